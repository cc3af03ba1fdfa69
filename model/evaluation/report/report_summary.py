"""The report's first screen and its small-sample statements (model.evaluation.report.report_html renders the rest).

Everything here reads numbers already in the metrics.json (``clinical.small_sample``,
``clinical.selective_brier``, ``clinical.subgroups.power``, ``population.dataset``) and says what a
governance board signs: which data, which design, how many cases and deaths, and for each headline
number whether this evaluation is large enough to estimate it (model.evaluation.statistics.small_sample holds the rule).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from model.evaluation.report.html_cells import card, ci, esc, fixed, interval_text, num, pct, table
from model.evaluation.statistics.clinical_stats import ETHNICITY_GROUPS
from model.evaluation.statistics.small_sample import NOT_ESTIMABLE, headline_auc

SCORE_NAMES = {"predictive_entropy": "predictive entropy", "mutual_information": "mutual information",
               "predictive_std": "std of sampled p", "risk": "highest p first"}
UNCERTAINTY = ("predictive_entropy", "mutual_information", "predictive_std")


def _events(doc: Mapping[str, Any]) -> int:
    return int(round(doc["n"] * doc["prevalence"]))


def _rule(clinical: Mapping[str, Any]) -> Mapping[str, Any]:
    return (clinical.get("small_sample") or {}).get("estimability") or {}


def shown_auc(cell: Mapping[str, Any] | None, clinical: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The AUROC cell the page may show for these cases (small_sample.headline_auc: the subgroups' rule)."""
    rule = _rule(clinical)
    return headline_auc(cell, rule["events"], rule["n"]) if rule else cell


def calibration_text(clinical: Mapping[str, Any]) -> str:
    """Slope and calibration-in-the-large as a sentence, or why they are not estimable here."""
    rule, cal = _rule(clinical), clinical["calibration"]
    if rule and not rule["calibration_estimable"]:
        return (f"not estimable at this size ({rule['smaller_class']} deaths or survivors; the rule needs "
                f"{rule['min_calibration_events']})")
    return f"slope {ci(cal['slope'], 2)}, calibration-in-the-large {ci(cal['intercept'], 2, signed=True)}"


def calibration_warning(clinical: Mapping[str, Any]) -> str:
    """A note above the calibration table when the small-sample rule says it is not estimable here."""
    rule = _rule(clinical)
    if not rule or rule["calibration_estimable"]:
        return ""
    return (f'<p class="note warn">Calibration slope, calibration-in-the-large and the smoothed calibration curve are '
            f"{NOT_ESTIMABLE} ({rule['smaller_class']} deaths or survivors, fewer than the "
            f"{rule['min_calibration_events']} a logistic recalibration needs): none is shown. The observed rate, the "
            "mean predicted risk and the deciles of p with their Wilson intervals remain.</p>")


def calibration_estimable(clinical: Mapping[str, Any]) -> bool:
    """Whether the small-sample rule lets this page show calibration slope, calibration-in-the-large and LOWESS."""
    rule = _rule(clinical)
    return not rule or rule["calibration_estimable"]


def shown_calibration(clinical: Mapping[str, Any]) -> Mapping[str, Any]:
    """The calibration cells the page may show: slope, calibration-in-the-large and the LOWESS curve replaced by
    not-estimable cells where the small-sample rule says so."""
    rule, cal = _rule(clinical), clinical["calibration"]
    if calibration_estimable(clinical):
        return cal
    reason = (f"{rule['smaller_class']} deaths or survivors, fewer than the {rule['min_calibration_events']} a "
              "logistic recalibration needs")
    gone = {"estimate": None, "lower": None, "upper": None, "estimable": False, "reason": reason}
    return {**cal, "slope": gone, "intercept": gone, "smoothed": None}


def uncertainty_verdict(clinical: Mapping[str, Any]) -> str:
    """Which referral measure keeps the lowest Brier score, whether it beats highest-p-first, which are absent."""
    sb = clinical.get("selective_brier")
    if not sb or not sb.get("scores"):
        return "not measured in this file"
    cells = sb["scores"]
    ranked = sorted((s for s in cells if s in UNCERTAINTY), key=lambda s: cells[s]["aurc"]["estimate"])
    absent = [SCORE_NAMES.get(s, s) for s in sb.get("absent", [])]
    if not ranked:
        return "no uncertainty measure varies over the cases: referral can only follow p"
    best = ranked[0]
    text = (f"referral by {SCORE_NAMES[best]} keeps the lowest Brier score (AURC, the kept cases' mean Brier score "
            f"over all coverages: {ci(cells[best]['aurc'], 4)})"
            + "".join(f"; AURC referring by {SCORE_NAMES[s]} {cells[s]['aurc']['estimate']:.4f}" for s in ranked[1:]))
    risk = cells.get("risk")
    if risk:
        mine, theirs = cells[best]["aurc"], risk["aurc"]
        overlap = theirs["lower"] is None or mine["lower"] is None or (
            mine["upper"] >= theirs["lower"] and theirs["upper"] >= mine["lower"])
        text += (f"; AURC referring highest p first {risk['aurc']['estimate']:.4f}"
                 + (": the intervals overlap, so at this size the uncertainty is not shown to refer better than "
                    "the risk itself" if overlap else ""))
    same = [f"{SCORE_NAMES.get(a, a)} orders the cases as {SCORE_NAMES.get(b, b)} does (the same referrals, one "
            "curve under the other)" for a, b in sb.get("same_ranking", [])]
    text += "".join(f"; {x}" for x in same)
    return text + (f"; absent (constant over the cases): {', '.join(absent)}" if absent else "")


KEPT_METRICS = {"auc_roc": ("AUC-ROC", +1), "auc_pr": ("AUC-PR", +1), "brier": ("Brier score", -1),
                "nll": ("NLL", -1), "ece": ("ECE", -1), "accuracy": ("accuracy at p > 0.5", +1)}


def kept_changes(doc: Mapping[str, Any]) -> list[tuple[str, float | None, float | None, str]]:
    """(metric, all cases, kept cases, 'better' / 'worse' / 'unchanged') for every metric of the referral rule's
    kept cases (doc["referral"]["kept"] against doc["overall"])."""
    kept, overall = (doc.get("referral") or {}).get("kept") or {}, doc.get("overall") or {}
    out = []
    for key, (name, sign) in KEPT_METRICS.items():
        a, b = overall.get(key), kept.get(key)
        auc = shown_auc({"estimate": a}, doc["clinical"]) if key == "auc_roc" and "clinical" in doc else None
        if auc is not None and auc.get("estimable") is False:  # the kept cases are fewer still
            out.append((name, None, None, f"not estimable ({auc['reason']})"))
            continue
        if a is None or b is None or a != a or b != b:  # NaN: undefined on these cases
            out.append((name, a, b, "undefined"))
            continue
        out.append((name, a, b, "unchanged" if a == b else "better" if sign * (b - a) > 0 else "worse"))
    return out


def referral_text(doc: Mapping[str, Any]) -> str:
    """What the referral rule does here: the share referred, and every kept-case metric against all cases."""
    r = doc.get("referral")
    if not r or not r.get("kept"):
        return "no referral rule in this file"
    changes = "; ".join(f"{name} {a:.3f} to {b:.3f} ({verdict})" for name, a, b, verdict in kept_changes(doc)
                        if verdict != "undefined" and a is not None)
    return (f"{r['referred_fraction']:.0%} referred by {SCORE_NAMES.get(r['measure'], r['measure'])} (the rule chosen "
            f"on validation); " + (f"all cases to kept cases: {changes}" if changes else
                                   "no metric is defined on the kept cases"))


def absent_groups(sub: Mapping[str, Any] | None) -> list[str]:
    """The report's ethnicity groups with no case in the evaluated split: nothing can be said about them."""
    present = set(((sub or {}).get("attributes") or {}).get("ethnicity") or {})
    return [g for g, _ in ETHNICITY_GROUPS if g not in present] if present else []


def subgroup_verdict(sub: Mapping[str, Any] | None) -> str:
    """Named gaps, or the power the absence of one has (smallest AUROC gap detectable at 80 %); absent groups."""
    absent = absent_groups(sub)
    return _subgroup_verdict(sub) + (f"; no {', '.join(absent)} patients in the evaluated cases, so nothing is known "
                                     "of the model's performance for them" if absent else "")


def _subgroup_verdict(sub: Mapping[str, Any] | None) -> str:
    if not sub:
        return "no subgroup attributes in this file"
    if sub.get("gaps"):
        return "served worse: " + "; ".join(f"{g['attribute'].replace('_', ' ')} = {g['group']}" for g in sub["gaps"])
    power = sub.get("power") or {}
    if not power.get("groups_tested"):
        return ("not testable at this size: no group has the 5 deaths and 5 survivors (in it and in the rest) an "
                "AUROC comparison needs")
    return (f"no gap named, with limited power: at {power['power']:.0%} power the Bonferroni-adjusted test detects "
            f"an AUROC gap of {power['smallest_detectable_auc_gap']:.3f} in the best-powered group and only "
            f"{power['largest_detectable_auc_gap']:.3f} in the weakest of the {power['groups_tested']} groups tested")


def limitations(doc: Mapping[str, Any]) -> list[str]:
    """What this evaluation cannot show, from its own numbers."""
    out = []
    rule = _rule(doc["clinical"])
    if rule.get("note"):
        out.append(rule["note"])
    dataset = (doc.get("population") or {}).get("dataset") or {}
    out.append("internal validation only (random split of one source): no temporal, geographic or external test")
    if dataset.get("synthetic"):
        out.append("synthetic data: performance here says how the pipeline behaves, not how it would do on patients")
    if dataset.get("dates"):
        out.append(f"dates {dataset['dates']}")
    return out


def operating_text(clinical: Mapping[str, Any]) -> str:
    """The operating threshold and why it is the one (small_sample.choose_threshold's record)."""
    op = clinical.get("operating_threshold")
    if not op:
        return "0.5 (no operating threshold recorded in this file)"
    return f"{op['threshold']:.3g}: {op['rationale']}"


def at_threshold_text(clinical: Mapping[str, Any], n: int) -> str:
    """Who the operating threshold flags: predicted positives, sensitivity and specificity with Wilson intervals."""
    row = clinical["small_sample"]["thresholds"][0]
    positives = row["tp"] + row["fp"]
    sens, spec = row["sensitivity"], row["specificity"]
    return (f"{positives} of {n} flagged (risk at least {row['threshold']:.3g}); sensitivity "
            f"{row['tp']}/{row['tp'] + row['fn']} = {ci(sens, 2)}; specificity {row['tn']}/{row['tn'] + row['fp']} "
            f"= {ci(spec, 2)}")


def observed_expected_text(clinical: Mapping[str, Any]) -> str:
    """Mean predicted risk against the observed rate, and O/E with its interval."""
    cal, oe = clinical["calibration"], (clinical.get("decision") or {}).get("observed_expected")
    text = f"mean predicted risk {cal['expected']:.3f} against {cal['observed']:.3f} observed"
    if oe:
        text += f"; observed / expected deaths {oe['observed']} / {oe['expected']:.1f} = {ci(oe, 2)}"
    return text


def _percent_range(pair: Sequence[float]) -> str:
    return f"{pair[0]:.0%}" if pair[0] == pair[1] else f"{pair[0]:.0%} to {pair[1]:.0%}"


def utility_text(clinical: Mapping[str, Any]) -> str:
    """Where the model's net benefit beats both treat-all and treat-none, and the gain at each tabulated threshold."""
    decision = clinical.get("decision") or {}
    span = decision.get("curve_range")
    runs = decision.get("useful_ranges")
    text = ""
    if runs is not None and span:
        where = (", ".join(_percent_range(r) for r in runs) if runs else "no threshold")
        text = (f"above both treat-all and treat-none at {where} (of the {_percent_range(span)} the decision curve "
                "covers; point estimates); ")
    gains = "; ".join(f"{row['threshold']:.0%} {ci(row['gain_over_default'], signed=True)}"
                      for row in clinical["decision_curve"]["table"])
    return text + f"gain in net benefit over the better of treat all / none at {gains}"


def baseline_text(doc: Mapping[str, Any]) -> str:
    """Which baseline stands beside this page's model."""
    if doc.get("baseline"):
        return f"this page is the {doc['baseline']['kind']} baseline itself"
    return ("none in this file: ehr-eval --baseline logistic, then --compare of its predictions.csv with this one, "
            "sets a baseline beside the model")


def summary_box(doc: Mapping[str, Any]) -> str:
    """The first screen: dataset, design, n and events, the decision facts, verdicts, limitations."""
    clinical = doc["clinical"]
    dataset = (doc.get("population") or {}).get("dataset") or {}
    rows = [("Dataset", dataset.get("name", "not named in this file (no data folder given)")),
            ("Design", dataset.get("design", "not recorded")),
            ("Cases", f"{num(doc['n'])} on the {doc.get('split', 'test')} split, {num(_events(doc))} deaths"),
            ("Operating threshold", operating_text(clinical)),
            ("At that threshold", at_threshold_text(clinical, doc["n"])),
            ("Discrimination", f"AUC-ROC {ci(shown_auc((doc.get('ci') or {}).get('auc_roc'), clinical))}"),
            ("Calibration", observed_expected_text(clinical) + "; " + calibration_text(clinical)),
            ("Net benefit", utility_text(clinical)),
            ("Baseline", baseline_text(doc)),
            ("Uncertainty", uncertainty_verdict(clinical)),
            ("Referral", referral_text(doc)),
            ("Subgroups", subgroup_verdict(clinical.get("subgroups")))]
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
    limits = "".join(f"<li>{esc(x)}</li>" for x in limitations(doc))
    return (f'<div class="summary" id="summary"><h2>Summary</h2><dl>{items}</dl>'
            f"<b>Limitations of this evaluation</b><ul>{limits}</ul></div>")


def comparison_summary(doc: Mapping[str, Any]) -> str:
    """The comparison page's first screen: for A and B the same decision facts as a single page, and the paired
    Brier score difference."""
    n = doc["n"]
    rows = [("Cases", f"{num(n)} paired cases, the same for A and B")]
    for side in ("a", "b"):
        c, name = doc["clinical"][side], side.upper()
        rows += [(f"{name}: operating threshold", operating_text(c)),
                 (f"{name}: at that threshold", at_threshold_text(c, n)),
                 (f"{name}: calibration", observed_expected_text(c) + "; " + calibration_text(c)),
                 (f"{name}: net benefit", utility_text(c))]
    brier = (doc.get("metrics") or {}).get("brier")
    if brier and None not in (brier.get("a"), brier.get("b"), brier.get("lower"), brier.get("upper")):
        better = "B" if brier["b"] < brier["a"] else "A"
        rows.append(("Brier score", f"A {brier['a']:.3f}, B {brier['b']:.3f}: {better} lower; B - A "
                                    f"{fixed(brier['difference'], 3, True)} ({fixed(brier['lower'], 3, True)} to "
                                    f"{fixed(brier['upper'], 3, True)}, "
                                    "paired bootstrap)"))
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
    return f'<div class="summary" id="summary"><h2>Summary</h2><dl>{items}</dl></div>'


def key_cards(doc: Mapping[str, Any], clinical: Mapping[str, Any]) -> str:
    """The headline cards, each with its small-sample note; calibration greyed where not estimable."""
    rule = _rule(clinical)
    note = rule.get("card_note", "") if rule else ""
    auc = shown_auc((doc.get("ci") or {}).get("auc_roc"), clinical)
    cards = [card("Cases (deaths)", f"{num(doc['n'])} ({num(_events(doc))})", "", note),
             card("AUC-ROC", *interval_text(auc), note, grey=auc is not None and auc.get("estimable") is False)]
    shown = shown_calibration(clinical)
    for key, cell, signed in (("Calibration slope (ideal 1)", shown["slope"], False),
                              ("Calibration-in-the-large (ideal 0)", shown["intercept"], True)):
        if cell.get("estimable", True):
            cards.append(card(key, *interval_text(cell, 2, signed=signed), note))
        else:  # the reason where the number would be, greyed
            cards.append(card(key, "not estimable", "", cell["reason"], grey=True))
    cards.append(card("Brier score", *interval_text((doc.get("ci") or {}).get("brier")), note))
    table_rows = {row["threshold"]: row for row in clinical["decision_curve"]["table"]}
    if 0.1 in table_rows:
        cards.append(card("Net benefit at 10% threshold", *interval_text(table_rows[0.1]["model"]), note))
    if doc.get("referral"):
        r = doc["referral"]
        cards.append(card("Referred to a clinician", pct(r["referred_fraction"]),
                          f"by {r['measure'].replace('_', ' ')}"))
    return '<div class="cards">' + "".join(cards) + "</div>"


def threshold_section(clinical: Mapping[str, Any]) -> str:
    """Sensitivity, specificity, PPV, NPV with Wilson intervals at the decision threshold and the curve's thresholds."""
    ss = clinical.get("small_sample")
    if not ss:
        return ""
    rows = [[f"{t['threshold']:.0%}", num(t["tp"] + t["fp"]), ci(t["sensitivity"]), ci(t["specificity"]),
             ci(t["ppv"]), ci(t["npv"])] for t in ss["thresholds"]]
    note = ('<p class="note">Positive: predicted risk at least the threshold. The first row is the operating threshold '
            "(see the summary for why it is the one); the others are the thresholds the decision curve tabulates, where a "
            "clinician would act. Wilson score 95% intervals, which keep their width at 0% and 100%; a ratio with "
            f"no cases in its denominator is n/a. No-information rate (always predicting the commoner outcome): "
            f"{ss['no_information_rate']:.3f}.</p>")
    return ("<h3>Sensitivity, specificity and predictive values at clinical thresholds</h3>"
            + table(["threshold", "predicted positive", "sensitivity", "specificity", "PPV", "NPV"], rows) + note)


def selective_brier_table(clinical: Mapping[str, Any]) -> str:
    """The decision-aligned referral numbers: Brier score of the kept cases per measure."""
    sb = clinical.get("selective_brier")
    if not sb:
        return ""
    rows = [[SCORE_NAMES.get(s, s), ci(c["aurc"], 4), ci(c["risk_at_coverage"], 4), ci(c["full_coverage_risk"], 4)]
            for s, c in sb["scores"].items()]
    rows += [[SCORE_NAMES.get(s, s), "absent: constant over the cases", "", ""] for s in sb.get("absent", [])]
    cov = sb["target_coverage"]
    return ("<h4>Referral judged by the Brier score of the kept cases</h4>"
            + table(["refer by", "AURC (mean kept Brier)", f"Brier at {cov:.0%} coverage", "Brier, no referral"], rows)
            + f'<p class="note">Verdict: {esc(uncertainty_verdict(clinical))}.</p>')


def dataset_paragraph(population: Mapping[str, Any]) -> str:
    """The data's name, design, date handling and missing-data handling, for the participants section."""
    d = population.get("dataset")
    if not d:
        return ""
    return (f"<p><b>Data.</b> {esc(d['name'])}. <b>Design.</b> {esc(d['design'])}. <b>Dates.</b> {esc(d['dates'])}. "
            f"<b>Missing data.</b> {esc(d['missing_data'])}.</p>")


def power_note(sub: Mapping[str, Any]) -> str:
    """The heterogeneity verdict's power as a note."""
    verdict = subgroup_verdict(sub)
    return f'<p class="note">{esc(verdict[0].upper() + verdict[1:])}.</p>'

