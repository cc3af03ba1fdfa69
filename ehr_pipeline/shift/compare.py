"""Two populations compared: a new one against the one a model learnt from, in words and numbers.

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

The statistics are in ``ehr_pipeline.shift.stats``; when a comparison is a finding, and its
words, in ``ehr_pipeline.shift.findings``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ehr_pipeline.encode import units
from ehr_pipeline.shift.population import MI_QUANTILES, Distribution, Profile
from ehr_pipeline.shift.findings import (
    KINDS,
    MODERATE,
    NONE,
    SEVERE,
    SEVERITIES,
    Comparison,
    Finding,
    Thresholds,
    finding_of,
    grouped_presence,
    json_ready,
    oov_findings,
    outcome_shares,
    unit_mismatches,
    unit_outcomes,
)
from ehr_pipeline.shift.stats import distribution_p, holm, psi

# What callers use: the report, its severities and kinds, and the thresholds it is judged by.
__all__ = ["KINDS", "MODERATE", "NONE", "SEVERE", "SEVERITIES", "Finding", "ShiftReport", "Thresholds", "compare"]


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
                "distributions": [{k: json_ready(v) for k, v in row.items()} for row in self.distributions],
                "summary": {k: json_ready(v) for k, v in self.summary.items()}, "counts": self.counts()}

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


def _same_bins(code: str, ref: Distribution, cur: Distribution) -> None:
    if ref.edges != cur.edges:
        raise ValueError(f"{code}: the new data's distribution is not binned on the reference's edges "
                         "(build it with Profile.build(..., bins_from=reference))")


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

    mismatched = unit_mismatches(reference, current, conv, loinc, findings)
    unit_outcomes(reference, current, conv, loinc, th, findings)
    oov_findings(reference, current, th, findings)

    tests = (_binned_comparisons(reference, current, th) + _share_comparisons(reference, current, th)
             + _uncertainty_comparisons(reference, current, th))
    _test(tests)

    rows = []
    for t in tests:
        significant = t.p_adjusted < th.alpha
        finding = finding_of(t, significant, th, reference, current, mismatched, loinc, conv)
        if finding is not None and finding.severity != NONE:
            findings.append(finding)
        if t.kind in ("value_shift", "events_per_admission", "case_mix"):
            rows.append(_row(t, finding))

    findings = grouped_presence(findings)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    kind_order = {k: i for i, k in enumerate(KINDS)}
    findings.sort(key=lambda f: (-order[f.severity], kind_order[f.kind], -float(f.numbers.get("psi") or 0), f.subject))
    level = max((f.severity for f in findings), key=order.__getitem__, default=NONE)
    return ShiftReport(level, tuple(findings), tuple(rows), _summary(reference, current, tests, th, conv, loinc))


def _binned_comparisons(reference: Profile, current: Profile, th: Thresholds) -> list[Comparison]:
    """Each code's values, then each source's events per admission, on the reference's bins."""
    tests = []
    for code, ref_stats in sorted(reference.codes.items()):
        cur_stats = current.codes.get(code)
        if ref_stats.values is None or cur_stats is None or cur_stats.values is None:
            continue
        ref, cur = ref_stats.values, cur_stats.values
        if min(ref.n, cur.n) < th.min_admissions:
            continue
        _same_bins(code, ref, cur)
        tests.append(Comparison("value_shift", code, np.asarray(ref.counts), np.asarray(cur.counts),
                                {"reference": ref, "current": cur}))
    for source, ref in reference.events.items():
        cur = current.events.get(source)
        if cur is None or not (ref.mean > 0 or cur.mean > 0) or min(ref.n, cur.n) < th.min_admissions:
            continue
        _same_bins(f"{source} events", ref, cur)
        tests.append(Comparison("events_per_admission", source, np.asarray(ref.counts), np.asarray(cur.counts),
                                {"reference": ref, "current": cur}))
    return tests


def _share_comparisons(reference: Profile, current: Profile, th: Thresholds) -> list[Comparison]:
    """The case mix by field, then the share of admissions with each frequent code (none for small populations)."""
    tests = []
    if min(reference.n, current.n) < th.min_admissions:
        return tests
    for field, ref_mix in reference.case_mix.items():
        cur_mix = current.case_mix.get(field, {})
        names = sorted(set(ref_mix) | set(cur_mix))
        tests.append(Comparison("case_mix", field, np.array([ref_mix.get(k, 0) for k in names], np.float64),
                                np.array([cur_mix.get(k, 0) for k in names], np.float64), {"names": names}))
    for code, ref_stats in sorted(reference.codes.items()):
        if ref_stats.admissions < th.presence_min_share * reference.n:
            continue
        cur_n = current.codes[code].admissions if code in current.codes else 0
        tests.append(Comparison("code_presence", code,
                                np.array([ref_stats.admissions, reference.n - ref_stats.admissions]),
                                np.array([cur_n, current.n - cur_n]), {}))
    return tests


def _uncertainty_comparisons(reference: Profile, current: Profile, th: Thresholds) -> list[Comparison]:
    """Admissions above and below the validation 95th percentile of mutual information (none without it)."""
    ref_mi, cur_mi = reference.mutual_information, current.mutual_information
    p95_index = MI_QUANTILES.index(0.95)
    if not (ref_mi is not None and cur_mi is not None and cur_mi.n >= th.min_admissions
            and len(ref_mi.edges) == len(MI_QUANTILES) and ref_mi.edges[p95_index] > 0):
        return []
    _same_bins("mutual information", ref_mi, cur_mi)
    above = p95_index + 1
    r, c = np.asarray(ref_mi.counts), np.asarray(cur_mi.counts)
    return [Comparison("uncertainty", "model", np.array([r[above:].sum(), r[:above].sum()]),
                       np.array([c[above:].sum(), c[:above].sum()]), {"p95": ref_mi.edges[p95_index]})]


def _test(tests: list[Comparison]) -> None:
    """Sets each comparison's p-value and PSI, then the p-values adjusted over the whole report (Holm)."""
    for t in tests:
        t.p = distribution_p(t.reference, t.current, ordered=t.kind in ("value_shift", "events_per_admission"))
        t.psi = psi(t.reference, t.current)
    for t, adjusted in zip(tests, holm([t.p for t in tests])):
        t.p_adjusted = float(adjusted)


def _summary(reference: Profile, current: Profile, tests: list[Comparison], th: Thresholds, conv: units.Converter,
             loinc: Mapping[str, str]) -> dict[str, Any]:
    """What was compared, and the shares behind the findings, for the report's header and shift.json."""
    mi_test = next((t for t in tests if t.kind == "uncertainty"), None)
    outcomes = outcome_shares(current, conv, loinc)
    total_values = sum(o["total"] for o in outcomes.values())
    return {"n_reference": reference.n, "n_current": current.n, "tests": len(tests), "alpha": th.alpha,
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


def _share(pair: tuple[int, int]) -> float:
    return pair[1] / pair[0] if pair[0] else 0.0


def _row(t: Comparison, finding: Finding | None) -> dict[str, Any]:
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

