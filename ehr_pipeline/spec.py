"""The SequenceExample spec: the one contract between the Beam job, the trainer and the service.

One ``tf.train.SequenceExample`` per hospital admission. Context features describe the
admission; each step of the sequence is one time bag (oldest first). Within a bag, the
per-code lists (codes, counts, numeric aggregates) are aligned index by index.

This module must stay cheap to import: no Beam, no Keras. TensorFlow is imported lazily,
only by the functions that build or parse protos.
"""
from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: importing TensorFlow here would make spec heavy
    import tensorflow as tf

    from ehr_pipeline.bagging import Bags

# 2: per-code value_min / value_max and the admission's start (admit_offset_seconds).
# 3: ethnicity and insurance as ADMISSIONS records them (for subgroup reports, never model inputs).
SCHEMA_VERSION = 3

# --- context features (one value per admission) ---
SUBJECT_ID = "subject_id"  # int64
HADM_ID = "hadm_id"  # int64
LABEL = "label"  # int64, 1 = in-hospital death after the trigger time, 0 = not, -1 = unknown (serving)
TRIGGER_TIME = "trigger_time"  # int64, seconds since 1970-01-01 (shifted MIMIC dates)
AGE_YEARS = "age_years"  # float, age at admission in years, capped at 90
GENDER = "gender"  # bytes, "M" / "F" / "U"
ADMISSION_TYPE = "admission_type"  # bytes, e.g. "EMERGENCY"
# Who the admission is, as ADMISSIONS records it: the evaluation reports metrics per group of
# these. No model reads them (model.training.inputs and the noise key in model.export.predict leave them out),
# and the service, which is not told them, writes NOT_RECORDED.
ETHNICITY = "ethnicity"  # bytes, ADMISSIONS.ETHNICITY as written, e.g. "WHITE"
INSURANCE = "insurance"  # bytes, ADMISSIONS.INSURANCE as written, e.g. "Medicare"
NUM_BAGS = "num_bags"  # int64, sequence length
# int64, trigger time minus admission time, seconds (>= 0): bags newer than this lie in the
# current admission, older ones are history. Relative, like BAG_OFFSET, so the job and the
# service (whose ids and clocks differ) write the same value for the same admission.
ADMIT_OFFSET = "admit_offset_seconds"

# --- sequence features (one entry per bag, oldest bag first) ---
BAG_OFFSET = "bag_offset_seconds"  # float [1]: seconds from the bag's newest event to the trigger
BAG_CODES = "codes"  # bytes [n_codes]: distinct codes "source:code", e.g. b"lab:50912"
BAG_COUNTS = "code_counts"  # int64 [n_codes]: events of that code in the bag
BAG_VALUE_COUNT = "value_count"  # int64 [n_codes]: numeric values seen (0 = no numeric value)
BAG_VALUE_MEAN = "value_mean"  # float [n_codes]: mean of numeric values (0 when value_count = 0)
BAG_VALUE_LAST = "value_last"  # float [n_codes]: newest numeric value (0 when value_count = 0)
# Extremes: severity scores (SAPS-II, APACHE) use the worst value of each measurement, and a
# mean dilutes one abnormal value among normal ones.
BAG_VALUE_MIN = "value_min"  # float [n_codes]: smallest numeric value (0 when value_count = 0)
BAG_VALUE_MAX = "value_max"  # float [n_codes]: largest numeric value (0 when value_count = 0)

CONTEXT_INT = (SUBJECT_ID, HADM_ID, LABEL, TRIGGER_TIME, NUM_BAGS, ADMIT_OFFSET)
CONTEXT_FLOAT = (AGE_YEARS,)
CONTEXT_BYTES = (GENDER, ADMISSION_TYPE, ETHNICITY, INSURANCE)
SEQUENCE_INT = (BAG_COUNTS, BAG_VALUE_COUNT)
SEQUENCE_FLOAT = (BAG_OFFSET, BAG_VALUE_MEAN, BAG_VALUE_LAST, BAG_VALUE_MIN, BAG_VALUE_MAX)
SEQUENCE_BYTES = (BAG_CODES,)

# Event sources, used as code namespaces ("lab:50912") and in the service's request schema.
SOURCES = ("lab", "chart", "input", "output", "prescription", "diagnosis", "procedure")
CODE_SEPARATOR = ":"  # codes read "source:code"; the source is everything before the first ":"
# No code may hold a control character (C0, DEL): NUL ends C strings ("50912\0" would be read
# as "50912"), and tabs or newlines make codes that print alike but differ. The job drops
# such events (events.BAD_CODE), the service refuses them (422).
CODE_CONTROL_CHARACTERS = "[\x00-\x1f\x7f]"
# Whitespace trimmed from both ends of a code's text, by the job and the service alike, so
# " 50912" and "50912" are one code. Spelled out (Python's str.isspace characters, which are
# also what pyarrow's utf8_trim_whitespace trims) so the job's vectorised trim and
# code_text read one list.
CODE_WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                   "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

# Allowed context values. The service fills LABEL with LABEL_UNKNOWN: the outcome is not known yet.
LABEL_UNKNOWN = -1
LABELS = (0, 1, LABEL_UNKNOWN)
GENDERS = ("M", "F", "U")
# Ethnicity / insurance when nobody recorded them: a null in ADMISSIONS, or a service request.
NOT_RECORDED = "UNKNOWN"
# Context features that schema-2 records lack: they parse as NOT_RECORDED, so data written
# before version 3 still trains and evaluates (its subgroup report then has one group).
CONTEXT_DEFAULTS = {ETHNICITY: NOT_RECORDED, INSURANCE: NOT_RECORDED}
AGE_CAP_YEARS = 90.0  # MIMIC shifts ages over 89 to ~300 years; they are capped to this

# --- files: the Beam job writes them, the trainer reads them ---
COMPRESSION = "GZIP"  # tf.io / tf.data compression_type of every TFRecord file
TFRECORD_SUFFIX = ".tfrecord.gz"  # Beam infers GZIP from ".gz" (compression AUTO)
# Beam's shard template: the job writes `{split}{SHARD_NAME_TEMPLATE}{TFRECORD_SUFFIX}`.
SHARD_NAME_TEMPLATE = "-SSSSS-of-NNNNN"
_SHARD_DIGITS = 5

# Keys make_sequence_example takes from the caller (NUM_BAGS is derived from the bags).
CONTEXT_INPUT_KEYS = (SUBJECT_ID, HADM_ID, LABEL, TRIGGER_TIME, ADMIT_OFFSET, AGE_YEARS, GENDER,
                      ADMISSION_TYPE, ETHNICITY, INSURANCE)
SEQUENCE_KEYS = SEQUENCE_FLOAT + SEQUENCE_INT + SEQUENCE_BYTES
# Sequence features that hold exactly one value per bag; the others hold one per code.
_ONE_PER_BAG = (BAG_OFFSET,)


def code_text(code: object) -> str:
    """A code's text as bags hold it: CODE_WHITESPACE trimmed; blank or control characters refused (ValueError)."""
    text = str(code).strip(CODE_WHITESPACE)
    if not text:
        raise ValueError("empty or blank code")
    if re.search(CODE_CONTROL_CHARACTERS, text):
        raise ValueError("code must not hold control characters (U+0000-U+001F, U+007F)")
    return text


def format_code(source: str, code: object) -> str:
    """The event code 'source:code' (e.g. 'lab:50912') that bags and vocabularies use; code_text normalises the code."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {SOURCES}")
    try:
        text = code_text(code)
    except ValueError as err:
        raise ValueError(f"{err} for source {source!r}: {str(code)!r}") from None
    return f"{source}{CODE_SEPARATOR}{text}"


def shard_file_name(split: str, shard: int, num_shards: int) -> str:
    """File name of one shard, e.g. 'train-00003-of-00008.tfrecord.gz'."""
    _check_split(split)
    if not 0 <= shard < num_shards < 10**_SHARD_DIGITS:
        raise ValueError(f"need 0 <= shard < num_shards < {10**_SHARD_DIGITS}, "
                         f"got shard={shard}, num_shards={num_shards}")
    middle = (SHARD_NAME_TEMPLATE.replace("S" * _SHARD_DIGITS, f"{shard:0{_SHARD_DIGITS}d}")
              .replace("N" * _SHARD_DIGITS, f"{num_shards:0{_SHARD_DIGITS}d}"))
    return f"{split}{middle}{TFRECORD_SUFFIX}"


def split_file_pattern(split: str) -> str:
    """Glob matching every shard of one split, e.g. 'train-?????-of-?????.tfrecord.gz'."""
    _check_split(split)
    middle = SHARD_NAME_TEMPLATE.replace("S", "?").replace("N", "?")
    return f"{split}{middle}{TFRECORD_SUFFIX}"


def _check_split(split: str) -> None:
    # '-' would make the pattern of one split match another's files ("train" vs "train-x").
    if not split or not split.replace("_", "").isalnum():
        raise ValueError(f"split name must be letters, digits or '_', got {split!r}")


def _tf():
    """TensorFlow, imported on first use only, so importing spec stays cheap."""
    import tensorflow as tf

    return tf


def _check_context(context: Mapping[str, Any]) -> None:
    """Raises ValueError/TypeError naming the first context key that breaks the contract."""
    missing = [k for k in CONTEXT_INPUT_KEYS if k not in context]
    unknown = sorted(set(context) - set(CONTEXT_INPUT_KEYS))
    if missing or unknown:
        hint = f" ({NUM_BAGS} is filled from the bags)" if NUM_BAGS in unknown else ""
        raise ValueError(f"context keys: missing {missing}, unknown {unknown}{hint}")
    for key in CONTEXT_INPUT_KEYS:
        value = context[key]
        if key in CONTEXT_INT and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TypeError(f"context[{key!r}] must be an integer, got {value!r}")
        if key in CONTEXT_FLOAT and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise TypeError(f"context[{key!r}] must be a number, got {value!r}")
        if key in CONTEXT_BYTES and not (isinstance(value, str) and value):
            raise TypeError(f"context[{key!r}] must be a non-empty str, got {value!r}")
    if context[LABEL] not in LABELS:
        raise ValueError(f"context[{LABEL!r}] must be one of {LABELS}, got {context[LABEL]!r}")
    if context[GENDER] not in GENDERS:
        raise ValueError(f"context[{GENDER!r}] must be one of {GENDERS}, got {context[GENDER]!r}")
    if context[ADMIT_OFFSET] < 0:
        raise ValueError(f"context[{ADMIT_OFFSET!r}] (trigger minus admission, s) must be >= 0, "
                         f"got {context[ADMIT_OFFSET]!r}")
    if not 0.0 <= context[AGE_YEARS] <= AGE_CAP_YEARS:  # also false for NaN
        raise ValueError(f"context[{AGE_YEARS!r}] must be in [0, {AGE_CAP_YEARS}], "
                         f"got {context[AGE_YEARS]!r}")


def make_sequence_example(context: Mapping[str, Any], bags: Bags) -> tf.train.SequenceExample:
    """One admission's SequenceExample: context keys CONTEXT_INPUT_KEYS, one step per bag (offsets, s)."""
    tf = _tf()
    _check_context(context)
    example = tf.train.SequenceExample()
    ctx = example.context.feature
    for key in CONTEXT_INT:
        ctx[key].int64_list.value.append(bags.num_bags if key == NUM_BAGS else int(context[key]))
    for key in CONTEXT_FLOAT:
        ctx[key].float_list.value.append(float(context[key]))
    for key in CONTEXT_BYTES:
        ctx[key].bytes_list.value.append(context[key].encode("utf-8"))

    lists = example.feature_lists.feature_list
    for key in SEQUENCE_KEYS:
        lists[key].SetInParent()  # present even with zero bags: readers see an empty sequence
    codes = [c.encode("utf-8") for c in bags.codes]
    counts, value_count = bags.counts.tolist(), bags.value_count.tolist()
    per_code_floats = [(key, getattr(bags, key).tolist())
                       for key in (BAG_VALUE_MEAN, BAG_VALUE_LAST, BAG_VALUE_MIN, BAG_VALUE_MAX)]
    for i in range(bags.num_bags):  # a loop over bags (tens), not over events
        s = bags.bag_slice(i)
        lists[BAG_OFFSET].feature.add().float_list.value.append(float(bags.offset_seconds[i]))
        lists[BAG_CODES].feature.add().bytes_list.value.extend(codes[s])
        lists[BAG_COUNTS].feature.add().int64_list.value.extend(counts[s])
        lists[BAG_VALUE_COUNT].feature.add().int64_list.value.extend(value_count[s])
        for key, column in per_code_floats:
            lists[key].feature.add().float_list.value.extend(column[s])
    return example


def feature_spec() -> tuple[dict[str, Any], dict[str, Any]]:
    """(context_features, sequence_features) for tf.io.parse_sequence_example."""
    tf = _tf()
    context: dict[str, Any] = {}
    for keys, dtype in ((CONTEXT_INT, tf.int64), (CONTEXT_FLOAT, tf.float32), (CONTEXT_BYTES, tf.string)):
        context.update({k: tf.io.FixedLenFeature([], dtype, default_value=CONTEXT_DEFAULTS.get(k)) for k in keys})
    sequence: dict[str, Any] = {}
    for keys, dtype in ((SEQUENCE_INT, tf.int64), (SEQUENCE_FLOAT, tf.float32), (SEQUENCE_BYTES, tf.string)):
        for k in keys:
            # One value per bag parses densely (and fails loudly on any other count); the
            # per-code lists vary in length, so they parse ragged.
            sequence[k] = (tf.io.FixedLenSequenceFeature([], dtype, allow_missing=True)
                           if k in _ONE_PER_BAG else tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64))
    return context, sequence


def parse_sequence_examples(serialized_batch: tf.Tensor) -> dict[str, tf.Tensor | tf.RaggedTensor]:
    """Parses a [batch] string tensor into model-ready tensors keyed by the spec's feature names.

    Context features are dense [batch]. BAG_OFFSET (seconds, float32) is ragged
    [batch, (bags)]; the per-code features are ragged [batch, (bags), (codes)] and share one
    row partition, so they line up index by index. NUM_BAGS equals the bag row lengths.
    """
    tf = _tf()
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
        if key in _ONE_PER_BAG:
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
    tf = _tf()
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


def sequence_example_to_dict(proto: tf.train.SequenceExample | bytes) -> dict[str, Any]:
    """Plain-Python view of one SequenceExample, for debugging and tests.

    Context features become scalars (bytes decoded to str); sequence features become one
    list per bag, except BAG_OFFSET, which becomes one float (seconds) per bag.
    """
    tf = _tf()
    if isinstance(proto, bytes):
        proto = tf.train.SequenceExample.FromString(proto)
    out: dict[str, Any] = {}
    for key, feature in sorted(proto.context.feature.items()):
        values = _feature_values(feature)
        scalar = key in CONTEXT_INT + CONTEXT_FLOAT + CONTEXT_BYTES and len(values) == 1
        out[key] = values[0] if scalar else values
    for key, feature_list in sorted(proto.feature_lists.feature_list.items()):
        steps = [_feature_values(f) for f in feature_list.feature]
        out[key] = [s[0] for s in steps] if key in _ONE_PER_BAG else steps
    return out


def _feature_values(feature: Any) -> list[Any]:
    """The values of one tf.train.Feature, whichever list kind it holds."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return []
    values = list(getattr(feature, kind).value)
    return [v.decode("utf-8") for v in values] if kind == "bytes_list" else values
