"""The suite's session fixtures, shared by every test folder. Importing ehr_base first pins TF_USE_LEGACY_KERAS.

Expensive inputs are made once per session here, never in a test module: the real demo through the
Beam job (``demo_run``), a tiny trained rank-1 run (``trained_rank1``), the service's fixture export
and the tiny untrained export factory (``tiny_export``). The first two are built once even under
pytest-xdist (tests/support/shared_dirs.py). Helpers that are not fixtures live in tests/support/.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pathlib
from collections.abc import Callable

import pytest
from hypothesis import settings

import ehr_base  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)
from tests.support.paths import DEMO_DIR, DEMO_MISSING, demo_available
from tests.support.shared_dirs import built_once

# CI replays the same generated examples on every run, so a submission's result does not depend on
# which random inputs a run happened to draw; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def demo_dir() -> pathlib.Path:
    """The real MIMIC-III v1.4 demo (100 patients); tests that need it skip without it."""
    if not demo_available():
        pytest.skip(DEMO_MISSING)
    return DEMO_DIR


@pytest.fixture(scope="session")
def demo_run(demo_dir, tmp_path_factory) -> tuple[pathlib.Path, dict, dict[int, dict]]:
    """The real demo through the Beam job (job_outputs.CONFIG), once per session: (folder, manifest, examples)."""
    # Beam is imported only by the tests that run a job; collection stays light.
    from ehr_pipeline.contract import PipelineConfig, layout
    from ehr_pipeline.job import run_job
    from tests.support.job_outputs import CONFIG, read_examples

    def build(folder: pathlib.Path) -> None:
        run_job(str(demo_dir), str(folder), PipelineConfig.model_validate(CONFIG))

    out = built_once(tmp_path_factory, "demo_job", build)
    return out, layout.read_json(str(out / layout.MANIFEST)), read_examples(out)


@pytest.fixture(scope="session")
def pinned_release(tmp_path_factory) -> pathlib.Path:
    """The synthetic release job_outputs.SYNTH_RELEASE, whose job and MEDS outputs the job tests pin by sha256."""
    from ehr_pipeline.synth import SynthConfig, write_release
    from tests.support.job_outputs import SYNTH_RELEASE

    folder = tmp_path_factory.mktemp("pinned_release")
    write_release(SynthConfig(**SYNTH_RELEASE), folder, show_progress=False)  # well under a second
    return folder


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory) -> pathlib.Path:
    """A small pipeline output folder (160 / 48 / 48 admissions, seed 0) shared read-only by the session."""
    # Beam-free but heavy (the pipeline's writers); loaded only where a test asks for the folder.
    from tests.support.ehr_testdata import write_data_dir

    return write_data_dir(tmp_path_factory.mktemp("synthetic_data"))


@pytest.fixture(scope="session")
def trained_rank1(tmp_path_factory) -> dict:
    """A tiny rank-1 run trained once per session: data, run folder, export, loss history, config."""
    # TensorFlow loads only for the tests that ask for a trained model.
    from model.ehr.config import parse_config
    from model.ehr.train import train
    from tests.support.ehr_testdata import tiny_config_dict, write_data_dir

    # kl_scale < 1: with 160 training admissions the full KL / N_train would swamp the likelihood.
    config = parse_config(tiny_config_dict("rank1", steps=100, kl_scale=0.05, eval_every_steps=25))

    def build(base: pathlib.Path) -> None:
        data, run = write_data_dir(base / "data"), base / "run"
        result = train(config, data, run, progress=False, truth_path=data / "SYNTH_TRUTH.csv")
        # Through JSON, as a test reading the run's files would see the values.
        (base / "summary.json").write_text(json.dumps({
            "history": result.history, "step": result.step, "validation": result.validation, "best": result.best,
            "n_train": 160, "config": config.to_dict()}))

    base = built_once(tmp_path_factory, "trained_rank1", build)
    summary = json.loads((base / "summary.json").read_text())
    return {"data": base / "data", "run": base / "run", "export": base / "run" / "export", **summary}


@pytest.fixture(scope="session")
def fixture_export(tmp_path_factory) -> pathlib.Path:
    """A seeded-noise test export (K = 2, no trained model) for tests of the service itself; read-only."""
    # TensorFlow loads only for the tests that ask for an export.
    from tests.support.serving_fixtures import write_fixture_export

    return built_once(tmp_path_factory, "fixture_export", lambda base: write_fixture_export(base, ensemble_size=2))


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> Callable[..., pathlib.Path]:
    """The one factory of tiny untrained exports: `tiny_export(**kwargs)` of write_tiny_model_export, read-only.

    Equal arguments (by repr) give the same folder, written once per session even under xdist: an
    export takes tens of seconds on 2 cores (tracing and saving every signature).
    """
    # TensorFlow loads only for the tests that ask for an export.
    from serving.tools.tiny_export import write_tiny_model_export

    def make(**kwargs) -> pathlib.Path:
        key = hashlib.sha256(repr(sorted(kwargs.items())).encode()).hexdigest()[:16]
        folder = built_once(tmp_path_factory, f"tiny_export_{key}",
                            lambda base: write_tiny_model_export(base / "export", **kwargs))
        return folder / "export"

    return make


@pytest.fixture(scope="session")
def reference_export(tmp_path_factory, tiny_export) -> pathlib.Path:
    """A tiny untrained export whose reference is its training folder's profile, for the monitor's tests; read-only.

    The folder: 60 / 8 / 8 admissions (seed 0, one train shard) in which chart:211 always records 5.0,
    a code whose training values are all one value, as the demo's PEEP setting. The soak, the
    monitor-refresh and the request-road tests serve it: one export (tiny_export's) for the three.
    """
    # TensorFlow loads only for the tests that ask for an export.
    from model.data_folder import load_data_files
    from model.evaluation import against_reference
    from tests.support.ehr_testdata import write_data_dir

    # The folder is cheap (well under a second); the export is made once per session by tiny_export.
    files = load_data_files(write_data_dir(tmp_path_factory.mktemp("reference_export") / "data",
                                           sizes=(("train", 60), ("validation", 8), ("test", 8)), train_shards=1,
                                           constant={"chart:211": 5.0}))
    vocabulary = {s: [c.split(":", 1)[1] for c in codes] for s, codes in files.vocabulary.items()}
    return tiny_export(vocabulary=vocabulary, reference=against_reference.reference_profile(files))


@pytest.fixture(scope="session")
def rank1_test_evaluation(trained_rank1, tmp_path_factory) -> dict:
    """`ehr-eval` of trained_rank1's run on its test split (S = 4, seed 3, its truth, 30 resamples, operating
    threshold sensitivity:0.8), once per session: the report folder ("out"), its arguments ("argv") and what it
    printed ("printed"), read-only. The model report's tests (tests/model/evaluation/test_report.py) read its page."""
    # TensorFlow loads only for the tests that ask for an evaluation.
    from model.cli import ehr_eval

    def build(base: pathlib.Path) -> None:
        argv = ["--model", str(trained_rank1["run"]), "--data", str(trained_rank1["data"]), "--split", "test",
                "--samples", "4", "--seed", "3", "--out", str(base / "eval"), "--truth",
                str(trained_rank1["data"] / "SYNTH_TRUTH.csv"), "--bootstrap", "30", "--threshold", "sensitivity:0.8",
                "--no-progress"]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = ehr_eval.main(argv)
        (base / "result.json").write_text(json.dumps({"code": code, "argv": argv, "printed": printed.getvalue()}))

    base = built_once(tmp_path_factory, "rank1_test_evaluation", build)
    return {"out": base / "eval", **json.loads((base / "result.json").read_text())}


@pytest.fixture(scope="session")
def demo_tiny_export(demo_run, tiny_export) -> pathlib.Path:
    """A tiny untrained export (K = 2) of the session's demo job output, read-only: the job's vocabulary,
    pipeline config, units and lab LOINC bridge, as a model trained on that output carries them."""
    from ehr_pipeline.contract import PipelineConfig, layout
    from tests.support.job_outputs import CONFIG

    data, _, _ = demo_run
    vocab = layout.read_json(str(data / layout.VOCABULARY))["sources"]
    # The job's own units and lab LOINC codes: values the job converted are converted by the service alike.
    return tiny_export(ensemble_size=2, vocabulary={s: [c.split(":", 1)[1] for c in codes] for s, codes in vocab.items()},
                       pipeline=PipelineConfig.model_validate(CONFIG), units=layout.read_json(str(data / layout.UNITS)),
                       lab_loinc=layout.read_json(str(data / layout.LAB_LOINC))["codes"])


@pytest.fixture(scope="session")
def demo_meds_conversion(demo_dir, tmp_path_factory) -> pathlib.Path:
    """The real demo through `to-meds` (job_outputs.CONFIG) on two workers with small buckets, once per session:
    the MEDS dataset's folder (its manifest from_mimic.MANIFEST inside), read-only.

    tests/ehr_pipeline/job/test_to_meds.py pins its bytes (the conversion's own, whatever the workers and the
    bucket size); the MEDS job's tests read it as the demo's MEDS dataset.
    """
    # Beam is imported only by the tests that run a job; collection stays light.
    from ehr_pipeline.contract import PipelineConfig
    from ehr_pipeline.job import SpillOptions, run_to_meds
    from tests.support.job_outputs import CONFIG

    def build(base: pathlib.Path) -> None:
        run_to_meds(str(demo_dir), str(base / "demo"), PipelineConfig.model_validate(CONFIG),
                    resources=SpillOptions(workers=2, bucket_rows=20_000))

    return built_once(tmp_path_factory, "demo_meds_conversion", build) / "demo"


@pytest.fixture(scope="session")
def rank1_export(trained_rank1):
    """trained_rank1's export loaded once per worker (model.export.load.load_export, float32), read-only.

    A load verifies every checksum and reads the whole SavedModel (seconds each): the tests that
    predict with, rebuild or compare against the trained export share this one.
    """
    # TensorFlow loads only for the tests that ask for the export.
    from model.export.load import load_export

    return load_export(trained_rank1["export"])


@pytest.fixture(scope="session")
def demo_meds_job(demo_meds_conversion, tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """`ehr-pipeline run --meds-dir` on demo_meds_conversion (job_outputs.CONFIG, two workers), once per session:
    (the data folder, its manifest), read-only.

    tests/ehr_pipeline/job/test_to_meds.py pins its bytes (the same on one worker or two); the MEDS round-trip
    test reads its examples as the MEDS job's on the demo.
    """
    # Beam is imported only by the tests that run a job; collection stays light.
    from ehr_pipeline.contract import PipelineConfig
    from ehr_pipeline.job import SpillOptions, run_meds_job
    from tests.support.job_outputs import CONFIG

    def build(base: pathlib.Path) -> None:
        run_meds_job(str(demo_meds_conversion), str(base / "data"), PipelineConfig.model_validate(CONFIG),
                     resources=SpillOptions(workers=2))

    out = built_once(tmp_path_factory, "demo_meds_job", build) / "data"
    return out, json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="session")
def units_model(tmp_path_factory, tiny_export) -> pathlib.Path:
    """A folder with data/ and export/ in mg/dL and mmol/L (tests/support/units_model.py), read-only: the
    hostile-input and unit-plausibility tests of ehr-eval share its one export."""
    # TensorFlow loads only for the tests that ask for an export.
    from tests.support.units_model import write_units_model

    return write_units_model(tmp_path_factory.mktemp("units_model"), tiny_export)
