"""Shared fixtures. Importing ehr_base first pins TF_USE_LEGACY_KERAS for every test."""
from __future__ import annotations

import json
import os
import pathlib

import pytest
from hypothesis import settings

import ehr_base  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)

# CI replays the same generated examples on every run, so a submission's result does not depend on
# which random inputs a run happened to draw; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The real MIMIC-III demo lives beside the checkout and is never copied into it;
# $MIMIC_DEMO_DIR points the suite at a copy somewhere else.
DEMO_DIR = pathlib.Path(os.environ.get("MIMIC_DEMO_DIR") or REPO_ROOT.parent / "shared" / "mimic-iii-demo").resolve()
DEMO_MISSING = (
    f"needs the real MIMIC-III Clinical Database Demo v1.4 (open access, ODbL) at {DEMO_DIR}: download it "
    "from PhysioNet (physionet.org/content/mimiciii-demo/1.4/) and put its tables there as TABLE.csv.gz, or "
    "set MIMIC_DEMO_DIR (README 'Data')")


def demo_available() -> bool:
    """Whether the real demo's tables are where the suite looks for them."""
    return (DEMO_DIR / "ADMISSIONS.csv.gz").is_file()


@pytest.fixture(scope="session")
def demo_dir() -> pathlib.Path:
    """The real MIMIC-III v1.4 demo (100 patients); tests that need it skip without it."""
    if not demo_available():
        pytest.skip(DEMO_MISSING)
    return DEMO_DIR


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory) -> pathlib.Path:
    """A small pipeline output folder (160 / 48 / 48 admissions, seed 0) shared read-only by the session."""
    from ehr_testdata import write_data_dir

    return write_data_dir(tmp_path_factory.mktemp("synthetic_data"))


@pytest.fixture(scope="session")
def trained_rank1(tmp_path_factory) -> dict:
    """A tiny rank-1 run trained once per session: data, run folder, export, loss history, config."""
    from ehr_testdata import tiny_config_dict, write_data_dir

    from model.training.config import parse_config
    from model.training.train import train

    base = tmp_path_factory.mktemp("trained_rank1")
    data, run = write_data_dir(base / "data"), base / "run"
    # kl_scale < 1: with 160 training admissions the full KL / N_train would swamp the likelihood.
    config = parse_config(tiny_config_dict("rank1", steps=100, kl_scale=0.05, eval_every_steps=25))
    result = train(config, data, run, progress=False, truth_path=data / "SYNTH_TRUTH.csv")
    # Through JSON, as a test reading the run's files would see the values.
    summary = json.loads(json.dumps({"history": result.history, "step": result.step, "validation": result.validation,
                                     "best": result.best, "n_train": 160, "config": config.to_dict()}))
    return {"data": data, "run": run, "export": run / "export", **summary}


@pytest.fixture(scope="session")
def fixture_export(tmp_path_factory) -> pathlib.Path:
    """A seeded-noise test export (K = 2, no trained model) for tests of the service itself; read-only."""
    from tests.serving_fixtures import write_fixture_export

    return write_fixture_export(tmp_path_factory.mktemp("fixture_export"), ensemble_size=2)
