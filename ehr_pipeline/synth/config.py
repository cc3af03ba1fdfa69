"""Typed configuration of one synthetic release."""
from __future__ import annotations

import dataclasses
import pathlib

from ehr_pipeline.synth.site import SITES

DIALECTS = ("demo", "physionet")
# The mortality truth's family: "linear" in window aggregates (truth.MortalityModel, the default)
# or "temporal" (temporal.TemporalModel: plus trajectory terms no window aggregate expresses).
TRUTH_FAMILIES = ("linear", "temporal")
# Admission types a subgroup can be planted in (newborns are excluded from the cohort anyway).
PLANTABLE_TYPES = ("EMERGENCY", "ELECTIVE", "URGENT")
# The changes `synth-counterfactual` makes to a temporal release, and how far it delays a readmission (days).
COUNTERFACTUAL_CHANGES = ("reverse-course", "delay-readmission")
DEFAULT_DELAY_DAYS = 180

# Patients generated (and seeded) together. Part of a release's identity: the same seed
# with another chunk size gives other data, so it is a constant, not a knob. 250 patients
# are ~400k events at events_scale 1, i.e. well under 200 MB of working memory.
CHUNK_PATIENTS = 250

# First SUBJECT_ID / HADM_ID / ICUSTAY_ID at site A (a site adds its id_offset); ids then
# count up in patient order.
SUBJECT_ID_BASE = 10_000
HADM_ID_BASE = 100_000
ICUSTAY_ID_BASE = 200_000


@dataclasses.dataclass(frozen=True)
class SynthConfig:
    """Everything that determines a release; equal configs give byte-identical files."""

    patients: int
    seed: int
    trigger_offset_seconds: int = 86_400  # trigger = ADMITTIME + this; deaths come after it
    dialect: str = "demo"  # "demo" (quoted UPPERCASE header) or "physionet" (lowercase, minimal quoting)
    gzip: bool = True  # TABLE.csv.gz (True) or TABLE.csv
    events_scale: float = 1.0  # multiplies every measurement rate (1.0 ~ 300 events per ICU day)
    compresslevel: int = 1  # gzip level; 1 is ~3x faster than 6 for ~15% larger files
    dictionary_dir: pathlib.Path | None = None  # a release whose D_ITEMS / D_LABITEMS enrich ours
    site: str = "A"  # which hospital (site.SITES): case mix, charting rate, assay bias, lab units, codes
    # An admission type whose admissions die by another physiology (truth.PLANTED_TERMS reversed):
    # a subgroup a model fitted to everyone serves worse. None (the default) changes nothing.
    plant_subgroup: str | None = None
    truth: str = "linear"  # TRUTH_FAMILIES; "linear" releases are the bytes they always were

    def __post_init__(self) -> None:
        if self.patients < 1:
            raise ValueError(f"patients must be >= 1, got {self.patients}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        # Minute-aligned triggers keep minute-resolution CHARTTIMEs strictly on one side.
        if self.trigger_offset_seconds < 4 * 3600 or self.trigger_offset_seconds % 60:
            raise ValueError("trigger_offset_seconds must be a whole number of minutes >= 4 h, "
                             f"got {self.trigger_offset_seconds}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, got {self.dialect!r}")
        if not 0.0 < self.events_scale <= 100.0:
            raise ValueError(f"events_scale must be in (0, 100], got {self.events_scale}")
        if self.site not in SITES:
            raise ValueError(f"site must be one of {tuple(SITES)}, got {self.site!r}")
        if self.plant_subgroup is not None and self.plant_subgroup not in PLANTABLE_TYPES:
            raise ValueError(f"plant_subgroup must be one of {PLANTABLE_TYPES}, got {self.plant_subgroup!r}")
        if self.truth not in TRUTH_FAMILIES:
            raise ValueError(f"truth must be one of {TRUTH_FAMILIES}, got {self.truth!r}")
        if not 0 <= self.compresslevel <= 9:
            raise ValueError(f"compresslevel must be in 0..9, got {self.compresslevel}")
