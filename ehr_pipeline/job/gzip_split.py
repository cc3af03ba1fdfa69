"""Big gzip inputs -> zstd parts cut at line ends, so every worker reads a share of one table.

One gzip stream can only be decompressed from its start: a single CHARTEVENTS.csv.gz (57% of
MIMIC-III's rows) would keep one worker busy while the others wait. Each file above a threshold
is decompressed once and its blocks (~16 MiB of text) are dealt to parts round-robin; a block
ends after the last newline at which the number of '"' since the file's start is even (RFC 4180
doubles quotes inside a field, so parity tells whether a newline is inside a field). Bytes are
copied, never parsed: a malformed row stays malformed and the reader dead-letters it in its part,
naming the part and the part's line. A file whose quotes never balance again is cut at a newline
after four blocks, so a broken row costs one part, not the whole file.

Parts are zstd level 1 (measured on the 2,000-patient CHARTEVENTS, 439 MB of text: 63 MB of parts
for 3.6 CPU s, against 81 MB and 25.9 CPU s for ``ehr-pipeline shard``'s csv module and gzip),
which the reader reads by their magic bytes.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import zlib
from collections.abc import Iterator

import pyarrow as pa
from tqdm.auto import tqdm

from ehr_pipeline.reader import table_schemas

log = logging.getLogger(__name__)

_READ = 1 << 20  # compressed bytes read at a time
# Temporary disk per byte of gzip input, measured on synthetic releases (docs/pipeline.md): zstd
# parts ~0.8 byte per byte of a split gzip file, spilled events ~0.5 per byte of any input.
PART_BYTES_PER_GZIP_BYTE = 0.8
SPILL_BYTES_PER_INPUT_BYTE = 0.5


class NotEnoughDiskError(OSError):
    """The temporary folder has less free space than the split and the spill need."""


def block_bytes(threshold: int) -> int:
    """Text bytes per block dealt to a part: a quarter of the threshold, within 64 KiB .. 16 MiB."""
    return max(64 << 10, min(16 << 20, threshold // 4))


def part_name(table: str, part: int, parts: int) -> str:
    """File name of one part, e.g. CHARTEVENTS-00003-of-00016.csv.zst."""
    return f"{table_schemas.get(table).name}-{part:05d}-of-{parts:05d}.csv.zst"


def _gunzip(path: str) -> Iterator[bytes]:
    """Decompressed pieces of a gzip file, every member of it."""
    with open(path, "rb") as fh:
        z, fed = zlib.decompressobj(wbits=31), False
        while True:
            data = z.unconsumed_tail or fh.read(_READ)
            if not data:
                if fed and not z.eof:
                    raise EOFError(f"{path}: the gzip stream ends before its end marker (truncated file)")
                return
            fed = True
            out = z.decompress(data, 4 * _READ)
            if out:
                yield out
            if z.eof:  # another member may follow (concatenated gzip)
                rest = z.unused_data
                z, fed = zlib.decompressobj(wbits=31), bool(rest)
                if rest:
                    out = z.decompress(rest, 4 * _READ)
                    if out:
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
                for sink in sinks:
                    sink.write(header)
            while len(buf) >= block:
                end = _cut(buf, parity, block, force=len(buf) >= 4 * block)
                if not end:
                    break
                parity = (parity + buf.count(b'"', 0, end)) % 2
                sinks[nxt].write(memoryview(buf)[:end])
                nxt = (nxt + 1) % parts
                del buf[:end]
            progress.update(len(piece))
        if header is None:  # a file without a newline: its only line is its header
            header, buf = bytes(buf), bytearray()
            for sink in sinks:
                sink.write(header)
        if buf:
            sinks[nxt].write(buf)
    finally:
        progress.close()
        for sink in sinks:
            sink.close()
    for path in paths:
        os.replace(path + ".inprogress", path)
    return paths


def parts_for(size: int, threshold: int) -> int:
    """Parts for a gzip file of `size` bytes: none (0) at or below the threshold, else one per threshold."""
    return 0 if size <= threshold else max(2, math.ceil(size / threshold))


def is_gzip(path: str) -> bool:
    """Whether a file holds gzip data (by its magic bytes, whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def check_free_space(folder: str, inputs: list[tuple[str, str]], threshold: int) -> None:
    """Raises NotEnoughDiskError (one line, the folder and the bytes) when the temp folder cannot hold the run."""
    if "://" in folder:
        return  # an object store: no free space to ask for
    sizes = [os.path.getsize(path) for _, path in inputs]
    split = sum(size for (_, path), size in zip(inputs, sizes) if parts_for(size, threshold) and is_gzip(path))
    needed = int(PART_BYTES_PER_GZIP_BYTE * split + SPILL_BYTES_PER_INPUT_BYTE * sum(sizes))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing) or "."
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise NotEnoughDiskError(
            f"{folder}: {free:,} bytes free, the job needs about {needed:,} for its temporary files "
            f"(input parts and spilled events); free space there or pass --temp-dir")


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
