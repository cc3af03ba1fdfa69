"""The method comparison's releases, data folders, training runs and predictions (a module, not a script).

bench/methods/compare_methods.py runs its grid with them; site_update.py, learning_curve.py and
coverage_bound.py make and read the same releases, and train and predict the same way, so that
their numbers stand beside the comparison's. Every step skips what is already in its folder
(a release with its SYNTH_TRUTH.csv, a data folder with its manifest, a run with its export).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import subprocess
import sys
import time

import numpy as np

from bench.methods.compare_setup import SCALES, VARIANTS, bella_base_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]

log = logging.getLogger("bench.methods.compare_runs")


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Split:
    """One test split of one site: serialized examples, labels, hadm_ids and the true P_DEATH."""

    records: list
    labels: np.ndarray
    hadm_ids: np.ndarray
    truth: np.ndarray


def make_release(site: str, patients: int, seed: int, out: pathlib.Path, truth: str = "linear") -> None:
    if (out / "SYNTH_TRUTH.csv").exists():
        return
    cmd = [sys.executable, "-m", "ehr_pipeline.cli", "synth", "--patients", str(patients), "--seed", str(seed),
           "--out", str(out), "--no-progress", "--truth", truth] + (["--site", site] if site != "A" else [])
    log.info("release %s: %s", site, " ".join(cmd[2:]))
    subprocess.run(cmd, check=True, cwd=ROOT)


def make_data(release: pathlib.Path, data: pathlib.Path, units_from: pathlib.Path | None = None) -> None:
    """The Beam job on a release; with units_from (a data folder), values in that folder's units."""
    if (data / "manifest.json").exists():
        return
    from ehr_pipeline.contract import PipelineConfig, layout
    from ehr_pipeline.job import run_job

    reference = layout.read_json(str(units_from / layout.UNITS))["canonical"] if units_from else None
    log.info("Beam job: %s -> %s%s", release, data, f" (units of {units_from})" if units_from else "")
    run_job(str(release), str(data), PipelineConfig(), ["--runner=FnApiRunner"], reference_units=reference)


def load_split(data: pathlib.Path, release: pathlib.Path, name: str) -> Split:
    from model.evaluation.evaluate import load_truth
    from model.data_folder import load_data_files, read_split

    split_records = read_split(load_data_files(data), name)
    records, labels, hadm_ids = split_records.records, split_records.labels, split_records.hadm_ids
    return Split(records, np.asarray(labels), np.asarray(hadm_ids), load_truth(release / "SYNTH_TRUTH.csv", hadm_ids))


def truth_design(release: pathlib.Path, harmonised: bool = True) -> dict[int, np.ndarray]:
    """hadm_id -> the truth's logit terms recomputed from a release's tables.

    The nine linear terms (MortalityModel.design); a temporal release adds its two trajectory
    terms (TemporalModel.design: the course's creatinine trend and the discharge gap's log).

    harmonised: a site's labs written in other units (its manifest's ``lab_units``) are read back
    in site A's units first, as the harmonised data the models see; False reads them as written.
    """
    from ehr_pipeline.synth.recompute import pre_trigger_features, read_tables, trajectory_features
    from ehr_pipeline.synth.temporal import temporal_model
    from ehr_pipeline.synth.truth import MortalityModel

    manifest = json.loads((release / "SYNTH_MANIFEST.json").read_text())
    settings = manifest.get("settings", manifest)
    tables = read_tables(release)
    lab_units = manifest.get("site", {}).get("lab_units", {}) if harmonised else {}
    if lab_units:
        labs = tables["LABEVENTS"].copy()
        for itemid, unit in lab_units.items():
            hit = labs.ITEMID == int(itemid)
            labs.loc[hit, "VALUENUM"] = labs.loc[hit, "VALUENUM"] / float(unit["factor"])
        tables = {**tables, "LABEVENTS": labs}
    ids, feats = pre_trigger_features(tables, int(settings.get("trigger_offset_seconds", 86400)))
    events_scale = float(settings.get("events_scale", 1.0))
    design = MortalityModel(lab_volume_scale=events_scale).design(feats)
    if manifest.get("truth", {}).get("family") == "temporal":
        traj_ids, traj = trajectory_features(tables)
        # Both come in ADMISSIONS order; the check keeps a reordering from pairing the wrong rows.
        if not np.array_equal(np.asarray(traj_ids), np.asarray(ids)):
            raise RuntimeError(f"{release}: the trajectory terms' admissions differ from the linear terms'")
        design = np.concatenate([design, temporal_model(events_scale).design(traj)], axis=1)
    return dict(zip(ids.tolist(), design))


# --------------------------------------------------------------------------- training


def run_config(method: str, seed: int, args: argparse.Namespace):
    from model.ehr.config import load_config

    name, model_overrides = VARIANTS.get(method, (method, {}))
    config = load_config(ROOT / "configs" / f"ehr_{name}.yaml")
    scale = SCALES[args.scale]
    steps = args.steps or scale["steps"]
    train = {**scale["train"], "seed": seed}
    if steps:
        train["max_steps"] = steps
    samples = 1 if config.model.method in ("deterministic", "batchensemble", "bella") else args.samples
    return config.with_overrides(model={**scale["model"], **model_overrides}, train=train,
                                 eval={"num_samples": samples, "seed": seed, "n_bootstrap": 200,
                                       "referral_measure": "mutual_information"})


def train_run(method: str, seed: int, args, data: pathlib.Path, truth: pathlib.Path, work: pathlib.Path,
           name: str | None = None):
    """(export folder, trainable parameters, train seconds) of one run (runs/NAME); a finished run is reused
    only when it was trained with the same config (else ConfigMismatchError: another scale's run, say)."""
    from model.ehr.train import train
    from model.fit.training_loop import check_run_folder

    run_dir = work / "runs" / (name or f"{method}_s{seed}")
    export_dir = run_dir / "export"
    timing = run_dir / "train_seconds.json"
    if (export_dir / "manifest.json").exists():
        check_run_folder(run_dir, run_config(method, seed, args))
    else:
        started = time.time()
        log.info("training %s seed %d -> %s", method, seed, run_dir)
        train(run_config(method, seed, args), data, run_dir, progress=False, truth_path=truth,
              base_dir=bella_base_dir(work, method, seed))
        timing.write_text(json.dumps({"seconds": time.time() - started}))
    card = json.loads((export_dir / "model_card.json").read_text())
    seconds = json.loads(timing.read_text())["seconds"] if timing.exists() else float("nan")
    return export_dir, card["num_parameters"], seconds


def predict(exports, split: Split, samples: int, seed: int) -> np.ndarray:
    """[N, S*K] probabilities of a split; exports are folders or already loaded exports (load once, predict many)."""
    from model.export.load import load_export
    from model.export.predict import predict_probs

    loaded = [e if hasattr(e, "ensemble_size") else load_export(str(e)) for e in exports]
    return predict_probs(loaded, split.records, samples, seed)
