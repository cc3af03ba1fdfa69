"""Time-stamped events of one time window per admission: labs, charts, outputs, inputs.

Each generator draws a Poisson process per admission on [start, end) (minute-aligned
times, so sampling is irregular), then values from the admission's severity. The same
functions run twice per chunk: before the trigger (these events decide the death
probability) and after it, where ``ramp`` lets dying patients deteriorate towards death.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ehr_pipeline.synth import catalog as cat
from ehr_pipeline.synth.blocks import NULL, Block, Cat, concat
from ehr_pipeline.synth.cohort import (DAY, EMERGENCY, HOUR, MINUTE, URGENT, Admissions, floor_to,
                                       sigmoid)

LAB_DRAWS_PER_HOUR = 1 / 8  # at severity 0; x exp(0.35 severity)
VITAL_ROUNDS_PER_HOUR = 1.0  # HR, BP, RR, SpO2 charted together
SLOW_ROUNDS_PER_HOUR = 0.25  # temperature and GCS
RAMP_SEVERITY = 2.5  # extra severity reached at death, ramping over the last 12 h
MISSING_ITEM_P = 0.05  # an item of a round / panel not charted
NON_NUMERIC_LAB_P = 0.002  # "HEMOLYZED" and friends: VALUE without VALUENUM
CHART_ERROR_P = 0.004  # MetaVision rows marked ERROR=1 (value is garbage)


@dataclasses.dataclass(frozen=True)
class Window:
    """Per-admission [start, end) of lab and ICU events, and the death ramp if any."""

    lab_start: np.ndarray
    lab_end: np.ndarray
    icu_start: np.ndarray
    icu_end: np.ndarray
    ramp_start: np.ndarray | None = None  # severity ramps up from here ...
    ramp_end: np.ndarray | None = None  # ... to RAMP_SEVERITY at death (end <= start: no ramp)


def poisson_times(rng: np.random.Generator, start: np.ndarray, end: np.ndarray,
                  rate_per_hour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Event owners and times (s, minute-aligned, in [start, end)) of per-row Poisson processes."""
    s = start + np.mod(-start, MINUTE)  # ceil to the minute
    e = floor_to(end, MINUTE)
    span_min = np.maximum((e - s) // MINUTE, 0)
    n = rng.poisson(np.asarray(rate_per_hour) * span_min / 60.0)
    owner = np.repeat(np.arange(start.size), n)
    t = s[owner] + MINUTE * (rng.random(owner.size) * span_min[owner]).astype(np.int64)
    return owner, t


def severity_at(adm: Admissions, owner: np.ndarray, t: np.ndarray, w: Window) -> np.ndarray:
    """Severity of each event's admission at time t, including the terminal ramp."""
    s = adm.severity[owner]
    if w.ramp_start is None:
        return s
    r0, r1 = w.ramp_start[owner], w.ramp_end[owner]
    active = r1 > r0
    frac = np.clip((t - r0) / np.where(active, r1 - r0, 1), 0.0, 1.0)
    return s + RAMP_SEVERITY * frac * active


def round_decimals(x: np.ndarray, decimals: np.ndarray | int) -> np.ndarray:
    """x rounded to ``decimals`` places, as MIMIC prints the value."""
    # Dividing two exact doubles gives the double nearest the decimal, so "14.1" prints as such.
    scale = 10.0 ** np.asarray(decimals)
    return np.round(x * scale) / scale


def _common(rng: np.random.Generator, t: np.ndarray) -> dict:
    n = t.size
    return {
        "STORETIME": t + floor_to(rng.integers(MINUTE, HOUR, n), MINUTE),
        "CGID": rng.integers(14_000, 21_600, n),
    }


# ---------------------------------------------------------------- labs
_LAB = cat.LAB_ITEMS
_L_ITEMID = np.array([i.itemid for i in _LAB])
_L_SORTER = np.argsort(_L_ITEMID)
_L_PANEL = np.array([cat.LAB_PANELS.index(i.panel) for i in _LAB])
_L_CENTRE = np.array([i.centre for i in _LAB])
_L_SD = np.array([i.sd for i in _LAB])
_L_SHIFT = np.array([i.shift for i in _LAB])
_L_LOG = np.array([i.log for i in _LAB])
_L_LO = np.array([i.lo for i in _LAB])
_L_HI = np.array([i.hi for i in _LAB])
_L_REF_LO = np.array([i.ref_lo for i in _LAB])
_L_REF_HI = np.array([i.ref_hi for i in _LAB])
_L_DEC = np.array([i.decimals for i in _LAB])
_L_UOM_VOCAB = tuple(sorted({i.unit for i in _LAB if i.unit}))
_L_UOM = np.array([_L_UOM_VOCAB.index(i.unit) if i.unit else -1 for i in _LAB])
LAB_TEXT_VALUES = ("HEMOLYZED", "UNABLE TO REPORT", "SPECIMEN CLOTTED")


def lab_rows(rng: np.random.Generator, owner: np.ndarray, t: np.ndarray, s: np.ndarray,
             panel_p: np.ndarray, fixed: dict[int, np.ndarray] | None = None) -> Block:
    """Lab rows of the given draws; panel_p[i, k] = P(draw i orders panel k).

    ``fixed`` (ITEMID -> value per draw, in the item's unit) replaces the severity-drawn value of
    those items before clipping and rounding; the draws happen all the same, so the stream of
    random numbers does not depend on it.
    """
    ordered = rng.random(panel_p.shape) < panel_p
    present = ordered[:, _L_PANEL] & (rng.random((owner.size, _L_ITEMID.size)) >= MISSING_ITEM_P / 2)
    d, j = np.nonzero(present)
    s = s[d]
    x = _L_CENTRE[j] + _L_SHIFT[j] * s + _L_SD[j] * rng.standard_normal(d.size)
    x = np.where(_L_LOG[j], np.exp(np.minimum(x, 12.0)), x)
    for itemid, per_draw in (fixed or {}).items():
        x = np.where(_L_ITEMID[j] == itemid, per_draw[d], x)
    x = round_decimals(np.clip(x, _L_LO[j], _L_HI[j]), _L_DEC[j])
    bad = rng.random(d.size) < NON_NUMERIC_LAB_P
    x = np.where(bad, np.nan, x)
    return {
        "owner": owner[d],
        "CHARTTIME": t[d],
        "ITEMID": _L_ITEMID[j],
        "VALUE": Cat(np.where(bad, rng.integers(0, len(LAB_TEXT_VALUES), d.size), -1), LAB_TEXT_VALUES),
        "VALUENUM": x,
        "VALUEUOM": Cat(_L_UOM[j], _L_UOM_VOCAB),
        "FLAG": _lab_flag(j, x),
    }


def _lab_flag(j: np.ndarray, x: np.ndarray) -> Cat:
    """FLAG of lab values x of items j: "abnormal" outside the reference range (NaN: none)."""
    return Cat(np.where((x < _L_REF_LO[j]) | (x > _L_REF_HI[j]), 0, -1), ("abnormal",))


def assay_bias(b: Block, factors: dict[int, float]) -> Block:
    """Lab rows as an assay reading ``factors[ITEMID]`` x the true value records them.

    VALUENUM is scaled and rounded to the item's decimals again; FLAG is judged on the
    recorded value (the lab does not know its bias). Items without a factor are unchanged.
    """
    out = dict(b)
    ids = b["ITEMID"]
    j = np.searchsorted(_L_ITEMID, ids, sorter=_L_SORTER)
    j = _L_SORTER[np.clip(j, 0, _L_ITEMID.size - 1)]
    x = b["VALUENUM"]
    for itemid, factor in factors.items():
        hit = ids == itemid
        x = np.where(hit, round_decimals(x * factor, _L_DEC[j]), x)
    out["VALUENUM"] = x
    out["FLAG"] = _lab_flag(j, x)
    return out


def lab_units(b: Block, units: dict[int, tuple[str, float, int]]) -> Block:
    """Lab rows with the items of ``units`` (ITEMID -> (unit, factor, decimals)) recorded in that unit.

    VALUENUM is the value times the factor, rounded to the unit's decimals, and VALUEUOM names
    the unit (VALUE prints VALUENUM when the table is written). FLAG stays as judged: the same
    measurement against the same reference range, only written in another unit. Text results
    (VALUENUM NaN) keep no number. Items without an entry are unchanged.
    """
    out = dict(b)
    ids, x = b["ITEMID"], b["VALUENUM"]
    vocab = list(b["VALUEUOM"].vocab)
    codes = b["VALUEUOM"].codes
    for itemid, (unit, factor, decimals) in units.items():
        hit = ids == itemid
        if unit not in vocab:
            vocab.append(unit)
        x = np.where(hit, round_decimals(x * factor, decimals), x)
        codes = np.where(hit, vocab.index(unit), codes)
    out["VALUENUM"] = x
    out["VALUEUOM"] = Cat(codes.astype(np.int32), tuple(vocab))
    return out


def _panel_p(s: np.ndarray) -> np.ndarray:
    p = np.empty((s.size, len(cat.LAB_PANELS)))
    p[:, 0], p[:, 1], p[:, 3], p[:, 4] = 0.9, 0.75, 0.3, 0.15
    p[:, 2] = sigmoid(-1.5 + 1.2 * s)  # blood gases (lactate) are ordered for the sick
    return p


def labs(rng: np.random.Generator, adm: Admissions, w: Window, scale: float,
         admission_draw: bool) -> Block:
    """LABEVENTS rows in the lab window; ``admission_draw`` adds the arrival panel."""
    rate = scale * LAB_DRAWS_PER_HOUR * np.exp(0.35 * adm.severity) * np.where(adm.neonate, 0.5, 1.0)
    owner, t = poisson_times(rng, w.lab_start, w.lab_end, rate)
    forced = np.zeros(owner.size, bool)
    if admission_draw:
        # Everyone gets a chemistry + blood count on arrival: in the ED (before ADMITTIME,
        # already under the HADM_ID) for emergencies, in the first hour otherwise.
        n = len(adm)
        in_ed = np.isin(adm.adm_type, (EMERGENCY, URGENT))
        t0 = np.where(in_ed, adm.admit - floor_to(rng.integers(30 * MINUTE, 4 * HOUR, n), MINUTE),
                      adm.admit + floor_to(rng.integers(0, HOUR, n), MINUTE))
        owner, t = np.concatenate([np.arange(n), owner]), np.concatenate([t0, t])
        forced = np.concatenate([np.ones(n, bool), forced])
    s = severity_at(adm, owner, t, w)
    p = _panel_p(s)
    p[forced, 0] = p[forced, 1] = 1.0
    return lab_rows(rng, owner, t, s, p)


def outpatient_labs(rng: np.random.Generator, adm: Admissions, scale: float) -> Block:
    """Clinic labs 1-29 days before some admissions: no HADM_ID, near-normal values."""
    n = np.where(rng.random(len(adm)) < 0.4, 1 + rng.poisson(scale * 1.0, len(adm)), 0)
    owner = np.repeat(np.arange(len(adm)), n)
    t = adm.admit[owner] - floor_to(rng.integers(DAY, 29 * DAY, owner.size), MINUTE)
    s = rng.normal(-0.5, 0.5, owner.size)
    p = np.zeros((owner.size, len(cat.LAB_PANELS)))
    p[:, 0], p[:, 1], p[:, 4] = 1.0, 0.6, 0.2
    rows = lab_rows(rng, owner, t, s, p)
    rows["HADM_NULL"] = np.ones(rows["owner"].size, bool)
    return rows


# ---------------------------------------------------------------- charts
_GCS_TEXT = tuple(txt for _, _, _, choices in cat.GCS_MV for txt in choices)
_GCS_OFFSET = np.cumsum([0] + [len(c) for *_, c in cat.GCS_MV])[:-1]
_CHART_UOM_VOCAB = tuple(sorted({u for c in cat.chart_concepts() for u in (c.cv_uom, c.mv_uom) if u}))
_CHART_UOM = {itemid: (_CHART_UOM_VOCAB.index(uom) if uom else -1)
              for c in cat.chart_concepts() for itemid, uom in ((c.cv_itemid, c.cv_uom), (c.mv_itemid, c.mv_uom))}
_UOM_IDS = np.array(sorted(_CHART_UOM))
_UOM_CODES = np.array([_CHART_UOM[i] for i in _UOM_IDS])


def _vital(c: cat.ChartConcept, s: np.ndarray, neo: np.ndarray, z: np.ndarray) -> np.ndarray:
    x = c.centre + c.neonate_offset * neo + c.shift * s + c.sd * z
    return round_decimals(np.clip(x, c.lo, c.hi), c.decimals)


def _chart_uom(itemid: np.ndarray) -> Cat:
    pos = np.clip(np.searchsorted(_UOM_IDS, itemid), 0, _UOM_IDS.size - 1)
    return Cat(np.where(_UOM_IDS[pos] == itemid, _UOM_CODES[pos], -1), _CHART_UOM_VOCAB)


def _vital_rounds(rng, adm: Admissions, w: Window, scale: float) -> Block:
    owner, t = poisson_times(rng, w.icu_start, w.icu_end,
                             scale * VITAL_ROUNDS_PER_HOUR * np.exp(0.15 * adm.severity))
    s = severity_at(adm, owner, t, w)
    cv, art, neo = adm.carevue[owner], adm.art_line[owner], adm.neonate[owner]
    z = rng.standard_normal((owner.size, 5))
    hr = _vital(cat.HR, s, neo, z[:, 0])
    sbp = _vital(cat.ABP_SYS, s, neo, z[:, 1])
    dbp = np.minimum(_vital(cat.ABP_DIA, s, neo, z[:, 2]), sbp - 10)
    mbp = np.round((sbp + 2 * dbp) / 3)
    vals = np.column_stack([hr, sbp, dbp, mbp, _vital(cat.RESP, s, neo, z[:, 3]),
                            _vital(cat.SPO2, s, neo, z[:, 4])])

    def pick(c_art: cat.ChartConcept, c_nbp: cat.ChartConcept) -> np.ndarray:
        return np.where(cv, np.where(art, c_art.cv_itemid, c_nbp.cv_itemid),
                        np.where(art, c_art.mv_itemid, c_nbp.mv_itemid))

    ids = np.column_stack([
        np.where(cv, cat.HR.cv_itemid, cat.HR.mv_itemid), pick(cat.ABP_SYS, cat.NBP_SYS),
        pick(cat.ABP_DIA, cat.NBP_DIA), pick(cat.ABP_MEAN, cat.NBP_MEAN),
        np.where(cv, cat.RESP.cv_itemid, cat.RESP.mv_itemid),
        np.where(cv, cat.SPO2.cv_itemid, cat.SPO2.mv_itemid)])
    r, c = np.nonzero(rng.random(vals.shape) >= MISSING_ITEM_P)
    return {"owner": owner[r], "CHARTTIME": t[r], "ITEMID": ids[r, c], "VALUENUM": vals[r, c],
            "TEXT": np.full(r.size, -1)}


def _slow_rounds(rng, adm: Admissions, w: Window, scale: float) -> list[Block]:
    out = []
    owner, t = poisson_times(rng, w.icu_start, w.icu_end, np.full(len(adm), scale * SLOW_ROUNDS_PER_HOUR))
    s = severity_at(adm, owner, t, w)
    temp = _vital(cat.TEMP_F, s, adm.neonate[owner], rng.standard_normal(owner.size))
    out.append({"owner": owner, "CHARTTIME": t, "VALUENUM": temp, "TEXT": np.full(owner.size, -1),
                "ITEMID": np.where(adm.carevue[owner], cat.TEMP_F.cv_itemid, cat.TEMP_F.mv_itemid)})

    owner, t = poisson_times(rng, w.icu_start, w.icu_end, np.full(len(adm), scale * SLOW_ROUNDS_PER_HOUR))
    s = severity_at(adm, owner, t, w)
    total = np.clip(np.round(14.6 - 2.2 * np.maximum(s - 0.3, 0) + 0.8 * rng.standard_normal(owner.size)),
                    3, 15)
    cv = adm.carevue[owner]
    out.append({"owner": owner[cv], "CHARTTIME": t[cv], "ITEMID": np.full(cv.sum(), cat.GCS_TOTAL_CV[0]),
                "VALUENUM": total[cv], "TEXT": np.full(cv.sum(), -1)})
    mv = ~cv
    eye = np.clip(np.round(total[mv] * 4 / 15), 1, 4)
    verbal = np.clip(np.round(total[mv] * 5 / 15), 1, 5)
    motor = np.clip(total[mv] - eye - verbal, 1, 6)
    for k, score in enumerate((eye, verbal, motor)):
        out.append({"owner": owner[mv], "CHARTTIME": t[mv], "ITEMID": np.full(mv.sum(), cat.GCS_MV[k][0]),
                    "VALUENUM": score, "TEXT": _GCS_OFFSET[k] + score.astype(np.int64) - 1})
    return out


def charts(rng: np.random.Generator, adm: Admissions, w: Window, scale: float, with_weight: bool) -> Block:
    """CHARTEVENTS rows in the ICU window (vitals, temperature, GCS, admission weight)."""
    parts = [_vital_rounds(rng, adm, w, scale), *_slow_rounds(rng, adm, w, scale)]
    if with_weight:
        t = floor_to(w.icu_start + rng.integers(MINUTE, 2 * HOUR, len(adm)), MINUTE)
        ok = t < w.icu_end
        parts.append({"owner": np.flatnonzero(ok), "CHARTTIME": t[ok], "VALUENUM": adm.weight_kg[ok],
                      "ITEMID": np.where(adm.carevue, cat.WEIGHT.cv_itemid, cat.WEIGHT.mv_itemid)[ok],
                      "TEXT": np.full(ok.sum(), -1)})
    b = concat(parts)
    n = b["owner"].size
    mv = ~adm.carevue[b["owner"]]
    # MetaVision flags mistaken entries with ERROR=1 and keeps them; CareVue has no flag.
    error = mv & (b["TEXT"] < 0) & (rng.random(n) < CHART_ERROR_P)
    b["VALUENUM"] = np.where(error, b["VALUENUM"] * 10, b["VALUENUM"])
    b["ERROR"] = np.where(mv, error.astype(np.int64), NULL)
    b["WARNING"] = np.where(mv, (rng.random(n) < 0.01).astype(np.int64), NULL)
    b["STOPPED"] = Cat(np.where(mv, -1, 0), ("NotStopd",))
    b["VALUE"] = Cat(b.pop("TEXT"), _GCS_TEXT)
    b["VALUEUOM"] = _chart_uom(b["ITEMID"])
    b.update(_common(rng, b["CHARTTIME"]))
    return b


# ---------------------------------------------------------------- outputs and inputs
def _fluid_events(rng, adm: Admissions, w: Window, scale: float, item: cat.FluidItem):
    on = adm.carevue == (item.dbsource == "carevue")
    rate = scale * item.rate_per_hour * np.exp(item.rate_gain * adm.severity) * on
    owner, t = poisson_times(rng, w.icu_start, w.icu_end, rate)
    s = severity_at(adm, owner, t, w)
    amount = np.exp(np.log(item.median) + item.amount_shift * s + item.spread * rng.standard_normal(owner.size))
    return owner, t, s, amount


def outputs(rng: np.random.Generator, adm: Admissions, w: Window, scale: float) -> Block:
    """OUTPUTEVENTS rows (urine falls with severity)."""
    parts = []
    for item in cat.OUTPUT_ITEMS:
        owner, t, _, amount = _fluid_events(rng, adm, w, scale, item)
        parts.append({"owner": owner, "CHARTTIME": t, "ITEMID": np.full(owner.size, item.itemid),
                      "VALUE": np.round(amount), "VALUEUOM": Cat.const(item.uom, owner.size)})
    b = concat(parts)
    b.update(_common(rng, b["CHARTTIME"]))
    return b


def _order_ids(rng, n: int) -> np.ndarray:
    return rng.integers(1_000_000, 10_000_000, n)


def inputs_cv(rng: np.random.Generator, adm: Admissions, w: Window, scale: float) -> Block:
    """INPUTEVENTS_CV rows (CareVue: one CHARTTIME per amount; pressors grow with severity)."""
    parts = []
    for item in (i for i in cat.INPUT_ITEMS if i.dbsource == "carevue"):
        owner, t, s, amount = _fluid_events(rng, adm, w, scale, item)
        n = owner.size
        rate = (round_decimals(item.median_rate * np.exp(0.3 * s + 0.4 * rng.standard_normal(n)), 3)
                if item.rate_uom else np.full(n, np.nan))
        order = _order_ids(rng, n)
        parts.append({"owner": owner, "CHARTTIME": t, "ITEMID": np.full(n, item.itemid),
                      "AMOUNT": round_decimals(amount, 2 if item.median < 10 else 0),
                      "AMOUNTUOM": Cat.const(item.uom, n), "RATE": rate,
                      "RATEUOM": Cat.const(item.rate_uom, n), "ORDERID": order, "LINKORDERID": order,
                      "ORIGINALAMOUNTUOM": Cat.const(item.uom, n), "ORIGINALROUTE": Cat.const(item.route, n),
                      "ORIGINALRATE": rate, "ORIGINALRATEUOM": Cat.const(item.rate_uom, n)})
    b = concat(parts)
    b.update(_common(rng, b["CHARTTIME"]))
    return b


_MV_STATUS = ("FinishedRunning", "Changed", "Rewritten", "Stopped")


def inputs_mv(rng: np.random.Generator, adm: Admissions, w: Window, scale: float) -> Block:
    """INPUTEVENTS_MV rows (MetaVision: STARTTIME/ENDTIME intervals with order metadata)."""
    parts = []
    for item in (i for i in cat.INPUT_ITEMS if i.dbsource == "metavision"):
        owner, t, s, amount = _fluid_events(rng, adm, w, scale, item)
        n = owner.size
        push = item.order_description in ("Bolus", "Drug Push")
        minutes = (np.ones(n) if push else
                   np.maximum(np.round(item.duration_min * rng.lognormal(0.0, 0.5, n)), 1.0))
        amount = round_decimals(amount, 2 if item.median < 10 else 0)
        if item.rate_uom == "mL/hour":
            rate = round_decimals(amount / (minutes / 60.0), 2)
        elif item.rate_uom:
            rate = round_decimals(item.median_rate * np.exp(0.3 * s + 0.4 * rng.standard_normal(n)), 3)
        else:
            rate = np.full(n, np.nan)
        order = _order_ids(rng, n)
        status = rng.choice(len(_MV_STATUS), n, p=(0.8, 0.1, 0.06, 0.04))
        parts.append({
            "owner": owner, "STARTTIME": t, "ENDTIME": t + (minutes * MINUTE).astype(np.int64),
            "ITEMID": np.full(n, item.itemid), "AMOUNT": amount, "AMOUNTUOM": Cat.const(item.uom, n),
            "RATE": rate, "RATEUOM": Cat.const(item.rate_uom, n), "ORDERID": order, "LINKORDERID": order,
            "ORDERCATEGORYNAME": Cat.const(item.order_category, n),
            "ORDERCOMPONENTTYPEDESCRIPTION": Cat.const("Main order parameter", n),
            "ORDERCATEGORYDESCRIPTION": Cat.const(item.order_description, n),
            "PATIENTWEIGHT": adm.weight_kg[owner],
            "ISOPENBAG": np.zeros(n, np.int64), "CONTINUEINNEXTDEPT": np.zeros(n, np.int64),
            "CANCELREASON": np.zeros(n, np.int64), "STATUSDESCRIPTION": Cat(status, _MV_STATUS),
            "ORIGINALAMOUNT": amount, "ORIGINALRATE": np.where(np.isnan(rate), amount, rate),
        })
    b = concat(parts)
    b.update(_common(rng, b["STARTTIME"]))
    return b


def window_events(rng: np.random.Generator, adm: Admissions, w: Window, scale: float,
                  first_pass: bool, chart_rate: float) -> dict[str, Block]:
    """All time-stamped ICU/lab events of one window, keyed by table name; chart_rate scales charting only."""
    return {
        "LABEVENTS": labs(rng, adm, w, scale, admission_draw=first_pass),
        "CHARTEVENTS": charts(rng, adm, w, scale * chart_rate, with_weight=first_pass),
        "OUTPUTEVENTS": outputs(rng, adm, w, scale),
        "INPUTEVENTS_CV": inputs_cv(rng, adm, w, scale),
        "INPUTEVENTS_MV": inputs_mv(rng, adm, w, scale),
    }
