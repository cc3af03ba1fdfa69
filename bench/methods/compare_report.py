"""The method comparison's tables (docs/results.md), recomputed from the saved per-case
predictions (WORK/preds/*.npz) that bench/methods/compare_methods.py writes: scores per method and site,
paired differences, uncertainty under the site shift and the harmonisation of units.
"""
from __future__ import annotations

import argparse
import math
import pathlib

import numpy as np

from bench.methods.compare_setup import (BASELINES, BELLA_METHODS, DEEP_ENSEMBLE, ENSEMBLE_SIZE, METHODS, RAW, SCALES, SHIFTED,
                                 WELL_SPECIFIED, split_names)
from model.evaluation.statistics.against_truth import design_coefficients

# The truth's own row; the coverage columns' interval levels; the share of site B referred.
TRUTH = "truth (P_DEATH)"
LEVELS = (0.5, 0.8, 0.95)
SHIFT_REFERRAL = 0.2


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
    from model.evaluation.statistics import against_truth

    p = probs.mean(axis=1)
    return {"nll": _nll_cases(p, y),
            "brier": (p - y) ** 2, "truth_mae": np.abs(p - truth), "kl_truth": against_truth.kl_bernoulli(truth, p)}


def _nll_cases(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    from model.evaluation.statistics.metrics import EPS

    q = np.clip(p, EPS, 1.0 - EPS)
    return -(y * np.log(q) + (1 - y) * np.log1p(-q))


def _scores(probs: np.ndarray, y: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    from model.evaluation.statistics import against_truth, metrics

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
    from model.evaluation.statistics import against_truth, metrics

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


# Where the temporal truth's trajectory terms carry signal: a trend term of at least this many
# logit units (|10 x creatinine_trend| >= 1, about a 2.7-fold change of the odds).
STRONG_TREND_LOGIT = 1.0


def trajectory_lines(runs, truth: dict[str, np.ndarray], designs: dict[str, np.ndarray],
                     coefficients: tuple[float, float]) -> list[str]:
    """Which trajectory term each method follows: its logit regressed on the truth's design, and abs(p - P) by group.

    designs: test split 'A0', ... -> [N, terms] (the truth's linear terms, then creatinine_trend and
    the readmission term), rows in the split's case order; coefficients: the truth's two trajectory ones.
    """
    head = ("| Method | coef. of trend (truth " f"{coefficients[0]:g}) | coef. of readmission (truth {coefficients[1]:g}) "
            "| abs(p - P), strong trend | abs(p - P), weak / no trend, first admission | abs(p - P), readmission |")
    lines = [head, "|---|---|---|---|---|---|"]
    rows = {**{name: seeds for name, seeds in runs.items()}, TRUTH: [{"seed": s} for s in _seeds(runs)]}
    for name, seeds in rows.items():
        cells: dict[str, list[float]] = {}
        for run in seeds:
            key = f"A{run['seed']}"
            if key not in designs or (name != TRUTH and "probs_A" not in run):
                continue
            x, t = designs[key], truth[f"truth_{key}"]
            p = t if name == TRUTH else run["probs_A"].mean(axis=1)
            beta = design_coefficients(p, x)
            strong = np.abs(coefficients[0] * x[:, -2]) >= STRONG_TREND_LOGIT
            readmission = x[:, -1] != 0.0
            err = np.abs(p - t)
            for col, value in (("trend", beta[-2]), ("readm", beta[-1]), ("strong", err[strong].mean()),
                               ("weak", err[~strong & ~readmission].mean()), ("readm_err", err[readmission].mean())):
                cells.setdefault(col, []).append(float(value))
        if cells:
            lines.append(f"| {name} | " + " | ".join(_fmt(*_mean_sem(cells[c]), digits=3 if c in ("trend", "readm")
                                                          else 4) for c in ("trend", "readm", "strong", "weak",
                                                                            "readm_err")) + " |")
    return lines


def total_seconds(runs: dict[str, list[dict]]) -> float:
    """Training / fitting seconds summed over every saved run, each deterministic run once."""
    # The deep ensembles' members are every deterministic run (the first ones are also the
    # deterministic rows), so count those through the ensembles when there are any.
    skip = "deterministic" if DEEP_ENSEMBLE in runs else None
    return float(sum(float(r.get("seconds", 0.0)) for name, seeds in runs.items() if name != skip
                     for r in seeds))


def _release_text(scale: dict, site: str, truth: dict[str, np.ndarray], names: list[str],
                  family: str = "linear") -> str:
    patients, seeds = scale["releases"][site]
    flag = ("" if site == "A" else f" --site {site}") + ("" if family == "linear" else f" --truth {family}")
    sizes = ", ".join(f"{truth[f'labels_{n}'].size}" for n in names if f"labels_{n}" in truth)
    deaths = ", ".join(f"{int(truth[f'labels_{n}'].sum())}" for n in names if f"labels_{n}" in truth)
    return (f"site {site} `ehr-pipeline synth{flag} --patients {patients} --seed "
            f"{' / '.join(str(s) for s in seeds[:len(names)])}` (test n = {sizes}; deaths {deaths})")


def report(args: argparse.Namespace, work: pathlib.Path, command: str, seconds: float,
           trajectory: tuple[dict[str, np.ndarray], tuple[float, float]] | None = None) -> str:
    """The markdown section: in-distribution, paired and site-shift tables (trajectory: the temporal truth's terms)."""
    from bench.harness import machine_info

    runs, truth = load_predictions(work / "preds")
    scale = SCALES[args.scale]
    n_seeds = len(_seeds(runs))
    sites = {"A": [f"A{i}" for i in range(n_seeds)]}
    for site in SHIFTED:
        if _releases(truth, site):
            sites[site] = split_names(site, _releases(truth, site))
    family = getattr(args, "truth", "linear")
    title = "" if family == "linear" else f", {family} truth"
    lines = [f"## Method comparison against the known truth ({args.scale} scale{title})", "",
             f"Command (repo root): `{command}`", "",
             "Releases: " + "; ".join(_release_text(scale, site, truth, names, family) for site, names in sites.items())
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
    if trajectory is not None:
        lines += ["", "Which trajectory term each model follows (site A test cases, mean +- SEM over seeds): each "
                  "model's logit(p) regressed by least squares on the truth's own design (its linear terms, the "
                  "course's creatinine trend in ln(mg/dL) per week and ln(244 / days since the previous discharge)), "
                  "and abs(p - P) in three groups: a strong trend term (|coef. x trend| >= "
                  f"{STRONG_TREND_LOGIT:g} logit), first admissions without one, and readmissions.", "",
                  *trajectory_lines(runs, truth, *trajectory)]
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
