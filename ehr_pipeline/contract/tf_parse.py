"""Parses the spec's SequenceExamples into tensors for training and evaluation (TensorFlow).

The reading half of the contract in ``ehr_pipeline.contract.spec``; ``ehr_pipeline.encode.seqex`` writes the
records without TensorFlow. TensorFlow is imported here at module level: only the trainer,
the evaluation and the service import this module, never the Beam job.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from ehr_pipeline.contract import spec
from ehr_pipeline.contract.spec import (
    BAG_CODES,
    BAG_OFFSET,
    COMPRESSION,
    CONTEXT_BYTES,
    CONTEXT_DEFAULTS,
    CONTEXT_FLOAT,
    CONTEXT_INT,
    NUM_BAGS,
    SEQUENCE_BYTES,
    SEQUENCE_FLOAT,
    SEQUENCE_INT,
    SEQUENCE_KEYS,
)


def feature_spec() -> tuple[dict[str, Any], dict[str, Any]]:
    """(context_features, sequence_features) for tf.io.parse_sequence_example."""
    context: dict[str, Any] = {}
    for keys, dtype in ((CONTEXT_INT, tf.int64), (CONTEXT_FLOAT, tf.float32), (CONTEXT_BYTES, tf.string)):
        context.update({k: tf.io.FixedLenFeature([], dtype, default_value=CONTEXT_DEFAULTS.get(k)) for k in keys})
    sequence: dict[str, Any] = {}
    for keys, dtype in ((SEQUENCE_INT, tf.int64), (SEQUENCE_FLOAT, tf.float32), (SEQUENCE_BYTES, tf.string)):
        for k in keys:
            # One value per bag parses densely (and fails loudly on any other count); the
            # per-code lists vary in length, so they parse ragged.
            sequence[k] = (tf.io.FixedLenSequenceFeature([], dtype, allow_missing=True)
                           if k in spec.ONE_PER_BAG else tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64))
    return context, sequence


def parse_sequence_examples(serialized_batch: tf.Tensor) -> dict[str, tf.Tensor | tf.RaggedTensor]:
    """Parses a [batch] string tensor into model-ready tensors keyed by the spec's feature names.

    Context features are dense [batch]. BAG_OFFSET (seconds, float32) is ragged
    [batch, (bags)]; the per-code features are ragged [batch, (bags), (codes)] and share one
    row partition, so they line up index by index. NUM_BAGS equals the bag row lengths.
    """
    context_spec, sequence_spec = feature_spec()
    context, sequence, lengths = tf.io.parse_sequence_example(serialized_batch, context_spec, sequence_spec)
    num_bags = context[NUM_BAGS]
    codes = sequence[BAG_CODES]
    # Eagerly these raise at once; inside tf.function / tf.data, TF runs stateful ops such as
    # assertions in program order, so no control dependencies are needed.
    tf.debugging.assert_equal(lengths[BAG_OFFSET], num_bags, message=f"{NUM_BAGS} != bags")
    tf.debugging.assert_equal(codes.row_lengths(), num_bags, message=f"{NUM_BAGS} != {BAG_CODES} bags")
    out: dict[str, Any] = dict(context)
    out[BAG_OFFSET] = tf.RaggedTensor.from_tensor(sequence[BAG_OFFSET], lengths=num_bags)
    for key in SEQUENCE_KEYS:
        if key in spec.ONE_PER_BAG:
            continue
        for mine, theirs in zip(sequence[key].nested_row_splits, codes.nested_row_splits):
            tf.debugging.assert_equal(mine, theirs, message=f"{key} not aligned with {BAG_CODES}")
        # One shared partition object: ragged ops then accept the features together.
        out[key] = codes.with_flat_values(sequence[key].flat_values)
    return out


def make_dataset(
    file_pattern: str | Iterable[str],
    batch_size: int,
    *,
    shuffle: bool = False,
    shuffle_buffer: int = 1024,
    seed: int | None = None,
    repeat: bool = False,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """tf.data over GZIP TFRecord shards yielding parse_sequence_examples dicts; files read sorted."""
    patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {patterns}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    # Interleaving several files keeps reads parallel; tf.data stays deterministic by default.
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=COMPRESSION),
                       cycle_length=min(len(files), 4), num_parallel_calls=tf.data.AUTOTUNE)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    # Batch the serialized protos first: one vectorised parse per batch is much cheaper.
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = ds.map(parse_sequence_examples, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)
