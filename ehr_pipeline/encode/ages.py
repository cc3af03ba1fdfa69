"""Ages in years from int64 seconds, vectorised, exact on the calendar and overflow-free.

Why not ``(t - dob) / 365.25 days`` on nanosecond timestamps:

* MIMIC-III shifts the date of birth of every patient older than 89 at their first
  admission so that they appear about 300 years old (HIPAA: ages over 89 must not be
  revealed). 300 years is more than the 292 years an int64 of nanoseconds can span, so
  ``DISCHTIME - DOB`` in pandas/Arrow nanoseconds overflows. We stay in int64 SECONDS
  (good for +-292 billion years) and numpy ``datetime64[s]`` calendar arithmetic.
* A mean-year division is off by up to a day against the calendar, which moves
  patients across the 18-year inclusion cut-off (born 2100-03-01 and admitted on the
  18th birthday gives 17.999 with 365.2425-day years, because 2100 is no leap year).
  We count completed birthdays on the calendar, then add the elapsed fraction of the
  current year of life, so an admission on the 18th birthday is exactly 18.0.

The true age of a shifted patient is unknown (the MIMIC-III documentation gives a median
of 91.4 years for them); we cap every age at 90, so the shifted ~300 becomes 90 and no
model ever sees an impossible age. Real ages below 90 (e.g. 89.5) are left as they are.
"""
from __future__ import annotations

import logging

import numpy as np

from ehr_pipeline.contract import spec

logger = logging.getLogger(__name__)

AGE_CAP_YEARS = spec.AGE_CAP_YEARS  # 90.0: the one cap the spec, the job and the service share


def _anniversary(
    birth_year: np.ndarray,
    month_index: np.ndarray,
    day_index: np.ndarray,
    second_of_day: np.ndarray,
    years: np.ndarray,
) -> np.ndarray:
    """The instant (datetime64[s]) of the `years`-th birthday.

    A 29 February birthday falls on 1 March in common years (month start + 28 days),
    the convention several jurisdictions use for legal age.
    """
    year = birth_year + years.astype("timedelta64[Y]")
    day = (year.astype("datetime64[M]") + month_index.astype("timedelta64[M]")).astype("datetime64[D]")
    day = day + day_index.astype("timedelta64[D]")
    return day.astype("datetime64[s]") + second_of_day.astype("timedelta64[s]")


def age_years(dob_seconds: np.ndarray, at_seconds: np.ndarray) -> np.ndarray:
    """Exact calendar age in years (float64, uncapped) at `at_seconds` of people born at `dob_seconds`; both int64 seconds since 1970.

    Arrays broadcast against each other. Negative ages (time before birth) are returned
    as they are, for the caller to count.
    """
    dob_s, at_s = np.broadcast_arrays(
        np.asarray(dob_seconds, dtype=np.int64), np.asarray(at_seconds, dtype=np.int64)
    )
    # Viewing int64 seconds as datetime64[s] is free and keeps full int64 range.
    dob = dob_s.view("datetime64[s]")
    at = at_s.view("datetime64[s]")
    birth_year = dob.astype("datetime64[Y]")
    birth_month = dob.astype("datetime64[M]")
    birth_day = dob.astype("datetime64[D]")
    month_index = (birth_month - birth_year.astype("datetime64[M]")).astype(np.int64)
    day_index = (birth_day - birth_month.astype("datetime64[D]")).astype(np.int64)
    second_of_day = (dob - birth_day.astype("datetime64[s]")).astype(np.int64)

    def anniversary(years: np.ndarray) -> np.ndarray:
        return _anniversary(birth_year, month_index, day_index, second_of_day, years)

    completed = (at.astype("datetime64[Y]") - birth_year).astype(np.int64)
    # Calendar-year difference overcounts by one when this year's birthday is still ahead.
    completed = completed - (anniversary(completed) > at)
    last = anniversary(completed)
    following = anniversary(completed + 1)
    fraction = (at - last).astype(np.int64) / (following - last).astype(np.int64)
    return completed.astype(np.float64) + fraction


def cap_age(ages: np.ndarray, cap_years: float = AGE_CAP_YEARS) -> np.ndarray:
    """Ages in years with everything above `cap_years` (default 90) set to `cap_years`; NaN stays NaN."""
    return np.minimum(np.asarray(ages, dtype=np.float64), cap_years)

