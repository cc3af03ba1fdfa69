"""Shared fixtures. Importing ehr_pipeline first pins TF_USE_LEGACY_KERAS for every test."""
from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import settings

import ehr_pipeline  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any test imports TensorFlow)

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
