"""The shell commands of a markdown page: what tests/project's documentation tests read from README.md and docs/.

A command is a line of a fenced block labelled bash, sh, shell or console (in a console block, a line
starting with "$ "), with backslash continuations and quotes that span lines joined and comments
dropped.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

from tests.support.paths import REPO_ROOT

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented command: where it is and its text (comments dropped, continuations joined)."""

    document: str  # relative to the checkout
    line: int
    text: str

    @property
    def flat(self) -> str:
        """The text with every run of white space as one space (what patterns match)."""
        return " ".join(self.text.split())

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.flat}"


def _drop_comment(line: str) -> str:
    """The line without a trailing '# ...' comment outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _complete(text: str) -> bool:
    """Whether shell text ends outside quotes and without a line continuation."""
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text, comments=False)
    except ValueError:  # an open quote
        return False
    return True


def fenced_blocks(path: pathlib.Path) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the first content line, lines) of every fenced block of a markdown file."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^\s*(```|~~~)\s*([\w+-]*)", line)
        if current is None and fence:
            current = (fence.group(2).lower(), number + 1, [])
        elif current is not None and re.match(r"^\s*(```|~~~)\s*$", line):
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    return blocks


def document_commands(path: pathlib.Path) -> list[Command]:
    """The commands of a document's shell blocks, in order."""
    name = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
    out = []
    for language, first, lines in fenced_blocks(path):
        if language not in SHELL_LANGUAGES:
            continue
        pending, start = "", 0
        for offset, raw in enumerate(lines):
            line = raw
            if not pending:
                if language == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                start = first + offset
                pending = _drop_comment(line.strip())
            else:  # inside a quote the line is data: keep it whole
                in_quote = not _complete(pending.rstrip("\\"))
                pending = (pending + "\n" + raw) if in_quote else (pending[:-1].rstrip() + " " + _drop_comment(
                    raw.strip()))
            if _complete(pending):
                out.append(Command(name, start, pending))
                pending = ""
        assert not pending, f"{name}:{start}: command not finished at the end of its block"
    return out
