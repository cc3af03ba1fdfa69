"""The size limits of the house rules, read from the source with ``ast``: no module over 600
lines, and no function over 80 lines unless a ``# long: <why>`` comment stands on the line
just above its ``def`` (or above its decorators).

A long module or function is where unrelated concerns pile up unnoticed; the comment makes a
long function a decision someone wrote down rather than an accident.
"""
from __future__ import annotations

import ast

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("ehr_base", "ehr_pipeline", "model", "serving", "bench")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
LONG_MARK = "# long:"


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _says_why(line: str) -> bool:
    text = line.strip()
    return text.startswith(LONG_MARK) and bool(text[len(LONG_MARK):].strip())


def shape_problems(source: str, path: str) -> list[str]:
    """Every limit one module's source breaks, each naming the file, the function and its length in lines."""
    lines = source.splitlines()
    problems = []
    if len(lines) > MAX_MODULE_LINES:
        problems.append(f"{path}: {len(lines)} lines (a module has at most {MAX_MODULE_LINES})")
    for name, node in _functions(ast.parse(source)):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        length = node.end_lineno - start + 1
        if length > MAX_FUNCTION_LINES and not (start >= 2 and _says_why(lines[start - 2])):
            problems.append(f"{path}:{start} {name}: {length} lines (at most {MAX_FUNCTION_LINES} without a "
                            f"'{LONG_MARK} <why>' comment on the line above)")
    return problems


def _function(name: str, body_lines: int, above: str = "", decorated: bool = False) -> str:
    """Source of a function `body_lines` + 1 lines long (+ 1 with a decorator), `above` on the line before."""
    head = ([above] if above else []) + (["@staticmethod"] if decorated else []) + [f"def {name}():"]
    return "\n".join(head + [f"    x{i} = {i}" for i in range(body_lines)]) + "\n"


def test_the_checker_names_file_function_and_length_of_a_planted_long_function():
    source = "import os\n\n\n" + _function("too_long", 80)
    assert shape_problems(source, "pkg/planted.py") == [
        f"pkg/planted.py:4 too_long: 81 lines (at most 80 without a '{LONG_MARK} <why>' comment on the line above)"]


def test_the_checker_takes_a_reason_above_the_def_or_its_decorators_and_nothing_less():
    assert shape_problems(_function("exactly_80", 79), "a.py") == []
    assert shape_problems(_function("explained", 100, above="# long: one flat table of declarations"), "a.py") == []
    assert shape_problems(_function("decorated", 100, above="# long: a flat table", decorated=True), "a.py") == []
    # A decorator's line counts: the comment must stand above it, not between it and the def.
    hidden = "@staticmethod\n# long: too late\n" + _function("hidden", 100)
    assert [p.split(":")[1] for p in shape_problems(hidden, "a.py")] == ["1 hidden"]
    assert shape_problems(_function("no_reason", 100, above="# long:"), "a.py")
    assert shape_problems(_function("other_comment", 100, above="# a comment that says nothing of length"), "a.py")


def test_the_checker_finds_methods_nested_functions_and_long_modules():
    method = "class Reader:\n" + "".join("    " + line + "\n" for line in _function("read", 90).splitlines())
    assert [p.split(" ")[1] for p in shape_problems(method, "a.py")] == ["Reader.read:"]
    nested = "def outer():\n" + "".join("    " + line + "\n" for line in _function("inner", 90).splitlines())
    assert [p.split(" ")[1] for p in shape_problems(nested, "a.py")] == ["outer:", "outer.inner:"]
    assert shape_problems("x = 1\n" * 601, "big.py") == ["big.py: 601 lines (a module has at most 600)"]
    assert shape_problems("x = 1\n" * 600, "big.py") == []


def test_every_module_of_the_project_keeps_the_limits():
    files = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    assert len(files) > 50  # the packages were found
    problems = [p for path in files
                for p in shape_problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not problems, "too long:\n" + "\n".join(problems)
