"""The task pages (docs/tasks/*.md) quote flags, defaults and output paths: each must be the code's.

* Every ``--flag`` a page quotes is a flag of its command's argument parser (what ``--help`` prints): a
  command of a shell block against its own program; a flag in the prose against the program named in the
  same code span (`ehr-adapt --method`), else against the program the page named last before it (in a
  code span or a command).
* A default quoted beside a flag, "`--flag` (default `X`)" or "(`--flag`, default `X`)", is the one
  ``--help`` prints for it.
* Every output path in a page's "Where the outputs land" table (a first-column code span holding a
  ``/``) is written by the command its second column names: the page has such a command whose output
  folder (``--out``, ``--export-ensemble``, ``--dead-letter-dir``) is the path or holds it, and a path
  below that folder starts with a name the command's code writes there (``export/`` of a run folder).
  `make demo`'s own steps are read from scripts/demo.py, its tools replaced by recorders, and the
  page's commands "by hand" must be those steps.

The parsers are built in this process and nothing runs: no training, no Beam job. The slow test of
test_documented_commands.py checks the same paths in the folder the page's commands wrote there.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import importlib.util
import io
import pathlib
import re
import shlex
import sys

import pytest

from tests.support.doc_commands import document_commands
from tests.support.doc_outputs import CODE_SPAN, OUTPUTS_HEADING, attributed_outputs, program_of
from tests.support.paths import REPO_ROOT

TASK_PAGES = sorted((REPO_ROOT / "docs" / "tasks").glob("*.md"))
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
# Right after a code span quoting a flag: "`--flag` (default `X`)", "(`--flag`, default `X`)".
DEFAULT_AFTER = re.compile(r"[,:]?\s*\(?default:?\s+`([^`\n]+)`")


def _load_script(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"doc_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache  # a parser per program, not per quoted flag
def parser_of(program: str):
    """The argparse parser of a program, or None where it has no flags this test checks (make, docker, curl)."""
    if program.startswith("ehr-pipeline"):
        from ehr_pipeline.cli import build_parser

        parser = build_parser()
        sub = program.partition(" ")[2]
        choices = next(a for a in parser._actions if a.dest == "command").choices
        assert sub in choices, f"no `ehr-pipeline {sub}`"
        return choices[sub]
    if program.startswith("ehr-analyze"):
        from model.cli import ehr_analyze

        parser = ehr_analyze.build_parser()
        sub = program.partition(" ")[2]
        choices = next(a.choices for a in parser._actions if isinstance(getattr(a, "choices", None), dict))
        assert sub in choices, f"no `ehr-analyze {sub}`"
        return choices[sub]
    if program in ("ehr-train", "ehr-eval", "ehr-adapt"):
        module = importlib.import_module(f"model.cli.{program.replace('-', '_')}")
        return module.build_parser()
    if program == "ehr-serve":
        from serving import cli

        return cli.build_parser()
    if program.endswith(".py") and (REPO_ROOT / program).is_file():
        module = _load_script(REPO_ROOT / program)
        return module.build_parser() if hasattr(module, "build_parser") else None
    return None


def help_of(parser, flag: str) -> str | None:
    """What --help prints for a flag (its help with the default as argparse expands it), None if no such flag."""
    action = next((a for a in parser._actions if flag in a.option_strings), None)
    if action is None:
        return None
    return " ".join(parser._get_formatter()._expand_help(action).split()) if action.help else ""


def _prose(text: str) -> str:
    """The page without its fenced blocks (their lines kept blank, so positions keep their order)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


@dataclasses.dataclass(frozen=True)
class Quote:
    """One flag a page quotes: where, for which program, and the default quoted beside it (if any)."""

    line: int
    program: str
    flag: str
    default: str | None = None


def quoted_flags(page: pathlib.Path) -> list[Quote]:
    """Every flag of the page's commands and prose, with its program, in page order."""
    text = page.read_text(encoding="utf-8")
    events: list[tuple[int, int, str, object]] = []  # (line, column, kind, payload) in page order
    for command in document_commands(page):
        events.append((command.line, 0, "command", command))
    prose = _prose(text)
    for number, line in enumerate(prose.splitlines(), 1):
        for m in CODE_SPAN.finditer(line):
            events.append((number, m.start(), "span", (m.group(1), line[m.end():])))
    events.sort(key=lambda e: (e[0], e[1]))
    quotes, current = [], None
    for number, _, kind, payload in events:
        if kind == "command":
            words = shlex.split(payload.flat.replace("$(", "("))
            program = program_of(words)
            if program:
                current = program
                quotes += [Quote(number, program, w.split("=", 1)[0]) for w in words[1:] if w.startswith("--")]
            continue
        span, after = payload
        try:
            words = shlex.split(span)
        except ValueError:
            words = span.split()
        program = program_of(words)
        if program:
            current = program
        flags = [w.split("=", 1)[0] for w in words if re.match(r"^--[a-z]", w)]
        if not flags:
            continue
        match = DEFAULT_AFTER.match(after)
        for i, flag in enumerate(flags):
            quotes.append(Quote(number, program or current or "", flag,
                                match.group(1) if match and i == len(flags) - 1 else None))
    return quotes


@pytest.mark.parametrize("page", TASK_PAGES, ids=lambda p: p.name)
def test_every_quoted_flag_is_its_commands_and_every_quoted_default_its_help(page):
    # A code span broken over two lines would hide its flags from the check below.
    problems = [f"line {n}: a code span continues on the next line: keep it on one"
                for n, line in enumerate(_prose(page.read_text(encoding="utf-8")).splitlines(), 1)
                if line.count("`") % 2]
    checked = 0
    for quote in quoted_flags(page):
        if not quote.program:
            problems.append(f"line {quote.line}: {quote.flag} quoted before any program is named")
            continue
        parser = parser_of(quote.program)
        if parser is None:
            continue
        text = help_of(parser, quote.flag)
        checked += 1
        if text is None:
            problems.append(f"line {quote.line}: `{quote.program}` has no {quote.flag}")
        elif quote.default is not None and not re.search(
                rf"default:?\s+{re.escape(quote.default)}(?![\w.])", text):
            problems.append(f"line {quote.line}: {quote.program} {quote.flag}: the page says default "
                            f"{quote.default!r}, --help says: {text!r}")
    assert not problems, f"{page.relative_to(REPO_ROOT)}:\n" + "\n".join(problems)
    assert checked, f"{page.relative_to(REPO_ROOT)}: no flag found to check"


# ------------------------------------------------------------------------------ output paths


def demo_steps(tmp_path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(tool, argv) of each step `make demo` runs (scripts/demo.py with the Makefile's defaults), recorded, not run."""
    demo = _load_script(REPO_ROOT / "scripts" / "demo.py")
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "configs").symlink_to(REPO_ROOT / "configs")
    release = tmp_path / "shared" / "mimic-iii-demo"
    release.mkdir(parents=True)
    with gzip.open(release / "ADMISSIONS.csv.gz", "wt") as f:  # enough for demo.py to take it as a release
        f.write("ROW_ID\n")
    steps: list[tuple[str, list[str]]] = []
    from ehr_pipeline import cli as pipeline_cli
    from model.cli import ehr_eval, ehr_train
    from serving.tools import demo as serving_demo

    def recorder(tool):
        return lambda argv: steps.append((tool, list(argv))) or 0

    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()):
        mp.chdir(work)
        mp.setattr(pipeline_cli, "main", recorder("ehr-pipeline"))
        mp.setattr(ehr_train, "main", recorder("ehr-train"))
        mp.setattr(ehr_eval, "main", recorder("ehr-eval"))
        mp.setattr(serving_demo, "main", recorder("python -m serving.tools.demo"))
        assert demo.main(["--mimic-dir", "../shared/mimic-iii-demo", "--out", "out/demo"]) == 0
    return steps


@pytest.fixture(scope="module")
def make_demo_steps(tmp_path_factory) -> list[tuple[str, list[str]]]:
    return demo_steps(tmp_path_factory.mktemp("make_demo"))


@pytest.mark.parametrize("page", TASK_PAGES, ids=lambda p: p.name)
def test_every_output_path_is_written_by_a_command_of_the_page(page, make_demo_steps):
    outputs, problems = attributed_outputs(page, make_demo_steps)
    assert not problems, f"{page.relative_to(REPO_ROOT)}:\n" + "\n".join(problems)
    if page.name != "deploy.md":  # the deploy page's one output is an image
        assert outputs, f"{page.relative_to(REPO_ROOT)}: no output paths found under {OUTPUTS_HEADING!r}"


def test_the_demo_page_gives_make_demos_steps_as_it_runs_them(make_demo_steps):
    page = REPO_ROOT / "docs" / "tasks" / "demo.md"
    documented = {" ".join(c.flat.split()) for c in document_commands(page)}
    assert "make demo" in documented
    for tool, argv in make_demo_steps:
        step = " ".join([tool, *[a for a in argv if a != "--no-progress"]])
        assert step in documented, f"make demo runs `{step}`; docs/tasks/demo.md does not give it"


def test_the_makefile_runs_the_demo_script_with_the_pages_folders():
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^MIMIC_DIR \?= \.\./shared/mimic-iii-demo$", makefile, re.M)
    assert re.search(r"^DEMO_OUT  ?\?= out/demo$", makefile, re.M)
    assert "scripts/demo.py --mimic-dir $(MIMIC_DIR) --out $(DEMO_OUT)" in makefile


def test_every_docker_target_a_task_page_names_is_a_stage():
    stages = set(re.findall(r"^FROM \S+ AS (\S+)", (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8"), re.M))
    named = {t for page in TASK_PAGES for t in re.findall(r"--target[ =]([\w.-]+)", page.read_text(encoding="utf-8"))}
    assert named and named <= stages, f"--target values without a stage: {sorted(named - stages)}"
