"""Text tables of the reports for the command lines: a metrics.json report, its truth section, a comparison."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from model.evaluation.report.html_cells import fixed
from model.evaluation.statistics.metrics import SCALAR_METRICS


def _fmt(value, digits: int = 4) -> str:
    """A number for the table, 'n/a' for None/NaN; one that rounds to zero is printed without a sign."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return fixed(value, digits)


def format_table(metrics: Mapping) -> str:
    """Compact text table of an evaluate() report for the CLI."""
    head = f"n={metrics['n']}  prevalence={_fmt(metrics['prevalence'], 3)}"
    lines = [f"{head}  K={metrics['K']}  S={metrics['S']}"]
    level = int(round(100 * metrics.get("ci_level", 0.95)))
    lines.append(f"{'metric':<18}{'value':>9}  {level}% CI")
    for name, value in metrics["overall"].items():
        ci = metrics.get("ci", {}).get(name)
        interval = f"[{_fmt(ci['lower'])}, {_fmt(ci['upper'])}]" if ci else ""
        lines.append(f"{name:<18}{_fmt(value):>9}  {interval}")
    if metrics.get("members"):
        lines.append("member " + "".join(f"{name:>10}" for name in SCALAR_METRICS))
        for k, row in enumerate(metrics["members"]):
            lines.append(f"{k:<7}" + "".join(f"{_fmt(row[name]):>10}" for name in SCALAR_METRICS))
    if metrics.get("uncertainty"):
        means = metrics["uncertainty"].items()
        lines.append("mean uncertainty: " + "  ".join(f"{k}={_fmt(v)}" for k, v in means))
    if metrics.get("selective"):
        # One line per measure: AUC-PR on the kept cases at each referral rate.
        rates = next(iter(metrics["selective"].values()))
        lines.append(f"{'AUC-PR @ referral':<20}" + "".join(f"{row['referral_rate']:>7.2f}" for row in rates))
        for name, rows in metrics["selective"].items():
            lines.append(f"{name:<20}" + "".join(f"{_fmt(row['auc_pr'], 3):>7}" for row in rows))
    if metrics.get("truth"):
        lines.extend(format_truth(metrics["truth"]))
    return "\n".join(lines)


def format_truth(truth: Mapping) -> list[str]:
    """Lines of a truth_report: error, interval coverage, uncertainty-error correlations, referral vs truth."""
    scalars = {k: v for k, v in truth.items() if not isinstance(v, (Mapping, list))}
    lines = ["vs truth: " + "  ".join(f"{k}={_fmt(v)}" for k, v in scalars.items())]
    lines.append("coverage of truth by central intervals: "
                 + "  ".join(f"{level}={_fmt(v, 3)}" for level, v in truth["coverage"].items()))
    lines.append(f"{'spearman(u, |p - truth|)':<26}{'overall':>9}{'within p deciles':>18}")
    for name, row in truth["uncertainty_vs_error"].items():
        lines.append(f"{name:<26}{_fmt(row['overall'], 3):>9}{_fmt(row['within_p_groups'], 3):>18}")
    rates = next(iter(truth["selective"].values()))
    lines.append(f"{'mean |p - truth| kept':<26}" + "".join(f"{row['referral_rate']:>7.2f}" for row in rates))
    for name, rows in truth["selective"].items():
        lines.append(f"{name:<26}" + "".join(f"{_fmt(row['mae_truth'], 4):>7}" for row in rows))
    return lines


def describe_gap(gap: Mapping[str, Any]) -> str:
    """One sentence naming a gap of subgroup_report, e.g. 'admission_type = URGENT: mean |p - truth| 0.121 ...'."""
    names = {"auc_roc": "AUC-ROC", "abs_observed_minus_expected": "|observed - expected|",
             "logit_error_truth": "mean |logit p - logit P_DEATH|"}
    return (f"{gap['attribute']} = {gap['group']} (n = {gap['n']}): {names.get(gap['metric'], gap['metric'])} "
            f"{gap['group_value']:.3f} vs {gap['rest']:.3f} in the rest, difference {gap['estimate']:+.3f} "
            f"[{gap['lower']:+.3f}, {gap['upper']:+.3f}]")


def describe_update(update: Mapping[str, Any]) -> str:
    """'updated at a new site by ...' for an Adaptation.summary: the method (and choice), the local data, what moved."""
    method = update["method"] + (f" (chose {update['chosen']})" if update.get("chosen") else "")
    if update["weights_updated"]:
        moved = "the network's weights re-estimated"
    else:
        r = update["recalibration"]
        moved = f"every sampled logit l recalibrated to {r['intercept']:+.4f} + {r['slope']:.4f} * l"
    return (f"updated at a new site by ehr-adapt {method} on {update['n']} local admissions "
            f"({update['events']} deaths): {moved}")


def _model_line(side: str, comparison: Mapping[str, Any]) -> str:
    path, name = comparison[side.lower()], (comparison.get("names") or {}).get(side.lower())
    return f"{side} = {path}" if not name or name == str(path) else f"{side} = {name} ({path})"


def format_comparison(comparison: Mapping[str, Any]) -> str:
    """Text table of compare_predictions: the models (which one updates the other), per metric A, B, B - A and its
    interval."""
    lines = [_model_line("A", comparison), _model_line("B", comparison)]
    relation = comparison.get("relation")
    if relation:
        updated, other = relation["updated"].upper(), "B" if relation["updated"] == "a" else "A"
        lines.append(f"{updated} is {other} {describe_update(relation['update'])}; the same cases before and after")
    lines += [f"n = {comparison['n']} paired cases, {comparison['n_bootstrap']} bootstrap resamples",
             f"{'metric':<12}{'A':>9}{'B':>9}{'B - A':>10}  95% interval"]
    for name, row in comparison["metrics"].items():
        lines.append(f"{name:<12}{_fmt(row['a']):>9}{_fmt(row['b']):>9}"
                     f"{_fmt(row['difference']):>10}  [{_fmt(row['lower'])}, "
                     f"{_fmt(row['upper'])}]")
    return "\n".join(lines)

