"""One chunk of patients -> Arrow tables (all ids final, ROW_ID left to the writer).

Order of draws within a chunk (fixed, so a seed gives the same data):
patients -> admissions -> events before the trigger -> P(death) from those events ->
death draw -> drop admissions after a death -> discharge/death times -> events after
the trigger -> outpatient labs -> prescriptions -> diagnoses -> procedures -> labels.
The site's recording of labs and charts (assay bias, local codes) draws nothing. The temporal
truth family draws its clinic course (its outpatient labs) before P(death), from a stream of its
own, and the outpatient-labs draw is skipped: everything up to the death draw is as in the
linear family.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline import schemas
from ehr_pipeline.synth import blocks as bl
from ehr_pipeline.synth import catalog as cat
from ehr_pipeline.synth import coding, cohort, events, temporal
from ehr_pipeline.synth.blocks import NULL, Block, Cat
from ehr_pipeline.synth.cohort import DAY, HOUR, MINUTE, Admissions, Outcome, Patients
from ehr_pipeline.synth.config import SynthConfig
from ehr_pipeline.synth.site import SITES
from ehr_pipeline.synth.temporal import TemporalModel
from ehr_pipeline.synth.truth import MortalityModel, PreTriggerFeatures

EVENT_TABLES = ("LABEVENTS", "CHARTEVENTS", "OUTPUTEVENTS", "INPUTEVENTS_CV", "INPUTEVENTS_MV")
RAMP_HOURS = 12  # dying patients deteriorate over their last 12 h (after the trigger only)


@dataclasses.dataclass(frozen=True)
class IdBase:
    """First ids of a chunk; the chunk uses consecutive ids from here."""

    subject: int
    hadm: int
    icustay: int


@dataclasses.dataclass
class Chunk:
    """Generated tables of one chunk (schema columns minus ROW_ID) and its truth rows."""

    tables: dict[str, pa.Table]
    truth: pa.Table  # HADM_ID, SUBJECT_ID, P_DEATH, DIED, SEVERITY
    n_patients: int
    n_admissions: int
    n_deaths: int
    n_long: int  # admissions that reach the trigger
    n_long_deaths: int


def chunk_rng(seed: int, chunk_index: int, stream: tuple[int, ...], child: int | None = None
              ) -> np.random.Generator:
    """The generator of one chunk: independent streams per (seed, chunk, site stream).

    ``child`` names an independent sub-stream of the chunk's (a spawn key): draws that only
    one truth family makes come from there and leave the chunk's main stream as it was.
    """
    entropy = [seed, chunk_index, *stream]
    seq = np.random.SeedSequence(entropy) if child is None else np.random.SeedSequence(entropy, spawn_key=(child,))
    return np.random.default_rng(seq)


COURSE_STREAM = 0  # chunk_rng child of the temporal family's clinic course


def release_model(cfg: SynthConfig) -> MortalityModel | TemporalModel:
    """The truth of a release: its family's model for its events_scale, with its site's truth."""
    model = (temporal.temporal_model(cfg.events_scale) if cfg.truth == "temporal"
             else MortalityModel(lab_volume_scale=cfg.events_scale))
    return SITES[cfg.site].truth_model(model)


def _group_reduce(owner: np.ndarray, values: np.ndarray, n: int, how: str) -> np.ndarray:
    """Per-owner mean / max / min of values; NaN where an owner has none."""
    if how == "mean":
        cnt = np.bincount(owner, minlength=n)
        tot = np.bincount(owner, weights=values, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
    fill = -np.inf if how == "max" else np.inf
    out = np.full(n, fill)
    (np.maximum if how == "max" else np.minimum).at(out, owner, values)
    return np.where(np.isinf(out), np.nan, out)


def pre_trigger_features(adm: Admissions, labs: Block, charts: Block) -> PreTriggerFeatures:
    """The mortality model's inputs from events before the trigger (NaN = not measured)."""
    n = len(adm)
    lo, li, lv = labs["owner"], labs["ITEMID"], labs["VALUENUM"]
    num = ~np.isnan(lv)
    lac = num & (li == cat.LACTATE_ITEMID)
    cre = num & (li == cat.CREATININE_ITEMID)
    co, ci, cv = charts["owner"], charts["ITEMID"], charts["VALUENUM"]
    valid = ~np.isnan(cv) & (charts["ERROR"] != 1)
    hr = valid & np.isin(ci, cat.HR_ITEMIDS)
    sbp = valid & np.isin(ci, cat.SBP_ITEMIDS)
    return PreTriggerFeatures(
        lactate_mean=_group_reduce(lo[lac], lv[lac], n, "mean"),
        creatinine_max=_group_reduce(lo[cre], lv[cre], n, "max"),
        hr_mean=_group_reduce(co[hr], cv[hr], n, "mean"),
        sbp_min=_group_reduce(co[sbp], cv[sbp], n, "min"),
        n_labs=np.bincount(lo, minlength=n).astype(np.float64),
        age_years=adm.age,
        prior_admissions=adm.k.astype(np.float64),
        prior_chronic=adm.prior_chronic.astype(np.float64),
    )


def generate_chunk(cfg: SynthConfig, chunk_index: int, n_patients: int, ids: IdBase,
                   model: MortalityModel | TemporalModel | None = None) -> Chunk:
    """Generates n_patients patients with all their rows; deterministic in (cfg, chunk_index).

    Events are generated with their true values and site A's codes; P(death) is computed
    from those, and only then does the site record them (assay bias, local codes).
    """
    model = model or release_model(cfg)
    site = SITES[cfg.site]
    rng = chunk_rng(cfg.seed, chunk_index, site.stream)
    trig = cfg.trigger_offset_seconds
    pats, first_admit, _ = cohort.draw_patients(rng, n_patients, ids.subject, site.case_mix)
    adm = cohort.draw_admissions(rng, pats, first_admit, trig, site.case_mix)

    # --- before the trigger: these events (and the temporal family's clinic course) alone decide P(death)
    pre_w = events.Window(
        lab_start=adm.admit, lab_end=np.where(adm.short, adm.disch_alive, adm.trigger),
        icu_start=adm.intime, icu_end=np.where(adm.short, adm.icu_out_short, adm.trigger))
    pre = events.window_events(rng, adm, pre_w, cfg.events_scale, first_pass=True, chart_rate=site.chart_rate)
    course = (temporal.clinic_course(chunk_rng(cfg.seed, chunk_index, site.stream, COURSE_STREAM), adm,
                                     model.course) if isinstance(model, TemporalModel) else None)
    p_death = death_probability(cfg, model, adm, pre, course)
    died = rng.random(len(adm)) < p_death

    # A patient who dies in hospital has no later admissions.
    keep = cohort.first_deaths_only(adm, died)
    remap = np.cumsum(keep) - 1
    adm, p_death, died = adm.take(keep), p_death[keep], died[keep]
    pre = {t: _reown(b, keep, remap) for t, b in pre.items()}
    course = None if course is None else _reown(course, keep, remap)
    out = cohort.settle(rng, adm, died)

    # --- after the trigger (stays that reach it); the dying deteriorate towards death
    dying = died & ~adm.short
    post_w = events.Window(
        lab_start=adm.trigger, lab_end=np.where(adm.short, adm.trigger, out.disch),
        icu_start=adm.trigger, icu_end=np.where(adm.short, adm.trigger, out.icu_out),
        ramp_start=np.maximum(adm.trigger, out.death - RAMP_HOURS * HOUR),
        ramp_end=np.where(dying, out.death, 0))
    post = events.window_events(rng, adm, post_w, cfg.events_scale, first_pass=False, chart_rate=site.chart_rate)

    for b in (pre["LABEVENTS"], post["LABEVENTS"]):
        b["HADM_NULL"] = np.zeros(bl.size(b), bool)
    ev = {t: bl.concat([pre[t], post[t]]) for t in EVENT_TABLES}
    outpatient = events.outpatient_labs(rng, adm, cfg.events_scale) if course is None else course
    ev["LABEVENTS"] = site.observe_labs(bl.concat([ev["LABEVENTS"], outpatient]))
    ev["CHARTEVENTS"] = site.observe_charts(ev["CHARTEVENTS"])
    rx = coding.prescriptions(rng, adm, out, cfg.events_scale, site.drugs())
    dx = coding.diagnoses(rng, adm, out)
    px = coding.procedures(rng, adm, out)

    hadm = ids.hadm + np.arange(len(adm), dtype=np.int64)
    icustay = ids.icustay + np.arange(len(adm), dtype=np.int64)
    subject = pats.subject_id[adm.pat]
    tables = {
        "PATIENTS": _patients(rng, pats, adm, out),
        "ADMISSIONS": _admissions(rng, pats, adm, out, hadm),
        "ICUSTAYS": _icustays(rng, adm, out, subject, hadm, icustay),
    }
    keys = {"SUBJECT_ID": subject, "HADM_ID": hadm, "ICUSTAY_ID": icustay}
    time_col = {"INPUTEVENTS_MV": "STARTTIME"}
    for t in EVENT_TABLES:
        tables[t] = _event_table(t, ev[t], keys, adm.pat, time_col.get(t, "CHARTTIME"))
    tables["PRESCRIPTIONS"] = _event_table("PRESCRIPTIONS", rx, keys, adm.pat, None)
    tables["DIAGNOSES_ICD"] = _event_table("DIAGNOSES_ICD", dx, keys, adm.pat, None)
    tables["PROCEDURES_ICD"] = _event_table("PROCEDURES_ICD", px, keys, adm.pat, None)

    truth = pa.table({
        "HADM_ID": hadm, "SUBJECT_ID": subject, "P_DEATH": p_death,
        "DIED": died.astype(np.int64), "SEVERITY": np.round(adm.severity, 4),
    })
    return Chunk(tables, truth, n_patients, len(adm), int(died.sum()), int((~adm.short).sum()),
                 int(dying.sum()))


def death_probability(cfg: SynthConfig, model: MortalityModel | TemporalModel, adm: Admissions,
                      pre: dict[str, Block], course: Block | None) -> np.ndarray:
    """P(death) per admission from its pre-trigger events (and, temporal family, its course and history)."""
    planted = (None if cfg.plant_subgroup is None
               else adm.adm_type == cohort.ADMISSION_TYPES.index(cfg.plant_subgroup))
    features = pre_trigger_features(adm, pre["LABEVENTS"], pre["CHARTEVENTS"])
    if course is None:
        return model.probability(features, planted)
    return model.probability(features, temporal.trajectory_features(adm, course), planted)


def _reown(b: Block, keep: np.ndarray, remap: np.ndarray) -> Block:
    rows = bl.take(b, keep[b["owner"]])
    rows["owner"] = remap[rows["owner"]]
    return rows


def _event_table(table: str, b: Block, keys: dict, pat: np.ndarray, time_col: str | None) -> pa.Table:
    """Sorts rows by patient (then time, item) as MIMIC ships them and adds the id columns."""
    owner = b["owner"]
    if time_col is not None:  # coded tables are already in admission order
        order = np.lexsort((b["ITEMID"], b[time_col], pat[owner]))
        b = bl.take(b, order)
        owner = b["owner"]
    cols = {k: v for k, v in b.items() if k not in ("owner", "HADM_NULL", "ICU")}
    names = schemas.TABLES[table].column_names
    cols["SUBJECT_ID"] = keys["SUBJECT_ID"][owner]
    cols["HADM_ID"] = keys["HADM_ID"][owner]
    if "HADM_NULL" in b:
        cols["HADM_ID"] = np.where(b["HADM_NULL"], NULL, cols["HADM_ID"])
    if "ICUSTAY_ID" in names:
        icu = keys["ICUSTAY_ID"][owner]
        cols["ICUSTAY_ID"] = np.where(b["ICU"], icu, NULL) if "ICU" in b else icu
    n = owner.size
    if "VALUENUM" in cols and "VALUE" in cols:
        # VALUE is the text as charted: the number as MIMIC prints it, or the text result.
        num = pc.cast(pa.array(cols["VALUENUM"], mask=np.isnan(cols["VALUENUM"])), pa.string())
        cols["VALUE"] = pc.coalesce(cols["VALUE"].to_arrow(), num)
    return bl.to_table(table, cols, n)


def _choice(rng: np.random.Generator, vocab: tuple, n: int, p=None) -> Cat:
    return Cat(rng.choice(len(vocab), n, p=p), vocab)


def _patients(rng: np.random.Generator, pats: Patients, adm: Admissions, out: Outcome) -> pa.Table:
    n = pats.subject_id.size
    death = np.full(n, -1, np.int64)
    np.maximum.at(death, adm.pat, out.death)
    last_disch = np.zeros(n, np.int64)
    np.maximum.at(last_disch, adm.pat, out.disch)
    # Deaths after discharge reach the record through the social security index only.
    later = (death < 0) & (rng.random(n) < 0.3)
    dod_later = cohort.floor_to(last_disch + rng.integers(10 * DAY, 1500 * DAY, n), DAY)
    in_hosp = death >= 0
    dod = np.where(in_hosp, cohort.floor_to(death, DAY), np.where(later, dod_later, NULL))
    ssn = later | (in_hosp & (rng.random(n) < 0.75))
    return bl.to_table("PATIENTS", {
        "SUBJECT_ID": pats.subject_id, "GENDER": Cat(pats.male.astype(np.int8), ("F", "M")),
        "DOB": pats.dob, "DOD": dod, "DOD_HOSP": np.where(in_hosp, dod, NULL),
        "DOD_SSN": np.where(ssn, dod, NULL), "EXPIRE_FLAG": (dod != NULL).astype(np.int64),
    }, n)


_ADMIT_LOC = ("EMERGENCY ROOM ADMIT", "TRANSFER FROM HOSP/EXTRAM", "CLINIC REFERRAL/PREMATURE",
              "PHYS REFERRAL/NORMAL DELI")


def _admissions(rng: np.random.Generator, pats: Patients, adm: Admissions, out: Outcome,
                hadm: np.ndarray) -> pa.Table:
    n = len(adm)
    n_pat = pats.subject_id.size
    t = adm.adm_type
    loc = np.select([t == cohort.EMERGENCY, t == cohort.URGENT, t == cohort.ELECTIVE],
                    [rng.choice(3, n, p=(0.72, 0.18, 0.10)), np.full(n, 1), np.full(n, 3)],
                    np.where(rng.random(n) < 0.7, 3, 2))
    alive = np.where(adm.neonate, 0, rng.choice(len(cat.DISCHARGE_ALIVE), n, p=cat.DISCHARGE_ALIVE_WEIGHTS))
    old = adm.age >= 65
    ins = np.where(old & (rng.random(n) < 0.85), 0,
                   rng.choice(5, n, p=(0.05, 0.55, 0.25, 0.08, 0.07)))
    # Language, religion and ethnicity belong to the patient, not the stay.
    lang = np.where(rng.random(n_pat) < 0.4, -1, rng.choice(len(cat.LANGUAGES), n_pat, p=(0.8, 0.1, 0.04, 0.03, 0.03)))
    rel = rng.choice(len(cat.RELIGIONS), n_pat)
    eth = rng.choice(len(cat.ETHNICITIES), n_pat, p=cat.ETHNICITY_WEIGHTS)
    marital = np.where(adm.neonate | (rng.random(n) < 0.1), -1, rng.choice(len(cat.MARITAL), n))
    has_ed = adm.ed_reg != -1
    dx_vocab = cat.ADMISSION_DIAGNOSES + ("NEWBORN",)
    dx = np.where(adm.neonate, len(cat.ADMISSION_DIAGNOSES), rng.choice(len(cat.ADMISSION_DIAGNOSES), n))
    return bl.to_table("ADMISSIONS", {
        "SUBJECT_ID": pats.subject_id[adm.pat], "HADM_ID": hadm, "ADMITTIME": adm.admit,
        "DISCHTIME": out.disch, "DEATHTIME": np.where(out.died, out.death, NULL),
        "ADMISSION_TYPE": Cat(t, cohort.ADMISSION_TYPES), "ADMISSION_LOCATION": Cat(loc, _ADMIT_LOC),
        "DISCHARGE_LOCATION": Cat(np.where(out.died, len(cat.DISCHARGE_ALIVE), alive),
                                  cat.DISCHARGE_ALIVE + (cat.DEAD,)),
        "INSURANCE": Cat(ins, cat.INSURANCES), "LANGUAGE": Cat(lang[adm.pat], cat.LANGUAGES),
        "RELIGION": Cat(rel[adm.pat], cat.RELIGIONS), "MARITAL_STATUS": Cat(marital, cat.MARITAL),
        "ETHNICITY": Cat(eth[adm.pat], cat.ETHNICITIES),
        "EDREGTIME": np.where(has_ed, adm.ed_reg, NULL),
        "EDOUTTIME": np.where(has_ed, adm.admit + cohort.floor_to(rng.integers(0, HOUR, n), MINUTE), NULL),
        "DIAGNOSIS": Cat(dx, dx_vocab), "HOSPITAL_EXPIRE_FLAG": out.died.astype(np.int64),
        "HAS_CHARTEVENTS_DATA": np.ones(n, np.int64),
    }, n)


def _icustays(rng: np.random.Generator, adm: Admissions, out: Outcome, subject: np.ndarray,
              hadm: np.ndarray, icustay: np.ndarray) -> pa.Table:
    n = len(adm)
    units = cat.CAREUNITS + ("NICU",)
    first = np.where(adm.neonate, len(cat.CAREUNITS), rng.choice(len(cat.CAREUNITS), n, p=cat.CAREUNIT_WEIGHTS))
    moved = ~adm.neonate & (rng.random(n) < 0.05)
    last = np.where(moved, rng.choice(len(cat.CAREUNITS), n), first)
    wards = np.asarray(cat.WARDS)
    first_ward = np.where(adm.neonate, cat.NICU_WARD, wards[rng.integers(0, wards.size, n)])
    last_ward = np.where(moved, wards[rng.integers(0, wards.size, n)], first_ward)
    return bl.to_table("ICUSTAYS", {
        "SUBJECT_ID": subject, "HADM_ID": hadm, "ICUSTAY_ID": icustay,
        "DBSOURCE": Cat(np.where(adm.carevue, 0, 1), ("carevue", "metavision")),
        "FIRST_CAREUNIT": Cat(first, units), "LAST_CAREUNIT": Cat(last, units),
        "FIRST_WARDID": first_ward, "LAST_WARDID": last_ward, "INTIME": adm.intime, "OUTTIME": out.icu_out,
        "LOS": np.round((out.icu_out - adm.intime) / DAY, 4),
    }, n)
