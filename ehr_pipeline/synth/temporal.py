"""The temporal truth family (``--truth temporal``): P_DEATH that depends on how a patient got here.

The linear truth (truth.MortalityModel) is a sum of per-code aggregates over the admission's first
day, so a logistic regression on window aggregates can express it exactly. This family adds two
terms that no per-code mean / min / max / last / count over the window can express:

* ``creatinine_trend``: the least-squares slope of ln(creatinine) against time over a
  pre-admission clinic course (outpatient labs on 2-4 days, 2-25 days before ADMITTIME), per
  week. Rising creatinine raises the risk, falling creatinine lowers it.
* ``readmission``: ln(244 d / days since the previous admission's DISCHTIME), the time since
  the last event of a kind (0 for a first admission; 244 d is the geometric mean gap).

Both live where the project's encoding keeps time. With the default bagging (1-day bags,
trigger 24 h after admission) all the pre-trigger events of the current admission fall into one
or two bags. A trend inside those bags would be invisible to a sequence model by construction.
So every clinic visit gets a bag of its own: visits are at least 3 days - 8 h apart, more than
one bag width. Each bag records how long before the trigger it lies (``bag_offset_seconds``),
and that is also where the gap to the previous discharge shows. Both terms are odd or
centred functions of things the window aggregates do not see. The slope's sign is independent
of the course's level and spread. The course ends at least 2 days before admission, so it falls
outside a 48-h window. The admission's own values are drawn as in the linear family,
independently of the course. docs/synthetic.md gives the formula and the measured correlations.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ehr_pipeline.synth import catalog as cat
from ehr_pipeline.synth import events
from ehr_pipeline.synth.blocks import Block
from ehr_pipeline.synth.cohort import DAY, HOUR, MINUTE, Admissions, floor_to
from ehr_pipeline.synth.truth import MortalityModel, PreTriggerFeatures, libm

WEEK = 7 * DAY
# Outpatient creatinine of the same patient in this many days before ADMITTIME forms the
# admission's course (the course itself spans at most 25 days + 8 h, and a readmission comes at
# least 30 days after the previous discharge, so no other admission's course reaches in).
COURSE_WINDOW_DAYS = 28


@dataclasses.dataclass(frozen=True)
class ClinicCourse:
    """How the pre-admission clinic course is drawn (outpatient labs; no HADM_ID)."""

    share: float = 0.8  # of non-newborn admissions that have one
    extra_visits_mean: float = 1.0  # visits = 2 + min(Poisson(mean), 2): 2-4 visits
    last_visit_days: tuple[int, int] = (2, 4)  # last visit this many whole days before admission (inclusive)
    spacing_days: tuple[int, int] = (3, 7)  # days between consecutive visits (inclusive)
    visit_spread_hours: int = 8  # each visit a further 0-8 h earlier, so visits are > 1 bag width apart
    baseline_creatinine: float = 1.1  # mg/dL, median of the course's level (lognormal)
    baseline_sd: float = 0.25  # SD of ln(level) between admissions
    trend_sd: float = 0.15  # SD of the true slope of ln(creatinine), per week
    noise_sd: float = 0.03  # visit-to-visit SD of ln(creatinine) around the trend (before rounding)


@dataclasses.dataclass(frozen=True)
class TrajectoryFeatures:
    """Per admission, what the trajectory terms read; NaN = undefined (the term is 0)."""

    creatinine_trend: np.ndarray  # ln(mg/dL) per week: OLS slope over the course's numeric creatinine
    discharge_gap_days: np.ndarray  # days from the previous admission's DISCHTIME to this ADMITTIME


@dataclasses.dataclass(frozen=True)
class TemporalModel:
    """The temporal family's logit: a linear part (MortalityModel) plus the trajectory terms."""

    linear: MortalityModel
    course: ClinicCourse = ClinicCourse()  # how the course the trend is read from is drawn
    creatinine_trend: float = 10.0  # per ln(mg/dL) per week of the course's creatinine slope
    readmission: float = 1.0  # per ln(reference_gap_days / days since the previous discharge)
    reference_gap_days: float = 244.0  # geometric mean gap (30 d + lognormal median 200 d, sigma 1): centred term

    TERMS = ("creatinine_trend", "readmission")

    def design(self, t: TrajectoryFeatures) -> np.ndarray:
        """[N, len(TERMS)] trajectory inputs of the logit (dimensionless; 0 where undefined)."""
        gap = np.nan_to_num(t.discharge_gap_days, nan=self.reference_gap_days)
        return np.stack([np.nan_to_num(t.creatinine_trend, nan=0.0),
                         libm(math.log, self.reference_gap_days / gap)], axis=1)

    def coefficients(self) -> np.ndarray:
        """The coefficient of each of TERMS."""
        return np.array([self.creatinine_trend, self.readmission])

    def logit(self, f: PreTriggerFeatures, t: TrajectoryFeatures, planted: np.ndarray | None = None) -> np.ndarray:
        """Log-odds of in-hospital death (dimensionless): the linear part (planted: see MortalityModel) + trajectory."""
        logit = self.linear.logit(f, planted)
        # Term by term, as MortalityModel sums, so a seed writes the same P_DEATH on any CPU.
        for coefficient, term in zip(self.coefficients(), self.design(t).T):
            logit = logit + coefficient * term
        return logit

    def probability(self, f: PreTriggerFeatures, t: TrajectoryFeatures,
                    planted: np.ndarray | None = None) -> np.ndarray:
        """P(in-hospital death) per admission, in [0, 1]."""
        return 1.0 / (1.0 + libm(math.exp, -self.logit(f, t, planted)))

    def describe(self) -> dict:
        """The trajectory terms and the course, JSON-ready (SYNTH_MANIFEST.json; the linear part has its own entry)."""
        return {"trajectory": {"creatinine_trend": self.creatinine_trend, "readmission": self.readmission,
                               "reference_gap_days": self.reference_gap_days,
                               "course_window_days": COURSE_WINDOW_DAYS},
                "clinic_course": dataclasses.asdict(self.course)}


# The linear terms keep this share of their strength in the temporal family, and the intercept
# is set so that about 12% of the stays reaching the trigger end in death, as in the linear
# family: the trajectory terms then carry over half of the logit's variance (docs/synthetic.md).
LINEAR_WEIGHT = 0.7
TEMPORAL_INTERCEPT = -4.9


def temporal_model(events_scale: float) -> TemporalModel:
    """The temporal family's default model for a release of that events_scale."""
    base = MortalityModel(lab_volume_scale=events_scale)
    # Rounded so the manifest shows 0.91, not 1.3 * 0.7 = 0.9099999999999999.
    scaled = {term: round(LINEAR_WEIGHT * getattr(base, term), 12) for term in MortalityModel.TERMS}
    return TemporalModel(linear=dataclasses.replace(base, intercept=TEMPORAL_INTERCEPT, **scaled))


def clinic_course(rng: np.random.Generator, adm: Admissions, course: ClinicCourse) -> Block:
    """LABEVENTS rows (HADM_ID empty) of each admission's pre-admission clinic visits.

    Every visit orders the chemistry panel (creatinine among it), 60% a blood count and 20% a liver
    panel, with near-normal values as ``events.outpatient_labs`` draws them; creatinine follows the
    admission's own trajectory: ln(value) = ln(level) + slope * (time - mean visit time) / week + noise.
    """
    n = len(adm)
    has = ~adm.neonate & (rng.random(n) < course.share)
    visits = np.where(has, 2 + np.minimum(rng.poisson(course.extra_visits_mean, n), 2), 0)
    owner = np.repeat(np.arange(n), visits)
    first = np.repeat(np.cumsum(visits) - visits, visits)  # row of each admission's last visit
    step = np.where(np.arange(owner.size) == first,
                    rng.integers(course.last_visit_days[0], course.last_visit_days[1] + 1, owner.size),
                    rng.integers(course.spacing_days[0], course.spacing_days[1] + 1, owner.size))
    cum = np.cumsum(step)
    days_before = cum - (cum[first] - step[first])  # last visit first, then further back
    spread = floor_to(rng.integers(0, course.visit_spread_hours * HOUR, owner.size), MINUTE)
    t = adm.admit[owner] - days_before * DAY - spread
    level = rng.normal(math.log(course.baseline_creatinine), course.baseline_sd, n)
    slope = rng.normal(0.0, course.trend_sd, n)
    count = np.bincount(owner, minlength=n)
    mean_t = np.bincount(owner, weights=t.astype(np.float64), minlength=n) / np.maximum(count, 1)
    ln_cr = (level[owner] + slope[owner] * (t - mean_t[owner]) / WEEK
             + course.noise_sd * rng.standard_normal(owner.size))
    p = np.zeros((owner.size, len(cat.LAB_PANELS)))
    p[:, 0], p[:, 1], p[:, 4] = 1.0, 0.6, 0.2
    rows = events.lab_rows(rng, owner, t, rng.normal(-0.5, 0.5, owner.size), p,
                           fixed={cat.CREATININE_ITEMID: libm(math.exp, ln_cr)})
    rows["HADM_NULL"] = np.ones(rows["owner"].size, bool)
    return rows


def trajectory_features(adm: Admissions, course: Block) -> TrajectoryFeatures:
    """The trajectory terms' inputs from the admissions and their course rows (true values, site A codes)."""
    n = len(adm)
    owner, value = course["owner"], course["VALUENUM"]
    use = (course["ITEMID"] == cat.CREATININE_ITEMID) & ~np.isnan(value)
    owner = owner[use]
    days = (course["CHARTTIME"][use] - adm.admit[owner]) / DAY
    trend = ols_slope(owner, days, libm(math.log, value[use]), n) * 7.0
    previous_discharge = np.r_[0, adm.disch_alive[:-1]]  # admissions are per patient, chronological
    gap = np.where(adm.k >= 1, (adm.admit - previous_discharge) / DAY, np.nan)
    return TrajectoryFeatures(creatinine_trend=trend, discharge_gap_days=gap)


def ols_slope(owner: np.ndarray, x: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    """Per owner, the least-squares slope of y on x (y units per x unit); NaN with < 2 distinct x.

    Sums run through bincount, a plain loop in C, so the bits do not depend on the CPU's vector unit.
    """
    count = np.bincount(owner, minlength=n)
    safe = np.maximum(count, 1)
    dx = x - (np.bincount(owner, weights=x, minlength=n) / safe)[owner]
    dy = y - (np.bincount(owner, weights=y, minlength=n) / safe)[owner]
    sxx = np.bincount(owner, weights=dx * dx, minlength=n)
    sxy = np.bincount(owner, weights=dx * dy, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((count >= 2) & (sxx > 0), sxy / sxx, np.nan)
