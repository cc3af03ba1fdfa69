"""Logistic recalibration of probabilities against outcomes: calibration-in-the-large and the calibration slope.

``calibration_fit`` fits one set of cases with statsmodels' GLM and Wald intervals (what the report
shows); ``calibration_estimates`` fits many sets at once, estimates only, by Newton's method (what a
bootstrap resamples). Both maximise the same two likelihoods; the tests hold them to 1e-6 of each other.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from model.evaluation.statistics import metrics


def logit(p) -> np.ndarray:
    """log(p / (1 - p)) with p clipped to [metrics.EPS, 1 - metrics.EPS] (a saturated p stays finite)."""
    p = np.clip(np.asarray(p, dtype=np.float64), metrics.EPS, 1.0 - metrics.EPS)
    return np.log(p) - np.log1p(-p)


def calibration_fit(p, y, alpha: float = 0.05) -> dict[str, Any]:
    """Calibration-in-the-large and calibration slope of p, each with a Wald (1 - alpha) interval.

    Two logistic recalibrations of y on lp = logit(p) (statsmodels GLM, binomial):
    ``logit P(y) = a + lp`` (lp an offset, slope fixed at 1) gives calibration-in-the-large
    a (0 when the mean prediction is right; > 0: risks under-estimated), and
    ``logit P(y) = a' + b lp`` gives the slope b (1 ideal; < 1: predictions too extreme, the
    overfitting signature; > 1: too timid). Also observed / expected (mean y / mean p). NaN
    where the labels hold one class (no fit exists).
    """
    p, y = metrics.as_pair(p, y)
    nan = float("nan")
    out: dict[str, Any] = {"observed": float(y.mean()), "expected": float(p.mean()),
                           "observed_over_expected": float(y.mean() / p.mean()) if p.mean() > 0 else nan,
                           "intercept": {"estimate": nan, "lower": nan, "upper": nan},
                           "slope": {"estimate": nan, "lower": nan, "upper": nan},
                           "method": "logistic recalibration (statsmodels GLM, binomial), Wald intervals"}
    if y.min() == y.max():
        return out
    import statsmodels.api as sm

    lp = logit(p)
    family = sm.families.Binomial()
    large = sm.GLM(y, np.ones((y.size, 1)), family=family, offset=lp).fit()
    slope = sm.GLM(y, np.column_stack([np.ones(y.size), lp]), family=family).fit()
    for name, fit, column in (("intercept", large, 0), ("slope", slope, 1)):
        lo, hi = np.asarray(fit.conf_int(alpha))[column]
        out[name] = {"estimate": float(np.asarray(fit.params)[column]), "lower": float(lo), "upper": float(hi)}
    return out


def calibration_estimates(p, y, *, max_iter: int = 50, tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Calibration-in-the-large and calibration slope of each row of p [..., N] (no intervals): the bootstrap's fit.

    The same two maximum-likelihood recalibrations as calibration_fit, by Newton's method on every row
    at once: a bootstrap of 1,000 statsmodels fits took ~10 s, this takes milliseconds and reaches the
    same estimates (the likelihood is concave; the tests compare with statsmodels). NaN for a row whose
    labels hold one class, and for one whose fit does not converge (separated data: no finite estimate).
    """
    p, y = metrics.as_pair(p, y)
    lp = logit(p)
    rows = lp.shape[:-1]
    # Recalibration in the large: logit P(y) = a + lp, one parameter.
    a = np.zeros(rows)
    for _ in range(max_iter):
        mu = _sigmoid(a[..., None] + lp)
        step = (y - mu).sum(-1) / np.maximum((mu * (1.0 - mu)).sum(-1), 1e-300)
        a = a + step
        if np.all(np.abs(step) < tol):
            break
    a_done = np.abs(step) < 1e-6
    # Intercept and slope: logit P(y) = a' + b lp, from the calibrated model (a, 1).
    beta = np.stack([a, np.ones(rows)], axis=-1)
    for _ in range(max_iter):
        mu = _sigmoid(beta[..., :1] + beta[..., 1:] * lp)
        w, r = mu * (1.0 - mu), y - mu
        g0, g1 = r.sum(-1), (r * lp).sum(-1)
        h00, h01, h11 = w.sum(-1), (w * lp).sum(-1), (w * lp * lp).sum(-1)
        det = h00 * h11 - h01 * h01
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.stack([(h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det], axis=-1)
        step = np.where(np.isfinite(step), step, 0.0)
        beta = beta + step
        if np.all(np.abs(step) < tol):
            break
    beta_done = np.all(np.abs(step) < 1e-6, axis=-1) & np.isfinite(det) & (det > 0)
    one_class = y.min(-1) == y.max(-1)
    intercept = np.where(one_class | ~a_done, np.nan, a)
    slope = np.where(one_class | ~beta_done, np.nan, beta[..., 1])
    return intercept, slope


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))
