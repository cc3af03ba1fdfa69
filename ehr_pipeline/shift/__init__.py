"""Population shift: a population of admissions in numbers, and a new one compared with a model's reference.

The modules: ``population`` summarises admissions into a ``Profile`` (case mix, events per
source, out-of-vocabulary shares, per-code value distributions, units), from the job's records
or the service's bagged requests alike; ``compare`` compares a new profile with the reference a
model's export carries and returns a ``ShiftReport`` of findings; ``findings`` decides when a
compared distribution is a finding and words it; ``stats`` holds the statistics (PSI, the
chi-square and rank tests, Holm's correction, the ratio of medians); ``unit_mismatch`` lists the
codes whose units differ between a model and a data folder and moves records' values to the
model's units. docs/shift.md has the rules.

numpy and scipy (no Beam); TensorFlow only inside ``population.admissions_from_examples``, which
parses records.
"""
from __future__ import annotations

from ehr_pipeline.shift import population, unit_mismatch
from ehr_pipeline.shift.compare import (
    KINDS,
    MODERATE,
    NONE,
    SEVERE,
    SEVERITIES,
    Finding,
    ShiftReport,
    Thresholds,
    compare,
)
from ehr_pipeline.shift.population import (
    MI_QUANTILES,
    Admission,
    Distribution,
    Profile,
    admission_from_bags,
    admissions_from_examples,
    data_units,
    profile_of_data,
)
from ehr_pipeline.shift.unit_mismatch import Mismatch

__all__ = [
    "KINDS",
    "MI_QUANTILES",
    "MODERATE",
    "Mismatch",
    "NONE",
    "SEVERE",
    "SEVERITIES",
    "Admission",
    "Distribution",
    "Finding",
    "Profile",
    "ShiftReport",
    "Thresholds",
    "admission_from_bags",
    "admissions_from_examples",
    "compare",
    "data_units",
    "population",
    "profile_of_data",
    "unit_mismatch",
]
