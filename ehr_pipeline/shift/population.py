"""A population of admissions in numbers: what the shift report (``ehr_pipeline.shift``) compares.

A model meets another population than the one it learnt from: another hospital's case mix,
units, codes and charting habits. To see that before anyone trusts a number, a population is
summarised into a ``Profile``: its size; case mix (age bands, gender, admission type); per
source, events per admission and the share of events whose code is out of the model's
vocabulary; per code, the admissions holding it, its events and, for numeric codes, the
distribution of ONE value per admission (the median of its bags' means: values of one
patient are not independent draws, admissions are); the units values arrived in and the unit
they were converted to; and, when a model has scored the admissions, its mutual information.

One function reads an admission for it, ``admission_from_entries``: the Beam job's records
(``admissions_from_examples``, the SequenceExamples of a data folder) and the service's bagged
requests (``admission_from_bags``) both go through it, so the export's reference and the
service's monitor count the same things. A reference profile keeps no raw values: each
numeric distribution is its count, its median with a 95% interval, and its counts in the bins
between its deciles; a profile of new data is binned on the reference's edges
(``Profile.build(..., bins_from=reference)``), which is all a comparison needs.

Pure numpy (no Beam, no Keras); only ``admissions_from_examples`` imports TensorFlow, to parse
the protos.
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ehr_pipeline.contract import layout, spec, tfrecord
from ehr_pipeline.encode import units as units_mod

FORMAT = "ehr-population-profile"
FORMAT_VERSION = 1
# Age bands of the case mix, years: lower bounds (the last band is open).
AGE_BANDS = (0.0, 1.0, 18.0, 40.0, 65.0, 80.0)
AGE_BAND_NAMES = ("<1", "1-17", "18-39", "40-64", "65-79", "80+")
# Reference bins of numeric distributions: between deciles. Tied deciles (discrete lab values,
# a value most admissions share) merge into one edge, so a point mass is one bin, not several.
DECILES = tuple(round(0.1 * k, 1) for k in range(1, 10))
# Mutual information is binned at these validation quantiles: the share above the 95th
# percentile is what the shift report reads (5% on validation by construction).
MI_QUANTILES = (0.5, 0.9, 0.95, 0.99)
# Relative distance under which two values are one when placing bin edges: floating-point noise
# of means and a unit conversion's rounding (a value written with 4 significant digits) stay in it.
TIE_TOLERANCE = 1e-3
_Z95 = 1.959963984540054


# ------------------------------------------------------------------------ one admission


@dataclasses.dataclass(frozen=True, eq=False)
class Admission:
    """One admission as the shift statistics see it: its case-mix fields and per distinct code its numbers."""

    age_years: float
    gender: str
    admission_type: str
    codes: np.ndarray  # object [n]: distinct codes 'source:code', sorted
    events: np.ndarray  # int64 [n]: events of the code in the admission's bags
    values: np.ndarray  # float64 [n]: median of the code's bag means (canonical unit); NaN = no value
    mutual_information: float = math.nan  # the model's, when it scored the admission (nats)


def admission_from_entries(age_years: float, gender: str, admission_type: str, codes: np.ndarray,
                           counts: np.ndarray, value_count: np.ndarray, value_mean: np.ndarray,
                           mutual_information: float = math.nan) -> Admission:
    """An Admission from its bags' per-code entries (spec's codes, code_counts, value_count, value_mean)."""
    codes = np.asarray(codes, dtype=object)
    if codes.size == 0:
        empty = np.zeros(0)
        return Admission(float(age_years), str(gender), str(admission_type), np.zeros(0, dtype=object),
                         empty.astype(np.int64), empty, float(mutual_information))
    distinct, inverse = np.unique(codes.astype(str), return_inverse=True)
    events = np.bincount(inverse, weights=np.asarray(counts, dtype=np.float64),
                         minlength=distinct.size).astype(np.int64)
    values = np.full(distinct.size, np.nan)
    valued = np.asarray(value_count) > 0
    if valued.any():
        ids, means = inverse[valued], np.asarray(value_mean, dtype=np.float64)[valued]
        order = np.lexsort((means, ids))  # by code, then by value
        ids, means = ids[order], means[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        sizes = np.diff(np.r_[starts, ids.size])
        lower, upper = means[starts + (sizes - 1) // 2], means[starts + sizes // 2]
        values[ids[starts]] = midpoint(lower, upper)  # the median of each code's bag means
    return Admission(float(age_years), str(gender), str(admission_type), distinct.astype(object), events, values,
                     float(mutual_information))


def admission_from_bags(age_years: float, gender: str, admission_type: str, bags: Any,
                        mutual_information: float = math.nan) -> Admission:
    """An Admission from ``bagging.Bags`` (the service's path)."""
    return admission_from_entries(age_years, gender, admission_type, bags.codes, bags.counts, bags.value_count,
                                  bags.value_mean, mutual_information)


def admissions_from_examples(records: Sequence[bytes], mutual_information: Sequence[float] | None = None,
                             batch_size: int = 512) -> list[Admission]:
    """Admissions of serialized SequenceExamples (the job's records), optionally with the model's MI per record."""
    # TensorFlow (~0.9 GB, ~4 s) only when records are parsed: the service builds admissions from
    # bags and must start without it.
    import tensorflow as tf

    from ehr_pipeline.contract import tf_parse

    if mutual_information is not None and len(mutual_information) != len(records):
        raise ValueError(f"{len(mutual_information)} mutual information values for {len(records)} records")
    out: list[Admission] = []
    for start in range(0, len(records), batch_size):
        parsed = tf_parse.parse_sequence_examples(tf.constant(list(records[start:start + batch_size])))
        codes = parsed[spec.BAG_CODES]
        per_example, per_bag = (s.numpy() for s in codes.nested_row_splits)
        flat = {key: parsed[key].flat_values.numpy() for key in (spec.BAG_CODES, spec.BAG_COUNTS,
                                                                 spec.BAG_VALUE_COUNT, spec.BAG_VALUE_MEAN)}
        ages = parsed[spec.AGE_YEARS].numpy()
        genders, types = parsed[spec.GENDER].numpy(), parsed[spec.ADMISSION_TYPE].numpy()
        for i in range(ages.size):
            lo, hi = per_bag[per_example[i]], per_bag[per_example[i + 1]]
            mi = math.nan if mutual_information is None else float(mutual_information[start + i])
            out.append(admission_from_entries(
                float(ages[i]), genders[i].decode(), types[i].decode(),
                np.array([c.decode() for c in flat[spec.BAG_CODES][lo:hi]], dtype=object),
                flat[spec.BAG_COUNTS][lo:hi], flat[spec.BAG_VALUE_COUNT][lo:hi], flat[spec.BAG_VALUE_MEAN][lo:hi], mi))
    return out


def read_records(data_dir: str | os.PathLike[str], split: str) -> list[bytes]:
    """Every serialized example of one split of a data folder (file order), read without TensorFlow.

    A damaged file (truncated, a bad CRC, not gzip) is a ValueError naming it.
    """
    paths = sorted(glob.glob(os.path.join(os.fspath(data_dir), spec.split_file_pattern(split))))
    if not paths:
        raise FileNotFoundError(f"{data_dir}: no TFRecord files for split {split!r}")
    records: list[bytes] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                records.extend(tfrecord.read_records(f))
        except (ValueError, EOFError, OSError, zlib.error) as err:  # gzip raises all of these on a cut file
            raise ValueError(f"{path}: not a readable TFRecord file ({type(err).__name__}: {err})") from None
    return records


# ------------------------------------------------------------------------ distributions


@dataclasses.dataclass(frozen=True)
class Distribution:
    """A numeric sample in summary: count, mean, median with its 95% interval, and counts per bin.

    Bin 0 holds values below ``edges[0]``, bin i values in ``[edges[i-1], edges[i])``, the last
    values at or above ``edges[-1]``.
    """

    n: int
    mean: float
    median: float
    median_low: float  # distribution-free 95% interval of the median (order statistics)
    median_high: float
    edges: tuple[float, ...]
    counts: tuple[int, ...]  # len(edges) + 1

    @classmethod
    def of(cls, values: np.ndarray, edges: Sequence[float] | None = None,
           quantiles: Sequence[float] = DECILES, merge_ties: bool = True) -> Distribution:
        """The summary of finite `values`, binned on `edges` (default: their own `quantiles`, ties merged)."""
        x = np.sort(np.asarray(values, dtype=np.float64))
        x = x[np.isfinite(x)]
        n = int(x.size)
        if edges is None:
            edges = _edges(x, quantiles, merge_ties)
        edges = tuple(float(e) for e in edges)
        counts = np.bincount(np.searchsorted(np.asarray(edges), x, side="right"), minlength=len(edges) + 1)
        if not n:
            return cls(0, math.nan, math.nan, math.nan, math.nan, edges, tuple(int(c) for c in counts))
        median = float(midpoint(x[(n - 1) // 2], x[n // 2]))
        # The ranks whose order statistics bracket the median with 95% confidence (normal
        # approximation to Binomial(n, 1/2)); with few values the interval is the range.
        half = _Z95 * math.sqrt(n) / 2.0
        low, high = max(int(math.floor(n / 2.0 - half)), 0), min(int(math.ceil(n / 2.0 + half)), n - 1)
        return cls(n, _mean(x), median, float(x[low]), float(x[high]), edges, tuple(int(c) for c in counts))

    def proportions(self) -> np.ndarray:
        """The share of values per bin (zeros when empty)."""
        counts = np.asarray(self.counts, dtype=np.float64)
        return counts / counts.sum() if counts.sum() else counts

    def share_at_or_above(self, edge_index: int) -> float:
        """Share of values at or above edges[edge_index]."""
        return float(self.proportions()[edge_index + 1:].sum())

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (NaN written as null)."""
        return {"n": self.n, "mean": _num(self.mean), "median": _num(self.median),
                "median_low": _num(self.median_low), "median_high": _num(self.median_high),
                "edges": list(self.edges), "counts": list(self.counts)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Distribution:
        """Inverse of to_json."""
        edges, counts = tuple(float(e) for e in doc["edges"]), tuple(int(c) for c in doc["counts"])
        if len(counts) != len(edges) + 1 or list(edges) != sorted(edges):
            raise ValueError("a distribution needs sorted edges and one count more than edges")
        return cls(int(doc["n"]), _float(doc.get("mean")), _float(doc.get("median")), _float(doc.get("median_low")),
                   _float(doc.get("median_high")), edges, counts)


def _edges(x: np.ndarray, quantiles: Sequence[float], merge_ties: bool) -> tuple[float, ...]:
    """Bin edges of sorted finite values at their quantiles, each moved halfway down to the next smaller value.

    Lab values are discrete (magnesium 1.9, 2.0, 2.1 mg/dL): an edge AT a value that many
    admissions share would send the same value converted from another unit (1.9998 from 0.8228
    mmol/L) to the bin below. Halfway to the next smaller value, the edge separates neighbours
    whatever the rounding; values within TIE_TOLERANCE of each other (2.0 and the mean
    2.0000000000000004 of 1.9, 2.0 and 2.1) count as one. An edge at the smallest value would
    leave an empty first bin and is dropped.

    A first or last bin that holds one value (a code whose training values are all one value, or
    a lab's lowest reportable value) is closed on its open side just past that value: values
    that move off a point mass land in a bin of their own, so a constant 5 read as 10 is a shift,
    not more of the same bin.
    """
    if not x.size:
        return ()
    cuts = _quantiles(x, quantiles)
    if not merge_ties:
        return tuple(float(c) for c in cuts)
    out = set()
    for cut in np.unique(cuts):
        with np.errstate(over="ignore"):  # a cut near the largest float: its tie reaches -inf, nothing below
            below = int(np.searchsorted(x, cut - _tie(cut), side="left"))
        if below == 0:
            continue
        out.add(float(midpoint(x[below - 1], cut)))
    edges = sorted(out)
    first = x[x < edges[0]] if edges else x
    last = x[x >= edges[-1]] if edges else x
    with np.errstate(over="ignore"):  # past the largest float: no closing edge
        low, high = float(x[0] - _tie(x[0])), float(x[-1] + _tie(x[-1]))
    if first.size and _one_value(first) and math.isfinite(low):
        edges.insert(0, low)
    if last.size and _one_value(last) and math.isfinite(high):
        edges.append(high)
    return tuple(edges)


def _quantiles(x: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """np.quantile of sorted finite values, without the overflow of interpolating between huge values."""
    with np.errstate(over="ignore", invalid="ignore"):
        cuts = np.quantile(x, quantiles)
    bad = ~np.isfinite(cuts)
    if bad.any():
        cuts[bad] = np.quantile(x, np.asarray(quantiles)[bad], method="nearest")
    return cuts


def _tie(value: float) -> float:
    """How far from `value` another value is still the same value (TIE_TOLERANCE relative; > 0 at 0)."""
    return TIE_TOLERANCE * max(abs(float(value)), np.finfo(np.float64).tiny)


def _one_value(sorted_values: np.ndarray) -> bool:
    return bool(sorted_values[-1] - sorted_values[0] <= _tie(max(abs(sorted_values[0]), abs(sorted_values[-1]))))


def midpoint(a: Any, b: Any) -> Any:
    """(a + b) / 2 that does not overflow for values near the largest float (elementwise on arrays)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        mid = (a + b) / 2.0
        # Halving first loses the smallest subnormals (5e-324 / 2 == 0): only where the sum overflowed.
        return np.where(np.isfinite(mid), mid, a / 2.0 + b / 2.0)


def _mean(x: np.ndarray) -> float:
    """The mean of finite values; scaled first when their sum would overflow."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean = float(x.mean())
    if not math.isfinite(mean):
        scale = float(np.max(np.abs(x)))
        mean = float((x / scale).mean() * scale)
    return mean


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


# ------------------------------------------------------------------------ a population


def unknown_codes(code_events: Mapping[str, int], vocabulary: Collection[str]) -> dict[str, dict[str, Any]]:
    """Per source: the split's events, those whose code the model does not know (read as the source's
    out-of-vocabulary token), their share and how many distinct codes they are (the shift report's
    out-of-vocabulary share; the evaluation report's TRIPOD+AI item 27a)."""
    known = frozenset(vocabulary)
    out: dict[str, dict[str, Any]] = {}
    for code, n in sorted(code_events.items()):
        row = out.setdefault(code.split(spec.CODE_SEPARATOR, 1)[0], {"events": 0, "unknown": 0, "unknown_codes": 0})
        row["events"] += n
        if code not in known:
            row["unknown"] += n
            row["unknown_codes"] += 1
    for row in out.values():
        row["share"] = row["unknown"] / row["events"] if row["events"] else 0.0
    return out


@dataclasses.dataclass(frozen=True)
class CodeStats:
    """One code in a population: admissions holding it, its events, and its values' distribution."""

    admissions: int
    events: int
    values: Distribution | None  # None: the code never had a value


@dataclasses.dataclass(frozen=True)
class Profile:
    """A population of admissions summarised (module docstring); JSON round trip with to_json / from_json."""

    n: int
    case_mix: Mapping[str, Mapping[str, int]]  # "age_band" / "gender" / "admission_type" -> category -> admissions
    age: Distribution
    events: Mapping[str, Distribution]  # source -> events per admission (every source in spec.SOURCES)
    oov: Mapping[str, tuple[int, int]]  # source -> (events, events whose code is not in the vocabulary)
    codes: Mapping[str, CodeStats]
    units: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)  # code -> unit as written -> rows
    canonical: Mapping[str, str] = dataclasses.field(default_factory=dict)  # code -> unit its values were converted to
    mutual_information: Distribution | None = None
    mi_samples: int | None = None  # S per member the mutual information was estimated with
    description: str = ""  # what population this is, for people

    @classmethod
    def build(cls, admissions: Iterable[Admission], *, vocabulary: Iterable[str] | None = None,
              bins_from: Profile | None = None, units: Mapping[str, Mapping[str, int]] | None = None,
              canonical: Mapping[str, str] | None = None, keep: Iterable[str] | None = None,
              mi_samples: int | None = None, description: str = "") -> Profile:
        """The profile of `admissions`.

        vocabulary: the model's codes; events of other codes count as out of vocabulary (without
        it, none do). bins_from: a reference whose bin edges the distributions use (new data is
        compared on the reference's bins). keep: only these codes get a per-code entry (a
        reference keeps the vocabulary's). units / canonical: the units values arrived in
        (units.json "codes") and the units they were converted to.
        """
        admissions = list(admissions)
        n = len(admissions)
        vocab = None if vocabulary is None else frozenset(vocabulary)
        ref = bins_from

        def dist(values: np.ndarray, ref_dist: Distribution | None) -> Distribution:
            return Distribution.of(values, ref_dist.edges if ref_dist is not None else None)

        case_mix = {"age_band": _counts(_age_band(a.age_years) for a in admissions),
                    "gender": _counts(a.gender for a in admissions),
                    "admission_type": _counts(a.admission_type for a in admissions)}
        ages = np.array([a.age_years for a in admissions], dtype=np.float64)

        all_codes = np.concatenate([a.codes for a in admissions]) if n else np.zeros(0, dtype=object)
        all_events = np.concatenate([a.events for a in admissions]) if n else np.zeros(0, dtype=np.int64)
        all_values = np.concatenate([a.values for a in admissions]) if n else np.zeros(0)
        which = np.repeat(np.arange(n), [a.codes.size for a in admissions]) if n else np.zeros(0, dtype=np.int64)
        distinct, inverse = (np.unique(all_codes.astype(str), return_inverse=True) if all_codes.size
                             else (np.zeros(0, dtype=str), np.zeros(0, dtype=np.int64)))
        sources = np.array([c.split(spec.CODE_SEPARATOR, 1)[0] for c in distinct], dtype=object)
        source_of_entry = sources[inverse] if all_codes.size else np.zeros(0, dtype=object)

        events_per_code = np.bincount(inverse, weights=all_events, minlength=distinct.size).astype(np.int64)
        unknown = unknown_codes(dict(zip(distinct.tolist(), events_per_code.tolist())),
                                distinct.tolist() if vocab is None else vocab)
        events, oov = {}, {}
        for source in spec.SOURCES:
            mine = source_of_entry == source
            per_admission = np.bincount(which[mine], weights=all_events[mine], minlength=n)[:n]
            events[source] = dist(per_admission, ref.events.get(source) if ref else None)
            row = unknown.get(source, {"events": 0, "unknown": 0})
            oov[source] = (row["events"], row["unknown"])

        wanted = None if keep is None else frozenset(keep)
        admissions_per_code = np.bincount(inverse, minlength=distinct.size)
        valued = ~np.isnan(all_values)
        order = np.argsort(inverse[valued], kind="stable")
        valued_ids, valued_values = inverse[valued][order], all_values[valued][order]
        bounds = np.searchsorted(valued_ids, np.arange(distinct.size + 1))
        codes: dict[str, CodeStats] = {}
        for k, code in enumerate(distinct.tolist()):
            if wanted is not None and code not in wanted:
                continue
            vals = valued_values[bounds[k]:bounds[k + 1]]
            ref_stats = ref.codes.get(code) if ref else None
            codes[code] = CodeStats(int(admissions_per_code[k]), int(events_per_code[k]),
                                    dist(vals, ref_stats.values if ref_stats else None) if vals.size else None)

        mi = np.array([a.mutual_information for a in admissions], dtype=np.float64)
        mi_dist = None
        if n and np.isfinite(mi).any():
            ref_mi = ref.mutual_information if ref else None
            mi_dist = Distribution.of(mi, ref_mi.edges if ref_mi else None, MI_QUANTILES, merge_ties=False)
        return cls(n=n, case_mix=case_mix, age=dist(ages, ref.age if ref else None), events=events, oov=oov,
                   codes=codes, units={c: dict(u) for c, u in (units or {}).items()}, canonical=dict(canonical or {}),
                   mutual_information=mi_dist, mi_samples=mi_samples, description=description)

    def with_mutual_information(self, values: np.ndarray, samples: int | None) -> Profile:
        """This profile with the model's mutual information (e.g. on the validation split) binned at MI_QUANTILES."""
        return dataclasses.replace(self, mutual_information=Distribution.of(values, quantiles=MI_QUANTILES,
                                                                            merge_ties=False), mi_samples=samples)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (key-sorted by the writer)."""
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "description": self.description, "n": self.n,
            "case_mix": {k: dict(v) for k, v in self.case_mix.items()}, "age": self.age.to_json(),
            "events_per_admission": {s: d.to_json() for s, d in self.events.items()},
            "oov": {s: {"events": e, "oov_events": o} for s, (e, o) in self.oov.items()},
            "codes": {c: {"admissions": s.admissions, "events": s.events,
                          "values": s.values.to_json() if s.values is not None else None}
                      for c, s in self.codes.items()},
            "units": {c: dict(u) for c, u in self.units.items()}, "canonical": dict(self.canonical),
            "mutual_information": self.mutual_information.to_json() if self.mutual_information is not None else None,
            "mi_samples": self.mi_samples,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Profile:
        """Inverse of to_json; ValueError names the field that is wrong."""
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise ValueError(f"not a population profile (expected \"format\": \"{FORMAT}\")")
        if doc.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {doc.get('format_version')!r}, this code reads {FORMAT_VERSION}")
        field = "n"
        try:
            n = int(doc["n"])
            field = "case_mix"
            case_mix = {str(k): {str(c): int(v) for c, v in d.items()} for k, d in doc["case_mix"].items()}
            field = "age"
            age = Distribution.from_json(doc["age"])
            field = "events_per_admission"
            events = {str(s): Distribution.from_json(d) for s, d in doc["events_per_admission"].items()}
            field = "oov"
            oov = {str(s): (int(d["events"]), int(d["oov_events"])) for s, d in doc["oov"].items()}
            codes = {}
            for code, d in doc["codes"].items():
                field = f"codes.{code}"
                codes[str(code)] = CodeStats(int(d["admissions"]), int(d["events"]),
                                             Distribution.from_json(d["values"]) if d.get("values") else None)
            field = "units"
            units = {str(c): {str(u): int(r) for u, r in d.items()} for c, d in (doc.get("units") or {}).items()}
            canonical = {str(c): str(u) for c, u in (doc.get("canonical") or {}).items()}
            field = "mutual_information"
            mi = Distribution.from_json(doc["mutual_information"]) if doc.get("mutual_information") else None
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{field}: {type(err).__name__}: {err}") from None
        samples = doc.get("mi_samples")
        return cls(n=n, case_mix=case_mix, age=age, events=events, oov=oov, codes=codes, units=units,
                   canonical=canonical, mutual_information=mi, mi_samples=None if samples is None else int(samples),
                   description=str(doc.get("description") or ""))


def _age_band(age: float) -> str:
    return AGE_BAND_NAMES[max(int(np.searchsorted(AGE_BANDS, age, side="right")) - 1, 0)]


def _counts(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items()))


def data_units(data_dir: str | os.PathLike[str]) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """(rows per code and unit as written, unit each code was converted to) of a data folder's units.json."""
    path = os.path.join(os.fspath(data_dir), layout.UNITS)
    if not os.path.exists(path):
        return {}, {}
    counts, canonical = units_mod.read_units_file(layout.read_json(path))
    # Folders made before values were harmonised have no "canonical": their values were used as
    # written, mostly in each code's most common unit, which the same rule recovers.
    return counts, canonical or units_mod.canonical_units(counts, units_mod.Converter())


def profile_of_data(data_dir: str | os.PathLike[str], splits: Sequence[str], *, vocabulary: Iterable[str] | None,
                    bins_from: Profile | None = None, keep: Iterable[str] | None = None,
                    description: str = "") -> Profile:
    """The profile of some splits of a Beam job output folder, with its units (data_units); no mutual information."""
    records = [r for split in splits for r in read_records(data_dir, split)]
    counts, canonical = data_units(data_dir)
    return Profile.build(admissions_from_examples(records), vocabulary=vocabulary, bins_from=bins_from, units=counts,
                         canonical=canonical, keep=keep, description=description)
