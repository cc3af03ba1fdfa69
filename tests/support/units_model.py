"""The model in mg/dL and mmol/L that the unit tests of ehr-eval judge data against (not a test module itself).

One data folder (40 / 24 / 24 admissions, seed 0, one train shard, PEEP charted as 5 everywhere, its units
declared) and one tiny untrained export of its vocabulary, units, training medians, lab LOINC codes and
reference: tests/model/cli/test_hostile_model_inputs.py feeds faulted and awkward folders to it, and
tests/model/evaluation/test_eval_unit_plausibility.py judges conversions against its medians. Writing an
export costs tens of seconds (tracing and saving every signature); the two modules share this one.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable

from model.data_folder import load_data_files
from model.evaluation import against_reference
from tests.support.ehr_testdata import write_data_dir

CREATININE, LACTATE, PEEP = "lab:50912", "lab:50813", "chart:211"
UMOL_PER_MG_DL = 88.4
TRAINING_MEDIAN = 1.1  # creatinine, mg/dL
# The job's units.json of the training data: counts per unit, the canonical unit and the median |value| in it.
MODEL_UNITS = {"codes": {CREATININE: {"mg/dL": 100}, LACTATE: {"mmol/L": 100}},
               "canonical": {CREATININE: "mg/dL", LACTATE: "mmol/L"},
               "medians": {CREATININE: TRAINING_MEDIAN, LACTATE: 1.8}}
LAB_LOINC = {"2160-0": ["50912"], "2524-7": ["50813"]}
SIZES = (("train", 40), ("validation", 24), ("test", 24))


def write_units_model(root: pathlib.Path, tiny_export: Callable[..., pathlib.Path]) -> pathlib.Path:
    """root/data (the folder) and root/export (a link to tiny_export's export of it); returns root."""
    files = load_data_files(write_data_dir(root / "data", sizes=SIZES, train_shards=1, constant={PEEP: 5.0},
                                           units=MODEL_UNITS["canonical"]))
    vocabulary = {s: [c.split(":", 1)[1] for c in codes] for s, codes in files.vocabulary.items()}
    (root / "export").symlink_to(tiny_export(vocabulary=vocabulary, units=MODEL_UNITS, lab_loinc=LAB_LOINC,
                                             reference=against_reference.reference_profile(files)))
    return root
