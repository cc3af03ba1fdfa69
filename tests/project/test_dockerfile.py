"""The Dockerfile, checked without a Docker daemon: the default target is the serve image the docs build.

Docker builds the last stage when `docker build` gets no --target, so the serve stage must be last;
every --target the docs name must be a stage; every COPY from the build context must exist; each
stage's entry point must be a console script the package defines.
"""
from __future__ import annotations

import re
import shlex
import tomllib

from tests.support.paths import REPO_ROOT

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "Dockerfile", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of every line, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            rows.append((word.upper(), rest.strip()))
    return rows


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """(name, its instructions) per FROM, in file order."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for word, rest in _instructions():
        if word == "FROM":
            stages.append((rest.split(" AS ")[-1].strip() if " AS " in rest else rest, []))
        elif stages:
            stages[-1][1].append((word, rest))
    return stages


def test_docker_build_without_a_target_builds_the_serve_image():
    names = [name for name, _ in _stages()]
    assert names[-1] == "serve", f"docker build . builds the last stage, {names[-1]!r}, not serve"
    entry = [rest for word, rest in _stages()[-1][1] if word == "ENTRYPOINT"]
    assert entry and eval(entry[-1]) == ["ehr-serve"]  # noqa: S307 (a JSON-array literal of the Dockerfile)


def test_every_target_the_docs_name_is_a_stage():
    names = {name for name, _ in _stages()}
    targets = {m for path in DOCS for m in re.findall(r"--target[ =]([\w.-]+)", path.read_text(encoding="utf-8"))}
    assert targets and targets <= names, f"--target values without a stage: {sorted(targets - names)}"


def test_every_copy_from_the_context_exists_and_entry_points_are_console_scripts():
    scripts = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    for name, instructions in _stages():
        for word, rest in instructions:
            if word == "COPY" and "--from=" not in rest:
                sources = [a for a in shlex.split(rest) if not a.startswith("--")][:-1]
                missing = [s for s in sources if not (REPO_ROOT / s).exists()]
                assert not missing, f"stage {name}: COPY of {missing}, absent from the checkout"
            if word == "ENTRYPOINT":
                program = eval(rest)[0]  # noqa: S307
                assert program in scripts, f"stage {name}: entry point {program!r} is not a console script"
