"""The decompressed bytes of a table file, whatever its name says it holds.

The content decides, never the name: export tools write plain text as TABLE.csv.gz and gzip as
TABLE.csv. zstd is read too: the job splits a big gzip table into zstd parts (mimic/table_parts.py).
Other containers are refused with a line naming what was found instead of failing inside a
decompressor.
"""
from __future__ import annotations

import logging
import pathlib
import zlib

import pyarrow as pa

from ehr_pipeline.reader.errors import ReaderError

# The package's logger, not this module's: what the reader logs keeps one name for filters.
logger = logging.getLogger(__package__)

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Other containers an export tool may write under a .csv or .csv.gz name: the reader reads
# plain CSV, gzip and zstd only, and names what it found instead of failing inside a decompressor.
_OTHER_MAGIC = (
    (b"PK\x03\x04", "a zip archive"),
    (b"BZh", "bzip2-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
)


def open_stream(path: pathlib.Path):
    """A stream with ``read_buffer(nbytes)`` and ``close()`` over the decompressed content of ``path``."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except FileNotFoundError:
        raise  # a MissingTableError's kin, naming the file
    except OSError as err:  # a folder, no permission, an I/O error: the file is unreadable, not the job broken
        raise ReaderError(f"{path}: cannot be read ({err.strerror or err})") from None
    # The content decides, never the name (Arrow's input_stream would guess gzip from ".gz").
    if magic.startswith(GZIP_MAGIC):
        if not path.name.lower().endswith(".gz"):
            logger.info("%s holds gzip data despite its name: reading it decompressed", path)
        return GunzipStream(open(path, "rb"))
    if magic.startswith(ZSTD_MAGIC):
        return pa.input_stream(str(path), compression="zstd")
    for prefix, what in _OTHER_MAGIC:
        if magic.startswith(prefix):
            raise ReaderError(f"{path}: the file holds {what}, not CSV, gzip or zstd; extract the "
                              "table's CSV (plain or gzip-compressed, under either name)")
    if path.name.lower().endswith(".gz"):
        logger.info("%s holds no gzip data despite its name: reading it as plain CSV", path)
    return pa.input_stream(str(path), compression=None)


class GunzipStream:
    """Decompresses a gzip file (all members) and, unlike Arrow's stream, hands out every byte
    before a truncation or corruption: the reader can then name the last complete line."""

    _CHUNK = 1 << 16

    def __init__(self, fh):
        self._fh = fh
        self._z = zlib.decompressobj(wbits=31)

    def read_buffer(self, nbytes: int | None = None) -> pa.Buffer:
        """The next decompressed bytes, at most ``nbytes`` (1 MiB when None); empty at the end."""
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
        """Closes the file."""
        self._fh.close()
