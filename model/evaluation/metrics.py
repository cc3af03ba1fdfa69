"""Every evaluation number of ehr-uncertainty, in one place, as pure numpy functions.

The trainer, the evaluator, the benchmarks and the service all import from here, so a metric
means the same thing wherever it is reported.

Conventions shared by the whole module:

* ``probs`` holds the model's per-sample probabilities of the positive class (death), shape
  ``[N, M]`` with ``M = S * K``: S Monte-Carlo samples of the rank-1 factors for each of K
  ensemble members, laid out **sample-major**: column ``m = s * K + k`` is sample ``s`` of
  member ``k``, so ``probs.reshape(N, S, K)`` recovers the samples.
* ``p`` is one probability per example (usually the predictive mean), shape ``[N]``.
* ``y`` holds labels in {0, 1}, shape ``[N]``.
* Scalar metrics of ``(p, y)`` reduce over the LAST axis and accept any leading batch axes
  (``p`` and ``y`` of shape ``[B, N]`` give ``[B]`` results); that is what lets
  :func:`bootstrap_ci` score a thousand resamples in one call instead of a Python loop.
* A metric that is undefined on the given labels (an AUC with one class) returns NaN rather
  than raising, because bootstrap resamples and referral subsets hit that case routinely.
* Logarithms are natural, so NLLs and entropies are in nats.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

# Clipping for probability inputs: Keras' backend epsilon, so an NLL computed here from
# saturated float32 probabilities matches the loss Keras reports for the same numbers.
EPS = 1e-7
# The paper (and uncertainty-baselines' ECE) uses 15 equal-width bins.
NUM_BINS = 15
# Referral rates of the paper's selective-prediction tables: 0 % to 50 % in 5 % steps.
REFERRAL_RATES: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(11))
# The scalar metrics reported overall, per member, with bootstrap CIs and per referral rate.
SCALAR_METRICS: tuple[str, ...] = ("auc_pr", "auc_roc", "nll", "ece", "brier", "accuracy")
UNCERTAINTY_MEASURES: tuple[str, ...] = ("predictive_entropy", "mutual_information", "predictive_std")
# Referral measure unless a model's config says otherwise: epistemic uncertainty. Predictive
# entropy is a function of p alone for one model (it refers the cases nearest 0.5, in practice
# the highest-risk ones); mutual information is what the posterior adds. It is 0 for a single
# deterministic model (S = K = 1), whose configs keep predictive entropy.
DEFAULT_REFERRAL_MEASURE = "mutual_information"
# Bootstrap interval per metric where the percentile one is wrong (see bootstrap_interval).
BOOTSTRAP_METHODS: dict[str, tuple[str, tuple[float, float]]] = {"ece": ("basic", (0.0, 1.0))}


# --------------------------------------------------------------------------- validation


def _labels(y) -> np.ndarray:
    """Labels as float64, refusing anything outside {0, 1} (a silent 2 would skew every metric)."""
    y = np.asarray(y, dtype=np.float64)
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    return y


def _pair(p, y) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (probability, label) pair of equal shape and return float64 arrays."""
    p = np.asarray(p, dtype=np.float64)
    y = _labels(y)
    if p.shape != y.shape:
        raise ValueError(f"p has shape {p.shape} but y has shape {y.shape}")
    if p.ndim == 0 or p.shape[-1] == 0:
        raise ValueError("need at least one example")
    return p, y


def _matrix(probs) -> np.ndarray:
    """Validate a [N, M] matrix of per-sample probabilities."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] == 0:
        raise ValueError(f"probs must have shape [N, M] with M >= 1, got {probs.shape}")
    if np.any((probs < 0) | (probs > 1)) or np.any(np.isnan(probs)):
        raise ValueError("probs must lie in [0, 1]")
    return probs


# --------------------------------------------------------------------------- likelihoods


def _log_likelihood(values, y, from_logits: bool, eps: float) -> np.ndarray:
    """log p(y | sample) for every sample, shape [..., N, M]; a [..., N] input counts as M = 1."""
    values = np.asarray(values, dtype=np.float64)
    y = _labels(y)
    if values.ndim == y.ndim:  # one prediction per example: a one-component mixture
        values = values[..., None]
    if values.shape[:-1] != y.shape or values.shape[-1] == 0 or y.size == 0:
        raise ValueError(f"values of shape {values.shape} do not match labels of shape {y.shape}")
    y = y[..., None]
    if from_logits:
        # log sigmoid(+-z) = -softplus(-+z); logaddexp never overflows, so |z| = 1e4 is fine.
        sign = 2.0 * y - 1.0
        return -np.logaddexp(0.0, -sign * values)
    p = np.clip(values, eps, 1.0 - eps)
    return np.where(y == 1.0, np.log(p), np.log1p(-p))


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(a))) along ``axis`` without overflow or total underflow."""
    peak = np.max(a, axis=axis, keepdims=True)
    return np.squeeze(peak, axis=axis) + np.log(np.sum(np.exp(a - peak), axis=axis))


def mixture_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> np.ndarray | float:
    """Mean over examples of -log((1/M) sum_m p(y | m)): the NLL of the model's predictive mixture."""
    # Averaging in log space (logsumexp) keeps the mixture finite even when every component
    # assigns the label a probability below float64's smallest positive number.
    log_lik = _log_likelihood(values, y, from_logits, eps)
    per_example = _logsumexp(log_lik, axis=-1) - np.log(log_lik.shape[-1])
    return -np.mean(per_example, axis=-1)


def per_component_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> np.ndarray | float:
    """Average of the M per-component NLLs: the training loss of the paper (App. D.4)."""
    # Always >= mixture_nll (Jensen); the gap is what ensembling/sampling buys at test time.
    log_lik = _log_likelihood(values, y, from_logits, eps)
    return -np.mean(log_lik, axis=(-2, -1))


def nll(p, y, eps: float = EPS) -> np.ndarray | float:
    """Binary NLL of one probability per example (the mixture NLL with M = 1)."""
    p, y = _pair(p, y)
    return mixture_nll(p, y, eps=eps)


# --------------------------------------------------------------------------- point metrics


def predictive_mean(probs) -> np.ndarray:
    """Predictive probability of the positive class: the mean over all M samples, shape [N]."""
    return _matrix(probs).mean(axis=1)


def brier(p, y) -> np.ndarray | float:
    """Mean squared error (p - y)^2 of the positive-class probability (half the two-class Brier sum)."""
    p, y = _pair(p, y)
    return np.mean((p - y) ** 2, axis=-1)


def accuracy(p, y, threshold: float = 0.5) -> np.ndarray | float:
    """Fraction of correct labels when predicting positive iff p > threshold."""
    # Strict '>' matches the argmax over [1 - p, p] used by uncertainty-baselines, where a tie
    # at p = 0.5 goes to the negative class.
    p, y = _pair(p, y)
    return np.mean((p > threshold) == (y == 1.0), axis=-1)


def _tie_groups(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last position of each element's run of equal values along the last axis."""
    n = sorted_scores.shape[-1]
    pos = np.broadcast_to(np.arange(n), sorted_scores.shape)
    differs = sorted_scores[..., 1:] != sorted_scores[..., :-1]
    true_col = np.ones(sorted_scores.shape[:-1] + (1,), dtype=bool)
    starts = np.concatenate([true_col, differs], axis=-1)
    ends = np.concatenate([differs, true_col], axis=-1)
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=-1)
    last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, pos, n - 1), -1), axis=-1), -1)
    return first, last


def auc_roc(p, y) -> np.ndarray | float:
    """Area under the ROC curve (ties count 1/2), NaN when only one class is present."""
    # Mann-Whitney U with tie-averaged ranks: identical to sklearn's trapezoidal ROC AUC, but
    # vectorised over leading axes for the bootstrap.
    p, y = _pair(p, y)
    order = np.argsort(p, axis=-1, kind="stable")
    s = np.take_along_axis(p, order, axis=-1)
    ys = np.take_along_axis(y, order, axis=-1)
    first, last = _tie_groups(s)
    ranks = (first + last) / 2.0 + 1.0
    n_pos = ys.sum(axis=-1)
    n_neg = ys.shape[-1] - n_pos
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = ((ranks * ys).sum(axis=-1) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)
    return np.where((n_pos > 0) & (n_neg > 0), auc, np.nan)[()]


def auc_pr(p, y) -> np.ndarray | float:
    """Average precision sum_n (R_n - R_{n-1}) P_n over distinct thresholds; NaN without positives."""
    # Average precision rather than trapezoidal PR area: the trapezoid over-states AUC-PR
    # when precision is non-monotone, and AP is what the paper reports.
    p, y = _pair(p, y)
    order = np.argsort(-p, axis=-1, kind="stable")
    s = np.take_along_axis(-p, order, axis=-1)
    ys = np.take_along_axis(y, order, axis=-1)
    _, last = _tie_groups(s)
    true_pos = np.cumsum(ys, axis=-1)
    # Each positive adds 1/P of recall at the threshold that admits its whole tie group, where
    # precision is TP/(rank) counted at the end of that group.
    precision_at_group_end = np.take_along_axis(true_pos, last, axis=-1) / (last + 1.0)
    n_pos = ys.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = (ys * precision_at_group_end).sum(axis=-1) / n_pos
    return np.where(n_pos > 0, ap, np.nan)[()]


def calibration_bins(p, y, num_bins: int = NUM_BINS) -> dict[str, np.ndarray]:
    """Per-bin count, summed confidence and summed correctness behind ece, shape [..., num_bins]."""
    # Top-label convention (see ece): confidence = max(p, 1 - p); bin i covers
    # [i/B, (i+1)/B), the last bin also holds confidence 1.0.
    p, y = _pair(p, y)
    confidence = np.maximum(p, 1.0 - p)
    correct = ((p > 0.5) == (y == 1.0)).astype(np.float64)
    bins = np.clip(np.floor(confidence * num_bins).astype(np.int64), 0, num_bins - 1)
    # One bincount over (row, bin) ids handles any number of leading axes at once.
    lead = p.shape[:-1]
    rows = np.arange(int(np.prod(lead, dtype=np.int64))).reshape(lead + (1,)) * num_bins
    ids = (rows + bins).ravel()
    size = int(np.prod(lead, dtype=np.int64)) * num_bins
    shape = lead + (num_bins,)
    return {
        "count": np.bincount(ids, minlength=size).reshape(shape).astype(np.float64),
        "sum_confidence": np.bincount(ids, confidence.ravel(), minlength=size).reshape(shape),
        "sum_correct": np.bincount(ids, correct.ravel(), minlength=size).reshape(shape),
    }


def ece(p, y, num_bins: int = NUM_BINS) -> np.ndarray | float:
    """Top-label expected calibration error: sum_b (n_b/N) |acc_b - conf_b| over equal-width confidence bins.

    Convention (that of uncertainty-baselines / ``ed.metrics.ExpectedCalibrationError``, which
    the paper used): confidence = max(p, 1 - p), the probability of the predicted label
    (positive iff p > 0.5); ``num_bins`` equal-width bins on [0, 1], bin i = [i/B, (i+1)/B),
    the last closed; acc_b = fraction of correct predictions in the bin. Because confidence is
    >= 0.5, the bins below 0.5 stay empty.
    """
    bins = calibration_bins(p, y, num_bins)
    # sum_b (n_b/N)|acc_b - conf_b| = sum_b |sum_correct_b - sum_conf_b| / N: no empty-bin division.
    gaps = np.abs(bins["sum_correct"] - bins["sum_confidence"]).sum(axis=-1)
    return (gaps / bins["count"].sum(axis=-1))[()]


# --------------------------------------------------------------------------- uncertainty


def bernoulli_entropy(p) -> np.ndarray:
    """Entropy (nats) of Bernoulli(p), with 0 log 0 = 0."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0) + np.where(p < 1, -(1 - p) * np.log1p(-p), 0.0)
    return terms


def predictive_entropy(probs) -> np.ndarray:
    """Total uncertainty H[E_m p_m] per example, shape [N]."""
    return bernoulli_entropy(predictive_mean(probs))


def expected_entropy(probs) -> np.ndarray:
    """Aleatoric uncertainty E_m H[p_m] per example, shape [N]."""
    return bernoulli_entropy(_matrix(probs)).mean(axis=1)


def mutual_information(probs) -> np.ndarray:
    """Epistemic uncertainty H[E p] - E H[p] (mutual information of label and model), shape [N]."""
    # >= 0 by concavity of entropy; the clip only removes float rounding below zero.
    return np.maximum(predictive_entropy(probs) - expected_entropy(probs), 0.0)


def predictive_std(probs) -> np.ndarray:
    """Standard deviation (ddof = 0) of the M sampled probabilities per example, shape [N]."""
    return _matrix(probs).std(axis=1)


def member_means(probs, K: int, S: int) -> np.ndarray:
    """Each member's probability averaged over its S samples, shape [N, K] (sample-major layout)."""
    probs = _matrix(probs)
    if probs.shape[1] != K * S:
        raise ValueError(f"probs has M = {probs.shape[1]} columns, expected K * S = {K * S}")
    return probs.reshape(probs.shape[0], S, K).mean(axis=1)


def member_disagreement(probs, K: int, S: int) -> np.ndarray:
    """Mean |pbar_i - pbar_j| over member pairs i < j of the K member means, shape [N]; 0 if K = 1."""
    # In probability units, unlike a variance, so "members differ by 0.2" reads directly.
    means = member_means(probs, K, S)
    if K < 2:
        return np.zeros(means.shape[0])
    diffs = np.abs(means[:, :, None] - means[:, None, :]).sum(axis=(1, 2)) / 2.0
    return diffs / (K * (K - 1) / 2.0)


def uncertainties(probs) -> dict[str, np.ndarray]:
    """The per-example uncertainty measures used for referral, keyed by UNCERTAINTY_MEASURES."""
    return {
        "predictive_entropy": predictive_entropy(probs),
        "mutual_information": mutual_information(probs),
        "predictive_std": predictive_std(probs),
    }


# --------------------------------------------------------------------------- bootstrap


def bootstrap_ci(
    metric_fn: Callable,
    p,
    y,
    n: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    batched: bool = True,
    method: str = "percentile",
    bounds: tuple[float, float] = (-np.inf, np.inf),
) -> dict[str, float]:
    """Bootstrap (1 - alpha) interval of metric_fn(p, y), resampling examples (axis 0 of p).

    ``batched=True`` requires ``metric_fn`` to reduce over the example axis with leading batch
    axes (every metric here does; for a ``[N, M]`` input it receives ``[B, N, M]``). Resamples
    where the metric is undefined (e.g. an AUC on one class) are dropped; ``n_valid`` counts
    the rest. ``method``: "percentile" or "basic" (see :func:`bootstrap_interval`); the
    result also holds ``bias_corrected``, 2 * estimate - median(resamples), which always lies
    inside the basic interval.
    """
    p = np.asarray(p, dtype=np.float64)
    y = _labels(y)
    n_examples = y.shape[0]
    if y.ndim != 1 or p.shape[0] != n_examples:
        raise ValueError("p must have the examples on axis 0 and y shape [N]")
    rng = np.random.default_rng(seed)
    estimate = float(metric_fn(p, y))
    if batched:
        # Resample in chunks of ~4M numbers so 1000 resamples of a large test set fit in memory.
        chunk = max(1, 4_000_000 // max(p.size, 1))
        values = []
        for start in range(0, n, chunk):
            idx = rng.integers(0, n_examples, size=(min(chunk, n - start), n_examples))
            values.append(np.asarray(metric_fn(p[idx], y[idx]), dtype=np.float64).reshape(-1))
        values = np.concatenate(values) if values else np.empty(0)
    else:
        values = np.array(
            [metric_fn(p[i], y[i]) for i in (rng.integers(0, n_examples, n_examples) for _ in range(n))],
            dtype=np.float64,
        )
    return {"estimate": estimate, **bootstrap_interval(values, estimate, alpha, method, bounds)}


def bootstrap_interval(values, estimate: float, alpha: float = 0.05, method: str = "percentile",
                       bounds: tuple[float, float] = (-np.inf, np.inf)) -> dict[str, float]:
    """(1 - alpha) interval from bootstrap replicates of a statistic; non-finite replicates are dropped.

    "percentile": the alpha/2 and 1 - alpha/2 quantiles q_lo, q_hi of the replicates. Right for
    statistics whose plug-in value is about unbiased (AUC, NLL, Brier). "basic" (reverse
    percentile): [2 * estimate - q_hi, 2 * estimate - q_lo]. Right for a statistic with a bias
    the bootstrap reproduces, such as ECE: each bin's |acc - conf| only grows with sampling
    noise, a resample adds its own noise on top, so the replicates sit above the estimate as
    the estimate sits above the population value; the percentile interval then misses the
    population ECE of a calibrated model almost always, and can exclude the estimate itself.
    Both ends are clipped to ``bounds`` (ECE >= 0).
    """
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    nan = float("nan")
    if values.size == 0 or not np.isfinite(estimate):
        return {"lower": nan, "upper": nan, "bias_corrected": nan, "n_valid": int(values.size)}
    q_lo, median, q_hi = (float(v) for v in np.quantile(values, [alpha / 2.0, 0.5, 1.0 - alpha / 2.0]))
    if method == "percentile":
        lower, upper = q_lo, q_hi
    elif method == "basic":
        lower, upper = 2.0 * estimate - q_hi, 2.0 * estimate - q_lo
    else:
        raise ValueError(f"bootstrap method must be 'percentile' or 'basic', got {method!r}")
    lo, hi = bounds
    return {"lower": float(np.clip(lower, lo, hi)), "upper": float(np.clip(upper, lo, hi)),
            "bias_corrected": float(np.clip(2.0 * estimate - median, lo, hi)), "n_valid": int(values.size)}


# --------------------------------------------------------------------------- referral


def _referral_count(rate: float, n: int) -> int:
    """How many of n cases a referral rate allows; the tolerance stops 0.29 * 100 from giving 28."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"referral rate must lie in [0, 1], got {rate}")
    return min(n, int(np.floor(rate * n + 1e-9)))


def referral_threshold(uncertainty_val, rate: float) -> float:
    """Threshold t (chosen on validation) such that referring uncertainty > t refers at most `rate`.

    t is the (n - k)-th smallest validation uncertainty with k = floor(rate * n), so exactly k
    cases lie strictly above it when there are no ties. Ties at t are KEPT (never referred):
    the referred fraction may fall below ``rate`` but never exceeds it, and a case's fate does
    not depend on its position in the data. rate = 0 gives max(u) (refer none); a rate that
    admits all n cases gives -inf (refer all).
    """
    u = np.asarray(uncertainty_val, dtype=np.float64).ravel()
    if u.size == 0 or np.any(np.isnan(u)):
        raise ValueError("need a non-empty uncertainty vector without NaN")
    k = _referral_count(rate, u.size)
    if k == u.size:
        return float("-inf")
    return float(np.sort(u)[u.size - k - 1])


def refer(uncertainty, threshold: float) -> np.ndarray:
    """Boolean mask of the cases to refer to a clinician: uncertainty strictly above the threshold."""
    return np.asarray(uncertainty, dtype=np.float64) > threshold


def scalar_metrics(p, y, num_bins: int = NUM_BINS) -> dict[str, float]:
    """AUC-PR, AUC-ROC, NLL, ECE, Brier and accuracy of p (NaN where undefined or empty)."""
    p = np.asarray(p, dtype=np.float64)
    if p.size == 0:
        return {name: float("nan") for name in SCALAR_METRICS}
    return {
        "auc_pr": float(auc_pr(p, y)),
        "auc_roc": float(auc_roc(p, y)),
        "nll": float(nll(p, y)),
        "ece": float(ece(p, y, num_bins)),
        "brier": float(brier(p, y)),
        "accuracy": float(accuracy(p, y)),
    }


def selective_prediction(
    p_mean,
    y,
    uncertainty,
    referral_rates: Sequence[float] = REFERRAL_RATES,
    num_bins: int = NUM_BINS,
) -> list[dict[str, float]]:
    """Risk-coverage table: per referral rate, the scalar metrics on the cases that are not referred.

    Referral uses the same rule as deployment: threshold = referral_threshold(uncertainty,
    rate) on these cases, refer uncertainty > threshold; each row reports the realised
    ``coverage`` (kept fraction) and ``n_kept``.
    """
    p, y = _pair(p_mean, y)
    u = np.asarray(uncertainty, dtype=np.float64)
    if p.ndim != 1 or u.shape != p.shape:
        raise ValueError("p_mean, y and uncertainty must all have shape [N]")
    rows = []
    for rate in referral_rates:
        keep = ~refer(u, referral_threshold(u, rate))
        row = {"referral_rate": float(rate), "coverage": float(keep.mean()), "n_kept": int(keep.sum())}
        row.update(scalar_metrics(p[keep], y[keep], num_bins))
        rows.append(row)
    return rows


def error_by_uncertainty(p_mean, y, uncertainty, num_bins: int = 10) -> dict[str, np.ndarray]:
    """Error rate and mean NLL within equal-count uncertainty bins (for uncertainty-vs-error plots)."""
    # Equal-count (quantile) bins: uncertainties pile up near zero, so equal-width bins would
    # leave most of them empty.
    p, y = _pair(p_mean, y)
    u = np.asarray(uncertainty, dtype=np.float64)
    order = np.argsort(u, kind="stable")
    groups = [g for g in np.array_split(order, min(num_bins, u.size)) if g.size]
    return {
        "mean_uncertainty": np.array([u[g].mean() for g in groups]),
        "error_rate": np.array([1.0 - accuracy(p[g], y[g]) for g in groups]),
        "nll": np.array([nll(p[g], y[g]) for g in groups]),
        "count": np.array([g.size for g in groups]),
    }


# --------------------------------------------------------------------------- against a known truth
# A synthetic release knows each case's true probability of death (``truth``, shape [N]). These
# functions ask whether the uncertainty tracks the error that matters, |p - truth|, instead of
# the label noise every model shares.

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
    lower, upper = np.quantile(_matrix(probs), [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=1)
    return lower, upper


def interval_coverage(probs, truth, levels: Sequence[float] = COVERAGE_LEVELS) -> dict[str, float]:
    """Fraction of cases whose true probability lies in the central interval, per level ("0.95": ...).

    NaN when M = 1: a single sample gives a zero-width interval, which covers nothing by design.
    """
    probs = _matrix(probs)
    truth = _truth(truth, probs.shape[0])
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


def _truth(truth, n: int) -> np.ndarray:
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
    first, last = _tie_groups(np.take_along_axis(a, order, axis=-1))
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
    error = np.abs(p - _truth(truth, p.shape[0]))
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
    p, y = _pair(p, y)
    truth = _truth(truth, p.shape[0])
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
        k = _referral_count(rate, p.size)
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
    probs = _matrix(probs)
    y = _labels(y)
    truth = _truth(truth, probs.shape[0])
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


# --------------------------------------------------------------------------- paired comparison

# Metrics of a paired comparison; "truth_mae" (mean |p - truth|) only when the truth is known.
PAIRED_METRICS: tuple[str, ...] = ("nll", "auc_pr", "auc_roc", "ece", "brier", "truth_mae")


def _paired_metrics(p, y, truth, num_bins: int) -> dict[str, np.ndarray]:
    """PAIRED_METRICS of p against (y, truth) with leading batch axes; truth None leaves truth_mae out."""
    out = {"nll": nll(p, y), "auc_pr": auc_pr(p, y), "auc_roc": auc_roc(p, y), "ece": ece(p, y, num_bins),
           "brier": brier(p, y)}
    if truth is not None:
        out["truth_mae"] = np.mean(np.abs(p - truth), axis=-1)
    return out


def paired_bootstrap(p_a, p_b, y, truth=None, *, n: int = 1000, alpha: float = 0.05, seed: int = 0,
                     num_bins: int = NUM_BINS) -> dict[str, dict[str, float]]:
    """Metric(b) - metric(a) on the same cases, with a bootstrap interval from shared resamples.

    Both models are scored on the same resampled cases, so the case-to-case variation they
    share cancels: the interval of the difference is much narrower than two separate
    intervals suggest. Percentile intervals, except "basic" for ECE (see bootstrap_interval).
    Per metric of PAIRED_METRICS: "a", "b", "difference" (b - a), "lower", "upper", "n_valid".
    """
    p_a, y = _pair(p_a, y)
    p_b, _ = _pair(p_b, y)
    if p_a.ndim != 1:
        raise ValueError("p_a, p_b and y must have shape [N]")
    truth = None if truth is None else _truth(truth, y.size)
    full_a = _paired_metrics(p_a, y, truth, num_bins)
    full_b = _paired_metrics(p_b, y, truth, num_bins)
    idx = np.random.default_rng(seed).integers(0, y.size, size=(n, y.size))
    truth_idx = None if truth is None else truth[idx]
    boot_a = _paired_metrics(p_a[idx], y[idx], truth_idx, num_bins)
    boot_b = _paired_metrics(p_b[idx], y[idx], truth_idx, num_bins)
    out = {}
    for name in full_a:
        a, b = float(full_a[name]), float(full_b[name])
        method = "basic" if name == "ece" else "percentile"
        interval = bootstrap_interval(boot_b[name] - boot_a[name], b - a, alpha, method)
        out[name] = {"a": a, "b": b, "difference": b - a, "lower": interval["lower"], "upper": interval["upper"],
                     "n_valid": interval["n_valid"]}
    return out


# --------------------------------------------------------------------------- report


def json_ready(obj: Any) -> Any:
    """Plain Python types for json.dumps(allow_nan=False): numpy scalars unwrapped, NaN/inf -> None."""
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def evaluate(
    probs,
    y,
    K: int,
    S: int,
    truth=None,
    *,
    num_bins: int = NUM_BINS,
    n_bootstrap: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    referral_rates: Sequence[float] = REFERRAL_RATES,
) -> dict:
    """Everything about one [N, M] prediction matrix as one JSON-serialisable dict (undefined -> None)."""
    probs = _matrix(probs)
    y = _labels(y)
    if y.shape != (probs.shape[0],):
        raise ValueError(f"y has shape {y.shape}, expected ({probs.shape[0]},)")
    means = member_means(probs, K, S)
    p = means.mean(axis=1)  # equals predictive_mean(probs): every member has S samples
    overall = scalar_metrics(p, y, num_bins)
    overall["per_component_nll"] = float(per_component_nll(probs, y))
    metric_fns = {
        "auc_pr": auc_pr,
        "auc_roc": auc_roc,
        "nll": nll,
        "ece": lambda q, t: ece(q, t, num_bins),
        "brier": brier,
        "accuracy": accuracy,
    }
    ci = {}
    for name in SCALAR_METRICS:
        method, bounds = BOOTSTRAP_METHODS.get(name, ("percentile", (-np.inf, np.inf)))
        ci[name] = bootstrap_ci(metric_fns[name], p, y, n=n_bootstrap, alpha=alpha, seed=seed, method=method,
                                bounds=bounds)
    measures = uncertainties(probs)
    report = {
        "n": int(y.size),
        "prevalence": float(y.mean()),
        "K": int(K),
        "S": int(S),
        "num_bins": int(num_bins),
        "ci_level": 1.0 - alpha,
        "overall": overall,
        "ci": ci,
        # A member's NLL is that of its own S-sample mixture, i.e. of its member mean.
        "members": [scalar_metrics(means[:, k], y, num_bins) for k in range(K)],
        "uncertainty": {
            "predictive_entropy": float(measures["predictive_entropy"].mean()),
            "expected_entropy": float(expected_entropy(probs).mean()),
            "mutual_information": float(measures["mutual_information"].mean()),
            "predictive_std": float(measures["predictive_std"].mean()),
            "member_disagreement": float(member_disagreement(probs, K, S).mean()),
        },
        "selective": {
            name: selective_prediction(p, y, measures[name], referral_rates, num_bins)
            for name in UNCERTAINTY_MEASURES
        },
    }
    if truth is not None:
        report["truth"] = truth_report(probs, y, truth, K, S, referral_rates=referral_rates, seed=seed)
    return json_ready(report)


def _fmt(value, digits: int = 4) -> str:
    """A number for the table, 'n/a' for None/NaN."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def format_table(metrics: Mapping) -> str:
    """Compact text table of an evaluate() report for the CLI."""
    head = f"n={metrics['n']}  prevalence={_fmt(metrics['prevalence'], 3)}"
    lines = [f"{head}  K={metrics['K']}  S={metrics['S']}"]
    level = int(round(100 * metrics.get("ci_level", 0.95)))
    lines.append(f"{'metric':<18}{'value':>9}  {level}% CI")
    for name, value in metrics["overall"].items():
        ci = metrics.get("ci", {}).get(name)
        interval = f"[{_fmt(ci['lower'])}, {_fmt(ci['upper'])}]" if ci else ""
        lines.append(f"{name:<18}{_fmt(value):>9}  {interval}")
    if metrics.get("members"):
        lines.append("member " + "".join(f"{name:>10}" for name in SCALAR_METRICS))
        for k, row in enumerate(metrics["members"]):
            lines.append(f"{k:<7}" + "".join(f"{_fmt(row[name]):>10}" for name in SCALAR_METRICS))
    if metrics.get("uncertainty"):
        means = metrics["uncertainty"].items()
        lines.append("mean uncertainty: " + "  ".join(f"{k}={_fmt(v)}" for k, v in means))
    if metrics.get("selective"):
        # One line per measure: AUC-PR on the kept cases at each referral rate.
        rates = next(iter(metrics["selective"].values()))
        lines.append(f"{'AUC-PR @ referral':<20}" + "".join(f"{row['referral_rate']:>7.2f}" for row in rates))
        for name, rows in metrics["selective"].items():
            lines.append(f"{name:<20}" + "".join(f"{_fmt(row['auc_pr'], 3):>7}" for row in rows))
    if metrics.get("truth"):
        lines.extend(format_truth(metrics["truth"]))
    return "\n".join(lines)


def format_truth(truth: Mapping) -> list[str]:
    """Lines of a truth_report: error, interval coverage, uncertainty-error correlations, referral vs truth."""
    scalars = {k: v for k, v in truth.items() if not isinstance(v, (Mapping, list))}
    lines = ["vs truth: " + "  ".join(f"{k}={_fmt(v)}" for k, v in scalars.items())]
    lines.append("coverage of truth by central intervals: "
                 + "  ".join(f"{level}={_fmt(v, 3)}" for level, v in truth["coverage"].items()))
    lines.append(f"{'spearman(u, |p - truth|)':<26}{'overall':>9}{'within p deciles':>18}")
    for name, row in truth["uncertainty_vs_error"].items():
        lines.append(f"{name:<26}{_fmt(row['overall'], 3):>9}{_fmt(row['within_p_groups'], 3):>18}")
    rates = next(iter(truth["selective"].values()))
    lines.append(f"{'mean |p - truth| kept':<26}" + "".join(f"{row['referral_rate']:>7.2f}" for row in rates))
    for name, rows in truth["selective"].items():
        lines.append(f"{name:<26}" + "".join(f"{_fmt(row['mae_truth'], 4):>7}" for row in rows))
    return lines


def format_comparison(comparison: Mapping[str, Any]) -> str:
    """Text table of compare_predictions: per metric A, B, B - A and its interval."""
    lines = [f"A = {comparison['a']}", f"B = {comparison['b']}",
             f"n = {comparison['n']} paired cases, {comparison['n_bootstrap']} bootstrap resamples",
             f"{'metric':<12}{'A':>9}{'B':>9}{'B - A':>10}  95% interval"]
    for name, row in comparison["metrics"].items():
        lines.append(f"{name:<12}{_fmt(row['a']):>9}{_fmt(row['b']):>9}"
                     f"{_fmt(row['difference']):>10}  [{_fmt(row['lower'])}, "
                     f"{_fmt(row['upper'])}]")
    return "\n".join(lines)


# --------------------------------------------------------------------------- multi-class
# The image models predict C classes. Here ``values`` holds per-sample class probabilities
# (or logits with from_logits=True) of shape [N, M, C], M = S * K sample-major as above; an
# [N, C] input counts as M = 1. ``y`` holds integer class labels in [0, C), shape [N].


def _class_log_likelihood(values, y, from_logits: bool, eps: float) -> np.ndarray:
    """log p_m(y_n) for every example and sample, shape [N, M]."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 2:
        values = values[:, None, :]
    if values.ndim != 3 or values.shape[0] == 0 or values.shape[1] == 0 or values.shape[2] < 2:
        raise ValueError(f"values must have shape [N, M, C] or [N, C] with N, M >= 1, C >= 2, got {values.shape}")
    labels = _class_labels(y, values.shape[0], values.shape[2])
    picked = np.take_along_axis(values, np.broadcast_to(labels[:, None, None], values.shape[:2] + (1,)), axis=2)
    picked = picked[..., 0]
    if from_logits:
        # log softmax at the label: z_y - logsumexp(z); exact for logits of any magnitude.
        return picked - _logsumexp(values, axis=-1)
    return np.log(np.clip(picked, eps, 1.0))


def _class_labels(y, n: int, num_classes: int) -> np.ndarray:
    """Integer labels of shape [n] in [0, num_classes), refusing anything else."""
    y = np.asarray(y)
    if y.shape != (n,):
        raise ValueError(f"labels have shape {y.shape}, expected ({n},)")
    if not np.all(np.isfinite(y.astype(np.float64))) or not np.all(y == np.round(y)):
        raise ValueError("class labels must be integers")
    y = y.astype(np.int64)
    if np.any((y < 0) | (y >= num_classes)):
        raise ValueError(f"class labels must lie in [0, {num_classes})")
    return y


def categorical_mixture_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> float:
    """Mean over examples of -log((1/M) sum_m p_m(y)): the NLL of the C-class predictive mixture."""
    log_lik = _class_log_likelihood(values, y, from_logits, eps)
    return float(-np.mean(_logsumexp(log_lik, axis=-1) - np.log(log_lik.shape[-1])))


def categorical_per_component_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> float:
    """Average of the M per-component C-class NLLs (the training loss, App. D.4); >= the mixture NLL."""
    return float(-np.mean(_class_log_likelihood(values, y, from_logits, eps)))


def _class_probs(p) -> np.ndarray:
    """Validate an [N, C] matrix of predictive class probabilities."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] < 2:
        raise ValueError(f"p must have shape [N, C] with N >= 1, C >= 2, got {p.shape}")
    if np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError("class probabilities must lie in [0, 1]")
    return p


def categorical_accuracy(p, y) -> float:
    """Fraction of examples whose most probable class (first on ties) is the label; p has shape [N, C]."""
    p = _class_probs(p)
    return float(np.mean(np.argmax(p, axis=1) == _class_labels(y, p.shape[0], p.shape[1])))


def categorical_ece(p, y, num_bins: int = NUM_BINS) -> float:
    """Top-label ECE of [N, C] class probabilities: sum_b (n_b/N)|acc_b - conf_b|, confidence = max_c p_c.

    Same binning as :func:`ece` (equal-width bins [i/B, (i+1)/B) on [0, 1], the last closed),
    which is ``ed.metrics.ExpectedCalibrationError`` as the paper's image tables use it; with
    C classes the confidence can fall below 0.5, so the low bins are no longer empty.
    """
    p = _class_probs(p)
    labels = _class_labels(y, p.shape[0], p.shape[1])
    confidence = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == labels).astype(np.float64)
    bins = np.clip(np.floor(confidence * num_bins).astype(np.int64), 0, num_bins - 1)
    sum_conf = np.bincount(bins, confidence, minlength=num_bins)
    sum_correct = np.bincount(bins, correct, minlength=num_bins)
    return float(np.abs(sum_correct - sum_conf).sum() / p.shape[0])


def categorical_mutual_information(probs) -> np.ndarray:
    """Per-example MI between label and component, [N] nats: H(mean_m p_m) - mean_m H(p_m), probs [N, M, C]."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3:
        raise ValueError(f"probs must have shape [N, M, C], got {probs.shape}")

    def entropy(p):
        return -np.sum(np.where(p > 0, p * np.log(np.clip(p, 1e-300, None)), 0.0), axis=-1)

    return np.maximum(entropy(probs.mean(axis=1)) - entropy(probs).mean(axis=1), 0.0)
