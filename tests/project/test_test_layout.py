"""The suite's own shape: its folders mirror the packages, one import root, no test module imports another.

Shared helpers live in tests/support and session fixtures in tests/conftest.py; a test module that
imported another would run that module's fixtures and tests twice and tie two rooms' tests together.
"""
from __future__ import annotations

import ast
import pathlib

from tests.support.paths import REPO_ROOT

TESTS = REPO_ROOT / "tests"
# Folders of tests/ that are not a package's mirror: the checks of the whole house and the helpers.
OWN_FOLDERS = {"project", "support"}
PACKAGES = ("ehr_pipeline", "model", "serving")


def _test_folders() -> list[pathlib.Path]:
    return sorted(p for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__" and any(p.glob("test_*.py")))


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at any depth of the file (absolute names; a relative import as '.name')."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_every_test_folder_mirrors_a_package_or_is_the_houses_own():
    stray = []
    for folder in _test_folders():
        parts = folder.relative_to(TESTS).parts
        if parts[0] in OWN_FOLDERS and len(parts) == 1:
            continue
        if parts[0] not in PACKAGES or not (REPO_ROOT.joinpath(*parts)).is_dir():
            stray.append("/".join(parts))
    assert not stray, f"test folders that mirror no package of the project: {stray}"
    assert not list(TESTS.glob("test_*.py")), "a test module at the top of tests/: put it beside its package's mirror"


def test_every_test_folder_is_a_package_under_the_one_root():
    missing = [str(p.relative_to(REPO_ROOT)) for p in [TESTS, *(q for q in TESTS.rglob("*") if q.is_dir()
               and q.name != "__pycache__" and any(q.glob("*.py")))] if not (p / "__init__.py").is_file()]
    assert not missing, f"folders without __init__.py (two import roots would follow): {missing}"


def test_no_test_module_imports_another_or_the_conftest():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        bad = sorted(name for name in _imported_modules(path)
                     if name.startswith(".") or name.split(".")[0] == "conftest" or name.startswith("test_")
                     or (name.startswith("tests.") and not name.startswith("tests.support")))
        if bad:
            offenders[str(path.relative_to(REPO_ROOT))] = bad
    assert not offenders, f"test modules importing tests (use tests.support or a conftest fixture): {offenders}"


def test_the_product_bench_and_docs_never_import_the_tests():
    offenders = [str(p.relative_to(REPO_ROOT)) for top in (*PACKAGES, "ehr_base", "bench")
                 for p in sorted((REPO_ROOT / top).rglob("*.py"))
                 if any(n == "tests" or n.startswith("tests.") for n in _imported_modules(p))]
    offenders += [str(p.relative_to(REPO_ROOT)) for p in sorted((REPO_ROOT / "docs").glob("*.md"))
                  if "from tests" in p.read_text() or "import tests" in p.read_text()]
    assert not offenders, f"outside tests/, nothing may import the tests (move the helper into the package): {offenders}"


def test_the_import_check_sees_a_planted_cross_import(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text("import os\n\ndef test_x():\n    from tests.serving.test_skew import X\n    from conftest import y\n")
    assert {"tests.serving.test_skew", "conftest"} <= _imported_modules(planted)
