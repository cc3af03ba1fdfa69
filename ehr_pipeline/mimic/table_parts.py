"""Split one large table file into parts that workers can read in parallel.

A gzip file can only be decompressed from its start, so the Beam job reads each file on one
worker; CHARTEVENTS (330M rows, one file) would then bound the whole run. ``write_table_parts``
rewrites it as TABLE-00000-of-000NN.csv.gz parts, each a complete CSV with the header, which
``reader.locate_table_files`` and the job pick up instead of the single file.

Rows are copied field by field with the csv module, never parsed into types: a malformed row
stays malformed and is dead-lettered by the job's reader like any other, so nothing is lost or
silently repaired here.
"""
from __future__ import annotations

import csv
import gzip
import io
import logging
import pathlib
import zlib

from tqdm.auto import tqdm

from ehr_pipeline.reader import CorruptFileError, ReaderError, table_schemas

log = logging.getLogger(__name__)

ROWS_PER_BLOCK = 50_000  # rows go to parts round-robin in blocks of this many


def part_name(table: str, part: int, parts: int) -> str:
    """File name of one part, e.g. CHARTEVENTS-00003-of-00016.csv.gz."""
    return f"{table_schemas.get(table).name}-{part:05d}-of-{parts:05d}.csv.gz"


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
    paths = [out_dir / part_name(table, i, parts) for i in range(parts)]
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
