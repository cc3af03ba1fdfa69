"""Big gzip inputs -> zstd parts cut at line ends, so every worker reads a share of one table.

One gzip stream can only be decompressed from its start: a single CHARTEVENTS.csv.gz (57% of
MIMIC-III's rows) would keep one worker busy while the others wait. Each file above a threshold
is decompressed once and its blocks (~16 MiB of text) are dealt to parts round-robin; a block
ends after the last newline at which the number of '"' since the file's start is even (RFC 4180
doubles quotes inside a field, so parity tells whether a newline is inside a field). Bytes are
copied, never parsed: a malformed row stays malformed and the reader dead-letters it in its part,
naming the part and the part's line. A file whose quotes never balance again is cut at a newline
after four blocks, so a broken row costs one part, not the whole file.

Blocks are dealt round-robin, so a part's lines are not a stretch of the file: beside each part
``<part>.lines.json`` says which of its lines are which of the file's (``part_lines``), so that a row
of a part can be named, and ordered, by the release's own file and line (a repeated ROW_ID keeps
the first row of the file, ``job.dedup``).

Parts are zstd level 1 (measured on the 2,000-patient CHARTEVENTS, 439 MB of text: 63 MB of parts
for 3.6 CPU s, against 81 MB and 25.9 CPU s for ``ehr-pipeline shard``'s csv module and gzip),
which the reader reads by their magic bytes.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import shutil
import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from ehr_pipeline.reader import CorruptFileError, table_schemas

log = logging.getLogger(__name__)

_READ = 1 << 20  # compressed bytes read at a time
# Temporary disk per byte of input, the peak of the spill folder sampled every 0.05 s (docs/pipeline.md,
# "Temporary disk"): zstd parts 0.78 byte per byte of a split gzip file (a 1,000-patient synthetic
# release; 0.85 at full size); events, record runs and dead values 1.52 per byte of event-table input
# on the real demo (its patients' many admissions share their events), 0.65 on that synthetic release
# and 0.58 at full size. The check asks for the worst measured with ~30% margin: the other failure, a
# disk filled half-way through, costs the run.
PART_BYTES_PER_GZIP_BYTE = 1.0
SPILL_BYTES_PER_INPUT_BYTE = 2.0


class NotEnoughDiskError(OSError):
    """The temporary folder has less free space than the split and the spill need."""


def block_bytes(threshold: int) -> int:
    """Text bytes per block dealt to a part: a quarter of the threshold, within 64 KiB .. 16 MiB."""
    return max(64 << 10, min(16 << 20, threshold // 4))


def part_name(table: str, part: int, parts: int) -> str:
    """File name of one part, e.g. CHARTEVENTS-00003-of-00016.csv.zst."""
    return f"{table_schemas.get(table).name}-{part:05d}-of-{parts:05d}.csv.zst"


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
    paths = [os.path.join(out_dir, part_name(table, i, parts)) for i in range(parts)]
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


def temp_bytes_needed(inputs: list[tuple[str, str]], threshold: int) -> int:
    """Temporary bytes a run of these (table, file) inputs needs at its peak, with margin (the ratios above)."""
    sizes = [os.path.getsize(path) for _, path in inputs]
    split = sum(size for (_, path), size in zip(inputs, sizes) if parts_for(size, threshold) and is_gzip(path))
    return int(PART_BYTES_PER_GZIP_BYTE * split + SPILL_BYTES_PER_INPUT_BYTE * sum(sizes))


def check_free_space(folder: str, inputs: list[tuple[str, str]], threshold: int) -> None:
    """Raises NotEnoughDiskError (one line, the folder and the bytes) when the temp folder cannot hold the run."""
    if "://" in folder:
        return  # an object store: no free space to ask for
    needed = temp_bytes_needed(inputs, threshold)
    free = shutil.disk_usage(_existing(folder)).free
    if free < needed:
        raise NotEnoughDiskError(
            f"{folder}: {free:,} bytes free, the job needs about {needed:,} for its temporary files "
            f"(input parts and spilled events); free space there or pass --temp-dir")


def _existing(folder: str) -> str:
    """The folder, or its nearest parent that exists (what a free-space query can ask about)."""
    while not os.path.exists(folder):
        folder = os.path.dirname(folder) or "."
    return folder


_DISK_FULL = ("[errno 28]", "no space left on device", "disk quota exceeded", "[errno 122]")


def is_disk_full(err: BaseException) -> bool:
    """Whether an error is a full disk (ENOSPC, EDQUOT): its errno, an error it came from, or its text.

    The text counts because Beam hands a worker's error to the driver as a RuntimeError holding the
    worker's traceback, and an OSError re-raised with Beam's step name added loses its errno.
    """
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(marker in str(err).lower() for marker in _DISK_FULL):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def disk_full_is_one_line(folder: str, inputs: list[tuple[str, str]], threshold: int):
    """Turns a full disk anywhere inside (the driver's split, a Beam worker's write) into a NotEnoughDiskError
    naming the temporary folder, its free bytes and the bytes the run needs there."""
    try:
        yield
    except NotEnoughDiskError:
        raise
    except Exception as err:
        if not is_disk_full(err):
            raise
        free = "?" if "://" in folder else f"{shutil.disk_usage(_existing(folder)).free:,}"
        raise NotEnoughDiskError(
            f"{folder}: the disk filled up during the job ({free} bytes free now that its temporary files are "
            f"gone); the job needs about {temp_bytes_needed(inputs, threshold):,} bytes there for its temporary "
            "files, and room for its output beside them: free space or pass --temp-dir") from None


def split_large_inputs(inputs: list[tuple[str, str]], out_dir: str, threshold: int) -> list[tuple[str, str]]:
    """(table, path) inputs with every gzip file above `threshold` bytes replaced by its zstd parts."""
    out = []
    for table, path in inputs:
        parts = parts_for(os.path.getsize(path), threshold)
        if parts and is_gzip(path):
            log.info("splitting %s (%d bytes) into %d parts in %s", path, os.path.getsize(path), parts, out_dir)
            # A folder per input file: two parts of one table (`ehr-pipeline shard`'s) split apart.
            paths = split_file(path, table, os.path.join(out_dir, os.path.basename(path)), parts,
                               block_bytes(threshold))
            out.extend((table, p) for p in paths)
        else:
            out.append((table, path))
    return out
