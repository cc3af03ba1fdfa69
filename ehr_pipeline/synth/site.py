"""Hospitals a release can come from: the same disease, admitted and recorded differently.

A site sets who is admitted (``CaseMix``), how often the ICU charts, and how the record
reads what was measured: a lab assay bias, lab units and local item / drug codes. The mortality
truth is computed from the true values before any of the recording differences apply,
so at sites A, B and C P_DEATH is the same function of the physiology (docs/synthetic.md,
"Sites"). Sites D and E are site A's hospital whose truth differs: a higher baseline risk
(intercept) at D, other effects of some predictors (coefficients) at E, the shifts the classic
model-updating ladder is built to find. Site A is the generator as it always was; its releases
do not change.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ehr_pipeline.synth import catalog as cat
from ehr_pipeline.synth import events
from ehr_pipeline.synth.blocks import Block
from ehr_pipeline.synth.cohort import CaseMix
from ehr_pipeline.synth.temporal import TemporalModel
from ehr_pipeline.synth.truth import MortalityModel

# Site B's own codes are site A's code plus this: far above every MIMIC-III v1.4 ITEMID
# (D_ITEMS ends near 230,000), so they never collide with a real dictionary's rows.
SITE_CODE_OFFSET = 1_000_000


@dataclasses.dataclass(frozen=True)
class Site:
    """One hospital's case mix, charting rate and recording conventions."""

    name: str
    description: str  # one line for `ehr-pipeline synth --help`
    stream: tuple[int, ...]  # appended to (seed, chunk) of every chunk's SeedSequence
    id_offset: int  # added to the first SUBJECT_ID, HADM_ID and ICUSTAY_ID
    case_mix: CaseMix
    chart_rate: float  # multiplies the CHARTEVENTS rates (vitals, temperature, GCS; weight is charted once)
    lab_bias: tuple[tuple[int, float], ...] = ()  # (LABEVENTS ITEMID, recorded / true value)
    lab_codes: tuple[tuple[int, int], ...] = ()  # (site A lab ITEMID, this site's ITEMID)
    chart_codes: tuple[tuple[int, int], ...] = ()  # (site A chart ITEMID, this site's ITEMID)
    drug_codes: tuple[tuple[str, str, str], ...] = ()  # (site A FORMULARY_DRUG_CD, DRUG here, FORMULARY_DRUG_CD here)
    # (site A LABEVENTS ITEMID, unit written, recorded value per site-A unit, decimals): one
    # line per analyte the site reports in another unit (catalog.SI_LAB_UNITS: SI units).
    lab_units: tuple[tuple[int, str, float, int], ...] = ()
    # The site's own truth: added to the logit's intercept, and (MortalityModel term, factor)
    # multiplying that term's coefficient. Both default to site A's truth.
    truth_intercept_shift: float = 0.0
    truth_factors: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted({term for term, _ in self.truth_factors} - set(MortalityModel.TERMS))
        if unknown:
            raise ValueError(f"site {self.name}: truth_factors name unknown terms {unknown}; "
                             f"known: {MortalityModel.TERMS}")

    def truth_model(self, model: MortalityModel | TemporalModel) -> MortalityModel | TemporalModel:
        """The model with this site's truth: intercept shifted, factored coefficients multiplied.

        A temporal model's linear part changes; its trajectory terms are the same at every site.
        """
        if not (self.truth_intercept_shift or self.truth_factors):
            return model  # the same object: site A's P_DEATH keeps its bits
        if isinstance(model, TemporalModel):
            return dataclasses.replace(model, linear=self.truth_model(model.linear))
        factored = {term: getattr(model, term) * factor for term, factor in self.truth_factors}
        return dataclasses.replace(model, intercept=model.intercept + self.truth_intercept_shift, **factored)

    def observe_labs(self, b: Block) -> Block:
        """LABEVENTS rows of true values as this site records them (assay bias, units, local codes)."""
        if not b or not (self.lab_bias or self.lab_units or self.lab_codes):
            return b
        out = events.assay_bias(b, dict(self.lab_bias)) if self.lab_bias else dict(b)
        if self.lab_units:  # the biased reading, written in the site's unit
            out = events.lab_units(out, {i: (u, f, d) for i, u, f, d in self.lab_units})
        out["ITEMID"] = _recode(b["ITEMID"], self.lab_codes)
        return out

    def observe_charts(self, b: Block) -> Block:
        """CHARTEVENTS rows with this site's local item codes."""
        if not b or not self.chart_codes:
            return b
        return {**b, "ITEMID": _recode(b["ITEMID"], self.chart_codes)}

    def drugs(self) -> tuple[cat.Drug, ...]:
        """The prescription vocabulary (``catalog.DRUGS`` + the comfort drug) with local names and codes."""
        local = {old: (name, code) for old, name, code in self.drug_codes}
        out = []
        for d in cat.DRUGS + (cat.COMFORT_DRUG,):
            if d.formulary_cd in local:
                name, code = local[d.formulary_cd]
                d = dataclasses.replace(d, drug=name, formulary_cd=code)
            out.append(d)
        return tuple(out)

    def d_labitems_rows(self) -> dict[str, list]:
        """D_LABITEMS columns: the built-in rows, then one per local code (label and LOINC of the original)."""
        return _with_local_rows(cat.d_labitems_rows(), self.lab_codes)

    def d_items_rows(self) -> dict[str, list]:
        """D_ITEMS columns: the built-in rows, then one per local chart code (copied from the original)."""
        return _with_local_rows(cat.d_items_rows(), self.chart_codes)

    def describe(self) -> dict:
        """The site's parameters as JSON-ready values (for SYNTH_MANIFEST.json)."""
        out = {
            "name": self.name, "stream": list(self.stream), "id_offset": self.id_offset,
            "case_mix": dataclasses.asdict(self.case_mix), "chart_rate": self.chart_rate,
            "lab_bias": {str(i): f for i, f in self.lab_bias},
            "lab_codes": {str(a): b for a, b in self.lab_codes},
            "chart_codes": {str(a): b for a, b in self.chart_codes},
            "drug_codes": {a: {"drug": n, "formulary_drug_cd": c} for a, n, c in self.drug_codes},
        }
        if self.lab_units:  # only where used: the manifests of sites A and B keep their bytes
            out["lab_units"] = {str(i): {"unit": u, "factor": f, "decimals": d} for i, u, f, d in self.lab_units}
        if self.truth_intercept_shift or self.truth_factors:  # likewise: sites A, B and C keep theirs
            out["truth"] = {"intercept_shift": self.truth_intercept_shift,
                            "coefficient_factors": dict(self.truth_factors)}
        return out


def _recode(itemid: np.ndarray, pairs: tuple[tuple[int, int], ...]) -> np.ndarray:
    out = itemid.copy()
    for old, new in pairs:
        out[itemid == old] = new
    return out


def _with_local_rows(rows: dict[str, list], pairs: tuple[tuple[int, int], ...]) -> dict[str, list]:
    """Dictionary columns plus a copy of each recoded item's row under its local ITEMID."""
    pos = {itemid: k for k, itemid in enumerate(rows["ITEMID"])}
    out = {name: list(values) for name, values in rows.items()}
    for old, new in pairs:
        for name, values in rows.items():
            out[name].append(new if name == "ITEMID" else values[pos[old]])
    return out


def _local(*itemids: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, i + SITE_CODE_OFFSET) for i in itemids)


SITE_A = Site(name="A", description="the generator as it always was (MIMIC-III's US units and codes)",
              stream=(), id_offset=0, case_mix=CaseMix(), chart_rate=1.0)

# An older, sicker, mostly emergency population; vitals charted every 2 h, not hourly;
# creatinine by a Jaffe-type assay that reads high, lactate and glucose on analysers that
# read high; the blood count, INR and bilirubin, respiratory rate, SpO2 and temperature
# under the site's own item codes; six drugs under local names and formulary codes.
SITE_B = Site(
    name="B", description="older, more emergent patients, vitals charted half as often, creatinine / lactate / "
                         "glucose read high, its own codes for some items and drugs",
    stream=(1,), id_offset=10_000_000,
    case_mix=CaseMix(kind_p=(0.93, 0.02, 0.01, 0.04), adult_age_mean=70.0, adult_age_sd=14.0,
                     admission_type_p=(0.88, 0.05, 0.07)),
    chart_rate=0.5,
    lab_bias=((cat.CREATININE_ITEMID, 1.15), (cat.LACTATE_ITEMID, 1.2), (50931, 1.1)),
    lab_codes=_local(51301, 51265, 51237, 50885),  # WBC, platelets, INR, bilirubin
    chart_codes=_local(*(i for c in (cat.RESP, cat.SPO2, cat.TEMP_F) for i in (c.cv_itemid, c.mv_itemid))),
    drug_codes=(("HEPA5I", "Heparin Sodium", "HEPS5000I"), ("PANT40T", "Protonix", "PROT40T"),
                ("VANC1F", "Vancomycin HCl", "VANH1000F"), ("PIPT45F", "Zosyn", "ZOSY45F"),
                ("NORE4I", "Levophed", "LEVO4I"), ("ACET325T", "Tylenol", "TYLE325T")),
)

# Site A's patients, case mix, charting and codes, with the chemistry and blood count reported
# in SI units as most of the world's labs report them (catalog.SI_LAB_UNITS: creatinine and
# bilirubin in umol/L; glucose, urea, calcium, magnesium, phosphate in mmol/L; albumin and
# hemoglobin in g/L). Its own patients (stream 2) and ids.
SITE_C = Site(
    name="C", description="site A's patients and charting, nine chemistry and blood-count analytes in SI units "
                         "(umol/L, mmol/L, g/L)",
    stream=(2,), id_offset=20_000_000, case_mix=CaseMix(), chart_rate=1.0, lab_units=cat.SI_LAB_UNITS,
)

# Site A's patients, charting and records (its own patients: stream 3) in a hospital whose
# patients die more often at the same physiology: the intercept + ln 2, twice the odds of death
# for everyone. Recalibration in the large (a new intercept) recovers its truth exactly.
SITE_D = Site(
    name="D", description="site A's patients, charting and records; twice the odds of death at the same "
                         "physiology (the truth's intercept + ln 2)",
    stream=(3,), id_offset=30_000_000, case_mix=CaseMix(), chart_rate=1.0, truth_intercept_shift=math.log(2.0),
)

# Site A's patients, charting and records (stream 4) in a hospital where the physiology weighs
# less and age more: the lactate, creatinine, heart-rate and systolic terms count half (a unit
# that treats shock early blunts what the first day's physiology says), age twice. The intercept
# + 0.7 keeps the share of deaths at site A's (11% of adult stays reaching the trigger, measured):
# the shift is in the effects, not the base rate. No intercept and slope on site A's logit
# reproduces it; revision (refitting the coefficients) does.
SITE_E = Site(
    name="E", description="site A's patients, charting and records; lactate, creatinine, heart rate and low "
                         "blood pressure weigh half as much in the truth, age twice as much, the same share of deaths",
    stream=(4,), id_offset=40_000_000, case_mix=CaseMix(), chart_rate=1.0, truth_intercept_shift=0.7,
    truth_factors=(("lactate", 0.5), ("creatinine", 0.5), ("heart_rate", 0.5), ("systolic", 0.5), ("age", 2.0)),
)

SITES = {s.name: s for s in (SITE_A, SITE_B, SITE_C, SITE_D, SITE_E)}
