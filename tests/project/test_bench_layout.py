"""bench/'s shape, read from the source with ``ast``: at most 7 rooms (a module or a folder directly
under bench/), no module named like one of the house's packages, and no script importing another
script. A script is a module with an ``if __name__ == "__main__":`` block; what scripts share lives in
modules that have none (harness.py, and a family's own such as methods/compare_runs.py).
"""
from __future__ import annotations

import ast
import pathlib

from tests.support.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"
MAX_ROOMS = 7
# The house's packages: a bench module or folder named like one of them or their sub-packages reads as it.
PACKAGE_ROOTS = ("ehr_base", "ehr_pipeline", "model", "serving")


def _modules() -> dict[str, pathlib.Path]:
    """Dotted name (bench.FAMILY.NAME) -> file, for every module under bench/."""
    return {".".join(p.relative_to(REPO_ROOT).with_suffix("").parts): p
            for p in sorted(BENCH.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_script(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def _bench_imports(tree: ast.Module) -> set[str]:
    """Every bench module a module imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("bench.")}
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module == "bench"
                                                                   or node.module.startswith("bench.")):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_bench_has_at_most_seven_rooms():
    rooms = sorted(p.name for p in BENCH.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py"))
    assert len(rooms) <= MAX_ROOMS, f"bench/ has {len(rooms)} rooms (at most {MAX_ROOMS}): {rooms}"


def test_no_bench_module_or_folder_is_named_like_a_package():
    packages = set(PACKAGE_ROOTS) | {p.parent.name for root in PACKAGE_ROOTS
                                     for p in (REPO_ROOT / root).rglob("__init__.py")}
    clashes = sorted(str(p.relative_to(REPO_ROOT)) for p in BENCH.rglob("*")
                     if "__pycache__" not in p.parts and (p.stem if p.suffix == ".py" else p.name) in packages)
    assert not clashes, f"bench/ names that are also packages of the house: {clashes}"


def test_no_bench_script_imports_another_script():
    modules = _modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}
    scripts = {name for name, tree in trees.items() if _is_script(tree)}
    assert len(scripts) >= 15  # the check sees the scripts at all
    offenders = [f"{name} imports {other}" for name in sorted(scripts)
                 for other in sorted(_bench_imports(trees[name]) & scripts) if other != name]
    assert not offenders, "a script imports another script (move what they share into a module):\n" + "\n".join(
        offenders)
