"""Dead letters: rows the reader could not turn into typed data, kept with their origin.

A dead letter is never an error for the run: the reader counts it by reason, hands it to a
sink and goes on. The sink decides where it lives; ``JsonlDeadLetterWriter`` keeps one JSON
object per line so a dead-letter file can be grepped, counted and replayed (the Beam job
writes its files whole and sorted instead: ``ehr_pipeline.job.sinks``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Callable, TextIO

logger = logging.getLogger(__name__)

# Why a row was dead-lettered. A row with several problems gets the first one found
# (field count first, then columns in schema order); ``detail`` lists all of them.
FIELD_COUNT = "field_count"  # more or fewer fields than the header
BAD_NUMBER = "bad_number"  # INT or FLOAT column that does not parse ("1.2.3", "12a") or is not finite ("inf")
BAD_TIMESTAMP = "bad_timestamp"  # TIMESTAMP column that is not an ISO date / date-time
MISSING_REQUIRED = "missing_required"  # empty field in a NOT NULL column
BAD_ENCODING = "bad_encoding"  # string column that is not valid UTF-8
BLANK_LINE = "blank_line"  # an empty line between rows: not data, but never dropped unseen
NUL_CHARACTER = "nul_character"  # string column holding a NUL (U+0000)
BAD_QUOTING = "bad_quoting"  # a line whose quote never closes (it would swallow the lines after it)
LINE_TOO_LONG = "line_too_long"  # a record too long for the reader's blocks (docs/reader.md)

REASONS = (FIELD_COUNT, BAD_NUMBER, BAD_TIMESTAMP, MISSING_REQUIRED, BAD_ENCODING, BLANK_LINE, NUL_CHARACTER,
           BAD_QUOTING, LINE_TOO_LONG)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One rejected row: where it was, what it said, and why it was rejected."""

    file: str  # the file as the reader was given it
    line: int  # 1-based physical line where the row starts (the header is line 1)
    raw: str  # the row's text as in the file, without its line terminator
    reason: str  # one of REASONS
    detail: str  # human-readable: which field(s), which value(s)

    def to_json(self) -> str:
        """The dead letter as one line of JSON (no trailing newline)."""
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "DeadLetter":
        """Parses a line written by ``to_json``."""
        return cls(**json.loads(text))

    def sort_key(self) -> tuple:
        """Order in a dead-letter file: by file, then line."""
        return (self.file, self.line)


DeadLetterSink = Callable[[DeadLetter], None]


class JsonlDeadLetterWriter:
    """A dead-letter sink writing JSON Lines; use as a context manager, call with each DeadLetter.

    The file is created (with its parent folders) on construction, so an empty file after a
    run means "no dead letters", not "the sink was never set up".
    """

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self._fh: TextIO | None = open(self.path, "w", encoding="utf-8")

    def __call__(self, letter: DeadLetter) -> None:
        if self._fh is None:
            raise ValueError(f"dead-letter file {self.path} is already closed")
        self._fh.write(letter.to_json() + "\n")
        self.count += 1

    def close(self) -> None:
        """Flushes and closes the file; safe to call twice."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            logger.info("wrote %d dead letter(s) to %s", self.count, self.path)

    def __enter__(self) -> "JsonlDeadLetterWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_dead_letters(path: str | pathlib.Path) -> list[DeadLetter]:
    """Reads back a file written by JsonlDeadLetterWriter."""
    with open(path, encoding="utf-8") as fh:
        return [DeadLetter.from_json(line) for line in fh if line.strip()]
