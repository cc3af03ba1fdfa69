"""Model revision for the deep model: the layers that make the logit re-estimated on the local admissions.

Vergouwe's revision re-estimates every coefficient of a linear predictor. The deep model's
linear predictor is its output layer (kernel and per-member bias on the hidden layer's output)
plus, where the model has one, the wide part's linear logit (its kernel, or the Laplace part's
mean). Those are re-estimated here by maximum likelihood, everything below them fixed, through
the very draws the export makes (seeded, S samples per member), so the log-likelihood is
comparable with the recalibrations' on the same draws. The fit starts at logistic recalibration
(kernels times b, biases times b plus a), which revision contains, so it never ends below it.
The Laplace wide part's spread is not re-estimated (only its mean).

Free parameters: the output kernel, one bias per member, and the wide part's weights.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from ehr_pipeline.contract import tf_parse
from model.adapt.local_data import LocalSample
from model.adapt.recalibration import RecalibrationFit
from model.export.predict import example_noise

# Probabilities are clipped this far from 0 and 1 before their log: the float32 sigmoid's resolution.
_EPS = 1e-7


@dataclasses.dataclass(frozen=True)
class RevisionFit:
    """The revised weights' log-likelihood (nats, summed) and free parameters; the weights stay in the model."""

    log_likelihood: float
    parameters: int


def revision_variables(model: tf.keras.Model) -> list[tf.Variable]:
    """The point-estimated weights of the output layer and the wide part (what revision re-estimates)."""
    chosen = []
    for layer in (model.output_layer, model.wide):
        if layer is None:
            continue
        for name in ("kernel", "bias", "ensemble_bias", "mean"):
            variable = getattr(layer, name, None)
            # A bias with a trainable posterior is an initializer layer, not a point estimate: not revised.
            if isinstance(variable, tf.Variable):
                chosen.append(variable)
    return chosen


def _start_at_recalibration(model: tf.keras.Model, start: RecalibrationFit) -> None:
    """Sets the weights so the logit is a + b * (the old logit): revision's start, inside its family."""
    a, b = start.intercept, start.slope
    for layer in (model.output_layer, model.wide):
        if layer is None:
            continue
        for name in ("kernel", "mean"):
            variable = getattr(layer, name, None)
            if isinstance(variable, tf.Variable):
                variable.assign(variable * b)
    for name in ("bias", "ensemble_bias"):
        variable = getattr(model.output_layer, name, None)
        if isinstance(variable, tf.Variable):
            variable.assign(variable * b + a)


def fit_revision(featurizer: tf.Module, model: tf.keras.Model, sample: LocalSample, start: RecalibrationFit, *,
                 samples: int, seed: int, steps: int, learning_rate: float = 0.01) -> RevisionFit:
    """Re-estimates revision_variables by full-batch Adam on the sample's mixture log-likelihood; keeps the best.

    Everything below the revised layers is fixed, so the network's trunk runs once (with the
    export's seeded draws) and each step runs only the logit layers: the same draws and numbers
    as the whole network per step, at the cost of one forward pass.
    """
    variables = revision_variables(model)
    _start_at_recalibration(model, start)
    examples = tf.constant(sample.records)
    labels = tf.constant(sample.labels.astype(np.float32))
    parsed = tf_parse.parse_sequence_examples(examples)
    noise = example_noise(parsed, tf.constant(seed, tf.int64))
    # In a graph: eagerly, the per-example noise streams and the LSTM's loop run op by op (~30 s at 2,500).
    trunk = tf.function(lambda: model.trunk(featurizer(parsed), tf.constant(samples, tf.int32), noise=noise),
                        autograph=False)()
    optimizer = tf.keras.optimizers.Adam(learning_rate)

    @tf.function(autograph=False)
    def log_likelihood():
        probs = tf.clip_by_value(tf.sigmoid(model.head(trunk, noise=noise)), _EPS, 1.0 - _EPS)
        mean = tf.reduce_mean(probs, axis=1)
        return tf.reduce_sum(labels * tf.math.log(mean) + (1.0 - labels) * tf.math.log(1.0 - mean))

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = -log_likelihood()
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return -loss

    best_value, best = float(log_likelihood()), [v.numpy() for v in variables]
    for _ in range(steps):
        before = [v.numpy() for v in variables]
        value = float(step())  # the log-likelihood of `before`: the step reports where it started
        if value > best_value:
            best_value, best = value, before
    final = float(log_likelihood())
    if final > best_value:
        best_value, best = final, [v.numpy() for v in variables]
    for variable, value in zip(variables, best):
        variable.assign(value)
    return RevisionFit(best_value, int(sum(int(np.prod(v.shape)) for v in variables)))
