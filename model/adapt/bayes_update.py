"""The Bayesian update: the training posterior becomes the prior of the parts a few hundred outcomes can inform.

Which parts, and why:
  * the rank-1 factors (alpha, gamma of every rank-1 layer, the LSTM's recurrent ones too) with a
    Normal posterior: a few hundred numbers per layer that rescale the shared weights' rows and
    columns, so a site whose predictors act differently can move them without relearning the
    kernels. Their trained posterior N(mu_0, sigma_0) is the prior; the update is variational
    (the same Normal family, mean and stddev trained on E_q[NLL] + KL(q || N(mu_0, sigma_0))).
    Cauchy factors stay as trained (their KL has no closed form to anchor them with);
  * the output layer's per-member bias, where the baseline risk of a site lives: a point estimate
    in training, so it gets a Normal prior around its trained value (``bias_prior_stddev``, logit).
    Its mode given the rest of the network is solved first (``bias_shift``, a concave problem in
    one number per member): a site's risk may sit two logits away, which the variational fit's
    small steps (Adam at 1e-2, a few dozen of them at a few hundred admissions) would not cover;
  * the Laplace wide part (model.ehr.wide): its Gaussian posterior N(m_0, A A^T) is the prior
    of a Laplace update, solved first and in closed form (Newton in the coordinates u of
    w = m_0 + A u, prior N(0, I), so columns the training fit dropped stay dropped), with the rest
    of the network's logit (mean over samples) as an offset.
The shared kernels, embeddings and token projection are frozen: thousands of weights per layer
that a few hundred admissions cannot pin down, and where the training data's information lives.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tensorflow as tf
from scipy import optimize

from ehr_pipeline.contract import tf_parse
from model.adapt.config import AdaptConfig
from model.adapt.local_data import LocalSample
from model.adapt.recalibration import logits_of
from model.adapt.weight_fit import FitLog, fit_weights
from model.export.predict import Predictor, predict_probs
from model.layers import FACTOR_SITES
from model.layers._edward2 import ed
from model.layers.noise import posterior_loc_scale
from model.ehr.inputs import Featurizer
from model.ehr.wide import GaussianLinear

log = logging.getLogger(__name__)

_NEWTON_STEPS = 50


@dataclasses.dataclass(frozen=True)
class _NormalSite:
    """A factor's variational posterior (its initializer layer) and the trained posterior, now its prior."""

    initializer: tf.keras.layers.Layer
    prior_loc: tf.Tensor
    prior_scale: tf.Tensor

    def kl(self) -> tf.Tensor:
        """KL(q || trained posterior) of two diagonal Normals, nats, summed."""
        _, loc, scale = posterior_loc_scale(self.initializer)
        ratio = scale / self.prior_scale
        return tf.reduce_sum(0.5 * (ratio ** 2 + ((loc - self.prior_loc) / self.prior_scale) ** 2 - 1.0)
                             - tf.math.log(ratio))


def normal_sites(model: tf.keras.Model) -> list[_NormalSite]:
    """Every rank-1 factor (and trainable-posterior bias) with a built Normal posterior, its prior frozen now."""
    sites = []
    for module in model.submodules:
        for site in (*FACTOR_SITES, "ensemble_bias"):
            init = getattr(module, f"{site}_initializer", None)
            if isinstance(init, ed.initializers.TrainableNormal) and init.built:
                _, loc, scale = posterior_loc_scale(init)
                sites.append(_NormalSite(init, tf.constant(loc.numpy()), tf.constant(scale.numpy())))
    return sites


def _output_bias(model: tf.keras.Model) -> tf.Variable | None:
    """The output layer's point-estimated bias (per member for ensembles), or None."""
    for name in ("ensemble_bias", "bias"):
        variable = getattr(model.output_layer, name, None)
        if isinstance(variable, tf.Variable):
            return variable
    return None


def bias_shift(logits: np.ndarray, labels: np.ndarray, prior_stddev: float) -> np.ndarray:
    """The mode [K] of each member's output-bias shift (logit) given the rest: logits [N, S, K] of seeded samples.

    It minimises what the variational fit minimises with everything but the bias held, so that fit
    starts at the bias's optimum instead of walking there: per admission the NLL averaged over the
    K members (and here over the S samples, the expectation the fit's one draw per step estimates),
    plus sum_k d_k^2 / (2 prior_stddev^2). Averaged over members but summed over them in the prior
    (training's convention for the KL), each member's bias sees a prior K times as precise.
    """
    logits = np.asarray(logits, np.float64)
    y = np.asarray(labels, np.float64)[:, None, None]
    if logits.ndim != 3 or y.shape[0] != logits.shape[0]:
        raise ValueError(f"expected logits [N, S, K] and labels [N], got {logits.shape} and {np.shape(labels)}")
    k = logits.shape[2]
    precision = k / prior_stddev ** 2

    def objective(d: np.ndarray) -> tuple[float, np.ndarray]:
        z = logits + d
        nll = (np.logaddexp(0.0, z) - y * z).mean(axis=1).sum(axis=0)  # [K]
        grad = (1.0 / (1.0 + np.exp(-z)) - y).mean(axis=1).sum(axis=0)
        return float((nll.sum() + 0.5 * precision * np.sum(d * d)) / k), (grad + precision * d) / k

    result = optimize.minimize(objective, np.zeros(k), jac=True, method="BFGS", options={"gtol": 1e-10})
    return result.x


def _solve_output_bias(bias: tf.Variable, predictor: Predictor, sample: LocalSample,
                       config: AdaptConfig) -> list[float]:
    """Moves the output bias to bias_shift's mode on the sample (one shift per member, or one for a shared bias)."""
    probs = predict_probs(predictor, sample.records, config.samples, config.seed, batch_size=config.batch_predict)
    logits = logits_of(probs).reshape(sample.n, config.samples, -1)  # columns s * K + k: [N, S, K]
    if int(np.prod(bias.shape)) == 1:  # one bias for every member: one shift
        logits = logits.reshape(sample.n, -1, 1)
    elif int(np.prod(bias.shape)) != logits.shape[2]:
        raise ValueError(f"output bias {bias.name} has {int(np.prod(bias.shape))} entries for "
                         f"{logits.shape[2]} members")
    shift = bias_shift(logits, sample.labels, config.bias_prior_stddev)
    bias.assign(bias + tf.constant(shift.reshape(bias.shape), bias.dtype))
    log.info("output bias moved to its mode on %d admissions: shift %s logit", sample.n,
             ", ".join(f"{d:+.3f}" for d in shift))
    return [float(d) for d in shift]


def laplace_wide_update(model: tf.keras.Model, featurizer: Featurizer, sample: LocalSample,
                        config: AdaptConfig, predictor: Predictor) -> dict | None:
    """Updates the Laplace wide part's posterior with the sample (prior: its trained posterior); None without one."""
    wide = model.wide
    if not isinstance(wide, GaussianLinear):
        return None
    parsed = tf_parse.parse_sequence_examples(tf.constant(sample.records))
    x = np.c_[np.ones(sample.n), featurizer(parsed)["window_aggregates"].numpy().astype(np.float64)]
    m0, a_full = wide.mean.numpy().astype(np.float64), wide.scale.numpy().astype(np.float64)
    kept = np.flatnonzero(np.abs(a_full).sum(axis=0) > 0)
    a = a_full[:, kept]
    probs = predict_probs(predictor, sample.records, config.samples, config.seed, batch_size=config.batch_predict)
    # The rest of the network's logit: the model's mean logit less the wide part's mean.
    offset = logits_of(probs).mean(axis=1) - x @ m0
    b, y = x @ a, sample.labels.astype(np.float64)
    u = np.zeros(len(kept))
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(offset + x @ m0 + b @ u)))
        hessian = (b * (p * (1.0 - p))[:, None]).T @ b + np.eye(len(kept))
        move = np.linalg.solve(hessian, b.T @ (y - p) - u)
        u += move
        if np.max(np.abs(move), initial=0.0) < 1e-9:
            break
    p = 1.0 / (1.0 + np.exp(-(offset + x @ m0 + b @ u)))
    hessian = (b * (p * (1.0 - p))[:, None]).T @ b + np.eye(len(kept))
    scale = np.zeros_like(a_full)
    scale[:, kept] = a @ np.linalg.cholesky(np.linalg.inv(hessian))
    wide.mean.assign((m0 + a @ u).astype(np.float32))
    wide.scale.assign(scale.astype(np.float32))
    log.info("Laplace wide part updated over %d columns: |mean move| %.4f", len(kept), float(np.abs(a @ u).max()))
    return {"columns": int(len(kept)), "mean_move_max": float(np.abs(a @ u).max(initial=0.0))}


def bayes_update(model: tf.keras.Model, featurizer: Featurizer, fit: LocalSample, validation: LocalSample,
                 config: AdaptConfig, *, predictor: Predictor, progress: bool = False) -> tuple[FitLog, dict]:
    """The Laplace wide update, the output bias's mode, then the variational fit of factors and bias (module doc)."""
    wide = laplace_wide_update(model, featurizer, fit, config, predictor)
    sites = normal_sites(model)
    bias = _output_bias(model)
    variables = [v for s in sites for v in s.initializer.trainable_variables]
    if bias is not None:
        variables.append(bias)
    if not variables:
        raise ValueError("the model has neither Normal rank-1 factors nor an output bias to update")
    bias_prior = None if bias is None else tf.constant(bias.numpy())
    tau = config.bias_prior_stddev
    shift = None if bias is None else _solve_output_bias(bias, predictor, fit, config)

    def penalty() -> tf.Tensor:
        total = tf.add_n([s.kl() for s in sites]) if sites else tf.constant(0.0)
        if bias is not None:
            total += tf.reduce_sum(tf.square(bias - bias_prior)) / (2.0 * tau * tau)
        return total

    fit_log = fit_weights(model, featurizer, fit, validation, variables, penalty, config,
                          learning_rate=config.bayes_learning_rate, progress=progress, predictor=predictor)
    parts = {"normal_factor_sites": len(sites), "factor_parameters": int(sum(
        int(np.prod(v.shape)) for s in sites for v in s.initializer.trainable_variables)),
        "output_bias": bias is not None, "output_bias_shift": shift, "laplace_wide": wide}
    return fit_log, parts
