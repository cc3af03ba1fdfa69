"""The previous discharge: the vectorised rule against a naive loop over every pair of stays."""
import numpy as np
from hypothesis import given, settings, strategies as st

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import previous_stay

DAY = 86400


def naive(subject, admit, stays):
    """Per admission: (previous discharge or None, stays skipped without discharge, skipped after admit)."""
    out = []
    for s, a in zip(subject, admit):
        best, no_discharge, after = None, 0, 0
        for ss, sa, sd in stays:  # sd None: no discharge recorded
            if ss != s or not sa < a:
                continue
            if sd is None:
                no_discharge += 1
            elif sd > a:
                after += 1
            elif best is None or sd > best:
                best = sd
        out.append((best, no_discharge, after))
    return out


stay = st.tuples(st.integers(0, 3), st.integers(0, 60), st.one_of(st.none(), st.integers(0, 80)))


@settings(max_examples=200, deadline=None)
@given(st.lists(stay, max_size=12), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 60)), max_size=8))
def test_matches_the_naive_rule(stays, asked):
    stays = [(s, a * DAY, None if d is None else (a + d - 20) * DAY) for s, a, d in stays]
    subject = [s for s, _ in asked]
    admit = [a * DAY for _, a in asked]
    got = previous_stay.previous_discharges(
        subject, admit, [s for s, _, _ in stays], [a for _, a, _ in stays],
        [0 if d is None else d for _, _, d in stays], [d is not None for _, _, d in stays])
    want = naive(subject, admit, stays)
    assert [None if not f else int(t) for f, t in zip(got.found, got.time)] == [w[0] for w in want]
    assert got.skipped_no_discharge.tolist() == [w[1] for w in want]
    assert got.skipped_after_admit.tolist() == [w[2] for w in want]
    counts = got.counts()
    assert counts[previous_stay.WITH_PREVIOUS] + counts[previous_stay.WITHOUT_PREVIOUS] == len(asked)
    assert tuple(counts) == previous_stay.COUNTS


def test_three_stays_one_without_discharge_one_overlapping():
    # Subject 1: stays at days 0, 100 (no DISCHTIME), 200, 205 (the day-200 stay ends on day 210: overlapping).
    stays = ([1, 1, 1, 1], [0, 100 * DAY, 200 * DAY, 205 * DAY], [10 * DAY, 0, 210 * DAY, 220 * DAY],
             [True, False, True, True])
    got = previous_stay.previous_discharges([1, 1, 1, 1], [0, 100 * DAY, 200 * DAY, 205 * DAY], *stays)
    assert got.found.tolist() == [False, True, True, True]
    # The stay without a discharge is skipped: the third stay's previous discharge is the first's.
    assert got.time[1:].tolist() == [10 * DAY, 10 * DAY, 10 * DAY]
    assert got.skipped_no_discharge.tolist() == [0, 0, 1, 1]
    assert got.skipped_after_admit.tolist() == [0, 0, 0, 1]
    trigger = np.array([1, 101, 201, 206]) * DAY
    assert got.seconds_before(trigger, spec.NO_PREVIOUS_DISCHARGE).tolist() == [
        spec.NO_PREVIOUS_DISCHARGE, 91 * DAY, 191 * DAY, 196 * DAY]
    assert got.counts() == {previous_stay.WITH_PREVIOUS: 3, previous_stay.WITHOUT_PREVIOUS: 1,
                            previous_stay.SKIPPED_NO_DISCHARGE: 2, previous_stay.SKIPPED_DISCHARGED_AFTER_ADMIT: 1}
