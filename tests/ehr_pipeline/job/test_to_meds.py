"""`to-meds` with bounded memory: the same bytes as the conversion that grouped every row in the runner.

``data/to_meds_sha256.json`` holds the sha256 of every file that conversion wrote (each shard
sorted whole in memory, one parquet write) on the real demo and on the synthetic release
``SYNTH_RELEASE`` (the ``pinned_release`` fixture), with the test configuration, but for the two
files ``UNPINNED`` names. The spilling conversion sorts a shard a bucket of subjects at a time and
writes it row group by row group; these tests pin that nothing of the output changes, on any
number of workers, with any bucket size, with split inputs.
"""
from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ehr_pipeline.contract import PipelineConfig
from ehr_pipeline.job import SpillOptions, run_meds_job, run_to_meds, spill
from ehr_pipeline.job.to_meds import bucket_ranges
from ehr_pipeline.meds import from_mimic
from tests.support.job_outputs import CONFIG, output_digests

GROUPED = json.loads((pathlib.Path(__file__).parent / "data" / "to_meds_sha256.json").read_text())
# Not pinned: the manifest records seconds and the input path (its balance is checked), and
# dataset.json names the input folder and the package version.
UNPINNED = (from_mimic.MANIFEST, "metadata/dataset.json")


def _convert(release_dir, out, **options) -> dict:
    manifest = run_to_meds(str(release_dir), str(out), PipelineConfig.model_validate(CONFIG),
                           resources=SpillOptions(**options))
    assert manifest["balanced"]
    return manifest


def _digests(out) -> dict[str, str]:
    return {k: v for k, v in output_digests(out).items() if k not in UNPINNED}


@pytest.fixture(scope="module")
def demo_meds(demo_meds_conversion) -> pathlib.Path:
    """The demo converted on two workers with small buckets (the session's, tests/conftest.py); the MEDS job's
    demo test here and the MEDS tests read it too."""
    manifest = json.loads((demo_meds_conversion / from_mimic.MANIFEST).read_text())
    assert manifest["balanced"]
    return demo_meds_conversion


@pytest.mark.parametrize("workers,bucket_rows", [(1, 1_000_000), (2, 20_000)])
def test_demo_gives_the_bytes_of_the_grouped_conversion(demo_dir, demo_meds, tmp_path, workers, bucket_rows):
    out = demo_meds
    if workers == 1:
        out = tmp_path / "out"
        _convert(demo_dir, out, workers=workers, bucket_rows=bucket_rows)
    assert _digests(out) == GROUPED["demo"]
    assert not (out / "_tmp").exists()  # MEDS readers glob the folder: no spill left in it


def test_synthetic_release_split_into_parts_gives_the_same_bytes(synthetic_meds):
    # Many buckets of few subjects, CHARTEVENTS and LABEVENTS split into parts, two workers (synthetic_meds).
    out, temp = synthetic_meds, synthetic_meds.parent / "scratch"
    assert _digests(out) == GROUPED["synthetic"]
    assert temp.is_dir() and not any(temp.iterdir())  # its own folder in --temp-dir, deleted at the end


def _rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    sid = np.sort(rng.integers(1, 40, n))
    time = pa.array(rng.integers(0, 10**12, n) * 1_000_000, pa.timestamp("us"))
    return pa.table([pa.array(sid, pa.int64()), time, pa.array([f"C//{c}" for c in rng.integers(0, 5, n)]),
                     pa.array(rng.random(n).astype("float32")), pa.array(rng.integers(0, 9, n), pa.int64()),
                     pa.nulls(n, pa.string()), pa.nulls(n, pa.string()), pa.nulls(n, pa.string())],
                    schema=from_mimic.DATA_SCHEMA)


@pytest.mark.parametrize("group", [7, 100, 10_000])
def test_a_shard_written_bucket_by_bucket_is_one_sorted_write(group):
    rows = _rows(1_000, seed=group)
    # Subject ranges, each arriving as several unsorted pieces (one per input file that held its rows).
    bounds = np.array([9, 10, 25])
    bucket = np.searchsorted(bounds, rows.column("subject_id").to_numpy(), side="right")
    buckets = []
    for b in range(len(bounds) + 1):
        part = rows.filter(pa.array(bucket == b))
        buckets.append([part.slice(i, 37) for i in range(0, part.num_rows, 37)][::-1])
    got = io.BytesIO()
    assert from_mimic.write_sorted_shard(iter(buckets), got, row_group_rows=group) == 1_000
    want = io.BytesIO()
    pq.write_table(from_mimic.sorted_rows([rows]), want, row_group_size=group)
    assert got.getvalue() == want.getvalue()
    assert pq.ParquetFile(io.BytesIO(got.getvalue())).metadata.num_row_groups == -(-1_000 // group)


def test_an_empty_shard_is_the_file_of_an_empty_table():
    got, want = io.BytesIO(), io.BytesIO()
    assert from_mimic.write_sorted_shard(iter([[], [from_mimic.DATA_SCHEMA.empty_table()]]), got) == 0
    pq.write_table(from_mimic.DATA_SCHEMA.empty_table(), want)
    assert got.getvalue() == want.getvalue()


def test_subject_cuts_keep_runs_under_the_limit_and_a_big_subject_whole():
    cuts = from_mimic.subject_cuts(np.array([3, 5, 8, 9, 12]), np.array([4, 4, 11, 2, 3]), limit=10)
    # 3+5 fit (8 rows), subject 8 alone is over the limit and stays whole, then 9+12 (5 rows).
    assert cuts.tolist() == [8, 9]
    assert from_mimic.subject_cuts(np.array([1, 2]), np.array([3, 4]), limit=10).tolist() == []


@pytest.mark.parametrize("limit", [40, 250, 5_000])
def test_a_bucket_over_its_row_limit_is_sorted_range_by_range(tmp_path, limit):
    """Buckets are drawn from estimated rows: the writer holds at most `limit` spilled rows (one subject's, if more)."""
    rows = _rows(1_000, seed=limit)
    writers = [spill.FrameWriter(str(tmp_path / f"w{i}"), str) for i in range(2)]
    for i, start in enumerate(range(0, 1_000, 90)):  # pieces in no order, as the converters spill them
        piece = rows.slice(start, 90)
        writers[i % 2].write("b", 0, from_mimic.to_ipc(piece.take(np.arange(piece.num_rows)[::-1])))
    paths = [w.close()["b"] for w in writers]
    ranges = list(bucket_ranges(paths, limit))
    per_subject = np.bincount(rows.column("subject_id").to_numpy())
    seen = []
    for tables in ranges:
        sids = np.concatenate([t.column("subject_id").to_numpy() for t in tables])
        assert sids.size <= max(limit, per_subject[np.unique(sids)].max())
        seen.append(np.unique(sids))
    flat = np.concatenate(seen)
    assert (np.diff(flat) > 0).all() and flat.tolist() == np.unique(rows.column("subject_id").to_numpy()).tolist()
    assert (len(ranges) == 1) == (limit >= 1_000)  # read once when the bucket fits
    got, want = io.BytesIO(), io.BytesIO()
    assert from_mimic.write_sorted_shard(iter(ranges), got, row_group_rows=64) == 1_000
    pq.write_table(from_mimic.sorted_rows([rows]), want, row_group_size=64)
    assert got.getvalue() == want.getvalue()


def test_every_subject_falls_in_one_bucket_of_its_own_shard():
    config = PipelineConfig.model_validate(CONFIG)
    known = np.arange(10_000, 10_500)
    bounds = from_mimic.subject_buckets(known, config, per_bucket=20)
    stranger = np.array([1, 10_250_000, 99])  # subjects PATIENTS does not list still get a bucket
    rows = _rows(300, seed=1).set_column(0, "subject_id", pa.array(np.r_[known, stranger][:300], pa.int64()))
    places = from_mimic.by_bucket(rows, config, bounds)
    assert sum(t.num_rows for _, t in places) == 300
    names, shards = from_mimic.subject_place(rows.column("subject_id").to_numpy(), config)
    for (split, shard, b), table in places:
        sids = table.column("subject_id").to_numpy()
        assert set(zip(names[np.isin(rows.column("subject_id").to_numpy(), sids)],
                       shards[np.isin(rows.column("subject_id").to_numpy(), sids)])) == {(split, shard)}
        edges = np.r_[np.iinfo(np.int64).min, bounds[(split, shard)], np.iinfo(np.int64).max]
        assert ((sids >= edges[b]) & (sids < edges[b + 1])).all()
    # 20 known subjects per bucket (the last one fewer): the sort holds a bucket, not a shard.
    known_names, known_shards = from_mimic.subject_place(known, config)
    for (split, shard), edges in bounds.items():
        members = known[(known_names == split) & (known_shards == shard)]
        assert np.bincount(np.searchsorted(edges, members, side="right")).tolist() == \
            [20] * (members.size // 20) + ([members.size % 20] if members.size % 20 else [])


# ----------------------------------------------------------------------------- the MEDS job (run --meds-dir)


@pytest.fixture(scope="module")
def synthetic_meds(pinned_release, tmp_path_factory) -> pathlib.Path:
    """The synthetic release converted with many buckets of few subjects, CHARTEVENTS and LABEVENTS split into
    parts, on two workers, its temporary files in scratch/ beside it: the split test pins its bytes (the
    conversion's own, whatever the options), so the MEDS job's tests read it as any conversion of the release."""
    base = tmp_path_factory.mktemp("meds")
    out = base / "synthetic"
    _convert(pinned_release, out, workers=2, bucket_rows=5_000, split_threshold_bytes=200_000,
             temp_dir=str(base / "scratch"))
    return out


def test_the_meds_job_gives_the_bytes_of_the_job_that_grouped_examples(synthetic_meds, tmp_path):
    """``meds_job_*`` digests: the MEDS job before it spilled (every example through one GroupByKey).

    One worker here; two workers on the converted demo below (each a pinned output): one run per road.
    """
    manifest = run_meds_job(str(synthetic_meds), str(tmp_path / "out"), PipelineConfig.model_validate(CONFIG),
                            resources=SpillOptions(workers=1))
    assert manifest["balanced"]
    assert output_digests(tmp_path / "out") == GROUPED["meds_job_synthetic"]
    assert not (tmp_path / "out" / "_tmp" / "spill").exists()


def test_the_meds_job_on_the_converted_demo_gives_the_same_bytes(demo_meds, demo_meds_job):
    # The conversion the demo test pins (two workers; its bucket size changes no byte of it). The MEDS job
    # on two workers too (the demo alone would get one): the job's multi-process road, against its pin. The
    # session's run (tests/conftest.py), which the MEDS round-trip test reads as well.
    out, manifest = demo_meds_job
    assert manifest["balanced"] and manifest["input"]["meds_dir"] == str(demo_meds)
    assert output_digests(out) == GROUPED["meds_job_demo"]
    assert not (out / "_tmp" / "spill").exists()


def test_dead_values_of_hashed_buckets_are_merged_in_file_order(tmp_path):
    from ehr_pipeline.job.sinks import DeadValue
    from ehr_pipeline.job.spill_merge import ConcatDeadRuns

    rng = np.random.default_rng(4)
    values = [DeadValue(int(h), int(h), int(t), f"lab:{c}", float(v), "mg", "g", "no", "not_convertible")
              for h, t, c, v in zip(rng.integers(0, 50, 300), rng.integers(0, 9, 300), rng.integers(0, 3, 300),
                                    rng.random(300))]
    runs = []
    for bucket in range(4):  # a hash partition: each run sorted, the runs interleaved
        mine = sorted((d for d in values if d.hadm_id % 4 == bucket), key=DeadValue.sort_key)
        path = tmp_path / f"run{bucket}.jsonl"
        path.write_text("".join(d.to_json() + "\n" for d in mine))
        runs.append((bucket, str(path), len(mine)))
    out = tmp_path / "out"
    (written,) = ConcatDeadRuns(str(out), merge=True).process(("values", runs[::-1]))
    assert written == ("dead_letters_written/values", 300)
    want = "".join(d.to_json() + "\n" for d in sorted(values, key=DeadValue.sort_key))
    assert (out / "dead_letter" / "values.jsonl").read_text() == want
