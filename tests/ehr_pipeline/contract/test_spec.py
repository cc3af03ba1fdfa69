"""The SequenceExample contract: build, write real GZIP TFRecords, read back through tf.data."""
from __future__ import annotations

import fnmatch
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import SPLIT_NAMES, BaggingConfig, spec, tf_parse
from ehr_pipeline.encode import seqex
from ehr_pipeline.encode.bagging import bag_events

T = 1_600_000_000
DAY = 86400
PER_CODE = [k for k in spec.SEQUENCE_KEYS if k != spec.BAG_OFFSET]  # ragged [batch, bags, codes]
CONFIG = BaggingConfig(bagging_time_precision=6 * 3600, bagging_aggregate_older_than=3 * DAY, max_bags=20)


def context(hadm_id: int, **overrides) -> dict:
    ctx = {spec.SUBJECT_ID: 100 + hadm_id, spec.HADM_ID: hadm_id, spec.LABEL: hadm_id % 2,
           spec.TRIGGER_TIME: T, spec.ADMIT_OFFSET: DAY + hadm_id, spec.AGE_YEARS: 40.25 + hadm_id, spec.GENDER: "F",
           spec.ADMISSION_TYPE: "EMERGENCY", spec.ETHNICITY: "HISPANIC OR LATINO", spec.INSURANCE: "Private",
           spec.PREVIOUS_DISCHARGE: 40 * DAY + hadm_id}
    ctx.update(overrides)
    return ctx


def random_bags(seed: int, n_events: int):
    rng = np.random.default_rng(seed)
    codes = np.array([spec.format_code(s, c) for s in ("lab", "chart", "diagnosis") for c in range(6)])
    return bag_events(T - rng.integers(-DAY, 10 * DAY, n_events), codes[rng.integers(0, len(codes), n_events)],
                      np.where(rng.random(n_events) < 0.6, rng.normal(50, 20, n_events), np.nan), T, CONFIG)


def write_shards(directory, split: str, examples: list[tf.train.SequenceExample], num_shards: int) -> list[str]:
    paths = [str(directory / spec.shard_file_name(split, i, num_shards)) for i in range(num_shards)]
    options = tf.io.TFRecordOptions(compression_type=spec.COMPRESSION)
    writers = [tf.io.TFRecordWriter(p, options) for p in paths]
    for i, ex in enumerate(examples):
        writers[i % num_shards].write(ex.SerializeToString())
    for w in writers:
        w.close()
    return paths


def test_round_trip_bags_to_gzip_tfrecords_to_dataset(tmp_path):
    admissions = {h: random_bags(h, n) for h, n in [(1, 300), (2, 5), (3, 0), (4, 1000), (5, 40)]}
    assert admissions[3].num_bags == 0 and admissions[4].has_history_bag
    examples = [seqex.make_sequence_example(context(h), b) for h, b in admissions.items()]
    paths = write_shards(tmp_path, "train", examples, num_shards=2)
    with open(paths[0], "rb") as f:
        assert f.read(2) == b"\x1f\x8b"  # really GZIP on disk

    ds = tf_parse.make_dataset(str(tmp_path / spec.split_file_pattern("train")), batch_size=2)
    seen = set()
    for batch in ds:
        assert isinstance(batch[spec.BAG_CODES], tf.RaggedTensor) and batch[spec.BAG_CODES].ragged_rank == 2
        assert batch[spec.BAG_OFFSET].ragged_rank == 1
        np.testing.assert_array_equal(batch[spec.BAG_OFFSET].row_lengths(), batch[spec.NUM_BAGS])
        for key in PER_CODE:
            np.testing.assert_array_equal(batch[key].nested_row_splits[1],
                                          batch[spec.BAG_CODES].nested_row_splits[1])
        for row in range(int(tf.shape(batch[spec.HADM_ID])[0])):
            hadm = int(batch[spec.HADM_ID][row])
            bags, ctx = admissions[hadm], context(hadm)
            seen.add(hadm)
            assert int(batch[spec.NUM_BAGS][row]) == bags.num_bags
            for key in (spec.SUBJECT_ID, spec.LABEL, spec.TRIGGER_TIME, spec.ADMIT_OFFSET):
                assert int(batch[key][row]) == ctx[key]
            assert float(batch[spec.AGE_YEARS][row]) == np.float32(ctx[spec.AGE_YEARS])
            assert batch[spec.GENDER][row].numpy().decode() == ctx[spec.GENDER]
            assert batch[spec.ADMISSION_TYPE][row].numpy().decode() == ctx[spec.ADMISSION_TYPE]
            np.testing.assert_array_equal(batch[spec.BAG_OFFSET][row].numpy(),
                                          bags.offset_seconds.astype(np.float32))
            assert batch[spec.BAG_CODES][row].row_lengths().numpy().tolist() == np.diff(bags.row_splits).tolist()
            flat = {key: batch[key][row].flat_values.numpy() for key in PER_CODE}
            assert [c.decode() for c in flat[spec.BAG_CODES]] == bags.codes.tolist()
            np.testing.assert_array_equal(flat[spec.BAG_COUNTS], bags.counts)
            np.testing.assert_array_equal(flat[spec.BAG_VALUE_COUNT], bags.value_count)
            np.testing.assert_array_equal(flat[spec.BAG_VALUE_MEAN], bags.value_mean.astype(np.float32))
            for key in (spec.BAG_VALUE_LAST, spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX):
                np.testing.assert_array_equal(flat[key], getattr(bags, key).astype(np.float32))
    assert seen == set(admissions)


def test_shuffled_repeated_dataset_serves_every_example(tmp_path):
    examples = [seqex.make_sequence_example(context(h), random_bags(h, 20)) for h in range(1, 8)]
    write_shards(tmp_path, "validation", examples, num_shards=3)
    ds = tf_parse.make_dataset(str(tmp_path / spec.split_file_pattern("validation")), batch_size=3,
                           shuffle=True, seed=7, repeat=True, drop_remainder=True)
    ids = [int(h) for batch in ds.take(7) for h in batch[spec.HADM_ID]]  # 21 = 3 epochs
    assert sorted(ids) == sorted(list(range(1, 8)) * 3)


def test_zero_bags_make_a_valid_example():
    bags = bag_events([], [], [], T, CONFIG)
    ex = seqex.make_sequence_example(context(9), bags)
    d = seqex.sequence_example_to_dict(ex.SerializeToString())
    assert d[spec.NUM_BAGS] == 0
    assert all(d[key] == [] for key in spec.SEQUENCE_KEYS)  # feature lists present, empty
    out = tf_parse.parse_sequence_examples(tf.constant([ex.SerializeToString()]))
    assert out[spec.NUM_BAGS].numpy().tolist() == [0]
    assert out[spec.BAG_CODES].shape.as_list()[0] == 1
    assert out[spec.BAG_CODES].flat_values.shape[0] == 0
    assert out[spec.BAG_OFFSET].row_lengths().numpy().tolist() == [0]


def test_sequence_example_to_dict_mirrors_the_bags():
    bags = bag_events(T - np.array([10, 20, DAY]), np.array(["lab:1", "chart:2", "lab:1"]),
                      np.array([1.5, np.nan, 3.0]), T, CONFIG)
    d = seqex.sequence_example_to_dict(seqex.make_sequence_example(context(4, **{spec.LABEL: spec.LABEL_UNKNOWN}), bags))
    assert d == {
        spec.SUBJECT_ID: 104, spec.HADM_ID: 4, spec.LABEL: -1, spec.TRIGGER_TIME: T, spec.ADMIT_OFFSET: DAY + 4,
        spec.PREVIOUS_DISCHARGE: 40 * DAY + 4,
        spec.AGE_YEARS: 44.25, spec.GENDER: "F", spec.ADMISSION_TYPE: "EMERGENCY", spec.NUM_BAGS: 2,
        spec.ETHNICITY: "HISPANIC OR LATINO", spec.INSURANCE: "Private",
        spec.BAG_OFFSET: [float(DAY), 10.0],
        spec.BAG_CODES: [["lab:1"], ["chart:2", "lab:1"]],
        spec.BAG_COUNTS: [[1], [1, 1]],
        spec.BAG_VALUE_COUNT: [[1], [0, 1]],
        spec.BAG_VALUE_MEAN: [[3.0], [0.0, 1.5]],
        spec.BAG_VALUE_LAST: [[3.0], [0.0, 1.5]],
        spec.BAG_VALUE_MIN: [[3.0], [0.0, 1.5]],
        spec.BAG_VALUE_MAX: [[3.0], [0.0, 1.5]],
    }


@pytest.mark.parametrize("change, error, match", [
    ({spec.HADM_ID: None}, TypeError, spec.HADM_ID),
    ({spec.NUM_BAGS: 3}, ValueError, "filled from the bags"),
    ({"ward": "MICU"}, ValueError, "ward"),
    ({spec.LABEL: 2}, ValueError, spec.LABEL),
    ({spec.LABEL: True}, TypeError, spec.LABEL),
    ({spec.GENDER: "X"}, ValueError, spec.GENDER),
    ({spec.AGE_YEARS: float("nan")}, ValueError, spec.AGE_YEARS),
    ({spec.AGE_YEARS: 300.0}, ValueError, spec.AGE_YEARS),
    ({spec.TRIGGER_TIME: 1.6e9}, TypeError, spec.TRIGGER_TIME),
    ({spec.ADMIT_OFFSET: -1}, ValueError, spec.ADMIT_OFFSET),
    ({spec.ADMISSION_TYPE: ""}, TypeError, spec.ADMISSION_TYPE),
    ({spec.ETHNICITY: ""}, TypeError, spec.ETHNICITY),
    ({spec.INSURANCE: None}, TypeError, spec.INSURANCE),
])
def test_context_that_breaks_the_contract_is_refused(change, error, match):
    ctx = context(1)
    ctx.update(change)
    with pytest.raises(error, match=match):
        seqex.make_sequence_example(ctx, bag_events([], [], [], T, CONFIG))


def test_missing_context_key_is_named():
    ctx = context(1)
    del ctx[spec.GENDER]
    with pytest.raises(ValueError, match=spec.GENDER):
        seqex.make_sequence_example(ctx, bag_events([], [], [], T, CONFIG))


def test_parser_rejects_num_bags_that_disagrees_with_the_sequence(tmp_path):
    ex = seqex.make_sequence_example(context(1), random_bags(1, 50))
    ex.context.feature[spec.NUM_BAGS].int64_list.value[0] += 1
    write_shards(tmp_path, "test", [ex], num_shards=1)
    ds = tf_parse.make_dataset(str(tmp_path / spec.split_file_pattern("test")), batch_size=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=spec.NUM_BAGS):
        next(iter(ds))


def test_parser_rejects_per_code_steps_beyond_num_bags():
    ex = seqex.make_sequence_example(context(1), random_bags(1, 50))
    lists = ex.feature_lists.feature_list
    for key in PER_CODE:  # one extra, internally consistent bag that num_bags does not count
        lists[key].feature.append(lists[key].feature[0])
    with pytest.raises(tf.errors.InvalidArgumentError, match=spec.NUM_BAGS):
        tf_parse.parse_sequence_examples(tf.constant([ex.SerializeToString()]))


def test_parser_rejects_per_code_lists_not_aligned_with_codes():
    ex = seqex.make_sequence_example(context(1), random_bags(1, 50))
    ex.feature_lists.feature_list[spec.BAG_VALUE_MEAN].feature[0].float_list.value.append(1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=spec.BAG_VALUE_MEAN):
        tf_parse.parse_sequence_examples(tf.constant([ex.SerializeToString()]))


def test_shard_names_match_the_split_pattern_and_only_it():
    name = spec.shard_file_name("train", 3, 8)
    assert name == "train-00003-of-00008.tfrecord.gz"
    for split in SPLIT_NAMES:
        names = [spec.shard_file_name(s, 0, 1) for s in SPLIT_NAMES]
        assert fnmatch.filter(names, spec.split_file_pattern(split)) == [spec.shard_file_name(split, 0, 1)]
    for bad in [("train", 8, 8), ("train", -1, 8), ("train-x", 0, 1), ("", 0, 1), ("a/b", 0, 1)]:
        with pytest.raises(ValueError):
            spec.shard_file_name(*bad)


def test_make_dataset_names_a_pattern_with_no_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        tf_parse.make_dataset(str(tmp_path / "nothing-here-*.tfrecord.gz"), batch_size=4)


def test_format_code():
    assert spec.format_code("lab", 50912) == "lab:50912"
    with pytest.raises(ValueError, match="blood"):
        spec.format_code("blood", 1)
    with pytest.raises(ValueError, match="empty"):
        spec.format_code("lab", "")
    assert spec.format_code("lab", " 50912\u00a0") == "lab:50912"  # as the job trims ITEMID text
    assert spec.format_code("prescription", "Heparin  Sodium ") == "prescription:Heparin  Sodium"
    with pytest.raises(ValueError, match="blank"):
        spec.format_code("lab", " \u3000")
    with pytest.raises(ValueError, match="control"):
        spec.format_code("lab", "509\x0012")


def test_code_whitespace_is_what_str_strip_and_the_jobs_arrow_trim_take():
    """spec.CODE_WHITESPACE is every character Python and Arrow call whitespace, and nothing else."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chars = [chr(i) for i in range(0x110000) if not 0xD800 <= i < 0xE000]  # surrogates are not text
    assert set(spec.CODE_WHITESPACE) == {c for c in chars if c.isspace()}
    padded = pa.array(["a" + c for c in chars])
    assert pc.utf8_trim_whitespace(padded).equals(pc.utf8_trim(padded, characters=spec.CODE_WHITESPACE))


def test_feature_spec_covers_every_declared_feature():
    context_spec, sequence_spec = feature_spec = tf_parse.feature_spec()
    assert set(context_spec) == set(spec.CONTEXT_INT + spec.CONTEXT_FLOAT + spec.CONTEXT_BYTES)
    assert set(sequence_spec) == set(spec.SEQUENCE_KEYS)
    assert not set(context_spec) & set(sequence_spec)  # one flat output dict needs unique names
    assert feature_spec[1][spec.BAG_CODES].dtype == tf.string


def test_importing_spec_bagging_config_loads_no_tensorflow_beam_or_keras():
    code = ("import sys, ehr_pipeline.contract.spec, ehr_pipeline.encode.bagging, ehr_pipeline.contract.config; "
            "print(sorted(m for m in ('tensorflow', 'apache_beam', 'keras', 'tf_keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_records_written_before_schema_3_parse_with_ethnicity_and_insurance_not_recorded():
    ex = seqex.make_sequence_example(context(3), random_bags(3, 10))
    del ex.context.feature[spec.ETHNICITY]
    del ex.context.feature[spec.INSURANCE]
    parsed = tf_parse.parse_sequence_examples(tf.constant([ex.SerializeToString()]))
    assert parsed[spec.ETHNICITY].numpy().tolist() == [spec.NOT_RECORDED.encode()]
    assert parsed[spec.INSURANCE].numpy().tolist() == [spec.NOT_RECORDED.encode()]
    assert parsed[spec.HADM_ID].numpy().tolist() == [3]


def _fields(descriptor, seen=None) -> dict:
    """{message name: [(field, number, type, label, packed, message type)]} of a message and those it holds."""
    seen = {} if seen is None else seen
    if descriptor.full_name in seen:
        return seen
    seen[descriptor.full_name] = sorted(
        (f.name, f.number, f.type, f.label, f.is_packed if hasattr(f, "is_packed") else None,
         f.message_type.full_name if f.message_type else None) for f in descriptor.fields)
    for f in descriptor.fields:
        if f.message_type is not None:
            _fields(f.message_type, seen)
    return seen


def test_the_protobuf_protos_declare_what_tensorflows_declare():
    from ehr_pipeline.contract import protos

    for ours, theirs in ((protos.SequenceExample, tf.train.SequenceExample),
                         (protos.Example, tf.train.Example)):
        assert _fields(ours.DESCRIPTOR) == _fields(theirs.DESCRIPTOR)


def test_tensorflow_reads_and_rewrites_the_written_bytes_unchanged():
    record = seqex.serialize(context(5), random_bags(5, 60))
    theirs = tf.train.SequenceExample.FromString(record)
    assert theirs.SerializeToString(deterministic=True) == record
    assert seqex.sequence_example_to_dict(theirs) == seqex.sequence_example_to_dict(record)


def test_the_admission_context_is_the_context_features():
    import dataclasses

    assert tuple(f.name for f in dataclasses.fields(spec.AdmissionContext)) == spec.CONTEXT_INPUT_KEYS
    built = spec.AdmissionContext.from_features(context(2))
    assert built.features() == context(2)
    with pytest.raises(ValueError, match=r"missing \['insurance'\]"):
        spec.AdmissionContext.from_features({k: v for k, v in context(2).items() if k != spec.INSURANCE})
    with pytest.raises(ValueError, match="gender"):
        dataclasses.replace(built, gender="X")  # replace re-runs the contract's checks
    # Left out, the previous discharge is none; given, it must precede the admission (>= the admit offset).
    bare = spec.AdmissionContext.from_features({k: v for k, v in context(2).items() if k != spec.PREVIOUS_DISCHARGE})
    assert bare.previous_discharge_seconds == spec.NO_PREVIOUS_DISCHARGE
    assert dataclasses.replace(built, previous_discharge_seconds=built.admit_offset_seconds).previous_discharge_seconds \
        == DAY + 2  # discharged the second the admission began
    for bad in (built.admit_offset_seconds - 1, -2):
        with pytest.raises(ValueError, match=spec.PREVIOUS_DISCHARGE):
            dataclasses.replace(built, previous_discharge_seconds=bad)


def test_a_record_written_before_the_previous_discharge_parses_as_none():
    # A schema-3 record has no PREVIOUS_DISCHARGE: TensorFlow fills the contract's default (none).
    proto = seqex.make_sequence_example(context(3), random_bags(3, 20))
    del proto.context.feature[spec.PREVIOUS_DISCHARGE]
    out = tf_parse.parse_sequence_examples(tf.constant([proto.SerializeToString(), seqex.serialize(context(4),
                                                                                                   random_bags(4, 5))]))
    assert out[spec.PREVIOUS_DISCHARGE].numpy().tolist() == [spec.NO_PREVIOUS_DISCHARGE, 40 * DAY + 4]
