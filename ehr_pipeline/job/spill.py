"""The MIMIC-III job's spill folder: frame files, bucket ranges of admissions, the cohort file, its options.

The job keeps its memory independent of the release's size by never shuffling events, records
or dead values (docs/pipeline.md, "Bounded memory"): they go to files in this folder and only
file references and counts cross a GroupByKey. A bucket is a range of the cohort's sorted
HADM_IDs with about ``bucket_admissions`` admissions, so one bucket is what a worker holds at a
time, and records of consecutive buckets concatenate into a shard already sorted.

A frame file is a sequence of ``<q HADM_ID, I payload bytes, payload>`` frames, written by one
writer (one bundle attempt) under a name of its own (a uuid): a retried bundle leaves orphans,
never duplicates, because only files named in references are read. Every file goes through
Beam's FileSystems, so the folder may be a bucket (gs://, s3://) every worker sees.

The stages around the folder, one module each (``spill_source`` A, ``spill_bag`` C, ``spill_merge``
D; the MEDS job's in ``meds_stages``), hand each other the kinds of items and sub-folders named here.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import shutil
import signal
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ehr_pipeline.contract import layout, output_folder
from ehr_pipeline.job import temp_disk

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<qI")  # HADM_ID, payload bytes
# A writer keeps each file's frames in memory up to this many bytes before it writes them: a
# stage A element writes to every bucket at once (~60 at full size), so 256 KiB each is ~15 MB,
# and an object store gets a few large writes instead of one per admission.
FLUSH_BYTES = 256 << 10
_RAW = CompressionTypes.UNCOMPRESSED  # never guess a codec from a file name


# The local runner's workers are processes of this machine, ~0.5 GB each, and its stages are CPU-bound:
# past the cores a worker adds memory and Beam's seconds of start-up, not speed. Twice the cores leaves
# room for workers waiting on a slow disk; above it, `--workers 100000` started processes until the
# machine stalled (138 in 25 s, none of them working).
MAX_WORKERS_PER_CORE = 2
# Files a job process holds open besides its frame files: Beam's channels and logs, Python's and
# Arrow's libraries, the input (sampled on the demo, 2 workers: 12-21 per process with 8 buckets, 128 at most
# with 117); with room to spare.
BASE_OPEN_FILES = 128


def max_local_workers() -> int:
    """The most local workers a run may ask for: MAX_WORKERS_PER_CORE per core of this machine."""
    return MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)


# Under this much input text one process finishes sooner: a local worker process costs seconds of Beam's
# start-up (the demo: 5.5 s in one process, 11.6 s on two workers), more than its share of a small release.
SMALL_INPUT_BYTES = 64 << 20


class SpillOptions(BaseModel):
    """How the local run uses the machine: workers, the temporary folder, bucket and block sizes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int | None = Field(None, ge=1, description="local workers; None: the machine's cores, or one for an "
                                                        "input under SMALL_INPUT_BYTES of text")
    temp_dir: str | None = Field(None, description="spill folder's parent; None: <out>/_tmp")
    bucket_admissions: int = Field(1000, ge=1, description="cohort admissions per bucket (stage C's memory)")
    bucket_rows: int = Field(500_000, ge=1, description="most MEDS rows of a shard sorted at a time (to-meds' memory)")
    split_threshold_bytes: int = Field(64 << 20, ge=1, description="gzip inputs above this are split into parts")
    block_size_bytes: int = Field(2 << 20, ge=1024, description="reader block (stage A's memory per worker)")

    @field_validator("workers")
    @classmethod
    def _at_most_the_bound(cls, workers: int | None) -> int | None:
        if workers is not None and workers > max_local_workers():
            raise ValueError(f"{workers} workers is more than {max_local_workers()}, {MAX_WORKERS_PER_CORE} per core "
                             f"of this machine's {os.cpu_count() or 1}")
        return workers

    def worker_count(self, input_bytes: int | None = None) -> int:
        """The local workers: the option, else one for input_bytes (text) under SMALL_INPUT_BYTES, else the cores."""
        if self.workers:
            return self.workers
        if input_bytes is not None and input_bytes < SMALL_INPUT_BYTES:
            return 1
        return os.cpu_count() or 1


SPILL_PREFIX = "ehr-pipeline-spill-"
# A run's spill folder in --temp-dir holds this file: which process on which machine owns it. A later
# run removes the folders whose owner is gone, and never a folder without the file.
OWNER_FILE = "owner.json"


def spill_folder(out_dir: str, temp_dir: str | None) -> str:
    """A run's spill folder: <out>/_tmp/spill (a leftover of a crashed run removed), or a new one in temp_dir."""
    if temp_dir is None:
        folder = layout.join(out_dir, layout.TMP_DIR, "spill")
        remove_folder(folder)
        return folder
    return layout.join(layout.absolute(temp_dir), f"{SPILL_PREFIX}{uuid.uuid4().hex[:12]}")


def _owner() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": round(time.time(), 3)}


def remove_dead_spill_folders(temp_dir: str) -> list[str]:
    """Removes the spill folders in a local temp_dir whose owner file names a process of this machine that is gone.

    A folder without the owner file, or owned by another machine or a live process, is left alone.
    Returns the folders removed (each logged with its size).
    """
    if "://" in temp_dir or not os.path.isdir(temp_dir):
        return []
    removed = []
    for name in sorted(os.listdir(temp_dir)):
        folder = os.path.join(temp_dir, name)
        if not name.startswith(SPILL_PREFIX) or not os.path.isdir(folder):
            continue
        try:
            with open(os.path.join(folder, OWNER_FILE)) as f:
                owner = json.load(f)
            pid, owner_host = int(owner["pid"]), str(owner["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a folder a run marked: not ours to judge
        if not output_folder.process_gone(pid, owner_host):
            continue
        size = folder_bytes(folder)
        remove_folder(folder)
        log.info("removed %s (%s bytes), the spill folder of run %d on %s, which ended without removing it",
                 folder, f"{size:,}", pid, owner_host)
        removed.append(folder)
    return removed


@contextlib.contextmanager
def spill_run(out_dir: str, temp_dir: str | None, disk_inputs: list[tuple[str, str]], split_threshold: int):
    """A run's spill folder for the ``with`` block: marked with its owner, removed at the end however the run
    ends (an error, Ctrl-C, SIGTERM), and a full disk inside turned into temp_disk.NotEnoughDiskError.

    ``disk_inputs`` ((table, file) inputs) and ``split_threshold`` size the temporary disk the error asks for.
    Folders of earlier runs that died in temp_dir are removed first (``remove_dead_spill_folders``).
    """
    if temp_dir is not None:
        remove_dead_spill_folders(layout.absolute(temp_dir))
    folder = spill_folder(out_dir, temp_dir)
    with _removed_on_sigterm(), temp_disk.disk_full_is_one_line(folder, disk_inputs, split_threshold):
        try:
            if temp_dir is not None:
                with FileSystems.create(layout.join(folder, OWNER_FILE), compression_type=_RAW) as f:
                    f.write(json.dumps(_owner()).encode("utf-8"))
            yield folder
        finally:
            remove_folder(folder)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that ``finally`` blocks run as they do for Ctrl-C; ``signum``."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def _removed_on_sigterm():
    """SIGTERM raises Terminated for the block (the main thread only: elsewhere Python cannot set a handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class OpenFilesError(OSError):
    """The process may open fewer files than a run's buckets need at once."""


def ensure_open_files(buckets: int, remedy: str | None) -> int:
    """Makes sure a process may hold `buckets` frame files open at once (+ BASE_OPEN_FILES); returns the soft limit.

    A stage A worker keeps one frame file per bucket open (``FrameWriter``), and worker processes inherit
    this process's limit: the soft limit is raised up to the hard one when it is short (logged), else
    OpenFilesError says what to raise, or (`remedy`, e.g. "pass a larger --bucket-admissions") how to
    make fewer buckets.
    """
    needed = buckets + BASE_OPEN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        log.info("open-file limit raised from %d to %d (hard limit %s): %d buckets' frame files are open at once",
                 soft, needed, "unlimited" if hard == resource.RLIM_INFINITY else hard, buckets)
        return needed
    raise OpenFilesError(
        f"{buckets:,} buckets need about {needed:,} open files per process, and this one may open {soft:,} "
        f"(hard limit {hard:,}): raise it (ulimit -n {needed}){' or ' + remedy if remedy else ''}")


# The spilling stages' own kinds of items (beside ``items``' kinds), passed from one stage's module to the next:
SPILL = "spill"  # (bucket, frame file of events): stage A's reference (spill_source)
BUCKET = "bucket"  # (bucket, [frame files or None]): stage C's element (spill_bag)
PLAN = "plan"  # the unit plan, joined to every bucket
RUN = "run"  # ((split, shard), (bucket, frame file of records)): stage D's input (spill_merge)
DEAD_RUN = "dead_run"  # (dead-letter file name, (bucket, JSONL run, lines))

# The spill folder's sub-folders: stage A's events, stage C's record runs and dead-value runs.
EVENTS_DIR, RUNS_DIR, DEAD_DIR = "events", "runs", "dead"


def bucket_folder(bucket: int) -> str:
    """A bucket's folder name among the frame files."""
    return f"b{bucket:05d}"


def bucket_count(admissions: int, workers: int, per_bucket: int) -> int:
    """Buckets for a cohort: about `per_bucket` admissions each, at least 4 per worker (balance)."""
    return max(4 * workers, math.ceil(admissions / per_bucket))


def bucket_bounds(hadm_ids: np.ndarray, buckets: int) -> np.ndarray:
    """Upper-exclusive HADM_ID bounds of at most `buckets` equal-count ranges of the sorted ids."""
    ids = np.sort(np.asarray(hadm_ids, dtype=np.int64))
    per = max(1, -(-ids.size // buckets))
    return ids[per::per].copy()


def bucket_of(bounds: np.ndarray, hadm: int) -> int:
    """The bucket (0 .. len(bounds)) holding one HADM_ID."""
    return int(np.searchsorted(bounds, hadm, side="right"))


class FrameWriter:
    """Frame files, one per key, opened on first use under ``folder/<name_of(key)>/<uuid>.frames``."""

    def __init__(self, folder: str, name_of: Callable[[Hashable], str]):
        self._folder, self._name_of = folder, name_of
        self._tag = uuid.uuid4().hex  # this attempt's: a retry writes other files
        self._pending: dict[Hashable, bytearray] = {}
        self._files: dict[Hashable, object] = {}
        self._paths: dict[Hashable, str] = {}
        self.bytes_written = 0

    def write(self, key: Hashable, hadm: int, payload: bytes) -> None:
        """Appends one frame to the key's file."""
        buf = self._pending.setdefault(key, bytearray())
        buf += _FRAME.pack(hadm, len(payload))
        buf += payload
        self.bytes_written += _FRAME.size + len(payload)
        if len(buf) >= FLUSH_BYTES:
            self._flush(key)

    def _flush(self, key: Hashable) -> None:
        f = self._files.get(key)
        if f is None:
            path = layout.join(self._folder, self._name_of(key), f"{self._tag}.frames")
            f = self._files[key] = FileSystems.create(path, compression_type=_RAW)
            self._paths[key] = path
        f.write(bytes(self._pending[key]))
        self._pending[key].clear()

    def close(self) -> dict[Hashable, str]:
        """Writes what is pending, closes every file; returns key -> path."""
        for key in list(self._pending):
            self._flush(key)
        for f in self._files.values():
            f.close()
        return dict(self._paths)


def read_frames(path: str) -> Iterator[tuple[int, bytes]]:
    """(HADM_ID, payload) of a frame file, in the order written."""
    with FileSystems.open(path, compression_type=_RAW) as f:
        data = f.read()
    view, pos = memoryview(data), 0
    while pos < len(data):
        hadm, n = _FRAME.unpack_from(data, pos)
        pos += _FRAME.size
        yield hadm, bytes(view[pos:pos + n])
        pos += n


def stream_frames(path: str) -> Iterator[tuple[int, bytes]]:
    """(HADM_ID or example key, payload) of a frame file, read frame by frame (a k-way merge holds one of each)."""
    with FileSystems.open(path, compression_type=_RAW) as f:
        while header := f.read(_FRAME.size):
            key, n = _FRAME.unpack(header)
            yield key, f.read(n)


def write_cohort_file(path: str, metas: Iterable[tuple[int, dict]], bounds: np.ndarray) -> list[tuple[int, int]]:
    """The cohort rows as JSON lines sorted by HADM_ID; returns each bucket's (byte offset, length) in it.

    One file instead of the shuffle: stage C reads its bucket's rows by offset, so the runner
    holds no cohort row (7-11 KB each in its buffers, measured).
    """
    rows = sorted(metas, key=lambda hm: hm[0])
    ranges = [[0, 0] for _ in range(len(bounds) + 1)]
    body = bytearray()
    for hadm, row in rows:
        bucket = bucket_of(bounds, hadm)
        if ranges[bucket][1] == 0:
            ranges[bucket][0] = len(body)
        line = (json.dumps(row, allow_nan=False) + "\n").encode("utf-8")
        body += line
        ranges[bucket][1] += len(line)
    with FileSystems.create(path, compression_type=_RAW) as f:
        f.write(bytes(body))
    return [(offset, length) for offset, length in ranges]


def read_cohort_rows(path: str, offset: int, length: int) -> dict[int, dict]:
    """HADM_ID -> cohort row of one bucket's byte range of the cohort file."""
    if length == 0:
        return {}
    with FileSystems.open(path, compression_type=_RAW) as f:
        f.seek(offset)
        data = f.read(length)
    rows = (json.loads(line) for line in data.decode("utf-8").splitlines())
    return {row["HADM_ID"]: row for row in rows}


def lpt_slots(items: list, slots: int, size_of: Callable[[object], int]) -> list[tuple[int, list]]:
    """Items in `slots` groups of similar total size, largest item first (longest processing time first).

    The local runner hands key k of a grouped stage to worker k mod workers, once, without work
    stealing: grouping files by size keeps one worker from drawing all of CHARTEVENTS.
    """
    load = [0] * slots
    groups: list[list] = [[] for _ in range(slots)]
    for item in sorted(items, key=lambda it: (-size_of(it), it)):
        k = min(range(slots), key=load.__getitem__)
        load[k] += size_of(item)
        groups[k].append(item)
    return [(k, group) for k, group in enumerate(groups) if group]


def folder_bytes(folder: str) -> int:
    """Bytes of every file under a folder (local or a filesystem URL); 0 when it does not exist."""
    if "://" in folder:
        found = FileSystems.match([layout.join(folder, "**")])[0].metadata_list
        return sum(m.size_in_bytes for m in found)
    total = 0
    for root, _, files in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total


def remove_folder(folder: str) -> None:
    """Deletes a folder and everything under it (local or a filesystem URL), if it exists."""
    if "://" not in folder:
        shutil.rmtree(folder, ignore_errors=True)
        return
    found = FileSystems.match([layout.join(folder, "**")])[0].metadata_list
    if found:
        FileSystems.delete([m.path for m in found])
