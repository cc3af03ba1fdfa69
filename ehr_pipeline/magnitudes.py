"""How large a code's values typically are, and the plausibility bound a unit conversion must keep.

A conversion can be right for the units as written and wrong for the values: a unit string read
as the wrong unit, or a unit field that does not describe its values (an export writing "ng/mL"
on values that are in mg/dL). Both move the converted values by a factor of a thousand or more
away from where the code's values lie. So a conversion is **implausible** when the typical
magnitude of the values recorded in a unit, converted, lies outside ``[1 / BOUND, BOUND]`` times
the code's **training median** (the median |value| recorded in its canonical unit); its values
are then not used. Legitimate conversions move a code's values onto its training values (g/L to
mg/dL: a factor 100 on values 100 times smaller), far inside the bound; a factor the bound
refuses needs values a thousand times off.

Magnitudes are kept as a sketch: counts of |value| in bins of ``1 / BINS_PER_DECADE`` decade
(zeros in a bin of their own). Sketches of two files add up, so the Beam job builds one per
(code, unit) beside its unit census without holding the values, and the median read from it is
within 6% of the exact one, plenty for a bound of a factor 1000.

Where the numbers come from (docs/units.md, "Plausibility"):

* the training median: the job's own census (values recorded in the canonical unit), or with
  ``--units-from`` the reference's ``units.json`` ``medians`` (the model's training data); the
  service reads the export's ``units.json``;
* the typical magnitude of the values being converted: the job's census of the unit over the
  whole release; the service's request (its values of the code in that unit).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

BOUND = 1e3  # converted values must land within [1/BOUND, BOUND] x the training median
BINS_PER_DECADE = 20
# |value| == 0 and infinities get bins of their own, just outside the finite floats' (log10 of the
# smallest subnormal is -323.3, of the largest 308.3): every bin fits in [ZERO_BIN, INFINITE_BIN].
ZERO_BIN = -325 * BINS_PER_DECADE
INFINITE_BIN = 310 * BINS_PER_DECADE
# A census entry: (rows with a value, {bin: values}), summed over files by merge_tallies.
Tally = tuple[int, dict[int, int]]


def magnitude_bins(values: np.ndarray) -> np.ndarray:
    """The bin of each |value| (int64): floor(BINS_PER_DECADE * log10|v|), ZERO_BIN for 0, INFINITE_BIN for inf.

    No NaN: a census counts values, and NaN is no value.
    """
    magnitude = np.abs(np.asarray(values, dtype=np.float64))
    out = np.full(magnitude.shape, ZERO_BIN, dtype=np.int64)
    positive = magnitude > 0
    out[positive] = np.floor(np.minimum(BINS_PER_DECADE * np.log10(magnitude[positive]), INFINITE_BIN))
    return out


def sketch(values: np.ndarray) -> dict[int, int]:
    """{bin: values} of the values that are not NaN, as the job's census counts them (events.unit_counts)."""
    values = np.asarray(values, dtype=np.float64)
    bins, counts = np.unique(magnitude_bins(values[~np.isnan(values)]), return_counts=True)
    return {int(b): int(n) for b, n in zip(bins, counts)}


def merge_sketches(sketches: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """The sum of sketches."""
    out: dict[int, int] = {}
    for s in sketches:
        for b, k in s.items():
            out[b] = out.get(b, 0) + int(k)
    return out


def merge_tallies(tallies: Iterable[Tally]) -> Tally:
    """The sum of census entries (rows and sketches): associative, so Beam may combine in any order."""
    tallies = list(tallies)
    return sum(int(n) for n, _ in tallies), merge_sketches(s for _, s in tallies)


def typical(sketch_: Mapping[int, int] | None) -> float | None:
    """The median |value| of a sketch (its bin's geometric centre; 0.0 or inf for those bins); None when empty."""
    if not sketch_:
        return None
    total = sum(sketch_.values())
    seen = 0
    for b in sorted(sketch_):
        seen += sketch_[b]
        if 2 * seen >= total:  # the lower median: the same bin for the job's census and the service's request
            # Four digits: the bin is 12% wide, and units.json stays readable.
            if b in (ZERO_BIN, INFINITE_BIN):
                return 0.0 if b == ZERO_BIN else math.inf
            return float(f"{10 ** ((b + 0.5) / BINS_PER_DECADE):.4g}")
    raise AssertionError("unreachable: the loop ends at the last bin")


def moved_ratio(converted_typical: float, training_median: float | None) -> float | None:
    """|converted typical value| / training median; None when either is zero or unknown (nothing to judge)."""
    if training_median is None or not training_median > 0 or not math.isfinite(training_median):
        return None
    moved = abs(converted_typical)
    if not moved > 0 or not math.isfinite(moved):
        return None
    return moved / training_median


def plausible(ratio: float | None) -> bool:
    """Whether a conversion's ratio (moved_ratio) keeps the bound; a ratio that cannot be judged is."""
    return ratio is None or 1.0 / BOUND <= ratio <= BOUND
