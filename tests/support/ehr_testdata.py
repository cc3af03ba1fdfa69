"""Small real pipeline output folders for the model tests (not a test module itself).

Built with the pipeline's own pieces (bag_events, make_sequence_example, the TFRecord writer,
the vocabulary functions), so the model reads exactly the format the Beam job writes. The
label carries an easy signal: admissions with the code "diagnosis:RISK" or a high lactate
(lab:50813) mostly die; ``P_DEATH`` of the truth CSV is that probability.
"""
from __future__ import annotations

import csv
import json
import os
import pathlib

import numpy as np

from ehr_pipeline.contract import PipelineConfig, layout, spec
from ehr_pipeline.contract.tfrecord import write_records
from ehr_pipeline.encode import bagging, seqex
from ehr_pipeline.job import vocab

CODES = ["lab:50813", "lab:50912", "chart:211", "chart:220045", "input:30018", "prescription:ASPIRIN",
         "diagnosis:4019", "procedure:9604", "output:40055", "diagnosis:RISK"]
LAB_MEANS = {"lab:50813": 1.5, "lab:50912": 1.0, "chart:211": 85.0, "chart:220045": 85.0, "output:40055": 200.0}
DAY = 86400
T0 = 1_700_000_000
# ADMISSIONS spellings, for the subgroup reports (no model reads them).
ETHNICITIES = ("WHITE", "BLACK/AFRICAN AMERICAN", "HISPANIC OR LATINO", "ASIAN - CHINESE", "UNKNOWN/NOT SPECIFIED")
INSURANCES = ("Medicare", "Private", "Medicaid")


# course: a pre-admission creatinine course (COURSE_DAYS before the trigger) whose trend moves the truth's
# logit by COURSE_TREND per ln(mg/dL) per week; "reversed" writes the same values in reverse time order.
COURSE_DAYS = (20, 13, 6)
COURSE_TREND = 10.0
COURSES = (None, "forward", "reversed")


def course_logit(hadm_id: int, course: str) -> tuple[float, np.ndarray]:
    """(the course's term of the truth's logit, its creatinine values oldest first) of one admission."""
    own = np.random.default_rng([hadm_id, 31])  # the admission's own stream: the shared one stays as it was
    slope = own.normal(0.0, 0.3)  # ln(mg/dL) per week
    weeks = (np.mean(COURSE_DAYS) - np.asarray(COURSE_DAYS, float)) / 7.0  # evenly spaced: reversing negates the slope
    values = np.exp(np.log(1.1) + own.normal(0.0, 0.2) + slope * weeks)
    if course == "reversed":
        values, slope = values[::-1], -slope
    return COURSE_TREND * slope, values


def _admission(rng: np.random.Generator, hadm_id: int, rare_codes: bool,
               scale: dict[str, float] | None = None, constant: dict[str, float] | None = None,
               course: str | None = None) -> tuple:
    """(context, bags, P_DEATH, codes, values, times) of one admission; scale multiplies codes' recorded values,
    constant records each of its codes at one value, course adds a creatinine course (COURSES)."""
    trigger = T0 + hadm_id * DAY
    n = int(rng.integers(3, 14))
    pool = CODES[:-1] + (["lab:99999"] if rare_codes else [])  # an out-of-vocabulary lab
    codes = list(rng.choice(pool, size=n))
    risky = rng.random() < 0.35
    if risky:
        codes.append("diagnosis:RISK")
    if rng.random() < 0.05:
        codes = []  # an admission with no events before the trigger: zero bags
    times = trigger - rng.integers(60, 3 * DAY, size=len(codes))
    values = np.array([rng.normal(LAB_MEANS[c], 0.2 * LAB_MEANS[c]) if c in LAB_MEANS else np.nan for c in codes])
    lactate = values[[i for i, c in enumerate(codes) if c == "lab:50813"]]
    high_lactate = bool(lactate.size and np.nanmax(lactate) > 1.9)
    p_death = 0.9 if (risky or high_lactate) else 0.05
    if course is not None:
        term, course_values = course_logit(hadm_id, course)
        p_death = 1.0 / (1.0 + np.exp(-(np.log(p_death / (1.0 - p_death)) + term)))
        codes = codes + ["lab:50912"] * len(COURSE_DAYS)
        times = np.concatenate([times, trigger - np.asarray(COURSE_DAYS, np.int64) * DAY])
        values = np.concatenate([values, course_values])
    for code, factor in (scale or {}).items():  # recorded differently, after the truth was drawn
        values = np.where(np.asarray(codes, dtype=object) == code, values * factor, values)
    for code, value in (constant or {}).items():  # a setting charted as a value (PEEP 5): one value everywhere
        values = np.where(np.asarray(codes, dtype=object) == code, value, values)
    bags = bagging.bag_events(np.asarray(times, np.int64), np.asarray(codes, dtype=object), values, trigger,
                              PipelineConfig().bagging)
    context = {spec.SUBJECT_ID: 10_000 + hadm_id, spec.HADM_ID: hadm_id, spec.LABEL: int(rng.random() < p_death),
               spec.TRIGGER_TIME: trigger, spec.ADMIT_OFFSET: 86400, spec.AGE_YEARS: float(rng.uniform(20, 90)),
               spec.GENDER: str(rng.choice(["M", "F"])),
               spec.ADMISSION_TYPE: str(rng.choice(["EMERGENCY", "ELECTIVE"]))}
    # Drawn from the admission's own stream: the shared one (and so every other value) stays as it was.
    who = np.random.default_rng([hadm_id, 24])
    context[spec.ETHNICITY] = str(who.choice(ETHNICITIES))
    context[spec.INSURANCE] = str(who.choice(INSURANCES))
    return context, bags, p_death, codes, values, times


def write_data_dir(out: str | os.PathLike[str], sizes=(("train", 160), ("validation", 48), ("test", 48)),
                   seed: int = 0, train_shards: int = 2, scale: dict[str, float] | None = None,
                   units: dict[str, str] | None = None, constant: dict[str, float] | None = None,
                   course: str | None = None) -> pathlib.Path:
    """Writes a complete pipeline output folder (shards, vocabulary, statistics, manifest, truth CSV).

    scale: code -> factor on its recorded values (another site's unit or assay); units: code ->
    the unit its values are in, written to units.json as the job writes it (none without it);
    constant: code -> the one value it always records; course: see COURSES (the same admissions either way).
    """
    if course not in COURSES:
        raise ValueError(f"course must be one of {COURSES}, got {course!r}")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    config = PipelineConfig.model_validate({"num_shards": {"train": train_shards, "validation": 1, "test": 1},
                                            "vocab": {"min_count": 2}})
    stats: dict = {}
    truth_rows = []
    splits = {}
    unit_rows: dict[str, int] = {}
    hadm = 100
    for split, n in sizes:
        records, positives = [], 0
        for _ in range(n):
            hadm += 1
            context, bags, p_death, codes, values, _ = _admission(rng, hadm, rare_codes=split != "train", scale=scale,
                                                                  constant=constant, course=course)
            for code in units or {}:
                unit_rows[code] = unit_rows.get(code, 0) + int(np.count_nonzero(np.asarray(codes, dtype=object) == code))
            records.append(seqex.make_sequence_example(context, bags).SerializeToString())
            positives += context[spec.LABEL]
            truth_rows.append((hadm, p_death))
            if split == "train":
                for code, st in vocab.example_code_stats(np.asarray(codes, dtype=object), values).items():
                    stats[code] = vocab.add_stats(stats.get(code, vocab.ZERO), st)
        shards = config.num_shards.model_dump()[split]
        files = {}
        for shard in range(shards):
            name = spec.shard_file_name(split, shard, shards)
            with open(out / name, "wb") as f:
                write_records(f, records[shard::shards])
            files[name] = {"sha256": layout.sha256_of(str(out / name))}
        splits[split] = {"examples": n, "positives": positives, "label_rate": positives / n, "files": files}
    vocabulary = vocab.build_vocabulary(stats, config.vocab.min_count, config.vocab.max_size_per_source)
    layout.write_json(str(out / layout.VOCABULARY), {"schema_version": spec.SCHEMA_VERSION, "sources": vocabulary,
                                                       "min_count": config.vocab.min_count, "built_on": "train"})
    layout.write_json(str(out / layout.NUMERIC_STATS), {
        "schema_version": spec.SCHEMA_VERSION, "clip_z": config.numeric.clip_z,
        "codes": vocab.normalisation_stats(stats), "built_on": "train"})
    if units:
        layout.write_json(str(out / layout.UNITS), {
            "schema_version": spec.SCHEMA_VERSION, "codes": {c: {u: unit_rows.get(c, 0)} for c, u in units.items()},
            "canonical": dict(units), "canonical_from": "this release"})
    # Last, with the checksums of what it names, as the job writes it (ehr_pipeline.job.manifest).
    side = {key: {"file": name, "sha256": layout.sha256_of(str(out / name))}
            for key, name in (("vocabulary", layout.VOCABULARY), ("numeric_stats", layout.NUMERIC_STATS),
                              ("units", layout.UNITS)) if (out / name).exists()}
    layout.write_json(str(out / layout.MANIFEST), {"manifest_version": 1, "schema_version": spec.SCHEMA_VERSION,
                                                     "config": config.to_dict(), "splits": splits, **side})
    with open(out / "SYNTH_TRUTH.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["HADM_ID", "P_DEATH"])
        writer.writerows(truth_rows)
    return out


def admission_requests(n: int, seed: int, scale: dict[str, float] | None = None,
                       units: dict[str, str | None] | None = None) -> list[dict]:
    """/v1/predict bodies of `n` admissions drawn like write_data_dir's (a fresh sample of its population).

    scale: code -> factor on its values; units: code -> the unit its values are sent with (None: sent
    as bare numbers). The prediction time is the default, admission + 24 h, which is the data's trigger.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        context, _, _, codes, values, times = _admission(rng, 10_000 + i, rare_codes=False, scale=scale)
        admit = context[spec.TRIGGER_TIME] - context[spec.ADMIT_OFFSET]
        events = []
        for t, code, value in zip(times, codes, values):
            source, item = code.split(":", 1)
            event = {"time": _iso(int(t)), "source": source, "code": item}
            if not np.isnan(value):
                event["value"] = float(value)
                if (units or {}).get(code):
                    event["unit"] = units[code]
            events.append(event)
        out.append({"patient": {"gender": context[spec.GENDER], "age_years": context[spec.AGE_YEARS]},
                    "admission": {"admit_time": _iso(admit), "admission_type": context[spec.ADMISSION_TYPE]},
                    "events": events})
    return out


def _iso(seconds: int) -> str:
    import datetime as dt

    return (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)).isoformat()


def tiny_config_dict(method: str = "rank1", steps: int = 60, **train) -> dict:
    """A tiny experiment config (hidden 8-16, K = 2) that trains in seconds on 2 cores."""
    ensemble = 2 if method in ("rank1", "batchensemble") else 1
    return {
        "name": f"tiny_{method}",
        "model": {"method": method, "ensemble_size": ensemble, "embedding_dim": 16, "rnn_dim": 16,
                  "hidden_layer_dim": 16, "prior_stddev": 1.0 if method == "fully_bayesian" else 0.1},
        "train": {"batch_size": 16, "learning_rate": 0.01, "clip_norm": 5.0, "kl_annealing_steps": 20,
                  "max_steps": steps, "eval_every_steps": 0, "checkpoint_every_steps": 20, "log_every_steps": 10,
                  "shuffle_buffer": 256, **train},
        "eval": {"num_samples": 3, "batch_size": 32, "n_bootstrap": 50},
    }


def read_json(path) -> dict:
    """JSON file -> dict."""
    with open(path) as f:
        return json.load(f)

