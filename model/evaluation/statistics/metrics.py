"""The evaluation numbers of binary predictions, as pure numpy functions: likelihoods, ranking,
calibration, uncertainty, bootstrap intervals, referral.

The trainer, the evaluator, the benchmarks and the service all import from here, so a metric
means the same thing wherever it is reported. Beside this module: ``against_truth`` (predictions
against a known true probability), ``metrics_report`` (metrics.json: the whole report of a
prediction matrix, paired comparisons), ``formatting`` (its text tables) and ``multiclass``
(the image models' C-class metrics).

Conventions shared by these modules:

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

from typing import Callable, Sequence

import numpy as np

from model.export_layout import UNCERTAINTY_MEASURES

# Clipping for probability inputs: Keras' backend epsilon, so an NLL computed here from
# saturated float32 probabilities matches the loss Keras reports for the same numbers.
EPS = 1e-7
# The paper (and uncertainty-baselines' ECE) uses 15 equal-width bins.
NUM_BINS = 15
# Referral rates of the paper's selective-prediction tables: 0 % to 50 % in 5 % steps.
REFERRAL_RATES: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(11))
# The scalar metrics reported overall, per member, with bootstrap CIs and per referral rate.
SCALAR_METRICS: tuple[str, ...] = ("auc_pr", "auc_roc", "nll", "ece", "brier", "accuracy")
# Fraction of cases referred to a clinician unless a config or flag says otherwise.
DEFAULT_REFERRAL_RATE = 0.1
# Bootstrap interval per metric where the percentile one is wrong (see bootstrap_interval).
BOOTSTRAP_METHODS: dict[str, tuple[str, tuple[float, float]]] = {"ece": ("basic", (0.0, 1.0))}


# --------------------------------------------------------------------------- validation


def as_labels(y) -> np.ndarray:
    """Labels as float64, refusing anything outside {0, 1} (a silent 2 would skew every metric)."""
    y = np.asarray(y, dtype=np.float64)
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    return y


def as_pair(p, y) -> tuple[np.ndarray, np.ndarray]:
    """Validate a (probability, label) pair of equal shape and return float64 arrays."""
    p = np.asarray(p, dtype=np.float64)
    y = as_labels(y)
    if p.shape != y.shape:
        raise ValueError(f"p has shape {p.shape} but y has shape {y.shape}")
    if p.ndim == 0 or p.shape[-1] == 0:
        raise ValueError("need at least one example")
    return p, y


def as_matrix(probs) -> np.ndarray:
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
    y = as_labels(y)
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


def logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(a))) along ``axis`` without overflow or total underflow."""
    peak = np.max(a, axis=axis, keepdims=True)
    return np.squeeze(peak, axis=axis) + np.log(np.sum(np.exp(a - peak), axis=axis))


def mixture_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> np.ndarray | float:
    """Mean over examples of -log((1/M) sum_m p(y | m)): the NLL of the model's predictive mixture."""
    # Averaging in log space (logsumexp) keeps the mixture finite even when every component
    # assigns the label a probability below float64's smallest positive number.
    log_lik = _log_likelihood(values, y, from_logits, eps)
    per_example = logsumexp(log_lik, axis=-1) - np.log(log_lik.shape[-1])
    return -np.mean(per_example, axis=-1)


def per_component_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> np.ndarray | float:
    """Average of the M per-component NLLs: the training loss of the paper (App. D.4)."""
    # Always >= mixture_nll (Jensen); the gap is what ensembling/sampling buys at test time.
    log_lik = _log_likelihood(values, y, from_logits, eps)
    return -np.mean(log_lik, axis=(-2, -1))


def nll(p, y, eps: float = EPS) -> np.ndarray | float:
    """Binary NLL of one probability per example (the mixture NLL with M = 1)."""
    p, y = as_pair(p, y)
    return mixture_nll(p, y, eps=eps)


# --------------------------------------------------------------------------- point metrics


def predictive_mean(probs) -> np.ndarray:
    """Predictive probability of the positive class: the mean over all M samples, shape [N]."""
    return as_matrix(probs).mean(axis=1)


def brier(p, y) -> np.ndarray | float:
    """Mean squared error (p - y)^2 of the positive-class probability (half the two-class Brier sum)."""
    p, y = as_pair(p, y)
    return np.mean((p - y) ** 2, axis=-1)


def accuracy(p, y, threshold: float = 0.5) -> np.ndarray | float:
    """Fraction of correct labels when predicting positive iff p > threshold."""
    # Strict '>' matches the argmax over [1 - p, p] used by uncertainty-baselines, where a tie
    # at p = 0.5 goes to the negative class.
    p, y = as_pair(p, y)
    return np.mean((p > threshold) == (y == 1.0), axis=-1)


def tie_groups(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    p, y = as_pair(p, y)
    order = np.argsort(p, axis=-1, kind="stable")
    s = np.take_along_axis(p, order, axis=-1)
    ys = np.take_along_axis(y, order, axis=-1)
    first, last = tie_groups(s)
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
    p, y = as_pair(p, y)
    order = np.argsort(-p, axis=-1, kind="stable")
    s = np.take_along_axis(-p, order, axis=-1)
    ys = np.take_along_axis(y, order, axis=-1)
    _, last = tie_groups(s)
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
    p, y = as_pair(p, y)
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
    return bernoulli_entropy(as_matrix(probs)).mean(axis=1)


def mutual_information(probs) -> np.ndarray:
    """Epistemic uncertainty H[E p] - E H[p] (mutual information of label and model), shape [N]."""
    # >= 0 by concavity of entropy; the clip only removes float rounding below zero.
    return np.maximum(predictive_entropy(probs) - expected_entropy(probs), 0.0)


def predictive_std(probs) -> np.ndarray:
    """Standard deviation (ddof = 0) of the M sampled probabilities per example, shape [N]."""
    return as_matrix(probs).std(axis=1)


def member_means(probs, K: int, S: int) -> np.ndarray:
    """Each member's probability averaged over its S samples, shape [N, K] (sample-major layout)."""
    probs = as_matrix(probs)
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
    y = as_labels(y)
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


def referral_count(rate: float, n: int) -> int:
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
    k = referral_count(rate, u.size)
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
    p, y = as_pair(p_mean, y)
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
    p, y = as_pair(p_mean, y)
    u = np.asarray(uncertainty, dtype=np.float64)
    order = np.argsort(u, kind="stable")
    groups = [g for g in np.array_split(order, min(num_bins, u.size)) if g.size]
    return {
        "mean_uncertainty": np.array([u[g].mean() for g in groups]),
        "error_rate": np.array([1.0 - accuracy(p[g], y[g]) for g in groups]),
        "nll": np.array([nll(p[g], y[g]) for g in groups]),
        "count": np.array([g.size for g in groups]),
    }

