"""Shared fixtures. Importing ehr_pipeline first pins TF_USE_LEGACY_KERAS for every test."""
from __future__ import annotations

import pathlib

import pytest

import ehr_pipeline  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The real MIMIC-III demo lives beside the checkout and is never copied into it.
DEMO_DIR = (REPO_ROOT.parent / "shared" / "mimic-iii-demo").resolve()


@pytest.fixture(scope="session")
def demo_dir() -> pathlib.Path:
    """The real MIMIC-III v1.4 demo (100 patients); the suite requires it."""
    if not (DEMO_DIR / "ADMISSIONS.csv.gz").exists():
        pytest.fail(f"MIMIC-III demo not found at {DEMO_DIR}: check out the project beside shared/")
    return DEMO_DIR
