"""The data folder's layout: the files a job output folder holds, shared by the job, the trainer and the service.

Writes go through Beam's FileSystems, so the same code writes to a local folder or to a bucket
(gs://, s3://) when the job runs on Dataflow, Flink or Spark; local reads and joins use the
standard library, so the trainer and the service read these files without importing Beam.
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


def _filesystems():
    """Beam's FileSystems, imported on first use."""
    # Lazy: importing Beam costs ~0.2 GB and ~1 s, which the trainer and the service (local
    # reads only) must not pay; the job has imported it already.
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def join(base: str, *parts: str) -> str:
    """Joins path parts for local folders and URLs alike."""
    return _filesystems().join(base, *parts) if "://" in base else posixpath.join(base, *parts)


@contextlib.contextmanager
def created_atomically(path: str) -> Iterator[BinaryIO]:
    """A binary file object for ``path`` (local or URL): written as PATH.inprogress, renamed when done.

    A reader, or a rerun after a crash, never sees half a file under the final name; where the
    filesystem cannot rename atomically (object stores copy), it is as close as Beam gets.
    """
    filesystems = _filesystems()
    tmp = path + ".inprogress"
    with filesystems.create(tmp) as f:
        yield f
    if filesystems.exists(path):
        filesystems.delete([path])
    filesystems.rename([tmp], [path])


def write_bytes(path: str, data: bytes) -> None:
    """Writes a whole file atomically where the filesystem allows (created_atomically)."""
    with created_atomically(path) as f:
        f.write(data)


def write_json(path: str, obj: Any) -> None:
    """Writes pretty, key-sorted, strict JSON (stable bytes for stable content; NaN or Infinity raise)."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def _open_read(path: str):
    return open(path, "rb") if "://" not in path else _filesystems().open(path)


def exists(path: str) -> bool:
    """Whether a file exists (local path or Beam filesystem URL)."""
    return os.path.exists(path) if "://" not in path else _filesystems().exists(path)


def remove(path: str) -> None:
    """Deletes a file (local path or Beam filesystem URL) if it exists."""
    if exists(path):
        if "://" in path:
            _filesystems().delete([path])
        else:
            os.remove(path)


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
