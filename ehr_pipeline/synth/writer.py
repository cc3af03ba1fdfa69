"""CSV dialects and the streamed per-table files of a release.

Two dialects, as the two public copies of MIMIC-III write them:
- ``demo``: quoted UPPERCASE header, every non-NULL string quoted, numbers bare, NULL empty
  (exactly pyarrow's ``quoting_style="needed"``).
- ``physionet``: lowercase bare header, strings quoted only when they hold a comma, quote
  or line break.
Files are written as ``NAME.partial`` and renamed when complete, so a crash never leaves
a truncated file under a real table name. Formatting and gzip run on two background
threads (Arrow and zlib release the GIL), overlapping the next chunk's generation:
CHARTEVENTS, about half of all bytes, has one to itself. One thread per file keeps each
file's blocks in order.
"""
from __future__ import annotations

import collections
import concurrent.futures
import gzip
import io
import os
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ehr_pipeline.reader import table_schemas

_MAX_PENDING = 12  # queued writes before the producer waits: about one chunk's tables
_OWN_LANE = frozenset({"CHARTEVENTS"})


def header(names: tuple[str, ...] | list[str], dialect: str) -> bytes:
    """The header line (with newline) of a table in a dialect."""
    if dialect == "demo":
        return (",".join(f'"{n}"' for n in names) + "\n").encode()
    return (",".join(n.lower() for n in names) + "\n").encode()


def _minimal(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as CSV cells with minimal quoting; NULL stays NULL (written empty)."""
    if pa.types.is_string(col.type):
        needs = pc.match_substring_regex(col, r'[",\r\n]')
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(col, '"', '""'), '"', "")
        return pc.if_else(needs, quoted, col)
    return pc.cast(col, pa.string())


def format_rows(table: pa.Table, dialect: str) -> bytes | pa.Buffer:
    """CSV text of the rows (no header, LF line ends) in a dialect; numbers print identically."""
    if table.num_rows == 0:
        return b""
    if dialect == "demo":
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
        return sink.getvalue()
    cells = [_minimal(c) for c in table.columns]
    lines = pc.binary_join_element_wise(*cells, ",", null_handling="replace", null_replacement="")
    lines = pc.binary_join_element_wise(lines, "", "\n")  # appends the line end
    return _string_bytes(lines)


def _string_bytes(lines: pa.ChunkedArray | pa.Array) -> bytes:
    """The concatenated UTF-8 bytes of a string array, straight from its data buffer."""
    out = io.BytesIO()
    for chunk in (lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]):
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[chunk.offset: chunk.offset + len(chunk) + 1]
        out.write(memoryview(chunk.buffers()[2])[offsets[0]: offsets[-1]])
    return out.getvalue()


class _Stream:
    """One output file: header, appended row blocks, ROW_ID counter."""

    def __init__(self, path: pathlib.Path, head: bytes, use_gzip: bool, compresslevel: int,
                 stale: pathlib.Path | None = None):
        self.path = path
        self.stale = stale  # the same table under the other compression, removed on commit
        self.partial = path.with_name(path.name + ".partial")
        self._raw = open(self.partial, "wb")
        # mtime=0 and a fixed name keep gzip output byte-identical between runs.
        self._fh = (gzip.GzipFile(filename=path.name.removesuffix(".gz"), mode="wb", fileobj=self._raw,
                                  compresslevel=compresslevel, mtime=0) if use_gzip else self._raw)
        self._fh.write(head)
        self.rows = 0

    def write(self, data) -> None:
        if len(data):
            self._fh.write(data)

    def close(self) -> None:
        if self._fh is not self._raw:
            self._fh.close()
        self._raw.close()

    def commit(self) -> None:
        os.replace(self.partial, self.path)
        # A stale copy under the other name would shadow or contradict this one for readers.
        if self.stale is not None:
            self.stale.unlink(missing_ok=True)

    def discard(self) -> None:
        self.close()
        self.partial.unlink(missing_ok=True)


class ReleaseWriter:
    """Per-table CSV streams in ``out_dir``; use as a context manager (aborts on error)."""

    def __init__(self, out_dir: pathlib.Path, dialect: str, use_gzip: bool, compresslevel: int = 1):
        self.out_dir = pathlib.Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.dialect, self.use_gzip, self.compresslevel = dialect, use_gzip, compresslevel
        self._streams: dict[str, _Stream] = {}
        self._lanes = [concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"synth-writer{i}")
                       for i in range(2)]
        self._pending: collections.deque[concurrent.futures.Future] = collections.deque()

    def __enter__(self) -> "ReleaseWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _stream(self, table: str) -> _Stream:
        if table not in self._streams:
            gz, plain = table_schemas.TABLES[table].file_names
            name, stale = (gz, plain) if self.use_gzip else (plain, gz)
            head = header(table_schemas.TABLES[table].column_names, self.dialect)
            self._streams[table] = _Stream(self.out_dir / name, head, self.use_gzip, self.compresslevel,
                                           self.out_dir / stale)
        return self._streams[table]

    def open_extra(self, key: str, file_name: str, column_names: list[str]) -> None:
        """Opens a plain, non-MIMIC CSV (e.g. the truth file): bare UPPERCASE header."""
        self._streams[key] = _Stream(self.out_dir / file_name, (",".join(column_names) + "\n").encode(),
                                     False, 0)

    def append(self, table: str, rows: pa.Table) -> None:
        """Appends rows (schema columns minus ROW_ID, in order) and numbers their ROW_IDs from 1."""
        s = self._stream(table)
        names = table_schemas.TABLES[table].column_names
        if tuple(["ROW_ID", *rows.column_names]) != names:
            raise ValueError(f"{table}: columns {rows.column_names} do not follow the schema {names}")
        row_id = pa.array(np.arange(s.rows + 1, s.rows + 1 + rows.num_rows, dtype=np.int64))
        s.rows += rows.num_rows
        self._submit(s, rows.add_column(0, "ROW_ID", row_id), self.dialect, lane=int(table in _OWN_LANE))

    def append_extra(self, key: str, rows: pa.Table) -> None:
        """Appends rows to an extra file, numbers minimally quoted (they are all numeric)."""
        s = self._streams[key]
        s.rows += rows.num_rows
        self._submit(s, rows, "physionet", lane=0)

    def _submit(self, s: _Stream, rows: pa.Table, dialect: str, lane: int) -> None:
        while len(self._pending) >= _MAX_PENDING:
            self._pending.popleft().result()
        self._pending.append(self._lanes[lane].submit(lambda: s.write(format_rows(rows, dialect))))

    def rows(self) -> dict[str, int]:
        """Rows written so far, per table (extra files included under their key)."""
        return {k: s.rows for k, s in self._streams.items()}

    def close(self) -> None:
        """Finishes every write, closes the files and gives them their final names."""
        try:
            while self._pending:
                self._pending.popleft().result()
        except BaseException:
            self.abort()
            raise
        for lane in self._lanes:
            lane.shutdown()
        for s in self._streams.values():
            s.close()
        for s in self._streams.values():
            s.commit()

    def abort(self) -> None:
        """Drops everything written: no partial file is left behind."""
        for f in self._pending:
            f.cancel()
        for lane in self._lanes:
            lane.shutdown(wait=True)
        for s in self._streams.values():
            s.discard()
