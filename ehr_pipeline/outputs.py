"""File layout of the job's output folder, shared by the job, the trainer and the service.

Everything goes through Beam's FileSystems so the same code writes to a local folder or to a
bucket (gs://, s3://) when the job runs on Dataflow, Flink or Spark.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any, BinaryIO

MANIFEST = "manifest.json"
VOCABULARY = "vocabulary.json"
NUMERIC_STATS = "numeric_stats.json"
# LOINC -> lab ITEMIDs from D_LABITEMS.LOINC_CODE: how FHIR lab Observations reach the model's codes.
LAB_LOINC = "lab_loinc.json"
# Units each numeric code's values were recorded in: the service warns about any other unit.
UNITS = "units.json"
# The MEDS code map a MEDS-sourced run read its codes with: the service reads requests' MEDS codes with it.
MEDS_CODES = "meds_codes.json"
DEAD_LETTER_DIR = "dead_letter"
TMP_DIR = "_tmp"


def absolute(path: str | os.PathLike[str]) -> str:
    """A local path made absolute against this process's working directory; a URL (gs://, s3://) as given."""
    path = os.fspath(path)
    return path if "://" in path else os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    """Joins path parts for local folders and URLs alike."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.join(base, *parts) if "://" in base else posixpath.join(base, *parts)


@contextlib.contextmanager
def created_atomically(path: str) -> Iterator[BinaryIO]:
    """A binary file object for ``path`` (local or URL): written as PATH.inprogress, renamed when done.

    A reader, or a rerun after a crash, never sees half a file under the final name; where the
    filesystem cannot rename atomically (object stores copy), it is as close as Beam gets.
    """
    from apache_beam.io.filesystems import FileSystems

    tmp = path + ".inprogress"
    with FileSystems.create(tmp) as f:
        yield f
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])


def write_bytes(path: str, data: bytes) -> None:
    """Writes a whole file atomically where the filesystem allows (created_atomically)."""
    with created_atomically(path) as f:
        f.write(data)


def write_json(path: str, obj: Any) -> None:
    """Writes pretty, key-sorted, strict JSON (stable bytes for stable content; NaN or Infinity raise)."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def _open_read(path: str):
    # Local reads must not pay Beam's import: the trainer and the service read these files too.
    if "://" not in path:
        return open(path, "rb")
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path)


def exists(path: str) -> bool:
    """Whether a file exists (local path or Beam filesystem URL)."""
    if "://" not in path:
        import os

        return os.path.exists(path)
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.exists(path)


def read_json(path: str) -> Any:
    """Reads a JSON file written by write_json."""
    with _open_read(path) as f:
        return json.loads(f.read().decode())


def sha256_of(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with _open_read(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
