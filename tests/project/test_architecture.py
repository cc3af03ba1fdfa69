"""The layering the house rules promise, read from the source: ehr_pipeline <- model <- serving,
no import circles between project modules, and a service that starts without TensorFlow.

Imports are read with ``ast`` (not by importing), including imports inside functions: a lazy
import still ties two modules together. Imports under ``if TYPE_CHECKING:`` are left out, as
they never run.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys
from collections.abc import Mapping

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
LAYERS = ("ehr_base", "ehr_pipeline", "model", "serving")  # each may import only the ones before it
def _modules() -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of the project packages (a package is its __init__)."""
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(tree: ast.AST, module: str, is_package: bool, modules: Mapping[str, pathlib.Path],
                    type_only: bool = False) -> set[str]:
    """Dotted names an import statement in tree names (relative imports resolved); type-only ones if asked."""
    names = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg.
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return names


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """Project module -> the project modules it imports (with type_only: those under TYPE_CHECKING too)."""
    # A copy of the graph read once per worker: reading it (every module parsed) takes ~1.2 s CPU, and a
    # dozen tests ask for it; no test changes the checkout it is read from.
    return {module: set(targets) for module, targets in _read_import_graph(type_only).items()}


@functools.cache
def _read_import_graph(type_only: bool) -> dict[str, set[str]]:
    """import_graph, read from the source."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for imported in _imported_names(tree, name, path.name == "__init__.py", modules, type_only):
            while imported and imported not in modules:  # `import a.b.c` of a name inside a module
                imported = imported.rpartition(".")[0]
            if imported:
                targets.add(imported)
        targets.discard(name)
        graph[name] = targets
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_strongly_connected_finds_a_planted_circle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}, "f": {"f"}}
    assert strongly_connected(graph) == [frozenset({"a", "b", "c"})]


def test_import_graph_reads_lazy_imports_and_skips_type_checking_ones():
    graph = import_graph()
    assert "model.export.load" in graph["model.export.predict"]  # module-level
    assert "model.export.predict" in graph["serving.inference.served_model"]  # inside ServedModel.forward
    # `from ehr_pipeline.contract import BaggingConfig, spec`: a module, and a name of the package's front door
    assert {"ehr_pipeline.contract.spec", "ehr_pipeline.contract"} <= graph["ehr_pipeline.encode.bagging"]
    planted = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ehr_pipeline.encode import bagging\n"
                        "from ehr_pipeline.contract import spec\n")
    assert _imported_names(planted, "x", False, _modules()) == {"typing", "ehr_pipeline.contract.spec"}
    assert "ehr_pipeline.encode.bagging" in _imported_names(planted, "x", False, _modules(), type_only=True)


def test_no_import_cycles_between_project_modules():
    # Type-only imports count: a circle that only annotations close still ties two modules together.
    cycles = [sorted(c) for c in strongly_connected(import_graph(type_only=True))]
    assert not cycles, f"import circles between project modules: {cycles}"


def test_the_spec_is_the_bottom_of_the_data_layer():
    # The contract every other module reads: it may import nothing of the project, so no
    # circle can pass through it (bagging -> config -> spec -> bagging was one).
    assert not import_graph()["ehr_pipeline.contract.spec"]


def test_nothing_imports_upward():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                    if rank[t.split(".")[0]] > rank[m.split(".")[0]])
    assert not upward, f"imports against ehr_pipeline <- model <- serving: {upward}"


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_only_command_lines_import_the_command_lines():
    wrong = sorted(f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                   if _is_under(t, "model.cli") and not _is_under(m, "model.cli"))
    assert not wrong, f"modules that call into a command line: {wrong}"


def test_the_service_and_the_export_reader_start_without_tensorflow():
    # The service loads TensorFlow only with the SavedModel; importing its modules (and the
    # export layout they read) must stay cheap for --help and for the app factory.
    code = ("import sys, serving.api.app, serving.cli, serving.settings, model.export_layout, model.export.load, "
            "model.ehr.config, model.fit, model.fit.experiment, model.evaluation.against_reference, "
            "model.cli.ehr_train, model.cli.ehr_eval, model.cli.ehr_analyze, model.cli.ehr_adapt, model.adapt.config, "
            "model.image.cli, "
            "model.layers, model.ehr, model.evaluation, model.export, model.cli; "
            "print(sorted(m for m in ('tensorflow', 'tf_keras', 'edward2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.stdout.strip() == "[]", out.stderr


def _route_modules() -> set[str]:
    """Serving modules that declare endpoints (an APIRouter)."""
    return {name for name, path in _modules().items()
            if name.startswith("serving.") and "APIRouter(" in path.read_text(encoding="utf-8")}


def test_route_modules_share_dependencies_not_each_other():
    # What two route modules share (dependencies, the prediction use case) lives in a module of
    # its own; a route module importing another would tie their endpoints together.
    routes = _route_modules()
    assert {"serving.api.routes", "serving.api.fhir_routes"} <= routes
    graph = import_graph()
    crossing = sorted(f"{m} -> {t}" for m in routes for t in graph[m] & routes)
    assert not crossing, f"route modules import route modules: {crossing}"


MAX_FUNCTION_LINES, MAX_MODULE_LINES = 80, 600


def test_serving_functions_and_modules_stay_short():
    too_long = []
    for name, path in _modules().items():
        if not name.startswith("serving"):
            continue
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {node.end_lineno - start + 1} lines")
    assert not too_long, f"over {MAX_FUNCTION_LINES} lines a function or {MAX_MODULE_LINES} a module: {too_long}"


def _architecture_page() -> str:
    return (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_architecture_page_names_every_package_and_only_those():
    listed = {}
    for line in _architecture_page().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[1].isdigit():
            listed[cells[0].strip("`")] = int(cells[1])
    packages = {".".join(p.parent.relative_to(ROOT).parts) for layer in LAYERS
                for p in (ROOT / layer).rglob("__init__.py")}
    assert set(listed) == packages, f"docs/architecture.md lists {sorted(set(listed) - packages)} that do not " \
                                    f"exist and misses {sorted(packages - set(listed))}"
    assert all(listed[name] == LAYERS.index(name.split(".")[0]) for name in listed), listed


def test_the_roads_on_the_architecture_page_pass_through_modules_that_exist():
    import re

    named = set(re.findall(r"`((?:ehr_base|ehr_pipeline|model|serving)/[\w/]+\.py)`", _architecture_page()))
    assert len(named) > 20  # the two roads name their modules
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


# ----------------------------------------------------------------------------- the rooms of ehr_pipeline

MAX_PIPELINE_ROOMS, MAX_PIPELINE_ARROWS = 12, 40
PROJECT = ("ehr_base", "ehr_pipeline", "model", "serving")
# Module names that each package may have for its own thing: a package's config, command line, errors, demo.
SHARED_MODULE_NAMES = {"__init__", "__main__", "config", "cli", "errors", "demo"}


def _pipeline_rooms() -> dict[str, tuple[int, set[str]]]:
    """Room -> (floor, its modules) as the rooms table of docs/architecture.md declares them (the one declaration)."""
    rooms = {}
    for line in _architecture_page().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`ehr_pipeline.") and cells[1].isdigit():
            rooms[cells[0].strip("`")] = (int(cells[1]), {m.strip() for m in cells[2].split(",") if m.strip()})
    return rooms


def _room_of(module: str) -> str | None:
    """'ehr_pipeline.encode.bagging' -> 'ehr_pipeline.encode'; None for the package itself and other packages."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "ehr_pipeline" and len(parts) > 1 else None


def _room_arrows() -> list[tuple[str, str, str, str]]:
    """(room, room it imports, module, module it imports) for every import between two rooms of ehr_pipeline."""
    arrows = []
    for module, targets in import_graph(type_only=True).items():
        for target in targets:
            source_room, target_room = _room_of(module), _room_of(target)
            if module.startswith("ehr_pipeline") and target.startswith("ehr_pipeline") and source_room != target_room:
                arrows.append((str(source_room), str(target_room), module, target))
    return arrows


def test_the_rooms_table_lists_every_room_of_ehr_pipeline_with_its_modules():
    rooms = _pipeline_rooms()
    found = {}
    for path in (ROOT / "ehr_pipeline").iterdir():
        if path.is_dir() and (path / "__init__.py").is_file():
            found[f"ehr_pipeline.{path.name}"] = {p.stem for p in path.glob("*.py")} - {"__init__", "__main__"}
        elif path.suffix == ".py" and path.name != "__init__.py":
            found[f"ehr_pipeline.{path.stem}"] = set()  # a loose module is a room of its own
    assert len(found) <= MAX_PIPELINE_ROOMS, f"ehr_pipeline has {len(found)} top-level modules or packages"
    assert set(rooms) == set(found), f"the rooms table lists {sorted(set(rooms) - set(found))} that do not exist " \
                                     f"and misses {sorted(set(found) - set(rooms))}"
    wrong = {room: (sorted(modules), sorted(found[room])) for room, (_, modules) in rooms.items()
             if modules != found[room]}
    assert not wrong, f"rooms whose modules the table lists otherwise (listed, in the folder): {wrong}"


def test_the_rooms_table_catches_a_planted_upward_import():
    # The check below reads the graph; this pins that an import against the floors is one it sees.
    floors = {room: floor for room, (floor, _) in _pipeline_rooms().items()}
    assert floors["ehr_pipeline.contract"] < floors["ehr_pipeline.encode"] < floors["ehr_pipeline.job"]
    planted = ast.parse("from ehr_pipeline.job import run_job\n")
    targets = _imported_names(planted, "ehr_pipeline.encode.bagging", False, _modules())
    assert {_room_of(t) for t in targets} == {"ehr_pipeline.job"}


def test_no_module_of_ehr_pipeline_imports_upward_or_sideways():
    floors = {room: floor for room, (floor, _) in _pipeline_rooms().items()}
    wrong = sorted(f"{module} -> {target}" for source, target_room, module, target in _room_arrows()
                   if module == "ehr_pipeline" or target == "ehr_pipeline"  # the package face stands apart
                   or floors[target_room] >= floors[source])
    assert not wrong, f"imports against the floors of docs/architecture.md's rooms table: {wrong}"


def test_the_rooms_of_ehr_pipeline_are_tied_by_at_most_forty_arrows():
    arrows = {(source, target) for source, target, _, _ in _room_arrows()}
    assert len(arrows) <= MAX_PIPELINE_ARROWS, sorted(arrows)


def test_every_room_has_a_front_door_that_names_its_modules_and_exports_its_api():
    problems = []
    for room, (_, modules) in _pipeline_rooms().items():
        init = ROOT / room.replace(".", "/") / "__init__.py"
        tree = ast.parse(init.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        unnamed = sorted(m for m in modules if f"``{m}``" not in doc)
        if unnamed:
            problems.append(f"{room}: the docstring does not name {unnamed}")
        exported = [node for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
        if not exported:
            problems.append(f"{room}: no __all__")
            continue
        bound = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
        unbound = sorted(set(ast.literal_eval(exported[0].value)) - bound)
        if unbound:
            problems.append(f"{room}: __all__ names what it does not import: {unbound}")
    assert not problems, problems


def _function_level_imports(tree: ast.AST):
    """Import statements inside functions (nested ones included), outside `if TYPE_CHECKING:`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack = list(node.body)
            while stack:
                child = stack.pop()
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    yield child
                elif isinstance(child, ast.If) and _is_type_checking(child):
                    stack.extend(child.orelse)
                elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):  # walked on their own
                    stack.extend(ast.iter_child_nodes(child))


def _says_why(lines: list[str], node: ast.stmt, marker: str) -> bool:
    """`marker` on the import's line, or starting the line above its run of imports (blank lines between are fine)."""
    if marker in lines[node.lineno - 1]:
        return True
    row = node.lineno - 2
    while row >= 0 and (not lines[row].strip() or lines[row].lstrip().startswith(("import ", "from "))):
        row -= 1
    return row >= 0 and lines[row].lstrip().startswith(marker)


def lazy_imports_without_a_reason(source: str, marker: str = "#") -> list[int]:
    """Lines of function-level imports of the project's own code that no comment starting with `marker` explains."""
    lines = source.splitlines()
    found = []
    for node in _function_level_imports(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if getattr(node, "level", 0) == 0 and any(n.split(".")[0] in PROJECT for n in names) \
                and not _says_why(lines, node, marker):
            found.append(node.lineno)
    return sorted(found)


def test_the_lazy_import_check_wants_a_comment_and_ignores_other_imports():
    bare = "def f():\n    from ehr_pipeline.job import run_job\n    return run_job\n"
    above = "def f():\n    # Beam only when a job runs\n    from ehr_pipeline.job import run_job\n    import os\n"
    inline = "def f():\n    from ehr_pipeline.job import run_job  # Beam only here\n"
    other = "def f():\n    import tensorflow as tf\n    from scipy.stats import norm\n"
    nested = "def f():\n    def g():\n        from model.cli import ehr_train\n    return g\n"
    assert lazy_imports_without_a_reason(bare) == [2]
    assert lazy_imports_without_a_reason(above) == lazy_imports_without_a_reason(inline) == []
    assert lazy_imports_without_a_reason(other) == []
    assert lazy_imports_without_a_reason(nested) == [3]


def test_function_level_imports_of_the_project_in_ehr_pipeline_say_why():
    found = {name: lines for name, path in _modules().items() if name.startswith("ehr_pipeline")
             if (lines := lazy_imports_without_a_reason(path.read_text(encoding="utf-8")))}
    assert not found, f"function-level imports of the project's own code without a comment saying why: {found}"


def test_a_module_name_of_ehr_pipeline_names_one_thing_across_the_layers():
    # `schemas`, `outputs` and `shift` once named two things; a module of the data layer shares its name
    # with no module of model or serving, but for the names every package may have for its own thing.
    names: dict[str, set[str]] = {}
    for name in _modules():
        top, _, rest = name.partition(".")
        names.setdefault(name.rsplit(".", 1)[-1], set()).add(top)
    shared = sorted(n for n, tops in names.items() if "ehr_pipeline" in tops and tops & {"model", "serving"}
                    and n not in SHARED_MODULE_NAMES)
    assert not shared, f"module names of ehr_pipeline that model or serving use for another thing: {shared}"


def test_the_service_road_loads_neither_beam_nor_tensorflow_nor_pyarrow():
    # A request's road: the contract, the encoding hop, the MEDS code map, the population monitor.
    code = ("import sys, ehr_pipeline.contract, ehr_pipeline.encode, ehr_pipeline.meds, ehr_pipeline.shift, "
            "ehr_pipeline.fhir, serving.inference.encoding, serving.api.app; "
            "print(sorted(m for m in ('apache_beam', 'tensorflow', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.stdout.strip() == "[]", out.stderr


# ----------------------------------------------------------------------------- the floors of model

WHY_MARKER = "# why:"  # the one marker a function-level import of the project's own code in model/ and serving/ carries


def _model_floors() -> dict[str, int]:
    """Part of model -> floor, as the floors table of docs/architecture.md declares them (the one declaration)."""
    floors = {}
    for line in _architecture_page().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`model.") and cells[1].startswith("floor "):
            floors[cells[0].strip("`")] = int(cells[1].removeprefix("floor "))
    return floors


def _part_of(module: str) -> str | None:
    """'model.evaluation.metrics' -> 'model.evaluation', 'model.export_layout' -> itself; None outside model's parts."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "model" and len(parts) > 1 else None


def _part_arrows() -> set[tuple[str, str]]:
    """(part, part it imports) for every import between two parts of model, lazy and type-only ones included."""
    return {(_part_of(m), _part_of(t)) for m, targets in import_graph(type_only=True).items() for t in targets
            if _part_of(m) and _part_of(t) and _part_of(m) != _part_of(t)}


def test_the_floors_table_lists_every_part_of_model():
    parts = {f"model.{p.stem if p.suffix == '.py' else p.name}" for p in (ROOT / "model").iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    floors = _model_floors()
    assert set(floors) == parts, f"the floors table lists {sorted(set(floors) - parts)} that do not exist and " \
                                 f"misses {sorted(parts - set(floors))}"
    # the order the house asks for: the export layout at the bottom, then layers, export < evaluation < ehr < cli
    assert floors["model.export_layout"] == 0
    assert floors["model.layers"] <= floors["model.export"] < floors["model.evaluation"] < floors["model.ehr"] \
        < floors["model.cli"]
    assert floors["model.image"] == floors["model.ehr"]  # beside it, on the same core


def test_no_part_of_model_imports_upward_or_sideways():
    floors = _model_floors()
    wrong = sorted(f"{a} -> {b}" for a, b in _part_arrows() if floors[b] >= floors[a])
    assert not wrong, f"imports against the floors of docs/architecture.md's model table: {wrong}"


def test_the_parts_of_model_form_no_loop():
    # Counted with every lazy and type-only import: a loop hidden inside functions is still a loop.
    graph: dict[str, set[str]] = {}
    for a, b in _part_arrows():
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    assert not strongly_connected(graph), strongly_connected(graph)


def test_the_part_check_catches_a_planted_loop():
    planted = ast.parse("def f():\n    from model.ehr import train\n")
    targets = _imported_names(planted, "model.export.write", False, _modules())
    assert {_part_of(t) for t in targets} == {"model.ehr"}
    floors = _model_floors()
    assert floors["model.ehr"] >= floors["model.export"]  # so the test above would name it


def lazy_imports_without_the_marker(source: str) -> list[int]:
    """Lines of function-level imports of the project's own code without a `# why:` comment (inline, or above its run)."""
    return lazy_imports_without_a_reason(source, WHY_MARKER)


def test_the_marker_check_wants_why_and_ignores_other_imports():
    bare = "def f():\n    from model.ehr import train\n"
    other_comment = "def f():\n    # TensorFlow\n    from model.ehr import train\n"
    above = "def f():\n    # why: TensorFlow loads only after the arguments\n    from model.ehr import train\n    import os\n"
    inline = "def f():\n    from model.ehr import train  # why: TensorFlow\n"
    other = "def f():\n    import tensorflow as tf\n"
    assert lazy_imports_without_the_marker(bare) == [2]
    assert lazy_imports_without_the_marker(other_comment) == [3]
    assert lazy_imports_without_the_marker(above) == lazy_imports_without_the_marker(inline) == []
    assert lazy_imports_without_the_marker(other) == []


def test_function_level_imports_of_the_project_in_model_and_serving_say_why():
    found = {name: lines for name, path in _modules().items() if name.startswith(("model", "serving"))
             if (lines := lazy_imports_without_the_marker(path.read_text(encoding="utf-8")))}
    assert not found, f"function-level imports of the project's own code without a {WHY_MARKER!r} comment: {found}"


def test_a_module_name_of_model_or_serving_names_one_thing_across_the_layers():
    # `metrics` (model's numbers, the service's Prometheus instruments), `precision` (mixed-precision training,
    # the service's bfloat16 choice) and `shift_report` once named two things.
    tops: dict[str, set[str]] = {}
    for name in _modules():
        tops.setdefault(name.rsplit(".", 1)[-1], set()).add(name.split(".")[0])
    shared = sorted(n for n, where in tops.items() if len(where & {"model", "serving", "ehr_pipeline"}) > 1
                    and n not in SHARED_MODULE_NAMES)
    assert not shared, f"module names that two layers use for different things: {shared}"


def class_names_defined_twice(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """Public class name -> the modules that define it, for names defined in more than one place.

    A name with a leading underscore is its module's own (never imported), so it may repeat.
    """
    where: dict[str, list[str]] = {}
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(module)
    return {name: sorted(modules) for name, modules in where.items() if len(modules) > 1}


def test_the_duplicate_class_check_catches_a_planted_twin_and_ignores_private_names():
    sources = {"a": "class Reading:\n    pass\nclass _Model:\n    pass\n",
               "b": "def f():\n    class Reading:\n        pass\nclass _Model:\n    pass\n",
               "c": "class Other:\n    pass\n"}
    assert class_names_defined_twice(sources) == {"Reading": ["a", "b"]}


def test_no_class_name_is_defined_twice_in_the_product():
    # `Admission`, `Column`, `Problem`, `Reading` and `UnitPlan` once each named two concepts.
    sources = {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}
    twice = class_names_defined_twice(sources)
    assert not twice, f"class names defined twice, for two concepts: {twice}"


# ----------------------------------------------------------------------------- the rooms of serving and evaluation

def _rooms_under(folder: str) -> dict[str, str]:
    """Module of the folder (dotted) -> its room: the module or sub-package directly under the folder."""
    depth = folder.count(".") + 1
    return {m: ".".join(m.split(".")[:depth + 1]) for m in _modules()
            if m.startswith(folder + ".") and m.count(".") >= depth}


def _arrows_between_rooms(folder: str) -> set[tuple[str, str]]:
    """(room, room it imports) between two rooms of a folder, lazy and type-only imports included."""
    rooms = _rooms_under(folder)
    return {(rooms[m], rooms[t]) for m, targets in import_graph(type_only=True).items() if m in rooms
            for t in targets if t in rooms and rooms[m] != rooms[t]}


def test_serving_is_at_most_ten_rooms_tied_by_twenty_arrows_and_the_service_never_imports_its_tools():
    rooms = set(_rooms_under("serving").values())
    arrows = _arrows_between_rooms("serving")
    assert len(rooms) <= 10 and len(arrows) <= 20, (sorted(rooms), sorted(arrows))
    assert not strongly_connected({r: {t for m, t in arrows if m == r} for r in rooms})
    assert not [a for a in arrows if a[1] == "serving.tools"], "the service imports serving.tools"


def test_evaluation_is_statistics_and_the_page_and_the_statistics_never_read_the_page():
    rooms = set(_rooms_under("model.evaluation").values())
    arrows = _arrows_between_rooms("model.evaluation")
    assert len(rooms) <= 8 and len(arrows) <= 12, (sorted(rooms), sorted(arrows))
    assert ("model.evaluation.statistics", "model.evaluation.report") not in arrows
    assert not strongly_connected({r: {t for m, t in arrows if m == r} for r in rooms})


def test_sub_packages_of_serving_and_evaluation_hold_at_most_ten_modules_in_no_loop():
    graph = import_graph(type_only=True)
    for package in ("serving.api", "serving.inference", "serving.monitoring", "serving.tools",
                    "model.evaluation.statistics", "model.evaluation.report"):
        members = {m for m in _modules() if m.startswith(package + ".")}
        assert len(members) <= 10, f"{package}: {len(members)} modules"
        inner = {m: graph[m] & members for m in members}
        assert not strongly_connected(inner), f"{package}: import loop"
