"""The small-sample rule and the closed-form intervals, each against an independent computation.

Wilson against statsmodels, the confusion counts against scikit-learn, the Hanley-McNeil standard
error against a bootstrap of scikit-learn's AUROC, the referral choice against a naive sort.
"""
from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.metrics import confusion_matrix, roc_auc_score
from statsmodels.stats.proportion import proportion_confint

from model.evaluation import dataset_identity, evaluate
from model.evaluation.report import design_html, html_cells, plots, report_html, report_summary
from model.evaluation.statistics import referral_choice, small_sample
from model.export_layout import json_ready


@pytest.mark.parametrize("k,n", [(0, 4), (4, 4), (1, 6), (3, 11), (57, 386), (0, 1)])
def test_wilson_matches_statsmodels_and_never_has_zero_width(k, n):
    lower, upper = small_sample.wilson_interval(k, n)
    ref = proportion_confint(k, n, alpha=0.05, method="wilson")
    assert lower == pytest.approx(ref[0], abs=1e-12) and upper == pytest.approx(ref[1], abs=1e-12)
    assert upper - lower > 0.05


def test_threshold_metrics_count_like_sklearn():
    rng = np.random.default_rng(0)
    p = rng.uniform(size=300)
    y = (rng.uniform(size=300) < p).astype(int)
    for t in (0.05, 0.1, 0.3, 0.5):
        out = small_sample.threshold_metrics(p, y, t)
        tn, fp, fn, tp = confusion_matrix(y, (p >= t).astype(int), labels=[0, 1]).ravel()
        assert (out["tp"], out["fp"], out["fn"], out["tn"]) == (tp, fp, fn, tn)
        assert out["sensitivity"]["estimate"] == pytest.approx(tp / (tp + fn))
        assert out["ppv"]["estimate"] == pytest.approx(tp / (tp + fp))
        assert out["npv"]["lower"] == pytest.approx(proportion_confint(tn, tn + fn, method="wilson")[0])


def test_a_ratio_with_an_empty_denominator_is_named_not_zero():
    out = small_sample.threshold_metrics([0.1, 0.2, 0.3], [0, 1, 0], 0.9)
    assert out["ppv"]["estimate"] is None and "no cases" in out["ppv"]["reason"]
    assert "no cases" in html_cells.ci(out["ppv"])


def test_hanley_mcneil_se_is_close_to_the_bootstrap_sd():
    rng = np.random.default_rng(1)
    y = np.r_[np.ones(80), np.zeros(320)].astype(int)
    score = rng.normal(size=400) + 1.0 * y
    auc = roc_auc_score(y, score)
    boot = []
    for _ in range(400):
        i = rng.integers(0, 400, 400)
        if 0 < y[i].sum() < 400:
            boot.append(roc_auc_score(y[i], score[i]))
    se = small_sample.hanley_mcneil_se(auc, 80, 320)
    assert se == pytest.approx(np.std(boot), rel=0.25)


def test_auc_interval_is_logit_scale_and_refuses_the_degenerate_cases():
    cell = small_sample.auc_interval(0.8, 20, 60)
    se = small_sample.hanley_mcneil_se(0.8, 20, 60) / (0.8 * 0.2)
    expit = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert cell["lower"] == pytest.approx(expit(math.log(4) - norm.ppf(0.975) * se))
    assert cell["lower"] < 0.8 < cell["upper"] < 1.0
    assert small_sample.auc_interval(1.0, 6, 10)["estimable"] is False
    assert small_sample.auc_interval(0.7, 4, 10)["estimable"] is False
    assert "not estimable" not in html_cells.ci(cell) and "separated" in html_cells.ci(
        small_sample.auc_interval(1.0, 6, 10))


def test_the_rule_at_the_demo_size_and_at_a_large_size():
    demo = small_sample.estimability(4, 11)
    assert not demo["calibration_estimable"] and not demo["precise"] and "not estimable" in demo["note"]
    mid = small_sample.estimability(57, 386)
    assert mid["calibration_estimable"] and not mid["precise"] and "imprecise" in mid["note"]
    assert small_sample.estimability(150, 1000)["note"] == ""


def test_detectable_gap_is_the_closed_form_power_formula():
    gap = small_sample.detectable_auc_gap(0.8, 10, 40, 50, 300, z_test=1.96)
    se = math.hypot(small_sample.hanley_mcneil_se(0.8, 10, 40), small_sample.hanley_mcneil_se(0.8, 50, 300))
    assert gap == pytest.approx((1.96 + norm.ppf(0.8)) * se)
    assert small_sample.detectable_auc_gap(0.8, 3, 40, 50, 300, z_test=1.96) is None


def test_zero_width_interval_is_never_printed():
    assert html_cells.ci({"estimate": 1.0, "lower": 1.0, "upper": 1.0}) == f"1.000 ({html_cells.NO_INTERVAL})"
    assert html_cells.interval_text({"estimate": 1.0, "lower": 1.0, "upper": 1.0})[1] == html_cells.NO_INTERVAL


def _naive_brier_aurc(p, y, score):
    order = np.argsort(score, kind="stable")
    loss = ((p - y) ** 2)[order]
    return float(np.mean(np.cumsum(loss) / np.arange(1, len(loss) + 1)))


def test_referral_choice_picks_the_lowest_brier_aurc_and_skips_a_constant_measure():
    rng = np.random.default_rng(2)
    probs = rng.beta(1, 6, size=(200, 1)) * np.ones((1, 5))  # one deterministic model: MI is 0 everywhere
    y = (rng.uniform(size=200) < probs[:, 0]).astype(int)
    chosen = referral_choice.choose(probs, y)
    assert "mutual_information" in chosen["absent"] and "mutual_information" not in chosen["aurc"]
    p = probs.mean(axis=1)
    entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    assert chosen["aurc"]["predictive_entropy"] == pytest.approx(_naive_brier_aurc(p, y, entropy))
    assert chosen["measure"] == min(chosen["aurc"], key=chosen["aurc"].get)
    sel = referral_choice.brier_selective(p, y, {"mutual_information": np.zeros(200), "risk": p}, n_bootstrap=50)
    assert sel["absent"] == ["mutual_information"] and sel["best"] == "risk"
    assert sel["scores"]["risk"]["aurc"]["estimate"] == pytest.approx(_naive_brier_aurc(p, y, p))


def test_dataset_identity_names_synthetic_demo_and_shifted_dates(tmp_path):
    (tmp_path / dataset_identity.SYNTH_MANIFEST).write_text('{"generator": "ehr_pipeline.synth", "version": "1", '
                                                            '"patients": 300, "seed": 3}')
    manifest = {"input": {"mimic_dir": str(tmp_path)}}
    release = dataset_identity.read_release_manifest(manifest)
    synth = dataset_identity.dataset_identity(manifest, release)
    assert synth["synthetic"] and "300 patients" in synth["name"] and "generated" in synth["dates"]
    demo = dataset_identity.dataset_identity({"input": {"mimic_dir": "data/mimic-iii-demo"}}, None)
    assert not demo["synthetic"] and "Demo" in demo["name"] and "shifted" in demo["dates"]
    assert "internal validation" in demo["design"] and "imputation" in demo["missing_data"]
    assert "names no input" in dataset_identity.dataset_identity({}, None)["name"]


def test_a_demo_sized_page_says_its_size_on_every_headline_and_prints_no_zero_width_interval():
    """11 cases, 4 deaths, subgroups of 1-6 cases (the MIMIC-III demo's test split): the page renders it honestly."""
    rng = np.random.default_rng(11)
    y = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0])
    probs = np.clip(0.2 + 0.5 * y[:, None] + rng.normal(0, 0.05, (11, 6)), 0.01, 0.99)
    attributes = {"gender": np.array(list("MFMFMFMFMFM"), dtype=object), "age_years": rng.uniform(20, 90, 11),
                  "admission_type": np.array(["EMERGENCY"] * 10 + ["ELECTIVE"], dtype=object),
                  "ethnicity": np.array(["WHITE"] * 11, dtype=object), "insurance": np.array(["Medicare"] * 11,
                                                                                            dtype=object)}
    report = evaluate.evaluate_predictions(probs, y, 2, 3, threshold=0.01, measure="predictive_entropy", rate=0.1,
                                           n_bootstrap=60)
    evaluate.add_clinical(report, probs, y, measure="predictive_entropy", threshold=0.01, attributes=attributes,
                          truth=None, n_bootstrap=60, seed=0, num_bins=15, target_coverage=0.8, target_risk=0.05)
    report.update(n=11, prevalence=4 / 11, S=3, K=2)
    page = report_html.render(json.loads(json.dumps(json_ready(report))))
    assert not re.search(r"(-?\d+\.\d+) \((?:95% CI )?\1 to \1\)", page)
    cards = re.findall(r'<div class="card[^"]*">(.*?)</div></div>', page)
    headline = [c for c in cards if "Referred" not in c]
    assert len(headline) >= 6 and all('class="ss"' in c for c in headline)
    assert page.count('class="card grey"') == 3 and "not estimable at this size" in page
    # 4 deaths: the AUROC is under the subgroups' rule too, so no AUROC number on the page or in the ROC legend.
    auc_card = [re.sub("<[^>]+>", " ", c) for c in cards if "AUC-ROC" in c]
    assert len(auc_card) == 1 and "not estimable" in auc_card[0] and not re.search(r"\d\.\d", auc_card[0])
    assert "AUC-ROC not estimable (fewer than 5 deaths or survivors)" in html.unescape(page)
    assert "AUC-ROC (discrimination)</td><td>not estimable (fewer than 5 deaths or survivors)" in page
    # No signed zero anywhere, and the command line's text withholds the slope as the page does.
    assert not re.search(r"[-+]0\.0+(?![0-9])", re.sub(r'src="data:[^"]*"', "", page))
    text = report_html.format_clinical(report["clinical"])
    assert "slope not estimable" in text and html_cells.ci(report["clinical"]["calibration"]["slope"]) not in text
    # Calibration is not estimable here: its fitted numbers appear nowhere, nor the LOWESS curve.
    clinical = report["clinical"]
    for key, signed in (("slope", False), ("intercept", True)):
        cell = clinical["calibration"][key]
        for digits in (2, 3):
            assert html_cells.ci(cell, digits, signed) not in page
    reason = report_summary.shown_calibration(clinical)["slope"]["reason"]
    calibration_cards = [re.sub("<[^>]+>", "", c) for c in cards if "Calibration" in c]
    assert len(calibration_cards) == 2
    assert all("not estimable" in c and not re.search(r"\d", re.sub(r"\(ideal \d\)", "", c.replace(reason, "")))
               for c in calibration_cards)
    shown = report_summary.shown_calibration(clinical)
    legend = [t.get_text() for t in plots.calibration_figure([("model", shown)]).axes[0].get_legend().get_texts()]
    assert not any("LOWESS" in t or "slope" in t for t in legend) and any("deciles" in t for t in legend)
    # Subgroups of 1-6 cases: no metric but the death rate, and no forest plot.
    for groups in clinical["subgroups"]["attributes"].values():
        for row in groups.values():
            for key in ("auc_roc", "brier", "observed_minus_expected", "mean_p"):
                assert small_sample.subgroup_estimate(row, key, 20)["estimate"] is None
            assert small_sample.subgroup_estimate(row, "observed_rate", 20)["estimate"] == row["events"] / row["n"]
    assert "no forest plot" in page and "subgroup forest plot" not in page
    assert "No subgroup is served worse" not in page and "not testable at this size" in page
    assert "0 comparisons" not in page


@pytest.mark.parametrize("lower, upper, most, decimals", [(0.357, 1.0, 3, 2), (0.70, 0.82, 3, 3), (0.0, 0.004, 4, 4),
                                                          (-100.0, 300.0, 3, 0), (None, None, 3, 3), (0.5, 0.5, 3, 3)])
def test_supported_decimals_follow_the_standard_error(lower, upper, most, decimals):
    assert small_sample.supported_decimals(lower, upper, most) == decimals
    if lower is not None and upper > lower:  # the SE's first significant digit is the last one printed, or finer
        se = (upper - lower) / (2 * 1.959964)
        assert decimals in (0, most) or 10 ** (1 - decimals) <= se < 10 ** (2 - decimals)


def test_a_not_estimable_cell_prints_no_number():
    cell = {"estimate": 0.0, "lower": None, "upper": None, "estimable": False, "reason": "fewer than 5 deaths"}
    assert html_cells.ci(cell) == "not estimable (fewer than 5 deaths)"
    assert html_cells.interval_text(cell) == ("not estimable", "fewer than 5 deaths")
    assert html_cells.ci({"estimate": 0.75, "lower": 0.357, "upper": 1.0}) == "0.75 (0.36 to 1.00)"


def test_same_rankings_names_entropy_as_the_risk_ranking_when_every_p_is_below_a_half():
    rng = np.random.default_rng(8)
    p = rng.uniform(0.01, 0.45, 50)
    entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    other = rng.random(50)
    assert referral_choice.same_rankings({"predictive_entropy": entropy, "risk": p, "mutual_information": other}) \
        == [["predictive_entropy", "risk"]]
    q = np.append(p, 0.9)  # one risk above 0.5: entropy no longer follows p
    e = -(q * np.log(q) + (1 - q) * np.log(1 - q))
    assert referral_choice.same_rankings({"predictive_entropy": e, "risk": q}) == []


def test_referral_states_every_kept_case_metric_and_which_way_it_moved():
    doc = {"overall": {"auc_roc": 0.75, "auc_pr": 0.6, "brier": 0.260, "nll": 0.7, "ece": 0.2, "accuracy": 0.64},
           "referral": {"measure": "predictive_entropy", "referred_fraction": 0.09,
                        "kept": {"auc_roc": 0.875, "auc_pr": 0.6, "brier": 0.273, "nll": 0.65, "ece": 0.25,
                                 "accuracy": float("nan")}}}
    changes = {name: verdict for name, _, _, verdict in report_summary.kept_changes(doc)}
    assert changes == {"AUC-ROC": "better", "AUC-PR": "unchanged", "Brier score": "worse", "NLL": "better",
                       "ECE": "worse", "accuracy at p > 0.5": "undefined"}
    text = report_summary.referral_text(doc)
    assert "Brier score 0.260 to 0.273 (worse)" in text and "AUC-ROC 0.750 to 0.875 (better)" in text


def test_inputs_are_listed_from_the_data_and_absent_groups_are_named():
    population = {"splits": {"train": {"n": 40, "missing_source": {"lab": 0.1, "chart": 1.0, "diagnosis": 0.5}},
                             "test": {"n": 11, "missing_source": {"lab": 0.0, "chart": 1.0, "diagnosis": 1.0}}}}
    text = design_html.input_sources(population)
    assert "labs" in text and "earlier admissions' diagnoses" in text
    assert text.endswith("this data had no charted observations (vital signs) events at all")
    assert "vital signs" not in text.split(";")[0]
    sub = {"attributes": {"ethnicity": {"WHITE": {}, "UNKNOWN": {}}}, "gaps": [], "power": {"groups_tested": 0}}
    assert report_summary.absent_groups(sub) == ["BLACK", "HISPANIC", "ASIAN"]
    assert "no BLACK, HISPANIC, ASIAN patients in the evaluated cases" in report_summary.subgroup_verdict(sub)


def test_a_number_that_rounds_to_zero_carries_no_sign():
    assert [html_cells.fixed(v, 3, signed=True) for v in (-0.0004, 0.0004, -0.0, -0.02, 0.5)] == \
        ["0.000", "0.000", "0.000", "-0.020", "+0.500"]
    assert html_cells.ci({"estimate": -0.0001, "lower": -0.05, "upper": 0.04}, 3, signed=True) == \
        "0.000 (-0.050 to +0.040)"


def test_the_headline_auroc_follows_the_subgroups_rule():
    cell = {"estimate": 0.75, "lower": 0.36, "upper": 1.0}
    assert small_sample.headline_auc(cell, 4, 11)["estimable"] is False
    assert small_sample.headline_auc(cell, 5, 11) is cell  # 5 deaths and 6 survivors: shown
    assert small_sample.headline_auc(cell, 7, 11)["estimable"] is False  # 4 survivors


@pytest.mark.parametrize("lower, upper, estimable, flagged", [(-0.2, 0.3, True, None), (-5.47, 11.58, True, "wide"),
                                                             (-0.2, 0.3, False, "not estimable"),
                                                             (None, None, True, "no interval")])
def test_a_calibration_slope_difference_is_flagged_when_unreadable(lower, upper, estimable, flagged):
    flag = small_sample.slope_difference_flag({"difference": 0.1, "lower": lower, "upper": upper}, estimable)
    assert flag is None if flagged is None else (flagged in flag or "interpretable" in flag and flagged == "wide")
