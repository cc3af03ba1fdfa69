"""Faults injected into real runs of `ehr-pipeline run`, `ehr-pipeline to-meds` and `ehr-adapt`: the previous
output survives byte for byte, nothing partial appears under its name, and a re-run writes the same records.

Each fault is injected into a real process (tests/support/fault_injection.py): SIGKILL at a stage of the work
(reading and spilling, bagging, writing shards, the side files, the manifest, the final swap), a full disk
while writing, and a truncated input table. The previous output is one release's; the faulty run works on
another, so a file of the second under the first's manifest would show. The job's faulty runs are forked
from one server process that imported Beam once (``FaultServer``): each is still a process of its own,
killed for real, without paying the ~5 s of imports a fresh interpreter would.
"""
from __future__ import annotations

import gzip
import hashlib
import pathlib
import shutil
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from ehr_pipeline.contract import PipelineConfig, output_folder
from ehr_pipeline.synth import SynthConfig, write_release
from tests.support.fault_injection import FaultServer
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow

# Two sources keep each run short: a fault stops the job at a stage every source's events pass through.
CONFIG = {"num_shards": {"train": 2, "validation": 1, "test": 1}, "sources": ["lab", "diagnosis"]}
# Fields of a folder that legitimately differ between two runs on the same input: when it ran.
RUN_TIMES = ("run_info.json", "to_meds_manifest.json")


def tree(folder: pathlib.Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under folder -> the SHA-256 of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in skip}


def faulty(point: str, fault: str, entry: str, *args: str) -> subprocess.CompletedProcess:
    """Runs a console command in a new interpreter with `fault` ('kill' or 'enospc') armed at `point`."""
    return subprocess.run([sys.executable, "-m", "tests.support.fault_injection", point, fault, entry, "--", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def only_staging_beside(target: pathlib.Path) -> list[str]:
    """What lies beside target other than itself (a killed run's staging folder at most)."""
    return [p.name for p in target.parent.iterdir() if p.name != target.name and p.name.startswith(target.name)]


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Two small synthetic releases (another seed, so no record of one equals the other's) and a config."""
    base = tmp_path_factory.mktemp("fault_releases")
    for name, seed in (("first", 11), ("second", 12)):
        write_release(SynthConfig(patients=40, seed=seed, events_scale=0.3), base / name, show_progress=False)
    (base / "pipeline.yaml").write_text("num_shards: {train: 2, validation: 1, test: 1}\nsources: [lab, diagnosis]\n")
    # The previous outputs have one train shard more: a shard of theirs surviving a re-run would show.
    (base / "previous.yaml").write_text("num_shards: {train: 3, validation: 1, test: 1}\nsources: [lab, diagnosis]\n")
    return {"first": base / "first", "second": base / "second", "config": base / "pipeline.yaml",
            "previous_config": base / "previous.yaml"}


@pytest.fixture(scope="module")
def server():
    """Forks the faulty runs of `ehr-pipeline` from one process that has imported the job and its stages once."""
    modules = sorted({point.partition(":")[0] for point in [*JOB_STAGES.values(), *MEDS_STAGES.values()]})
    fork_server = FaultServer(["ehr_pipeline.cli.main", *modules], cwd=REPO_ROOT)
    yield fork_server.run
    fork_server.close()


@pytest.fixture(scope="module")
def job_outputs(releases, tmp_path_factory) -> dict[str, pathlib.Path]:
    """The first release's data folder (the output a faulty run must leave alone) and the second's, fresh."""
    from ehr_pipeline.job import run_job

    base = tmp_path_factory.mktemp("fault_job")
    config = PipelineConfig.model_validate(CONFIG)
    run_job(str(releases["first"]), str(base / "first"), PipelineConfig.model_validate(
        {**CONFIG, "num_shards": {"train": 3, "validation": 1, "test": 1}}))
    run_job(str(releases["second"]), str(base / "reference"), config)
    return {"first": base / "first", "reference": base / "reference"}


# The side files (vocabulary, statistics, units) are written just before the manifest: one kill covers both.
JOB_STAGES = {
    "reading and spilling": "ehr_pipeline.job.spill_source:SpillTable.process",
    "bagging": "ehr_pipeline.job.spill_bag:BagBucket.process",
    "writing shards": "ehr_pipeline.job.spill_merge:MergeShard.process@2",
    "manifest": "ehr_pipeline.job.manifest:build_manifest",
    "moving into place": "ehr_pipeline.contract.output_folder:_swap_in",
}


def _job_args(releases, out: pathlib.Path, release: pathlib.Path | None = None) -> list[str]:
    return ["run", "--mimic-dir", str(release or releases["second"]), "--out", str(out), "--overwrite",
            "--config", str(releases["config"]), "--workers", "1"]


@pytest.fixture()
def previous_data(job_outputs, tmp_path) -> pathlib.Path:
    """A copy of the first release's data folder, for one faulty run to meet."""
    out = tmp_path / "data"
    shutil.copytree(job_outputs["first"], out)
    return out


@pytest.mark.parametrize("stage", list(JOB_STAGES))
def test_a_job_killed_at_any_stage_leaves_the_previous_data_folder(releases, job_outputs, previous_data, server,
                                                                   stage):
    before = tree(previous_data)
    done = server(JOB_STAGES[stage], "kill", "ehr_pipeline.cli.main:main", *_job_args(releases, previous_data))
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert tree(previous_data) == before
    assert all(name.startswith("data.inprogress-") for name in only_staging_beside(previous_data))
    if stage == "writing shards":  # one re-run (they cost a job each): it clears the staging, writes the same
        from ehr_pipeline.cli.main import main

        assert main(_job_args(releases, previous_data)) == 0
        assert tree(previous_data, RUN_TIMES) == tree(job_outputs["reference"], RUN_TIMES)
        assert only_staging_beside(previous_data) == []


def test_a_full_disk_or_a_truncated_table_leaves_the_previous_data_folder(releases, previous_data, server, tmp_path):
    before = tree(previous_data)
    full = server("ehr_pipeline.job.spill_merge:MergeShard.process", "enospc", "ehr_pipeline.cli.main:main",
                  *_job_args(releases, previous_data))
    assert full.returncode != 0 and "No space left on device" in full.stderr
    assert tree(previous_data) == before and only_staging_beside(previous_data) == []
    truncated = tmp_path / "truncated"
    shutil.copytree(releases["second"], truncated)
    labs = gzip.compress(gzip.decompress((truncated / "LABEVENTS.csv.gz").read_bytes()))
    (truncated / "LABEVENTS.csv.gz").write_bytes(labs[: len(labs) // 2])
    from ehr_pipeline.cli.main import main

    assert main(_job_args(releases, previous_data, truncated)) == 2
    assert tree(previous_data) == before and only_staging_beside(previous_data) == []


MEDS_STAGES = {
    "converting": "ehr_pipeline.job.to_meds:ConvertTable.process",
    "writing shards": "ehr_pipeline.job.to_meds:WriteMedsShard.process@2",
    "moving into place": "ehr_pipeline.contract.output_folder:_swap_in",
}


def meds_rows(folder: pathlib.Path) -> dict[str, object]:
    """Every parquet file of a MEDS dataset -> its rows (a pyarrow table), and every other file's bytes."""
    return {p.relative_to(folder).as_posix(): (pq.read_table(p) if p.suffix == ".parquet"
                                               else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in RUN_TIMES}


def test_to_meds_killed_at_any_stage_leaves_the_previous_dataset_and_a_rerun_equals_a_fresh_one(
        releases, server, tmp_path):
    from ehr_pipeline.cli.main import main

    def args(out, release="second", config="config"):
        return ["to-meds", "--mimic-dir", str(releases[release]), "--out", str(out), "--overwrite",
                "--config", str(releases[config]), "--workers", "1"]

    previous, reference = tmp_path / "meds", tmp_path / "reference"
    assert main(args(previous, "first", "previous_config")) == 0 and main(args(reference)) == 0
    before = tree(previous)
    for stage, point in MEDS_STAGES.items():
        done = server(point, "kill", "ehr_pipeline.cli.main:main", *args(previous))
        assert done.returncode == -signal.SIGKILL, (stage, done.stderr[-2000:])
        assert tree(previous) == before, stage
    assert main(args(previous)) == 0
    fresh, rerun = meds_rows(reference), meds_rows(previous)
    assert fresh.keys() == rerun.keys()
    for name, rows in fresh.items():
        assert rows == rerun[name] if isinstance(rows, str) else rows.equals(rerun[name]), name
    assert only_staging_beside(previous) == []
    # A shard someone copied in is not read beside the dataset's own (it was mixed into the job's examples).
    shard = sorted((previous / "data").rglob("*.parquet"))[0]
    shutil.copy(shard, shard.with_name("copied.parquet"))
    from ehr_pipeline.meds.standard import MedsError
    from ehr_pipeline.meds.source import data_files

    with pytest.raises(MedsError, match="copied.parquet: not among the files ehr-pipeline to-meds wrote"):
        data_files(previous)


def test_readers_refuse_a_file_the_job_did_not_write(job_outputs, tmp_path):
    from ehr_pipeline.contract import integrity

    for stray, why in (("train-00005-of-00008.tfrecord.gz", "not listed in"),
                       ("notes.txt", "not among the files the job wrote")):
        folder = tmp_path / stray
        shutil.copytree(job_outputs["reference"], folder)
        shutil.copy(next(folder.glob("test-*")), folder / stray)
        with pytest.raises(integrity.DataIntegrityError, match=f"{stray}.*{why}"):
            integrity.verify_folder(folder, ["train"])


def test_ehr_adapt_never_deletes_a_folder_it_did_not_write_and_survives_a_kill(trained_rank1, tmp_path):
    from model.cli.ehr_adapt import main

    sandbox = tmp_path / "sandbox"
    shutil.copytree(trained_rank1["export"], sandbox / "model_export")
    (sandbox / "unrelated.txt").write_text("keep")
    data = tmp_path / "data_copy"
    shutil.copytree(trained_rank1["data"], data)
    guarded = {sandbox: tree(sandbox), data: tree(data)}
    common = ["--model", str(sandbox / "model_export"), "--data", str(data), "--method", "recalibrate-intercept",
              "--samples", "2", "--no-progress"]
    for out in (sandbox, data, sandbox / "model_export", data / "inside"):
        for overwrite in ([], ["--overwrite"]):
            assert main([*common, "--out", str(out), *overwrite]) == 2
    assert {folder: tree(folder) for folder in guarded} == guarded
    # An earlier update of its own is replaced only with --overwrite, and survives a kill at any point.
    out = tmp_path / "adapted"
    assert main([*common, "--out", str(out)]) == 0
    assert main([*common, "--out", str(out)]) == 2
    before = tree(out)
    # Killed at the last moment: everything before it happens in the staging folder like the job's.
    done = faulty("ehr_pipeline.contract.output_folder:_swap_in", "kill", "model.cli.ehr_adapt:main", *common,
                  "--out", str(out), "--overwrite")
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert tree(out) == before
    assert main([*common, "--out", str(out), "--overwrite"]) == 0
    assert tree(out, ("model_card.json", "manifest.json")).keys() == before.keys() - {"model_card.json",
                                                                                       "manifest.json"}
    assert only_staging_beside(out) == [] and output_folder.read_marker(out)["command"] == "ehr-adapt"
