"""Reproducible prediction: serialized SequenceExamples + (S, seed) -> probabilities [N, S*K].

One function body serves ehr-eval, the tests and the exported SavedModel, so the service's
prediction for an example equals ehr-eval's for the same seed.

Reproducibility. Every sampling layer takes an explicit noise source (``model.layers.noise.Noise``)
in its ``call``: the prediction graph passes one keyed by the seed input, and the layers draw
their perturbations with stateless random ops from it. Each traced graph is checked for
leftover stateful random ops (``assert_stateless``), so a layer that samples some other way
fails loudly at trace time instead of silently breaking reproducibility. Nothing is patched
and nothing is locked: threads may trace and predict at the same time.

Batch independence. The whole batch is one vectorised pass (N examples x S samples x K
members), but every noise draw is split by example: each example gets its own stream keyed
by ``(seed, fingerprint of the example's model inputs)`` and indexed by its local row, so its
probabilities depend only on the example, S and the seed, never on which other examples share
the request (up to float round-off of the batched matmuls, ~1e-7). Weight draws with no batch
axis (mean-field kernels) are keyed by the seed alone, which is just as batch independent.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from ehr_pipeline.contract import spec, tf_parse
from model.export.load import load_export
from model.export_layout import MAX_SAMPLES, PRECISIONS, SIGNATURES
from model.layers.noise import Noise

INPUT_SIGNATURE = (
    tf.TensorSpec([None], tf.string, name="examples"),
    tf.TensorSpec([], tf.int32, name="num_samples"),
    tf.TensorSpec([], tf.int64, name="seed"),
)
# Random ops that keep hidden state: none may remain in a seeded prediction graph.
STATEFUL_RANDOM_OPS = frozenset({
    "RandomStandardNormal", "RandomUniform", "RandomUniformInt", "TruncatedNormal", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomShuffle", "Multinomial", "ParameterizedTruncatedNormal",
    "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulUniform", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngReadAndSkip",
    "RngSkip", "RandomGammaGrad",
})


def stateful_random_ops(graph_def: tf.compat.v1.GraphDef) -> set[str]:
    """Types of stateful random ops in a GraphDef, including its nested functions (loops, map_fn)."""
    found = {n.op for n in graph_def.node if n.op in STATEFUL_RANDOM_OPS}
    for fn in graph_def.library.function:
        found |= {n.op for n in fn.node_def if n.op in STATEFUL_RANDOM_OPS}
    return found


def assert_stateless(concrete_fn) -> None:
    """Raises RuntimeError if a traced prediction graph still holds stateful random ops."""
    found = stateful_random_ops(concrete_fn.graph.as_graph_def())
    if found:
        raise RuntimeError(f"seeded prediction graph still draws stateful random numbers via {sorted(found)}: "
                           "a layer draws its noise without the explicit source it was given (model.layers.noise)")


# What the model sees of an example. Identifiers, the label and the trigger's absolute time
# are left out on purpose: the service sends unknown ids and label -1 for the same admission
# the Beam job wrote with its real ids, and both must draw the same noise for the same seed.
_KEY_FEATURES = (spec.AGE_YEARS, spec.GENDER, spec.ADMISSION_TYPE, spec.ADMIT_OFFSET, spec.BAG_OFFSET,
                 spec.BAG_CODES, spec.BAG_COUNTS, spec.BAG_VALUE_COUNT, spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST,
                 spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX)


def _content_strings(parsed: dict[str, tf.Tensor | tf.RaggedTensor]) -> tf.Tensor:
    """[N] strings that spell out each example's model inputs (and nothing else), from the parsed batch."""
    columns = []
    for name in _KEY_FEATURES:
        value = parsed[name]
        if isinstance(value, tf.RaggedTensor):
            text = value.flat_values if value.dtype == tf.string else tf.strings.as_string(value.flat_values)
            columns.append(_join_rows(text, _flat_row_splits(value)))
            # Ragged row lengths too, so [[a, b], [c]] and [[a], [b, c]] differ.
            if value.ragged_rank > 1:
                inner = value.nested_row_splits[1]
                columns.append(_join_rows(tf.strings.as_string(inner[1:] - inner[:-1]), value.row_splits))
        else:
            columns.append(value if value.dtype == tf.string else tf.strings.as_string(value))
    return tf.strings.join(columns, separator="|")


def _flat_row_splits(value: tf.RaggedTensor) -> tf.Tensor:
    """Where each row of a ragged [N, (..), (..)] tensor starts in its flat values: [N + 1]."""
    splits = value.row_splits
    for inner in value.nested_row_splits[1:]:
        splits = tf.gather(inner, splits)
    return splits


def _join_rows(flat_text: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
    """[rows] strings: each row's run of flat_text [V] (rows given by splits [rows + 1]) joined by ','.

    What tf.strings.reduce_join(ragged, axis=1, separator=",") gives, in a few graph ops instead of the
    ~100 of ragged validation and segment ids it builds per feature: the serving graph is traced in
    every export and Predictor, and those ops were a third of it.
    """
    positions = tf.range(tf.shape(flat_text, out_type=splits.dtype)[0])
    segments = tf.searchsorted(splits[1:], positions, side="right")
    return tf.strings.unsorted_segment_join(flat_text, segments, tf.shape(splits, out_type=splits.dtype)[0] - 1,
                                            separator=",")


def example_noise(parsed: dict[str, tf.Tensor | tf.RaggedTensor], seed: tf.Tensor) -> Noise:
    """Noise keyed by (seed, fingerprint of the example's model inputs) per example of a parsed batch.

    Public because model.adapt's revision fits the output layer through the very draws the export makes.
    """
    fp = tf.bitcast(tf.fingerprint(_content_strings(parsed)), tf.int64)  # [N, 8] uint8 -> [N] int64
    return Noise.from_fingerprints(fp, seed)


def _check_samples(num_samples: tf.Tensor) -> tf.Tensor:
    ok = tf.logical_and(num_samples >= 1, num_samples <= MAX_SAMPLES)
    with tf.control_dependencies([tf.debugging.Assert(ok, [f"num_samples must be in [1, {MAX_SAMPLES}], got",
                                                           num_samples])]):
        return tf.identity(num_samples)


class _Untracked:
    """A plain holder: objects inside it are invisible to TensorFlow's object tracking."""

    def __init__(self, **items: Any):
        self.__dict__.update(items)


class ServingModule(tf.Module):
    """Featurizer + member models behind one seeded prediction function (what gets exported).

    Only the models' variables are tracked, not the Keras objects: tf_keras would otherwise
    try to serialise every layer's call (edward2 layers cannot be re-created from configs).
    """

    def __init__(self, featurizer: tf.Module, models: Sequence[tf.keras.Model]):
        super().__init__(name="ehr_serving")
        self.featurizer = featurizer
        # The traced functions stay untracked too: saving lists a tracked tf.function's concrete functions
        # again inside its save context, which retraces the whole network a second time (half of an
        # export's time); the signatures carry the one trace.
        functions = {precision: tf.function(functools.partial(self._serve, precision=precision),
                                            input_signature=INPUT_SIGNATURE, autograph=False)
                     for precision in PRECISIONS}
        self._hidden = _Untracked(models=list(models), concrete={}, functions=functions)  # see the class docstring
        self.model_variables = [v for m in self._hidden.models for v in m.variables]
        self.ensemble_size = int(sum(m.ensemble_size for m in self._hidden.models))

    def probs_batch(self, parsed: dict[str, tf.Tensor | tf.RaggedTensor], noise: Noise, num_samples: tf.Tensor,
                    precision: str = "float32") -> tf.Tensor:
        """Probabilities [N, S*K] of a parsed batch in one vectorised pass, every draw from `noise`."""
        feats = self.featurizer(parsed)
        per_member = []
        for model in self._hidden.models:
            # Each member draws as it would alone: an in-memory ensemble predicts what its
            # members' exports, evaluated side by side, predict.
            logits = model(feats, num_samples=num_samples, matmul_dtype=precision, noise=noise)  # [N, S*K_m]
            per_member.append(tf.reshape(tf.sigmoid(logits), [-1, num_samples, model.ensemble_size]))
        # Members side by side, still sample-major: column s*K + k.
        return tf.reshape(tf.concat(per_member, axis=2), [tf.shape(parsed[spec.NUM_BAGS])[0], -1])

    def _serve(self, examples, num_samples, seed, *, precision: str):
        num_samples = _check_samples(num_samples)
        parsed = tf_parse.parse_sequence_examples(examples)  # once: the noise keys and the featurizer share it
        probs = self.probs_batch(parsed, example_noise(parsed, seed), num_samples, precision)
        width = num_samples * self.ensemble_size
        return {"probs": tf.reshape(probs, [tf.shape(examples)[0], width])}

    def concrete(self, precision: str = "float32"):
        """The traced serving function of a precision (checked to be free of stateful random ops).

        Called with (examples, num_samples, seed) it gives {"probs": float32 [N, S*K]}, reproducible given
        the seed; "bfloat16" runs the LSTM's matmuls in bfloat16 (same noise, probabilities within tolerance).
        """
        if precision not in SIGNATURES:
            raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
        if precision not in self._hidden.concrete:
            fn = self._hidden.functions[precision].get_concrete_function()
            assert_stateless(fn)
            self._hidden.concrete[precision] = fn
        return self._hidden.concrete[precision]

    def signatures(self) -> dict:
        """Every precision's concrete function under its exported signature name."""
        return {SIGNATURES[p]: self.concrete(p) for p in PRECISIONS}


class Predictor:
    """An in-memory model (or deep ensemble of models) ready for predict_probs."""

    def __init__(self, featurizer: tf.Module, models: Sequence[tf.keras.Model] | tf.keras.Model,
                 precision: str = "float32"):
        models = [models] if isinstance(models, tf.keras.Model) else list(models)
        if precision not in SIGNATURES:
            raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
        self.module = ServingModule(featurizer, models)
        self.precision = precision

    @property
    def ensemble_size(self) -> int:
        """Total K over the member models."""
        return self.module.ensemble_size

    def __call__(self, examples: tf.Tensor, num_samples: int, seed: int) -> np.ndarray:
        out = self.module.concrete(self.precision)(examples=examples, num_samples=tf.constant(num_samples, tf.int32),
                                     seed=tf.constant(seed, tf.int64))
        return out["probs"].numpy()


def _as_callables(export_or_model: Any) -> list:
    """Predictor / loaded export / export path, or a list of them (a deep ensemble) -> callables."""
    if isinstance(export_or_model, (str, os.PathLike)):
        return [load_export(export_or_model)]
    if isinstance(export_or_model, (list, tuple)):
        return [c for item in export_or_model for c in _as_callables(item)]
    if not callable(export_or_model):
        raise TypeError("expected a Predictor, a loaded export or an export path, "
                        f"got {type(export_or_model).__name__}")
    return [export_or_model]


def predict_probs(export_or_model: Any, serialized_examples: Sequence[bytes] | np.ndarray | tf.Tensor,
                  num_samples: int, seed: int, *, batch_size: int = 256, progress: bool = False) -> np.ndarray:
    """Probabilities float32 [N, S*K] (column s*K + k); a list of models/exports is a deep ensemble."""
    if not 1 <= int(num_samples) <= MAX_SAMPLES:
        raise ValueError(f"num_samples must be in [1, {MAX_SAMPLES}], got {num_samples}")
    members = _as_callables(export_or_model)
    examples = tf.convert_to_tensor(serialized_examples, tf.string) if len(serialized_examples) else None
    if examples is None:
        total_k = sum(m.ensemble_size for m in members)
        return np.zeros([0, int(num_samples) * total_k], np.float32)
    n = int(examples.shape[0])
    outs = []
    for member in members:
        chunks = []
        starts = range(0, n, batch_size)
        for start in tqdm(starts, desc="predict", unit="batch", disable=not progress, leave=False):
            chunks.append(member(examples[start:start + batch_size], int(num_samples), int(seed)))
        probs = np.concatenate(chunks, axis=0)
        outs.append(probs.reshape(n, int(num_samples), -1))  # [N, S, K_member]
    return np.concatenate(outs, axis=2).reshape(n, -1).astype(np.float32)
