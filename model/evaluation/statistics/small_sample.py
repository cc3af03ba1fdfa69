"""What an evaluation of this size can and cannot say: intervals that stay honest at 0 and 1, and the rule.

A bootstrap of eleven cases with four deaths shows "AUC 1.000 (1.000 to 1.000)": no resample holds
the variation a new sample would. This module holds the closed-form pieces the report uses instead,
each pure and checked against an independent computation in the tests:

* ``wilson_interval``: the Wilson score interval of a proportion (never of zero width, also at 0/n
  and n/n), for sensitivity, specificity, PPV, NPV and subgroup rates;
* ``threshold_metrics``: those four at a risk threshold, with the counts behind them;
* ``parse_rule`` / ``choose_threshold``: the operating threshold (``ehr-eval --threshold``), a
  probability given, or a rule (``sensitivity:0.8``: the highest threshold whose validation
  sensitivity is at least 0.8) applied only where the validation split has at least
  ``MIN_CALIBRATION_EVENTS`` deaths: with fewer, a sensitivity moves in steps above 10 % and the
  threshold a rule picks is one patient's risk, so the default (the export's decision threshold, 0.5,
  which carries no clinical rationale) is used and the record says why;
* ``auc_interval``: the Hanley-McNeil (1982) standard error of an AUROC, its interval built on the
  logit scale so it stays inside (0, 1); not estimable below ``MIN_AUC_EVENTS`` deaths or
  survivors, or at complete separation (AUROC 0 or 1), where that standard error is zero;
* ``observed_expected``: observed / expected deaths with the log-scale interval of Debray et al.
  (BMJ 2017; 356:i6460), the expected count taken as fixed;
* ``subgroup_estimate``: the cell a subgroup table and forest plot show for a metric, or none;
* ``supported_decimals``: the rounding rule, decimals from an interval's standard error;
* ``estimability``: the small-sample rule of the headline numbers (docs/model.md, "Small samples");
* ``detectable_auc_gap``: the smallest AUROC gap between a group and the rest that the
  heterogeneity test could find at 80 % power, so "no gap named" states its own power.

The rule. Riley et al. (Stat Med 2021; 40:4230) derive the validation size that estimates the
calibration slope, calibration-in-the-large and the c statistic to a useful precision; their worked
examples, like Collins, Ogundimu & Altman (Stat Med 2016; 35:214), land at 100 events or more and
as many non-events. Below ``PRECISE_EVENTS`` deaths or survivors a headline number is shown with
a note that it is imprecise; below ``MIN_CALIBRATION_EVENTS`` the logistic recalibration fit has
fewer deaths than the ten per parameter a logistic fit needs (Peduzzi et al. 1996; two parameters,
but the slope is one of them and the page states it per estimate) and calibration is "not estimable
at this size".
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import norm

from model.evaluation.statistics import metrics
from model.export_layout import DECISION_THRESHOLD

# Fewer deaths or survivors than this: calibration slope, calibration-in-the-large and the
# LOWESS curve are not estimable (ten events per fitted parameter, Peduzzi et al. 1996).
MIN_CALIBRATION_EVENTS = 10
# Fewer than this: every headline number carries "imprecise at this size" (Riley et al. 2021;
# Collins et al. 2016 advise at least 100 events and 100 non-events for a validation).
PRECISE_EVENTS = 100
# A subgroup AUROC needs at least this many deaths and survivors (and 0 < AUROC < 1).
MIN_AUC_EVENTS = 5
# A paired calibration-slope difference whose 95% interval is wider than this says nothing a reader can use:
# the ideal slope is 1 and 0 means no discrimination left, so an interval spanning more than twice that
# distance comes from resamples near separation (the demo's -5.47 to 11.58), not from the models.
MAX_SLOPE_DIFFERENCE_WIDTH = 2.0
# Power the heterogeneity verdict states its detectable gap at.
POWER = 0.8
NOT_ESTIMABLE = "not estimable at this size"


def wilson_interval(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float] | None:
    """Wilson score interval of successes / n; None when n is 0."""
    if n <= 0:
        return None
    z = float(norm.ppf(1.0 - alpha / 2.0))
    phat = successes / n
    denom = 1.0 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1.0 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def proportion(successes: int, n: int, alpha: float = 0.05) -> dict[str, Any]:
    """{estimate, lower, upper, successes, n} with a Wilson interval; estimate None (with a reason) when n is 0."""
    interval = wilson_interval(successes, n, alpha)
    if interval is None:
        return {"estimate": None, "lower": None, "upper": None, "successes": successes, "n": n,
                "reason": "no cases in the denominator"}
    return {"estimate": successes / n, "lower": interval[0], "upper": interval[1], "successes": successes, "n": n}


def threshold_metrics(p, y, threshold: float, alpha: float = 0.05) -> dict[str, Any]:
    """Sensitivity, specificity, PPV, NPV of 'positive when p >= threshold' (probability), Wilson intervals."""
    p, y = metrics.as_pair(p, y)
    positive = p >= threshold
    death = y == 1
    tp = int(np.sum(positive & death))
    fp = int(np.sum(positive & ~death))
    fn = int(np.sum(~positive & death))
    tn = int(np.sum(~positive & ~death))
    return {"threshold": float(threshold), "tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "sensitivity": proportion(tp, tp + fn, alpha), "specificity": proportion(tn, tn + fp, alpha),
            "ppv": proportion(tp, tp + fp, alpha), "npv": proportion(tn, tn + fn, alpha)}


def threshold_table(p, y, thresholds: Sequence[float], alpha: float = 0.05) -> list[dict[str, Any]]:
    """threshold_metrics at each threshold (probabilities), in the given order."""
    return [threshold_metrics(p, y, t, alpha) for t in thresholds]


def no_information_rate(y) -> float:
    """Accuracy of always predicting the more common outcome: what 'accuracy' must beat."""
    rate = float(np.mean(np.asarray(y, dtype=np.float64)))
    return max(rate, 1.0 - rate)


def hanley_mcneil_se(auc: float, events: int, non_events: int) -> float:
    """Standard error of an AUROC with `events` positives and `non_events` negatives (Hanley & McNeil 1982)."""
    q1 = auc / (2.0 - auc)
    q2 = 2.0 * auc * auc / (1.0 + auc)
    var = (auc * (1.0 - auc) + (events - 1) * (q1 - auc * auc)
           + (non_events - 1) * (q2 - auc * auc)) / (events * non_events)
    return math.sqrt(max(var, 0.0))


def auc_interval(auc: float | None, events: int, non_events: int, alpha: float = 0.05) -> dict[str, Any]:
    """AUROC with a logit-scale Hanley-McNeil interval, or not estimable (with the reason) at this size."""
    if min(events, non_events) < MIN_AUC_EVENTS:
        return {"estimate": auc, "lower": None, "upper": None, "estimable": False,
                "reason": f"fewer than {MIN_AUC_EVENTS} deaths or survivors"}
    if auc is None or not 0.0 < auc < 1.0:
        return {"estimate": auc, "lower": None, "upper": None, "estimable": False,
                "reason": "deaths and survivors completely separated: no interval at this size"}
    se_logit = hanley_mcneil_se(auc, events, non_events) / (auc * (1.0 - auc))
    z = float(norm.ppf(1.0 - alpha / 2.0))
    centre = math.log(auc / (1.0 - auc))
    expit = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731
    return {"estimate": auc, "lower": expit(centre - z * se_logit), "upper": expit(centre + z * se_logit),
            "estimable": True}


def observed_expected(events: int, expected: float, n: int, alpha: float = 0.05) -> dict[str, Any]:
    """O/E = events / expected (expected: the sum of predicted risks) with a log-scale Wald interval,
    SE(ln O/E) = sqrt((1 - O/n) / O) (Debray et al. 2017); not estimable with no deaths or no survivors."""
    if events <= 0 or events >= n or expected <= 0:
        return {"estimate": None if expected <= 0 else events / expected, "lower": None, "upper": None,
                "estimable": False, "observed": int(events), "expected": float(expected),
                "reason": "no deaths or no survivors"}
    ratio = events / expected
    se = math.sqrt((1.0 - events / n) / events)
    z = float(norm.ppf(1.0 - alpha / 2.0))
    return {"estimate": ratio, "lower": ratio * math.exp(-z * se), "upper": ratio * math.exp(z * se),
            "observed": int(events), "expected": float(expected)}


def estimability(events: int, n: int) -> dict[str, Any]:
    """The small-sample rule for a set of cases: whether calibration is estimable, whether numbers are precise."""
    smaller = min(events, n - events)
    calibration = smaller >= MIN_CALIBRATION_EVENTS
    precise = smaller >= PRECISE_EVENTS
    if not calibration:
        note = (f"{smaller} {'deaths' if events <= n - events else 'survivors'}: calibration slope and "
                f"calibration-in-the-large are {NOT_ESTIMABLE} (fewer than {MIN_CALIBRATION_EVENTS}); every other "
                f"number is imprecise (fewer than {PRECISE_EVENTS}, Riley et al. 2021)")
    elif not precise:
        note = (f"imprecise at this size: {smaller} {'deaths' if events <= n - events else 'survivors'}, fewer "
                f"than the {PRECISE_EVENTS} a validation needs (Riley et al. 2021)")
    else:
        note = ""
    what = "deaths" if events <= n - events else "survivors"
    # The card's line: the same rule, short enough to sit under every headline number.
    card_note = "" if precise else f"imprecise: {smaller} {what} (< {PRECISE_EVENTS}; Riley et al. 2021)"
    return {"events": int(events), "n": int(n), "smaller_class": int(smaller), "calibration_estimable": calibration,
            "precise": precise, "note": note, "card_note": card_note, "min_calibration_events": MIN_CALIBRATION_EVENTS,
            "precise_events": PRECISE_EVENTS}


def headline_auc(cell: dict[str, Any] | None, events: int, n: int) -> dict[str, Any] | None:
    """The whole evaluation's AUROC cell as the page may show it: the subgroups' rule (MIN_AUC_EVENTS deaths and
    survivors) applied to all cases, so an AUROC of 4 deaths is not estimable on page 1 as in a subgroup."""
    if cell is None or min(events, n - events) >= MIN_AUC_EVENTS:
        return cell
    return {"estimate": None, "lower": None, "upper": None, "estimable": False,
            "reason": f"fewer than {MIN_AUC_EVENTS} deaths or survivors"}


def slope_difference_flag(cell: dict[str, Any], estimable: bool) -> str | None:
    """Why a paired calibration-slope difference B - A must not be read, or None: either side's slope is not
    estimable (small-sample rule), or its 95% interval is wider than MAX_SLOPE_DIFFERENCE_WIDTH."""
    if not estimable:
        return "not estimable: a side's calibration slope is not estimable at this size"
    lower, upper = cell.get("lower"), cell.get("upper")
    if lower is None or upper is None or not math.isfinite(lower) or not math.isfinite(upper):
        return "not estimable: no interval"
    if upper - lower > MAX_SLOPE_DIFFERENCE_WIDTH:
        return (f"not interpretable: its 95% interval is {upper - lower:.0f} slope units wide (more than "
                f"{MAX_SLOPE_DIFFERENCE_WIDTH:g}), from near-separation in a resample")
    return None


def subgroup_estimate(row: dict[str, Any], key: str, min_cases: int) -> dict[str, Any]:
    """The cell of a subgroup_report row to show for metric `key`, or {estimate None, estimable False, reason}.

    The death rate carries its Wilson interval at any size; the AUROC its Hanley-McNeil one, not estimable
    under MIN_AUC_EVENTS deaths or survivors or at complete separation; every other metric is not estimable
    in a group of fewer than `min_cases` cases (the heterogeneity test's MIN_GAP_CASES, below which a
    bootstrap of the group is itself unreliable).
    """
    if key == "observed_rate" and row.get("observed_rate_wilson"):
        return row["observed_rate_wilson"]
    if key == "auc_roc" and row.get("auc_roc_hm"):
        cell = row["auc_roc_hm"]
        return cell if cell.get("estimable", True) else {"estimate": None, "lower": None, "upper": None,
                                                         "estimable": False, "reason": cell["reason"]}
    if row["n"] < min_cases:
        return {"estimate": None, "lower": None, "upper": None, "estimable": False,
                "reason": f"fewer than {min_cases} cases"}
    return row.get(key) or {"estimate": None, "lower": None, "upper": None}


def supported_decimals(lower: float | None, upper: float | None, most: int = 3, alpha: float = 0.05) -> int:
    """Decimals an estimate with this (1 - alpha) interval supports: 1 - floor(log10(SE)), SE the interval's width
    over 2 z, between 0 and `most` (an SE of 0.16 gives 2 decimals, 0.03 gives 3); `most` without an interval."""
    if lower is None or upper is None or not math.isfinite(lower) or not math.isfinite(upper) or upper <= lower:
        return most
    se = (upper - lower) / (2.0 * float(norm.ppf(1.0 - alpha / 2.0)))
    return max(0, min(most, 1 - math.floor(math.log10(se))))


def detectable_auc_gap(auc: float, events: int, non_events: int, rest_events: int, rest_non_events: int,
                       z_test: float, power: float = POWER) -> float | None:
    """Smallest AUROC gap (group - rest, absolute) a z test at z_test finds with `power`; None if not estimable."""
    if min(events, non_events, rest_events, rest_non_events) < MIN_AUC_EVENTS or not 0.0 < auc < 1.0:
        return None
    se = math.hypot(hanley_mcneil_se(auc, events, non_events), hanley_mcneil_se(auc, rest_events, rest_non_events))
    return float((z_test + norm.ppf(power)) * se)


def small_sample_report(p, y, thresholds: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """The rule applied to one set of predictions, the no-information rate and the threshold table (JSON-ready)."""
    p, y = metrics.as_pair(p, y)
    events = int(y.sum())
    return {"estimability": estimability(events, int(y.size)), "no_information_rate": no_information_rate(y),
            "thresholds": threshold_table(p, y, thresholds, alpha)}


def subgroup_power(sub: dict[str, Any], auc: float, events: int, n: int, alpha: float = 0.05) -> dict[str, Any]:
    """Adds to a subgroup_report, in place, per group a Hanley-McNeil AUROC, a Wilson death rate and its detectable
    AUROC gap at POWER (Bonferroni z of the report); returns the power statement's numbers."""
    z_test = float(sub["z_named"])
    detectable = []
    for groups in sub["attributes"].values():
        for name, row in groups.items():
            g_events, g_n = int(row["events"]), int(row["n"])
            g_auc = (row.get("auc_roc") or {}).get("estimate")
            row["auc_roc_hm"] = auc_interval(g_auc, g_events, g_n - g_events, alpha)
            row["observed_rate_wilson"] = proportion(g_events, g_n, alpha)
            gap = detectable_auc_gap(auc, g_events, g_n - g_events, events - g_events,
                                     (n - events) - (g_n - g_events), z_test)
            row["detectable_auc_gap"] = gap
            if gap is not None:
                detectable.append(gap)
    sub["power"] = {"power": POWER, "z_test": z_test, "groups_tested": len(detectable),
                    "smallest_detectable_auc_gap": min(detectable) if detectable else None,
                    "largest_detectable_auc_gap": max(detectable) if detectable else None}
    return sub["power"]


# --------------------------------------------------------------------------- the operating threshold

# --threshold's default: the export's decision threshold, where accuracy is counted.
DEFAULT_THRESHOLD = f"{DECISION_THRESHOLD:g}"
RULES = ("sensitivity",)


class ThresholdRule(BaseModel):
    """A parsed --threshold: a probability given, or a target sensitivity to reach on validation."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["probability", "sensitivity"]
    value: float = Field(gt=0.0, lt=1.0)

    @property
    def text(self) -> str:
        """The rule as --threshold spells it."""
        return f"{self.value:g}" if self.kind == "probability" else f"{self.kind}:{self.value:g}"


def parse_rule(text: str) -> ThresholdRule:
    """'0.3' or 'sensitivity:0.8' as a ThresholdRule; ValueError with one line naming what is wrong."""
    kind, _, value = text.rpartition(":")
    kind = kind or "probability"
    if kind not in ("probability", *RULES):
        raise ValueError(f"--threshold {text!r}: a probability in (0, 1) or {', '.join(RULES)}:TARGET")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--threshold {text!r}: {value!r} is not a number") from None
    if not 0.0 < number < 1.0 or not math.isfinite(number):
        raise ValueError(f"--threshold {text!r}: {number:g} is outside (0, 1)")
    return ThresholdRule(kind=kind, value=number)


def sensitivity_threshold(p, y, target: float) -> float:
    """Highest threshold t (a probability) with mean(p[y == 1] >= t) >= target: the k-th highest death's risk."""
    p, y = metrics.as_pair(p, y)
    deaths = np.sort(p[y == 1])[::-1]
    if deaths.size == 0:
        raise ValueError("no deaths: a target sensitivity cannot be placed")
    k = max(1, math.ceil(target * deaths.size - 1e-12))
    return float(deaths[k - 1])


def choose_threshold(rule: ThresholdRule, p_validation=None, y_validation=None) -> dict[str, Any]:
    """The operating threshold for a rule, with where it came from and why (JSON-ready, for metrics.json)."""
    if rule.kind == "probability":
        default = rule.text == DEFAULT_THRESHOLD
        rationale = ("the default, the export's decision threshold (where accuracy is counted): no clinical "
                     "rationale; give ehr-eval --threshold for one" if default else
                     "given with ehr-eval --threshold; its clinical rationale is for the user to state")
        return {"threshold": rule.value, "rule": rule.text, "chosen_on": "default" if default else "given",
                "rationale": rationale, "validation": None}
    if p_validation is None:
        return {"threshold": DECISION_THRESHOLD, "rule": rule.text, "chosen_on": "default",
                "rationale": f"the default: {rule.text} needs a validation split, which this evaluation has not",
                "validation": None}
    p, y = metrics.as_pair(p_validation, y_validation)
    events, n = int(y.sum()), int(y.size)
    validation = {"n": n, "events": events}
    if events < MIN_CALIBRATION_EVENTS:
        return {"threshold": DECISION_THRESHOLD, "rule": rule.text, "chosen_on": "default", "validation": validation,
                "rationale": f"the default: validation too small to choose by {rule.text} ({events} deaths in {n} "
                             f"cases, fewer than the {MIN_CALIBRATION_EVENTS} a target sensitivity "
                             "needs)"}
    t = sensitivity_threshold(p, y, rule.value)
    reached = float(np.mean(p[y == 1] >= t))
    return {"threshold": t, "rule": rule.text, "chosen_on": "validation", "validation": {**validation,
                                                                                          "sensitivity": reached},
            "rationale": f"chosen on the validation split ({n} cases, {events} deaths) as the highest risk "
                         f"threshold reaching sensitivity {rule.value:g} there ({reached:.2f})"}
