"""The spilling MIMIC-III job: the same bytes as the job that grouped events in the runner, on any number of workers.

``data/grouped_road_sha256.json`` holds the sha256 of every output file that job wrote (its last
version, with the exact code statistics) on the real demo and on the synthetic release
``SYNTH_RELEASE`` (the ``pinned_release`` fixture); the manifest's digest leaves out its input paths (``output_digests``).
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import pathlib

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.pipeline import PipelineVisitor
from apache_beam.testing.util import assert_that, equal_to

from ehr_pipeline.contract import PipelineConfig
from ehr_pipeline.job import SpillOptions, run_job, run_to_meds, spill, temp_disk
from ehr_pipeline.job.run import DASK_RUNNER, with_local_workers
from ehr_pipeline.job.spill import BUCKET, PLAN
from ehr_pipeline.job.spill_bag import BagBuckets, with_plan
from ehr_pipeline.mimic import table_parts
from tests.support.job_outputs import CONFIG, output_digests
from tests.support.job_runners import RUNNER_ARG, SideInputRecordingRunner

GROUPED = json.loads((pathlib.Path(__file__).parent / "data" / "grouped_road_sha256.json").read_text())


def _run(release_dir, out, **options) -> dict:
    return run_job(str(release_dir), str(out), PipelineConfig.model_validate(CONFIG),
                   resources=SpillOptions(**options))


def test_demo_outputs_equal_the_grouped_job_byte_for_byte(demo_run):
    """demo_run is the job with its defaults: one process, the demo being a small input."""
    out, _, _ = demo_run
    assert output_digests(out) == GROUPED["demo"]


def test_demo_on_two_workers_with_many_buckets_and_split_tables_gives_the_same_bytes(demo_dir, tmp_path, caplog):
    """Two workers with many buckets, the big tables split into parts: the demo's pinned bytes.

    One run for the three: two workers, many small buckets and the split tables are separate stages of the
    job. The synthetic release below gets many buckets and split tables on one worker.
    """
    threshold = 200_000
    temp = tmp_path / "scratch"
    with caplog.at_level(logging.INFO, logger="ehr_pipeline.job"):
        _run(demo_dir, tmp_path / "out", workers=2, bucket_admissions=20, split_threshold_bytes=threshold,
             temp_dir=str(temp))
    assert output_digests(tmp_path / "out") == GROUPED["demo"]
    split = [r.getMessage() for r in caplog.records if r.getMessage().startswith("splitting")]
    parts = table_parts.parts_for((demo_dir / "LABEVENTS.csv.gz").stat().st_size, threshold)
    assert parts > 1 and any("LABEVENTS.csv.gz" in m and f"into {parts} parts" in m for m in split), split
    assert temp.is_dir() and not any(temp.iterdir())  # its own folder in --temp-dir, deleted at the end


def test_synthetic_release_with_many_buckets_and_split_tables_gives_the_same_bytes_on_one_worker(
        pinned_release, tmp_path, caplog):
    # Few admissions per bucket: many buckets, so stage D concatenates many runs per shard.
    threshold = 200_000  # CHARTEVENTS (~1.2 MB) in 6 parts, LABEVENTS (~0.5 MB) in 3
    with caplog.at_level(logging.INFO, logger="ehr_pipeline.job"):
        _run(pinned_release, tmp_path / "out", workers=1, bucket_admissions=20, split_threshold_bytes=threshold)
    assert output_digests(tmp_path / "out") == GROUPED["synthetic"]
    split = [r.getMessage() for r in caplog.records if r.getMessage().startswith("splitting")]
    assert any("CHARTEVENTS.csv.gz" in m and "into 6 parts" in m for m in split), split
    assert not (tmp_path / "out" / "_tmp" / "spill").exists()  # the spill folder is gone at the end


def test_a_malformed_row_in_a_part_is_dead_lettered_naming_the_part_and_its_line(pinned_release, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in pinned_release.iterdir():
        if f.name != "CHARTEVENTS.csv.gz":
            (broken / f.name).symlink_to(f)
    lines = gzip.decompress((pinned_release / "CHARTEVENTS.csv.gz").read_bytes()).decode().split("\n")
    bad = lines[5000].replace(",", ",not-a-number,", 1)  # ROW_ID, then a SUBJECT_ID that is no integer
    lines[5000] = bad
    (broken / "CHARTEVENTS.csv.gz").write_bytes(gzip.compress("\n".join(lines).encode(), mtime=0))
    threshold = 200_000
    # One worker: the split into parts is made before any worker starts, whatever their number, and the
    # two-worker runs above already pay for the worker processes (~5 CPU-s each). Chart events only: the
    # broken table is the one source read, so no other table's parts are made, read or bagged.
    chart_only = PipelineConfig.model_validate({**CONFIG, "sources": ["chart"]})
    manifest = run_job(str(broken), str(tmp_path / "out"), chart_only,
                       resources=SpillOptions(workers=1, split_threshold_bytes=threshold))
    letters = [json.loads(x) for x in (tmp_path / "out" / "dead_letter" / "CHARTEVENTS.jsonl").read_text().splitlines()]
    assert [d["raw"] for d in letters] == [bad] and manifest["tables"]["CHARTEVENTS"]["dead_lettered"]
    # The same split, redone here: the part named holds the row on the line named.
    parts = table_parts.split_file(str(broken / "CHARTEVENTS.csv.gz"), "CHARTEVENTS", str(tmp_path / "parts"),
                                   table_parts.parts_for((broken / "CHARTEVENTS.csv.gz").stat().st_size, threshold),
                                   table_parts.block_bytes(threshold))
    name = pathlib.Path(letters[0]["file"]).name
    assert name.startswith("CHARTEVENTS-") and name.endswith(".csv.zst")
    part = next(p for p in parts if pathlib.Path(p).name == name)
    text = pa.input_stream(part, compression="zstd").read().decode()
    assert text.split("\n")[letters[0]["line"] - 1] == bad
    assert manifest["balanced"]


def test_frame_files_of_two_attempts_never_share_a_name(tmp_path):
    """A retried bundle writes new files: the first attempt's are orphans no reference names."""
    attempts = []
    for _ in range(2):
        writer = spill.FrameWriter(str(tmp_path), lambda bucket: f"b{bucket:05d}")
        for hadm in range(100, 400):
            writer.write(hadm % 3, hadm, bytes([hadm % 256]) * (hadm % 17))
        attempts.append(writer.close())
    assert set(attempts[0].values()).isdisjoint(attempts[1].values())
    assert len(list(tmp_path.rglob("*.frames"))) == 6
    for key, path in attempts[1].items():
        assert list(spill.read_frames(path)) == [(h, bytes([h % 256]) * (h % 17)) for h in range(100, 400)
                                                 if h % 3 == key]


def test_buckets_are_equal_count_ranges_and_the_cohort_file_keeps_each_bucket_apart(tmp_path):
    ids = np.random.default_rng(0).permutation(np.arange(1000, 1103))
    bounds = spill.bucket_bounds(ids, 8)
    sizes = np.bincount([spill.bucket_of(bounds, h) for h in ids])
    assert len(sizes) == 8 and sizes.max() - sizes[:-1].min() == 0 and sizes.sum() == 103
    rows = [(int(h), {"HADM_ID": int(h), "age_years": h / 7, "gender": None}) for h in ids]
    ranges = spill.write_cohort_file(str(tmp_path / "cohort.jsonl"), rows, bounds)
    for bucket, (offset, length) in enumerate(ranges):
        got = spill.read_cohort_rows(str(tmp_path / "cohort.jsonl"), offset, length)
        assert got == {h: r for h, r in rows if spill.bucket_of(bounds, h) == bucket}


def test_not_enough_disk_is_one_line_naming_the_folder_and_the_bytes(tmp_path):
    huge = tmp_path / "CHARTEVENTS.csv.gz"
    with open(huge, "wb") as f:
        f.write(b"\x1f\x8b")
        f.truncate(2**43)  # sparse: 8 TiB by its size, nothing on disk
    with pytest.raises(temp_disk.NotEnoughDiskError, match=r"scratch: [\d,]+ bytes free, the job needs about "
                                                            r"[\d,]+ for its temporary files") as err:
        temp_disk.check_free_space(str(tmp_path / "scratch"), [("CHARTEVENTS", str(huge))], 64 << 20)
    needed = int(temp_disk.PART_BYTES_PER_GZIP_BYTE * 2**43 + temp_disk.SPILL_BYTES_PER_INPUT_BYTE * 2**43)
    assert "\n" not in str(err.value) and f"{needed:,}" in str(err.value)


def test_the_default_workers_are_the_cores_but_one_for_a_small_input(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert SpillOptions().worker_count(spill.SMALL_INPUT_BYTES - 1) == 1
    assert SpillOptions().worker_count(spill.SMALL_INPUT_BYTES) == 6
    assert SpillOptions().worker_count(None) == 6  # sizes unknown (not local files): every core
    assert SpillOptions(workers=3).worker_count(1) == 3


def test_workers_set_the_local_runner_and_leave_other_runners_alone():
    assert with_local_workers([], 4) == ["--direct_num_workers=4", "--direct_running_mode=multi_processing"]
    assert with_local_workers([], 1) == []
    assert with_local_workers(["--direct_running_mode=multi_threading"], 3) == [
        "--direct_running_mode=multi_threading", "--direct_num_workers=3"]
    assert with_local_workers(["--direct_num_workers=2"], 8) == ["--direct_num_workers=2"]
    dask = [f"--runner={DASK_RUNNER}", "--dask_client_address=127.0.0.1:1"]
    assert with_local_workers(dask, 8) == dask


class _Echo(beam.DoFn):
    def process(self, element):
        (bucket, frames), plan = element
        yield bucket, frames, plan["canonical"]


def test_every_bucket_meets_the_unit_plan_by_key_and_no_step_reads_a_side_input():
    """Beam's DaskRunner computes a side input again inside every task that reads it: the source ran twice."""
    side_inputs = []

    class Visitor(PipelineVisitor):
        def visit_transform(self, node):
            side_inputs.extend(node.side_inputs)

    p = beam.Pipeline()
    items = p | "Items" >> beam.Create([(BUCKET, (0, ["a", "b"])), ("counts", ("x", 1)), (BUCKET, (1, None))])
    plan = p | "Plan" >> beam.Create([{"canonical": {"lab:1": "mg/dL"}}])
    bagged = items | BagBuckets(_Echo(), plan, buckets=2)
    assert_that(bagged, equal_to([(0, ["a", "b"], {"lab:1": "mg/dL"}), (1, None, {"lab:1": "mg/dL"})]))
    p.visit(Visitor())
    assert side_inputs == []
    p.run().wait_until_finish()


def test_a_bucket_without_its_plan_fails_loudly():
    assert with_plan((3, [(PLAN, {"p": 1}), (BUCKET, ["f"])])) == ((3, ["f"]), {"p": 1})
    with pytest.raises(RuntimeError, match="bucket 3: 1 file lists and 0 unit plans"):
        with_plan((3, [(BUCKET, ["f"])]))


@pytest.mark.parametrize("job", ["run", "to-meds"])
def test_no_step_of_the_jobs_reads_a_side_input(demo_dir, tmp_path, job):
    """Beam's DaskRunner computes a side input again inside each task that reads it (stages ran twice)."""
    SideInputRecordingRunner.steps_with_side_inputs.clear()
    config = PipelineConfig.model_validate(CONFIG)
    if job == "run":
        manifest = run_job(str(demo_dir), str(tmp_path / "out"), config, [RUNNER_ARG])
    else:
        manifest = run_to_meds(str(demo_dir), str(tmp_path / "out"), config, [RUNNER_ARG])
    assert manifest["balanced"]
    assert SideInputRecordingRunner.steps_with_side_inputs == []
