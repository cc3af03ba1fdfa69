"""Row accounting of a whole MIMIC-III release: what `ehr-pipeline summarize` (and `make demo`) prints.

Every table of ``reader.table_schemas.TABLES`` present in the directory is read once, fully typed, so the
summary doubles as a validation pass: rows read, rows parsed, rows dead-lettered by reason.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import sys
import time

from ehr_pipeline.reader import (
    DeadLetterSink,
    JsonlDeadLetterWriter,
    MissingTableError,
    ReaderError,
    TableReader,
    locate_table,
    table_schemas,
)

logger = logging.getLogger(__name__)

DEAD_LETTER_FILE = "dead_letters.jsonl"
EXIT_INPUT_ERROR = 2  # every command: input that cannot be read is exit code 2 and one line


@dataclasses.dataclass(frozen=True)
class TableSummary:
    table: str
    file: str
    rows_read: int
    rows_parsed: int
    dead_lettered: dict[str, int]
    seconds: float  # wall time to read and type the table

    @property
    def rows_dead(self) -> int:
        """Rows dead-lettered, all reasons together."""
        return sum(self.dead_lettered.values())


@dataclasses.dataclass(frozen=True)
class ReleaseSummary:
    mimic_dir: str
    tables: tuple[TableSummary, ...]
    absent: tuple[str, ...]  # optional tables with no file in the directory

    @property
    def rows_dead(self) -> int:
        """Rows dead-lettered across all tables."""
        return sum(t.rows_dead for t in self.tables)


def summarize_release(mimic_dir: str | pathlib.Path, on_dead_letter: DeadLetterSink | None = None) -> ReleaseSummary:
    """Reads every schema table present in mimic_dir; raises MissingTableError for a missing required one."""
    located = {name: locate_table(mimic_dir, name) for name in table_schemas.TABLES}  # fail before reading anything
    tables, absent = [], []
    for name, path in located.items():
        if path is None:
            absent.append(name)
            continue
        started = time.perf_counter()
        reader = TableReader(path, name, on_dead_letter=on_dead_letter)
        for _ in reader:
            pass
        s = reader.stats
        tables.append(TableSummary(name, path.name, s.rows_read, s.rows_parsed, dict(s.dead_lettered),
                                   time.perf_counter() - started))
    return ReleaseSummary(str(mimic_dir), tuple(tables), tuple(absent))


def format_release_summary(summary: ReleaseSummary) -> str:
    """The summary as a fixed-width text table, one row per table plus a total."""
    header = ("table", "file", "rows read", "parsed", "dead", "dead by reason")
    rows = [
        (t.table, t.file, f"{t.rows_read:,}", f"{t.rows_parsed:,}", f"{t.rows_dead:,}",
         ", ".join(f"{r}={n:,}" for r, n in sorted(t.dead_lettered.items())) or "-")
        for t in summary.tables
    ]
    rows.append(("TOTAL", "", f"{sum(t.rows_read for t in summary.tables):,}",
                 f"{sum(t.rows_parsed for t in summary.tables):,}", f"{summary.rows_dead:,}", ""))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = {2, 3, 4}

    def fmt(r: tuple[str, ...]) -> str:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    lines = [f"MIMIC-III release: {summary.mimic_dir}", fmt(header), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    if summary.absent:
        lines.append(f"absent optional tables: {', '.join(summary.absent)}")
    return "\n".join(lines)


def summarize_command(mimic_dir: str | pathlib.Path, dead_letter_dir: str | pathlib.Path | None = None) -> int:
    """`ehr-pipeline summarize`: prints the summary; exit code 0, or 2 when the release cannot be read.

    Dead letters do not fail the command (they are counted in the table); with
    ``dead_letter_dir`` they are written to DIR/dead_letters.jsonl.
    """
    try:
        if dead_letter_dir is None:
            summary = summarize_release(mimic_dir)
        else:
            path = pathlib.Path(dead_letter_dir) / DEAD_LETTER_FILE
            with JsonlDeadLetterWriter(path) as sink:
                summary = summarize_release(mimic_dir, on_dead_letter=sink)
    except (MissingTableError, ReaderError) as e:
        print(f"ehr-pipeline: error: {e}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    print(format_release_summary(summary))
    if dead_letter_dir is not None:
        print(f"dead letters: {summary.rows_dead:,} written to {pathlib.Path(dead_letter_dir) / DEAD_LETTER_FILE}")
    return 0
