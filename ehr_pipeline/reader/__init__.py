"""Streaming, typed reader of MIMIC-III v1.4 CSV tables (gzip or plain, either dialect).

Arrow's streaming CSV reader does the parsing: every column is read as a string and cast
per block with vectorised kernels, so memory depends on the block size, never on the file.
Rows that cannot be typed are dead letters (see ``deadletter``): counted by reason, handed to
a sink with file, physical line and raw text, and never fatal.

Exact line numbers come cheap: a record spans ``1 + (newlines inside its fields)`` lines and
Arrow numbers every record it parses (including the ones it rejects), so the reader walks a
line cursor block by block and only computes per-row spans in blocks that hold a dead row.
The raw text of a dead row is cut out of a small window of recently read bytes.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import logging
import pathlib
import threading
import weakref
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ehr_pipeline import schemas
from ehr_pipeline.deadletter import (
    BAD_QUOTING,
    BLANK_LINE,
    FIELD_COUNT,
    LINE_TOO_LONG,
    DeadLetter,
    DeadLetterSink,
)
from ehr_pipeline.reader.columns import (
    ARROW_TYPES,
    Problem,
    arrow_schema,
    as_schema,
    per_row_newlines,
    requested,
    string_newlines,
    type_block,
)
from ehr_pipeline.reader.errors import (
    CorruptFileError,
    EmptyFileError,
    MissingTableError,
    ReaderError,
    SchemaMismatchError,
)
from ehr_pipeline.reader.header import check_header, match_header, read_header
from ehr_pipeline.reader.locate import locate_table, locate_table_files
from ehr_pipeline.reader.window import DEFAULT_BLOCK_SIZE, RawWindow

logger = logging.getLogger(__name__)

__all__ = [
    "ARROW_TYPES",
    "DEFAULT_BLOCK_SIZE",
    "CorruptFileError",
    "EmptyFileError",
    "MissingTableError",
    "ReadStats",
    "ReaderError",
    "SchemaMismatchError",
    "TableReader",
    "arrow_schema",
    "check_header",
    "locate_table",
    "locate_table_files",
    "read_table",
]

# Longest wait (seconds) for Arrow's I/O thread to let go of a closed reader: one block read.
_READ_AHEAD_RELEASE_S = 30.0


@dataclasses.dataclass
class ReadStats:
    """Row accounting of one pass: rows_read == rows_parsed + sum(dead_lettered.values())."""

    rows_read: int = 0
    rows_parsed: int = 0
    dead_lettered: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def rows_dead(self) -> int:
        """Rows dead-lettered, all reasons together."""
        return sum(self.dead_lettered.values())


class TableReader:
    """Iterates a MIMIC-III table file as typed pyarrow RecordBatches; see module docstring.

    INT -> int64, FLOAT -> float64, TIMESTAMP -> int64 seconds since 1970-01-01, STR ->
    string, empty field -> null. ``stats`` describes the last (or running) pass.
    """

    def __init__(
        self,
        path: str | pathlib.Path,
        table: str | schemas.TableSchema,
        columns: Sequence[str] | None = None,
        on_dead_letter: DeadLetterSink | None = None,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE,
    ):
        self.path = pathlib.Path(path)
        self.schema = as_schema(table)
        self.columns = requested(self.schema, columns)
        self.arrow_schema = pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in self.columns])
        self.on_dead_letter = on_dead_letter
        if block_size_bytes < 1024:
            raise ValueError(f"block_size_bytes must be at least 1024, got {block_size_bytes}")
        self.block_size_bytes = int(block_size_bytes)
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self.stats = ReadStats()
        with RawWindow.open(self.path, self.block_size_bytes) as window:
            header_names = read_header(window, self.path)
            positions = match_header(header_names, self.schema, self.path)
            if not window.only_header_left():
                yield from _Pass(self, window, header_names, positions).run()
            if window.error is not None:
                raise CorruptFileError(
                    f"{self.path}: compressed data is truncated or corrupt after line {window.complete_lines:,}, "
                    f"the last complete line (the {self.stats.rows_read:,} rows up to it were read and counted; "
                    f"the rest of the file is lost): {window.error}")
        if self.stats.rows_dead and self.on_dead_letter is None:
            logger.warning(
                "%s: %d row(s) dead-lettered %s with no sink to keep them; pass on_dead_letter",
                self.path, self.stats.rows_dead, self.stats.dead_lettered,
            )


def read_table(
    path: str | pathlib.Path,
    table: str | schemas.TableSchema,
    columns: Sequence[str] | None = None,
    on_dead_letter: DeadLetterSink | None = None,
) -> tuple[pa.Table, ReadStats]:
    """Reads a whole table file into memory; for small tables (dimension tables, the demo)."""
    reader = TableReader(path, table, columns=columns, on_dead_letter=on_dead_letter)
    batches = list(reader)
    return pa.Table.from_batches(batches, schema=reader.arrow_schema), reader.stats


class _Straddled(Exception):
    """Arrow found no record end within a block: an unclosed quote or a line longer than a block."""


_MAX_RAW = 1 << 16  # characters of a dead letter's raw text kept for a huge line


def _clip(raw: str) -> str:
    return raw if len(raw) <= _MAX_RAW else raw[:_MAX_RAW] + f"... [{len(raw) - _MAX_RAW} more characters]"


def _split_line(line: str) -> list[str] | None:
    """One physical line parsed alone as a CSV record; None when its quotes do not balance."""
    try:
        rows = list(csv.reader([line], strict=True))
    except csv.Error:
        return None
    return rows[0] if rows else []


def _splice(batch: pa.RecordBatch, keep: np.ndarray, pieces: list[tuple[int, pa.RecordBatch]]) -> pa.RecordBatch:
    """The kept rows of ``batch`` with each piece inserted before row ``pos`` (file order)."""
    if not pieces:
        return batch if keep.all() else batch.filter(pa.array(keep))
    parts, prev = [], 0
    for pos, piece in sorted(pieces, key=lambda pp: pp[0]):
        parts.append(batch.slice(prev, pos - prev).filter(pa.array(keep[prev:pos])))
        parts.append(piece)
        prev = pos
    parts.append(batch.slice(prev).filter(pa.array(keep[prev:])))
    table = pa.Table.from_batches(parts, schema=batch.schema).combine_chunks()
    return table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=batch.schema)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Pass:
    """One pass over a file: typing, dead-lettering and the line cursor."""

    def __init__(self, reader: TableReader, window: RawWindow, header: list[str], positions: dict[str, int]):
        self.reader = reader
        self.window = window
        self.header = header
        self.file = str(reader.path)
        self.stats = reader.stats
        self.wanted = [(c, positions[c.name]) for c in reader.columns]
        wanted_pos = {p for _, p in self.wanted}
        # Columns never typed still count lines: their quoted values may hold newlines.
        self.untyped = [i for i in range(len(header)) if i not in wanted_pos]
        self.invalid: collections.deque[pacsv.InvalidRow] = collections.deque()
        self.next_number = 2  # Arrow's number of the next record; the header is record 1
        self.next_line = 2  # physical line where the next record starts

    def _on_invalid(self, row: pacsv.InvalidRow) -> str:
        self.invalid.append(row)
        return "skip"

    def run(self) -> Iterator[pa.RecordBatch]:
        fresh = True
        while True:
            try:
                reader, released = self._open(header_in_data=fresh)
            except _Straddled:
                yield from self._skip_line()
                fresh = False
                continue
            restart = False
            try:
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        break
                    except (pa.ArrowException, OSError) as e:
                        if not self._straddled(e):
                            raise self._failure(e) from e
                        restart = True
                        break
                    out = self._process(batch)
                    self.window.release_before(self.next_line)
                    if out.num_rows:
                        yield out
            finally:
                # Stop Arrow's read-ahead before the caller's `with` closes the stream under it
                # (a consumer may stop early).
                reader.close()
                del reader
                # A read-ahead still in flight keeps Arrow's reader, and through it the feed,
                # alive on Arrow's I/O thread. Released there while the interpreter exits, the
                # feed's destructor wants the GIL that is being torn down, and the process aborts
                # ("terminate called without an active exception") after all its work is done.
                released.wait(_READ_AHEAD_RELEASE_S)
            if not restart:
                break
            # A quote that never closes within a block (or one enormous line): the record at
            # the cursor goes, and a fresh reader resumes on the line after it.
            yield from self._skip_line()
            fresh = False
        tail = self._flush_invalid(len(self.invalid))
        if tail is not None:
            yield tail
        if self.invalid:
            raise RuntimeError(f"{self.file}: rejected rows out of order (reader bug)")

    def _straddled(self, e: BaseException) -> bool:
        return "straddl" in str(e) and self.window.error is None

    def _open(self, header_in_data: bool) -> tuple[pacsv.CSVStreamingReader, threading.Event]:
        """An Arrow reader on a fresh feed, and an event set once nothing holds that feed any more."""
        read = pacsv.ReadOptions(use_threads=False, block_size=self.reader.block_size_bytes,
                                 column_names=None if header_in_data else self.header)
        parse = pacsv.ParseOptions(
            newlines_in_values=True,  # D_ITEMS labels, NOTEEVENTS text
            ignore_empty_lines=False,  # a skipped blank line would shift every later line number
            invalid_row_handler=self._on_invalid,
        )
        convert = pacsv.ConvertOptions(
            column_types={name: pa.string() for name in self.header},
            check_utf8=False,  # checked per column so one bad byte is one dead row, not a dead file
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        )
        feed = self.window.feed()
        released = threading.Event()
        weakref.finalize(feed, released.set)
        try:
            reader = pacsv.open_csv(feed, read_options=read, parse_options=parse, convert_options=convert)
        except (pa.ArrowException, OSError) as e:
            if self._straddled(e):
                raise _Straddled() from e
            raise self._failure(e) from e
        if reader.schema.names != self.header:
            raise ReaderError(f"{self.file}: Arrow parsed the header as {reader.schema.names}, expected {self.header}")
        return reader, released

    def _skip_line(self) -> Iterator[pa.RecordBatch]:
        """Dead-letters the physical line at the cursor and points the window just after it."""
        # Arrow's read-ahead for the reader that gave up may still be running: stop it before
        # this thread reads, so the window's record of the file stays in file order.
        self.window.retire_feeds()
        tail = self._flush_invalid(len(self.invalid), partial=True)
        if tail is not None:
            yield tail
        self.invalid.clear()  # the next reader reports the rest again, numbered afresh
        line = self.next_line
        self.window.read_through(line)
        raw = self.window.text(line, 1)
        if raw.count('"') % 2:
            reason, detail = BAD_QUOTING, "a quote opened on this line never closes"
        else:
            reason, detail = LINE_TOO_LONG, f"record too long for block_size_bytes={self.reader.block_size_bytes}"
        self._emit(DeadLetter(self.file, line, _clip(raw), reason, detail))
        self.stats.rows_read += 1
        self.next_line = line + 1
        self.next_number = 1  # a reader given the column names numbers the first data row 1
        self.window.rewind_to(self.next_line)

    def _failure(self, e: BaseException) -> ReaderError:
        self._flush_invalid(len(self.invalid), partial=True)
        where = f"after line {self.next_line - 1:,} ({self.stats.rows_read:,} rows read)"
        if self.window.error is not None:
            return CorruptFileError(f"{self.file}: compressed data is truncated or corrupt; the CSV ends inside a "
                                    f"record {where}: {self.window.error}")
        return CorruptFileError(f"{self.file}: CSV cannot be parsed {where}: {e}")

    # -- per block
    def _process(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        typed, problems, nl_columns = type_block(batch, self.wanted, self.untyped)
        counts = [string_newlines(a) for a in nl_columns]
        newlines = sum(counts)
        nl_columns = [a for a, c in zip(nl_columns, counts) if c]

        blank = self._blank_candidates(batch)
        n_invalid = self._invalid_in_range(n)
        # A record over several lines may be rows merged by a stray quote: the slow path checks.
        if not problems and blank is None and not n_invalid and not newlines:
            self.stats.rows_read += n
            self.stats.rows_parsed += n
            self.next_number += n
            self.next_line += n
            return pa.RecordBatch.from_arrays(typed, schema=self.reader.arrow_schema)
        return self._process_slow(batch, typed, problems, nl_columns, blank, n_invalid)

    def _blank_candidates(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """Rows where every field is null: a blank line, or a line of empty fields."""
        if batch.num_rows == 0 or batch.column(0).null_count == 0:
            return None
        mask = batch.column(0).is_null()
        for i in range(1, batch.num_columns):
            mask = pc.and_(mask, batch.column(i).is_null())
        out = mask.to_numpy(zero_copy_only=False)
        return out if out.any() else None

    def _invalid_in_range(self, n: int) -> int:
        """How many rejected rows Arrow reported inside this block's range of records."""
        end = self.next_number + n
        count = 0
        for row in list(self.invalid):  # a copy: Arrow may report rows of the next block meanwhile
            if row.number is None or row.number >= end:  # None: Arrow's last record of the file
                break
            count += 1
            end += 1
        return count

    def _process_slow(self, batch, typed, problems, nl_columns, blank, n_invalid) -> pa.RecordBatch:
        n = batch.num_rows
        invalid = [self.invalid.popleft() for _ in range(n_invalid)]
        total = n + n_invalid
        is_valid = np.ones(total, dtype=bool)
        spans = np.ones(total, dtype=np.int64)
        inv_pos = np.array([r.number - self.next_number for r in invalid], dtype=np.int64)
        is_valid[inv_pos] = False
        if nl_columns:
            row_nl = np.zeros(n, dtype=np.int64)
            for arr in nl_columns:
                row_nl += per_row_newlines(arr)
            spans[is_valid] += row_nl
        for p, r in zip(inv_pos, invalid):
            spans[p] = 1 + r.text.count("\n")
        starts = self.next_line + np.concatenate(([0], np.cumsum(spans)[:-1]))
        row_starts, row_spans = starts[is_valid], spans[is_valid]
        valid_before = np.cumsum(is_valid) - is_valid

        letters: list[DeadLetter] = []
        recovered: list[tuple[int, list[tuple[int, list[str]]]]] = []  # (insert before row, [(line, fields)])
        extra = 0  # physical records beyond Arrow's count, from re-read records
        for p, r in zip(inv_pos, invalid):
            line = int(starts[p])
            split = self._resync(r.text, line)
            if split is None:
                letters.append(self._field_count(line, r))
                continue
            letters += split[0]
            recovered.append((int(valid_before[p]), split[1]))
            extra += int(spans[p]) - 1
        candidates = row_spans > 1
        for prob in problems:
            candidates |= prob.mask
        if blank is not None:
            candidates |= blank
        dead = np.zeros(n, dtype=bool)
        replaced = np.zeros(n, dtype=bool)
        for i in np.flatnonzero(candidates):
            line, span = int(row_starts[i]), int(row_spans[i])
            raw_text = self.window.text(line, span)
            split = self._resync(raw_text, line) if span > 1 else None
            if split is not None:
                letters += split[0]
                recovered.append((int(i), split[1]))
                replaced[i] = True
                extra += raw_text.count("\n")  # not span - 1: a quote open at the end takes the last newline
                continue
            if blank is not None and blank[i] and raw_text.strip() == "":
                letters.append(DeadLetter(self.file, line, raw_text, BLANK_LINE, "blank line"))
                dead[i] = True
                continue
            if span > 1 and raw_text.count('"') % 2:  # Arrow closed it at the end of the file
                letters.append(DeadLetter(self.file, line, raw_text, BAD_QUOTING,
                                          "a quote opened in this record never closes before the end of the file"))
                dead[i] = True
                continue
            letter = self._letter(problems, i, line, raw_text)
            if letter is not None:  # None: a line of empty fields whose requested columns are all nullable
                letters.append(letter)
                dead[i] = True

        pieces: list[tuple[int, pa.RecordBatch]] = []
        n_recovered = 0
        for pos, rows in recovered:
            part, part_letters = self._type_lines(rows)
            letters += part_letters
            n_recovered += part.num_rows
            pieces.append((pos, part))
        letters.sort(key=lambda l: l.line)
        for letter in letters:
            self._emit(letter)
        self.stats.rows_read += total + extra
        self.stats.rows_parsed += n - int(dead.sum()) - int(replaced.sum()) + n_recovered
        self.next_number += total
        self.next_line = int(starts[-1] + spans[-1]) if total else self.next_line
        out = pa.RecordBatch.from_arrays(typed, schema=self.reader.arrow_schema)
        return _splice(out, ~(dead | replaced), pieces)

    def _field_count(self, line: int, row: pacsv.InvalidRow) -> DeadLetter:
        """The dead letter of a record Arrow rejected for its number of fields."""
        if row.text.count('"') % 2:  # e.g. the file's last record, its quote still open at the end
            return DeadLetter(self.file, line, row.text, BAD_QUOTING, "a quote opened in this record never closes")
        return DeadLetter(self.file, line, row.text, FIELD_COUNT,
                          f"expected {row.expected_columns} fields, found {row.actual_columns}")

    def _letter(self, problems: list[Problem], i: int, line: int, raw_text: str) -> DeadLetter | None:
        """The dead letter of row i of a block, or None when it has no problem."""
        found = [p for p in problems if p.mask[i]]
        if not found:
            return None
        detail = "; ".join(
            f"{p.column} {_short(p.raw[i].as_py()) + ' ' if p.raw is not None else ''}{p.message}"
            for p in found
        )
        return DeadLetter(self.file, line, raw_text, found[0].reason, detail)

    def _resync(self, text: str, first_line: int):
        """Re-reads a record of several lines line by line, if it is rows merged by a stray quote.

        Returns None when the quotes close and no line holds a whole record on its own (a
        genuine multi-line value, such as a note's text); else (dead letters of the lines that
        are no record, [(line, fields)] of those that are). A quote still open at the end of
        the file opened no value: each line is then a physical record of its own.
        """
        if "\n" not in text:
            return None
        lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
        width = len(self.header)
        fields = [_split_line(line) if line.count(",") >= width - 1 else None for line in lines]
        if not text.count('"') % 2 and not any(f is not None and len(f) == width for f in fields):
            return None
        letters, rows = [], []
        for k, (line, f) in enumerate(zip(lines, fields)):
            number = first_line + k
            if f is not None and len(f) == width:
                rows.append((number, f))
            elif not line.strip():
                letters.append(DeadLetter(self.file, number, line, BLANK_LINE, "blank line"))
            elif line.count('"') % 2:
                letters.append(DeadLetter(self.file, number, line, BAD_QUOTING,
                                          "a quote opened on this line never closes on it; it had joined "
                                          "the lines after it into one record"))
            else:
                found = _split_line(line)
                letters.append(DeadLetter(self.file, number, line, FIELD_COUNT,
                                          f"expected {width} fields, found "
                                          f"{len(found) if found is not None else 'unparseable quoting'}"))
        return letters, rows

    def _type_lines(self, rows: list[tuple[int, list[str]]]) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """Types re-read lines as the block path does; (kept rows, dead letters of the others)."""
        if not rows:
            return pa.RecordBatch.from_pylist([], schema=self.reader.arrow_schema), []
        columns = [pa.array([f[j] if f[j] != "" else None for _, f in rows], pa.string())
                   for j in range(len(self.header))]
        batch = pa.RecordBatch.from_arrays(columns, names=self.header)
        typed, problems, _ = type_block(batch, self.wanted, self.untyped)
        letters, dead = [], np.zeros(len(rows), dtype=bool)
        for i, (line, _) in enumerate(rows):
            letter = self._letter(problems, i, line, self.window.text(line, 1))
            if letter is not None:
                letters.append(letter)
                dead[i] = True
        out = pa.RecordBatch.from_arrays(typed, schema=self.reader.arrow_schema)
        return (out.filter(pa.array(~dead)) if dead.any() else out), letters

    def _flush_invalid(self, count: int, partial: bool = False) -> pa.RecordBatch | None:
        """Emits rejected rows that follow the last block (end of file, or before a failure)."""
        pieces: list[tuple[int, pa.RecordBatch]] = []
        for _ in range(count):
            row = self.invalid[0]
            if row.number is not None and row.number != self.next_number:
                if partial:
                    break
                raise RuntimeError(f"{self.file}: rejected row {row.number} out of order (reader bug)")
            self.invalid.popleft()
            line, span = self.next_line, 1 + row.text.count("\n")
            split = self._resync(row.text, line)
            if split is not None:
                part, letters = self._type_lines(split[1])
                for letter in sorted(split[0] + letters, key=lambda l: l.line):
                    self._emit(letter)
                pieces.append((0, part))
                self.stats.rows_parsed += part.num_rows
            else:
                self._emit(self._field_count(line, row))
            self.stats.rows_read += span if split is not None else 1
            self.next_number += 1
            self.next_line += span
        if not pieces:
            return None
        return _splice(pa.RecordBatch.from_pylist([], schema=self.reader.arrow_schema), np.zeros(0, bool), pieces)

    def _emit(self, letter: DeadLetter) -> None:
        self.stats.dead_lettered[letter.reason] = self.stats.dead_lettered.get(letter.reason, 0) + 1
        logger.debug("dead letter %s:%d %s: %s", letter.file, letter.line, letter.reason, letter.detail)
        if self.reader.on_dead_letter is not None:
            self.reader.on_dead_letter(letter)
