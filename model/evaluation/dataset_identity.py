"""Which data an evaluation ran on, as a reviewer needs it named: source, synthetic or real, date handling, design.

The data folder's manifest records its input (``input.mimic_dir`` or ``input.meds_dir``); a synthetic
release writes ``SYNTH_MANIFEST.json`` into the folder it generates (generator, version, patients, seed).
``read_release_manifest`` reads that file when the input folder is still there; ``dataset_identity``
is pure and turns both into the sentence the report's summary and participants section print.
MIMIC-III shifts every date of a patient into the future (2100-2200) to protect privacy, so its real
calendar period is unknown and the report gives none; a synthetic release's dates are generated.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

SYNTH_MANIFEST = "SYNTH_MANIFEST.json"
# A random split by patient is an internal validation (TRIPOD+AI 10b): the test patients come from the same
# source, period and site as the training ones.
DESIGN = ("internal validation: patients assigned at random to train, validation and test splits, so a patient's "
          "admissions are all in one split; same source, period and site")
MISSING_DATA = ("no imputation and no exclusion for missing data: an event table with no record before the "
                "prediction time contributes no bag, and the model reads the absence itself (the bag sequence is "
                "shorter); numeric values outside their plausible range or in an unconvertible unit are set aside "
                "and counted in the data folder's dead letters")


def read_release_manifest(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The synthetic release's SYNTH_MANIFEST.json beside the data's input, or None (real data or folder gone)."""
    folder = (manifest.get("input") or {}).get("mimic_dir")
    if not folder:
        return None
    path = os.path.join(str(folder), SYNTH_MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def dataset_identity(manifest: Mapping[str, Any], release: Mapping[str, Any] | None) -> dict[str, Any]:
    """Name, provenance, date handling, design and missing-data handling of the data a report evaluates."""
    source = manifest.get("input") or {}
    if release is not None:
        name = (f"synthetic MIMIC-III-shaped release ({release.get('generator', 'ehr_pipeline.synth')} "
                f"{release.get('version', '')}, {release.get('patients', '?')} patients, seed "
                f"{release.get('seed', '?')})")
        dates = "generated dates: the calendar period has no real meaning"
        synthetic = True
    elif not source.get("mimic_dir") and not source.get("meds_dir"):
        name = "not recorded: the data folder's manifest names no input"
        dates = "unknown: the input is not named"
        synthetic = False
    elif source.get("meds_dir"):
        name = "MEDS dataset (from its MEDS metadata; the source's own documentation names it)"
        dates = "as recorded in the MEDS source; check its documentation for date shifting"
        synthetic = False
    else:
        folder = os.path.basename(os.path.normpath(str(source["mimic_dir"])))
        demo = "demo" in folder.lower()
        name = ("MIMIC-III Clinical Database Demo (100 patients, PhysioNet)" if demo
                else f"MIMIC-III Clinical Database (folder {folder})")
        dates = ("shifted: MIMIC-III moves each patient's dates to 2100-2200 for privacy, so the real period "
                 "(2001-2012, Beth Israel Deaconess Medical Center) is not recoverable per admission")
        synthetic = False
    return {"name": name, "synthetic": synthetic, "dates": dates, "design": DESIGN, "missing_data": MISSING_DATA}
