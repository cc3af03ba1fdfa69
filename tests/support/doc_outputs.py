"""Which documented command writes each output path a task page (docs/tasks/*.md) names.

A page's "Where the outputs land" table gives, per row, a path (a first-column code span holding a
``/``) and the command that writes it (the second column's code span, e.g. `ehr-eval --compare`). A
path is attributed to the page command of that program whose output folder (``--out``,
``--export-ensemble``, ``--dead-letter-dir``) is the path or holds it, the innermost; `make demo`'s own
steps, when given, count as commands too. tests/project/test_doc_paths_flags.py checks the attribution
against the code; test_documented_commands.py checks the paths exist where the page's commands ran.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

from tests.support.doc_commands import Command, document_commands

CODE_SPAN = re.compile(r"`([^`\n]+)`")
OUT_FLAGS = ("--out", "--export-ensemble", "--dead-letter-dir")
OUTPUTS_HEADING = "## Where the outputs land"
# Programs whose subcommand is part of the name ("ehr-pipeline run").
WITH_SUBCOMMAND = ("ehr-pipeline", "ehr-analyze")
PROGRAMS = ("ehr-pipeline", "ehr-train", "ehr-eval", "ehr-adapt", "ehr-analyze", "ehr-serve", "make", "docker",
            "curl", "python")


def program_of(words: list[str]) -> str | None:
    """The program a command's words call ("ehr-pipeline run", "ehr-eval", "scripts/demo.py", ...), or None."""
    if not words or words[0] not in PROGRAMS:
        return None
    if words[0] in WITH_SUBCOMMAND:
        sub = next((w for w in words[1:] if not w.startswith("-")), None)
        return f"{words[0]} {sub}" if sub else words[0]
    if words[0] == "python" and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            return words[2]
        return words[1] if words[1].endswith(".py") else "python"
    return words[0]


def _value(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words and words.index(flag) + 1 < len(words) else None


def output_folders(commands: list[Command]) -> list[tuple[list[str], str, Command]]:
    """(words, output folder, command) of every page command that writes a folder."""
    out = []
    for command in commands:
        words = shlex.split(command.flat.replace("$(", "("))
        for flag in OUT_FLAGS:
            if (folder := _value(words, flag)) and folder != "-":
                out.append((words, folder.rstrip("/"), command))
    return out


def outputs_table(page: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """(line, path, writer's words) of each row of the page's outputs table whose path holds a '/'."""
    rows, inside = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            inside = line.strip() == OUTPUTS_HEADING
            continue
        if inside and line.startswith("|") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            path, writer = CODE_SPAN.search(cells[0]), CODE_SPAN.search(cells[1]) if len(cells) > 1 else None
            if path and "/" in path.group(1) and writer:
                rows.append((number, path.group(1).rstrip("/"), writer.group(1).split()))
    return rows


def subfolder_names() -> dict[str, set[str]]:
    """The names a command's code writes inside its output folder, for the paths the pages name below one."""
    from model.ehr import train
    from model.export_layout import EXPORT_DIR
    from model.fit import training_loop

    return {"ehr-train": {EXPORT_DIR, train.EVAL_DIR, training_loop.CHECKPOINT_DIR, training_loop.BEST_DIR,
                          training_loop.TENSORBOARD_DIR}}


@dataclasses.dataclass(frozen=True)
class Output:
    """A path a page names and the command that writes it (None for one of `make demo`'s steps)."""

    line: int
    path: str
    command: Command | None


def attributed_outputs(page: pathlib.Path, demo: list[tuple[str, list[str]]] | None = None) -> tuple[
        list[Output], list[str]]:
    """Each output path of the page with the page command that writes it; and the problems found."""
    commands = document_commands(page)
    folders = output_folders(commands)
    names = subfolder_names()
    # make demo's steps: the Beam job's folder is the one ehr-train reads, the others their --out.
    demo_folders = []
    if demo and any(c.flat == "make demo" for c in commands):
        train = next(argv for tool, argv in demo if tool == "ehr-train")
        evaluate = next(argv for tool, argv in demo if tool == "ehr-eval")
        demo_folders = [(["ehr-pipeline", "demo"], _value(train, "--data")), (["ehr-train"], _value(train, "--out")),
                        (["ehr-eval"], _value(evaluate, "--out"))]
    outputs, problems = [], []
    for line, path, writer in outputs_table(page):
        wanted = program_of(writer)
        candidates = [(words, folder, command) for words, folder, command in
                      [*folders, *((words, folder, None) for words, folder in demo_folders)]
                      if program_of(words) == wanted and set(writer) <= set(words)
                      and (path == folder or path.startswith(folder + "/"))]
        if not candidates:
            problems.append(f"line {line}: {path}: no `{' '.join(writer)}` command of the page writes it")
            continue
        # The innermost folder; a page command before make demo's step of the same folder.
        words, folder, command = max(candidates, key=lambda c: (len(c[1]), c[2] is not None))
        if path != folder:
            below = path[len(folder) + 1:].split("/")[0]
            demo_data = [f for w, f in demo_folders if program_of(w) == wanted]
            if not (below in names.get(wanted, set()) or path in demo_data):
                problems.append(f"line {line}: {path}: `{wanted}` writes no {below!r} in {folder}")
        outputs.append(Output(line, path, command))
    return outputs, problems
