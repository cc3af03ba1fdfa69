"""A fitted logistic regression with its Laplace posterior, as the EHR model's linear ("wide") part.

``model.wide_posterior: laplace`` makes the wide part the logistic regression of
``model.ehr.baselines`` (penalty and C chosen by validation NLL) fitted on the training split's
window aggregates (``model.ehr.inputs``), with a Gaussian posterior N(w, H^-1) over its intercept
and weights: H is the Hessian of the training NLL at w, plus a unit prior precision, over the
columns the fit kept (an L1 fit drops most; dropped columns stay at 0 with no variance). The
trainer fits it before the first step and freezes it; the LSTM then learns the residual.

Why a Laplace posterior and not the factory's: on the medium synthetic release the
logistic regression already is the best point estimate any model here reached, and most of
the error left is in its few weights; the Laplace posterior over them put P_DEATH inside the
95% interval of 88% of test cases, where the rank-1 factors' reached 61-68% (docs/results.md).
Every sample (row) draws its own weight vector, ``w + A eps`` with A A^T the covariance.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from model.layers.noise import Noise
from model.ehr import baselines
from model.ehr.baselines import SplitFeatures

PRIOR_PRECISION = 1.0  # of the standardised weights: keeps H invertible where columns are collinear


@dataclasses.dataclass(frozen=True)
class LaplaceFit:
    """A fitted logistic regression on raw columns: mean [1 + F] (intercept first) and its covariance's factor."""

    mean: np.ndarray  # [1 + F]
    scale: np.ndarray  # [1 + F, 1 + F]: covariance = scale scale^T
    params: dict  # the chosen penalty and C
    validation_nll: float


def fit_laplace(train: SplitFeatures, val: SplitFeatures, seed: int = 0) -> LaplaceFit:
    """Fits model.ehr.baselines' logistic regression (chosen on validation) and its Laplace posterior, on raw columns."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        pipeline, params, scores = baselines.fit_logistic(train, val, seed)
    mean, scale = laplace_posterior(pipeline, train.x)
    return LaplaceFit(mean, scale, params, float(min(scores.values())))


def laplace_posterior(pipeline, x: np.ndarray, *, prior_precision: float = PRIOR_PRECISION,
                      dropped_precision: float | None = None,
                      sandwich_labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mean [1 + F], covariance factor [1 + F, 1 + F]) on raw columns of a fitted standardised logistic pipeline.

    The posterior is Normal at the fit with precision H + prior on standardised columns, H the
    Hessian of the NLL summed over the rows of x. dropped_precision None: the columns the fit
    dropped stay at 0 with no variance (the shipped posterior); a number: they are free too, under
    a Normal prior of that precision. sandwich_labels: the covariance becomes the sandwich
    P^-1 J P^-1 (P the precision, J the sum of per-row gradient outer products at these labels),
    the estimator's sampling covariance when the model is misspecified.
    """
    scaler, logistic = pipeline[0], pipeline[-1]
    coef = np.r_[logistic.intercept_, logistic.coef_[0]]  # on standardised columns
    kept = np.r_[True, logistic.coef_[0] != 0]
    free = kept if dropped_precision is None else np.ones_like(kept)
    z = np.c_[np.ones(len(x)), scaler.transform(x)][:, free]
    p = 1.0 / (1.0 + np.exp(-z @ coef[free]))
    prior = np.where(kept[free], prior_precision, dropped_precision or 0.0)  # kept[free] is all True if None
    precision_inv = np.linalg.inv((z * (p * (1.0 - p))[:, None]).T @ z + np.diag(prior))
    if sandwich_labels is None:
        factor = np.linalg.cholesky(precision_inv)
    else:
        # J = G^T G = R^T R (QR of the per-row gradients G), so P^-1 R^T is a factor of P^-1 J P^-1
        # even where J is singular (a kept column that is constant on these rows).
        gradients = z * (np.asarray(sandwich_labels) - p)[:, None]
        factor = precision_inv @ np.linalg.qr(gradients, mode="r").T
    to_raw = _to_raw(scaler)
    scale = np.zeros((coef.size, coef.size))
    # T L with L L^T the covariance is a factor of the raw covariance T C T^T; columns not free stay 0.
    scale[:, :free.sum()] = to_raw[:, free] @ factor
    return to_raw @ coef, scale


def raw_coefficients(pipeline) -> np.ndarray:
    """[1 + F] intercept and weights on raw columns of a fitted standardised logistic pipeline."""
    scaler, logistic = pipeline[0], pipeline[-1]
    return _to_raw(scaler) @ np.r_[logistic.intercept_, logistic.coef_[0]]


def _to_raw(scaler) -> np.ndarray:
    """T with (b, w) on raw columns = T (b, c) on standardised ones: b + sum_j (c_j / s_j) (x_j - m_j)."""
    to_raw = np.diag(np.r_[1.0, 1.0 / scaler.scale_])
    to_raw[0, 1:] = -scaler.mean_ / scaler.scale_
    return to_raw


class GaussianLinear(tf.keras.layers.Layer):
    """logit = [1, x] . w with w ~ N(mean, A A^T), one draw per row; mean and A fixed (set by ``set_fit``)."""

    def __init__(self, input_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.input_dim = int(input_dim)
        self.mean = self.add_weight(name="mean", shape=[1 + self.input_dim], initializer="zeros", trainable=False)
        self.scale = self.add_weight(name="scale", shape=[1 + self.input_dim, 1 + self.input_dim],
                                     initializer="zeros", trainable=False)

    def set_fit(self, fit: LaplaceFit) -> None:
        """Loads a fitted mean and covariance factor."""
        if fit.mean.shape != (1 + self.input_dim,):
            raise ValueError(f"expected a fit over {self.input_dim} columns, got {fit.mean.shape[0] - 1}")
        self.mean.assign(fit.mean.astype(np.float32))
        self.scale.assign(fit.scale.astype(np.float32))

    def call(self, inputs: tf.Tensor, noise: Noise | None = None) -> tf.Tensor:
        """[rows, F] -> [rows, 1]; noise: the explicit source (model.layers.noise), None: stateful draws."""
        x = tf.concat([tf.ones_like(inputs[:, :1]), inputs], axis=-1)
        rows = tf.shape(x)[0]
        mean = tf.cast(self.mean, x.dtype)
        if noise is None:
            eps = tf.random.normal([rows, 1 + self.input_dim], dtype=x.dtype)
        else:
            eps = noise.fold_in(self.name).normal(rows, [1 + self.input_dim], x.dtype)
        # x . (m + A eps) = x . m + (x A) . eps: no [rows, F, F] tensor.
        spread = tf.reduce_sum(tf.matmul(x, tf.cast(self.scale, x.dtype)) * eps, axis=-1)
        return (tf.linalg.matvec(x, mean) + spread)[:, None]
