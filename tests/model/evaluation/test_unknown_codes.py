"""TRIPOD+AI item 27a: the evaluated split's events whose code the model does not know, counted per source."""
from __future__ import annotations

import collections
import glob

import tensorflow as tf

from ehr_pipeline.contract import spec
from model import data_folder
from ehr_pipeline.shift.population import unknown_codes


def test_unknown_codes_are_counted_per_source_against_the_vocabulary():
    events = {"lab:1": 5, "lab:2": 3, "lab:9": 2, "chart:7": 4, "diagnosis:X": 1}
    got = unknown_codes(events, {"lab:1", "lab:2", "chart:7", "chart:8"})
    assert got == {"lab": {"events": 10, "unknown": 2, "unknown_codes": 1, "share": 0.2},
                   "chart": {"events": 4, "unknown": 0, "unknown_codes": 0, "share": 0.0},
                   "diagnosis": {"events": 1, "unknown": 1, "unknown_codes": 1, "share": 1.0}}
    assert unknown_codes({}, {"lab:1"}) == {}


def _codes_of_records(pattern: str) -> collections.Counter:
    """Every bag code of every record, read with the protobuf alone."""
    counts: collections.Counter = collections.Counter()
    for record in tf.data.TFRecordDataset(sorted(glob.glob(pattern)), compression_type=spec.COMPRESSION):
        example = tf.train.SequenceExample.FromString(record.numpy())
        for bag in example.feature_lists.feature_list[spec.BAG_CODES].feature:
            counts.update(v.decode("utf-8") for v in bag.bytes_list.value)
    return counts


def test_a_splits_code_events_count_every_event_of_its_records(synthetic_data):
    files = data_folder.load_data_files(synthetic_data)
    split = data_folder.read_split(files, "test")
    expected = _codes_of_records(files.split_pattern("test"))
    assert split.code_events == dict(expected) and sum(expected.values()) > 0
    # A vocabulary without the test split's two most frequent codes: exactly their events are unknown.
    dropped = [code for code, _ in expected.most_common(2)]
    known = set(expected) - set(dropped)
    got = unknown_codes(split.code_events, known)
    assert sum(row["unknown"] for row in got.values()) == sum(expected[c] for c in dropped)
    assert sum(row["unknown_codes"] for row in got.values()) == 2
