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
import io
import logging
import pathlib
import threading
import weakref
import zlib
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ehr_pipeline import schemas
from ehr_pipeline.deadletter import (
    BAD_ENCODING,
    BAD_NUMBER,
    BAD_TIMESTAMP,
    BAD_QUOTING,
    BLANK_LINE,
    FIELD_COUNT,
    LINE_TOO_LONG,
    MISSING_REQUIRED,
    NUL_CHARACTER,
    DeadLetter,
    DeadLetterSink,
)

logger = logging.getLogger(__name__)

# Bytes of decompressed CSV per Arrow block (one RecordBatch each). Arrow reads about 32
# blocks ahead. At 256 KiB peak RSS stays flat from 1M to 10M rows (bench/reader.py); 1 MiB
# blocks were no faster but let allocator fragmentation add ~20% between those sizes.
DEFAULT_BLOCK_SIZE = 256 << 10
_HEADER_PROBE_BYTES = 1 << 16
_MAX_HEADER_BYTES = 1 << 20
# Longest wait (seconds) for Arrow's I/O thread to let go of a closed reader: one block read.
_READ_AHEAD_RELEASE_S = 30.0
_GZIP_MAGIC = b"\x1f\x8b"
# Other containers an export tool may write under a .csv or .csv.gz name: the reader reads
# plain CSV and gzip only, and names what it found instead of failing inside a decompressor.
_OTHER_MAGIC = (
    (b"PK\x03\x04", "a zip archive"),
    (b"BZh", "bzip2-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
)
_NEWLINE = 10
_CR = 13

ARROW_TYPES: dict[schemas.ColType, pa.DataType] = {
    schemas.ColType.INT: pa.int64(),
    schemas.ColType.FLOAT: pa.float64(),
    # Seconds, never nanoseconds: DOBs of patients over 89 sit ~300 years before the other
    # shifted dates and would overflow int64 nanoseconds in age arithmetic.
    schemas.ColType.TIMESTAMP: pa.int64(),
    schemas.ColType.STR: pa.string(),
}


class ReaderError(ValueError):
    """A file that cannot be read as the MIMIC-III table it should be."""


class EmptyFileError(ReaderError):
    """The file has no header line at all."""


class SchemaMismatchError(ReaderError):
    """The header does not carry the columns the v1.4 schema requires."""


class CorruptFileError(ReaderError):
    """Truncated or corrupt compressed data, or CSV structure Arrow cannot recover from."""


class MissingTableError(FileNotFoundError):
    """A required table has no file in the release directory."""


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


def arrow_schema(table: str | schemas.TableSchema, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema TableReader yields for ``table`` restricted to ``columns``."""
    schema = _as_schema(table)
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in _requested(schema, columns)])


def locate_table(mimic_dir: str | pathlib.Path, table: str) -> pathlib.Path | None:
    """Finds TABLE.csv.gz or TABLE.csv (any case) in mimic_dir; None if an optional table is absent."""
    schema = schemas.get(table)
    directory = pathlib.Path(mimic_dir)
    if not directory.is_dir():
        raise MissingTableError(f"MIMIC-III directory {directory} does not exist or is not a directory")
    files_by_name: dict[str, list[pathlib.Path]] = collections.defaultdict(list)
    for p in directory.iterdir():
        if p.is_file():
            files_by_name[p.name.lower()].append(p)
    found = [p for name in schema.file_names for p in sorted(files_by_name.get(name.lower(), []))]
    if len(found) > 1:
        # TABLE.csv beside TABLE.csv.gz is as ambiguous as two spellings of one name: which
        # one is the release? Reading either would silently ignore the other.
        raise ReaderError(f"{directory}: several files hold table {schema.name}: "
                          f"{', '.join(p.name for p in found)}; keep one")
    if found:
        return found[0]
    expected = " or ".join(schema.file_names)
    if schema.required:
        raise MissingTableError(f"required MIMIC-III table {schema.name} not found in {directory}: expected {expected}")
    logger.info("optional table %s absent from %s (looked for %s); skipping it", schema.name, directory, expected)
    return None


def locate_table_files(mimic_dir: str | pathlib.Path, table: str) -> list[pathlib.Path]:
    """All files of a table: [TABLE.csv(.gz)] or its parts TABLE-*.csv(.gz); [] for an absent optional table.

    Parts let one huge table (CHARTEVENTS: 330M rows) be read by many workers at once: a gzip
    file can only be read from its start, so one file is one unit of work. Each part is a
    complete CSV with its own header (``ehr-pipeline shard`` writes them).
    """
    schema = schemas.get(table)
    directory = pathlib.Path(mimic_dir)
    if not directory.is_dir():
        raise MissingTableError(f"MIMIC-III directory {directory} does not exist or is not a directory")
    prefix = schema.name.lower() + "-"
    parts = sorted(
        p for p in directory.iterdir()
        if p.is_file() and p.name.lower().startswith(prefix)
        and (p.name.lower().endswith(".csv") or p.name.lower().endswith(".csv.gz"))
    )
    stems: dict[str, list[str]] = collections.defaultdict(list)
    for p in parts:
        stems[p.name.lower().removesuffix(".gz")].append(p.name)
    doubled = [names for names in stems.values() if len(names) > 1]
    if doubled:
        raise ReaderError(f"{directory}: several files hold one part of {schema.name}: "
                          f"{', '.join(doubled[0])}; keep one")
    if not parts:
        whole = locate_table(directory, table)
        return [] if whole is None else [whole]
    whole = [n for n in schema.file_names if (directory / n).exists() or (directory / n.lower()).exists()]
    if whole:
        raise ReaderError(
            f"{directory}: {schema.name} is given both whole ({whole[0]}) and in {len(parts)} part(s) "
            f"({parts[0].name}, ...); keep one or the other")
    return parts


def check_header(path: str | pathlib.Path, table: str | schemas.TableSchema) -> None:
    """Reads only the header of a table file; raises the ReaderError a full read would raise first."""
    path = pathlib.Path(path)
    with _RawWindow.open(path, _HEADER_PROBE_BYTES) as window:  # no Arrow reader: any size will do
        _match_header(_read_header(window, path), _as_schema(table), path)


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
        self.schema = _as_schema(table)
        self.columns = _requested(self.schema, columns)
        self.arrow_schema = pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in self.columns])
        self.on_dead_letter = on_dead_letter
        if block_size_bytes < 1024:
            raise ValueError(f"block_size_bytes must be at least 1024, got {block_size_bytes}")
        self.block_size_bytes = int(block_size_bytes)
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self.stats = ReadStats()
        with _RawWindow.open(self.path, self.block_size_bytes) as window:
            header_names = _read_header(window, self.path)
            positions = _match_header(header_names, self.schema, self.path)
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


# ---------------------------------------------------------------------------- internals


def _as_schema(table: str | schemas.TableSchema) -> schemas.TableSchema:
    return table if isinstance(table, schemas.TableSchema) else schemas.get(table)


def _requested(schema: schemas.TableSchema, columns: Sequence[str] | None) -> tuple[schemas.Column, ...]:
    """Requested columns in the caller's order; names match the schema case-insensitively."""
    if columns is None:
        return schema.columns
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of column names, not one string")
    by_upper = {c.name: c for c in schema.columns}
    out: list[schemas.Column] = []
    for name in columns:
        col = by_upper.get(str(name).upper())
        if col is None:
            raise KeyError(f"{schema.name} has no column {name!r}; columns: {', '.join(schema.column_names)}")
        if col in out:
            raise ValueError(f"column {col.name} requested twice")
        out.append(col)
    if not out:
        raise ValueError("columns must name at least one column (or be None for all)")
    return tuple(out)


class _RawWindow:
    """File-like view of the (decompressed) file that remembers recent blocks.

    Arrow reads it from its I/O thread; the reader asks it for the text of dead rows by line
    number and tells it which lines it will never ask for again, which bounds its memory.

    The buffers it hands out depend on the file and ``size`` alone, never on who asks or how
    far Arrow's read-ahead got (see ``_cut``): the dead letters of a file are the same on a
    busy machine as on an idle one.
    """

    def __init__(self, path: pathlib.Path, stream: pa.NativeFile, size: int):
        self.path = path
        self._stream = stream
        self._size = size
        self._lock = threading.Lock()
        # (line number at the chunk's first byte, bytes, newlines in it, newline offsets or None)
        self._chunks: collections.deque[list] = collections.deque()
        self._newlines_seen = 0
        self._replay: collections.deque[pa.Buffer] = collections.deque()
        # Decompressed bytes read from the stream and not cut into a buffer yet.
        self._pending: list[pa.Buffer] = []
        self._pending_bytes = 0
        self._eof = False
        self.error: BaseException | None = None
        # Arrow's read-ahead thread goes on reading for a reader that failed or was closed,
        # while this thread reads too: every read holds _io, and retired feeds read nothing.
        self._io = threading.RLock()
        self._generation = 0

    def feed(self) -> "_Feed":
        """A file-like object for one Arrow reader; it reads nothing once feeds are retired."""
        return _Feed(self, self._generation)

    def read_for_feed(self, generation: int, nbytes: int = -1) -> pa.Buffer:
        """What a feed handed out at ``generation`` reads: up to ``nbytes`` bytes, none once it is retired."""
        # One step under _io: a retirement cannot slip in between the check and the read.
        with self._io:
            if generation != self._generation:
                return pa.py_buffer(b"")
            return self.read(nbytes)

    def retire_feeds(self) -> None:
        """Makes every feed handed out so far read nothing more (the end of its reader)."""
        with self._io:
            self._generation += 1

    @classmethod
    def open(cls, path: pathlib.Path, size: int = DEFAULT_BLOCK_SIZE) -> "_RawWindow":
        """A window on ``path`` handing out buffers of at most ``size`` bytes (Arrow's block size)."""
        with open(path, "rb") as fh:  # a missing file is a plain FileNotFoundError naming it
            magic = fh.read(6)
        # The content decides, never the name: export tools write plain text as TABLE.csv.gz
        # and gzip as TABLE.csv. (Arrow's input_stream would guess gzip from a ".gz" name.)
        if magic.startswith(_GZIP_MAGIC):
            if not path.name.lower().endswith(".gz"):
                logger.info("%s holds gzip data despite its name: reading it decompressed", path)
            return cls(path, _GunzipStream(open(path, "rb")), size)
        for prefix, what in _OTHER_MAGIC:
            if magic.startswith(prefix):
                raise ReaderError(f"{path}: the file holds {what}, not CSV or gzip; extract the table's CSV "
                                  "(plain or gzip-compressed, under either name)")
        if path.name.lower().endswith(".gz"):
            logger.info("%s holds no gzip data despite its name: reading it as plain CSV", path)
        return cls(path, pa.input_stream(str(path), compression=None), size)

    # -- what Arrow reads, through a _Feed
    def read(self, nbytes: int = -1) -> pa.Buffer:
        with self._io:
            if not self._replay:
                return self._read_new()
            buf = self._replay.popleft()
            if 0 < nbytes < len(buf):  # Arrow asks for its block size, which no buffer exceeds
                self._replay.appendleft(buf.slice(nbytes))
                buf = buf.slice(0, nbytes)
            return buf

    def __enter__(self) -> "_RawWindow":
        return self

    def __exit__(self, *exc) -> None:
        self._stream.close()

    # -- helpers for the reader
    def _read_new(self) -> pa.Buffer:
        with self._io:  # the cut and its record in the window, as one step in file order
            buf, newlines = self._cut()
            if len(buf):
                with self._lock:
                    self._chunks.append([self._newlines_seen + 1, buf, newlines, None])
                    self._newlines_seen += newlines
            return buf

    def _cut(self) -> tuple[pa.Buffer, int]:
        """The next buffer for Arrow (empty at the end) and the newlines in it.

        Arrow needs every record to end within the buffer after the one it starts in, else it
        reports a "straddling" record. Each buffer ends after the last newline within ``size``
        bytes of its start, so a record shorter than ``size`` bytes (a single line shorter
        than twice that) always fits, whatever sizes the stream returned. A line with no
        newline within ``size`` bytes goes out in pieces of ``size`` bytes.
        """
        while self._pending_bytes < self._size and not self._eof:
            self._pull(self._size - self._pending_bytes)
        if not self._pending:
            return pa.py_buffer(b""), 0
        data = self._pending[0] if len(self._pending) == 1 else _concat(self._pending)
        head = np.frombuffer(data, dtype=np.uint8, count=min(len(data), self._size))
        newlines = np.flatnonzero(head == _NEWLINE)
        if len(newlines):
            cut = int(newlines[-1]) + 1
        elif self._eof and len(data) <= self._size:
            cut = len(data)  # the file's last line, without a line end
        else:
            cut = len(head)
            # Arrow drops the first "\n" of a buffer that follows one ending in "\r", even
            # inside a quoted value (apache/arrow#51368): no buffer but the last ends in "\r".
            while cut > 1 and head[cut - 1] == _CR:
                cut -= 1
        self._pending = [data.slice(cut)] if cut < len(data) else []
        self._pending_bytes = len(data) - cut
        return data.slice(0, cut), len(newlines)

    def _pull(self, nbytes: int) -> None:
        """Appends the stream's next bytes (up to ``nbytes``) to the pending ones."""
        try:
            buf = self._stream.read_buffer(nbytes)
        except Exception as e:  # zlib and I/O errors: end the data at the last complete line
            # A cut line would otherwise reach Arrow as a short row, or worse as a valid one
            # ("12.5" cut to "12."); the reader raises after the complete lines are read.
            self.error = e
            self._eof = True
            if self._pending:
                data = _concat(self._pending)
                newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == _NEWLINE)
                keep = int(newlines[-1]) + 1 if len(newlines) else 0
                self._pending = [data.slice(0, keep)] if keep else []
                self._pending_bytes = keep
            return
        if len(buf) == 0:
            self._eof = True
            return
        self._pending.append(buf)
        self._pending_bytes += len(buf)

    @property
    def complete_lines(self) -> int:
        """Physical lines handed out so far that end with a line terminator."""
        return self._newlines_seen

    def probe(self) -> bytes:
        """Reads the next buffer ahead of Arrow; Arrow gets it later from the replay."""
        with self._io:
            buf = self._read_new()
            if len(buf):
                self._replay.append(buf)
        return buf.to_pybytes()

    def rewind_to(self, line: int) -> None:
        """Makes the next reads start at physical ``line`` (for a fresh Arrow reader after a bad line)."""
        with self._io:
            self.retire_feeds()
            self.read_through(line - 1)
            with self._lock:
                index, offset = self._line_start(line)
                pieces = [self._chunks[index][1].slice(offset)] + [c[1] for c in list(self._chunks)[index + 1:]]
            self._replay = collections.deque(p for p in pieces if len(p))

    def read_through(self, line: int) -> None:
        """Reads ahead (into the window) until ``line`` has ended or the data has."""
        with self._io:
            while self._newlines_seen < line:
                buf = self._read_new()
                if not len(buf):
                    break
                self._replay.append(buf)

    def only_header_left(self) -> bool:
        """True when nothing but the header line (and at most its terminator) is in the file."""
        data = b"".join(b.to_pybytes() for b in self._replay)
        rest = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        while not rest:
            more = self.probe()
            if not more:
                break
            data += more
            rest = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        return not rest

    def release_before(self, line: int) -> None:
        """Forgets bytes before the start of ``line``: the reader never asks for them again."""
        with self._lock:
            # Chunk 0 holds newlines up to number chunks[1].first - 1; line L starts after
            # newline L - 1, so chunk 0 is still needed while that newline may be in it.
            while len(self._chunks) > 1 and self._chunks[1][0] < line:
                self._chunks.popleft()

    def text(self, line: int, span: int) -> str:
        """The raw text of ``span`` physical lines starting at ``line``, without the final terminator."""
        with self._lock:
            start = self._line_start(line)
            end = self._line_start(line + span)
            parts = []
            for i in range(start[0], end[0] + 1):
                data = self._chunks[i][1]
                lo = start[1] if i == start[0] else 0
                hi = end[1] if i == end[0] else len(data)
                parts.append(data.slice(lo, hi - lo).to_pybytes())
        raw = b"".join(parts)
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        return raw.decode("utf-8", errors="replace")

    def _line_start(self, line: int) -> tuple[int, int]:
        """(chunk index, byte offset) just after newline number ``line - 1``; end of data if unread."""
        chunks = self._chunks
        wanted = line - 1  # the newline that ends the previous line
        if not chunks or wanted < chunks[0][0]:
            raise RuntimeError(f"{self.path}: line {line} is no longer in the read window (reader bug)")
        for idx in range(len(chunks) - 1, -1, -1):
            first, data, count, offsets = chunks[idx]
            if first <= wanted < first + count:
                if offsets is None:
                    offsets = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == _NEWLINE)
                    chunks[idx][3] = offsets
                return idx, int(offsets[wanted - first]) + 1
        # Past the last newline read: the final line of a file without a closing newline.
        return len(chunks) - 1, len(chunks[-1][1])


class _GunzipStream:
    """Decompresses a gzip file (all members) and, unlike Arrow's stream, hands out every byte
    before a truncation or corruption: the reader can then name the last complete line."""

    _CHUNK = 1 << 16

    def __init__(self, fh):
        self._fh = fh
        self._z = zlib.decompressobj(wbits=31)

    def read_buffer(self, nbytes: int | None = None) -> pa.Buffer:
        want = nbytes or (1 << 20)
        while True:
            if self._z.eof:  # end of one member: another may follow (concatenated gzip)
                pending = self._z.unused_data or self._fh.read(self._CHUNK)
                if not pending:
                    return pa.py_buffer(b"")
                self._z = zlib.decompressobj(wbits=31)
            else:
                pending = self._z.unconsumed_tail or self._fh.read(self._CHUNK)
                if not pending:
                    raise EOFError("the compressed stream ends before its end marker (truncated file)")
            out = self._z.decompress(pending, want)  # zlib.error on corrupt data
            if out:
                return pa.py_buffer(out)

    def close(self) -> None:
        self._fh.close()


class _Feed:
    """What one Arrow reader reads: the window, until a rewind hands the data to a new reader."""

    def __init__(self, window: _RawWindow, generation: int):
        self._window = window
        self._generation = generation
        self.closed = False

    def read(self, nbytes: int = -1) -> pa.Buffer:
        return self._window.read_for_feed(self._generation, nbytes)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _concat(buffers: list[pa.Buffer]) -> pa.Buffer:
    """One buffer holding the bytes of ``buffers`` in order."""
    return pa.py_buffer(np.concatenate([np.frombuffer(b, dtype=np.uint8) for b in buffers]))


def _read_header(window: _RawWindow, path: pathlib.Path) -> list[str]:
    """Parses the first physical line as CSV column names."""
    data = b""
    while b"\n" not in data:
        more = window.probe()
        if not more:
            break
        data += more
        if len(data) > _MAX_HEADER_BYTES and b"\n" not in data:
            raise ReaderError(f"{path}: no line break in the first {_MAX_HEADER_BYTES} bytes; not a CSV table")
    if window.error is not None and b"\n" not in data:
        raise CorruptFileError(f"{path}: compressed data is truncated or corrupt before the end of line 1 "
                               f"(the header): {window.error}")
    if data.startswith(_GZIP_MAGIC):  # gzip inside gzip: no CSV header would ever come out
        raise ReaderError(f"{path}: the decompressed content is gzip data again (compressed twice); "
                          "decompress it once")
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    if not line.strip():
        if not data.strip():
            raise EmptyFileError(f"{path} is empty: expected a header line with the column names")
        raise EmptyFileError(f"{path}: line 1 is blank; expected the header line with the column names")
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ReaderError(f"{path}: header line is not UTF-8 ({e})") from e
    if text.count('"') % 2:
        raise ReaderError(f"{path}: header line has an unterminated quote: {text[:200]!r}")
    return next(csv.reader(io.StringIO(text)))


def _match_header(names: list[str], schema: schemas.TableSchema, path: pathlib.Path) -> dict[str, int]:
    """Maps each schema column to its position in the header (names match case-insensitively)."""
    positions: dict[str, int] = {}
    extras: list[str] = []
    for i, name in enumerate(names):
        key = name.strip().upper()
        if key in positions:
            raise SchemaMismatchError(
                f"{path}: header names column {key} twice (positions {positions[key] + 1}, {i + 1})")
        if key in schema.column_names:
            positions[key] = i
        else:
            extras.append(name)
            positions[key] = i  # also catches duplicated extras
    missing = [c for c in schema.column_names if c not in positions]
    if missing:
        # Even a nullable column is not filled with nulls: a missing DEATHTIME would quietly
        # read as "nobody died". A header without a v1.4 column means the wrong file.
        raise SchemaMismatchError(
            f"{path}: header lacks {schema.name} column(s) {', '.join(missing)}; "
            f"found {', '.join(names)}"
        )
    if extras:
        logger.warning("%s: ignoring column(s) not in the %s v1.4 schema: %s", path, schema.name, ", ".join(extras))
    return {c: positions[c] for c in schema.column_names}


def _string_newlines(arr: pa.Array) -> int:
    """Number of '\\n' bytes in the values of a string array (nulls count none)."""
    bufs = arr.buffers()
    if arr.null_count == len(arr) or bufs[2] is None:
        return 0
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(arr) + 1, offset=4 * arr.offset)
    start, end = int(offsets[0]), int(offsets[-1])
    if end == start:
        return 0
    data = np.frombuffer(bufs[2], dtype=np.uint8, count=end - start, offset=start)
    return int(np.count_nonzero(data == _NEWLINE))


def _per_row_newlines(arr: pa.Array) -> np.ndarray:
    return pc.count_substring(arr, "\n").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _failures(raw: pa.Array, convert: Callable[[pa.Array], pa.Array]) -> np.ndarray:
    """Boolean mask of the values ``convert`` rejects, found by bisection (rare path)."""
    bad = np.zeros(len(raw), dtype=bool)

    def visit(lo: int, hi: int) -> None:
        try:
            convert(raw.slice(lo, hi - lo))
            return
        except pa.ArrowInvalid:
            pass
        if hi - lo <= 16:
            for i in range(lo, hi):
                try:
                    convert(raw.slice(i, 1))
                except pa.ArrowInvalid:
                    bad[i] = True
            return
        mid = (lo + hi) // 2
        visit(lo, mid)
        visit(mid, hi)

    visit(0, len(raw))
    return bad


def _to_int(raw: pa.Array) -> pa.Array:
    return pc.cast(raw, pa.int64())


def _to_float(raw: pa.Array) -> pa.Array:
    value = pc.cast(raw, pa.float64())
    # "inf", "nan" and "1e400" cast fine but are no measurement: they would poison every
    # mean and z-score built from the column.
    if value.null_count < len(value) and not pc.all(pc.is_finite(value)).as_py():
        raise pa.ArrowInvalid("non-finite number")
    return value


def _to_seconds(raw: pa.Array) -> pa.Array:
    # Arrow's ISO-8601 parser checks calendar ranges (no 2164-02-30) and rejects trailing text.
    return pc.cast(pc.cast(raw, pa.timestamp("s")), pa.int64())


def _checked_utf8(raw: pa.Array) -> pa.Array:
    raw.validate(full=True)
    return raw


_CONVERTERS = {
    schemas.ColType.INT: (_to_int, BAD_NUMBER, "is not an integer"),
    schemas.ColType.FLOAT: (_to_float, BAD_NUMBER, "is not a finite number"),
    schemas.ColType.TIMESTAMP: (_to_seconds, BAD_TIMESTAMP, "is not a YYYY-MM-DD[ HH:MM:SS] timestamp"),
    schemas.ColType.STR: (_checked_utf8, BAD_ENCODING, "is not valid UTF-8"),
}


@dataclasses.dataclass
class _Problem:
    column: str
    reason: str
    mask: np.ndarray
    message: str
    raw: pa.Array | None  # to quote the offending value in the detail


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

    def __init__(self, reader: TableReader, window: _RawWindow, header: list[str], positions: dict[str, int]):
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
    def _type(self, batch: pa.RecordBatch) -> tuple[list[pa.Array], list[_Problem], list[pa.Array]]:
        """Typed requested columns, their problems, and the string columns that may hold newlines."""
        n = batch.num_rows
        typed: list[pa.Array] = []
        problems: list[_Problem] = []
        nl_columns: list[pa.Array] = []
        for col, pos in self.wanted:
            raw = batch.column(pos)
            convert, reason, message = _CONVERTERS[col.type]
            try:
                value = convert(raw)
            except pa.ArrowInvalid:
                bad = _failures(raw, convert)
                # Invalid UTF-8 cannot be quoted back as text; the raw line still carries it.
                quote = raw if col.type is not schemas.ColType.STR else None
                problems.append(_Problem(col.name, reason, bad, message, quote))
                value = convert(pc.if_else(pa.array(bad), pa.nulls(n, raw.type), raw))
                # Unparseable values may hide quoted newlines; parsed numbers never do.
                nl_columns.append(raw)
            else:
                if col.type is schemas.ColType.STR:
                    nl_columns.append(raw)
                    if value.null_count < n and pc.any(pc.match_substring(value, "\0")).as_py():
                        # NUL ends C strings: a code "50912\0x" would become "50912" downstream.
                        mask = pc.fill_null(pc.match_substring(value, "\0"), False).to_numpy(zero_copy_only=False)
                        problems.append(_Problem(col.name, NUL_CHARACTER, mask, "holds a NUL character", None))
                        value = pc.if_else(pa.array(mask), pa.nulls(n, value.type), value)
            if not col.nullable and raw.null_count:
                problems.append(_Problem(col.name, MISSING_REQUIRED, raw.is_null().to_numpy(zero_copy_only=False),
                                         "is empty but NOT NULL", None))
            typed.append(value)
        nl_columns.extend(batch.column(i) for i in self.untyped)
        return typed, problems, nl_columns

    def _process(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        typed, problems, nl_columns = self._type(batch)
        counts = [_string_newlines(a) for a in nl_columns]
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
                row_nl += _per_row_newlines(arr)
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

    def _letter(self, problems: list[_Problem], i: int, line: int, raw_text: str) -> DeadLetter | None:
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
        typed, problems, _ = self._type(pa.RecordBatch.from_arrays(columns, names=self.header))
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
