"""The small training loop every weight update shares: minibatch Adam on the local admissions,
early stopping on their validation part.

finetune, bayes and retrain differ only in which variables move and what penalty joins the
likelihood (the caller passes both); the likelihood is the training loss (the average
per-member Bernoulli NLL, Appendix D.4, one sample per member and admission) and the stopping
rule the mixture NLL of the validation part with seeded samples, the number the export will be
judged by. The best epoch's weights are kept; a run that never beats its starting point keeps
the starting weights.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from ehr_pipeline.contract import tf_parse
from model.adapt.config import AdaptConfig
from model.adapt.local_data import LocalSample
from model.evaluation.statistics import metrics
from model.export.predict import Predictor, predict_probs
from model.fit import losses
from model.ehr.inputs import Featurizer

log = logging.getLogger(__name__)

_STRINGS = tf.TensorSpec([None], tf.string)
_LABELS = tf.TensorSpec([None], tf.float32)


@dataclasses.dataclass(frozen=True)
class FitLog:
    """What a weight fit did: validation mixture NLL per epoch (index 0: before any step), the epoch kept."""

    validation_nll: list[float]
    best_epoch: int
    steps: int

    def to_json(self) -> dict:
        """As adaptation.json records it."""
        return dataclasses.asdict(self)


def validation_nll(predictor: Predictor, sample: LocalSample, config: AdaptConfig) -> float:
    """Mixture NLL (nats per admission) of the sample under seeded S-sample predictions."""
    probs = predict_probs(predictor, sample.records, config.samples, config.seed, batch_size=config.batch_predict)
    return float(metrics.mixture_nll(probs, sample.labels))


def fit_weights(model: tf.keras.Model, featurizer: Featurizer, fit: LocalSample, validation: LocalSample,
                variables: Sequence[tf.Variable], penalty: Callable[[], tf.Tensor], config: AdaptConfig, *,
                predictor: Predictor, learning_rate: float, clip_norm: float | None = None,
                progress: bool = False) -> FitLog:
    """Moves `variables` to minimise NLL + penalty() / n_fit; keeps the epoch with the best validation NLL.

    `predictor` is the caller's Predictor of `model` (one trace serves every check: it reads the variables).
    """
    variables = list(variables)
    if not variables:
        raise ValueError("no variables to fit")
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    # Slots made now, not in the first traced step: a tf.function that creates variables is traced
    # twice (with and without the creation), and a trace of this step costs seconds.
    optimizer.build(variables)
    n_fit = float(fit.n)

    @tf.function(input_signature=[_STRINGS, _LABELS], autograph=False)
    def step(examples, labels):
        with tf.GradientTape() as tape:
            features = featurizer(tf_parse.parse_sequence_examples(examples))
            logits = model(features, num_samples=1, training=True)
            loss = losses.nll_loss(logits, labels, "average") + penalty() / n_fit
        grads = tape.gradient(loss, variables)
        if clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, clip_norm)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    tf.random.set_seed(config.seed)  # the training draws are stateful (as in ehr-train); seeded for a rerun
    history = [validation_nll(predictor, validation, config)]
    best, best_epoch, steps = [v.numpy() for v in variables], 0, 0
    rng = np.random.default_rng(config.seed)
    records = np.array(fit.records, dtype=object)
    labels = fit.labels.astype(np.float32)
    for epoch in tqdm(range(1, config.epochs + 1), desc="update", unit="epoch", disable=not progress, leave=False):
        order = rng.permutation(fit.n)
        for start in range(0, fit.n, config.batch_size):
            index = order[start:start + config.batch_size]
            loss = step(tf.constant(list(records[index])), tf.constant(labels[index]))
            steps += 1
            if not np.isfinite(float(loss)):
                raise FloatingPointError(f"update loss is {float(loss)} at epoch {epoch}: lower --learning-rate")
        history.append(validation_nll(predictor, validation, config))
        if history[-1] < history[best_epoch]:
            best, best_epoch = [v.numpy() for v in variables], epoch
        elif epoch - best_epoch >= config.patience:
            break
    for variable, value in zip(variables, best):
        variable.assign(value)
    log.info("weight update: validation NLL %.4f before, %.4f at the kept epoch %d (%d epochs, %d steps)",
             history[0], history[best_epoch], best_epoch, len(history) - 1, steps)
    return FitLog(history, best_epoch, steps)
