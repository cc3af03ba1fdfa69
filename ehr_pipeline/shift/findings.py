"""The findings of a comparison (``compare``): when a compared distribution is a finding, how severe it is,
and what it says in words.

``ehr_pipeline.shift.compare`` builds the comparisons (``Comparison``: the counts of both
populations over shared bins or categories, with their PSI and p-values) and asks
``finding_of`` for each one's finding; the findings read from the profiles alone (unit
mismatches, converted or unconvertible values, out-of-vocabulary shares) are made here too.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import units
from ehr_pipeline.shift import unit_mismatch
from ehr_pipeline.shift.population import Distribution, Profile
from ehr_pipeline.shift.stats import median_ratio

NONE, MODERATE, SEVERE = "none", "moderate", "severe"
SEVERITIES = (NONE, MODERATE, SEVERE)
KINDS = ("unit_mismatch", "value_shift", "not_convertible", "units_converted", "oov_share", "code_presence",
         "events_per_admission", "case_mix", "uncertainty")
# Units a value is often recorded in: the candidates a shifted median is checked against.
COMMON_UNITS = ("g/L", "g/dL", "mg/dL", "mg/L", "ug/dL", "ug/L", "ug/mL", "ng/mL", "ng/dL", "pg/mL",
                "mol/L", "mmol/L", "umol/L", "nmol/L", "pmol/L", "meq/L", "10*9/L", "10*3/uL", "10*6/uL",
                "10*12/L", "/uL", "Cel", "[degF]", "mm[Hg]", "kPa", "%", "1", "kg", "g", "[lb_av]", "cm",
                "[in_i]", "m", "s", "min", "h")
_NEAR_ONE = 1.05  # median ratios closer to 1 than this are described by the bin that moved most


class Thresholds(BaseModel):
    """When a difference is a finding, and how severe (docs/shift.md explains each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # One declaration per threshold, alike in shape: each is a documented setting of its own.
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
                "numbers": {k: json_ready(v) for k, v in self.numbers.items()}}


def json_ready(v: Any) -> Any:
    """A number or list of numbers as JSON takes it: numpy scalars as Python's, non-finite floats as None."""
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (list, tuple)):
        return [json_ready(x) for x in v]
    return v


@dataclasses.dataclass
class Comparison:
    """One distribution of both populations: counts over shared bins or categories, and its statistics."""

    kind: str
    subject: str
    reference: np.ndarray  # counts per bin or category
    current: np.ndarray
    extra: dict[str, Any]
    p: float = 1.0
    psi: float = 0.0
    p_adjusted: float = 1.0


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
        if abs(log_of(factor)) < math.log(thresholds.unit_hint_min_factor):
            continue
        miss = abs(log_of(current.median / expected))
        if miss <= math.log(thresholds.unit_hint_tolerance) and (best is None or miss < best[0]):
            best = (miss, candidate, factor)
    return None if best is None else (best[1], best[2])


def _times(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.2g}x" if x >= 0.1 else f"{x:.2g}x"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


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
    if ratio is not None and abs(log_of(ratio[0])) >= math.log(_NEAR_ONE):
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
    """The bin whose share changed most, in words ('values below 4.5: 10% of training admissions, 25% now').

    Any binning: no edges (one bin, an export's reference of a constant code made before its point
    masses were closed) reads 'all values'.
    """
    r, c = ref.proportions(), cur.proportions()
    i = int(np.argmax(np.abs(c - r)))
    return f"values {bin_words(ref.edges, i)} are {_pct(c[i])} of admissions ({_pct(r[i])} in training)"


def bin_words(edges: tuple[float, ...], i: int) -> str:
    """Bin i of `edges` (population.Distribution's bins) in words: 'below 4.5', 'in [4.5, 6)', 'at or above 6'."""
    if not edges:
        return "(all values in one bin)"
    if i <= 0:
        return f"below {edges[0]:.3g}"
    if i >= len(edges):
        return f"at or above {edges[-1]:.3g}"
    return f"in [{edges[i - 1]:.3g}, {edges[i]:.3g})"


def log_of(x: float) -> float:
    """Natural log that is total on [0, inf]: -inf at 0 (a ratio that underflowed), NaN for NaN."""
    return -math.inf if x == 0 else math.log(x)


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


def grouped_presence(findings: list[Finding]) -> list[Finding]:
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


def finding_of(t: Comparison, significant: bool, th: Thresholds, reference: Profile, current: Profile,
               mismatched: Mapping[str, str], loinc: Mapping[str, str], conv: units.Converter) -> Finding:
    """The finding of one comparison, by its kind (severity NONE when it is not one)."""
    return _FINDERS[t.kind](t, significant, th, reference, current, mismatched, loinc, conv)


def unit_mismatches(reference: Profile, current: Profile, conv: units.Converter, loinc: Mapping[str, str],
                     findings: list[Finding]) -> dict[str, str]:
    """code -> the data's unit, for codes whose values were converted to another unit than the model's."""
    out = {}
    for m in unit_mismatch.mismatches(reference.canonical, current.canonical, conv, loinc):
        stats = current.codes.get(m.code)
        if stats is None or stats.values is None:
            continue
        out[m.code] = m.data_unit
        how = ("prepare the data with `ehr-pipeline run --units-from MODEL_DIR` to convert them"
               if m.conversion is not None else f"they cannot be converted ({m.why})")
        findings.append(Finding("unit_mismatch", SEVERE, m.code,
                                f"{m.code}: the data's values are in {m.data_unit}, the model's in {m.model_unit}: "
                                f"{how}",
                                {"data_unit": m.data_unit, "model_unit": m.model_unit,
                                 "factor": m.conversion.scale if m.conversion is not None else None,
                                 "admissions": stats.values.n}))
    return out


def outcome_shares(profile: Profile, conv: units.Converter, loinc: Mapping[str, str]) -> dict[str, dict[str, Any]]:
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
            elif outcome in units.NOT_USED:  # not convertible, ambiguous or a placeholder: lost alike
                lost[unit] = lost.get(unit, 0) + rows
        out[code] = {"total": total, "converted": converted, "not_convertible": lost}
    return out


def unit_outcomes(reference: Profile, current: Profile, conv: units.Converter, loinc: Mapping[str, str],
                  th: Thresholds, findings: list[Finding]) -> None:
    """Adds to `findings` the codes with more values converted, or not convertible, than in training."""
    ref_shares = outcome_shares(reference, conv, loinc)
    for code, cur in sorted(outcome_shares(current, conv, loinc).items()):
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


def oov_findings(reference: Profile, current: Profile, th: Thresholds, findings: list[Finding]) -> None:
    """Adds to `findings` the sources whose share of events with unknown codes rose (most frequent codes named)."""
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
