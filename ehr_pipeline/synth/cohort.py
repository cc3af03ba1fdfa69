"""Patients and their admission timelines, drawn vectorised for one chunk.

All times are int64 seconds since 1970 (shifted MIMIC dates, years 2100-2200): 64-bit
nanosecond timestamps cannot hold the ~300-year DOB shift of patients over 89.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ehr_pipeline.synth import catalog
from ehr_pipeline.synth.truth import SECONDS_PER_YEAR, age_years

MINUTE, HOUR, DAY = 60, 3600, 86400
FIRST_ADMIT_MIN = 4_102_444_800  # 2100-01-01 00:00:00
FIRST_ADMIT_MAX = 7_098_307_200  # 2195-01-01 00:00:00

# Patient kinds: children and the over-89s exist so that cohort filters have work to do.
ADULT, NEONATE, TEEN, OVER89 = 0, 1, 2, 3

ADMISSION_TYPES = ("EMERGENCY", "ELECTIVE", "URGENT", "NEWBORN")
EMERGENCY, ELECTIVE, URGENT, NEWBORN = range(4)


@dataclasses.dataclass(frozen=True)
class CaseMix:
    """Who a hospital admits: the draws that differ between sites (docs/synthetic.md)."""

    kind_p: tuple[float, float, float, float] = (0.90, 0.06, 0.01, 0.03)  # ADULT, NEONATE, TEEN, OVER89
    adult_age_mean: float = 63.0  # years at first admission, before clipping to 18-89
    adult_age_sd: float = 16.0
    admission_type_p: tuple[float, float, float] = (0.8, 0.14, 0.06)  # EMERGENCY, ELECTIVE, URGENT (non-newborns)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function (dimensionless)."""
    return 1.0 / (1.0 + np.exp(-x))


def floor_to(t: np.ndarray, unit: int) -> np.ndarray:
    """Floors epoch seconds to a multiple of ``unit`` seconds."""
    return t - np.mod(t, unit)


@dataclasses.dataclass
class Patients:
    """One row per patient of the chunk."""

    subject_id: np.ndarray  # int64
    male: np.ndarray  # bool
    kind: np.ndarray  # int8, ADULT / NEONATE / TEEN / OVER89
    dob: np.ndarray  # int64 s, midnight
    chronic: np.ndarray  # bool [n, len(CHRONIC_DX)], conditions the patient carries


@dataclasses.dataclass
class Admissions:
    """One row per admission, patients' admissions contiguous and chronological."""

    pat: np.ndarray  # int64 index into Patients
    k: np.ndarray  # int64, 0 = the patient's first admission
    admit: np.ndarray  # int64 s, minute-aligned
    trigger: np.ndarray  # int64 s, admit + trigger offset
    disch_alive: np.ndarray  # int64 s, discharge if the patient survives
    short: np.ndarray  # bool, stay ends before the trigger
    severity: np.ndarray  # float, latent, standard normal-ish
    adm_type: np.ndarray  # int8 index into ADMISSION_TYPES
    carevue: np.ndarray  # bool, CareVue (else MetaVision) ICU system
    art_line: np.ndarray  # bool, arterial line (ABP items) instead of cuff (NBP items)
    intime: np.ndarray  # int64 s, ICU admission (seconds resolution, as in MIMIC)
    icu_out_short: np.ndarray  # int64 s, ICU discharge of short stays (else unused)
    death_delay: np.ndarray  # int64 s, trigger -> death if this admission ends in death
    disch_early: np.ndarray  # int64 s, DISCHTIME precedes DEATHTIME by this much (mostly 0)
    ed_reg: np.ndarray  # int64 s, emergency department registration; -1 = none
    weight_kg: np.ndarray  # float, admission weight
    age: np.ndarray  # float years at admission, capped at 90 (~300 for shifted DOB -> 90)
    neonate: np.ndarray  # bool
    chronic_coded: np.ndarray  # bool [n, len(CHRONIC_DX)], chronic codes on this admission
    prior_chronic: np.ndarray  # int64, distinct chronic codes coded on earlier admissions

    def take(self, idx: np.ndarray) -> "Admissions":
        """The admissions at ``idx`` (an index or boolean mask), every field subset alike."""
        return Admissions(**{f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)})

    def __len__(self) -> int:
        return int(self.pat.size)


def draw_patients(rng: np.random.Generator, n: int, subject0: int,
                  mix: CaseMix) -> tuple[Patients, np.ndarray, np.ndarray]:
    """Draws n patients; returns them with each one's first ADMITTIME (s) and true age there (years)."""
    kind = rng.choice(4, size=n, p=mix.kind_p).astype(np.int8)
    male = rng.random(n) < 0.56
    first_admit = floor_to(rng.integers(FIRST_ADMIT_MIN, FIRST_ADMIT_MAX, n), MINUTE)
    age_first = np.select(
        [kind == NEONATE, kind == TEEN, kind == OVER89],
        [np.zeros(n), rng.uniform(15.0, 18.0, n), rng.uniform(300.0, 306.0, n)],
        np.clip(rng.normal(mix.adult_age_mean, mix.adult_age_sd, n), 18.0, 89.0),
    )
    # Newborns are born on their admission day; everyone's DOB is a midnight.
    dob = floor_to(first_admit - (age_first * SECONDS_PER_YEAR).astype(np.int64), DAY)
    prevalence = np.asarray(catalog.CHRONIC_PREVALENCE) * np.clip(age_first / 65.0, 0.0, 1.3)[:, None]
    chronic = (rng.random((n, len(catalog.CHRONIC_DX))) < prevalence) & (kind[:, None] != NEONATE)
    pats = Patients(subject0 + np.arange(n, dtype=np.int64), male, kind, dob, chronic)
    return pats, first_admit, age_first


def draw_admissions(rng: np.random.Generator, pats: Patients, first_admit: np.ndarray,
                    trigger_offset: int, mix: CaseMix) -> Admissions:
    """Draws every admission a patient would have if none ended in death (chronological)."""
    n_pat = pats.kind.size
    n_adm = np.where(pats.kind == NEONATE, 1, 1 + np.minimum(rng.poisson(0.5, n_pat), 5))
    pat = np.repeat(np.arange(n_pat), n_adm)
    n = pat.size
    starts = np.cumsum(n_adm) - n_adm  # index of each patient's first admission
    k = np.arange(n) - starts[pat]
    neonate = pats.kind[pat] == NEONATE

    adm_type = np.where(neonate, NEWBORN, rng.choice(3, size=n, p=mix.admission_type_p)).astype(np.int8)
    n_chronic = pats.chronic[pat].sum(axis=1)
    severity = rng.normal(0.0, 1.0, n) + 0.15 * n_chronic - 0.5 * (adm_type == ELECTIVE) - 0.3 * neonate

    short = ~neonate & (rng.random(n) < np.where(adm_type == ELECTIVE, 0.2, 0.09))
    # Short stays end between 3 h and 1 h before the trigger; the others after it.
    short_los = floor_to(rng.integers(3 * HOUR, max(trigger_offset - HOUR, 3 * HOUR + MINUTE), n), MINUTE)
    after = np.where(neonate, rng.lognormal(np.log(4 * DAY), 0.8, n),
                     rng.lognormal(np.log(3 * DAY) + 0.2 * severity, 0.7, n))
    long_los = trigger_offset + floor_to(np.maximum(after, 2 * HOUR).astype(np.int64), MINUTE)
    los = np.where(short, short_los, long_los)
    # Readmissions come at least 30 days after the previous discharge, so outpatient labs
    # placed up to 29 days before an admission never fall inside another one.
    gap = 30 * DAY + floor_to(np.minimum(rng.lognormal(np.log(200 * DAY), 1.0, n), 3650 * DAY)
                              .astype(np.int64), MINUTE)
    span = los + gap
    excl = np.cumsum(span) - span
    admit = first_admit[pat] + excl - excl[starts][pat]
    trigger = admit + trigger_offset
    disch_alive = admit + los

    intime = admit + rng.integers(0, HOUR, n)
    icu_out_short = intime + ((disch_alive - intime) * rng.uniform(0.7, 1.0, n)).astype(np.int64)
    death_delay = floor_to(np.maximum(rng.lognormal(np.log(2.5 * DAY), 0.9, n), 2 * HOUR)
                           .astype(np.int64), MINUTE)
    # As in the real data, a few deaths are recorded after the discharge time.
    disch_early = np.where(rng.random(n) < 0.06, floor_to(rng.integers(MINUTE, 90 * MINUTE, n), MINUTE), 0)
    has_ed = (adm_type == EMERGENCY) & (rng.random(n) < 0.6)
    ed_reg = np.where(has_ed, admit - floor_to(rng.integers(HOUR, 8 * HOUR, n), MINUTE), -1)

    carevue = rng.random(n) < 0.45
    art_line = rng.random(n) < np.where(neonate, 0.1, sigmoid(severity - 0.3))
    weight = np.where(neonate, np.clip(rng.normal(3.2, 0.5, n), 1.0, 5.0),
                      np.clip(rng.normal(80.0, 18.0, n), 35.0, 250.0))
    weight = np.round(weight, 1)

    coded = pats.chronic[pat] & (rng.random((n, len(catalog.CHRONIC_DX))) < 0.85)
    seen = np.cumsum(coded, axis=0)
    seen_before = seen - coded  # inclusive minus own row ...
    seen_before = seen_before - (seen[starts] - coded[starts])[pat]  # ... minus earlier patients
    prior_chronic = (seen_before > 0).sum(axis=1).astype(np.int64)

    return Admissions(
        pat=pat, k=k, admit=admit, trigger=trigger, disch_alive=disch_alive, short=short,
        severity=severity, adm_type=adm_type, carevue=carevue, art_line=art_line, intime=intime,
        icu_out_short=icu_out_short, death_delay=death_delay, disch_early=disch_early, ed_reg=ed_reg,
        weight_kg=weight, age=age_years(admit, pats.dob[pat]), neonate=neonate, chronic_coded=coded,
        prior_chronic=prior_chronic,
    )


def first_deaths_only(adm: Admissions, died: np.ndarray) -> np.ndarray:
    """Mask of admissions that happen: none after the patient's in-hospital death."""
    cum = np.cumsum(died)
    starts = np.flatnonzero(adm.k == 0)
    first = starts[np.cumsum(adm.k == 0) - 1]  # each row's patient's first row
    deaths_before = cum - died - (cum[first] - died[first])
    return deaths_before == 0


@dataclasses.dataclass
class Outcome:
    """Discharge and death times once the death draw is known."""

    died: np.ndarray  # bool
    disch: np.ndarray  # int64 s
    death: np.ndarray  # int64 s, -1 = survived
    icu_out: np.ndarray  # int64 s


def settle(rng: np.random.Generator, adm: Admissions, died: np.ndarray) -> Outcome:
    """Fixes DISCHTIME / DEATHTIME / ICU OUTTIME; deaths of stays > trigger come after it."""
    long_death = died & ~adm.short
    death = np.where(long_death, adm.trigger + adm.death_delay, np.where(died, adm.disch_alive, -1))
    disch = np.where(long_death, death - adm.disch_early, adm.disch_alive)
    # Survivors leave the ICU for the ward some time after the trigger; deaths die in it.
    frac = rng.uniform(0.3, 0.95, len(adm))
    icu_long = adm.trigger + ((disch - adm.trigger) * frac).astype(np.int64)
    icu_out = np.where(adm.short, adm.icu_out_short, np.where(died, disch, icu_long))
    return Outcome(died=died, disch=disch, death=death, icu_out=icu_out)
