"""report.html: one self-contained page per evaluation, for a clinical reviewer.

The page renders a metrics.json (``ehr-eval --model`` / ``--baseline``) or a comparison.json
(``ehr-eval --compare``) and computes nothing: every number on it is a number in that file, and
every figure is drawn (model.evaluation.report.plots) from the curves stored there. Figures are embedded as PNG
data URIs and the style sheet is inline, so the page opens from disk with no network.

Sections follow the results items of TRIPOD+AI (Collins et al., BMJ 2024): participants (20a-c),
numbers in each analysis (21), model specification (22), performance with intervals including
subgroups (23a), heterogeneity (23b), updating (24).
"""
from __future__ import annotations

import base64
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from model.evaluation.statistics import clinical_stats, small_sample
from model.evaluation.report import design_html, formatting, plots, report_summary, tripod_items
from model.evaluation.report.html_cells import card as _card, ci as _ci, esc as _esc, interval_text as _interval_text
from model.evaluation.report.html_cells import NO_INTERVAL, fixed as _fixed
from model.evaluation.report.html_cells import num as _num, pct as _pct, section as _section, table as _table

TITLE = "In-hospital mortality after the first 24 hours: evaluation report"
# Labels of the report's metrics, in the order tables list them.
METRIC_LABELS = {"auc_roc": "AUC-ROC (discrimination)", "auc_pr": "AUC-PR (average precision)",
                 "brier": "Brier score", "nll": "Negative log-likelihood (nats)", "ece": "ECE (15 bins, top-label)",
                 "accuracy": "Accuracy at p > 0.5"}
SELECTIVE_LABELS = {"aurc": "AURC", "augrc": "AUGRC", "risk_at_coverage": "error at {cov:.0%} coverage",
                    "coverage_at_risk": "coverage at error <= {risk:g}", "full_coverage_risk": "error, no referral"}
SCORE_LABELS = {"predictive_entropy": "predictive entropy", "mutual_information": "mutual information (epistemic)",
                "predictive_std": "std of sampled p", clinical_stats.RISK_SCORE: "highest p first"}
SUBGROUP_COLUMNS = (("auc_roc", "AUC-ROC"), ("observed_minus_expected", "observed - expected"),
                    ("brier", "Brier"), ("nll", "NLL"), ("ece", "ECE"), ("auc_pr", "AUC-PR"),
                    ("accuracy", "accuracy"), ("mean_p", "mean p"), ("observed_rate", "observed rate"))
GAP_LABELS = {"auc_roc": "AUC-ROC", "abs_observed_minus_expected": "|observed - expected|",
              "logit_error_truth": "mean |logit p - logit P_DEATH|"}

_CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1d2733;max-width:1100px;
margin:24px auto;padding:0 20px;line-height:1.45;font-size:14px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;border-bottom:2px solid #2b6cb0;padding-bottom:3px;
margin-top:30px}h3{font-size:14.5px;margin:18px 0 6px}.meta{color:#556;font-size:12.5px}
.item{color:#2b6cb0;font-weight:normal;font-size:12px;margin-left:6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:12.5px}th,td{border:1px solid #cfd6de;
padding:3px 7px;text-align:right;vertical-align:top}th{background:#eef3f8}td.l,th.l{text-align:left}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:10px;margin:12px 0}
.card{border:1px solid #cfd6de;border-radius:6px;padding:8px 10px;background:#f8fafc}
.card .v{font-size:18px;font-weight:600}.card .k{font-size:11.5px;color:#556}.card .ci{font-size:11.5px;color:#556}
figure{margin:10px 0}figure img{max-width:100%;border:1px solid #e2e8f0}figcaption{font-size:12px;color:#556}
.note{font-size:12.5px;color:#445;background:#f6f8fa;border-left:3px solid #a0aec0;padding:6px 10px}
.warn{border-left-color:#c05621;background:#fffaf0}ul.gaps li{margin-bottom:4px}
.card.grey{opacity:.55}.card .ss{font-size:11px;color:#9c4221;margin-top:3px}
.summary{border:2px solid #2b6cb0;border-radius:6px;padding:2px 14px;background:#f7fafc;font-size:12.5px;
line-height:1.3}
.summary h2{margin-top:6px}.summary dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:4px 0}
.summary dt{font-weight:600}.summary dd{margin:0}.summary ul{margin:2px 0 6px}
"""


# --------------------------------------------------------------------------- sections


def _figure(fig, alt: str, caption: str) -> str:
    data = base64.b64encode(plots.png_bytes(fig)).decode("ascii")
    return (f'<figure><img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")




def _overall(doc: Mapping[str, Any]) -> str:
    ci = dict(doc.get("ci", {}))
    if ci.get("auc_roc"):
        ci["auc_roc"] = report_summary.shown_auc(ci["auc_roc"], doc["clinical"])
    rows = [[METRIC_LABELS[k], _ci(ci.get(k) or {"estimate": doc["overall"].get(k)})] for k in METRIC_LABELS
            if k in doc.get("overall", {})]
    nir = (doc.get("clinical", {}).get("small_sample") or {}).get("no_information_rate")
    if nir is not None:
        rows.append(["No-information rate (always the commoner outcome)", _num(nir)])
    note = ""
    ece = ci.get("ece") or {}
    if ece.get("bias_corrected") is not None:
        note = ('<p class="note">ECE grows with sampling noise, so its interval is the basic bootstrap one, which '
                f"can lie below the estimate; the bias-corrected ECE is {_num(ece['bias_corrected'])}.</p>")
    return "<h3>Discrimination and overall performance</h3>" + _table(["Metric", "estimate (95% CI)"], rows) + note


def _roc(models: Sequence[tuple[str, Mapping, Mapping | None]]) -> str:
    """The ROC curve of each (label, clinical, AUROC cell) whose file stores one; the AUROC in the legend only where
    the small-sample rule lets the page show it, rounded as the tables round it."""
    lines = []
    for label, clinical, auc in models:
        roc = (clinical.get("curves") or {}).get("roc")
        if not roc or not roc["fpr"]:
            continue
        cell = report_summary.shown_auc(auc, clinical)
        shown = cell is not None and cell.get("estimable", True) and cell.get("estimate") is not None
        lines.append((f"{label} (AUC-ROC {_interval_text(cell)[0]})" if shown else label, roc))
    if not lines:
        return ""
    return _figure(plots.roc_figure(lines), "ROC curve: sensitivity against 1 - specificity",
                   f"ROC curve{'s' if len(lines) > 1 else ''} over every risk threshold; the dashed diagonal is chance "
                   "(AUC-ROC 0.5).")


def _risk_histogram(doc: Mapping[str, Any]) -> str:
    """Where the predicted risks lie, drawn under the calibration curve."""
    histogram = (doc["clinical"].get("curves") or {}).get("histogram")
    if not histogram:
        return ""
    return _figure(plots.risk_histogram_figure(histogram), "histogram of predicted risk by outcome",
                   "Cases per predicted-risk bin (width 0.02), deaths stacked on survivors: the calibration curve "
                   "above is informed only where cases lie.")


def _calibration(models: Sequence[tuple[str, Mapping]]) -> str:
    """Calibration table and figure of (label, clinical) pairs, each as the small-sample rule lets it be shown."""
    models = [(label, report_summary.shown_calibration(clinical)) for label, clinical in models]
    rows = []
    for label, cal in models:
        rows.append([label, _ci(cal["intercept"], 3, signed=True), _ci(cal["slope"]),
                     _num(cal["observed"]), _num(cal["expected"]), _num(cal["observed_over_expected"])])
    table = _table(["Model", "calibration-in-the-large (0 ideal)", "calibration slope (1 ideal)",
                    "observed rate", "mean predicted", "observed / expected"], rows)
    note = ('<p class="note">Intercept: logistic recalibration with logit(p) as an offset (slope fixed at 1): '
            "above 0, risks are under-estimated on average. Slope: regression of the outcome on logit(p): below 1, "
            "predictions are too extreme (high risks too high, low risks too low). Wald 95% intervals "
            "(statsmodels). The curve, where estimable, is a LOWESS smooth of the outcome on p with a bootstrap band; "
            "points are deciles of p with Wilson intervals.</p>")
    fig = _figure(plots.calibration_figure(models), "calibration curve",
                  "Observed proportion of deaths against predicted risk; the dashed diagonal is perfect calibration.")
    return "<h3>Calibration</h3>" + table + note + fig


def _decision(models: Sequence[tuple[str, Mapping]]) -> str:
    rows = []
    for label, d in models:
        for row in d["table"]:
            rows.append([label, f"{row['threshold']:.0%}", _ci(row["model"]),
                         _ci(row["gain_over_default"], signed=True)])
    table = _table(["Model", "threshold", "net benefit (95% CI)", "gain over the better of treat all / none"], rows,
                   left=2)
    first = models[0][1]
    ref = ""
    if "referral_treated" in first:
        ref = (f" With referral, {_pct(first['referred_fraction'])} of the cases go to a clinician: the dashed line "
               "treats every referred case, the dotted line assumes the review decides each correctly (an upper "
               "bound); the right panel is the model among the cases it decides alone.")
    note = ('<p class="note">Net benefit = true positives/n - false positives/n x pt/(1-pt), treating every '
            "patient whose predicted risk is at least the threshold pt (Vickers and Elkin 2006). A model is useful "
            f"at a threshold where its curve lies above both treat-all and treat-none.{_esc(ref)}</p>")
    fig = _figure(plots.decision_curve_figure(models), "decision curve", "Net benefit against threshold probability.")
    return "<h3>Clinical utility: decision curve analysis</h3>" + fig + note + table


def _selective(models: Sequence[tuple[str, Mapping]], referral: Mapping[str, Any] | None,
               doc: Mapping[str, Any] | None = None, same_ranking: Sequence[Sequence[str]] = ()) -> str:
    first = models[0][1]
    labels = {k: v.format(cov=first["target_coverage"], risk=first["target_risk"]) for k, v in SELECTIVE_LABELS.items()}
    keys = ("aurc", "augrc", "risk_at_coverage", "coverage_at_risk", "full_coverage_risk")
    rows = []
    for label, sel in models:
        for score, cells in sel["scores"].items():
            rows.append([label, SCORE_LABELS.get(score, score)] + [_ci(cells[k]) for k in keys])
    table = _table(["Model", "refer by"] + [labels[k] for k in keys], rows, left=2)
    note = ('<p class="note">Cases are referred to a clinician most-uncertain first; the model decides the rest. '
            "Error: p > 0.5 disagrees with the outcome. AURC: mean error of the kept cases over all coverages; "
            "AUGRC: mean share of all cases that are kept and wrong (Traub et al. 2024); lower is better for both. "
            "Percentile bootstrap 95% intervals. A score that does no better than referring the highest risks "
            "first adds nothing a risk threshold would not.</p>")
    fig = _figure(plots.selective_figure(models, first["target_risk"]), "risk-coverage curves",
                  "Error rate of the cases the model keeps, as more are referred (right to left).")
    kept = ""
    if referral and referral.get("kept") and doc is not None:
        rows = [[name, _num(a), _num(b), verdict] for name, a, b, verdict in report_summary.kept_changes(doc)]
        kept = ("<p>At the referral rule chosen on validation "
                f"({_esc(referral['measure'])}, {_pct(referral['referred_fraction'])} referred here), every metric of "
                "the kept cases against all cases (a metric can worsen while another improves):</p>"
                + _table(["metric", "all cases", "kept cases", "kept vs all"], rows))
    same = "".join(f" {SCORE_LABELS.get(a, a)} orders the cases exactly as {SCORE_LABELS.get(b, b)} does: their "
                   "curves coincide and one hides the other." for a, b in same_ranking)
    if same:
        note = note.replace("</p>", _esc(same) + "</p>")
    return "<h3>Uncertainty and referral: selective prediction</h3>" + table + note + fig + kept


def _truth(truth: Mapping[str, Any] | None) -> str:
    if not truth:
        return ""
    cov = truth.get("coverage", {})
    rows = [["mean |p - P_DEATH|", _num(truth.get("mae"), 4)], ["RMSE against P_DEATH", _num(truth.get("rmse"), 4)],
            ["excess NLL over the truth (nats)", _num(truth.get("nll_excess"), 4)],
            ["AUC-ROC of P_DEATH itself (the ceiling)", _num(truth.get("auc_roc_truth"))]]
    rows += [[f"P_DEATH inside the central {float(level):.0%} interval", _pct(v)] for level, v in cov.items()]
    return ("<h3>Against the known truth (synthetic release)</h3>"
            '<p class="note">A synthetic release knows each admission\'s probability of death (P_DEATH); a real '
            "release does not, and these rows are absent there.</p>" + _table(["Measure", "value"], rows))


def _subgroup_text(cell: Mapping[str, Any], key: str) -> str:
    """A subgroup table's cell: the estimate and interval, or "not estimable" (the note above the tables says
    by which rule)."""
    return "not estimable" if cell.get("estimable") is False else _ci(cell, 3, signed=key.endswith("expected"))


def _subgroups(models: Sequence[tuple[str, Mapping]]) -> str:
    parts = []
    for label, sub in models:
        if not sub:
            continue
        has_truth = "logit_error_truth" in sub.get("gap_metrics", [])
        truth_columns = [("mae_truth", "mean |p - P_DEATH|"), ("logit_error_truth", "mean |logit p - logit P_DEATH|")]
        columns = list(SUBGROUP_COLUMNS) + (truth_columns if has_truth else [])
        panels = [("auc_roc", "AUC-ROC"), ("observed_minus_expected", "observed - expected")]
        panels += truth_columns[1:] if has_truth else [("brier", "Brier")]
        title = f"{label}: " if len(models) > 1 else ""
        if plots.forest_rows(sub, panels):
            parts.append(_figure(plots.subgroup_figure(sub, panels), "subgroup forest plot",
                                 f"{title}estimates with 95% intervals per subgroup, only where estimable (a group "
                                 f"of at least {sub['min_gap_cases']} cases; an AUROC with "
                                 f"{small_sample.MIN_AUC_EVENTS} deaths and survivors)."))
        else:
            parts.append(f'<p class="note">{_esc(title)}no forest plot: no subgroup estimate is estimable at this '
                         "size (see the tables).</p>")
        for attribute, groups in sub["attributes"].items():
            rows = [[group, _num(row["n"]), _num(row["events"])]
                    + [_subgroup_text(small_sample.subgroup_estimate(row, k, sub["min_gap_cases"]), k)
                       for k, _ in columns]
                    for group, row in groups.items()]
            parts.append(f"<h3>{_esc(title)}{_esc(attribute.replace('_', ' '))}</h3>"
                         + _table(["group", "n", "deaths"] + [name for _, name in columns], rows))
    return ("<h3>Subgroups (calibration by subgroup: observed - expected)</h3>"
            '<p class="note">AUC-ROC with a logit-scale Hanley-McNeil 95% interval, not estimable with fewer than '
            f"{small_sample.MIN_AUC_EVENTS} deaths or survivors or at complete separation; the death rate with a "
            "Wilson interval; every other metric with a percentile bootstrap 95% interval (basic for ECE) within each "
            f"group, not estimable in a group of fewer than {clinical_stats.MIN_GAP_CASES} cases. AUC-PR, Brier and "
            "NLL move with a group's death rate, ECE with its size and |p - P_DEATH| with "
            "its risk: compare groups on AUC-ROC, observed - expected and, where the truth is known, the error on "
            "the log-odds scale.</p>" + "".join(parts))


def _heterogeneity(models: Sequence[tuple[str, Mapping]]) -> str:
    parts = []
    for label, sub in models:
        if not sub:
            continue
        title = f"<h3>{_esc(label)}</h3>" if len(models) > 1 else ""
        if sub["gaps"]:
            items = "".join(f"<li><b>{_esc(g['attribute'].replace('_', ' '))} = {_esc(g['group'])}</b> "
                            f"(n = {g['n']}): {_esc(GAP_LABELS.get(g['metric'], g['metric']))} "
                            f"{_num(g['group_value'])} against {_num(g['rest'])} in the other cases, difference "
                            f"{_fixed(g['estimate'], 3, True)} (95% CI {_fixed(g['lower'], 3, True)} to "
                            f"{_fixed(g['upper'], 3, True)})</li>"
                            for g in sub["gaps"])
            lead = '<p>The model serves these groups worse than the rest:</p><ul class="gaps">' + items + "</ul>"
        else:
            seen = "".join(f"<li>{_esc(formatting.describe_gap(g))}</li>" for g in sub["largest"].values())
            lead = report_summary.power_note(sub) + (
                f'<p>The largest gaps seen, none beyond the adjusted threshold:</p><ul class="gaps">{seen}</ul>'
                if seen else "")
        if not sub["comparisons"]:  # nothing was tested: the power note above says why
            parts.append(title + lead)
            continue
        parts.append(title + lead + (
            f'<p class="note">Each group is compared with all other cases on {", ".join(GAP_LABELS[m] for m in sub["gap_metrics"])} '
            f"({sub['comparisons']} comparisons of groups with at least {sub['min_gap_cases']} cases); a gap is named "
            f"when it exceeds {sub['z_named']:.2f} bootstrap standard errors (Bonferroni-adjusted 5%).</p>"))
    return _section("Heterogeneity of performance across subgroups", "23b", "".join(parts)) if parts else ""


_NOT_UPDATED = "<p>None: the model is evaluated as exported, without recalibration or refitting.</p>"


def _updated_from(update: Mapping[str, Any]) -> str:
    return (f"{_esc(update['parent_name'])} (export sha256 {_esc(update['parent_checksum'][:12])}) "
            f"{_esc(formatting.describe_update(update))}")


def _updating(members: Sequence[Mapping[str, Any]]) -> str:
    """TRIPOD 24 for one evaluated model: each member an update made at a new site (ehr-adapt), or none."""
    body = "".join(f"<p>{_esc(m.get('name', 'the model'))} is {_updated_from(m['update'])}.</p>"
                   for m in members if m.get("update"))
    return _section("Model updating", "24", body or _NOT_UPDATED)


def _updating_compared(doc: Mapping[str, Any]) -> str:
    """TRIPOD 24 for a comparison: which side updates the other (same cases before and after), each side's updates."""
    relation = doc.get("relation")
    body = ""
    if relation:
        updated, other = relation["updated"].upper(), "B" if relation["updated"] == "a" else "A"
        body += (f"<p><b>{updated} is {other} {_esc(formatting.describe_update(relation['update']))}</b>: both "
                 f"scored on the same {_num(doc['n'])} cases, so the paired differences above are what the update "
                 "changed on them.</p>")
    for side, card in (doc.get("cards") or {}).items():
        if card.get("kind") == "baseline":
            body += (f"<p>{side.upper()} is a {_esc(card.get('estimator'))} baseline fitted on the spot on the data "
                     "folder's train split: not an existing model, so not an update of one.</p>")
    for side, updates in (doc.get("updates") or {}).items():
        body += "".join(f"<p>{side.upper()} is {_updated_from(u)}.</p>" for u in updates
                        if not relation or u != relation["update"])
    if body and len(doc.get("cards") or {}) == 2 and not relation and not doc.get("updates", {}).get("a") \
            and not doc.get("updates", {}).get("b") and any(c.get("kind") != "baseline" for c in doc["cards"].values()):
        body += "<p>The other side is evaluated as exported, without recalibration or refitting.</p>"
    return _section("Model updating", "24", body or _NOT_UPDATED)


# --------------------------------------------------------------------------- pages


def render(doc: Mapping[str, Any]) -> str:
    """The page of a metrics.json (one model, ensemble or baseline) or a comparison.json (two prediction files)."""
    body = _render_comparison(doc) if "a" in doc.get("clinical", {}) else _render_single(doc)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_esc(TITLE)}</title>'
            f"<style>{_CSS}</style></head><body>{body}</body></html>\n")


def _method(card: Mapping[str, Any]) -> str:
    """The architecture a model card's config names (its "method" field is the config's name)."""
    return str(((card.get("config") or {}).get("model") or {}).get("method") or card.get("method", "?"))


def _render_single(doc: Mapping[str, Any]) -> str:
    clinical = doc["clinical"]
    members = (doc.get("model") or {}).get("members") or []
    if doc.get("baseline"):
        what = f"{doc['baseline']['kind']} baseline"
    else:
        what = " + ".join(f"{m.get('name', '?')} ({_method(m)}, K = {m.get('ensemble_size', '?')})"
                          for m in members) or "model"
    meta = (f"{_esc(what)} · split <b>{_esc(doc.get('split', 'test'))}</b> · {_num(doc['n'])} admissions · "
            f"S = {doc['S']} samples x K = {doc['K']} members · {doc.get('ci_level', 0.95):.0%} intervals · "
            f"seed {doc.get('seed', 0)}")
    sha = doc.get("data_manifest_sha256")
    meta += f" · data manifest sha256 {_esc(sha[:12])}" if sha else ""
    performance = (report_summary.key_cards(doc, clinical) + _overall(doc)
                   + _roc([("model", clinical, (doc.get("ci") or {}).get("auc_roc"))])
                   + report_summary.threshold_section(clinical) + report_summary.calibration_warning(clinical)
                   + _calibration([("model", clinical)])
                   + _risk_histogram(doc)
                   + _decision([("model", clinical["decision_curve"])])
                   + _selective([("model", clinical["selective"])], doc.get("referral"), doc,
                                (clinical.get("selective_brier") or {}).get("same_ranking", ()))
                   + report_summary.selective_brier_table(clinical) + _truth(doc.get("truth"))
                   + (_subgroups([("model", clinical.get("subgroups"))]) if clinical.get("subgroups") else ""))
    return (f"<h1>{_esc(TITLE)}</h1><p class=\"meta\">{meta}</p>" + report_summary.summary_box(doc)
            + design_html.participants(doc.get("population")) + design_html.analysis_numbers(doc.get("population"), doc)
            + design_html.specification(doc) + _section("Model performance", "23a", performance)
            + _heterogeneity([("model", clinical.get("subgroups"))])
            + (_section("Model updating", "24", "<p>Not applicable: a baseline fitted on the spot on this data folder's "
                                                "train split, not an existing model updated.</p>")
               if doc.get("baseline") else _updating(members)) + _further_items(doc) + _footer())


def _paired_clinical_rows(paired: Mapping[str, Any] | None, calibration: bool = True) -> list[list[str]]:
    """Rows of B - A for calibration slope, calibration-in-the-large and net benefit per threshold; a slope
    difference is flagged, without a number, where either side's slope is not estimable (`calibration` False: the
    small-sample rule) or its interval is implausibly wide (small_sample.slope_difference_flag)."""
    if not paired:
        return []
    rows = []
    flag = small_sample.slope_difference_flag(paired["slope"], calibration)
    if flag:
        rows.append(["calibration slope", "", "", "", flag])
    if not calibration:
        rows.append(["calibration-in-the-large", "not estimable", "not estimable", "", "not estimable at this size"])
    cells = ([] if flag else [("calibration slope", paired["slope"])])
    cells += [("calibration-in-the-large", paired["intercept"])] if calibration else []
    cells += [(f"net benefit at {float(t):.0%}", c) for t, c in paired["net_benefit"].items()]
    return rows + [[name, _num(c["a"], 4), _num(c["b"], 4), _fixed(c["difference"], 4, True), _paired_interval(c)]
                   for name, c in cells]


def _card_rows(card: Mapping[str, Any]) -> list[list[str]]:
    """(field, value) rows of one side's model card (evaluate.model_card_beside)."""
    if card.get("kind") == "baseline":
        params = ", ".join(f"{k}={v}" for k, v in (card.get("params") or {}).items())
        return [["name", f"{card.get('estimator')} baseline (scikit-learn)"],
                ["version", "none: fitted on the spot by ehr-eval --baseline, not an export"],
                ["method", "standardised logistic regression" if card.get("estimator") == "logistic"
                 else "histogram gradient boosting"],
                ["features", f"{_num(card.get('num_features'))} bag aggregates (per code: log(1 + events) in the "
                             "admission window and before it; per analyte: window min, max, mean, newest z-score, "
                             "no-value indicator; age, sex, admission type)"],
                ["settings", f"{params}, chosen by {card.get('chosen_by')} among {card.get('settings_tried')} tried "
                             f"(seed {card.get('seed')})"],
                ["training data", f"train split of {card.get('training_data') or 'the data folder'}"],
                ["checksum", f"data manifest sha256 {str(card.get('data_manifest_sha256') or 'not recorded')[:12]}"
                             "; the fitted estimator is not saved"]]
    if card.get("kind") == "export":
        rows = []
        for m in card["members"]:
            rows += [["name", str(m.get("name"))], ["version", str(m.get("version") or "not recorded")],
                     ["method", f"{m.get('method')}, {_num(m.get('num_parameters'))} parameters"],
                     ["training data", f"data manifest sha256 {str(m.get('training_data_sha256') or '?')[:12]}"],
                     ["checksum", f"export sha256 {str(m.get('checksum') or 'not recorded')[:12]}"]]
        return rows
    return [["identity", "not recorded: no metrics.json of ehr-eval beside this predictions file"]]


def _model_cards(doc: Mapping[str, Any]) -> str:
    """Each side's model card (name, version, method, training data, checksum; a baseline's estimator, features and
    how its settings were chosen)."""
    cards = doc.get("cards") or {}
    if not cards:
        return ""
    body = "".join(f"<h3>{side.upper()}</h3>" + _table(["field", "value"], _card_rows(cards[side]), left=2)
                   for side in ("a", "b") if side in cards)
    return _section("Model specification", "22", body)


def _paired_interval(cell: Mapping[str, Any]) -> str:
    """'lower to upper' of a paired difference; a collapsed one (lower = upper) named as such."""
    if cell.get("lower") is not None and cell.get("lower") == cell.get("upper"):
        return NO_INTERVAL
    return f"{_num(cell['lower'], 4)} to {_num(cell['upper'], 4)}"


def _render_comparison(doc: Mapping[str, Any]) -> str:
    clinical = doc["clinical"]
    names = ("A", "B")
    models = {n: clinical[n.lower()] for n in names}
    auc_shown = all((report_summary.shown_auc({"estimate": 0.5}, models[n]) or {}).get("estimable", True)
                    for n in names)
    rows = [[name, _num(r["a"], 4), _num(r["b"], 4), _fixed(r["difference"], 4, True) if r["difference"] is not None
             else "n/a", _paired_interval(r)] if name != "auc_roc" or auc_shown else
            [name, "not estimable", "not estimable", "", f"fewer than {small_sample.MIN_AUC_EVENTS} deaths or "
                                                         "survivors"] for name, r in doc["metrics"].items()]
    rows += _paired_clinical_rows(clinical.get("paired_clinical"),
                                  all(report_summary.calibration_estimable(models[n]) for n in names))
    paired = _table(["Metric", "A", "B", "B - A", "95% interval (paired bootstrap)"], rows)
    absent = clinical.get("absent_scores") or {}
    sel_rows = []
    for score, cells in clinical["selective_difference"].items():
        if score in absent:  # a constant score cannot order cases: no comparison to make
            sel_rows.append([SCORE_LABELS.get(score, score), "all", "absent" if "A" in absent[score] else "",
                             "absent" if "B" in absent[score] else "", "not compared: constant over the cases in "
                             + " and ".join(absent[score])])
            continue
        for key in ("aurc", "augrc", "risk_at_coverage", "coverage_at_risk"):
            c = cells[key]
            sel_rows.append([SCORE_LABELS.get(score, score), key.replace("_", " "), _num(c["a"]), _num(c["b"]),
                             f"{_fixed(c['difference'], 3, True)} ({_num(c['lower'])} to {_num(c['upper'])})"])
    sel_diff = ("<h3>Selective prediction: B - A on the same cases</h3>"
                + _table(["refer by", "number", "A", "B", "B - A (95% CI)"], sel_rows, left=2))
    performance = ("<h3>Paired differences on the same cases</h3>" + paired
                   + _roc([(n, models[n], (doc["metrics"].get("auc_roc") or {}).get(n.lower()) and
                            {"estimate": doc["metrics"]["auc_roc"][n.lower()]}) for n in names])
                   + "".join(f"<h4>{n}</h4>" + report_summary.threshold_section(models[n]) for n in names)
                   + _calibration([(n, models[n]) for n in names])
                   + _decision([(n, models[n]["decision_curve"]) for n in names])
                   + _selective([(n, models[n]["selective"]) for n in names], None) + sel_diff
                   + (_subgroups([(n, models[n].get("subgroups")) for n in names])
                      if any(models[n].get("subgroups") for n in names) else ""))
    named = doc.get("names") or {"a": doc["a"], "b": doc["b"]}
    sides = "<br>".join(f"{side.upper()} = {_esc(doc[side])}" if str(named[side]) == str(doc[side]) else
                        f"{side.upper()} = {_esc(named[side])} ({_esc(doc[side])})" for side in ("a", "b"))
    meta = (f"{sides}<br>{_num(doc['n'])} paired cases, {_num(doc['n_bootstrap'])} bootstrap resamples, seed "
            f"{doc['seed']}")
    return (f"<h1>{_esc(TITLE)}: comparison</h1><p class=\"meta\">{meta}</p>" + report_summary.comparison_summary(doc)
            + design_html.participants(doc.get("population")) + _model_cards(doc)
            + _section("Model performance", "23a", performance)
            + _heterogeneity([(n, models[n].get("subgroups")) for n in names]) + _updating_compared(doc)
            + _further_items_compared(doc) + _footer())


def _settings(doc: Mapping[str, Any], clinical: Mapping[str, Any]) -> str:
    """The evaluation's own settings, as item 18 names them."""
    operating = clinical.get("operating_threshold") or {}
    parts = [f"seed {doc.get('seed', 0)}"]
    if "S" in doc:
        parts += [f"split {doc.get('split', 'test')}", f"S = {doc['S']} samples x K = {doc['K']} members"]
    if doc.get("n_bootstrap"):
        parts.append(f"{doc['n_bootstrap']} bootstrap resamples")
    if operating.get("rule"):
        parts.append(f"--threshold {operating['rule']}")
    return ", ".join(parts)


def _further_items(doc: Mapping[str, Any]) -> str:
    """TRIPOD+AI 10, 14, 16, 17, 18, 27 of a single page (tripod_items)."""
    clinical = doc["clinical"]
    members = (doc.get("model") or {}).get("members") or []
    baseline = doc.get("baseline")
    parameters = ([(f"{baseline['kind']} baseline", baseline.get("num_features"), "candidate feature")] if baseline
                  else [(m.get("name", "model"), m.get("num_parameters"), "parameter") for m in members])
    training = [doc.get("data_manifest_sha256")] if baseline else [m.get("data_manifest_sha256") for m in members]
    return tripod_items.section_html(
        doc, parameters=parameters, subgroups=[("model", clinical.get("subgroups"))],
        absent=report_summary.absent_groups(clinical.get("subgroups")), training_sha=training,
        evaluated_sha=doc.get("data_manifest_sha256"), version=doc.get("software_version"),
        settings=_settings(doc, clinical), checksums=[m.get("checksum") for m in members])


def _further_items_compared(doc: Mapping[str, Any]) -> str:
    """TRIPOD+AI 10, 14, 16, 17, 18, 27 of a comparison page, from both sides' cards."""
    cards = doc.get("cards") or {}
    parameters, training, checksums = [], [], []
    for side in ("a", "b"):
        card = cards.get(side) or {}
        if card.get("kind") == "baseline":
            parameters.append((f"{side.upper()} ({card['estimator']} baseline)", card.get("num_features"),
                               "candidate feature"))
            training.append(card.get("data_manifest_sha256"))
        for m in card.get("members") or []:
            parameters.append((f"{side.upper()} ({m.get('name')})", m.get("num_parameters"), "parameter"))
            training.append(m.get("training_data_sha256"))
            checksums.append(m.get("checksum"))
        if card.get("kind", "unknown") == "unknown":
            training.append(None)
    clinical = doc["clinical"]
    absent = sorted(set(report_summary.absent_groups(clinical["a"].get("subgroups"))))
    return tripod_items.section_html(
        doc, parameters=parameters, subgroups=[(n, clinical[n.lower()].get("subgroups")) for n in "AB"],
        absent=absent, training_sha=training, evaluated_sha=doc.get("data_manifest_sha256"),
        version=doc.get("software_version"), settings=_settings(doc, clinical["a"]), checksums=checksums)


def _footer() -> str:
    return ('<p class="meta">Written by ehr-eval from the metrics.json / comparison.json beside this page; every '
            "number here is in that file.</p>")


def write(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> pathlib.Path:
    """Renders doc (metrics.json or comparison.json contents) to path; returns the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(doc), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- text for the CLI


def format_clinical(clinical: Mapping[str, Any]) -> str:
    """The clinical statistics as a few lines of text (ehr-eval prints them)."""
    cal = report_summary.shown_calibration(clinical)
    lines = [f"calibration-in-the-large {_ci(cal['intercept'], 3, signed=True)}, slope {_ci(cal['slope'])}, "
             f"observed/expected {_num(cal['observed_over_expected'])}"]
    nb = "  ".join(f"{row['threshold']:.0%}: {_ci(row['model'])}" for row in clinical["decision_curve"]["table"])
    lines.append(f"net benefit {nb}")
    sel = clinical["selective"]
    lines.append(f"{'refer by':<22}{'AURC':>8}{'AUGRC':>8}{'err@' + format(sel['target_coverage'], 'g'):>9}"
                 f"{'cov@' + format(sel['target_risk'], 'g'):>9}")
    for score, cells in sel["scores"].items():
        lines.append(f"{score:<22}" + "".join(f"{_num(cells[k]['estimate']):>{w}}" for k, w in
                                              (("aurc", 8), ("augrc", 8), ("risk_at_coverage", 9),
                                               ("coverage_at_risk", 9))))
    sub = clinical.get("subgroups")
    if sub:
        named = sub["gaps"] or []
        lines.append("subgroups served worse: " + ("; ".join(formatting.describe_gap(g) for g in named)
                                                   if named else "none beyond the adjusted threshold"))
    return "\n".join(lines)


def format_selective_difference(diff: Mapping[str, Any]) -> str:
    """B - A of the selective numbers per referral score, as text."""
    lines = [f"{'selective, refer by':<22}{'AURC B - A':>24}{'AUGRC B - A':>24}"]
    for score, cells in diff.items():
        lines.append(f"{score:<22}" + "".join(
            f"{_fixed(cells[k]['difference'], 4, True)} [{_num(cells[k]['lower'], 4)}, {_num(cells[k]['upper'], 4)}]".rjust(24)
            for k in ("aurc", "augrc")))
    return "\n".join(lines)
