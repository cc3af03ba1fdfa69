"""Reproducible prediction: serialized SequenceExamples + (S, seed) -> probabilities [N, S*K].

One function body serves ehr-eval, the tests and the exported SavedModel, so the service's
prediction for an example equals ehr-eval's for the same seed.

Reproducibility. The layers (edward2's rank-1 and Flipout layers, the stochastic embeddings,
the fast LSTM) draw their noise with TensorFlow's *stateful* random ops, whose stream cannot
be reset from an input tensor. While the prediction graph is traced, ``_stateless_sampling``
therefore swaps ``tf.random.normal / uniform / truncated_normal`` for their stateless
versions keyed by (seed input, example, call index). Every traced graph is then checked for
leftover stateful random ops (``assert_stateless``), so a layer that samples some other way
fails loudly at trace time instead of silently breaking reproducibility.

Batch independence. The whole batch is one vectorised pass (N examples x S samples x K
members), but every noise draw is split by example: each example gets its own stream keyed
by ``(seed, fingerprint of the example's model inputs)`` and indexed by its local row, so its
probabilities depend only on the example, S and the seed, never on which other examples share
the request (up to float round-off of the batched matmuls, ~1e-7). Weight draws with no batch
axis (mean-field kernels) are keyed by the seed alone, which is just as batch independent.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util
from tqdm.auto import tqdm

from ehr_pipeline import spec
from model.export import MAX_SAMPLES, PRECISIONS, SIGNATURES, load_export

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
_PATCH_LOCK = threading.RLock()  # the swap is process-wide while a graph is traced


def _static_dims(shape: tf.Tensor) -> list[int | None]:
    """What is known at trace time of a 1-D shape tensor, one entry per dimension (None: unknown).

    Goes further than ``constant_value_as_shape`` through the ops TensorFlow Probability
    builds sample shapes with (``concat([n], BroadcastArgs(shape(loc), shape(scale)))``),
    whose broadcast part is static although the op itself is not folded.
    """
    op = shape.op
    if op.type == "ConcatV2":
        return [d for part in op.inputs[:-1] for d in _static_dims(part)]
    if op.type == "BroadcastArgs":
        parts = [_static_dims(t) for t in op.inputs]
        if all(None not in part for part in parts):
            return [int(d) for d in np.broadcast_shapes(*(tuple(part) for part in parts))]
    static = tensor_util.constant_value_as_shape(shape)
    if static.rank is None:
        if shape.shape.rank != 1 or shape.shape[0] is None:
            raise RuntimeError("seeded prediction: a random op with a shape of unknown rank")
        return [None] * shape.shape[0]
    return static.as_list()


class _StatelessSampling:
    """Context: tf.random.{normal,uniform,truncated_normal} draw statelessly, per example.

    ``keys`` is [N, 2] int64, one stateless key per example of the batch. A noise request
    has at most one dimension unknown at trace time: the tiled batch axis, whose rows are
    ``blocks x examples x rows-of-that-example`` (e.g. [S*N] sample-major, [K*S*N], or the
    embedding's [S*n_tokens] with each example's tokens contiguous, see ``grouped_rows``).
    Every example gets its own stream, keyed by (its key, call index) and indexed by its
    *local* position, so its noise does not depend on which examples share the batch.
    Fully static shapes (no batch axis: e.g. one weight draw for the whole batch) are
    keyed by (seed, call index) only, which is just as batch independent.
    """

    def __init__(self, keys: tf.Tensor, seed_key: tf.Tensor):
        self.keys = keys
        self.seed_key = seed_key
        self.calls = 0
        self.group_sizes: tf.Tensor | None = None  # rows per example on the batch axis; None: one each
        self.originals = {"normal": tf.random.normal, "uniform": tf.random.uniform,
                          "truncated_normal": tf.random.truncated_normal}
        self.patched: list[tuple[dict, str, Any]] = []

    @contextlib.contextmanager
    def grouped_rows(self, sizes: tf.Tensor):
        """Within: the batch axis holds ``sizes[i]`` consecutive rows of example i per block."""
        previous, self.group_sizes = self.group_sizes, tf.cast(sizes, tf.int32)
        try:
            yield
        finally:
            self.group_sizes = previous

    def _draw(self, shape, dtype, draw_flat) -> tf.Tensor:
        """Noise of `shape`; draw_flat(length, key) -> [length] gives one stream."""
        # A distinct stream per call site, in trace order (deterministic for a given graph).
        self.calls += 1
        call = self.calls
        shape = tf.cast(tf.convert_to_tensor(shape), tf.int32)
        dims = _static_dims(shape)
        unknown = [a for a, d in enumerate(dims) if d is None]
        if not unknown:
            return tf.reshape(draw_flat(tf.reduce_prod(shape), tf.random.experimental.stateless_fold_in(
                self.seed_key, call)), shape)
        if len(unknown) > 1:
            raise RuntimeError(f"seeded prediction: random op of shape {dims} has more than one batch-like "
                               "dimension; model.predict cannot tell which rows belong to which example")
        axis = unknown[0]
        pre = int(np.prod(dims[:axis], dtype=np.int64))
        post = int(np.prod(dims[axis + 1:], dtype=np.int64))
        rows = shape[axis]
        n = tf.shape(self.keys)[0]
        sizes = tf.ones([n], tf.int32) if self.group_sizes is None else self.group_sizes
        per_block = tf.reduce_sum(sizes)
        blocks = rows // tf.maximum(per_block, 1)
        # Row r of the batch axis -> (example, local row): block b = r // C, offset o = r % C.
        r = tf.range(rows)
        ends = tf.cumsum(sizes)
        b, o = r // tf.maximum(per_block, 1), r % tf.maximum(per_block, 1)
        owner = tf.searchsorted(ends, o, side="right", out_type=tf.int32)
        local = b * tf.gather(sizes, owner) + o - tf.gather(ends - sizes, owner)
        longest = blocks * tf.maximum(tf.reduce_max(tf.concat([sizes, [0]], 0)), 0)
        length = longest * pre * post
        # Stateless ops have no batched-key kernel (pfor would loop too): one small draw per
        # example; the network itself still runs once on the whole batch.
        streams = tf.map_fn(
            lambda key: draw_flat(length, tf.random.experimental.stateless_fold_in(key, call)), self.keys,
            fn_output_signature=tf.TensorSpec([None], dtype), parallel_iterations=16)
        if self.group_sizes is None:
            # Every example owns exactly `blocks` rows: its stream is laid out as the request
            # itself would be for that example alone (so a lone example draws what a
            # per-example pass drew).
            streams = tf.transpose(tf.reshape(streams, [n, pre, longest, post]), [0, 2, 1, 3])
        else:
            # Examples own different numbers of rows: local-row-major, so a longer stream only
            # appends and padding to the longest example leaves each one's values unchanged.
            streams = tf.reshape(streams, [n, longest, pre, post])
        picked = tf.gather_nd(streams, tf.stack([owner, local], axis=1))  # [rows, pre, post]
        return tf.reshape(tf.transpose(picked, [1, 0, 2]), shape)

    def _normal(self, shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
        del seed, name
        z = self._draw(shape, dtype, lambda length, key: tf.random.stateless_normal([length], key, dtype=dtype))
        return z * tf.cast(stddev, dtype) + tf.cast(mean, dtype)

    def _truncated_normal(self, shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
        del seed, name
        z = self._draw(shape, dtype,
                       lambda length, key: tf.random.stateless_truncated_normal([length], key, dtype=dtype))
        return z * tf.cast(stddev, dtype) + tf.cast(mean, dtype)

    def _uniform(self, shape, minval=0, maxval=None, dtype=tf.float32, seed=None, name=None):
        del seed, name
        dtype = tf.as_dtype(dtype)
        if dtype.is_integer and maxval is None:
            raise ValueError("integer tf.random.uniform needs maxval")
        return self._draw(shape, dtype, lambda length, key: tf.random.stateless_uniform(
            [length], key, minval=minval, maxval=maxval, dtype=dtype))

    def __enter__(self) -> _StatelessSampling:
        _PATCH_LOCK.acquire()
        replacement = {id(fn): getattr(self, f"_{name}") for name, fn in self.originals.items()}
        originals = {id(fn): fn for fn in self.originals.values()}
        # Every module binding of the public functions (tf.random, tf.compat.v2.random,
        # random_ops, ...): libraries reach them through different namespaces.
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                if id(value) in replacement and originals[id(value)] is value:
                    self.patched.append((namespace, attr, value))
                    namespace[attr] = replacement[id(value)]
        return self

    def __exit__(self, *exc) -> None:
        for namespace, attr, value in reversed(self.patched):
            namespace[attr] = value
        self.patched.clear()
        _PATCH_LOCK.release()


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
                           "a layer samples through an API that model.predict does not make stateless")


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
            flat = value.merge_dims(1, -1) if value.ragged_rank > 1 else value
            text = flat if flat.dtype == tf.string else tf.strings.as_string(flat)
            columns.append(tf.strings.reduce_join(text, axis=1, separator=","))
        else:
            columns.append(value if value.dtype == tf.string else tf.strings.as_string(value))
        # Ragged row lengths too, so [[a, b], [c]] and [[a], [b, c]] differ.
        if isinstance(value, tf.RaggedTensor) and value.ragged_rank > 1:
            columns.append(tf.strings.reduce_join(tf.strings.as_string(value.row_lengths(axis=2)),
                                                  axis=1, separator=","))
    return tf.strings.join(columns, separator="|")


def _example_keys(parsed: dict[str, tf.Tensor | tf.RaggedTensor], seed: tf.Tensor) -> tf.Tensor:
    """[N, 2] int64 stateless keys (seed, fingerprint of the example's model inputs) of a parsed batch."""
    fp = tf.bitcast(tf.fingerprint(_content_strings(parsed)), tf.int64)  # [N, 8] uint8 -> [N] int64
    return tf.stack([tf.fill(tf.shape(fp), seed), fp], axis=1)


def _check_samples(num_samples: tf.Tensor) -> tf.Tensor:
    ok = tf.logical_and(num_samples >= 1, num_samples <= MAX_SAMPLES)
    with tf.control_dependencies([tf.debugging.Assert(ok, [f"num_samples must be in [1, {MAX_SAMPLES}], got",
                                                           num_samples])]):
        return tf.identity(num_samples)


@contextlib.contextmanager
def _grouped_embeddings(models: Sequence[tf.keras.Model], sampling: _StatelessSampling, tokens: tf.Tensor):
    """While tracing: each model's embedding layer samples with rows grouped by example tokens.

    Wraps the instance's ``call`` (restored on exit) rather than changing model code: only
    the prediction trace needs to know the embedding's row layout.
    """
    wrapped = []
    try:
        for model in models:
            layer = getattr(model, "embedding", None)
            if layer is None or "call" in vars(layer):
                continue
            original = layer.call

            def call(ids, *args, _original=original, **kwargs):
                with sampling.grouped_rows(tokens):
                    return _original(ids, *args, **kwargs)

            layer.call = call
            wrapped.append(layer)
        yield
    finally:
        for layer in wrapped:
            del layer.call


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
        self._hidden = _Untracked(models=list(models), concrete={})  # see the class docstring
        self.model_variables = [v for m in self._hidden.models for v in m.variables]
        self.ensemble_size = int(sum(m.ensemble_size for m in self._hidden.models))

    def probs_batch(self, parsed: dict[str, tf.Tensor | tf.RaggedTensor], keys: tf.Tensor, seed: tf.Tensor,
                    num_samples: tf.Tensor, precision: str = "float32") -> tf.Tensor:
        """Probabilities [N, S*K] of a parsed batch in one vectorised pass (traced statelessly)."""
        seed_key = tf.stack([seed, tf.constant(0, tf.int64)])
        with _StatelessSampling(keys, seed_key) as sampling:
            feats = self.featurizer(parsed)
            # The embedding draws one row per token occurrence on the S-tiled tokens, each
            # example's tokens contiguous: tell the sampler how many rows each example owns.
            tokens = feats["code_ids"].merge_dims(1, 2).row_lengths()
            per_member = []
            with _grouped_embeddings(self._hidden.models, sampling, tokens):
                for model in self._hidden.models:
                    logits = model(feats, num_samples=num_samples, matmul_dtype=precision)  # [N, S*K_m]
                    per_member.append(tf.reshape(tf.sigmoid(logits), [-1, num_samples, model.ensemble_size]))
            # Members side by side, still sample-major: column s*K + k.
            return tf.reshape(tf.concat(per_member, axis=2), [tf.shape(keys)[0], -1])

    def _serve(self, examples, num_samples, seed, precision: str):
        num_samples = _check_samples(num_samples)
        parsed = spec.parse_sequence_examples(examples)  # once: the noise keys and the featurizer share it
        keys = _example_keys(parsed, seed)
        probs = self.probs_batch(parsed, keys, seed, num_samples, precision)
        width = num_samples * self.ensemble_size
        return {"probs": tf.reshape(probs, [tf.shape(examples)[0], width])}

    @tf.function(input_signature=INPUT_SIGNATURE, autograph=False)
    def serve(self, examples, num_samples, seed):
        """{"probs": float32 [N, S*K]} for serialized SequenceExamples, reproducible given seed."""
        return self._serve(examples, num_samples, seed, "float32")

    @tf.function(input_signature=INPUT_SIGNATURE, autograph=False)
    def serve_bfloat16(self, examples, num_samples, seed):
        """As serve, with the LSTM's matmuls in bfloat16 (same noise; probabilities within tolerance)."""
        return self._serve(examples, num_samples, seed, "bfloat16")

    def concrete(self, precision: str = "float32"):
        """The traced serving function of a precision (checked to be free of stateful random ops)."""
        if precision not in SIGNATURES:
            raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
        if precision not in self._hidden.concrete:
            fn = (self.serve if precision == "float32" else self.serve_bfloat16).get_concrete_function()
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


@contextlib.contextmanager
def stateless_sampling(key: tf.Tensor):
    """Public form of the tracing context for one example (for tests of other seeded functions)."""
    key = tf.convert_to_tensor(key, tf.int64)
    with _StatelessSampling(tf.reshape(key, [1, 2]), key) as ctx:
        yield ctx
