"""Recalibration of a model's sampled logits on a site's labelled admissions: the first rungs of the ladder.

A Bayesian export answers with M = S * K sampled probabilities per admission; its prediction is
their mean. A recalibration (a, b) moves every sample's logit the same way, l -> a + b * l, so
the spread between samples survives, and is fitted by maximum likelihood of what the model
predicts after it, the mean of the moved samples:

  log L(a, b) = sum_i y_i log p_i + (1 - y_i) log(1 - p_i),   p_i = mean_m sigmoid(a + b * l_im).

With M = 1 (a deterministic model) this is the textbook logistic recalibration: a logistic
regression of the outcome on the logit, as an offset (recalibration in the large, b = 1) or as
a covariate (intercept and slope); the tests compare both with statsmodels.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize, special

# float32 probabilities cannot tell logits beyond this apart (1 - p < 6e-8): the same reading as
# model.export.load.Recalibration.apply, so a fit sees the logits the predictor will move.
_P_LOW = np.finfo(np.float64).tiny
_P_HIGH = 1.0 - np.finfo(np.float32).epsneg


@dataclasses.dataclass(frozen=True)
class RecalibrationFit:
    """A fitted (intercept, slope), the log-likelihood it reaches (nats, summed) and its free parameters."""

    intercept: float
    slope: float
    log_likelihood: float
    parameters: int  # 0 (original), 1 (intercept), 2 (intercept and slope)


def logits_of(probs: np.ndarray) -> np.ndarray:
    """float64 logits [N, M] of sampled probabilities [N, M] (float32 ones read as the predictor reads them)."""
    p = np.clip(np.asarray(probs, np.float64), _P_LOW, _P_HIGH)
    return np.log(p) - np.log1p(-p)


def _check(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels, np.float64)
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"expected logits [N, M] and labels [N], got {logits.shape} and {labels.shape}")
    if logits.shape[0] == 0:
        raise ValueError("no admissions to recalibrate on")
    if not np.all((labels == 0) | (labels == 1)):
        raise ValueError("labels must be 0/1")
    if not np.all(np.isfinite(logits)):
        raise ValueError("logits must be finite")
    return logits, labels


def log_likelihood(logits: np.ndarray, labels: np.ndarray, intercept: float = 0.0, slope: float = 1.0) -> float:
    """log L(a, b) of the mean of the moved samples (nats, summed over admissions)."""
    logits, labels = _check(logits, labels)
    return float(-_negative_log_likelihood(np.array([intercept, slope]), logits, labels)[0])


def _negative_log_likelihood(ab: np.ndarray, logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """(-log L, its gradient in (a, b)) from log-sum-exp of each sample's log p or log (1 - p)."""
    z = ab[0] + ab[1] * logits  # [N, M]
    # log p of each sample for a death, log (1 - p) for a survivor: -softplus(-z) and -softplus(z).
    signed = np.where(labels[:, None] == 1, z, -z)
    per_sample = -np.logaddexp(0.0, -signed)
    m = logits.shape[1]
    per_case = special.logsumexp(per_sample, axis=1) - np.log(m)
    # d log mean_m q_m = sum_m w_m d log q_m, w the samples' shares of the mean; d log q / dz = +-(1 - q).
    weights = np.exp(per_sample - per_case[:, None] - np.log(m))
    dz = weights * np.where(labels[:, None] == 1, 1.0, -1.0) * (1.0 - np.exp(per_sample))
    grad = np.array([dz.sum(), (dz * logits).sum()])
    return float(-per_case.sum()), -grad


def fit_intercept(logits: np.ndarray, labels: np.ndarray) -> RecalibrationFit:
    """Recalibration in the large: the intercept a with slope 1 fixed (maximum likelihood)."""
    logits, labels = _check(logits, labels)
    result = optimize.minimize(lambda a: _with_slope(a, logits, labels), np.zeros(1), jac=True, method="BFGS",
                               options={"gtol": 1e-9})
    return RecalibrationFit(float(result.x[0]), 1.0, float(-result.fun), 1)


def _with_slope(a: np.ndarray, logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    value, grad = _negative_log_likelihood(np.array([a[0], 1.0]), logits, labels)
    return value, grad[:1]


def fit_intercept_slope(logits: np.ndarray, labels: np.ndarray) -> RecalibrationFit:
    """Logistic recalibration: intercept a and slope b (maximum likelihood), started from the intercept's fit."""
    logits, labels = _check(logits, labels)
    start = fit_intercept(logits, labels)
    result = optimize.minimize(_negative_log_likelihood, np.array([start.intercept, 1.0]), args=(logits, labels),
                               jac=True, method="BFGS", options={"gtol": 1e-9})
    # BFGS stops where the gradient is flat; never hand back less than the nested model reached.
    if -result.fun < start.log_likelihood:
        return RecalibrationFit(start.intercept, 1.0, start.log_likelihood, 2)
    return RecalibrationFit(float(result.x[0]), float(result.x[1]), float(-result.fun), 2)


def original(logits: np.ndarray, labels: np.ndarray) -> RecalibrationFit:
    """The model as it is: (0, 1) and its log-likelihood on these admissions."""
    return RecalibrationFit(0.0, 1.0, log_likelihood(logits, labels), 0)


def fit_ladder(logits: np.ndarray, labels: np.ndarray) -> dict[str, RecalibrationFit]:
    """The three rungs probabilities alone can fit, by the names of closed_test.STEPS: none, recalibrate-intercept,
    recalibrate."""
    return {"none": original(logits, labels), "recalibrate-intercept": fit_intercept(logits, labels),
            "recalibrate": fit_intercept_slope(logits, labels)}


def compose(first: tuple[float, float], then: tuple[float, float]) -> tuple[float, float]:
    """(a, b) of applying `first` and then `then`: a2 + b2 (a1 + b1 l) = (a2 + b2 a1) + b2 b1 l."""
    (a1, b1), (a2, b2) = first, then
    return a2 + b2 * a1, b2 * b1
