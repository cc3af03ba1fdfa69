"""Every method x several seeds on synthetic releases with known truth: docs/results.md's comparison.

  python bench/compare_methods.py --scale medium              # ~8,300 admissions, 3 seeds, site A and B
  python bench/compare_methods.py --scale tiny --seeds 3      # a few minutes, a smoke test of the grid

The medium scale writes two releases with the project's generator, site A
(``ehr-pipeline synth --patients 7000 --seed 11``: 8,328 cohort admissions) and site B
(``--site B``: another case mix, biased assays, unseen codes, other charting; the same truth
formula), runs the Beam job on each, then for every method and seed trains on site A's
training split (best checkpoint by validation NLL), and predicts site A's and site B's test
splits with S samples per member. Deep ensembles combine ENSEMBLE_SIZE deterministic runs of
disjoint seeds; the scikit-learn baselines read the same TFRecords. Every number comes from
model.metrics on the saved per-case predictions (WORK/preds/*.npz), so the tables can be
recomputed without training (``--report-only``).

Reported, mean +- SEM over seeds: NLL, AUC-PR, AUC-ROC, ECE, Brier, |p - P_DEATH| and the
coverage of P_DEATH by the central 50 / 80 / 95% intervals of the S x K sampled probabilities;
paired differences on the same cases (bootstrap over cases of the seed-averaged per-case
difference); under the site shift, how well mutual information (and the deterministic model's
entropy) tells site-B test cases from site-A ones (AUROC), and how much |p - P_DEATH| referring
the 20% most uncertain site-B cases removes compared with referring the 20% highest p.
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

import ehr_pipeline  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.compare_methods")

# Table 4's rows in its order (configs/ehr_<name>.yaml), then the methods of the other papers.
# ktied_normal: paper 003, fully_bayesian with stddevs of rank 2 (k1 / k3: ranks 1 and 3).
METHODS = ("deterministic", "batchensemble", "bayesian_embeddings", "fully_bayesian", "rank1_normal",
           "rank1_cauchy", "ktied_normal", "ktied_normal_k1", "ktied_normal_k3", "rank1_normal_wide",
           "rank1_normal_laplace")
# Rows that are another row's config with a model setting changed: {row: (config name, model overrides)}.
# rank1_normal_wide: with a linear part on the admission window's aggregates (ModelConfig.wide),
# trained with the LSTM; rank1_normal_laplace: that part fitted first as the logistic regression
# with its Laplace posterior (model.wide), the LSTM learning the residual.
VARIANTS = {"ktied_normal_k1": ("ktied_normal", {"ktied_rank": 1}),
            "ktied_normal_k3": ("ktied_normal", {"ktied_rank": 3}),
            "rank1_normal_wide": ("rank1_normal", {"wide": True}),
            "rank1_normal_laplace": ("rank1_normal", {"wide": True, "wide_posterior": "laplace"})}
DEFAULT_METHODS = ("deterministic", "batchensemble", "rank1_normal")
# --- Bella (configs/ehr_bella_<update>.yaml): adapts the deterministic run of the same seed, which
# run_grid trains first whenever "deterministic" is among --methods.
BELLA_METHODS = ("bella_ensemble", "bella_svgd")


def bella_base_dir(work: pathlib.Path, method: str, seed: int) -> pathlib.Path | None:
    """The run folder a Bella method adapts (the deterministic run of `seed`); None for other methods."""
    return work / "runs" / f"deterministic_s{seed}" if method in BELLA_METHODS else None
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
# validation split (docs/results.md says how).
SCALES = {
    "tiny": {"releases": {"A": (700, 1)}, "steps": 600,
             "model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32},
             "train": {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 100,
                       "early_stopping_patience": 4, "checkpoint_every_steps": 200, "log_every_steps": 50,
                       "shuffle_buffer": 1024, "kl_annealing_steps": 300}},
    "medium": {"releases": {"A": (7000, 11), "B": (7000, 12)}, "steps": 4000,
               "model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32, "pooling": "attention",
                         "attention_heads": 4},
               "train": {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 250,
                         "early_stopping_patience": 4, "checkpoint_every_steps": 500, "log_every_steps": 50,
                         "shuffle_buffer": 4096, "kl_annealing_steps": 1000, "kl_scale": 0.3}},
    "paper": {"releases": {"A": (40000, 11), "B": (7000, 12)}, "steps": None, "model": {}, "train": {}},
}


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
    p.add_argument("--seeds", type=int, default=3, help="seeds per method (>= 3 for a SEM)")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member (1 for deterministic)")
    p.add_argument("--steps", type=int, default=None, help="max_steps per run (default: the scale's)")
    p.add_argument("--no-shift", action="store_true", help="skip site B (in-distribution tables only)")
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


def _make_data(release: pathlib.Path, data: pathlib.Path) -> None:
    if (data / "manifest.json").exists():
        return
    from ehr_pipeline.config import PipelineConfig
    from ehr_pipeline.job import run_job

    log.info("Beam job: %s -> %s", release, data)
    run_job(str(release), str(data), PipelineConfig(), ["--runner=FnApiRunner"])


def _split(data: pathlib.Path, release: pathlib.Path, name: str) -> Split:
    from model.evaluate import load_truth
    from model.inputs import load_data_files, read_split

    records, labels, hadm_ids = read_split(load_data_files(data), name)
    return Split(records, np.asarray(labels), np.asarray(hadm_ids), load_truth(release / "SYNTH_TRUTH.csv", hadm_ids))


def truth_design(release: pathlib.Path) -> dict[int, np.ndarray]:
    """hadm_id -> the truth's nine logit terms (MortalityModel.design) recomputed from a release's tables."""
    from ehr_pipeline.synth.recompute import pre_trigger_features, read_tables
    from ehr_pipeline.synth.truth import MortalityModel

    manifest = json.loads((release / "SYNTH_MANIFEST.json").read_text())
    settings = manifest.get("settings", manifest)
    ids, feats = pre_trigger_features(read_tables(release), int(settings.get("trigger_offset_seconds", 86400)))
    model = MortalityModel(lab_volume_scale=float(settings.get("events_scale", 1.0)))
    return dict(zip(ids.tolist(), model.design(feats)))


def _well_specified(work: pathlib.Path, sites) -> dict[str, np.ndarray]:
    """Test-split probabilities [N, 1] per site of the truth's design fitted on site A's training split."""
    from sklearn.linear_model import LogisticRegression

    rows_a = truth_design(work / "release_A")
    train = _split(work / "data_A", work / "release_A", "train")
    fit = LogisticRegression(C=1e6, max_iter=5000).fit(np.stack([rows_a[h] for h in train.hadm_ids]), train.labels)
    out = {"params": np.array(fit.coef_.size + 1)}
    for site, split in sites.items():
        rows = rows_a if site == "A" else truth_design(work / f"release_{site}")
        out[f"probs_{site}"] = fit.predict_proba(np.stack([rows[h] for h in split.hadm_ids]))[:, 1:]
    return out


# --------------------------------------------------------------------------- training


def _config(method: str, seed: int, args: argparse.Namespace):
    from model.config import load_config

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


def _train(method: str, seed: int, args, data: pathlib.Path, truth: pathlib.Path, work: pathlib.Path):
    """(export folder, trainable parameters, train seconds) of one run; a finished run is reused."""
    from model.train import train

    run_dir = work / "runs" / f"{method}_s{seed}"
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
    from model.predict import predict_probs

    return predict_probs([str(e) for e in exports], split.records, samples, seed)


def _save(path: pathlib.Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def run_grid(args: argparse.Namespace, work: pathlib.Path) -> None:
    """Trains every run that is missing and saves its test predictions (WORK/preds/NAME_sSEED.npz)."""
    scale = SCALES[args.scale]
    sites = {s: v for s, v in scale["releases"].items() if not (args.no_shift and s != "A")}
    for site, (patients, seed) in sites.items():
        _make_release(site, patients, seed, work / f"release_{site}")
        _make_data(work / f"release_{site}", work / f"data_{site}")
    data_a, truth_a = work / "data_A", work / "release_A" / "SYNTH_TRUTH.csv"
    splits = {site: _split(work / f"data_{site}", work / f"release_{site}", "test") for site in sites}
    preds = work / "preds"

    def save_predictions(name: str, exports, samples: int, seed: int, params: int, seconds: float) -> None:
        target = preds / f"{name}_s{seed}.npz"
        if target.exists():
            return
        arrays = {f"probs_{site}": _predict(exports, split, samples, seed) for site, split in splits.items()}
        _save(target, params=params, seconds=seconds, **arrays)

    det_runs = []
    n_det = max(args.seeds, ENSEMBLE_SIZE * args.seeds) if "deterministic" in args.methods else 0
    for seed in range(n_det):  # the deep ensembles' members; the first `seeds` are the deterministic rows
        det_runs.append(_train("deterministic", seed, args, data_a, truth_a, work))
        if seed < args.seeds:
            save_predictions("deterministic", [det_runs[-1][0]], 1, seed, det_runs[-1][1], det_runs[-1][2])
    for e in range(args.seeds if len(det_runs) >= ENSEMBLE_SIZE * args.seeds else 0):
        members = det_runs[e * ENSEMBLE_SIZE:(e + 1) * ENSEMBLE_SIZE]
        save_predictions(DEEP_ENSEMBLE, [m[0] for m in members], 1, e, sum(m[1] for m in members),
                         sum(m[2] for m in members))
    for method in args.methods:
        if method == "deterministic":
            continue
        for seed in range(args.seeds):
            export_dir, params, seconds = _train(method, seed, args, data_a, truth_a, work)
            samples = 1 if method in ("batchensemble", *BELLA_METHODS) else args.samples
            save_predictions(method, [export_dir], samples, seed, params, seconds)
    for kind in () if args.no_baselines else BASELINES:
        # Both fits are deterministic (lbfgs or liblinear with a fixed random_state; histogram boosting
        # without subsampling): one fit is every seed's.
        for seed in range(1):
            target = preds / f"{kind}_s{seed}.npz"
            if target.exists():
                continue
            from model.baselines import fit_baseline

            started = time.time()
            fitted = fit_baseline(data_a, kind, seed=seed)
            arrays = {f"probs_{site}": fitted.predict_data(work / f"data_{site}", "test")[:, None]
                      for site in splits}
            _save(target, params=fitted.num_parameters, seconds=time.time() - started, **arrays)
    if not args.no_baselines and not (preds / f"{WELL_SPECIFIED}_s0.npz").exists():
        started = time.time()
        arrays = _well_specified(work, splits)
        _save(preds / f"{WELL_SPECIFIED}_s0.npz", seconds=time.time() - started, **arrays)
    _save(preds / "truth.npz", **{f"truth_{s}": sp.truth for s, sp in splits.items()},
          **{f"labels_{s}": sp.labels for s, sp in splits.items()})


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
    """{row name: [one dict of arrays per seed]} and the truth / label arrays."""
    truth = dict(np.load(preds / "truth.npz"))
    runs: dict[str, list[dict]] = {}
    for path in sorted(preds.glob("*_s*.npz")):
        name = path.stem.rsplit("_s", 1)[0]
        runs.setdefault(name, []).append(dict(np.load(path)))
    order = [m for m in (*METHODS, *BELLA_METHODS, DEEP_ENSEMBLE, *BASELINES, WELL_SPECIFIED) if m in runs]
    return {m: runs[m] for m in order}, truth


def _case_losses(probs: np.ndarray, y: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """Per-case NLL, squared error and |p - P_DEATH| of the predictive mean (these average to the metric)."""
    from model import metrics

    p = probs.mean(axis=1)
    return {"nll": _nll_cases(p, y),
            "brier": (p - y) ** 2, "truth_mae": np.abs(p - truth), "kl_truth": metrics.kl_bernoulli(truth, p)}


def _nll_cases(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    from model.metrics import EPS

    q = np.clip(p, EPS, 1.0 - EPS)
    return -(y * np.log(q) + (1 - y) * np.log1p(-q))


def _scores(probs: np.ndarray, y: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    from model import metrics

    p = probs.mean(axis=1)
    out = metrics.scalar_metrics(p, y)
    out["truth_mae"] = float(np.mean(np.abs(p - truth)))
    out["kl_truth"] = float(np.mean(metrics.kl_bernoulli(truth, p)))
    out.update({f"cov{int(level * 100)}": v for level, v in zip(LEVELS, metrics.interval_coverage(
        probs, truth, LEVELS).values())})
    return out


COLUMNS = (("nll", "NLL"), ("auc_pr", "AUC-PR"), ("auc_roc", "AUC-ROC"), ("ece", "ECE"), ("brier", "Brier"),
           ("truth_mae", "abs(p - P)"), ("kl_truth", "KL(P, p)"), ("cov50", "cov 50%"), ("cov80", "cov 80%"),
           ("cov95", "cov 95%"))


def _table(runs: dict[str, list[dict]], truth: dict[str, np.ndarray], site: str) -> list[str]:
    y, t = truth[f"labels_{site}"], truth[f"truth_{site}"]
    head = "| Method | " + " | ".join(name for _, name in COLUMNS) + " | # Parameters | train s | runs |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    rows = {name: [_scores(r[f"probs_{site}"], y, t) for r in seeds] for name, seeds in runs.items()}
    rows[TRUTH] = [_scores(t[:, None], y, t)]
    for name, scores in rows.items():
        cells = [_fmt(*_mean_sem([s[key] for s in scores])) for key, _ in COLUMNS]
        seeds = runs.get(name, [{}])
        params = int(seeds[0]["params"]) if "params" in seeds[0] else 0
        seconds = _mean_sem([float(r["seconds"]) for r in seeds if "seconds" in r])[0]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {params:,} | "
                     + ("" if not math.isfinite(seconds) else f"{seconds:.0f}") + f" | {len(scores)} |")
    return lines


def _paired(runs, truth, site: str, a: str, b: str, n_boot: int) -> dict[str, tuple[float, float, float]]:
    """b - a of the per-case losses averaged over the seeds both have, with a 95% bootstrap interval over cases."""
    y, t = truth[f"labels_{site}"], truth[f"truth_{site}"]

    def per_case(name: str) -> dict[str, np.ndarray]:
        if name == TRUTH:
            return _case_losses(t[:, None], y, t)
        seeds = [_case_losses(r[f"probs_{site}"], y, t) for r in runs[name]]
        return {k: np.mean([s[k] for s in seeds], axis=0) for k in seeds[0]}

    la, lb = per_case(a), per_case(b)
    idx = np.random.default_rng(0).integers(0, y.size, size=(n_boot, y.size))
    out = {}
    for key in la:
        d = lb[key] - la[key]
        boot = d[idx].mean(axis=1)
        out[key] = (float(d.mean()), *(float(v) for v in np.quantile(boot, [0.025, 0.975])))
    return out


def _paired_lines(runs, truth, site: str, n_boot: int) -> list[str]:
    """Paired differences B - A: every run against the truth, then rank-1 and its wide variants against the rest."""
    pairs = [(TRUTH, m) for m in runs] + [(b, "rank1_normal") for b in (*BASELINES, DEEP_ENSEMBLE, "deterministic")
                                          if b in runs and "rank1_normal" in runs]
    pairs += [(b, wide) for wide in ("rank1_normal_wide", "rank1_normal_laplace")
              for b in ("rank1_normal", *BASELINES) if b in runs and wide in runs]
    keys = (("nll", "NLL"), ("truth_mae", "abs(p - P)"), ("kl_truth", "KL(P, p)"), ("brier", "Brier"))
    lines = ["| B - A (same cases) | " + " | ".join(n for _, n in keys) + " |", "|---|" + "---|" * len(keys)]
    for a, b in pairs:
        diff = _paired(runs, truth, site, a, b, n_boot)
        cells = [f"{diff[k][0]:+.4f} [{diff[k][1]:+.4f}, {diff[k][2]:+.4f}]" for k, _ in keys]
        lines.append(f"| {b} - {a} | " + " | ".join(cells) + " |")
    return lines


def _shift_lines(runs, truth) -> list[str]:
    """Site-B detection by uncertainty and the error removed by referring 20% of site B."""
    from model import metrics

    ya, yb, tb = truth["labels_A"], truth["labels_B"], truth["truth_B"]
    is_b = np.r_[np.zeros(ya.size), np.ones(yb.size)]
    rate = SHIFT_REFERRAL
    head = ("| Method | AUROC B vs A: mutual information | AUROC B vs A: entropy | kept abs(p - P), refer by MI | "
            "refer by entropy | refer highest p | refer at random | no referral |")
    lines = [head, "|---|" + "---|" * 7]
    for name, seeds in runs.items():
        cells: dict[str, list[float]] = {}
        for r in seeds:
            pa, pb = r["probs_A"], r["probs_B"]
            both = np.concatenate([pa, pb])
            mi, ent = metrics.mutual_information(both), metrics.predictive_entropy(both)
            sampled = pb.shape[1] > 1  # one sample per case has no mutual information (it is 0)
            cells.setdefault("auc_mi", []).append(metrics.auc_roc(mi, is_b) if sampled else float("nan"))
            cells.setdefault("auc_ent", []).append(metrics.auc_roc(ent, is_b))
            p = pb.mean(axis=1)
            sel = metrics.selective_vs_truth(p, yb, tb, {"mi": metrics.mutual_information(pb),
                                                         "entropy": metrics.predictive_entropy(pb)},
                                             referral_rates=(0.0, rate))
            for key in ("mi", "entropy", "risk", "random"):
                value = sel[key][1]["mae_truth"]
                cells.setdefault(key, []).append(value if sampled or key != "mi" else float("nan"))
            cells.setdefault("none", []).append(sel["risk"][0]["mae_truth"])
        order = ("auc_mi", "auc_ent", "mi", "entropy", "risk", "random", "none")
        lines.append(f"| {name} | " + " | ".join(_fmt(*_mean_sem(cells[k])) for k in order) + " |")
    return lines


def total_seconds(runs: dict[str, list[dict]]) -> float:
    """Training / fitting seconds summed over every saved run, each deterministic run once."""
    # The deep ensembles' members are every deterministic run (the first ones are also the
    # deterministic rows), so count those through the ensembles when there are any.
    skip = "deterministic" if DEEP_ENSEMBLE in runs else None
    return float(sum(float(r.get("seconds", 0.0)) for name, seeds in runs.items() if name != skip
                     for r in seeds))


def report(args: argparse.Namespace, work: pathlib.Path, command: str, seconds: float) -> str:
    """The markdown section: in-distribution, paired and site-shift tables."""
    from bench.report import machine_info

    runs, truth = load_predictions(work / "preds")
    scale = SCALES[args.scale]
    n_a, n_b = truth["labels_A"].size, truth.get("labels_B", np.empty(0)).size
    lines = [f"## Method comparison against the known truth ({args.scale} scale)", "",
             f"Command (repo root): `{command}`", "",
             f"Releases: site A `ehr-pipeline synth --patients {scale['releases']['A'][0]} --seed "
             f"{scale['releases']['A'][1]}`" + (f", site B `--site B --patients {scale['releases']['B'][0]} --seed "
                                                 f"{scale['releases']['B'][1]}`" if n_b else "")
             + f"; every model trained on site A's training split, the checkpoint with the best validation NLL "
             f"kept; test splits: site A n = {n_a} ({int(truth['labels_A'].sum())} deaths)"
             + (f", site B n = {n_b} ({int(truth['labels_B'].sum())} deaths)" if n_b else "") + ".",
             f"Mean +- SEM over {args.seeds} seeds; S = {args.samples} samples per member for the Bayesian methods "
             "(1 for deterministic members); abs(p - P) is the mean absolute error of the predictive mean against the "
             "true P_DEATH, KL(P, p) the mean KL divergence from the true Bernoulli (the expected excess NLL); "
             "cov X% is the fraction of cases whose P_DEATH lies in the central X% interval of the S x K sampled "
             f"probabilities (n/a for one sample). A deep ensemble combines {ENSEMBLE_SIZE} deterministic runs of "
             "disjoint seeds; the scikit-learn fits are deterministic, so they are fitted once. rank1_normal_wide "
             "adds a linear part on the admission window's aggregates trained with the LSTM, rank1_normal_laplace "
             "that part fitted first as the logistic regression with its Laplace posterior (docs/model.md). "
             "Training and "
             f"fitting took {total_seconds(runs) / 60:.0f} CPU-shared minutes summed over runs (train s per run in "
             f"the tables; the grid's last invocation ran {seconds / 60:.1f} min).", "",
             "### Site A (in distribution)", "", *_table(runs, truth, "A"), "",
             "Paired differences on site A's test cases (per-case losses averaged over seeds; 95% bootstrap "
             "interval over cases):", "", *_paired_lines(runs, truth, "A", args.n_bootstrap)]
    if n_b:
        lines += ["", "### Site B (dataset shift), models trained at site A", "", *_table(runs, truth, "B"), "",
                  "Paired differences on site B's test cases:", "", *_paired_lines(runs, truth, "B", args.n_bootstrap),
                  "", f"Uncertainty under the shift: how well each measure separates site-B from site-A test cases "
                  f"(AUROC), and the mean abs(p - P) of the site-B cases kept after referring {SHIFT_REFERRAL:.0%} of "
                  "them by each rule:", "", *_shift_lines(runs, truth)]
    lines += ["", "Machine:", "", machine_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Trains the grid (unless --report-only) and writes the tables; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.report import command_line, write_section
    from ehr_pipeline.cli_args import setup_logging

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
    path = write_section("compare_methods", markdown, args.out)
    print(markdown)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
