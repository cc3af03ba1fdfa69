"""Ages: calendar-exact, vectorised, overflow-free on MIMIC's ~300-year-old shifted DOBs, capped at 90."""
import datetime as dt

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ehr_pipeline.encode import ages


def secs(text: str) -> int:
    """'YYYY-MM-DD[THH:MM:SS]' (UTC) -> int64 seconds since 1970, computed with the standard library."""
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp())


def completed_years(dob: dt.datetime, at: dt.datetime) -> int:
    """Birthdays passed, by hand; a 29 February birthday falls on 1 March in common years."""
    def birthday(year: int) -> dt.datetime:
        try:
            return dob.replace(year=year)
        except ValueError:  # 29 February in a common year
            return dob.replace(year=year, month=3, day=1)

    years = at.year - dob.year
    return years - 1 if birthday(at.year) > at else years


def test_normal_age_and_birthday_boundary():
    dob = secs("2100-06-15T08:00:00")
    got = ages.age_years(dob, np.array([secs("2150-06-15T08:00:00"), secs("2150-06-15T07:59:59"),
                                         secs("2150-12-15T08:00:00")]))
    assert got[0] == 50.0
    assert 49.99 < got[1] < 50.0
    # 183 of the 365 days of that year of life (2150-06-15 .. 2151-06-15) have passed.
    assert got[2] == pytest.approx(50 + 183 / 365)


def test_eighteenth_birthday_is_exactly_18_even_across_a_skipped_leap_year():
    # 2100 is not a leap year: 365.2425-day years would give 17.999 here and exclude an adult.
    dob = secs("2100-03-01")
    assert ages.age_years(dob, secs("2118-03-01")) == 18.0
    assert ages.age_years(dob, secs("2118-02-28T23:59:59")) < 18.0
    assert (secs("2118-03-01") - dob) / (365.2425 * 86400) < 18.0  # why the calendar is needed


def test_leap_day_birth():
    dob = secs("1880-02-29")  # a real DOB in the demo's PATIENTS
    got = ages.age_years(dob, np.array([secs("2180-02-29"), secs("2181-02-28"), secs("2181-03-01")]))
    assert got[0] == 300.0  # 2180 is a leap year: the birthday itself
    assert 300.99 < got[1] < 301.0  # common year: not yet on 28 February
    assert got[2] == 301.0  # ... but on 1 March


def test_shifted_dob_does_not_overflow_and_caps_at_90():
    # 1844 -> 2180 is 336 years: more than int64 nanoseconds can hold (292 years).
    dob, at = secs("1844-07-18"), secs("2180-01-01")
    with np.errstate(all="raise"):
        raw = ages.age_years(dob, at)
    expected = completed_years(dt.datetime(1844, 7, 18), dt.datetime(2180, 1, 1))
    assert int(np.floor(raw)) == expected == 335
    assert ages.cap_age(ages.age_years(dob, at)) == 90.0
    # Far outside any record, still finite and exact in whole years.
    assert ages.age_years(secs("0001-01-01"), secs("9999-01-01")) == 9998.0


def test_cap_leaves_real_ages_and_nan():
    got = ages.cap_age(np.array([17.0, 89.5, 90.0, 91.4, 300.2, np.nan]))
    np.testing.assert_array_equal(got[:5], [17.0, 89.5, 90.0, 90.0, 90.0])
    assert np.isnan(got[5])


def test_vectorised_broadcast_and_negative_age():
    at = np.array([secs("2120-01-01"), secs("2099-01-01")], dtype=np.int64)
    got = ages.age_years(secs("2100-01-01"), at)
    assert got.shape == (2,)
    assert got[0] == 20.0
    assert got[1] == -1.0  # before birth: reported, for the caller to count
    assert ages.age_years(np.array([], np.int64), np.array([], np.int64)).shape == (0,)


_dates = st.datetimes(min_value=dt.datetime(1800, 1, 1), max_value=dt.datetime(2300, 12, 31))


@settings(max_examples=300, deadline=None)
@given(dob=_dates, at=_dates)
def test_matches_hand_computed_completed_years(dob, at):
    dob, at = dob.replace(microsecond=0), at.replace(microsecond=0)
    to_s = lambda d: int(d.replace(tzinfo=dt.timezone.utc).timestamp())  # noqa: E731
    got = float(ages.age_years(to_s(dob), to_s(at)))
    assert int(np.floor(got)) == completed_years(dob, at)
