"""Bagging: one admission's timestamped events -> per-code aggregates in time bags.

This is the single implementation used both by the Beam job (training data) and by the
prediction service (request data), so the two cannot skew. It is pure numpy: no Beam, no
TensorFlow, no Keras, cheap to import. It is vectorised (sorts and segment reductions, no
per-event Python loop) because the job runs it for ~60k admissions of thousands of events.

Semantics (docs/spec.md has a worked example):

* ``age = trigger_time - time`` in seconds. Events with ``age <= 0`` (at or after the
  trigger) are never bagged; they are counted under ``at_or_after_trigger``.
* Bag index ``k = age // precision``: bag 0 holds ages in ``[1, precision - 1]`` seconds (an
  event exactly ``precision`` seconds old is in bag 1).
* With ``bagging_aggregate_older_than >= 0``, every event with ``age > older_than`` goes to
  one history bag, which is older than every regular bag.
* Only non-empty bags are emitted, oldest first; each bag's ``offset_seconds`` says where it
  lies in time. If there are more than ``max_bags``, the newest ``max_bags`` are kept (the
  history bag counts as a bag, and being the oldest it is the first dropped); events of the
  dropped bags are counted under ``older_than_max_bags``.
* Within a bag, codes are distinct and sorted by code point order.

Event normalisation lives here and in ``spec`` too, so the job and the service cannot skew:
each event is moved to when its source makes it known (``known_time``; a no-op for events
already stamped so), codes must be normalised (``spec.format_code``), and the result does not
depend on the order of the input events (``value_last`` breaks ties in time by value, as the
job's ``canonical_order`` would, and a zero's sign is dropped).
"""
from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping

import numpy as np

from ehr_pipeline.contract import BaggingConfig, spec

DROP_AT_OR_AFTER_TRIGGER = "at_or_after_trigger"
DROP_OLDER_THAN_MAX_BAGS = "older_than_max_bags"
# Every reason is always reported (zero included) so counters and manifests are stable.
DROP_REASONS = (DROP_AT_OR_AFTER_TRIGGER, DROP_OLDER_THAN_MAX_BAGS)

_ENTRY_FIELDS = {  # per-(bag, code) arrays and their dtypes
    "codes": object,
    "counts": np.int64,
    "value_count": np.int64,
    "value_mean": np.float64,
    "value_last": np.float64,
    "value_min": np.float64,
    "value_max": np.float64,
}


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: == on numpy arrays is ambiguous
class Bags:
    """One admission's bags, oldest first, in ragged form (flat entries + row_splits).

    Bag ``i`` owns entries ``row_splits[i]:row_splits[i + 1]`` of ``codes``, ``counts``,
    ``value_count``, ``value_mean``, ``value_last``, ``value_min`` and ``value_max``. Arrays
    are read-only; the numeric field names equal the spec's feature names.
    """

    offset_seconds: np.ndarray  # int64 [n_bags]: trigger time minus the bag's newest event, s
    row_splits: np.ndarray  # int64 [n_bags + 1]
    codes: np.ndarray  # object (str) [n_entries]: "source:code", distinct within a bag, sorted
    counts: np.ndarray  # int64 [n_entries]: events of the code in the bag
    value_count: np.ndarray  # int64 [n_entries]: events with a finite numeric value
    value_mean: np.ndarray  # float64 [n_entries]: mean of those values, 0 when value_count = 0
    value_last: np.ndarray  # float64 [n_entries]: newest of those values, 0 when value_count = 0
    value_min: np.ndarray  # float64 [n_entries]: smallest of those values, 0 when value_count = 0
    value_max: np.ndarray  # float64 [n_entries]: largest of those values, 0 when value_count = 0
    has_history_bag: bool  # True when bag 0 is the history bag
    n_events_used: int  # events that landed in a kept bag
    n_dropped_by_reason: Mapping[str, int]  # every name in DROP_REASONS -> events dropped

    def __post_init__(self) -> None:
        # Read-only views: a frozen dataclass should not hand out mutable arrays, and a
        # view leaves any array the caller passed in untouched.
        fields = {"offset_seconds": np.int64, "row_splits": np.int64, **_ENTRY_FIELDS}
        for name, dtype in fields.items():
            arr = np.asarray(getattr(self, name), dtype=dtype).view()
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        splits, n_entries = self.row_splits, len(self.codes)
        if (splits.ndim != 1 or len(splits) != len(self.offset_seconds) + 1 or splits[0] != 0
                or splits[-1] != n_entries or np.any(np.diff(splits) < 0)):
            raise ValueError("Bags.row_splits must run from 0 to len(codes), one more than the bags")
        for name in _ENTRY_FIELDS:
            if getattr(self, name).shape != (n_entries,):
                raise ValueError(f"Bags.{name} must have one entry per code, like Bags.codes")
        object.__setattr__(self, "n_dropped_by_reason",
                           {r: int(self.n_dropped_by_reason.get(r, 0)) for r in DROP_REASONS})

    @property
    def num_bags(self) -> int:
        """Number of bags (the sequence length)."""
        return len(self.offset_seconds)

    def bag_slice(self, i: int) -> slice:
        """The entries of bag ``i`` (0 = oldest) as a slice into the per-code arrays."""
        return slice(int(self.row_splits[i]), int(self.row_splits[i + 1]))


def bag_events(
    times: np.ndarray,
    codes: np.ndarray,
    values: np.ndarray,
    trigger_time: int,
    config: BaggingConfig,
) -> Bags:
    """Bags the events known before trigger_time; times and trigger_time in seconds since 1970, NaN value = none."""
    times, codes, values = _check_events(times, codes, values)
    trigger = _check_seconds(trigger_time)
    precision = config.bagging_time_precision
    older_than = config.bagging_aggregate_older_than
    if times.size == 0:
        return _empty_bags({DROP_AT_OR_AFTER_TRIGGER: 0, DROP_OLDER_THAN_MAX_BAGS: 0})

    vocab, code_id = np.unique(codes, return_inverse=True)
    vocab_source = _check_codes(vocab)
    times = _known_times(times, vocab_source, code_id)
    # -0.0 == 0.0 sorts as a tie, so which one reached value_min / value_last would depend on
    # the input order; the sign of a zero measurement carries no information.
    values = values + 0.0

    age = trigger - times  # seconds before the trigger
    past = age > 0
    n_future = int(age.size - np.count_nonzero(past))
    age, code_id, values = age[past], code_id[past], values[past]

    slot = age // precision
    history_slot = older_than // precision + 1  # one past the oldest regular bag
    if older_than >= 0:
        slot = np.where(age > older_than, history_slot, slot)

    # Ascending slot = newest bag first, so truncation to the newest is a prefix.
    slots, newest_first = np.unique(slot, return_inverse=True)
    n_bags = min(len(slots), config.max_bags)
    kept = newest_first < n_bags
    n_too_old = int(kept.size - np.count_nonzero(kept))
    if n_too_old:
        age, code_id, values, newest_first = age[kept], code_id[kept], values[kept], newest_first[kept]
    dropped = {DROP_AT_OR_AFTER_TRIGGER: n_future, DROP_OLDER_THAN_MAX_BAGS: n_too_old}
    if age.size == 0:
        return _empty_bags(dropped)
    bag = (n_bags - 1) - newest_first  # oldest first

    vocab = vocab.astype(object)  # Python str out, like the caller's codes
    # One entry per (bag, code); unique() sorts keys by bag, then by code.
    keys, entry, counts = np.unique(bag * len(vocab) + code_id, return_inverse=True,
                                    return_counts=True)
    entry_bag = keys // len(vocab)
    row_splits = np.concatenate(([0], np.cumsum(np.bincount(entry_bag, minlength=n_bags))))
    offsets = np.full(n_bags, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(offsets, bag, age)  # newest event of each bag
    numeric = _numeric_aggregates(entry, len(keys), age, values)
    return Bags(
        offset_seconds=offsets,
        row_splits=row_splits,
        codes=vocab[keys % len(vocab)],
        counts=counts,
        **numeric,
        has_history_bag=bool(older_than >= 0 and slots[n_bags - 1] == history_slot),
        n_events_used=int(age.size),
        n_dropped_by_reason=dropped,
    )


def _numeric_aggregates(entry: np.ndarray, n_entries: int, age: np.ndarray, values: np.ndarray
                        ) -> dict[str, np.ndarray]:
    """Per-entry value_count, value_mean, value_last, value_min, value_max of the finite values (0 if none)."""
    numeric = np.isfinite(values)  # NaN means "no value"; +-inf would poison the mean
    entry, values, age = entry[numeric], values[numeric], age[numeric]
    value_count = np.bincount(entry, minlength=n_entries).astype(np.int64)
    mean, last, low, high = (np.zeros(n_entries) for _ in range(4))
    out = {"value_count": value_count, "value_mean": mean, "value_last": last, "value_min": low,
           "value_max": high}
    if entry.size == 0:
        return out
    # Sum each entry's values in ascending value order: floating-point addition is not
    # associative, and this makes the mean bit-identical whatever order the input came in.
    by_value = np.lexsort((values, entry))
    starts = np.flatnonzero(np.r_[True, np.diff(entry[by_value]) != 0])
    present = entry[by_value][starts]
    mean[present] = np.add.reduceat(values[by_value], starts) / value_count[present]
    ends = np.r_[starts[1:], entry.size] - 1
    low[present] = values[by_value][starts]  # segments are in ascending value order
    high[present] = values[by_value][ends]
    # Same segments (both orders sort by entry first); within one, oldest first and, on
    # equal times, smallest value first (canonical_order's order, whatever the input order),
    # so each segment's last element is the newest value.
    by_time = np.lexsort((values, -age, entry))
    last[present] = values[by_time][ends]
    return out


def _empty_bags(dropped: dict[str, int]) -> Bags:
    """Zero bags: a valid (empty) sequence, e.g. an admission with no events before the trigger."""
    return Bags(
        offset_seconds=np.zeros(0, np.int64), row_splits=np.zeros(1, np.int64),
        codes=np.zeros(0, object), counts=np.zeros(0, np.int64),
        value_count=np.zeros(0, np.int64), value_mean=np.zeros(0), value_last=np.zeros(0),
        value_min=np.zeros(0), value_max=np.zeros(0), has_history_bag=False, n_events_used=0, n_dropped_by_reason=dropped,
    )


def _check_seconds(t: object) -> int:
    """An integral number of seconds as a Python int; bool and float are refused."""
    if isinstance(t, bool) or not isinstance(t, numbers.Integral):
        raise TypeError(f"trigger_time must be integer seconds, got {type(t).__name__}")
    return int(t)


def _check_events(times, codes, values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coerces the three event arrays, checking they are 1-D, aligned and typed."""
    times, codes = np.asarray(times), np.asarray(codes)
    values = np.asarray(values, dtype=np.float64)  # None becomes NaN: "no value"
    n = times.shape[0] if times.ndim == 1 else -1
    if n < 0 or codes.shape != (n,) or values.shape != (n,):
        raise ValueError(f"times, codes and values must be 1-D and equally long, got shapes "
                         f"{times.shape}, {codes.shape}, {values.shape}")
    if n == 0:  # np.asarray([]) is float64; an empty input is still valid
        return times.astype(np.int64), codes.astype(object), values
    if times.dtype.kind not in "iu":
        raise TypeError(f"times must be integer seconds since 1970, got dtype {times.dtype}")
    if codes.dtype.kind not in "UOT":
        raise TypeError(f"codes must be strings 'source:code', got dtype {codes.dtype}")
    # Fixed-width unicode sorts in C, about twice as fast as Python str objects. A stray
    # None or number becomes 'None' / '3' here, which _check_codes then rejects.
    return times.astype(np.int64, copy=False), codes.astype(np.str_, copy=False), values


def _check_codes(vocab: np.ndarray) -> np.ndarray:
    """The source of each distinct code (cheap: not every event); refuses codes that are not
    'source:code' with a known source and a code text that spec.format_code left as it is."""
    source, sep, rest = np.strings.partition(vocab, spec.CODE_SEPARATOR)
    bad = ~(np.isin(source, spec.SOURCES) & (sep == spec.CODE_SEPARATOR) & (np.strings.str_len(rest) > 0))
    if np.any(bad):
        raise ValueError(f"code {str(vocab[bad][0])!r} is not 'source{spec.CODE_SEPARATOR}code' "
                         f"with a source in {spec.SOURCES}")
    padded = np.strings.strip(rest, spec.CODE_WHITESPACE) != rest
    if np.any(padded):
        raise ValueError(f"code {str(vocab[padded][0])!r} has surrounding whitespace: build codes with "
                         f"spec.format_code, as the job and the service do")
    return source


def _known_times(times: np.ndarray, vocab_source: np.ndarray, code_id: np.ndarray) -> np.ndarray:
    """Each event's time moved by its source's known_time rule (one call per source present)."""
    names, source_of_code = np.unique(vocab_source, return_inverse=True)
    event_source = source_of_code[code_id]
    out = np.empty_like(times)
    for i, source in enumerate(names.tolist()):
        at = event_source == i
        out[at] = known_time(source, times[at])
    return out


# ----------------------------------------------------------------------------- known time
# When the information of each source becomes known (docs/task.md). The caller picks the time
# its record states (CHARTTIME, ENDTIME, STARTDATE, the admission's effective discharge; for
# FHIR: effective[x], authoredOn, the encounter's period.end); the rule does the rest. The job
# stamps events with it when it extracts them, and bag_events applies it again (each rule
# leaves a known time as it is), so a service client that sends a prescription's start time
# gets it bagged where the job bagged it.
AS_RECORDED = "as_recorded"  # charted, resulted, or (inputs) the end of what was given
END_OF_DAY = "end_of_day"  # a dated order: the last second of its day
AT_DISCHARGE = "at_discharge"  # billing codes: the (effective) discharge of their admission
KNOWN_TIME_RULES: dict[str, str] = {
    "lab": AS_RECORDED,
    "chart": AS_RECORDED,
    "output": AS_RECORDED,
    "input": AS_RECORDED,
    "prescription": END_OF_DAY,
    "diagnosis": AT_DISCHARGE,
    "procedure": AT_DISCHARGE,
}
SECONDS_PER_DAY = 86400


def end_of_day(seconds: np.ndarray) -> np.ndarray:
    """The last second (23:59:59) of the day containing each time, int64 seconds since 1970.

    A date-only value (MIMIC writes it as midnight) may describe anything during that
    day, so it is only certainly known once the day is over. Whole-second timestamps
    end at 23:59:59, which also keeps the event on its own calendar day.
    """
    seconds = np.asarray(seconds, dtype=np.int64)
    # floor_divide rounds towards minus infinity, so pre-1970 days work too.
    return np.floor_divide(seconds, SECONDS_PER_DAY) * SECONDS_PER_DAY + (SECONDS_PER_DAY - 1)


def known_time(source: str, recorded: np.ndarray, date_only: bool | np.ndarray = False) -> np.ndarray:
    """int64 s when events of `source` became known, from the time their record states (int64 s).

    Prescriptions are dated, so they are known at the end of their day; every other source is
    known at the time given (for diagnoses and procedures that time must be their admission's
    discharge, for MetaVision inputs the infusion's ENDTIME). A time that is only a date
    (`date_only`, per element or for all) may describe any moment of that day, so it too is
    known only at the day's end. Applying it to a known time changes nothing.
    """
    if source not in KNOWN_TIME_RULES:
        raise ValueError(f"unknown source {source!r}; known: {tuple(KNOWN_TIME_RULES)}")
    recorded = np.asarray(recorded, dtype=np.int64)
    if KNOWN_TIME_RULES[source] == END_OF_DAY:
        return end_of_day(recorded)
    dated = np.broadcast_to(np.asarray(date_only, dtype=bool), recorded.shape)
    return np.where(dated, end_of_day(recorded), recorded) if dated.any() else recorded


# ----------------------------------------------------------------------------- event order


def canonical_permutation(times: np.ndarray, codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Indices that sort events by (time s, code, value; no value first).

    Bags do not depend on the input order; this order makes everything else that sums
    floats over events (the job's code statistics) and lists them (the FHIR mapping's
    event list) independent of it too.
    """
    # A no-op for the job's fixed-width str arrays; object arrays (the FHIR mapping) are cast once.
    return np.lexsort((np.nan_to_num(values, nan=-np.inf), np.asarray(codes, dtype=np.str_), times))


def canonical_order(times: np.ndarray, codes: np.ndarray, values: np.ndarray):
    """(times, codes, values) sorted by canonical_permutation; the job's shuffle order then cannot change its output."""
    if times.size == 0:
        return times, codes, values
    order = canonical_permutation(times, codes, values)
    return times[order], codes[order], values[order]
