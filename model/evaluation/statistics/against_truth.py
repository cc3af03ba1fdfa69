"""Predictions against a known truth: the true probability of death a synthetic release knows.

``truth`` holds each case's true probability, shape [N] (``probs``, ``p`` and ``y`` as in
model.evaluation.statistics.metrics). These functions ask whether the uncertainty tracks the error that
matters, |p - truth|, instead of the label noise every model shares.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from model.export_layout import UNCERTAINTY_MEASURES
from model.evaluation.statistics.metrics import (EPS, REFERRAL_RATES, as_labels, as_matrix, bootstrap_interval,
                                      as_pair, auc_roc, ece, expected_entropy, member_disagreement, nll,
                                      refer, referral_count, referral_threshold, tie_groups, uncertainties)

# Central intervals of the M sampled probabilities whose coverage of the truth is reported.
COVERAGE_LEVELS: tuple[float, ...] = (0.5, 0.8, 0.95)
# Every per-case uncertainty measure correlated with |p - truth| (keys of all_uncertainties).
TRUTH_MEASURES: tuple[str, ...] = ("predictive_entropy", "mutual_information", "expected_entropy",
                                   "predictive_std", "interval_width_95", "member_disagreement")
# Referral baselines beside the uncertainty measures: the highest predicted risk first, a
# random order (averaged over draws), and the oracle that refers the largest |p - truth| first.
# Referring by "closeness to 0.5" needs no row of its own: predictive entropy is a decreasing
# function of |p - 0.5|, so it refers exactly those cases.
REFERRAL_BASELINES: tuple[str, ...] = ("risk", "random", "oracle")


def sample_interval(probs, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Central `level` interval of each row's M sampled probabilities (linear-interpolated quantiles), [N] each."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level must lie in (0, 1), got {level}")
    lower, upper = np.quantile(as_matrix(probs), [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=1)
    return lower, upper


def interval_coverage(probs, truth, levels: Sequence[float] = COVERAGE_LEVELS) -> dict[str, float]:
    """Fraction of cases whose true probability lies in the central interval, per level ("0.95": ...).

    NaN when M = 1: a single sample gives a zero-width interval, which covers nothing by design.
    """
    probs = as_matrix(probs)
    truth = as_truth(truth, probs.shape[0])
    out = {}
    for level in levels:
        lower, upper = sample_interval(probs, level)
        out[f"{level:g}"] = float("nan") if probs.shape[1] == 1 else float(np.mean((lower <= truth) & (truth <= upper)))
    return out


def all_uncertainties(probs, K: int, S: int) -> dict[str, np.ndarray]:
    """Every per-case uncertainty measure of TRUTH_MEASURES, shape [N] each."""
    lower, upper = sample_interval(probs, 0.95)
    return {
        **uncertainties(probs),
        "expected_entropy": expected_entropy(probs),
        "interval_width_95": upper - lower,
        "member_disagreement": member_disagreement(probs, K, S),
    }


def as_truth(truth, n: int) -> np.ndarray:
    """Validated true probabilities, shape [n]."""
    truth = np.asarray(truth, dtype=np.float64)
    if truth.shape != (n,):
        raise ValueError(f"truth has shape {truth.shape}, expected ({n},)")
    if np.any((truth < 0) | (truth > 1)) or np.any(np.isnan(truth)):
        raise ValueError("truth must lie in [0, 1]")
    return truth


def rank(a) -> np.ndarray:
    """1-based ranks along the last axis, ties given their average rank (scipy.stats.rankdata's default)."""
    a = np.asarray(a, dtype=np.float64)
    order = np.argsort(a, axis=-1, kind="stable")
    first, last = tie_groups(np.take_along_axis(a, order, axis=-1))
    ranks = np.empty_like(a)
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=-1)
    return ranks


def spearman(a, b) -> float:
    """Spearman rank correlation of two [N] vectors (Pearson on tie-averaged ranks); NaN if either is constant."""
    ra, rb = rank(a), rank(b)
    if ra.shape != rb.shape or ra.ndim != 1:
        raise ValueError(f"need two vectors of one length, got {ra.shape} and {rb.shape}")
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def uncertainty_error_correlation(p, truth, measures: Mapping[str, np.ndarray],
                                  num_groups: int = 10) -> dict[str, dict[str, Any]]:
    """Spearman correlation of each measure with |p - truth|: overall and within equal-count groups of p.

    "within_p_groups" averages the per-group correlations (groups where a measure is constant
    are left out): every measure grows with p(1 - p), and so does the size of the error, so
    only the within-group number says whether a measure knows *which* of two cases with the
    same p is wrong.
    """
    p = np.asarray(p, dtype=np.float64)
    error = np.abs(p - as_truth(truth, p.shape[0]))
    groups = [g for g in np.array_split(np.argsort(p, kind="stable"), min(num_groups, p.size)) if g.size > 2]
    out = {}
    for name, u in measures.items():
        u = np.asarray(u, dtype=np.float64)
        per_group = np.array([spearman(u[g], error[g]) for g in groups])
        finite = per_group[np.isfinite(per_group)]
        out[name] = {"overall": spearman(u, error),
                     "within_p_groups": float(finite.mean()) if finite.size else float("nan"),
                     "per_group": per_group.tolist()}
    return out


def kl_bernoulli(truth, p, eps: float = EPS) -> np.ndarray:
    """KL(Bernoulli(truth) || Bernoulli(p)) per case, nats: the expected excess NLL of p over the truth."""
    t = np.asarray(truth, dtype=np.float64)
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1.0 - eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = np.where(t > 0, t * (np.log(t) - np.log(q)), 0.0)
        neg = np.where(t < 1, (1.0 - t) * (np.log1p(-t) - np.log1p(-q)), 0.0)
    return pos + neg


def _kept_vs_truth(p, y, truth, keep) -> dict[str, float]:
    """Error vs truth and label metrics of the kept cases."""
    if not keep.any():
        return {"mae_truth": float("nan"), "kl_truth": float("nan"), "nll": float("nan"), "auc_roc": float("nan")}
    return {"mae_truth": float(np.mean(np.abs(p[keep] - truth[keep]))),
            "kl_truth": float(np.mean(kl_bernoulli(truth[keep], p[keep]))),
            "nll": float(nll(p[keep], y[keep])), "auc_roc": float(auc_roc(p[keep], y[keep]))}


def selective_vs_truth(p, y, truth, scores: Mapping[str, np.ndarray],
                       referral_rates: Sequence[float] = REFERRAL_RATES, n_random: int = 100,
                       seed: int = 0) -> dict[str, list[dict[str, float]]]:
    """Per referral score and rate, the kept cases' mean |p - truth|, mean KL to the truth, NLL and AUC-ROC.

    Each score in ``scores`` refers its highest values first by the deployment rule
    (referral_threshold on these cases, ties kept); REFERRAL_BASELINES are added: "risk"
    (highest p first), "random" (metrics averaged over ``n_random`` random orders) and
    "oracle" (largest |p - truth| first, the best any measure could do).
    """
    p, y = as_pair(p, y)
    truth = as_truth(truth, p.shape[0])
    all_scores = {**scores, "risk": p, "oracle": np.abs(p - truth)}
    out: dict[str, list[dict[str, float]]] = {}
    for name, score in all_scores.items():
        score = np.asarray(score, dtype=np.float64)
        rows = []
        for rate in referral_rates:
            keep = ~refer(score, referral_threshold(score, rate))
            rows.append({"referral_rate": float(rate), "coverage": float(keep.mean()), "n_kept": int(keep.sum()),
                         **_kept_vs_truth(p, y, truth, keep)})
        out[name] = rows
    rng = np.random.default_rng(seed)
    random_rows = []
    for rate in referral_rates:
        k = referral_count(rate, p.size)
        draws = []
        for _ in range(n_random):
            keep = np.ones(p.size, dtype=bool)
            keep[rng.permutation(p.size)[:k]] = False
            draws.append(_kept_vs_truth(p, y, truth, keep))
        row = {"referral_rate": float(rate), "coverage": (p.size - k) / p.size, "n_kept": p.size - k}
        row.update({key: float(np.nanmean([d[key] for d in draws])) for key in draws[0]})
        random_rows.append(row)
    out["random"] = random_rows
    return out


def truth_report(probs, y, truth, K: int, S: int, *, referral_rates: Sequence[float] = REFERRAL_RATES,
                 levels: Sequence[float] = COVERAGE_LEVELS, num_groups: int = 10, seed: int = 0) -> dict[str, Any]:
    """Everything measured against a known truth: error, coverage, uncertainty-error correlation, referral."""
    probs = as_matrix(probs)
    y = as_labels(y)
    truth = as_truth(truth, probs.shape[0])
    p = probs.mean(axis=1)
    nll_truth = float(nll(truth, y))
    measures = all_uncertainties(probs, K, S)
    return {
        "mae": float(np.mean(np.abs(p - truth))),
        "rmse": float(np.sqrt(np.mean((p - truth) ** 2))),
        # The NLL the true probabilities score on these labels: no model can expect to beat it.
        "nll_truth": nll_truth,
        "nll_excess": float(nll(p, y)) - nll_truth,
        "kl_truth": float(np.mean(kl_bernoulli(truth, p))),
        "auc_roc_truth": float(auc_roc(truth, y)),
        "ece_truth": float(ece(truth, y)),
        "coverage": interval_coverage(probs, truth, levels),
        "uncertainty_vs_error": uncertainty_error_correlation(p, truth, measures, num_groups),
        "selective": selective_vs_truth(p, y, truth, {name: measures[name] for name in UNCERTAINTY_MEASURES},
                                        referral_rates, seed=seed),
    }



# A truth change counts as "large" in the counterfactual's sign agreement from this many logit units
# (a factor e on the odds): smaller ones are within what a model's noise may flip.
LARGE_TRUTH_CHANGE = 1.0


def counterfactual_response(model_before, model_after, truth_before, truth_after, *,
                            large: float = LARGE_TRUTH_CHANGE, n_bootstrap: int = 1000, alpha: float = 0.05,
                            seed: int = 0) -> dict[str, Any]:
    """How a model's logit follows the truth's when the trajectories change: all inputs logits [N] of the same cases.

    slope: least-squares slope (with intercept) of the model's logit change on the truth's, with a
    case-bootstrap (1 - alpha) interval; 1 means the model moves as the truth does, 0 not at all.
    sign_agreement: the share of the cases with |truth change| >= large whose model change has the
    truth change's sign, a model change of exactly 0 counting half (0.5 is a coin, or a model that
    cannot see the change, such as one on window aggregates). mean_abs_dp / truth_mean_abs_dp: mean |change of the
    probability| of the model and of the truth. Cases whose truth does not change count in the slope
    (they pin the intercept) and in neither share.
    """
    logits = [np.asarray(x, np.float64) for x in (model_before, model_after, truth_before, truth_after)]
    if len({x.shape for x in logits}) != 1 or logits[0].ndim != 1:
        raise ValueError(f"model and truth logits must be [N] alike, got {[x.shape for x in logits]}")
    model_before, model_after, truth_before, truth_after = logits
    dm, dt = model_after - model_before, truth_after - truth_before

    def slope(rows: np.ndarray) -> float:
        x, y = dt[rows], dm[rows]
        dx = x - x.mean()
        sxx = float(dx @ dx)
        return float(dx @ (y - y.mean())) / sxx if sxx > 0 else float("nan")

    n = dt.size
    everything = np.arange(n)
    rng = np.random.default_rng(seed)
    replicates = [slope(rng.integers(0, n, n)) for _ in range(n_bootstrap)]
    estimate = slope(everything)
    interval = bootstrap_interval(replicates, estimate, alpha)
    big = np.abs(dt) >= large
    moved = dt != 0
    dp_model = np.abs(_sigmoid(model_after) - _sigmoid(model_before))
    dp_truth = np.abs(_sigmoid(truth_after) - _sigmoid(truth_before))
    return {"n": int(n), "n_changed": int(moved.sum()), "slope": estimate, "slope_lower": interval["lower"],
            "slope_upper": interval["upper"], "n_large": int(big.sum()),
            "sign_agreement": _sign_agreement(dm[big], dt[big]) if big.any() else float("nan"),
            "mean_abs_dp": float(dp_model[moved].mean()) if moved.any() else float("nan"),
            "truth_mean_abs_dp": float(dp_truth[moved].mean()) if moved.any() else float("nan")}


def _sign_agreement(model_change: np.ndarray, truth_change: np.ndarray) -> float:
    """Share of the cases where the model moves the truth's way; a model that does not move counts half (a coin)."""
    same = np.sign(model_change) == np.sign(truth_change)
    still = model_change == 0
    return float(np.mean(np.where(still, 0.5, same.astype(np.float64))))


def _sigmoid(logit) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(logit, np.float64)))


def uncertainty_where_decided(uncertainty, decided, undecided, *, n_bootstrap: int = 1000, alpha: float = 0.05,
                              seed: int = 0) -> dict[str, Any]:
    """Mean uncertainty where the trajectory decides the truth minus where it does not, with a bootstrap interval.

    uncertainty: one score per case [N] (mutual information, interval width, ...); decided / undecided:
    bool masks [N] of two disjoint groups of the same test cases (e.g. the largest and the smallest
    |trajectory terms| of the truth's logit). Cases are resampled together, so the interval of the
    difference holds whatever the two groups share (the same model, the same release). A posterior
    that knows what it has not learned has difference > 0.
    """
    u = np.asarray(uncertainty, np.float64)
    a, b = np.asarray(decided, bool), np.asarray(undecided, bool)
    if not (u.shape == a.shape == b.shape) or u.ndim != 1:
        raise ValueError(f"uncertainty and masks must be [N] alike, got {u.shape}, {a.shape}, {b.shape}")
    if (a & b).any():
        raise ValueError("the decided and undecided groups overlap")
    if not a.any() or not b.any():
        raise ValueError("each group needs at least one case")

    def difference(rows: np.ndarray) -> float:
        ra, rb = a[rows], b[rows]
        if not ra.any() or not rb.any():
            return float("nan")
        return float(u[rows][ra].mean() - u[rows][rb].mean())

    n = u.size
    rng = np.random.default_rng(seed)
    replicates = [difference(rng.integers(0, n, n)) for _ in range(n_bootstrap)]
    estimate = difference(np.arange(n))
    interval = bootstrap_interval(replicates, estimate, alpha)
    return {"decided_mean": float(u[a].mean()), "undecided_mean": float(u[b].mean()), "difference": estimate,
            "lower": interval["lower"], "upper": interval["upper"], "n_decided": int(a.sum()),
            "n_undecided": int(b.sum()), "ratio": float(u[a].mean() / u[b].mean()) if u[b].mean() > 0 else float("nan")}


def design_coefficients(p, design) -> np.ndarray:
    """Least-squares coefficients of logit(p) [N] on [1, design [N, T]]: [T + 1], the intercept first.

    Regressed on the truth's own design, a model's coefficient of a term says how much of that term
    its logit carries (the truth's own coefficient when all of it; 0 when none).
    """
    x = np.asarray(design, np.float64)
    q = np.clip(np.asarray(p, np.float64), EPS, 1.0 - EPS)
    if x.ndim != 2 or q.shape != (x.shape[0],):
        raise ValueError(f"expected p [N] and design [N, T], got {q.shape} and {x.shape}")
    return np.linalg.lstsq(np.column_stack([np.ones(len(x)), x]), np.log(q) - np.log1p(-q), rcond=None)[0]


def carried_coefficients(p, design, columns: Sequence[int], *, n_bootstrap: int = 1000, alpha: float = 0.05,
                         seed: int = 0) -> list[dict[str, float]]:
    """design_coefficients of the given design columns, each with a case-bootstrap (1 - alpha) interval."""
    q, x = np.asarray(p, np.float64), np.asarray(design, np.float64)
    picks = [c + 1 for c in columns]  # after the intercept
    estimate = design_coefficients(q, x)[picks]
    rng = np.random.default_rng(seed)
    n = len(q)
    replicates = np.array([design_coefficients(q[rows], x[rows])[picks]
                           for rows in (rng.integers(0, n, n) for _ in range(n_bootstrap))])
    out = []
    for j, value in enumerate(estimate):
        interval = bootstrap_interval(replicates[:, j], float(value), alpha)
        out.append({"estimate": float(value), "lower": interval["lower"], "upper": interval["upper"]})
    return out


def truth_error(p, truth, *, reference=None, n_bootstrap: int = 1000, alpha: float = 0.05,
                seed: int = 0) -> dict[str, float]:
    """Mean |p - truth| over the cases with a case-bootstrap interval; with `reference` [N] also the paired difference.

    difference: mean |p - truth| - mean |reference - truth| on the same cases (< 0: p is closer to
    the truth), its interval from the same resamples.
    """
    p = np.asarray(p, np.float64)
    if reference is not None and np.shape(reference) != p.shape:
        raise ValueError(f"p and reference must be [N] alike, got {p.shape} and {np.shape(reference)}")
    err = np.abs(p - as_truth(truth, len(p)))
    ref = None if reference is None else np.abs(np.asarray(reference, np.float64) - as_truth(truth, len(p)))
    rng = np.random.default_rng(seed)
    n = err.size
    draws = [rng.integers(0, n, n) for _ in range(n_bootstrap)]
    out = {"mean": float(err.mean()), **_interval([err[r].mean() for r in draws], float(err.mean()), alpha, "")}
    if ref is not None:
        diff = err - ref
        out.update({"difference": float(diff.mean()),
                    **_interval([diff[r].mean() for r in draws], float(diff.mean()), alpha, "difference_")})
    return out


def _interval(replicates, estimate: float, alpha: float, prefix: str) -> dict[str, float]:
    interval = bootstrap_interval(replicates, estimate, alpha)
    return {f"{prefix}lower": interval["lower"], f"{prefix}upper": interval["upper"]}
