"""bag_events: bag boundaries, drops, history bag, truncation, aggregates, determinism.

The property tests compare against a deliberately naive per-event reference written from
the documented semantics (docs/spec.md), not from the vectorised implementation.
"""
from __future__ import annotations

import datetime as dt
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ehr_pipeline.contract import BaggingConfig
from ehr_pipeline.encode import bagging
from ehr_pipeline.encode.bagging import DROP_AT_OR_AFTER_TRIGGER, DROP_OLDER_THAN_MAX_BAGS, bag_events

T = 1_600_000_000  # a trigger time, seconds since 1970 (12:26:40 UTC)
HOUR = 3600
DAY = 86400


def cfg(precision: int = HOUR, older_than: int = -1, max_bags: int = 100) -> BaggingConfig:
    return BaggingConfig(bagging_time_precision=precision, bagging_aggregate_older_than=older_than,
                         max_bags=max_bags)


def events(*rows: tuple[int, str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(age seconds before T, code, value) rows -> the three input arrays."""
    ages, codes, values = zip(*rows) if rows else ((), (), ())
    return (T - np.asarray(ages, dtype=np.int64), np.asarray(codes, dtype=object),
            np.asarray(values, dtype=np.float64))


def per_bag(bags: bagging.Bags, field: str) -> list[list]:
    arr = getattr(bags, field)
    return [arr[bags.bag_slice(i)].tolist() for i in range(bags.num_bags)]


def test_event_exactly_one_precision_old_is_in_bag_1_and_just_under_in_bag_0():
    b = bag_events(*events((HOUR, "lab:1", 1.0), (HOUR - 1, "lab:2", 2.0), (1, "lab:3", 3.0)), T, cfg())
    assert b.num_bags == 2
    assert per_bag(b, "codes") == [["lab:1"], ["lab:2", "lab:3"]]  # oldest bag first
    assert b.offset_seconds.tolist() == [HOUR, 1]  # age of each bag's newest event
    assert b.row_splits.tolist() == [0, 1, 3]


def test_sparse_bags_keep_their_true_offsets():
    b = bag_events(*events((5 * HOUR + 10, "lab:1", 1.0), (30, "lab:1", 2.0)), T, cfg())
    assert b.num_bags == 2  # empty bags 1..4 are not emitted
    assert b.offset_seconds.tolist() == [5 * HOUR + 10, 30]


def test_events_at_or_after_trigger_are_dropped_and_counted():
    b = bag_events(*events((0, "lab:1", 1.0), (-5, "lab:1", 2.0), (-HOUR, "chart:9", np.nan),
                           (1, "lab:1", 4.0)), T, cfg())
    assert b.n_dropped_by_reason == {DROP_AT_OR_AFTER_TRIGGER: 3, DROP_OLDER_THAN_MAX_BAGS: 0}
    assert b.n_events_used == 1
    assert per_bag(b, "codes") == [["lab:1"]]
    assert b.value_last.tolist() == [4.0]  # the newer values at/after the trigger never leak in


def test_old_events_collapse_into_one_history_bag():
    older_than = 3 * HOUR
    b = bag_events(*events((older_than, "lab:1", 1.0),  # not older than the threshold: bag 3
                           (older_than + 1, "lab:1", 2.0), (100 * HOUR, "lab:2", 3.0),
                           (9 * HOUR, "lab:1", 4.0), (10, "chart:5", 5.0)), T,
                   cfg(older_than=older_than))
    assert b.has_history_bag
    assert b.num_bags == 3
    assert per_bag(b, "codes") == [["lab:1", "lab:2"], ["lab:1"], ["chart:5"]]
    assert per_bag(b, "counts") == [[2, 1], [1], [1]]
    assert b.offset_seconds.tolist() == [older_than + 1, older_than, 10]
    assert per_bag(b, "value_last")[0] == [2.0, 3.0]  # the youngest history value per code


def test_history_bag_off_by_default_and_flag_false():
    b = bag_events(*events((100 * HOUR, "lab:1", 1.0), (1, "lab:1", 2.0)), T, cfg())
    assert b.num_bags == 2 and not b.has_history_bag


def test_max_bags_keeps_the_newest_bags():
    rows = [(k * HOUR + 1, f"lab:{k}", float(k)) for k in (0, 2, 5, 9)] + [(9 * HOUR + 2, "lab:9", 0.0)]
    b = bag_events(*events(*rows), T, cfg(max_bags=2))
    assert per_bag(b, "codes") == [["lab:2"], ["lab:0"]]
    assert b.n_dropped_by_reason[DROP_OLDER_THAN_MAX_BAGS] == 3
    assert b.n_events_used == 2


def test_history_bag_counts_as_a_bag_and_is_dropped_first():
    rows = [(1, "lab:1", 1.0), (HOUR + 1, "lab:2", 2.0), (50 * HOUR, "lab:3", 3.0)]
    kept = bag_events(*events(*rows), T, cfg(older_than=10 * HOUR, max_bags=3))
    assert kept.has_history_bag and kept.num_bags == 3
    cut = bag_events(*events(*rows), T, cfg(older_than=10 * HOUR, max_bags=2))
    assert not cut.has_history_bag
    assert per_bag(cut, "codes") == [["lab:2"], ["lab:1"]]
    assert cut.n_dropped_by_reason[DROP_OLDER_THAN_MAX_BAGS] == 1


def test_numeric_aggregates_match_a_hand_computation():
    # One bag: lab:1 at ages 50, 40, 30 with 2.0, NaN, 7.0 and once more at age 40 with 3.0.
    b = bag_events(*events((50, "lab:1", 2.0), (40, "lab:1", np.nan), (30, "lab:1", 7.0),
                           (40, "lab:1", 3.0), (20, "chart:2", -1.5), (60, "chart:2", 10.0)),
                   T, cfg())
    assert per_bag(b, "codes") == [["chart:2", "lab:1"]]
    assert per_bag(b, "counts") == [[2, 4]]
    assert per_bag(b, "value_count") == [[2, 3]]
    assert per_bag(b, "value_mean") == [[(10.0 - 1.5) / 2, (2.0 + 7.0 + 3.0) / 3]]
    assert per_bag(b, "value_last") == [[-1.5, 7.0]]  # the youngest (age 30 / 20), not the last row
    assert per_bag(b, "value_min") == [[-1.5, 2.0]]
    assert per_bag(b, "value_max") == [[10.0, 7.0]]
    assert b.offset_seconds.tolist() == [20]


def test_codes_without_values_are_counted_with_zero_aggregates():
    b = bag_events(*events((10, "diagnosis:4019", np.nan), (20, "diagnosis:4019", np.nan),
                           (10, "procedure:9604", np.inf), (10, "lab:1", 1.0)), T, cfg())
    assert per_bag(b, "codes") == [["diagnosis:4019", "lab:1", "procedure:9604"]]
    assert per_bag(b, "counts") == [[2, 1, 1]]
    assert per_bag(b, "value_count") == [[0, 1, 0]]  # +-inf is "no value" like NaN
    assert per_bag(b, "value_mean") == [[0.0, 1.0, 0.0]]
    assert per_bag(b, "value_last") == [[0.0, 1.0, 0.0]]


def test_none_values_mean_no_value():
    b = bag_events(T - np.array([5, 6]), np.array(["lab:1", "lab:1"]), [None, 4.0], T, cfg())
    assert b.value_count.tolist() == [1] and b.value_last.tolist() == [4.0]


def test_last_value_tie_on_time_goes_to_the_larger_value_in_any_input_order():
    # The job's canonical order (time, code, value) puts the larger value last; the service
    # sees request order. Both must bag 2.0.
    rows = [(10, "lab:1", 1.0), (10, "lab:1", 2.0), (10, "lab:1", np.nan)]
    for perm in itertools.permutations(rows):
        assert bag_events(*events(*perm), T, cfg()).value_last.tolist() == [2.0]


def test_the_sign_of_a_zero_does_not_depend_on_input_order():
    rows = [(10, "lab:1", -0.0), (10, "lab:1", 0.0)]
    for perm in (rows, rows[::-1]):
        b = bag_events(*events(*perm), T, cfg())
        for field in ("value_mean", "value_last", "value_min", "value_max"):
            assert np.signbit(getattr(b, field)).tolist() == [False], field


def test_prescriptions_are_bagged_at_the_end_of_their_day():
    """bag_events applies known_time: a prescription sent at its start time counts from 23:59:59 of that day."""
    midnight = T - T % DAY
    times = np.array([midnight + 9 * HOUR, midnight - DAY + 9 * HOUR, midnight + 9 * HOUR])
    codes = np.array(["prescription:Heparin", "prescription:Heparin", "lab:1"])
    b = bag_events(times, codes, np.array([np.nan, np.nan, 1.0]), T, cfg(precision=DAY))
    assert b.n_dropped_by_reason[DROP_AT_OR_AFTER_TRIGGER] == 1  # today's: known only tonight
    assert per_bag(b, "codes") == [["lab:1", "prescription:Heparin"]]
    assert b.offset_seconds.tolist() == [T - midnight - 9 * HOUR]  # the lab's age, the newer of the two
    stamped = bag_events(bagging.known_time("prescription", times[:2]), codes[:2], [np.nan] * 2, T, cfg())
    assert stamped.offset_seconds.tolist() == [T - (midnight - 1)]  # already known: moved no further


def test_known_time_keeps_each_rule_and_changes_no_known_time():
    times = np.array([0, 1, DAY - 1, DAY, -1, 1_600_000_000])
    for source in bagging.KNOWN_TIME_RULES:
        once = bagging.known_time(source, times)
        np.testing.assert_array_equal(bagging.known_time(source, once), once)  # idempotent
    assert bagging.known_time("prescription", times).tolist() == [DAY - 1, DAY - 1, DAY - 1, 2 * DAY - 1, -1,
                                                                  1_600_041_599]
    assert bagging.known_time("lab", times).tolist() == times.tolist()
    with pytest.raises(ValueError, match="radiology"):
        bagging.known_time("radiology", times)


@given(st.lists(st.integers(-10**11, 10**11), max_size=30), st.data())
@settings(max_examples=60, deadline=None)
def test_known_time_against_a_naive_reference(times, data):
    """Per source: as recorded, or the day's last second for prescriptions and for date-only times."""
    dated = data.draw(st.lists(st.booleans(), min_size=len(times), max_size=len(times)))
    for source in bagging.KNOWN_TIME_RULES:
        got = bagging.known_time(source, np.array(times, np.int64), np.array(dated, bool)).tolist()
        for t, d, g in zip(times, dated, got):
            day_end = (t // DAY) * DAY + DAY - 1  # Python's // floors, as the rule must before 1970
            expected = day_end if (source == "prescription" or d) else t
            assert g == expected, (source, t, d)


def test_end_of_day_is_the_last_second_of_that_day():
    midnight = T - T % DAY
    got = bagging.end_of_day(np.array([midnight, midnight + 13 * HOUR, midnight + DAY - 1, midnight + DAY, -1]))
    assert got.tolist() == [midnight + DAY - 1] * 3 + [midnight + 2 * DAY - 1, -1]
    assert dt.datetime.fromtimestamp(int(got[0]), dt.timezone.utc).time() == dt.time(23, 59, 59)


def test_mean_is_bit_identical_under_any_input_order():
    # Floating-point addition is order-dependent: (1e16 + 1) - 1e16 = 0 but (1e16 - 1e16) + 1 = 1.
    rows = [(10, "lab:1", 1e16), (20, "lab:1", 1.0), (30, "lab:1", -1e16)]
    means = {bag_events(*events(*[rows[i] for i in perm]), T, cfg()).value_mean[0]
             for perm in itertools.permutations(range(3))}
    assert len(means) == 1


def test_empty_input_gives_zero_bags():
    for b in (bag_events([], [], [], T, cfg()), bag_events(*events(), T, cfg()),
              bag_events(*events((0, "lab:1", 1.0)), T, cfg())):
        assert b.num_bags == 0
        assert b.row_splits.tolist() == [0]
        assert b.codes.shape == b.counts.shape == b.value_mean.shape == (0,)
        assert b.n_events_used == 0
        assert not b.has_history_bag
    assert b.n_dropped_by_reason[DROP_AT_OR_AFTER_TRIGGER] == 1


def test_bags_are_read_only():
    b = bag_events(*events((10, "lab:1", 1.0)), T, cfg())
    with pytest.raises(ValueError):
        b.counts[0] = 5
    with pytest.raises(AttributeError):
        b.n_events_used = 3  # type: ignore[misc]


@pytest.mark.parametrize("times, codes, values, trigger, error, match", [
    ([1.5], ["lab:1"], [1.0], T, TypeError, "integer seconds"),
    ([1, 2], ["lab:1"], [1.0, 2.0], T, ValueError, "equally long"),
    ([1], ["lab1"], [1.0], T, ValueError, "lab1"),
    ([1], ["blood:1"], [1.0], T, ValueError, "blood:1"),
    ([1], ["lab:"], [1.0], T, ValueError, "lab:"),
    ([1], ["lab: 50912"], [1.0], T, ValueError, "whitespace"),
    ([1], ["lab:50912\u00a0"], [1.0], T, ValueError, "whitespace"),
    ([1], np.array([None], dtype=object), [1.0], T, ValueError, "None"),
    ([1], [7], [1.0], T, TypeError, "codes"),
    ([1], ["lab:1"], [1.0], float(T), TypeError, "trigger_time"),
    ([1], ["lab:1"], [1.0], True, TypeError, "trigger_time"),
])
def test_bad_inputs_are_refused_with_a_clear_message(times, codes, values, trigger, error, match):
    with pytest.raises(error, match=match):
        bag_events(times, codes, values, trigger, cfg())


# ---------------------------------------------------------------- properties ----------

CODES = ("lab:1", "lab:2", "chart:a", "diagnosis:4019", "prescription:Heparin Sodium")
event_rows = st.lists(st.tuples(
    st.integers(-5, 60),  # age in seconds; <= 0 is at/after the trigger
    st.sampled_from(CODES),
    st.one_of(st.just(math.nan), st.sampled_from([0.0, -0.0, 1.0, -2.5]),
              st.floats(-1e6, 1e6, allow_nan=False)),
), max_size=40)
configs = st.builds(cfg, precision=st.sampled_from([1, 3, 7, 10, 100]),
                    older_than=st.sampled_from([-1, 0, 4, 20]), max_bags=st.sampled_from([1, 2, 3, 50]))


def reference_bags(rows, config: BaggingConfig) -> dict:
    """Per-event, dictionary-based bagging written straight from the documented rules."""
    history = math.inf  # sorts after every regular bag index: the oldest
    slots: dict[float, dict[str, list[tuple[int, int, float]]]] = {}
    future = 0
    for i, (age, code, value) in enumerate(rows):
        if code.startswith("prescription:"):  # known at the end of its day (23:59:59)
            recorded = T - age
            age = T - (recorded // DAY * DAY + DAY - 1)
        value = value + 0.0  # a zero's sign is dropped
        if age <= 0:
            future += 1
            continue
        older = config.bagging_aggregate_older_than
        slot = history if 0 <= older < age else age // config.bagging_time_precision
        slots.setdefault(slot, {}).setdefault(code, []).append((age, i, value))
    kept = sorted(slots)[:config.max_bags]  # newest first
    out = {"codes": [], "counts": [], "value_count": [], "value_mean": [], "value_last": [], "value_min": [],
           "value_max": [],
           "offset": [], "history": bool(kept) and kept[-1] == history,
           "dropped": {DROP_AT_OR_AFTER_TRIGGER: future,
                       DROP_OLDER_THAN_MAX_BAGS: sum(len(e) for s in slots if s not in kept
                                                     for e in slots[s].values())}}
    for slot in reversed(kept):  # oldest first
        bag = slots[slot]
        out["offset"].append(min(age for evs in bag.values() for age, _, _ in evs))
        codes = sorted(bag)
        nums = [[(a, i, v) for a, i, v in bag[c] if math.isfinite(v)] for c in codes]
        out["codes"].append(codes)
        out["counts"].append([len(bag[c]) for c in codes])
        out["value_count"].append([len(n) for n in nums])
        out["value_mean"].append([math.fsum(v for _, _, v in n) / len(n) if n else 0.0 for n in nums])
        # The newest; among equally new values, the largest.
        out["value_last"].append([max(n, key=lambda e: (-e[0], e[2]))[2] if n else 0.0 for n in nums])
        out["value_min"].append([min(v for _, _, v in n) if n else 0.0 for n in nums])
        out["value_max"].append([max(v for _, _, v in n) if n else 0.0 for n in nums])
    return out


@settings(max_examples=200, deadline=None)
@given(rows=event_rows, config=configs)
def test_matches_the_naive_reference(rows, config):
    b = bag_events(*events(*rows), T, config)
    ref = reference_bags(rows, config)
    for field in ("codes", "counts", "value_count", "value_last", "value_min", "value_max"):
        assert per_bag(b, field) == ref[field], field
    np.testing.assert_allclose(np.concatenate([[]] + [np.array(m) for m in ref["value_mean"]]),
                               b.value_mean, rtol=1e-12, atol=1e-9)
    assert b.offset_seconds.tolist() == ref["offset"]
    assert b.has_history_bag == ref["history"]
    assert b.n_dropped_by_reason == ref["dropped"]
    assert b.n_events_used + sum(ref["dropped"].values()) == len(rows)
    assert b.num_bags <= config.max_bags


@settings(max_examples=150, deadline=None)
@given(rows=event_rows, config=configs, data=st.data())
def test_output_does_not_depend_on_input_order(rows, config, data):
    perm = data.draw(st.permutations(range(len(rows))))
    a = bag_events(*events(*rows), T, config)
    b = bag_events(*events(*[rows[i] for i in perm]), T, config)
    assert a.codes.tolist() == b.codes.tolist()
    for field in ("offset_seconds", "row_splits", "counts", "value_count", "value_mean", "value_last", "value_min",
                  "value_max"):
        # Bit-identical, the sign of zeros included (assert_array_equal has -0.0 == 0.0).
        assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), field
    assert (a.has_history_bag, a.n_events_used, a.n_dropped_by_reason) == \
           (b.has_history_bag, b.n_events_used, b.n_dropped_by_reason)
