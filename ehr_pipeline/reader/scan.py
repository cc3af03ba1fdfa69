"""One pass over a table file: Arrow readers on the window, typed blocks, and the line cursor.

Arrow's streaming CSV reader parses; this walks a line cursor block by block (a record spans
``1 + (newlines inside its fields)`` lines and Arrow numbers every record, rejected ones too),
hands blocks that hold a suspect row to ``dead_rows``, and starts a fresh Arrow reader on the
next line when one gives up on a record (a quote that never closes, or a line longer than a
block).
"""
from __future__ import annotations

import collections
import logging
import threading
import weakref
import dataclasses
import pathlib
from typing import Iterator, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from ehr_pipeline.reader import dead_rows
from ehr_pipeline.reader.columns import Problem, string_newlines, type_block
from ehr_pipeline.reader.dead_letters import BAD_QUOTING, LINE_TOO_LONG, DeadLetter, DeadLetterSink
from ehr_pipeline.reader.errors import CorruptFileError, ReaderError
from ehr_pipeline.reader.window import RawWindow
# The package's logger, not this module's: what the reader logs keeps one name for filters.
logger = logging.getLogger(__package__)

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


class ScanSource(Protocol):
    """What a scan reads of the TableReader that starts it: declared here so the two modules form no circle."""

    path: pathlib.Path
    columns: Sequence
    arrow_schema: pa.Schema
    block_size_bytes: int
    stats: ReadStats
    on_dead_letter: DeadLetterSink | None


class _Straddled(Exception):
    """Arrow found no record end within a block: an unclosed quote or a line longer than a block."""


class Scan:
    """One pass over a file: typing, dead-lettering and the line cursor."""

    def __init__(self, reader: ScanSource, window: RawWindow, header: list[str], positions: dict[str, int]):
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

    def run(self) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """Yields (typed block, physical line of each of its rows) after the header; dead rows go to the sink."""
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
                    if out[0].num_rows:
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

    def _skip_line(self) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
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
        self._emit(DeadLetter(self.file, line, dead_rows.clip(raw), reason, detail))
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
    def _process(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        """The typed rows of a block and the physical line of each; the line cursor and counts move past it."""
        n = batch.num_rows
        typed, problems, nl_columns = type_block(batch, self.wanted, self.untyped)
        counts = [string_newlines(a) for a in nl_columns]
        newlines = sum(counts)
        nl_columns = [a for a, c in zip(nl_columns, counts) if c]

        blank = dead_rows.blank_rows(batch)
        # A copy: Arrow may report rows of the next block meanwhile.
        n_invalid = dead_rows.rejected_in_block(list(self.invalid), self.next_number, n)
        # A record over several lines may be rows merged by a stray quote: the slow path checks.
        if not problems and blank is None and not n_invalid and not newlines:
            lines = np.arange(self.next_line, self.next_line + n, dtype=np.int64)
            self.stats.rows_read += n
            self.stats.rows_parsed += n
            self.next_number += n
            self.next_line += n
            return pa.RecordBatch.from_arrays(typed, schema=self.reader.arrow_schema), lines
        return self._process_slow(batch, typed, problems, nl_columns, blank, n_invalid)

    def _process_slow(self, batch: pa.RecordBatch, typed: list[pa.Array], problems: list[Problem],
                      nl_columns: list[pa.Array], blank: np.ndarray | None, n_invalid: int,
                      ) -> tuple[pa.RecordBatch, np.ndarray]:
        """A block holding a suspect row: its dead rows set aside, rows a stray quote had merged re-read."""
        n = batch.num_rows
        rejected = [self.invalid.popleft() for _ in range(n_invalid)]
        layout = dead_rows.block_layout(n, rejected, self.next_number, self.next_line, nl_columns)
        verdict = dead_rows.judge_block(layout, rejected, problems, blank, self.window.text, self.file,
                                        len(self.header))
        pieces, letters = self._type_recovered(verdict.recovered)
        for letter in sorted(verdict.letters + letters, key=lambda l: l.line):
            self._emit(letter)
        n_recovered = sum(part.num_rows for _, part, _ in pieces)
        self.stats.rows_read += layout.records + verdict.extra
        self.stats.rows_parsed += n - int(verdict.dead.sum()) - int(verdict.replaced.sum()) + n_recovered
        self.next_number += layout.records
        self.next_line = layout.next_line
        out = pa.RecordBatch.from_arrays(typed, schema=self.reader.arrow_schema)
        keep = ~(verdict.dead | verdict.replaced)
        return (dead_rows.splice(out, keep, [(pos, part) for pos, part, _ in pieces]),
                dead_rows.splice_lines(layout.row_starts, keep, [(pos, lines) for pos, _, lines in pieces]))

    def _type_recovered(self, recovered: list[dead_rows.Recovered],
                        ) -> tuple[list[tuple[int, pa.RecordBatch, np.ndarray]], list[DeadLetter]]:
        """Types the records re-read out of merged rows; ([(insert before row, rows, their lines)], dead letters)."""
        pieces: list[tuple[int, pa.RecordBatch, np.ndarray]] = []
        letters: list[DeadLetter] = []
        for pos, rows in recovered:
            part, part_letters, lines = self._type_lines(rows)
            letters += part_letters
            pieces.append((pos, part, lines))
        return pieces, letters

    def _type_lines(self, rows: list[tuple[int, list[str]]],
                    ) -> tuple[pa.RecordBatch, list[DeadLetter], np.ndarray]:
        """Types re-read lines as the block path does; (kept rows, dead letters of the others, kept rows' lines)."""
        if not rows:
            return pa.RecordBatch.from_pylist([], schema=self.reader.arrow_schema), [], np.zeros(0, np.int64)
        columns = [pa.array([f[j] if f[j] != "" else None for _, f in rows], pa.string())
                   for j in range(len(self.header))]
        batch = pa.RecordBatch.from_arrays(columns, names=self.header)
        typed, problems, _ = type_block(batch, self.wanted, self.untyped)
        letters, dead = [], np.zeros(len(rows), dtype=bool)
        for i, (line, _) in enumerate(rows):
            letter = dead_rows.problem_letter(self.file, problems, i, line, self.window.text(line, 1))
            if letter is not None:
                letters.append(letter)
                dead[i] = True
        out = pa.RecordBatch.from_arrays(typed, schema=self.reader.arrow_schema)
        lines = np.asarray([line for line, _ in rows], dtype=np.int64)[~dead]
        return (out.filter(pa.array(~dead)) if dead.any() else out), letters, lines

    def _flush_invalid(self, count: int, partial: bool = False) -> tuple[pa.RecordBatch, np.ndarray] | None:
        """Emits rejected rows that follow the last block (end of file, or before a failure), with their lines."""
        pieces: list[tuple[int, pa.RecordBatch]] = []
        piece_lines: list[tuple[int, np.ndarray]] = []
        for _ in range(count):
            row = self.invalid[0]
            if row.number is not None and row.number != self.next_number:
                if partial:
                    break
                raise RuntimeError(f"{self.file}: rejected row {row.number} out of order (reader bug)")
            self.invalid.popleft()
            line, span = self.next_line, 1 + row.text.count("\n")
            split = dead_rows.resync(self.file, row.text, line, len(self.header))
            if split is not None:
                part, letters, lines = self._type_lines(split[1])
                for letter in sorted(split[0] + letters, key=lambda l: l.line):
                    self._emit(letter)
                pieces.append((0, part))
                piece_lines.append((0, lines))
                self.stats.rows_parsed += part.num_rows
            else:
                self._emit(dead_rows.field_count_letter(self.file, line, row))
            self.stats.rows_read += span if split is not None else 1
            self.next_number += 1
            self.next_line += span
        if not pieces:
            return None
        empty = pa.RecordBatch.from_pylist([], schema=self.reader.arrow_schema)
        return (dead_rows.splice(empty, np.zeros(0, bool), pieces),
                dead_rows.splice_lines(np.zeros(0, np.int64), np.zeros(0, bool), piece_lines))

    def _emit(self, letter: DeadLetter) -> None:
        """Counts a dead letter and hands it to the sink."""
        self.stats.dead_lettered[letter.reason] = self.stats.dead_lettered.get(letter.reason, 0) + 1
        logger.debug("dead letter %s:%d %s: %s", letter.file, letter.line, letter.reason, letter.detail)
        if self.reader.on_dead_letter is not None:
            self.reader.on_dead_letter(letter)
