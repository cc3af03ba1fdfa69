"""The temporary disk a job needs: checked before it starts, and a full disk inside it told in one line.

A run's temporary folder holds the parts of its big gzip inputs (``mimic.table_parts``) and its
spill folder (``spill``); both grow with the input, so the job asks for their worst measured size
per input byte before any work starts (``check_free_space``), and a disk that fills up anyway (a
worker's write, the driver's split) ends the run with ``NotEnoughDiskError`` naming the folder and
the bytes (``disk_full_is_one_line``), not a runner's traceback.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil

from ehr_pipeline.mimic.table_parts import is_gzip, parts_for

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
