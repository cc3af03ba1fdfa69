"""The known truth of a synthetic release: P(in-hospital death) from pre-trigger facts.

Every input of ``death_logit`` can be recomputed from the written tables alone (events
with CHARTTIME < trigger, DOB, earlier admissions; at site B after undoing the assay bias
and local codes the manifest lists), so a model can in principle learn P_DEATH exactly;
tests recompute it from the files. docs/synthetic.md gives the formula.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

SECONDS_PER_YEAR = 365.2425 * 86400.0
# The physiology terms whose relation to death a planted subgroup reverses (SynthConfig.plant_subgroup),
# and the factor their coefficients take there: reversed and doubled, so that a model fitted to
# everyone errs there by more than a few hundred test cases can hide.
PLANTED_TERMS = ("lactate", "creatinine", "heart_rate", "systolic")
PLANTED_FACTOR = -2.0
AGE_CAP_YEARS = 90.0  # MIMIC shifts DOB of patients > 89 by ~300 years; cap like the pipeline


@dataclasses.dataclass(frozen=True)
class PreTriggerFeatures:
    """Per-admission facts observable before the trigger; NaN = not measured."""

    lactate_mean: np.ndarray  # mmol/L, mean true LABEVENTS 50813 value (site A: the VALUENUM)
    creatinine_max: np.ndarray  # mg/dL, max true LABEVENTS 50912 value (site A: the VALUENUM)
    hr_mean: np.ndarray  # beats/min, mean of CHARTEVENTS 211/220045 (ERROR != 1)
    sbp_min: np.ndarray  # mmHg, min of CHARTEVENTS 51/455/220050/220179 (ERROR != 1)
    n_labs: np.ndarray  # count of LABEVENTS rows of the admission (any value)
    age_years: np.ndarray  # (ADMITTIME - DOB) / 365.2425 d, capped at 90
    prior_admissions: np.ndarray  # earlier admissions of the same patient
    prior_chronic: np.ndarray  # distinct CHRONIC_DX codes coded on earlier admissions


@dataclasses.dataclass(frozen=True)
class MortalityModel:
    """Coefficients of the logit; the intercept sets the base rate (~12% for stays > 24 h)."""

    intercept: float = -5.55
    lactate: float = 1.3  # per log(lactate / 1.4 mmol/L)
    creatinine: float = 0.8  # per log(max creatinine / 1.0 mg/dL)
    heart_rate: float = 0.035  # per beat/min above the age-band reference
    systolic: float = 0.03  # per mmHg the minimum falls below the age-band reference
    lab_intensity: float = 0.35  # per log(1 + lab rows / lab_volume_scale)
    age: float = 0.03  # per year above 65
    prior_admission: float = 0.25  # per earlier admission, at most 3 counted
    chronic: float = 0.3  # per distinct chronic condition coded before
    neonate: float = -2.5  # newborns (age < 1 y) rarely die in hospital
    # The release's events_scale: lab volume is judged against it, so the base rate does
    # not move when a release is generated sparser or denser.
    lab_volume_scale: float = 1.0

    # The logit's terms, in the order of ``design`` (names for tables and fitted coefficients).
    TERMS = ("lactate", "creatinine", "heart_rate", "systolic", "lab_intensity", "age", "prior_admission",
             "chronic", "neonate")

    def design(self, f: PreTriggerFeatures) -> np.ndarray:
        """[N, len(TERMS)] inputs of the logit, each multiplied by its coefficient (dimensionless)."""
        neo = f.age_years < 1.0
        hr_ref = np.where(neo, 135.0, 85.0)
        sbp_ref = np.where(neo, 72.0, 122.0)
        # Unmeasured -> the reference value, i.e. a zero contribution: missing labs are
        # (weakly) reassuring, as clinicians skip tests on stable patients.
        return np.stack([
            libm(math.log, np.nan_to_num(f.lactate_mean, nan=1.4) / 1.4),
            libm(math.log, np.nan_to_num(f.creatinine_max, nan=1.0) / 1.0),
            np.nan_to_num(f.hr_mean - hr_ref, nan=0.0),
            np.nan_to_num(sbp_ref - f.sbp_min, nan=0.0),
            libm(math.log1p, f.n_labs / self.lab_volume_scale),
            np.minimum(f.age_years, AGE_CAP_YEARS) - 65.0,
            np.minimum(f.prior_admissions, 3),
            np.asarray(f.prior_chronic, dtype=np.float64),
            neo.astype(np.float64),
        ], axis=1)

    def coefficients(self) -> np.ndarray:
        """The coefficient of each of TERMS."""
        return np.array([self.lactate, self.creatinine, self.heart_rate, self.systolic, self.lab_intensity,
                         self.age, self.prior_admission, self.chronic, self.neonate])

    def logit(self, f: PreTriggerFeatures, planted: np.ndarray | None = None) -> np.ndarray:
        """Log-odds of in-hospital death for each admission (dimensionless).

        ``planted`` (bool per admission): those admissions' PLANTED_TERMS count PLANTED_FACTOR
        times, a physiology -> risk relation the rest of the population does not share.
        """
        # Summed term by term, left to right: a matrix product would round differently and
        # change the bytes of SYNTH_TRUTH.csv, which releases promise to keep.
        logit = self.intercept
        for name, coefficient, term in zip(self.TERMS, self.coefficients(), self.design(f).T):
            if planted is not None and name in PLANTED_TERMS:
                coefficient = np.where(planted, PLANTED_FACTOR * coefficient, coefficient)
            logit = logit + coefficient * term
        return logit

    def probability(self, f: PreTriggerFeatures, planted: np.ndarray | None = None) -> np.ndarray:
        """P(in-hospital death) per admission, in [0, 1] (planted: see logit)."""
        return 1.0 / (1.0 + libm(math.exp, -self.logit(f, planted)))


def libm(fn, x) -> np.ndarray:
    """fn (math.log, math.exp, ...) element by element, as float64.

    numpy's vectorised log and exp take another code path on AVX-512 machines than on AVX2 ones
    and round the last bit differently; SYNTH_TRUTH.csv prints P_DEATH at full precision, so the
    same seed would write other bytes on another CPU. The C library's functions do not depend on
    the vector unit (a few thousand calls per chunk: microseconds).
    """
    x = np.asarray(x, dtype=np.float64)
    return np.fromiter((fn(v) for v in x.ravel().tolist()), dtype=np.float64, count=x.size).reshape(x.shape)


def age_years(admit_s: np.ndarray, dob_s: np.ndarray) -> np.ndarray:
    """Age at admission in years from int64 epoch seconds, capped at 90 (DOB-shift safe)."""
    return np.minimum((admit_s - dob_s) / SECONDS_PER_YEAR, AGE_CAP_YEARS)
