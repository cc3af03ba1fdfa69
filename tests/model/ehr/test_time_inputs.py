"""The time inputs (model.ehr.inputs.TIME_INPUTS) against a naive per-bag computation, and their switches."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import PipelineConfig, spec, tf_parse
from ehr_pipeline.encode import bagging, seqex
from model.ehr import inputs
from model.ehr.config import parse_config
from model.ehr.ehr_model import bag_vector_dim, build_model
from tests.support.ehr_testdata import tiny_config_dict

HOUR, DAY = 3600, 86400
TRIGGER = 2_000_000_000
VOCAB = {"lab": ["lab:50912"], "diagnosis": ["diagnosis:4019"]}


def scales(t: float) -> list[float]:
    """time_scales written out: exp(-t / tau) for 1 h, 1 d, 7 d, 30 d, 365 d and log(1 + days) / 10."""
    t = max(t, 0.0)
    return [math.exp(-t / tau) for tau in (HOUR, DAY, 7 * DAY, 30 * DAY, 365 * DAY)] + [math.log1p(t / DAY) / 10]


def record(ages_s, admit_offset, previous):
    """One admission whose events lie ages_s seconds before the trigger (a bag each, with the default 1 h bags)."""
    ages_s = np.asarray(ages_s, np.int64)
    codes = np.array(["diagnosis:4019" if a > admit_offset else "lab:50912" for a in ages_s], dtype=object)
    bags = bagging.bag_events(TRIGGER - ages_s, codes, np.full(ages_s.size, np.nan), TRIGGER,
                              PipelineConfig().bagging)
    context = spec.AdmissionContext(subject_id=1, hadm_id=2, label=0, trigger_time=TRIGGER,
                                    admit_offset_seconds=admit_offset, age_years=60.0, gender="M",
                                    admission_type="EMERGENCY", previous_discharge_seconds=previous)
    return seqex.serialize(context, bags), bags


def naive(bags, admit_offset, previous):
    """(per-bag time features, context time features) of one admission, bag by bag."""
    rows = []
    offsets = bags.offset_seconds.tolist()
    has = previous != spec.NO_PREVIOUS_DISCHARGE
    for i, off in enumerate(offsets):
        first = i == 0
        gap = [0.0] * 6 if first else scales(offsets[i - 1] - off)
        in_admission = off <= admit_offset
        since = scales(admit_offset - off) if in_admission else [0.0] * 6
        rows.append(gap + [float(first)] + scales(off) + since + [float(has and off >= previous)])
    context = [float(has)] + (scales(previous) if has else [0.0] * 6)
    return np.array(rows), np.array(context)


CASES = [  # (event ages before the trigger, s; admit offset, s; previous discharge, s before the trigger)
    ([400 * DAY, 90 * DAY + 5, 40 * DAY, 20 * HOUR, 2 * HOUR, 90], DAY, 39 * DAY),
    ([3 * HOUR, 100], DAY, spec.NO_PREVIOUS_DISCHARGE),
    ([], DAY, 2 * DAY),
    ([5 * 365 * DAY], 2 * DAY, 5 * 365 * DAY),  # a bag at the very second of the previous discharge
]


def test_time_features_match_the_naive_computation():
    fz = inputs.Featurizer(VOCAB, {}, time_inputs=list(reversed(inputs.TIME_INPUTS)))  # order given is not kept
    assert fz.time_inputs == inputs.TIME_INPUTS
    made = [record(*case) for case in CASES]
    feats = fz(tf_parse.parse_sequence_examples(tf.constant([r for r, _ in made])))
    bag_rows = feats["bag_features"]
    assert feats["bag_features"].flat_values.shape[-1] == fz.bag_feature_dim
    assert feats["context"].shape[-1] == fz.context_dim == inputs.CONTEXT_DIM + 7
    for i, ((_, bags), case) in enumerate(zip(made, CASES)):
        want_bags, want_context = naive(bags, case[1], case[2])
        got = bag_rows[i].numpy()[:, inputs.NUM_BAG_FEATURES:]
        np.testing.assert_allclose(got.reshape(want_bags.shape), want_bags, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(feats["context"][i].numpy()[inputs.CONTEXT_DIM:], want_context, rtol=1e-5,
                                   atol=1e-6)


def test_scales_keep_days_and_months_apart():
    # The complaint: log(1 + hours) / 10 puts 30 and 1,000 days within 0.66-1.0. Some scale moves
    # by at least 0.3 between any two of an hour, a day, a week, a month and a year.
    points = [HOUR, DAY, 7 * DAY, 30 * DAY, 365 * DAY]
    for a, b in zip(points, points[1:]):
        assert max(abs(x - y) for x, y in zip(scales(a), scales(b))) > 0.3
    got = inputs.time_scales(tf.constant(points, tf.float32)).numpy()
    np.testing.assert_allclose(got, [scales(p) for p in points], rtol=1e-5, atol=1e-7)


def valued_record(events):
    """One admission from (seconds before the trigger, code, value) events, in the default 1-day bags."""
    ages = np.array([a for a, _, _ in events], np.int64)
    bags = bagging.bag_events(TRIGGER - ages, np.array([c for _, c, _ in events], dtype=object),
                              np.array([v for _, _, v in events], float), TRIGGER, PipelineConfig().bagging)
    context = spec.AdmissionContext(subject_id=1, hadm_id=2, label=0, trigger_time=TRIGGER, admit_offset_seconds=DAY,
                                    age_years=60.0, gender="M", admission_type="EMERGENCY")
    return seqex.serialize(context, bags), bags


STATS = {"lab:50912": {"mean": 1.0, "std": 0.5}, "lab:50971": {"mean": 4.0, "std": 0.5}}
VALUE_VOCAB = {"lab": ["lab:50912", "lab:50971"], "diagnosis": ["diagnosis:4019"]}


def naive_value_change(bags):
    """Per token, oldest bag first: (dz since the code's previous valued bag, 1 if any, time_scales of the gap)."""
    rows, seen = [], {}
    for bag, offset in enumerate(bags.offset_seconds.tolist()):
        entries = slice(bags.row_splits[bag], bags.row_splits[bag + 1])
        for code, count, last in zip(bags.codes[entries], bags.value_count[entries], bags.value_last[entries]):
            if code not in STATS or count == 0:
                rows.append([0.0] * 8)
                continue
            z = max(-10.0, min(10.0, (last - STATS[code]["mean"]) / STATS[code]["std"]))
            if code in seen:
                z0, t0 = seen[code]
                rows.append([z - z0, 1.0] + scales(t0 - offset))
            else:
                rows.append([0.0] * 8)
            seen[code] = (z, offset)
    return np.array(rows)


def test_value_change_matches_the_naive_computation():
    # Two admissions in one batch (a code's history must not leak from one to the next), an unvalued
    # token between valued ones, a code without statistics, and a value clipped at 10 z.
    first = [(20 * DAY, "lab:50912", 1.1), (20 * DAY, "lab:50971", 4.2), (13 * DAY, "lab:50912", 1.3),
             (13 * DAY, "diagnosis:4019", np.nan), (6 * DAY, "lab:50912", np.nan), (5 * DAY, "lab:50912", 1.6),
             (5 * DAY, "lab:99999", 3.0), (2 * DAY, "lab:50971", 40.0), (HOUR, "lab:50971", 4.1)]
    second = [(9 * DAY, "lab:50971", 3.9), (3 * DAY, "lab:50912", 0.8), (DAY, "lab:50912", 0.9)]
    fz = inputs.Featurizer(VALUE_VOCAB, STATS, time_inputs=["value_change"])
    made = [valued_record(e) for e in (first, second)]
    feats = fz(tf_parse.parse_sequence_examples(tf.constant([r for r, _ in made])))
    assert fz.value_feature_dim == inputs.NUM_VALUE_FEATURES + 8
    assert [naive_value_change(b)[:, 1].sum() for _, b in made] == [4, 1]  # tokens with a previous value
    for i, (_, bags) in enumerate(made):
        got = feats["code_values"][i].flat_values.numpy()[:, inputs.NUM_VALUE_FEATURES:]
        np.testing.assert_allclose(got, naive_value_change(bags), rtol=1e-5, atol=1e-6)
    # Its change is the only one: the bag features and context are those of no time inputs.
    old = inputs.Featurizer(VALUE_VOCAB, STATS)(tf_parse.parse_sequence_examples(tf.constant([made[0][0]])))
    np.testing.assert_array_equal(feats["code_values"][0].flat_values.numpy()[:, :inputs.NUM_VALUE_FEATURES],
                                  old["code_values"].flat_values.numpy())


@pytest.mark.parametrize("names", [(), ("bag_gap",), ("trigger_scales",), ("since_admit",), ("previous_discharge",),
                                   ("value_change",)])
def test_each_input_switches_alone_and_the_old_inputs_stay_first(names):
    one = inputs.Featurizer(VOCAB, {}, time_inputs=names)
    parsed = tf_parse.parse_sequence_examples(tf.constant([record(*CASES[0])[0]]))
    got = one(parsed)
    # Without time inputs the featurizer writes what it wrote before they existed: the old columns, unchanged.
    old = inputs.Featurizer(VOCAB, {})(parsed)
    np.testing.assert_array_equal(got["bag_features"].flat_values.numpy()[:, :inputs.NUM_BAG_FEATURES],
                                  old["bag_features"].flat_values.numpy())
    np.testing.assert_array_equal(got["context"].numpy()[:, :inputs.CONTEXT_DIM], old["context"].numpy())
    np.testing.assert_array_equal(got["code_values"].flat_values.numpy()[:, :inputs.NUM_VALUE_FEATURES],
                                  old["code_values"].flat_values.numpy())
    assert got["code_values"].flat_values.shape[-1] == inputs.value_feature_dim(names)
    assert got["bag_features"].flat_values.shape[-1] == inputs.bag_feature_dim(names)
    assert got["context"].shape[-1] == inputs.context_dim(names)
    if not names:
        assert inputs.bag_feature_dim(()) == inputs.NUM_BAG_FEATURES and inputs.context_dim(()) == inputs.CONTEXT_DIM
    cfg = tiny_config_dict("deterministic")
    cfg["model"]["time_inputs"] = list(names)
    config = parse_config(cfg).model
    model = build_model(config, one.vocab_size)
    assert bag_vector_dim(config) == config.embedding_dim * config.attention_heads + one.bag_feature_dim
    assert model(got).shape[0] == 1


def test_the_config_refuses_unknown_or_repeated_time_inputs():
    cfg = tiny_config_dict("deterministic")
    for bad in (["gap"], ["bag_gap", "bag_gap"]):
        cfg["model"]["time_inputs"] = bad
        with pytest.raises(Exception, match="time_inputs"):
            parse_config(cfg)
