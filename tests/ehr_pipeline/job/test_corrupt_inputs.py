"""Truncated or corrupt compressed tables on every road that decompresses them: one line naming the file.

The job's split of big gzip tables and ``ehr-pipeline shard`` (both ``mimic.table_parts``) and the
reader of zstd parts each meet the same damaged bytes; each must raise the reader's CorruptFileError
naming the file (the CLI prints it as one line, exit 2), never an EOFError or zlib.error, and must leave
no half-written part behind. The expected outcome is computed apart: Python's gzip module on the same
bytes says whether the damage is detectable at all.
"""
from __future__ import annotations

import gzip
import os
import pathlib
import shutil
import zlib

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ehr_pipeline.contract import PipelineConfig
from ehr_pipeline.job import SpillOptions, run_job, run_to_meds
from ehr_pipeline.mimic import table_parts
from ehr_pipeline.reader import CorruptFileError, ReaderError, read_table
from tests.support.job_outputs import CONFIG

HEADER = b'"ROW_ID","SUBJECT_ID","HADM_ID","SEQ_NUM","ICD9_CODE"\n'
TEXT = HEADER + b"".join(b'%d,%d,%d,1,"%05d"\n' % (i, i % 97, 100000 + i % 500, i * 7 % 99991)
                         for i in range(1, 4001))
GZ = gzip.compress(TEXT, compresslevel=6, mtime=0)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _python_gzip_reads(data: bytes) -> bool:
    """Whether Python's own gzip module reads these bytes without an error (the independent verdict)."""
    try:
        gzip.decompress(data)
    except (EOFError, OSError, zlib.error):
        return False
    return True


def _write(folder: pathlib.Path, name: str, data: bytes) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


@FAST
@given(cut=st.integers(2, len(GZ) - 1))  # from the magic on: shorter is no gzip file
def test_a_gzip_table_cut_anywhere_fails_the_split_naming_the_file(tmp_path_factory, cut):
    folder = tmp_path_factory.mktemp("cut")
    src = _write(folder, "DIAGNOSES_ICD.csv.gz", GZ[:cut])
    with pytest.raises(CorruptFileError) as err:
        table_parts.split_file(str(src), "DIAGNOSES_ICD", str(folder / "parts"), 3, 64 << 10)
    assert str(src) in str(err.value) and "\n" not in str(err.value)
    assert not list((folder / "parts").iterdir())  # no part, not even an unfinished one


@FAST
@given(at=st.integers(0, len(GZ) - 1), flip=st.integers(1, 255))
def test_a_corrupt_byte_fails_the_split_naming_the_file_or_changes_nothing(tmp_path_factory, at, flip):
    damaged = bytearray(GZ)
    damaged[at] ^= flip
    folder = tmp_path_factory.mktemp("flip")
    src = _write(folder, "DIAGNOSES_ICD.csv.gz", bytes(damaged))
    if _python_gzip_reads(bytes(damaged)):  # a header byte gzip ignores (mtime, OS): the same table
        paths = table_parts.split_file(str(src), "DIAGNOSES_ICD", str(folder / "parts"), 3, 64 << 10)
        rows = sorted(line for p in paths for line in pa.input_stream(p, compression="zstd").read().splitlines()[1:])
        assert rows == sorted(gzip.decompress(bytes(damaged)).splitlines()[1:])
        return
    with pytest.raises(ReaderError) as err:
        table_parts.split_file(str(src), "DIAGNOSES_ICD", str(folder / "parts"), 3, 64 << 10)
    assert str(src) in str(err.value) and "\n" not in str(err.value)
    assert not list((folder / "parts").iterdir())


@FAST
@given(cut=st.integers(2, len(GZ) - 1))  # from the magic on: shorter is no gzip file
def test_shard_of_a_gzip_table_cut_anywhere_fails_naming_the_file(tmp_path_factory, cut):
    folder = tmp_path_factory.mktemp("shard")
    src = _write(folder / "in", "DIAGNOSES_ICD.csv.gz", GZ[:cut])
    with pytest.raises(ReaderError) as err:
        table_parts.write_table_parts(src, "DIAGNOSES_ICD", folder / "out", 2, show_progress=False)
    assert str(src) in str(err.value) and "\n" not in str(err.value)
    assert not list((folder / "out").iterdir())


def test_shard_of_a_file_that_is_not_gzip_inside_fails_naming_the_file(tmp_path):
    src = _write(tmp_path / "in", "DIAGNOSES_ICD.csv.gz", b"\x1f\x8b\x08\x00" + b"\x00" * 40)
    with pytest.raises(ReaderError, match=str(src)):
        table_parts.write_table_parts(src, "DIAGNOSES_ICD", tmp_path / "out", 2, show_progress=False)


def _zstd_file(text: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as f:
        f.write(text)
    return sink.getvalue().to_pybytes()


ZST_FILE = _zstd_file(TEXT)


@FAST
@given(cut=st.integers(0, len(ZST_FILE) - 1))
def test_a_zstd_part_cut_anywhere_fails_the_reader_naming_the_file(tmp_path_factory, cut):
    path = _write(tmp_path_factory.mktemp("zst"), "DIAGNOSES_ICD-00000-of-00002.csv.zst", ZST_FILE[:cut])
    with pytest.raises(ReaderError) as err:
        read_table(path, "DIAGNOSES_ICD")
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_an_unreadable_table_file_is_a_reader_error_naming_it(tmp_path):
    folder = tmp_path / "DIAGNOSES_ICD.csv.gz"
    folder.mkdir()  # a folder where the file should be: open() fails with IsADirectoryError
    with pytest.raises(ReaderError, match=str(folder)):
        read_table(folder, "DIAGNOSES_ICD")


@pytest.mark.parametrize("job", ["run", "to-meds"])
def test_a_truncated_table_forced_into_parts_ends_the_job_naming_it(pinned_release, tmp_path, job):
    release = tmp_path / "release"
    shutil.copytree(pinned_release, release)
    chart = release / "CHARTEVENTS.csv.gz"
    chart.write_bytes(chart.read_bytes()[: os.path.getsize(chart) // 2])
    temp = tmp_path / "scratch"
    resources = SpillOptions(workers=1, split_threshold_bytes=100_000, temp_dir=str(temp))
    with pytest.raises(CorruptFileError) as err:
        (run_job if job == "run" else run_to_meds)(str(release), str(tmp_path / "out"),
                                                  PipelineConfig.model_validate(CONFIG), resources=resources)
    assert str(chart) in str(err.value) and "\n" not in str(err.value)
    assert not any(temp.iterdir())  # the spill folder, with any parts, is gone
