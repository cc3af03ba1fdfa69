"""The expected-performance table (statistics.metrics_report.estimate_performance) as markdown, with realized numbers beside it.

One table serves the shift report (estimate only: no outcomes yet) and ehr-eval (realized beside
the estimate, and the truth-expected value on a synthetic release); the command lines print it too.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from model.evaluation.statistics.metrics_report import ESTIMATED_METRICS

NAMES = {"auc_roc": "AUROC", "auc_pr": "AUC-PR", "brier": "Brier score", "observed_expected": "O/E deaths"}
ASSUMPTIONS = ("Assumes the model is calibrated on this population, the same relation between inputs and death "
               "as at training (no concept shift) and no region the model never saw; outcomes are what can "
               "show a violation.")


def _interval(row: Mapping[str, Any]) -> str:
    if row.get("estimate") is None:
        return "n/a (one class in every draw)"
    return f"{row['estimate']:.3f} [{row['lower']:.3f}, {row['upper']:.3f}]"


def _realized(row: Mapping[str, Any] | None) -> str:
    if row is None or row.get("value") is None:
        return "n/a"
    inside = {True: "", False: " (outside)", None: ""}[row.get("inside")]
    return f"{row['value']:.3f}{inside}"


def estimate_markdown(estimate: Mapping[str, Any], realized: Mapping[str, Any] | None = None,
                      truth_expected: Mapping[str, Any] | None = None) -> str:
    """Markdown: per metric and net-benefit threshold the posterior estimate, CBPE's mean-only one, and any
    realized / truth-expected values."""
    post, mean_only = estimate["posterior"], estimate["mean_only"]
    head = ["Metric", f"expected ({100 * post['level']:.0f}% interval, posterior)", "expected (mean only)"]
    if realized is not None:
        head.append("realized")
    if truth_expected is not None:
        head.append("truth-expected")
    rows = [(NAMES[name], post["metrics"][name], mean_only["metrics"][name],
             None if realized is None else realized["metrics"][name],
             None if truth_expected is None else truth_expected["metrics"][name]) for name in ESTIMATED_METRICS]
    for j, row in enumerate(post["net_benefit"]):
        rows.append((f"net benefit at {row['threshold']:g}", row, mean_only["net_benefit"][j],
                     None if realized is None else realized["net_benefit"][j],
                     None if truth_expected is None else truth_expected["net_benefit"][j]))
    lines = [f"Expected performance of {post['n']} admissions ({post['expected_deaths']:.1f} deaths expected; "
             f"{post['n_draws']} draws, seed {post['seed']}, {post['columns']} posterior columns). " + ASSUMPTIONS,
             "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, p_row, m_row, r_row, t_row in rows:
        cells = [name, _interval(p_row), _interval(m_row)]
        if realized is not None:
            cells.append(_realized(r_row))
        if truth_expected is not None:
            cells.append(_interval(t_row))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
