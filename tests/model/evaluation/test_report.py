"""report.html: ehr-eval's one page per evaluation, opened in a real headless Chromium.

The page renders metrics.json / comparison.json and computes nothing, so the tests read numbers
from the JSON and find them on the page; the browser checks that every figure decodes and draws.
"""
from __future__ import annotations

import csv
import html
import json
import re

import numpy as np
import pytest
from sklearn.metrics import roc_curve

from model.cli import ehr_eval
from model.evaluation import evaluate
from model.evaluation.report import html_cells, plots, report_html
from model.evaluation.statistics import clinical_stats
from tests.support.browser import render_check
from tests.support.ehr_testdata import read_json

TRIPOD_ORDER = ("20a-c", "21", "22", "23a", "23b", "24")
# "0.500 (0.500 to 0.500)": an interval of zero width, which the page must never print.
ZERO_WIDTH = re.compile(r"(-?\d+\.\d+) \((?:95% CI )?\1 to \1\)")


def _no_network(page: str) -> None:
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page), "the page must not fetch anything"


@pytest.fixture(scope="module")
def model_report(rank1_test_evaluation):
    """The session's `ehr-eval` of the trained rank-1 run (its truth, --threshold sensitivity:0.8): the folder."""
    assert rank1_test_evaluation["code"] == 0
    return rank1_test_evaluation["out"]


def test_model_report_is_the_metrics_json_rendered(model_report):
    doc = read_json(model_report / "metrics.json")
    page = (model_report / evaluate.REPORT_HTML).read_text(encoding="utf-8")
    _no_network(page)
    clinical = doc["clinical"]
    # Numbers of the file, as the page formats them.
    assert report_html._ci(clinical["calibration"]["slope"]) in page
    assert report_html._ci(clinical["calibration"]["intercept"], 3, signed=True) in page
    assert report_html._ci(doc["ci"]["auc_roc"]) in page
    for row in clinical["decision_curve"]["table"]:
        assert report_html._ci(row["model"]) in page
    for cells in clinical["selective"]["scores"].values():
        assert report_html._ci(cells["aurc"]) in page
    # TRIPOD+AI's results items, in their order, after the summary.
    positions = [page.index(f"TRIPOD+AI {item}") for item in TRIPOD_ORDER]
    assert positions == sorted(positions) and page.index('id="summary"') < positions[0]
    # Small samples said plainly: the rule's note on the headline numbers, no interval of zero width.
    rule = clinical["small_sample"]["estimability"]
    assert not rule["precise"] and html.escape(rule["note"]) in page
    assert not ZERO_WIDTH.search(page), ZERO_WIDTH.search(page)
    # Threshold metrics with their Wilson intervals, the no-information rate, the data named.
    for row in clinical["small_sample"]["thresholds"]:
        for key in ("sensitivity", "specificity", "npv"):
            assert html.escape(html_cells.ci(row[key])) in page
    assert f"{clinical['small_sample']['no_information_rate']:.3f}" in page
    # This hand-written folder's manifest names no input: the page says so rather than guess.
    assert "names no input" in doc["population"]["dataset"]["name"]
    assert html.escape(doc["population"]["dataset"]["name"]) in page
    # The decision-aligned referral verdict; subgroup AUROCs never 1.000 (1.000 to 1.000).
    assert clinical["selective_brier"]["best"] in clinical["selective_brier"]["scores"]
    for groups in clinical["subgroups"]["attributes"].values():
        for row in groups.values():
            cell = row["auc_roc_hm"]
            assert cell["estimable"] is False or cell["lower"] < cell["estimate"] < cell["upper"]
    # The decision facts, recomputed from predictions.csv: the operating threshold's flags, O/E, the rule's record.
    pred = evaluate.read_predictions(model_report / evaluate.PREDICTIONS_FILE)
    op = clinical["operating_threshold"]
    assert op["rule"] == "sensitivity:0.8" and op["chosen_on"] in ("validation", "default")
    assert op["threshold"] == clinical["small_sample"]["thresholds"][0]["threshold"]
    if op["chosen_on"] == "default":  # the page says why no rule was applied
        assert op["validation"]["events"] < 10 and "too small" in op["rationale"]
    flagged = pred.p >= op["threshold"]
    summary = page[page.index('id="summary"'):page.index("</div>", page.index('id="summary"'))]
    assert f"{int(flagged.sum())} of {doc['n']} flagged" in summary
    sens = f"sensitivity {int((flagged & (pred.labels == 1)).sum())}/{int(pred.labels.sum())} = "
    assert sens in summary
    oe = clinical["decision"]["observed_expected"]
    assert oe["estimate"] == pytest.approx(pred.labels.sum() / pred.p.sum(), rel=1e-4)
    assert f"= {oe['estimate']:.2f} ({oe['lower']:.2f} to {oe['upper']:.2f})" in summary
    assert html.escape(op["rationale"]) in summary and "Baseline" in summary
    # Who the cases are: every split of the data folder, counted as the data's manifest counts them.
    splits = doc["population"]["splits"]
    assert {name: s["n"] for name, s in splits.items()} == {"train": 160, "validation": 48, "test": 48}
    assert splits["test"]["events"] == int(round(doc["n"] * doc["prevalence"]))
    assert set(splits["test"]["missing_source"]) == {"lab", "chart", "input", "output", "prescription",
                                                      "diagnosis", "procedure"}
    # Subgroups from the SequenceExamples' context (ethnicity and insurance included).
    assert set(clinical["subgroups"]["attributes"]) == set(clinical_stats.SUBGROUP_ATTRIBUTES)
    with open(model_report / evaluate.PREDICTIONS_FILE) as f:
        row = next(csv.DictReader(f))
    assert {"REFERRED", "GENDER", "AGE_YEARS", "ADMISSION_TYPE", "ETHNICITY", "INSURANCE"} <= set(row)


NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?%?")


def _leaves(doc, numbers: list, texts: list) -> None:
    """Every number and every string of a JSON document (lists and mappings walked)."""
    if isinstance(doc, dict):
        for value in doc.values():
            _leaves(value, numbers, texts)
    elif isinstance(doc, list):
        for value in doc:
            _leaves(value, numbers, texts)
    elif isinstance(doc, bool) or doc is None:
        return
    elif isinstance(doc, (int, float)):
        numbers.append(float(doc))
    elif isinstance(doc, str):
        texts.append(doc)


def _from_json(token: str, numbers: list, texts: list) -> bool:
    """Whether a printed number is a metrics.json number rounded to the decimals shown (a percentage: of a
    fraction), or a number written in one of its strings (a rule's reason, a rationale)."""
    if any(token in NUMBER.findall(t) for t in texts):
        return True
    percent = token.endswith("%")
    text = token.rstrip("%").replace(",", "").lstrip("+")
    decimals = len(text.split(".")[1]) if "." in text else 0
    value = float(text)
    return any(abs(round(100 * v if percent else v, decimals) - value) < 10 ** -decimals / 2 + 1e-9
               for v in numbers)


def test_every_number_of_the_summary_is_a_metrics_json_number_and_none_is_printed_where_not_estimable(model_report):
    """Each summary sentence's numbers come from metrics.json; a not-estimable quantity shows no number."""
    doc = read_json(model_report / "metrics.json")
    page = (model_report / evaluate.REPORT_HTML).read_text(encoding="utf-8")
    numbers, texts = [], []
    _leaves(doc, numbers, texts)
    summary = page[page.index('id="summary"'):page.index("</dl>", page.index('id="summary"'))]
    sentences = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", summary)
    assert [k for k, _ in sentences][:6] == ["Dataset", "Design", "Cases", "Operating threshold", "At that threshold",
                                             "Discrimination"]
    for key, sentence in sentences:
        text = html.unescape(sentence).replace("AUC-ROC", "").replace("p > 0.5", "")
        for token in NUMBER.findall(text):
            assert _from_json(token, numbers, texts), (key, token, text)
    # Not estimable: the reason where the number would be, on the page and in no figure's alt text.
    text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]*"', "", page)))
    assert not re.search(r"\d\.\d+\s*\(?not estimable", text)
    assert not any(re.search(r"\d\.\d", alt) for alt in re.findall(r'alt="([^"]*)"', page))
    rule = doc["clinical"]["small_sample"]["estimability"]
    if not rule["calibration_estimable"]:
        cal = doc["clinical"]["calibration"]
        for key, signed in (("slope", False), ("intercept", True)):
            for digits in (2, 3):
                assert html_cells.ci(cal[key], digits, signed) not in page


def test_the_page_states_tripod_items_10_14_16_17_18_27_from_the_file_or_leaves_them_to_the_user(model_report):
    doc = read_json(model_report / "metrics.json")
    page = (model_report / evaluate.REPORT_HTML).read_text(encoding="utf-8")
    part = html.unescape(re.sub(r"<[^>]+>", " ", page[page.index("TRIPOD+AI 10, 14, 16, 17, 18, 27"):]))
    member = doc["model"]["members"][0]
    train = doc["population"]["splits"]["train"]["events"]
    # 10: the deaths the data had and deaths per parameter, from the file's split and model card.
    assert f"{train / member['num_parameters']:.2g} deaths per parameter" in part
    assert f"{member['num_parameters']:,} parameters" in part
    # 14: the attributes compared; 16: trained on this very folder (the manifests' checksums agree).
    assert "sex, age band, admission type, ethnicity, insurance" in part
    assert member["data_manifest_sha256"] == doc["data_manifest_sha256"]
    assert f"Same data folder as training (manifest sha256 {doc['data_manifest_sha256'][:12]})" in part
    # 18: version, settings and the export's checksum; 17 and 18's registration left to the user.
    assert f"ehr-eval {doc['software_version']}" in part and member["checksum"][:12] in part
    assert "--threshold sensitivity:0.8" in part and part.count("For the user to state:") == 3
    # 27: the evaluated split's share of cases with no event, per source.
    for source, share in doc["population"]["splits"]["test"]["missing_source"].items():
        assert f"no {source} event {100 * share:.1f}%" in part
    # 27: and, per source, its events whose code the model does not know (read as out-of-vocabulary).
    unknown = doc["population"]["splits"]["test"]["unknown_codes"]
    assert unknown and sum(row["events"] for row in unknown.values()) > 0
    for source, row in unknown.items():
        assert f"{source} {row['unknown']:,} of {row['events']:,} ({100 * row['share']:.1f}%" in part


def test_model_report_renders_in_chromium_with_every_figure(model_report, tmp_path):
    seen = render_check(model_report / evaluate.REPORT_HTML, tmp_path)
    # ROC, calibration with the risk histogram under it, decision curve, risk-coverage, subgroup forest plot.
    assert seen["images"] == 6 and seen["drawn"] == 6
    assert seen["height"] > 3000
    assert [s for s in seen["sections"] if "TRIPOD" in s][0].startswith("Participants")
    # The first screen holds the summary; every figure has its alt text and caption.
    assert seen["sections"][0] == "Summary" and seen["summary_bottom"] <= seen["viewport"]
    assert seen["described"] == seen["figures"] == seen["images"]


def test_compare_report_renders_both_models(tmp_path, capsys):
    rng = np.random.default_rng(3)
    n, ids = 300, np.arange(1000, 1300)
    truth = rng.beta(1.2, 6.0, n)
    y = (rng.random(n) < truth).astype(int)
    attributes = {"gender": rng.choice(["M", "F"], n), "age_years": rng.uniform(18, 90, n),
                  "admission_type": rng.choice(["EMERGENCY", "ELECTIVE"], n), "ethnicity": rng.choice(["WHITE"], n),
                  "insurance": rng.choice(["Medicare", "Private"], n)}
    probs_a = np.clip(truth[:, None] + rng.normal(0, 0.08, (n, 4)), 0.001, 0.999)
    probs_b = np.clip(truth[:, None] + rng.normal(0, 0.02, (n, 4)), 0.001, 0.999)
    referred = rng.random(n) < 0.1
    evaluate.write_predictions(tmp_path / "a.csv", probs_a, y, ids, 2, 2, truth, attributes, referred)
    evaluate.write_predictions(tmp_path / "b.csv", probs_b, y, ids, 2, 2, truth, attributes, referred)
    # What ehr-eval wrote beside each file: an export's model card (A) and a baseline fitted on the spot (B).
    member = {"name": "rank1_lstm", "version": "0.4.0", "method": "rank1", "num_parameters": 12345,
              "data_manifest_sha256": "ab" * 32, "checksum": "cd" * 32, "config": {"model": {"method": "rank1"}}}
    baseline = {"kind": "logistic", "seed": 0, "params": {"penalty": "l1", "C": 0.05}, "num_features": 812,
                "validation_nll": {"penalty=l1,C=0.05": 0.31, "penalty=l2,C=0.1": 0.33}}
    (tmp_path / "metrics.json").write_text(json.dumps({"model": {"members": [member]}, "data_manifest_sha256": "ab" * 32}))
    (tmp_path / "b").mkdir()
    evaluate.write_predictions(tmp_path / "b" / "b.csv", probs_b, y, ids, 2, 2, truth, attributes, referred)
    (tmp_path / "b" / "metrics.json").write_text(json.dumps({"baseline": baseline, "data_manifest_sha256": "ef" * 32}))
    out = tmp_path / "cmp"
    assert ehr_eval.main(["--compare", str(tmp_path / "a.csv"), str(tmp_path / "b" / "b.csv"), "--bootstrap", "50",
                          "--out", str(out)]) == 0
    assert "AURC B - A" in capsys.readouterr().out
    doc = read_json(out / evaluate.COMPARISON_FILE)
    a = evaluate.read_predictions(tmp_path / "a.csv")
    assert doc["clinical"]["a"]["calibration"]["slope"]["estimate"] == pytest.approx(
        clinical_stats.calibration_fit(a.p, a.labels)["slope"]["estimate"])
    diff = doc["clinical"]["selective_difference"]["mutual_information"]["aurc"]
    assert diff["difference"] == pytest.approx(diff["b"] - diff["a"])
    page = (out / evaluate.REPORT_HTML).read_text(encoding="utf-8")
    _no_network(page)
    assert report_html._ci(doc["clinical"]["b"]["calibration"]["slope"]) in page
    # Each side's card: an export by name, version, method, training data and checksum; the baseline by its
    # estimator, features and how its settings were chosen, and not called an unchanged model.
    specification = page[page.index("TRIPOD+AI 22"):page.index("TRIPOD+AI 23a")]
    for text in ("rank1_lstm", "0.4.0", "rank1, 12,345 parameters", "ab" * 6, "export sha256 " + "cd" * 6,
                 "logistic baseline", "812 bag aggregates", "penalty=l1, C=0.05, chosen by lowest validation-split "
                 "NLL among 2 tried", "data manifest sha256 " + "ef" * 6):
        assert text in specification, text
    updating = page[page.index("TRIPOD+AI 24"):]
    assert "B is a logistic baseline fitted on the spot" in updating and "None: the model" not in updating
    items = html.unescape(updating[updating.index("TRIPOD+AI 10, 14"):])
    assert "A (rank1_lstm): 12,345 parameters" in items and "B (logistic baseline): 812 candidate features" in items
    # B was fitted on another folder than the one A was trained and both were evaluated on: item 16 says so.
    assert f"A different data folder from training (trained on manifest sha256 {'ab' * 6}, {'ef' * 6}" in items
    # The ROC figure's curves are in comparison.json and are scikit-learn's on each file's probabilities.
    for side, pred in (("a", a), ("b", evaluate.read_predictions(tmp_path / "b" / "b.csv"))):
        fpr, tpr, _ = roc_curve(pred.labels, pred.p)
        stored = doc["clinical"][side]["curves"]["roc"]
        assert len(fpr) <= 200 and np.allclose(stored["fpr"], fpr) and np.allclose(stored["tpr"], tpr)
    # Referral: one panel per model, each with its own four referral orders, not eight lines in one axes.
    panels = plots.selective_figure([(n, doc["clinical"][n.lower()]["selective"]) for n in "AB"], 0.05).axes
    assert len(panels) == 2 and all(len(ax.get_lines()) == 5 for ax in panels)  # 4 orders + the target line
    assert not re.search(r"[-+]0\.0+(?![0-9])", re.sub(r'src="data:[^"]*"', "", page))
    seen = render_check(out / evaluate.REPORT_HTML, tmp_path / "browser")
    # ROC of both, calibration, decision curve, risk-coverage of both, and one forest plot per model.
    assert seen["images"] == 6 and seen["drawn"] == 6


def test_compare_marks_a_constant_measure_absent_and_pairs_calibration_and_net_benefit(tmp_path):
    rng = np.random.default_rng(5)
    n, ids = 240, np.arange(2000, 2240)
    truth = rng.beta(1.2, 6.0, n)
    y = (rng.random(n) < truth).astype(int)
    # A: one deterministic network (every sample equal, mutual information 0); B: a sampled model.
    probs_a = np.repeat(np.clip(truth + rng.normal(0, 0.05, n), 0.001, 0.999)[:, None], 4, axis=1)
    probs_b = np.clip(truth[:, None] + rng.normal(0, 0.03, (n, 4)), 0.001, 0.999)
    evaluate.write_predictions(tmp_path / "a.csv", probs_a, y, ids, 1, 4)
    evaluate.write_predictions(tmp_path / "b.csv", probs_b, y, ids, 2, 2)
    out = tmp_path / "cmp"
    assert ehr_eval.main(["--compare", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--bootstrap", "40",
                          "--out", str(out)]) == 0
    doc = read_json(out / evaluate.COMPARISON_FILE)
    assert doc["clinical"]["absent_scores"] == {"mutual_information": ["A"], "predictive_std": ["A"]}
    a, b = evaluate.read_predictions(tmp_path / "a.csv"), evaluate.read_predictions(tmp_path / "b.csv")
    paired = doc["clinical"]["paired_clinical"]
    slope_a = clinical_stats.calibration_fit(a.p, a.labels)["slope"]["estimate"]
    slope_b = clinical_stats.calibration_fit(b.p, b.labels)["slope"]["estimate"]
    assert paired["slope"]["difference"] == pytest.approx(slope_b - slope_a)
    # Net benefit at 10 % by its definition, TP/n - FP/n * 0.1 / 0.9, for each model.
    nb = [(np.sum((p >= 0.1) & (y == 1)) - np.sum((p >= 0.1) & (y == 0)) / 9) / n for p in (a.p, b.p)]
    assert paired["net_benefit"]["0.1"]["difference"] == pytest.approx(nb[1] - nb[0])
    assert paired["net_benefit"]["0.1"]["lower"] < paired["net_benefit"]["0.1"]["upper"]
    page = (out / evaluate.REPORT_HTML).read_text(encoding="utf-8")
    assert "not compared: constant over the cases in A" in page and "calibration slope" in page
    # The same decision facts as a single page, for both; a model without a card named once, by its file.
    summary = page[page.index('id="summary"'):page.index("</dl>", page.index('id="summary"'))]
    for side in ("a", "b"):
        row = doc["clinical"][side]["small_sample"]["thresholds"][0]
        flagged = int(np.sum((a.p if side == "a" else b.p) >= row["threshold"]))
        assert f"{side.upper()}: at that threshold</dt><dd>{flagged} of {n} flagged" in summary
    assert page.count(f"A = {tmp_path / 'a.csv'}") == 1 and f"({tmp_path / 'a.csv'})" not in page
    assert page.count("Sensitivity, specificity and predictive values") == 2


@pytest.mark.slow
def test_report_names_the_subgroup_planted_in_a_synthetic_release(tmp_path):
    """A release whose URGENT admissions die by another physiology: the report names that group."""
    from ehr_pipeline.contract import PipelineConfig
    from ehr_pipeline.job import run_job
    from ehr_pipeline.synth import generate_release

    release, data, out = tmp_path / "release", tmp_path / "data", tmp_path / "eval"
    generate_release(release, patients=2000, seed=3, events_scale=0.2, plant_subgroup="URGENT", show_progress=False)
    # Half the patients in the test split: the planted group is ~6% of admissions.
    config = PipelineConfig.model_validate({"splits": {"train": 0.4, "validation": 0.1, "test": 0.5}})
    run_job(str(release), str(data), config, ["--runner=FnApiRunner"])
    # A linear model of everyone cannot follow the reversed relation in one admission type.
    assert ehr_eval.main(["--baseline", "logistic", "--data", str(data), "--truth", str(release / "SYNTH_TRUTH.csv"),
                          "--bootstrap", "200", "--out", str(out)]) == 0
    subgroups = read_json(out / "metrics.json")["clinical"]["subgroups"]
    print([(g["attribute"], g["group"], g["metric"], round(g["z"], 2)) for g in subgroups["gaps"]])
    urgent = [g for g in subgroups["gaps"] if g["attribute"] == "admission_type"]
    assert [(g["group"], g["metric"]) for g in urgent] == [("URGENT", "logit_error_truth")]
    assert urgent[0]["z"] > subgroups["z_named"] + 0.5  # named with room to spare
    page = (out / evaluate.REPORT_HTML).read_text(encoding="utf-8")
    heterogeneity = page[page.index("TRIPOD+AI 23b"):]
    assert "serves these groups worse" in heterogeneity and "admission type = URGENT</b>" in heterogeneity
    seen = render_check(out / evaluate.REPORT_HTML, tmp_path / "browser")
    assert seen["images"] == seen["drawn"] == 6  # with the ROC curve and the risk histogram
