"""The shift report: a new population against the one a model learnt from, in words and numbers.

``compare(reference, current)`` reads two ``population.Profile`` s (the reference the export
carries, the new data's binned on its edges) and returns a ``ShiftReport``: findings, each a
kind, a severity (none / moderate / severe), the code, source or field it is about, a message
that says what differs in words, and the numbers behind it. The report's level is its worst
finding. The kinds (thresholds: ``Thresholds``, documented in docs/shift.md):

* ``unit_mismatch``: the new data's values of a code were converted to another unit than the
  model's (its units.json against the export's): severe, fixed by preparing the data with
  ``ehr-pipeline run --units-from MODEL``.
* ``value_shift``: a code's per-admission values against the reference's, by the population
  stability index (PSI) on the reference's decile bins, gated by a chi-square test and a rank
  test (Mann-Whitney, for shifts of location); the ratio of
  medians with its 95% interval; and when that ratio is near the factor between the model's
  unit and another unit of the same analyte (``units.Converter``, molar masses by LOINC), the
  unit it likely is: "lab:50912 values are ~88x the training median: likely umol/L labelled as
  mg/dL".
* ``units_converted`` / ``not_convertible``: values that arrived in another unit and were
  converted (another site's conventions: check them), or could not be and were not used.
* ``oov_share``: per source, the share of events whose code the model does not know.
* ``code_presence``: a code the model often saw that the new population rarely has (or the
  reverse): a local code for the same test is the usual cause.
* ``events_per_admission``: how often each source records (charting frequency).
* ``case_mix``: age bands, gender, admission type.
* ``uncertainty``: the share of admissions whose mutual information is above the model's
  validation 95th percentile (5% on validation).

Every test of one report (one per code, source, case-mix field, ...) is gated together with
Holm's step-down correction at a family-wise ``alpha``, so a fresh release of the training
site does not raise an alarm somewhere among hundreds of codes by chance.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ehr_pipeline import spec, units
from ehr_pipeline.population import MI_QUANTILES, Distribution, Profile

NONE, MODERATE, SEVERE = "none", "moderate", "severe"
SEVERITIES = (NONE, MODERATE, SEVERE)
KINDS = ("unit_mismatch", "value_shift", "not_convertible", "units_converted", "oov_share", "code_presence",
         "events_per_admission", "case_mix", "uncertainty")
# Units a value is often recorded in: the candidates a shifted median is checked against.
COMMON_UNITS = ("g/L", "g/dL", "mg/dL", "mg/L", "ug/dL", "ug/L", "ug/mL", "ng/mL", "ng/dL", "pg/mL",
                "mol/L", "mmol/L", "umol/L", "nmol/L", "pmol/L", "meq/L", "10*9/L", "10*3/uL", "10*6/uL",
                "10*12/L", "/uL", "Cel", "[degF]", "mm[Hg]", "kPa", "%", "1", "kg", "g", "[lb_av]", "cm",
                "[in_i]", "m", "s", "min", "h")
_SMOOTH = 0.5  # added to every bin count before PSI: an empty bin of a small sample is not infinitely far
_MIN_EXPECTED = 5.0  # chi-square bins are merged until each expects this many admissions
_NEAR_ONE = 1.05  # median ratios closer to 1 than this are described by the bin that moved most


class Thresholds(BaseModel):
    """When a difference is a finding, and how severe (docs/shift.md explains each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    psi_moderate: float = Field(0.1, gt=0, description="PSI of a distribution for 'moderate' (the common convention).")
    psi_severe: float = Field(0.25, gt=0, description="PSI for 'severe' (the common convention).")
    alpha: float = Field(0.01, gt=0, lt=1, description="Family-wise error rate of one report's tests (Holm).")
    min_admissions: int = Field(20, ge=2, description="Admissions with a value needed on both sides to compare a "
                                                      "distribution.")
    oov_moderate: float = Field(0.05, gt=0, le=1, description="Rise of a source's out-of-vocabulary event share "
                                                              "for 'moderate'.")
    oov_severe: float = Field(0.2, gt=0, le=1, description="Rise of the out-of-vocabulary share for 'severe'.")
    min_events: int = Field(100, ge=1, description="Events of a source needed to judge its out-of-vocabulary share.")
    min_values: int = Field(20, ge=1, description="Values with a unit a code needs before its conversions are "
                                                   "judged.")
    converted_moderate: float = Field(0.05, gt=0, le=1, description="Rise of the share of a code's values that "
                                                                    "arrived in another unit, for 'moderate'.")
    not_convertible_moderate: float = Field(0.01, gt=0, le=1, description="Rise of the share of a code's values "
                                                                          "that could not be converted, for "
                                                                          "'moderate'.")
    not_convertible_severe: float = Field(0.5, gt=0, le=1, description="Share not convertible for 'severe'.")
    presence_ratio: float = Field(2.0, gt=1, description="Change of the share of admissions with a code (either way) "
                                                         "for 'moderate'.")
    presence_min_share: float = Field(0.05, gt=0, le=1, description="Codes in at least this share of reference "
                                                                    "admissions are checked for presence.")
    mi_moderate: float = Field(0.10, gt=0, le=1, description="Share of admissions above the validation 95th "
                                                             "percentile of mutual information for 'moderate' "
                                                             "(0.05 expected).")
    mi_severe: float = Field(0.25, gt=0, le=1, description="That share for 'severe'.")
    unit_hint_tolerance: float = Field(1.25, gt=1, description="A median ratio within this factor of a unit "
                                                               "conversion factor names that unit.")
    unit_hint_min_factor: float = Field(1.5, gt=1, description="Conversion factors closer to 1 than this are not "
                                                               "told apart from a bias.")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One difference between the populations: its kind, severity, subject, message and numbers."""

    kind: str
    severity: str
    subject: str  # a code 'lab:50912', a source 'chart', a case-mix field, or 'model'
    message: str
    numbers: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"kind": self.kind, "severity": self.severity, "subject": self.subject, "message": self.message,
                "numbers": {k: _clean(v) for k, v in self.numbers.items()}}


@dataclasses.dataclass(frozen=True)
class ShiftReport:
    """The findings (worst first), every compared distribution, and what was compared."""

    level: str
    findings: tuple[Finding, ...]
    distributions: tuple[Mapping[str, Any], ...]  # one row per compared distribution (codes, sources, case mix)
    summary: Mapping[str, Any]

    def at_least(self, severity: str) -> bool:
        """True when the report's level is `severity` or worse."""
        return SEVERITIES.index(self.level) >= SEVERITIES.index(severity)

    def counts(self) -> dict[str, dict[str, int]]:
        """Findings per kind and severity (every kind and severity listed)."""
        out = {k: {s: 0 for s in SEVERITIES[1:]} for k in KINDS}
        for f in self.findings:
            out[f.kind][f.severity] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"level": self.level, "findings": [f.to_json() for f in self.findings],
                "distributions": [{k: _clean(v) for k, v in row.items()} for row in self.distributions],
                "summary": {k: _clean(v) for k, v in self.summary.items()}, "counts": self.counts()}

    def text(self, limit: int = 30) -> str:
        """The report in words, worst first (at most `limit` findings, the rest counted)."""
        s = self.summary
        lines = [f"shift: {self.level} ({s['n_current']} admissions against the model's reference of "
                 f"{s['n_reference']}; {s['tests']} distributions compared)"]
        for f in self.findings[:limit]:
            lines.append(f"  [{f.severity}] {f.message}")
        if len(self.findings) > limit:
            lines.append(f"  ... and {len(self.findings) - limit} more findings (shift.json lists them all)")
        if not self.findings:
            lines.append("  no difference above the thresholds")
        return "\n".join(lines)

    def markdown(self) -> str:
        """A short markdown report: the level, the findings table, the worst distributions."""
        s = self.summary
        out = [f"# Shift report: {self.level}", "",
               f"{s['n_current']} admissions ({s.get('current', 'new data')}) against the model's reference of "
               f"{s['n_reference']} ({s.get('reference', 'its training split')}); {s['tests']} distributions "
               f"compared, tests gated at a family-wise error rate of {s['alpha']:g} (Holm).", ""]
        if self.findings:
            out += ["| severity | kind | subject | finding |", "|---|---|---|---|"]
            out += [f"| {f.severity} | {f.kind} | {f.subject} | {f.message.replace('|', '/')} |" for f in self.findings]
        else:
            out.append("No difference above the thresholds.")
        worst = sorted((r for r in self.distributions if r.get("psi") is not None), key=lambda r: -r["psi"])[:10]
        if worst:
            out += ["", "Largest distribution changes (population stability index on the reference's bins):", "",
                    "| distribution | n reference | n new | median reference | median new | PSI | p (Holm) |",
                    "|---|---|---|---|---|---|---|"]
            out += [f"| {r['subject']} | {r['n_reference']} | {r['n_current']} | {_g(r.get('median_reference'))} | "
                    f"{_g(r.get('median_current'))} | {r['psi']:.3f} | {_g(r.get('p_adjusted'))} |" for r in worst]
        return "\n".join(out) + "\n"


def _g(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


def _clean(v: Any) -> Any:
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


# ------------------------------------------------------------------------ statistics


def psi(reference: Sequence[float], current: Sequence[float]) -> float:
    """Population stability index of two count vectors over the same bins (counts smoothed by 0.5 each)."""
    r = np.asarray(reference, dtype=np.float64) + _SMOOTH
    c = np.asarray(current, dtype=np.float64) + _SMOOTH
    r, c = r / r.sum(), c / c.sum()
    return float(np.sum((c - r) * np.log(c / r)))


def homogeneity_p(reference: Sequence[float], current: Sequence[float]) -> float:
    """p-value of the chi-square test that two count vectors over the same bins come from one distribution.

    Adjacent bins are merged until each expects at least 5 admissions on the smaller side, where
    the chi-square approximation holds; one bin left means nothing to test (p = 1).
    """
    from scipy.stats import chi2

    r, c = np.asarray(reference, dtype=np.float64), np.asarray(current, dtype=np.float64)
    nr, nc = r.sum(), c.sum()
    if nr <= 0 or nc <= 0:
        return 1.0
    share = min(nr, nc) / (nr + nc)
    merged_r, merged_c, acc_r, acc_c = [], [], 0.0, 0.0
    for a, b in zip(r, c):
        acc_r, acc_c = acc_r + a, acc_c + b
        if (acc_r + acc_c) * share >= _MIN_EXPECTED:
            merged_r.append(acc_r)
            merged_c.append(acc_c)
            acc_r = acc_c = 0.0
    if acc_r + acc_c > 0:
        if merged_r:
            merged_r[-1] += acc_r
            merged_c[-1] += acc_c
        else:
            merged_r, merged_c = [acc_r], [acc_c]
    if len(merged_r) < 2:
        return 1.0
    table = np.array([merged_r, merged_c])
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(np.sum((table - expected) ** 2 / expected))
    return float(chi2.sf(statistic, df=len(merged_r) - 1))


def rank_p(reference: Sequence[float], current: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney test on counts over ordered bins (values in one bin tie).

    Power against a shift of location (an assay reading 15% high) that the chi-square test spreads
    over every bin; the normal approximation with the tie correction, from the counts alone.
    """
    from scipy.stats import norm

    r, c = np.asarray(reference, dtype=np.float64), np.asarray(current, dtype=np.float64)
    nr, nc = r.sum(), c.sum()
    if nr <= 0 or nc <= 0:
        return 1.0
    t = r + c
    n = t.sum()
    mid_rank = np.cumsum(t) - (t - 1.0) / 2.0  # the mean rank of each bin's tied values
    u = float(np.sum(c * mid_rank)) - nc * (nc + 1.0) / 2.0
    variance = nr * nc / 12.0 * ((n + 1.0) - float(np.sum(t ** 3 - t)) / (n * (n - 1.0)))
    if variance <= 0:
        return 1.0
    return float(2.0 * norm.sf(abs(u - nr * nc / 2.0) / math.sqrt(variance)))


def distribution_p(reference: Sequence[float], current: Sequence[float], ordered: bool) -> float:
    """p-value that two count vectors come from one distribution: ordered bins take the better of the
    chi-square and the rank test (Bonferroni over the two), categories the chi-square test."""
    chi = homogeneity_p(reference, current)
    return min(1.0, 2.0 * min(chi, rank_p(reference, current))) if ordered else chi


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if not m:
        return p
    order = np.argsort(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def median_ratio(reference: Distribution, current: Distribution) -> tuple[float, float, float] | None:
    """(current / reference median, 95% interval low, high) for positive medians; None otherwise.

    The interval combines each median's order-statistic interval on the log scale as if normal.
    """
    if not (reference.median > 0 and current.median > 0):
        return None
    ratio = current.median / reference.median
    if reference.median_low > 0 and current.median_low > 0:
        se = math.hypot(math.log(reference.median_high / reference.median_low),
                        math.log(current.median_high / current.median_low)) / (2 * 1.959963984540054)
        return ratio, ratio * math.exp(-1.959963984540054 * se), ratio * math.exp(1.959963984540054 * se)
    return ratio, math.nan, math.nan


def unit_hint(code: str, reference: Distribution, current: Distribution, canonical: str | None, loinc: str | None,
              converter: units.Converter, thresholds: Thresholds) -> tuple[str, float] | None:
    """(unit, factor) when the current median is what the reference's would read in another unit of the analyte.

    For each common unit V convertible to the model's unit U: a value recorded in V but read as
    U reads as the reference median converted from U to V. The closest such reading within
    ``unit_hint_tolerance`` of the current median names V; factors nearer 1 than
    ``unit_hint_min_factor`` are left out (an assay bias, not a unit).
    """
    if not canonical or not (reference.median > 0 and current.median > 0):
        return None
    best = None
    for candidate in COMMON_UNITS:
        back, _ = converter.conversion(canonical, candidate, loinc)  # U -> V
        if back is None or back.identity:
            continue
        expected = float(back.apply(reference.median))
        if not expected > 0:
            continue
        factor = expected / reference.median
        if abs(math.log(factor)) < math.log(thresholds.unit_hint_min_factor):
            continue
        miss = abs(math.log(current.median / expected))
        if miss <= math.log(thresholds.unit_hint_tolerance) and (best is None or miss < best[0]):
            best = (miss, candidate, factor)
    return None if best is None else (best[1], best[2])


# ------------------------------------------------------------------------ the comparison


@dataclasses.dataclass
class _Test:
    kind: str
    subject: str
    reference: np.ndarray  # counts per bin or category
    current: np.ndarray
    extra: dict[str, Any]
    p: float = 1.0
    psi: float = 0.0
    p_adjusted: float = 1.0


def _same_bins(code: str, ref: Distribution, cur: Distribution) -> None:
    if ref.edges != cur.edges:
        raise ValueError(f"{code}: the new data's distribution is not binned on the reference's edges "
                         "(build it with Profile.build(..., bins_from=reference))")


def _times(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.2g}x" if x >= 0.1 else f"{x:.2g}x"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def compare(reference: Profile, current: Profile, *, loinc: Mapping[str, str] | None = None,
            thresholds: Thresholds | None = None, converter: units.Converter | None = None) -> ShiftReport:
    """The shift report of `current` (binned on `reference`'s edges) against `reference`.

    loinc: 'lab:ITEMID' -> LOINC, so unit hints can use the analyte's molar mass. Raises
    ValueError when `current` was not built with ``bins_from=reference``.
    """
    th = thresholds or Thresholds()
    conv = converter or units.Converter()
    loinc = dict(loinc or {})
    findings: list[Finding] = []
    tests: list[_Test] = []

    mismatched = _unit_mismatches(reference, current, conv, loinc, findings)
    _unit_outcomes(reference, current, conv, loinc, th, findings)
    _oov(reference, current, th, findings)

    for code, ref_stats in sorted(reference.codes.items()):
        cur_stats = current.codes.get(code)
        if ref_stats.values is None or cur_stats is None or cur_stats.values is None:
            continue
        ref, cur = ref_stats.values, cur_stats.values
        if min(ref.n, cur.n) < th.min_admissions:
            continue
        _same_bins(code, ref, cur)
        tests.append(_Test("value_shift", code, np.asarray(ref.counts), np.asarray(cur.counts),
                           {"reference": ref, "current": cur}))
    for source, ref in reference.events.items():
        cur = current.events.get(source)
        if cur is None or not (ref.mean > 0 or cur.mean > 0) or min(ref.n, cur.n) < th.min_admissions:
            continue
        _same_bins(f"{source} events", ref, cur)
        tests.append(_Test("events_per_admission", source, np.asarray(ref.counts), np.asarray(cur.counts),
                           {"reference": ref, "current": cur}))
    if min(reference.n, current.n) >= th.min_admissions:
        for field, ref_mix in reference.case_mix.items():
            cur_mix = current.case_mix.get(field, {})
            names = sorted(set(ref_mix) | set(cur_mix))
            tests.append(_Test("case_mix", field, np.array([ref_mix.get(k, 0) for k in names], np.float64),
                               np.array([cur_mix.get(k, 0) for k in names], np.float64), {"names": names}))
        for code, ref_stats in sorted(reference.codes.items()):
            if ref_stats.admissions < th.presence_min_share * reference.n:
                continue
            cur_n = current.codes[code].admissions if code in current.codes else 0
            tests.append(_Test("code_presence", code, np.array([ref_stats.admissions, reference.n - ref_stats.admissions]),
                               np.array([cur_n, current.n - cur_n]), {}))
    ref_mi, cur_mi = reference.mutual_information, current.mutual_information
    p95_index = MI_QUANTILES.index(0.95)
    if (ref_mi is not None and cur_mi is not None and cur_mi.n >= th.min_admissions
            and len(ref_mi.edges) == len(MI_QUANTILES) and ref_mi.edges[p95_index] > 0):
        _same_bins("mutual information", ref_mi, cur_mi)
        above = p95_index + 1
        r, c = np.asarray(ref_mi.counts), np.asarray(cur_mi.counts)
        tests.append(_Test("uncertainty", "model", np.array([r[above:].sum(), r[:above].sum()]),
                           np.array([c[above:].sum(), c[:above].sum()]), {"p95": ref_mi.edges[p95_index]}))

    for t in tests:
        t.p = distribution_p(t.reference, t.current, ordered=t.kind in ("value_shift", "events_per_admission"))
        t.psi = psi(t.reference, t.current)
    for t, adjusted in zip(tests, holm([t.p for t in tests])):
        t.p_adjusted = float(adjusted)

    rows = []
    for t in tests:
        significant = t.p_adjusted < th.alpha
        finding = _FINDERS[t.kind](t, significant, th, reference, current, mismatched, loinc, conv)
        if finding is not None and finding.severity != NONE:
            findings.append(finding)
        if t.kind in ("value_shift", "events_per_admission", "case_mix"):
            rows.append(_row(t, finding))

    findings = _grouped_presence(findings)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    kind_order = {k: i for i, k in enumerate(KINDS)}
    findings.sort(key=lambda f: (-order[f.severity], kind_order[f.kind], -float(f.numbers.get("psi") or 0), f.subject))
    level = max((f.severity for f in findings), key=order.__getitem__, default=NONE)
    mi_test = next((t for t in tests if t.kind == "uncertainty"), None)
    outcomes = _outcome_shares(current, conv, loinc)
    total_values = sum(o["total"] for o in outcomes.values())
    summary = {"n_reference": reference.n, "n_current": current.n, "tests": len(tests), "alpha": th.alpha,
               "worst_psi": max((t.psi for t in tests if t.kind in ("value_shift", "events_per_admission",
                                                                    "case_mix")), default=0.0),
               "oov_share": {s: {"reference": _share(reference.oov.get(s, (0, 0))), "current": _share(e)}
                             for s, e in current.oov.items() if e[0]},
               "values_with_unit": total_values,
               "converted_share": (sum(sum(o["converted"].values()) for o in outcomes.values()) / total_values
                                   if total_values else 0.0),
               "not_convertible_share": (sum(sum(o["not_convertible"].values()) for o in outcomes.values())
                                         / total_values if total_values else 0.0),
               "mi_share_above_p95": (mi_test.current[0] / max(mi_test.current.sum(), 1)) if mi_test else None,
               "reference": reference.description or "the model's training split",
               "current": current.description or "new data",
               "codes_compared": sum(t.kind == "value_shift" for t in tests),
               "mi_compared": any(t.kind == "uncertainty" for t in tests),
               "thresholds": th.model_dump()}
    return ShiftReport(level, tuple(findings), tuple(rows), summary)


def _share(pair: tuple[int, int]) -> float:
    return pair[1] / pair[0] if pair[0] else 0.0


def _row(t: _Test, finding: Finding | None) -> dict[str, Any]:
    row = {"kind": t.kind, "subject": t.subject, "psi": t.psi, "p": t.p, "p_adjusted": t.p_adjusted,
           "severity": finding.severity if finding is not None else NONE,
           "n_reference": int(t.reference.sum()), "n_current": int(t.current.sum())}
    if "reference" in t.extra:
        ref, cur = t.extra["reference"], t.extra["current"]
        row.update(median_reference=ref.median, median_current=cur.median, mean_reference=ref.mean,
                   mean_current=cur.mean, edges=list(ref.edges), reference_proportions=ref.proportions().tolist(),
                   current_proportions=cur.proportions().tolist())
    else:
        row.update(categories=t.extra["names"], reference_proportions=(t.reference / t.reference.sum()).tolist(),
                   current_proportions=(t.current / max(t.current.sum(), 1)).tolist())
    return row


def _severity(significant: bool, value: float, moderate: float, severe: float) -> str:
    if not significant or not value >= moderate:
        return NONE
    return SEVERE if value >= severe else MODERATE


def _value_finding(t, significant, th, reference, current, mismatched, loinc, conv) -> Finding:
    ref, cur = t.extra["reference"], t.extra["current"]
    code = t.subject
    unit = reference.canonical.get(code, "")
    data_unit = mismatched.get(code, unit)
    severity = _severity(significant, t.psi, th.psi_moderate, th.psi_severe)
    numbers: dict[str, Any] = {"psi": t.psi, "p_adjusted": t.p_adjusted, "n_reference": ref.n, "n_current": cur.n,
                               "median_reference": ref.median, "median_current": cur.median, "unit": unit}
    ratio = median_ratio(ref, cur)
    before, after = f"{ref.median:.3g}{' ' + unit if unit else ''}", f"{cur.median:.3g}{' ' + data_unit if data_unit else ''}"
    if ratio is not None and abs(math.log(ratio[0])) >= math.log(_NEAR_ONE):
        numbers.update(ratio=ratio[0], ratio_low=ratio[1], ratio_high=ratio[2])
        interval = f", 95% interval {ratio[1]:.3g}-{ratio[2]:.3g}x" if math.isfinite(ratio[1]) else ""
        message = f"{code} values are ~{_times(ratio[0])} the training median ({before} -> {after}{interval}; PSI {t.psi:.2f})"
    else:
        if ratio is not None:
            numbers.update(ratio=ratio[0], ratio_low=ratio[1], ratio_high=ratio[2])
        message = (f"{code} values are distributed differently (PSI {t.psi:.2f}) around a similar median "
                   f"({before} -> {after}): {_moved_bin(ref, cur)}")
    if severity == NONE:
        return Finding("value_shift", NONE, code, message, numbers)
    if code in mismatched:
        message += f": the data is in {data_unit}, the model's unit is {unit} (see the unit mismatch)"
    else:
        hint = unit_hint(code, ref, cur, unit or None, loinc.get(code), conv, th)
        if hint is not None:
            numbers.update(likely_unit=hint[0], unit_factor=hint[1])
            message += f": likely {hint[0]} labelled as {unit}"
            severity = SEVERE  # a value read in the wrong unit is wrong for every patient
    return Finding("value_shift", severity, code, message, numbers)


def _moved_bin(ref: Distribution, cur: Distribution) -> str:
    """The bin whose share changed most, in words ('values below 4.5: 10% of training admissions, 25% now')."""
    r, c = ref.proportions(), cur.proportions()
    i = int(np.argmax(np.abs(c - r)))
    edges = ref.edges
    where = (f"below {edges[0]:.3g}" if i == 0 else f"at or above {edges[-1]:.3g}" if i == len(edges)
             else f"in [{edges[i - 1]:.3g}, {edges[i]:.3g})")
    return f"values {where} are {_pct(c[i])} of admissions ({_pct(r[i])} in training)"


def _events_finding(t, significant, th, reference, current, *_) -> Finding:
    ref, cur = t.extra["reference"], t.extra["current"]
    ratio = cur.mean / ref.mean if ref.mean > 0 else math.inf
    message = (f"{t.subject} events per admission: mean {ref.mean:.3g} -> {cur.mean:.3g} ({_times(ratio)}; "
               f"PSI {t.psi:.2f})")
    if t.subject == "chart":
        message += ": vital signs are charted " + ("less" if ratio < 1 else "more") + " often"
    return Finding("events_per_admission", _severity(significant, t.psi, th.psi_moderate, th.psi_severe), t.subject,
                   message, {"psi": t.psi, "p_adjusted": t.p_adjusted, "mean_reference": ref.mean,
                             "mean_current": cur.mean, "ratio": ratio})


def _case_mix_finding(t, significant, th, reference, current, *_) -> Finding:
    names = t.extra["names"]
    r = t.reference / max(t.reference.sum(), 1)
    c = t.current / max(t.current.sum(), 1)
    moved = sorted(range(len(names)), key=lambda i: -abs(c[i] - r[i]))[:3]
    parts = ", ".join(f"{names[i]} {_pct(r[i])} -> {_pct(c[i])}" for i in moved if abs(c[i] - r[i]) >= 0.005)
    label = t.subject.replace("_", " ")
    extra = f", mean age {reference.age.mean:.0f} -> {current.age.mean:.0f}" if t.subject == "age_band" else ""
    return Finding("case_mix", _severity(significant, t.psi, th.psi_moderate, th.psi_severe), t.subject,
                   f"case mix, {label}: {parts}{extra} (PSI {t.psi:.2f})",
                   {"psi": t.psi, "p_adjusted": t.p_adjusted,
                    **{f"reference_{n}": float(r[i]) for i, n in enumerate(names)},
                    **{f"current_{n}": float(c[i]) for i, n in enumerate(names)}})


def _presence_finding(t, significant, th, reference, current, *_) -> Finding:
    r = t.reference[0] / max(t.reference.sum(), 1)
    c = t.current[0] / max(t.current.sum(), 1)
    ratio = (c + 1e-12) / r
    severity = MODERATE if significant and (ratio <= 1 / th.presence_ratio or ratio >= th.presence_ratio) else NONE
    message = f"{t.subject} is in {_pct(c)} of admissions ({_pct(r)} in training)"
    return Finding("code_presence", severity, t.subject, message,
                   {"share_reference": r, "share_current": c, "p_adjusted": t.p_adjusted})


def _grouped_presence(findings: list[Finding]) -> list[Finding]:
    """One code_presence finding per source, naming its codes (most changed first), instead of one per code."""
    others = [f for f in findings if f.kind != "code_presence"]
    by_source: dict[str, list[Finding]] = {}
    for f in findings:
        if f.kind == "code_presence":
            by_source.setdefault(f.subject.split(spec.CODE_SEPARATOR, 1)[0], []).append(f)
    for source, group in sorted(by_source.items()):
        group.sort(key=lambda f: -abs(f.numbers["share_current"] - f.numbers["share_reference"]))
        missing = [f for f in group if f.numbers["share_current"] < 0.1 * f.numbers["share_reference"]]
        listed = "; ".join(f"{f.subject} {_pct(f.numbers['share_reference'])} -> {_pct(f.numbers['share_current'])}"
                           for f in group[:6]) + (f"; and {len(group) - 6} more" if len(group) > 6 else "")
        hint = (f" ({len(missing)} (almost) missing: local codes for the same tests?)" if missing else "")
        others.append(Finding("code_presence", MODERATE, source,
                              f"{source}: {len(group)} codes are in a different share of admissions than in "
                              f"training{hint}: {listed}",
                              {"codes": [f.subject for f in group],
                               "share_reference": [f.numbers["share_reference"] for f in group],
                               "share_current": [f.numbers["share_current"] for f in group]}))
    return others


def _uncertainty_finding(t, significant, th, *_) -> Finding:
    r = t.reference[0] / max(t.reference.sum(), 1)
    c = t.current[0] / max(t.current.sum(), 1)
    return Finding("uncertainty", _severity(significant, c, th.mi_moderate, th.mi_severe), "model",
                   f"the model's mutual information is above its validation 95th percentile "
                   f"({t.extra['p95']:.3g} nats) on {_pct(c)} of admissions ({_pct(r)} on validation)",
                   {"share_above_p95": c, "share_above_p95_reference": r, "p95": t.extra["p95"],
                    "p_adjusted": t.p_adjusted})


_FINDERS = {"value_shift": _value_finding, "events_per_admission": _events_finding, "case_mix": _case_mix_finding,
            "code_presence": _presence_finding, "uncertainty": _uncertainty_finding}


def _unit_mismatches(reference: Profile, current: Profile, conv: units.Converter, loinc: Mapping[str, str],
                     findings: list[Finding]) -> dict[str, str]:
    """code -> the data's unit, for codes whose values were converted to another unit than the model's."""
    out = {}
    for code, model_unit in sorted(reference.canonical.items()):
        data_unit = current.canonical.get(code)
        stats = current.codes.get(code)
        if not data_unit or stats is None or stats.values is None or conv.key(data_unit) == conv.key(model_unit):
            continue
        conversion, why = conv.conversion(data_unit, model_unit, loinc.get(code))
        if conversion is not None and conversion.identity:
            continue  # two names of one unit (mEq/L and mmol/L of a monovalent ion)
        out[code] = data_unit
        how = (f"prepare the data with `ehr-pipeline run --units-from MODEL_DIR` to convert them"
               if conversion is not None else f"they cannot be converted ({why})")
        findings.append(Finding("unit_mismatch", SEVERE, code,
                                f"{code}: the data's values are in {data_unit}, the model's in {model_unit}: {how}",
                                {"data_unit": data_unit, "model_unit": model_unit,
                                 "factor": conversion.scale if conversion is not None else None,
                                 "admissions": stats.values.n}))
    return out


def _outcome_shares(profile: Profile, conv: units.Converter, loinc: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Per code: rows with a unit, rows converted, rows not convertible (against the profile's own canonical units)."""
    harmoniser = units.Harmoniser(profile.canonical, loinc, conv)
    out = {}
    for code, by_unit in profile.units.items():
        total = sum(by_unit.values())
        if not total:
            continue
        converted: dict[str, int] = {}
        lost: dict[str, int] = {}
        for unit, rows in by_unit.items():
            outcome, _, _ = harmoniser.resolve(code, unit)
            if outcome == units.CONVERTED:
                converted[unit] = converted.get(unit, 0) + rows
            elif outcome == units.NOT_CONVERTIBLE:
                lost[unit] = lost.get(unit, 0) + rows
        out[code] = {"total": total, "converted": converted, "not_convertible": lost}
    return out


def _unit_outcomes(reference: Profile, current: Profile, conv: units.Converter, loinc: Mapping[str, str],
                   th: Thresholds, findings: list[Finding]) -> None:
    ref_shares = _outcome_shares(reference, conv, loinc)
    for code, cur in sorted(_outcome_shares(current, conv, loinc).items()):
        if cur["total"] < th.min_values:
            continue
        ref = ref_shares.get(code, {"total": 0, "converted": {}, "not_convertible": {}})
        canonical = current.canonical.get(code, "")
        for kind, outcome in (("units_converted", "converted"), ("not_convertible", "not_convertible")):
            rows = sum(cur[outcome].values())
            share = rows / cur["total"]
            ref_share = sum(ref[outcome].values()) / ref["total"] if ref["total"] else 0.0
            which = ", ".join(sorted(cur[outcome], key=lambda u: -cur[outcome][u]))
            numbers = {"values": rows, "share": share, "share_reference": ref_share, "units": which,
                       "canonical": canonical}
            if kind == "units_converted" and share - ref_share >= th.converted_moderate:
                findings.append(Finding(kind, MODERATE, code,
                                        f"{code}: {_pct(share)} of values arrived in {which} and were converted to "
                                        f"{canonical} ({_pct(ref_share)} in training): another site's conventions, "
                                        "check the conversion", numbers))
            elif kind == "not_convertible" and share - ref_share >= th.not_convertible_moderate:
                severity = SEVERE if share >= th.not_convertible_severe else MODERATE
                findings.append(Finding(kind, severity, code,
                                        f"{code}: {rows} values ({_pct(share)}; {_pct(ref_share)} in training) in "
                                        f"{which} cannot be converted to {canonical}: not used", numbers))


def _oov(reference: Profile, current: Profile, th: Thresholds, findings: list[Finding]) -> None:
    for source in spec.SOURCES:
        ref_events, ref_oov = reference.oov.get(source, (0, 0))
        cur_events, cur_oov = current.oov.get(source, (0, 0))
        if cur_events < th.min_events:
            continue
        r = ref_oov / ref_events if ref_events else 0.0
        c = cur_oov / cur_events
        rise = c - r
        if rise < th.oov_moderate:
            continue
        unknown = sorted((code for code in current.codes if code.startswith(source + spec.CODE_SEPARATOR)
                          and code not in reference.codes), key=lambda k: -current.codes[k].admissions)[:3]
        listed = ", ".join(f"{k} (in {_pct(current.codes[k].admissions / max(current.n, 1))} of admissions)"
                           for k in unknown)
        findings.append(Finding("oov_share", SEVERE if rise >= th.oov_severe else MODERATE, source,
                                f"{source}: {_pct(c)} of events have codes the model does not know ({_pct(r)} in "
                                f"training)" + (f"; most frequent: {listed}" if listed else ""),
                                {"share": c, "share_reference": r, "events": cur_events, "top_codes": unknown}))
