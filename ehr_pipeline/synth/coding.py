"""Per-admission records without a time of day: prescriptions and ICD-9 codes.

PRESCRIPTIONS carry dates only (00:00:00), DIAGNOSES_ICD / PROCEDURES_ICD no time at
all: both are known fully only after discharge, so they depend on the outcome.
"""
from __future__ import annotations

import numpy as np

from ehr_pipeline.synth import catalog as cat
from ehr_pipeline.synth.blocks import Block, Cat
from ehr_pipeline.synth.cohort import DAY, HOUR, Admissions, Outcome, floor_to, sigmoid

_COMFORT = len(cat.DRUGS)
_W = np.array([d.weight for d in cat.DRUGS])
_GAIN = np.array([d.severity_gain for d in cat.DRUGS])


def _group_rank(owner: np.ndarray) -> np.ndarray:
    """1-based position of each row within its (contiguous, sorted) owner group."""
    if owner.size == 0:
        return owner.copy()
    first = np.r_[True, owner[1:] != owner[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(owner.size), 0))
    return np.arange(owner.size) - start + 1


def prescriptions(rng: np.random.Generator, adm: Admissions, out: Outcome, scale: float,
                  drugs: tuple[cat.Drug, ...]) -> Block:
    """PRESCRIPTIONS rows: STARTDATE/ENDDATE at midnight, antibiotics and pressors for the sick.

    ``drugs`` names what is drawn: ``catalog.DRUGS`` then the comfort drug, in that order
    (a site may rename them; frequencies come from ``catalog.DRUGS``).
    """
    los = out.disch - adm.admit
    n = np.minimum(rng.poisson(scale * (2.0 + 1.5 * los / DAY)), 60)
    owner = np.repeat(np.arange(len(adm)), n)
    cum = np.cumsum(_W[None, :] * np.exp(_GAIN[None, :] * adm.severity[:, None]), axis=1)
    u = rng.random(owner.size) * cum[owner, -1]
    drug = (cum[owner] < u[:, None]).sum(axis=1)
    start = floor_to(adm.admit[owner] + (rng.random(owner.size) * los[owner]).astype(np.int64), DAY)
    end = start + DAY * (1 + rng.poisson(2.0, owner.size))

    # End-of-life comfort care, ordered after the trigger but dated at midnight: a
    # date-only STARTDATE can precede the trigger (a leakage trap for the pipeline).
    comfort = out.died & ~adm.short & (rng.random(len(adm)) < 0.6)
    c_owner = np.flatnonzero(comfort)
    ordered_at = np.maximum(adm.trigger[c_owner],
                            out.death[c_owner] - rng.integers(0, 18 * HOUR, c_owner.size))
    owner = np.concatenate([owner, c_owner])
    drug = np.concatenate([drug, np.full(c_owner.size, _COMFORT)])
    start = np.concatenate([start, floor_to(ordered_at, DAY)])
    end = np.concatenate([end, floor_to(out.death[c_owner], DAY) + DAY])
    order = np.lexsort((drug, start, owner))
    owner, drug, start, end = owner[order], drug[order], start[order], end[order]

    def col(name: str, main_only: bool = False) -> Cat:
        return Cat(drug, tuple(None if main_only and d.drug_type != "MAIN" else getattr(d, name) for d in drugs))

    m = owner.size
    return {
        "owner": owner, "STARTDATE": start, "ENDDATE": end,
        "ICU": rng.random(m) < 0.7,  # ICUSTAY_ID known for most lines
        "DRUG_TYPE": col("drug_type"), "DRUG": col("drug"), "DRUG_NAME_POE": col("drug", True),
        "DRUG_NAME_GENERIC": col("drug", True), "FORMULARY_DRUG_CD": col("formulary_cd"),
        "NDC": Cat.const("0", m), "PROD_STRENGTH": col("strength"), "DOSE_VAL_RX": col("dose"),
        "DOSE_UNIT_RX": col("dose_unit"), "FORM_VAL_DISP": col("form_val"),
        "FORM_UNIT_DISP": col("form_unit"), "ROUTE": col("route"),
    }


_DX = cat.ACUTE_DX + (cat.TERMINAL_DX,) + cat.CHRONIC_DX + cat.BACKGROUND_DX + cat.NEONATE_DX
_N_ACUTE, _N_CHRONIC, _N_BG = len(cat.ACUTE_DX), len(cat.CHRONIC_DX), len(cat.BACKGROUND_DX)


def _rows_from_matrix(present: np.ndarray, vocab: tuple[str, ...]) -> Block:
    owner, code = np.nonzero(present)  # row-major: per admission, in vocabulary order
    return {"owner": owner, "SEQ_NUM": _group_rank(owner), "ICD9_CODE": Cat(code, vocab)}


def diagnoses(rng: np.random.Generator, adm: Admissions, out: Outcome) -> Block:
    """DIAGNOSES_ICD rows: acute codes first (severity, death), then chronic, then background."""
    n = len(adm)
    adult = ~adm.neonate[:, None]
    acute = adult & (rng.random((n, _N_ACUTE)) < sigmoid(-2.4 + 0.9 * adm.severity + 1.0 * out.died)[:, None])
    terminal = adult[:, 0] & (rng.random(n) < np.where(out.died, 0.5, 0.01))
    background = adult & (rng.random((n, _N_BG)) < 0.25)
    birth = rng.integers(0, 2, n)  # V3000 vs V3001 (caesarean)
    neo = np.zeros((n, len(cat.NEONATE_DX)), bool)
    neo[np.arange(n), birth] = True
    neo[:, 2:] = rng.random((n, len(cat.NEONATE_DX) - 2)) < (0.3, 0.3, 0.5)
    neo &= adm.neonate[:, None]
    present = np.column_stack([acute, terminal, adm.chronic_coded, background, neo])
    # Every admission is coded with something.
    empty = ~present.any(axis=1)
    present[np.flatnonzero(empty), rng.integers(0, _N_ACUTE, empty.sum())] = True
    return _rows_from_matrix(present, _DX)


_PX = cat.PROCEDURES + cat.NEONATE_PROCEDURES
_SEVERE = np.array([c in cat.SEVERE_PROCEDURES for c in cat.PROCEDURES])
_I9671, _I9672 = cat.PROCEDURES.index("9671"), cat.PROCEDURES.index("9672")


def procedures(rng: np.random.Generator, adm: Admissions, out: Outcome) -> Block:
    """PROCEDURES_ICD rows: lines, intubation, ventilation, dialysis with severity."""
    n = len(adm)
    p = np.where(_SEVERE[None, :], sigmoid(-1.8 + 1.0 * adm.severity)[:, None], 0.06)
    px = (rng.random((n, len(cat.PROCEDURES))) < p) & ~adm.neonate[:, None]
    # Ventilation is coded by duration: under or over 96 hours.
    vent = px[:, _I9671] | px[:, _I9672]
    long_stay = (out.disch - adm.admit) > 4 * DAY
    px[:, _I9671], px[:, _I9672] = vent & ~long_stay, vent & long_stay
    neo = (rng.random((n, len(cat.NEONATE_PROCEDURES))) < 0.4) & adm.neonate[:, None]
    return _rows_from_matrix(np.column_stack([px, neo]), _PX)
