"""One update of an export on a site's labelled admissions: every method of ehr-adapt, one entry point.

The classic ladder acts on the logit of every sample: ``none``, ``recalibrate-intercept`` and
``recalibrate`` fit (a, b) on the parent's seeded predictions (model.adapt.recalibration) and
store it; ``closed-test`` fits revision too (model.adapt.revision) and lets Vergouwe's procedure
(model.adapt.closed_test) choose. The weight methods rebuild the network (model.adapt.rebuild):
``finetune`` trains every trainable weight from the trained ones with the training loss and
priors, ``bayes`` updates the parts the data can inform with the training posterior as their
prior (model.adapt.bayes_update), ``retrain`` trains the same network from a fresh start on the
local admissions alone. The weight methods start from the parent's network without the parent's
own stored recalibration (if it has one): they refit what it corrected.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import tensorflow as tf

from ehr_pipeline.contract import tf_parse
from model.adapt import closed_test as closed
from model.adapt import recalibration as recal
from model.adapt.bayes_update import bayes_update
from model.adapt.config import WEIGHT_METHODS, AdaptConfig
from model.adapt.local_data import LocalData, LocalSample, split_for_validation
from model.adapt.rebuild import Rebuilt, rebuild
from model.adapt.revision import fit_revision
from model.adapt.weight_fit import fit_weights
from model.export.load import LoadedExport
from model.export.predict import Predictor, predict_probs
from model.fit import losses
from model.ehr.baselines import SplitFeatures
from model.ehr.wide import GaussianLinear, fit_laplace

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Update:
    """What an update produced: the recalibration to store, or a new network; its record and local predictions."""

    method: str
    recalibration: tuple[float, float]  # (a, b) the new export applies to its SavedModel's sampled logits
    network: Rebuilt | None  # the updated network when weights changed; None: the parent's SavedModel is kept
    record: dict[str, Any]  # adaptation.json's method-specific part (fits, tests, fit log)
    probs: np.ndarray  # [N, S*K] the updated model's seeded predictions of the local sample
    # The network's Predictor that made `probs` (None without a network): the export writer saves its module,
    # whose float32 signature is then already traced (a trace costs seconds).
    predictor: Predictor | None = None


def _parent_recalibration(loaded: LoadedExport) -> tuple[float, float]:
    a = loaded.files.adaptation
    return (0.0, 1.0) if a is None else (a.recalibration.intercept, a.recalibration.slope)


def adapt(loaded: LoadedExport, local: LocalData, config: AdaptConfig, *, progress: bool = False) -> Update:
    """Updates `loaded` on the local sample with config.method (module docstring)."""
    sample = local.sample
    if config.method in WEIGHT_METHODS:
        return _weights(loaded, sample, config, progress)
    probs = predict_probs(loaded, sample.records, config.samples, config.seed, batch_size=config.batch_predict)
    logits = recal.logits_of(probs)
    fits = recal.fit_ladder(logits, sample.labels)
    record: dict[str, Any] = {"fits": {k: dataclasses.asdict(v) for k, v in fits.items()}}
    step = config.method
    network = None
    if config.method == "closed-test":
        network = rebuild(loaded)
        start = fits["recalibrate"]
        # Revision moves the raw network, which lacks the parent's own stored recalibration: start from both.
        a, b = recal.compose(_parent_recalibration(loaded), (start.intercept, start.slope))
        revision = fit_revision(network.featurizer, network.model, sample,
                                dataclasses.replace(start, intercept=a, slope=b), samples=config.samples,
                                seed=config.seed, steps=config.revision_steps)
        result = closed.closed_test({**{k: v.log_likelihood for k, v in fits.items()},
                                     "revision": revision.log_likelihood}, revision.parameters, config.alpha)
        record["fits"]["revision"] = dataclasses.asdict(revision)
        record["closed_test"] = result.to_json()
        step = result.step
        log.info("closed test chose %s (%s)", step, ", ".join(
            f"revision vs {t.simpler}: LR {t.statistic:.2f}, df {t.df}, p {t.p_value:.3g}" for t in result.tests))
        if step == "revision":
            predictor = Predictor(network.featurizer, network.model)
            new_probs = predict_probs(predictor, sample.records, config.samples, config.seed,
                                      batch_size=config.batch_predict)
            return Update(config.method, (0.0, 1.0), network, record, new_probs, predictor)
    chosen = fits[step]
    stored = recal.compose(_parent_recalibration(loaded), (chosen.intercept, chosen.slope))
    moved = (chosen.intercept, chosen.slope)
    new_probs = probs if moved == (0.0, 1.0) else _recalibrated(probs, *moved)
    return Update(config.method, stored, None, record, new_probs)


def _recalibrated(probs: np.ndarray, intercept: float, slope: float) -> np.ndarray:
    logits = recal.logits_of(probs)
    return (1.0 / (1.0 + np.exp(-(intercept + slope * logits)))).astype(np.float32)


def _weights(loaded: LoadedExport, sample: LocalSample, config: AdaptConfig, progress: bool) -> Update:
    """finetune, bayes or retrain on the sample's fit part, stopped on its validation part."""
    fit, validation = split_for_validation(sample, config.validation_fraction, config.seed)
    network = rebuild(loaded, restore=config.method != "retrain")
    model, train = network.model, network.config.train
    record: dict[str, Any] = {"fit_admissions": fit.n, "validation_admissions": validation.n}
    # One traced prediction function for the fit's checks and the final predictions: tracing costs seconds.
    predictor = Predictor(network.featurizer, model)
    if config.method == "bayes":
        fit_log, record["updated_parts"] = bayes_update(model, network.featurizer, fit, validation, config,
                                                        progress=progress, predictor=predictor)
    else:
        if config.method == "retrain" and isinstance(model.wide, GaussianLinear):
            record["laplace_wide"] = _refit_laplace(network, fit, validation, train.seed)

        def penalty() -> tf.Tensor:
            # The training objective per example is NLL + kl_scale * KL / N + L2: times n here, as fit_weights divides.
            return train.kl_scale * losses.kl_divergence(model) + float(fit.n) * losses.l2_penalty(model)

        rate = train.learning_rate if config.method == "retrain" else config.learning_rate
        fit_log = fit_weights(model, network.featurizer, fit, validation, model.trainable_variables, penalty,
                              config, learning_rate=rate, clip_norm=train.clip_norm, progress=progress,
                              predictor=predictor)
        record["learning_rate"] = rate
    record["fit"] = fit_log.to_json()
    probs = predict_probs(predictor, sample.records, config.samples, config.seed, batch_size=config.batch_predict)
    return Update(config.method, (0.0, 1.0), network, record, probs, predictor)


def _refit_laplace(network: Rebuilt, fit: LocalSample, validation: LocalSample, seed: int) -> dict:
    """A retrain's wide part: the logistic regression and its Laplace posterior on the local admissions alone."""
    def features(part: LocalSample) -> SplitFeatures:
        parsed = tf_parse.parse_sequence_examples(tf.constant(part.records))
        x = network.featurizer(parsed)["window_aggregates"].numpy()
        return SplitFeatures(part.hadm_ids, part.labels, x)

    result = fit_laplace(features(fit), features(validation), seed=seed)
    network.model.wide.set_fit(result)
    for variable in network.model.output_layer.variables:  # as training starts: the regression alone
        if variable.name.endswith("/kernel:0") or "bias" in variable.name:
            variable.assign(tf.zeros_like(variable))
    return {"params": result.params, "validation_nll": result.validation_nll}
