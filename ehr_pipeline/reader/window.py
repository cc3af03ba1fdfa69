"""A window of recently read bytes of one table file, shared by Arrow's I/O thread and the reader.

Arrow reads the file through a ``Feed``; the reader asks the window for the raw text of dead
rows by physical line number, reads ahead of Arrow to quote a line Arrow gave up on, and
rewinds it so a fresh Arrow reader resumes on the line after. The buffers handed out are cut
at line ends, so what Arrow sees depends on the file and the block size alone, never on
thread timing.
"""
from __future__ import annotations

import collections
import pathlib
import threading

import numpy as np
import pyarrow as pa

from ehr_pipeline.reader.stream import open_stream

# Bytes of decompressed CSV per Arrow block (one RecordBatch each). Arrow reads about 32
# blocks ahead. At 256 KiB peak RSS stays flat from 1M to 10M rows (bench/data_jobs/csv_reader.py); 1 MiB
# blocks were no faster but let allocator fragmentation add ~20% between those sizes.
DEFAULT_BLOCK_SIZE = 256 << 10
NEWLINE = 10
_CR = 13


class RawWindow:
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

    def feed(self) -> "Feed":
        """A file-like object for one Arrow reader; it reads nothing once feeds are retired."""
        return Feed(self, self._generation)

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
    def open(cls, path: pathlib.Path, size: int = DEFAULT_BLOCK_SIZE) -> "RawWindow":
        """A window on ``path`` handing out buffers of at most ``size`` bytes (Arrow's block size)."""
        return cls(path, open_stream(path), size)

    # -- what Arrow reads, through a Feed
    def read(self, nbytes: int = -1) -> pa.Buffer:
        """The next buffer, at most ``nbytes`` bytes: what was read ahead first, then new data."""
        with self._io:
            if not self._replay:
                return self._read_new()
            buf = self._replay.popleft()
            if 0 < nbytes < len(buf):  # Arrow asks for its block size, which no buffer exceeds
                self._replay.appendleft(buf.slice(nbytes))
                buf = buf.slice(0, nbytes)
            return buf

    def __enter__(self) -> "RawWindow":
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
        newlines = np.flatnonzero(head == NEWLINE)
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
            # Without its traceback: the frames it holds reach back to the Feed that read, and a
            # feed kept alive keeps the reader waiting for Arrow to let go of it (30 s).
            self.error = e.with_traceback(None)
            self._eof = True
            if self._pending:
                data = _concat(self._pending)
                newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == NEWLINE)
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
                    offsets = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == NEWLINE)
                    chunks[idx][3] = offsets
                return idx, int(offsets[wanted - first]) + 1
        # Past the last newline read: the final line of a file without a closing newline.
        return len(chunks) - 1, len(chunks[-1][1])


class Feed:
    """What one Arrow reader reads: the window, until a rewind hands the data to a new reader."""

    def __init__(self, window: RawWindow, generation: int):
        self._window = window
        self._generation = generation
        self.closed = False

    def read(self, nbytes: int = -1) -> pa.Buffer:
        """The window's next buffer (at most ``nbytes`` bytes); empty once this feed is retired."""
        return self._window.read_for_feed(self._generation, nbytes)

    def readable(self) -> bool:
        """Always: Arrow checks before it reads."""
        return True

    def seekable(self) -> bool:
        """Never: Arrow reads it front to back."""
        return False

    def close(self) -> None:
        """Marks the feed closed; the window (and its file) outlives it."""
        self.closed = True


def _concat(buffers: list[pa.Buffer]) -> pa.Buffer:
    """One buffer holding the bytes of ``buffers`` in order."""
    return pa.py_buffer(np.concatenate([np.frombuffer(b, dtype=np.uint8) for b in buffers]))

