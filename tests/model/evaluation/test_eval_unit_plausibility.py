"""ehr-eval's unit conversion keeps the plausibility bound the job and the service keep.

A data folder in other units than the model is converted before scoring (model.evaluation.unit_check),
but a conversion that would land a code's values a thousand times away from the model's training
median is the sign of a unit field that does not describe its values: the job dead-letters those
values and the service leaves them out (units.Harmoniser, magnitudes.BOUND). Here the same folder
is judged by ehr-eval's plan and, value by value, by the service's own Harmoniser of the export:
both must agree, and ehr-eval must refuse with one line naming the code and the reason.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from ehr_pipeline.contract import layout
from ehr_pipeline.encode import magnitudes, units
from model.evaluation.unit_check import UnitMismatchError, plan_units
from model.export.load import load_export
from tests.support.ehr_testdata import write_data_dir
from tests.support.units_model import CREATININE, LACTATE, MODEL_UNITS, TRAINING_MEDIAN, UMOL_PER_MG_DL

SIZES = (("train", 12), ("validation", 4), ("test", 4))


@pytest.fixture(scope="module")
def export(units_model):
    """The session's tiny export in mg/dL and mmol/L, creatinine's training median 1.1 mg/dL (its units.json)."""
    return load_export(units_model / "export")


def _si_folder(path: pathlib.Path, creatinine_median: float | None) -> pathlib.Path:
    """A data folder whose creatinine is declared umol/L, its units.json median of it `creatinine_median`."""
    data = write_data_dir(path, sizes=SIZES, seed=5, train_shards=1, scale={CREATININE: UMOL_PER_MG_DL},
                          units={**MODEL_UNITS["canonical"], CREATININE: "umol/L"})
    if creatinine_median is not None:  # as the job writes it: the median |value| in the folder's canonical unit
        doc = json.loads((data / layout.UNITS).read_text())
        doc["medians"] = {CREATININE: creatinine_median, LACTATE: 1.8}
        layout.write_json(str(data / layout.UNITS), doc)
        manifest = json.loads((data / layout.MANIFEST).read_text())
        manifest["units"]["sha256"] = layout.sha256_of(str(data / layout.UNITS))
        layout.write_json(str(data / layout.MANIFEST), manifest)
    return data


def _service_outcome(export, value_umol: float) -> str:
    """What the service's Harmoniser of `export` does to one creatinine value sent in umol/L."""
    done = export.files.harmoniser.harmonise(np.array([CREATININE], dtype=object), ["umol/L"], np.array([value_umol]))
    return str(done.outcomes[0])


def test_a_conversion_onto_the_training_values_is_made(export, tmp_path):
    data = _si_folder(tmp_path / "si", creatinine_median=UMOL_PER_MG_DL * TRAINING_MEDIAN)
    plan = plan_units([export], data)
    assert list(plan.conversions) == [CREATININE]
    assert plan.canonical[CREATININE] == "mg/dL"
    assert _service_outcome(export, UMOL_PER_MG_DL * TRAINING_MEDIAN) == units.CONVERTED  # the service agrees


@pytest.mark.parametrize("off", [1e4, 1e-4])
def test_a_conversion_that_leaves_the_bound_is_refused_as_the_service_refuses_it(export, tmp_path, off):
    median = UMOL_PER_MG_DL * TRAINING_MEDIAN * off  # a unit field that does not describe its values
    data = _si_folder(tmp_path / "si", creatinine_median=median)
    assert _service_outcome(export, median) == units.IMPLAUSIBLE
    with pytest.raises(UnitMismatchError) as raised:
        plan_units([export], data)
    message = str(raised.value)
    assert "\n" not in message
    conversion, _ = units.Converter().conversion("umol/L", "mg/dL", "2160-0")
    assert message.startswith(f"{data} holds 1 code(s) in units that cannot be converted to the model's "
                              f"({CREATININE} umol/L -> mg/dL cannot be converted (the conversion "
                              f"x{conversion.scale:.4g} is implausible: once converted, its values"), message
    assert f"outside the plausible {1 / magnitudes.BOUND:g} to {magnitudes.BOUND:g} times" in message
    assert message.endswith("or pass --force to score them as they are")
    assert plan_units([export], data, force=True).forced  # --force scores them as they are, as before


def test_a_folder_without_medians_is_converted_unjudged(export, tmp_path):
    # Folders written before the job kept medians: nothing to judge with, the conversion is made (as before).
    plan = plan_units([export], _si_folder(tmp_path / "old", creatinine_median=None))
    assert list(plan.conversions) == [CREATININE]
