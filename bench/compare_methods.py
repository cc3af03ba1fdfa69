"""Every method x several seeds on synthetic releases with known truth: docs/results.md's comparison.

  python bench/compare_methods.py --scale medium              # ~8,300 admissions per release, 3 x sites A, B, C
  python bench/compare_methods.py --scale tiny --seeds 3      # a few minutes, a smoke test of the grid

Seed s of every method is trained on its OWN site-A release (``ehr-pipeline synth --patients 7000
--seed 11 / 21 / 31``: ~8,300 cohort admissions each), so a row's spread over seeds covers the
release it was trained on as well as its initialisation. Each model then predicts its release's
site-A test split and the test splits of three releases of each shifted site: site B (``--site
B``: another case mix, biased assays, unseen codes, other charting) and site C (``--site C``: site
A's hospital reporting labs in SI units). Every shifted release is bagged with the model's units
(``ehr-pipeline run --units-from``, the harmonised data a site prepares for a model); site C also
as it comes (its own units, "before harmonisation"). The truth formula is the same everywhere.
Training keeps the checkpoint with the best validation NLL; predictions use S samples per member.
Deep ensembles combine ENSEMBLE_SIZE deterministic runs of one release; the scikit-learn
baselines read the same TFRecords. Every number comes from model.evaluation.metrics on the saved per-case
predictions (WORK/preds/*.npz), so the tables can be recomputed without training
(``--report-only``).

Reported, mean +- SEM over seeds (at a shifted site, each seed's mean over the site's releases):
NLL, AUC-PR, AUC-ROC, ECE, Brier, |p - P_DEATH| and the coverage of P_DEATH by the central 50 / 80
/ 95% intervals of the S x K sampled probabilities; paired differences on the same cases
(bootstrap over cases within each test split); under the site shift, how well mutual information
(and the deterministic model's entropy) tells site-B test cases from site-A ones (AUROC), and how
much |p - P_DEATH| referring the 20% most uncertain site-B cases removes compared with referring
the 20% highest p; at site C, each method's |p - P_DEATH| against its site-A value.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.compare_methods")

# Table 4's rows in its order (configs/ehr_<name>.yaml), then the methods of the other papers.
# ktied_normal: paper 003, fully_bayesian with stddevs of rank 2 (k1 / k3: ranks 1 and 3).
METHODS = ("deterministic", "batchensemble", "bayesian_embeddings", "fully_bayesian", "rank1_normal",
           "rank1_cauchy", "ktied_normal", "ktied_normal_k1", "ktied_normal_k3", "rank1_normal_wide",
           "rank1_normal_laplace")
# Rows that are another row's config with a model setting changed: {row: (config name, model overrides)}.
# rank1_normal_wide: with a linear part on the admission window's aggregates (ModelConfig.wide),
# trained with the LSTM; rank1_normal_laplace: that part fitted first as the logistic regression
# with its Laplace posterior (model.training.wide), the LSTM learning the residual.
VARIANTS = {"ktied_normal_k1": ("ktied_normal", {"ktied_rank": 1}),
            "ktied_normal_k3": ("ktied_normal", {"ktied_rank": 3}),
            "rank1_normal_wide": ("rank1_normal", {"wide": True}),
            "rank1_normal_laplace": ("rank1_normal", {"wide": True, "wide_posterior": "laplace"})}
DEFAULT_METHODS = ("deterministic", "batchensemble", "rank1_normal")
# --- Bella (configs/ehr_bella_<update>.yaml): adapts the deterministic run of the same seed, which
# run_grid trains first whenever "deterministic" is among --methods.
BELLA_METHODS = ("bella_ensemble", "bella_svgd")


def bella_base_dir(work: pathlib.Path, method: str, seed: int) -> pathlib.Path | None:
    """The run folder a Bella method adapts (the deterministic row of `seed`); None for other methods."""
    return work / "runs" / run_name("deterministic", seed, ENSEMBLE_SIZE * seed) if method in BELLA_METHODS else None
# --- end Bella
DEEP_ENSEMBLE = "deep_ensemble"
ENSEMBLE_SIZE = 4  # members of a deep ensemble: the rank-1 models' K
BASELINES = ("logistic", "gbm")
# The truth's own logistic design (its nine terms, recomputed from the tables) with coefficients
# fitted on the training split: the well-specified model, so its error is the estimation error
# any model pays at this training-set size.
WELL_SPECIFIED = "well_specified_logistic"
TRUTH = "truth (P_DEATH)"
LEVELS = (0.5, 0.8, 0.95)
SHIFT_REFERRAL = 0.2

# Model sizes and optimisation per scale, applied over each method's config. medium: the
# sizes of configs/ehr_demo.yaml; the step size, schedule and pooling were chosen on site A's
# validation split (docs/results.md says how). releases: site -> (patients, one release seed per
# seed of a method at site A, or per release of a shifted site).
SCALES = {
    "tiny": {"releases": {"A": (700, (1, 2, 3)), "B": (700, (4,)), "C": (700, (5,))}, "steps": 600,
             "model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32},
             "train": {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 100,
                       "early_stopping_patience": 4, "checkpoint_every_steps": 200, "log_every_steps": 50,
                       "shuffle_buffer": 1024, "kl_annealing_steps": 300}},
    "medium": {"releases": {"A": (7000, (11, 21, 31)), "B": (7000, (12, 22, 32)), "C": (7000, (13, 23, 33))},
               "steps": 4000,
               "model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32, "pooling": "attention",
                         "attention_heads": 4},
               "train": {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 250,
                         "early_stopping_patience": 4, "checkpoint_every_steps": 500, "log_every_steps": 50,
                         "shuffle_buffer": 4096, "kl_annealing_steps": 1000, "kl_scale": 0.3}},
    "paper": {"releases": {"A": (40000, (11, 21, 31)), "B": (7000, (12, 22, 32)), "C": (7000, (13, 23, 33))},
              "steps": None, "model": {}, "train": {}},
}
SHIFTED = ("B", "C")
# Sites whose units differ from site A's: also bagged as they come (their own units), the data a
# site would feed a model without harmonising; "Craw" in the tables.
RAW_SITES = ("C",)
RAW = "raw"


def run_name(method: str, seed: int, model_seed: int | None = None) -> str:
    """runs/ folder of a method's seed-th row (trained on release `seed`); deep-ensemble members differ by model seed."""
    return f"{method}_r{seed}_s{seed if model_seed is None else model_seed}"


def split_names(site: str, releases: int) -> list[str]:
    """The test splits a run is scored on at a site: 'A' (its own release), else 'B0', 'B1', ... / 'Craw0', ..."""
    return ["A"] if site == "A" else [f"{site}{j}" for j in range(releases)]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scale", choices=tuple(SCALES), default="medium",
                   help="tiny: ~1k admissions, minutes; medium: ~8.3k admissions per site (the issue's size); "
                        "paper: the configs as written (a GPU)")
    p.add_argument("--work", default="out/compare_methods", help="folder for releases, data, runs, predictions")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=METHODS + BELLA_METHODS,
                   help="methods to train (a deep ensemble of deterministic runs is always added)")
    p.add_argument("--seeds", type=int, default=3,
                   help="seeds per method, each trained on its own site-A release (>= 3 for a SEM; at most the "
                        "scale's site-A releases)")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member (1 for deterministic)")
    p.add_argument("--steps", type=int, default=None, help="max_steps per run (default: the scale's)")
    p.add_argument("--no-shift", action="store_true", help="skip sites B and C (in-distribution tables only)")
    p.add_argument("--no-baselines", action="store_true",
                   help="train the methods only (e.g. a second process on other methods sharing WORK)")
    p.add_argument("--report-only", action="store_true", help="recompute the tables from WORK/preds only")
    p.add_argument("--n-bootstrap", type=int, default=2000, help="resamples of the paired bootstrap")
    p.add_argument("--out", default="docs/results.md", help="markdown file that receives the tables")
    return p


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Split:
    """One test split of one site: serialized examples, labels, hadm_ids and the true P_DEATH."""

    records: list
    labels: np.ndarray
    hadm_ids: np.ndarray
    truth: np.ndarray


def _make_release(site: str, patients: int, seed: int, out: pathlib.Path) -> None:
    if (out / "SYNTH_TRUTH.csv").exists():
        return
    cmd = [sys.executable, "-m", "ehr_pipeline.cli", "synth", "--patients", str(patients), "--seed", str(seed),
           "--out", str(out), "--no-progress"] + (["--site", site] if site != "A" else [])
    log.info("release %s: %s", site, " ".join(cmd[2:]))
    subprocess.run(cmd, check=True, cwd=ROOT)


def _make_data(release: pathlib.Path, data: pathlib.Path, units_from: pathlib.Path | None = None) -> None:
    """The Beam job on a release; with units_from (a data folder), values in that folder's units."""
    if (data / "manifest.json").exists():
        return
    from ehr_pipeline import outputs
    from ehr_pipeline.config import PipelineConfig
    from ehr_pipeline.job import run_job

    reference = outputs.read_json(str(units_from / outputs.UNITS))["canonical"] if units_from else None
    log.info("Beam job: %s -> %s%s", release, data, f" (units of {units_from})" if units_from else "")
    run_job(str(release), str(data), PipelineConfig(), ["--runner=FnApiRunner"], reference_units=reference)


def _split(data: pathlib.Path, release: pathlib.Path, name: str) -> Split:
    from model.evaluation.evaluate import load_truth
    from model.training.inputs import load_data_files, read_split

    records, labels, hadm_ids = read_split(load_data_files(data), name)
    return Split(records, np.asarray(labels), np.asarray(hadm_ids), load_truth(release / "SYNTH_TRUTH.csv", hadm_ids))


def truth_design(release: pathlib.Path, harmonised: bool = True) -> dict[int, np.ndarray]:
    """hadm_id -> the truth's nine logit terms (MortalityModel.design) recomputed from a release's tables.

    harmonised: a site's labs written in other units (its manifest's ``lab_units``) are read back
    in site A's units first, as the harmonised data the models see; False reads them as written.
    """
    from ehr_pipeline.synth.recompute import pre_trigger_features, read_tables
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
    model = MortalityModel(lab_volume_scale=float(settings.get("events_scale", 1.0)))
    return dict(zip(ids.tolist(), model.design(feats)))


def _well_specified(work: pathlib.Path, seed: int, splits: dict[str, Split]) -> dict[str, np.ndarray]:
    """Test-split probabilities [N, 1] per split of the truth's design fitted on release `seed`'s training split."""
    from sklearn.linear_model import LogisticRegression

    rows_a = truth_design(work / f"release_A{seed}")
    train = _split(work / f"data_A{seed}", work / f"release_A{seed}", "train")
    fit = LogisticRegression(C=1e6, max_iter=5000).fit(np.stack([rows_a[h] for h in train.hadm_ids]), train.labels)
    out = {"params": np.array(fit.coef_.size + 1)}
    designs = {}
    for name, split in splits.items():
        release = _release_of(name, work) if name != "A" else work / f"release_A{seed}"
        key = (release, RAW not in name)  # a raw split reads its labs as written, like the models' raw data
        rows = designs.setdefault(key, rows_a if name == "A" else truth_design(release, harmonised=key[1]))
        out[f"probs_{name}"] = fit.predict_proba(np.stack([rows[h] for h in split.hadm_ids]))[:, 1:]
    return out


# --------------------------------------------------------------------------- training


def _config(method: str, seed: int, args: argparse.Namespace):
    from model.training.config import load_config

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


def _train(method: str, seed: int, args, data: pathlib.Path, truth: pathlib.Path, work: pathlib.Path,
           name: str | None = None):
    """(export folder, trainable parameters, train seconds) of one run (runs/NAME); a finished run is reused."""
    from model.training.train import train

    run_dir = work / "runs" / (name or f"{method}_s{seed}")
    export_dir = run_dir / "export"
    timing = run_dir / "train_seconds.json"
    if not (export_dir / "manifest.json").exists():
        started = time.time()
        log.info("training %s seed %d -> %s", method, seed, run_dir)
        train(_config(method, seed, args), data, run_dir, progress=False, truth_path=truth,
              base_dir=bella_base_dir(work, method, seed))
        timing.write_text(json.dumps({"seconds": time.time() - started}))
    card = json.loads((export_dir / "model_card.json").read_text())
    seconds = json.loads(timing.read_text())["seconds"] if timing.exists() else float("nan")
    return export_dir, card["num_parameters"], seconds


def _predict(exports, split: Split, samples: int, seed: int) -> np.ndarray:
    """[N, S*K] probabilities of a split; exports are folders or already loaded exports (load once, predict many)."""
    from model.export.load import load_export
    from model.export.predict import predict_probs

    loaded = [e if hasattr(e, "ensemble_size") else load_export(str(e)) for e in exports]
    return predict_probs(loaded, split.records, samples, seed)


def _save(path: pathlib.Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def make_releases(args: argparse.Namespace, work: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every release and data folder of the grid; returns {split family: data folder} for the test splits.

    Keys: 'A0', 'A1', ... (one training release per seed), 'B0', ..., 'C0', ... (harmonised to A0's
    units) and 'Craw0', ... (site C's own units).
    """
    scale = SCALES[args.scale]
    patients, seeds = scale["releases"]["A"]
    if args.seeds > len(seeds):
        raise SystemExit(f"--seeds {args.seeds}: the {args.scale} scale has {len(seeds)} site-A releases")
    data = {}
    for i in range(args.seeds):
        _make_release("A", patients, seeds[i], work / f"release_A{i}")
        _make_data(work / f"release_A{i}", work / f"data_A{i}")
        data[f"A{i}"] = work / f"data_A{i}"
    units_a = [json.loads((data[f"A{i}"] / "units.json").read_text())["canonical"] for i in range(args.seeds)]
    if any(u != units_a[0] for u in units_a):
        raise RuntimeError("the site-A releases disagree on canonical units: shifted data cannot share A0's")
    for site in () if args.no_shift else SHIFTED:
        if site not in scale["releases"]:
            continue
        patients, seeds = scale["releases"][site]
        for j, seed in enumerate(seeds):
            release = work / f"release_{site}{j}"
            _make_release(site, patients, seed, release)
            _make_data(release, work / f"data_{site}{j}", units_from=data["A0"])
            data[f"{site}{j}"] = work / f"data_{site}{j}"
            if site in RAW_SITES:
                _make_data(release, work / f"data_{site}{RAW}{j}")
                data[f"{site}{RAW}{j}"] = work / f"data_{site}{RAW}{j}"
    return data


def _release_of(name: str, work: pathlib.Path) -> pathlib.Path:
    """The release folder behind a split family name ('Craw1' -> release_C1)."""
    return work / f"release_{name.replace(RAW, '')}"


def run_grid(args: argparse.Namespace, work: pathlib.Path) -> None:
    """Trains every run that is missing and saves its test predictions (WORK/preds/NAME_sSEED.npz)."""
    data = make_releases(args, work)
    tests = {name: _split(folder, _release_of(name, work), "test") for name, folder in data.items()}
    shifted = {name: split for name, split in tests.items() if not name.startswith("A")}
    preds = work / "preds"

    def splits_of(seed: int) -> dict[str, Split]:
        return {"A": tests[f"A{seed}"], **shifted}

    def save_predictions(name: str, exports, samples: int, seed: int, params: int, seconds: float) -> None:
        target = preds / f"{name}_s{seed}.npz"
        if target.exists():
            return
        from model.export.load import load_export

        loaded = [load_export(str(e)) for e in exports]  # ~10 s each: once for the ten-odd test splits
        arrays = {f"probs_{n}": _predict(loaded, split, samples, seed) for n, split in splits_of(seed).items()}
        _save(target, params=params, seconds=seconds, **arrays)

    def train_on(method: str, seed: int, model_seed: int | None = None):
        return _train(method, seed if model_seed is None else model_seed, args, data[f"A{seed}"],
                      _release_of(f"A{seed}", work) / "SYNTH_TRUTH.csv", work, run_name(method, seed, model_seed))

    if "deterministic" in args.methods:
        for seed in range(args.seeds):
            # Release `seed`'s deep ensemble; its first member is also the deterministic row.
            members = [train_on("deterministic", seed, ENSEMBLE_SIZE * seed + k) for k in range(ENSEMBLE_SIZE)]
            save_predictions("deterministic", [members[0][0]], 1, seed, members[0][1], members[0][2])
            save_predictions(DEEP_ENSEMBLE, [m[0] for m in members], 1, seed, sum(m[1] for m in members),
                             sum(m[2] for m in members))
    for method in args.methods:
        if method == "deterministic":
            continue
        for seed in range(args.seeds):
            export_dir, params, seconds = train_on(method, seed)
            samples = 1 if method in ("batchensemble", *BELLA_METHODS) else args.samples
            save_predictions(method, [export_dir], samples, seed, params, seconds)
    for seed in range(0 if args.no_baselines else args.seeds):
        for kind in BASELINES:
            # Both fits are deterministic for a release (lbfgs or liblinear with a fixed random_state;
            # histogram boosting without subsampling): one fit per training release.
            target = preds / f"{kind}_s{seed}.npz"
            if target.exists():
                continue
            from model.training.baselines import fit_baseline

            started = time.time()
            fitted = fit_baseline(data[f"A{seed}"], kind, seed=0)
            arrays = {f"probs_{n}": fitted.predict_data(data[f"A{seed}"] if n == "A" else data[n], "test")[:, None]
                      for n in splits_of(seed)}
            _save(target, params=fitted.num_parameters, seconds=time.time() - started, **arrays)
        if not (preds / f"{WELL_SPECIFIED}_s{seed}.npz").exists():
            started = time.time()
            arrays = _well_specified(work, seed, splits_of(seed))
            _save(preds / f"{WELL_SPECIFIED}_s{seed}.npz", seconds=time.time() - started, **arrays)
    _save(preds / "truth.npz", **{f"truth_{n}": sp.truth for n, sp in tests.items()},
          **{f"labels_{n}": sp.labels for n, sp in tests.items()})


# --------------------------------------------------------------------------- tables


def _mean_sem(values) -> tuple[float, float]:
    vals = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if vals.size == 0:
        return float("nan"), float("nan")
    if vals.size < 2:
        return float(vals.mean()), float("nan")
    return float(vals.mean()), float(vals.std(ddof=1) / math.sqrt(vals.size))


def _fmt(mean: float, sem: float, digits: int = 4) -> str:
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.{digits}f}" + ("" if not math.isfinite(sem) else f" +- {sem:.{digits}f}")


def load_predictions(preds: pathlib.Path) -> tuple[dict[str, list[dict]], dict[str, np.ndarray]]:
    """{row name: [one dict of arrays per seed, with its "seed"]} and the truth / label arrays."""
    truth = dict(np.load(preds / "truth.npz"))
    runs: dict[str, list[dict]] = {}
    for path in sorted(preds.glob("*_s*.npz"), key=lambda p: (p.stem.rsplit("_s", 1)[0], int(p.stem.rsplit("_s", 1)[1]))):
        name, seed = path.stem.rsplit("_s", 1)
        runs.setdefault(name, []).append({**np.load(path), "seed": int(seed)})
    order = [m for m in (*METHODS, *BELLA_METHODS, DEEP_ENSEMBLE, *BASELINES, WELL_SPECIFIED) if m in runs]
    return {m: runs[m] for m in order}, truth


def _releases(truth: dict[str, np.ndarray], site: str) -> int:
    """How many test splits of a shifted site ('B', 'C', 'Craw') the grid holds."""
    return sum(1 for k in truth if k.startswith(f"labels_{site}") and k[len(f"labels_{site}"):].isdigit())


def _cases(run: dict | None, seed: int, site: str, truth: dict[str, np.ndarray]) -> list[tuple]:
    """(probs or None for the truth, labels, P_DEATH) of each test split a seed is scored on at a site."""
    if site == "A":
        names = [("A", f"A{seed}")]
    else:
        names = [(n, n) for n in split_names(site, _releases(truth, site))]
    return [(None if run is None else run.get(f"probs_{key}"), truth[f"labels_{tkey}"], truth[f"truth_{tkey}"])
            for key, tkey in names]


def _case_losses(probs: np.ndarray, y: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """Per-case NLL, squared error and |p - P_DEATH| of the predictive mean (these average to the metric)."""
    from model.evaluation import against_truth

    p = probs.mean(axis=1)
    return {"nll": _nll_cases(p, y),
            "brier": (p - y) ** 2, "truth_mae": np.abs(p - truth), "kl_truth": against_truth.kl_bernoulli(truth, p)}


def _nll_cases(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    from model.evaluation.metrics import EPS

    q = np.clip(p, EPS, 1.0 - EPS)
    return -(y * np.log(q) + (1 - y) * np.log1p(-q))


def _scores(probs: np.ndarray, y: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    from model.evaluation import against_truth, metrics

    p = probs.mean(axis=1)
    out = metrics.scalar_metrics(p, y)
    out["truth_mae"] = float(np.mean(np.abs(p - truth)))
    out["kl_truth"] = float(np.mean(against_truth.kl_bernoulli(truth, p)))
    out.update({f"cov{int(level * 100)}": v for level, v in zip(LEVELS, against_truth.interval_coverage(
        probs, truth, LEVELS).values())})
    return out


def _site_scores(run: dict | None, seed: int, site: str, truth: dict[str, np.ndarray]) -> dict[str, float] | None:
    """A seed's scores at a site: its one site-A split, or the mean over a shifted site's releases (None if absent)."""
    parts = [_scores(t[:, None] if probs is None else probs, y, t) for probs, y, t in _cases(run, seed, site, truth)]
    if not parts or (run is not None and any(probs is None for probs, _, _ in _cases(run, seed, site, truth))):
        return None
    return {k: float(np.mean([p[k] for p in parts])) for k in parts[0]}


COLUMNS = (("nll", "NLL"), ("auc_pr", "AUC-PR"), ("auc_roc", "AUC-ROC"), ("ece", "ECE"), ("brier", "Brier"),
           ("truth_mae", "abs(p - P)"), ("kl_truth", "KL(P, p)"), ("cov50", "cov 50%"), ("cov80", "cov 80%"),
           ("cov95", "cov 95%"))


def _seeds(runs: dict[str, list[dict]]) -> list[int]:
    return sorted({r["seed"] for seeds in runs.values() for r in seeds})


def _table(runs: dict[str, list[dict]], truth: dict[str, np.ndarray], site: str) -> list[str]:
    head = "| Method | " + " | ".join(name for _, name in COLUMNS) + " | # Parameters | train s | runs |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    rows = {name: [sc for r in seeds if (sc := _site_scores(r, r["seed"], site, truth)) is not None]
            for name, seeds in runs.items()}
    rows[TRUTH] = [sc for seed in _seeds(runs) if (sc := _site_scores(None, seed, site, truth)) is not None]
    for name, scores in rows.items():
        if not scores:
            continue
        cells = [_fmt(*_mean_sem([s[key] for s in scores])) for key, _ in COLUMNS]
        seeds = runs.get(name, [{}])
        params = int(seeds[0]["params"]) if "params" in seeds[0] else 0
        seconds = _mean_sem([float(r["seconds"]) for r in seeds if "seconds" in r])[0]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {params:,} | "
                     + ("" if not math.isfinite(seconds) else f"{seconds:.0f}") + f" | {len(scores)} |")
    return lines


def _paired(runs, truth, site: str, a: str, b: str, n_boot: int) -> dict[str, tuple[float, float, float]]:
    """b - a of the per-case losses over every (seed, test split) both have, with a 95% bootstrap interval.

    Each seed is scored on its own cases (its release's site-A test split, or the shifted site's
    splits): the pairs are the same cases for a and b, and the bootstrap resamples cases within
    each (seed, split) stratum.
    """
    def losses(name: str, seed: int) -> list[dict[str, np.ndarray]] | None:
        run = None if name == TRUTH else next((r for r in runs[name] if r["seed"] == seed), None)
        if name != TRUTH and run is None:
            return None
        cases = _cases(run, seed, site, truth)
        if any(probs is None and name != TRUTH for probs, _, _ in cases):
            return None
        return [_case_losses(t[:, None] if probs is None else probs, y, t) for probs, y, t in cases]

    diffs: dict[str, list[np.ndarray]] = {}
    for seed in _seeds(runs):
        la, lb = losses(a, seed), losses(b, seed)
        if la is None or lb is None:
            continue
        for sa, sb in zip(la, lb):
            for key in sa:
                diffs.setdefault(key, []).append(sb[key] - sa[key])
    rng = np.random.default_rng(0)
    strata = diffs[next(iter(diffs))]
    offsets = np.cumsum([0] + [d.size for d in strata[:-1]])
    idx = np.concatenate([rng.integers(0, d.size, size=(n_boot, d.size)) + o for d, o in zip(strata, offsets)], axis=1)
    out = {}
    for key, parts in diffs.items():
        d = np.concatenate(parts)
        boot = d[idx].mean(axis=1)
        out[key] = (float(d.mean()), *(float(v) for v in np.quantile(boot, [0.025, 0.975])))
    return out


def _paired_lines(runs, truth, site: str, n_boot: int) -> list[str]:
    """Paired differences B - A: every run against the truth, then rank-1 and its wide variants against the rest."""
    have = {name for name, seeds in runs.items() if any(_site_scores(r, r["seed"], site, truth) for r in seeds)}
    pairs = [(TRUTH, m) for m in runs if m in have]
    pairs += [(b, "rank1_normal") for b in (*BASELINES, DEEP_ENSEMBLE, "deterministic")
              if b in have and "rank1_normal" in have]
    pairs += [(b, wide) for wide in ("rank1_normal_wide", "rank1_normal_laplace")
              for b in ("rank1_normal", *BASELINES) if b in have and wide in have]
    keys = (("nll", "NLL"), ("truth_mae", "abs(p - P)"), ("kl_truth", "KL(P, p)"), ("brier", "Brier"))
    lines = ["| B - A (same cases) | " + " | ".join(n for _, n in keys) + " |", "|---|" + "---|" * len(keys)]
    for a, b in pairs:
        diff = _paired(runs, truth, site, a, b, n_boot)
        cells = [f"{diff[k][0]:+.4f} [{diff[k][1]:+.4f}, {diff[k][2]:+.4f}]" for k, _ in keys]
        lines.append(f"| {b} - {a} | " + " | ".join(cells) + " |")
    return lines


def _shift_lines(runs, truth) -> list[str]:
    """Site-B detection by uncertainty and the error removed by referring 20% of site B (per seed: all B releases)."""
    from model.evaluation import against_truth, metrics

    rate = SHIFT_REFERRAL
    head = ("| Method | AUROC B vs A: mutual information | AUROC B vs A: entropy | kept abs(p - P), refer by MI | "
            "refer by entropy | refer highest p | refer at random | no referral |")
    lines = [head, "|---|" + "---|" * 7]
    for name, seeds in runs.items():
        cells: dict[str, list[float]] = {}
        for r in seeds:
            (pa, ya, _), = _cases(r, r["seed"], "A", truth)
            shifted = _cases(r, r["seed"], "B", truth)
            if pa is None or not shifted or any(p is None for p, _, _ in shifted):
                continue
            pb = np.concatenate([p for p, _, _ in shifted])
            yb = np.concatenate([y for _, y, _ in shifted])
            tb = np.concatenate([t for _, _, t in shifted])
            is_b = np.r_[np.zeros(len(pa)), np.ones(len(pb))]
            both = np.concatenate([pa, pb])
            mi, ent = metrics.mutual_information(both), metrics.predictive_entropy(both)
            sampled = pb.shape[1] > 1  # one sample per case has no mutual information (it is 0)
            cells.setdefault("auc_mi", []).append(metrics.auc_roc(mi, is_b) if sampled else float("nan"))
            cells.setdefault("auc_ent", []).append(metrics.auc_roc(ent, is_b))
            p = pb.mean(axis=1)
            sel = against_truth.selective_vs_truth(p, yb, tb, {"mi": metrics.mutual_information(pb),
                                                         "entropy": metrics.predictive_entropy(pb)},
                                             referral_rates=(0.0, rate))
            for key in ("mi", "entropy", "risk", "random"):
                value = sel[key][1]["mae_truth"]
                cells.setdefault(key, []).append(value if sampled or key != "mi" else float("nan"))
            cells.setdefault("none", []).append(sel["risk"][0]["mae_truth"])
        if not cells:
            continue
        order = ("auc_mi", "auc_ent", "mi", "entropy", "risk", "random", "none")
        lines.append(f"| {name} | " + " | ".join(_fmt(*_mean_sem(cells[k])) for k in order) + " |")
    return lines


HARMONISED_TOLERANCE = 0.10  # the target: abs(p - P) at the SI-unit site within 10% of the site-A value


def _harmonisation_lines(runs, truth) -> list[str]:
    """Per method: abs(p - P) at site A, at site C as it comes and harmonised, and the ratio C / A per seed."""
    head = ("| Method | abs(p - P) site A | site C, its own units | site C, harmonised | harmonised / site A | "
            f"within {HARMONISED_TOLERANCE:.0%} |")
    lines = [head, "|---|" + "---|" * 5]
    for name, seeds in runs.items():
        a, raw, harm, ratio = [], [], [], []
        for r in seeds:
            sa = _site_scores(r, r["seed"], "A", truth)
            sc = _site_scores(r, r["seed"], "C", truth)
            sr = _site_scores(r, r["seed"], f"C{RAW}", truth)
            if sa is None or sc is None:
                continue
            a.append(sa["truth_mae"])
            harm.append(sc["truth_mae"])
            ratio.append(sc["truth_mae"] / sa["truth_mae"])
            if sr is not None:
                raw.append(sr["truth_mae"])
        if not ratio:
            continue
        mean_ratio = _mean_sem(ratio)
        lines.append(f"| {name} | {_fmt(*_mean_sem(a))} | {_fmt(*_mean_sem(raw))} | {_fmt(*_mean_sem(harm))} | "
                     f"{_fmt(*mean_ratio, digits=3)} | {'yes' if mean_ratio[0] <= 1 + HARMONISED_TOLERANCE else 'no'} |")
    return lines


def total_seconds(runs: dict[str, list[dict]]) -> float:
    """Training / fitting seconds summed over every saved run, each deterministic run once."""
    # The deep ensembles' members are every deterministic run (the first ones are also the
    # deterministic rows), so count those through the ensembles when there are any.
    skip = "deterministic" if DEEP_ENSEMBLE in runs else None
    return float(sum(float(r.get("seconds", 0.0)) for name, seeds in runs.items() if name != skip
                     for r in seeds))


def _release_text(scale: dict, site: str, truth: dict[str, np.ndarray], names: list[str]) -> str:
    patients, seeds = scale["releases"][site]
    flag = "" if site == "A" else f" --site {site}"
    sizes = ", ".join(f"{truth[f'labels_{n}'].size}" for n in names if f"labels_{n}" in truth)
    deaths = ", ".join(f"{int(truth[f'labels_{n}'].sum())}" for n in names if f"labels_{n}" in truth)
    return (f"site {site} `ehr-pipeline synth{flag} --patients {patients} --seed "
            f"{' / '.join(str(s) for s in seeds[:len(names)])}` (test n = {sizes}; deaths {deaths})")


def report(args: argparse.Namespace, work: pathlib.Path, command: str, seconds: float) -> str:
    """The markdown section: in-distribution, paired and site-shift tables."""
    from bench.report import machine_info

    runs, truth = load_predictions(work / "preds")
    scale = SCALES[args.scale]
    n_seeds = len(_seeds(runs))
    sites = {"A": [f"A{i}" for i in range(n_seeds)]}
    for site in SHIFTED:
        if _releases(truth, site):
            sites[site] = split_names(site, _releases(truth, site))
    lines = [f"## Method comparison against the known truth ({args.scale} scale)", "",
             f"Command (repo root): `{command}`", "",
             "Releases: " + "; ".join(_release_text(scale, site, truth, names) for site, names in sites.items())
             + ". Seed s of every method is trained on site-A release s (its training split; the checkpoint with the "
             "best validation NLL kept) and scored on that release's test split; at a shifted site it is scored on "
             "every release of the site, bagged with the model's units (`ehr-pipeline run --units-from`), and its "
             "score is the mean over those releases.",
             f"Mean +- SEM over {n_seeds} seeds (so over training releases and initialisations); S = {args.samples} "
             "samples per member for the Bayesian methods (1 for deterministic members); abs(p - P) is the mean "
             "absolute error of the predictive mean against the true P_DEATH, KL(P, p) the mean KL divergence from "
             "the true Bernoulli (the expected excess NLL); cov X% is the fraction of cases whose P_DEATH lies in the "
             "central X% interval of the S x K sampled probabilities (n/a for one sample). A deep ensemble combines "
             f"{ENSEMBLE_SIZE} deterministic runs of one release; the scikit-learn fits are deterministic, so they "
             "are fitted once per release. rank1_normal_wide adds a linear part on the admission window's aggregates "
             "trained with the LSTM, rank1_normal_laplace that part fitted first as the logistic regression with its "
             "Laplace posterior (docs/model.md). Training and "
             f"fitting took {total_seconds(runs) / 60:.0f} CPU-shared minutes summed over runs (train s per run in "
             f"the tables; the grid's last invocation ran {seconds / 60:.1f} min).", "",
             "### Site A (in distribution)", "", *_table(runs, truth, "A"), "",
             "Paired differences on site A's test cases (each seed on its own release's cases; 95% bootstrap "
             "interval over cases within each test split):", "", *_paired_lines(runs, truth, "A", args.n_bootstrap)]
    if "B" in sites:
        lines += ["", "### Site B (dataset shift), models trained at site A", "", *_table(runs, truth, "B"), "",
                  "Paired differences on site B's test cases:", "", *_paired_lines(runs, truth, "B", args.n_bootstrap),
                  "", f"Uncertainty under the shift: how well each measure separates site-B from site-A test cases "
                  f"(AUROC; per seed, its site-A test split against every site-B release's), and the mean abs(p - P) "
                  f"of the site-B cases kept after referring {SHIFT_REFERRAL:.0%} of them by each rule:", "",
                  *_shift_lines(runs, truth)]
    if "C" in sites:
        lines += ["", "### Site C (labs in SI units), models trained at site A", "",
                  "Site C is site A's hospital reporting creatinine, glucose, urea, calcium, magnesium, phosphate, "
                  "bilirubin, albumin and haemoglobin in SI units (docs/synthetic.md). Harmonised: bagged with "
                  "`--units-from` the model's data, so every value is converted to the training units; as it comes: "
                  "bagged in the site's own units, as a model would be fed without harmonisation.", "",
                  *_harmonisation_lines(runs, truth), "", "Harmonised:", "", *_table(runs, truth, "C"), "",
                  "As it comes (before harmonisation):", "", *_table(runs, truth, f"C{RAW}")]
    lines += ["", "Machine:", "", machine_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Trains the grid (unless --report-only) and writes the tables; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.report import command_line, publish
    from ehr_base.cli_args import setup_logging

    setup_logging()
    work = pathlib.Path(args.work)
    started = time.time()
    timing = work / "grid_seconds.json"
    if not args.report_only:
        run_grid(args, work)
        timing.write_text(json.dumps({"seconds": time.time() - started}))
    seconds = json.loads(timing.read_text())["seconds"] if timing.exists() else time.time() - started
    command = command_line(__file__, argv, drop=("--report-only",))
    markdown = report(args, work, command, seconds)
    publish("compare_methods", markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
