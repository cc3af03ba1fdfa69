"""A big table file cut into parts that workers read in parallel: the job's own parts, or ``ehr-pipeline shard``'s.

One gzip stream can only be decompressed from its start, so one file is read by one worker: a
single CHARTEVENTS.csv.gz (57% of MIMIC-III's rows, 330M at full size) would keep one worker busy
while the others wait. Both ways below copy bytes or fields, never parse them into types: a
malformed row stays malformed and the reader dead-letters it in its part, naming the part and the
part's line. A part is named TABLE-00003-of-00016.csv.<codec> (``part_name``) and holds the header.

The job's parts (``split_file``), cut on every run in its temporary folder (``job.run.split_inputs``):
each gzip file above a threshold is decompressed once and its blocks (~16 MiB of text) are dealt to
parts round-robin; a block ends after the last newline at which the number of '"' since the file's
start is even (RFC 4180 doubles quotes inside a field, so parity tells whether a newline is inside a
field). A file whose quotes never balance again is cut at a newline after four blocks, so a broken
row costs one part, not the whole file. Since a part's lines are not a stretch of the file, beside
each part ``<part>.lines.json`` says which of its lines are which of the file's (``part_lines``), so
that a row of a part can be named, and ordered, by the release's own file and line (a repeated
ROW_ID keeps the first row of the file, ``job.dedup``). These parts are zstd level 1 (measured on
the 2,000-patient CHARTEVENTS, 439 MB of text: 63 MB of parts for 3.6 CPU s, against 81 MB and 25.9
CPU s for the csv module and gzip of ``write_table_parts``), which the reader reads by their magic
bytes. The temporary disk they take is ``job.temp_disk``'s to check.

``ehr-pipeline shard``'s parts (``write_table_parts``), written once beside the release: complete
gzip CSVs, rows dealt round-robin in blocks of ``ROWS_PER_BLOCK`` with the csv module, which
``reader.locate_table_files`` and the job pick up instead of the single file (each part then a file
of the release of its own).

numpy, pyarrow, tqdm and the standard library only: no Beam.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import math
import os
import pathlib
import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from ehr_pipeline.reader import CorruptFileError, ReaderError, table_schemas

log = logging.getLogger(__name__)

_READ = 1 << 20  # compressed bytes read at a time (the job's parts)
ROWS_PER_BLOCK = 50_000  # ``write_table_parts``: rows go to parts round-robin in blocks of this many


def part_name(table: str, part: int, parts: int, codec: str) -> str:
    """File name of one part, e.g. CHARTEVENTS-00003-of-00016.csv.zst (codec "zst") or .csv.gz ("gz")."""
    return f"{table_schemas.get(table).name}-{part:05d}-of-{parts:05d}.csv.{codec}"


# ----------------------------------------------------------------------------- the job's parts


def block_bytes(threshold: int) -> int:
    """Text bytes per block dealt to a part: a quarter of the threshold, within 64 KiB .. 16 MiB."""
    return max(64 << 10, min(16 << 20, threshold // 4))


def _gunzip(path: str) -> Iterator[bytes]:
    """Decompressed pieces of a gzip file, every member of it; CorruptFileError naming the file when it is
    truncated or corrupt (the reader's error for the same file read whole)."""
    done = 0  # decompressed bytes handed out: where the damage starts
    with open(path, "rb") as fh:
        z, fed = zlib.decompressobj(wbits=31), False
        while True:
            data = z.unconsumed_tail or fh.read(_READ)
            if not data:
                if fed and not z.eof:
                    raise CorruptFileError(f"{path}: compressed data is truncated after {done:,} decompressed bytes "
                                           "(the gzip stream ends before its end marker); nothing of the table "
                                           "was used")
                return
            fed = True
            try:
                out = z.decompress(data, 4 * _READ)
                if z.eof and z.unused_data:  # another member follows (concatenated gzip)
                    rest = z.unused_data
                    z = zlib.decompressobj(wbits=31)
                    out += z.decompress(rest, 4 * _READ)
                elif z.eof:
                    z, fed = zlib.decompressobj(wbits=31), False
            except zlib.error as err:
                raise CorruptFileError(f"{path}: compressed data is corrupt after {done:,} decompressed bytes "
                                       f"({err}); nothing of the table was used") from None
            if out:
                done += len(out)
                yield out


def _cut(buf: bytearray, parity: int, block: int, force: bool) -> int:
    """Bytes of buf up to a newline outside quotes: the last within `block` bytes, else the first after.

    ``parity`` is the number of '"' before buf, mod 2. Returns 0 when there is none yet (a quoted
    field runs on), unless ``force``: then any newline after ``block`` bytes will do.
    """
    pos = buf.rfind(b"\n", 0, block)
    quotes = buf.count(b'"', 0, pos) if pos >= 0 else 0
    while pos >= 0:
        if (parity + quotes) % 2 == 0:
            return pos + 1
        prev = buf.rfind(b"\n", 0, pos)
        quotes -= buf.count(b'"', prev + 1 if prev >= 0 else 0, pos)
        pos = prev
    pos = buf.find(b"\n", block)
    quotes = buf.count(b'"', 0, pos) if pos >= 0 else 0
    while pos >= 0:
        if (parity + quotes) % 2 == 0:
            return pos + 1
        nxt = buf.find(b"\n", pos + 1)
        quotes += buf.count(b'"', pos, nxt) if nxt >= 0 else 0
        pos = nxt
    if force:
        pos = buf.find(b"\n", block)
        return pos + 1 if pos >= 0 else buf.rfind(b"\n") + 1
    return 0


def _header_end(buf: bytearray) -> int:
    """Bytes of buf up to its first newline outside quotes (the header line); 0 if none yet."""
    pos, start, quotes = buf.find(b"\n"), 0, 0
    while pos >= 0:
        quotes += buf.count(b'"', start, pos)
        if quotes % 2 == 0:
            return pos + 1
        start, pos = pos, buf.find(b"\n", pos + 1)
    return 0


def split_file(src: str, table: str, out_dir: str, parts: int, block: int) -> list[str]:
    """Splits one gzip CSV into `parts` zstd CSV parts, each with the header; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, part_name(table, i, parts, "zst")) for i in range(parts)]
    sinks = [pa.CompressedOutputStream(pa.OSFile(p + ".inprogress", "wb"), "zstd") for p in paths]
    buf, parity, header, nxt = bytearray(), 0, None, 0
    blocks: list[list[tuple[int, int]]] = [[] for _ in range(parts)]  # per part: (its line, the file's line)
    part_line, file_line = [0] * parts, 0
    progress = tqdm(unit="B", unit_scale=True, desc=f"split {os.path.basename(src)}", disable=None)
    try:
        for piece in _gunzip(src):
            buf += piece
            if header is None:
                end = _header_end(buf)
                if not end:
                    continue
                header = bytes(buf[:end])
                del buf[:end]
                part_line, file_line = [header.count(b"\n") + 1] * parts, header.count(b"\n") + 1
                for sink in sinks:
                    sink.write(header)
            while len(buf) >= block:
                end = _cut(buf, parity, block, force=len(buf) >= 4 * block)
                if not end:
                    break
                parity = (parity + buf.count(b'"', 0, end)) % 2
                lines = buf.count(b"\n", 0, end)
                blocks[nxt].append((part_line[nxt], file_line))
                part_line[nxt] += lines
                file_line += lines
                sinks[nxt].write(memoryview(buf)[:end])
                nxt = (nxt + 1) % parts
                del buf[:end]
            progress.update(len(piece))
        if header is None:  # a file without a newline: its only line is its header
            header, buf = bytes(buf), bytearray()
            for sink in sinks:
                sink.write(header)
        if buf:
            blocks[nxt].append((part_line[nxt], file_line))
            sinks[nxt].write(buf)
    except BaseException:
        progress.close()
        for sink in sinks:
            _close_quietly(sink)
        for path in paths:  # half a part would read as a complete one
            _remove_quietly(path + ".inprogress")
        raise
    progress.close()
    for sink in sinks:
        sink.close()
    for path, found in zip(paths, blocks):
        with open(path + LINES_SUFFIX, "w") as f:  # before the part: a part never lies without it
            json.dump({"file": src, "blocks": found}, f)
        os.replace(path + ".inprogress", path)
    return paths


LINES_SUFFIX = ".lines.json"


def part_lines(path: str):
    """For a part split_file wrote: (the file it was cut from, a function: the part's lines -> the file's lines).

    None for any other file. Lines are 1-based physical lines (int64 arrays).
    """
    if not os.path.exists(path + LINES_SUFFIX):
        return None
    with open(path + LINES_SUFFIX) as f:
        doc = json.load(f)
    blocks = np.asarray(doc["blocks"], dtype=np.int64).reshape(-1, 2)
    starts, shift = blocks[:, 0], blocks[:, 1] - blocks[:, 0]

    def to_file(lines: np.ndarray) -> np.ndarray:
        lines = np.asarray(lines, dtype=np.int64)
        if not starts.size:
            return lines
        return lines + shift[np.maximum(np.searchsorted(starts, lines, side="right") - 1, 0)]

    return doc["file"], to_file


def _close_quietly(sink) -> None:
    """Closes a part's stream after a failure: a full disk fails the close too, and the first error is the one."""
    try:
        sink.close()
    except OSError:
        pass


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def parts_for(size: int, threshold: int) -> int:
    """Parts for a gzip file of `size` bytes: none (0) at or below the threshold, else one per threshold."""
    return 0 if size <= threshold else max(2, math.ceil(size / threshold))


def is_gzip(path: str) -> bool:
    """Whether a file holds gzip data (by its magic bytes, whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


# ----------------------------------------------------------------------------- ehr-pipeline shard's parts


def _open_text(path: pathlib.Path):
    raw = open(path, "rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", newline="")
    raw.seek(0)
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def write_table_parts(src: str | pathlib.Path, table: str, out_dir: str | pathlib.Path, parts: int,
                show_progress: bool = True) -> tuple[list[pathlib.Path], int]:
    """Copies `src` into `parts` gzip parts in `out_dir`; returns (part paths, data rows copied)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    src, out_dir = pathlib.Path(src), pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / part_name(table, i, parts, "gz") for i in range(parts)]
    tmp = [p.with_name(p.name + ".inprogress") for p in paths]
    sinks = [io.TextIOWrapper(gzip.GzipFile(t, "wb", compresslevel=1, mtime=0), encoding="utf-8", newline="")
             for t in tmp]
    writers = [csv.writer(s, lineterminator="\n") for s in sinks]
    rows = 0
    try:
        with _open_text(src) as f:
            reader = csv.reader(f)
            try:
                header = next(reader)
            except StopIteration:
                raise ReaderError(f"{src}: empty file, no header") from None
            for w in writers:
                w.writerow(header)
            for row in tqdm(reader, desc=f"shard {table}", unit=" rows", disable=not show_progress,
                            mininterval=1.0):
                writers[(rows // ROWS_PER_BLOCK) % parts].writerow(row)
                rows += 1
    except BaseException as err:
        for s in sinks:
            try:
                s.close()
            except OSError:  # a full disk fails the close too; the first error is the one to report
                pass
        for t in tmp:  # half a part would read as a complete one
            t.unlink(missing_ok=True)
        if isinstance(err, (EOFError, zlib.error, gzip.BadGzipFile)):
            raise CorruptFileError(f"{src}: compressed data is truncated or corrupt after {rows:,} data rows "
                                   f"({err}); no part was written") from None
        if isinstance(err, (UnicodeDecodeError, csv.Error)):
            raise ReaderError(f"{src}: cannot be copied as CSV after {rows:,} data rows ({err}); "
                              "no part was written") from None
        raise
    for s in sinks:
        s.close()
    for t, p in zip(tmp, paths):
        t.replace(p)
    log.info("%s: %d rows copied into %d parts in %s", src, rows, parts, out_dir)
    return paths, rows
