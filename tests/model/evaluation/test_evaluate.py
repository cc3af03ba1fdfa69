"""ehr-eval on real exports: the report files, error vs a known truth, referral at the stored
threshold, and deep ensembles (members side by side, also as one ensemble export)."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from model import data_folder
from model.cli import ehr_eval
from model.evaluation import evaluate
from model.evaluation.statistics import against_truth, metrics, metrics_report
from model.evaluation.evaluate import PLOT_FILES, TRUTH_PLOT_FILE, load_truth
from model.export.predict import predict_probs
from model.ehr import baselines
from tests.support.ehr_testdata import read_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def trained(trained_rank1):
    return trained_rank1


def test_eval_writes_report_plots_and_error_vs_truth(trained, rank1_export, rank1_test_evaluation):
    # The session's one `ehr-eval --model RUN --split test --samples 4 --seed 3 --truth ... --out` (tests/conftest.py),
    # shared with the MEDS evaluation test, which reads the same folder's predictions.meds.parquet.
    out, code, printed = (rank1_test_evaluation[k] for k in ("out", "code", "printed"))
    assert code == 0
    assert "auc_pr" in printed and "vs truth" in printed and "referral" in printed
    report = read_json(out / "metrics.json")
    assert (report["n"], report["K"], report["S"], report["split"]) == (48, 2, 4, "test")
    assert {"auc_pr", "auc_roc", "nll", "ece", "brier"} <= set(report["ci"])
    assert report["truth"]["rmse"] >= report["truth"]["mae"] > 0
    # The referral rule is the one stored with the model (chosen on validation at training time).
    stored = read_json(trained["export"] / "metrics.json")["referral"]
    assert report["referral"]["threshold"] == pytest.approx(stored["threshold"])
    for name in PLOT_FILES.values():
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    with open(out / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    # ehr-eval's probabilities are the export's for the same seed (the service's numbers).
    split_records = data_folder.read_split(data_folder.load_data_files(trained["data"]), "test")
    records, labels, hadm_ids = split_records.records, split_records.labels, split_records.hadm_ids
    probs = predict_probs(rank1_export, records, 4, seed=3)
    assert [int(r["HADM_ID"]) for r in rows] == hadm_ids and [int(r["LABEL"]) for r in rows] == labels
    np.testing.assert_allclose([float(r["P_MEAN"]) for r in rows], probs.mean(axis=1), atol=2e-6)
    # Against the truth: coverage, correlations and referral, recomputable from the file.
    truth = load_truth(trained["data"] / "SYNTH_TRUTH.csv", hadm_ids)
    np.testing.assert_allclose([float(r["P_TRUTH"]) for r in rows], truth, atol=1e-6)
    lo, hi = np.quantile(probs, [0.025, 0.975], axis=1)
    np.testing.assert_allclose([float(r["Q0.025"]) for r in rows], lo, atol=2e-6)
    inside = np.mean([float(r["Q0.025"]) <= t <= float(r["Q0.975"]) for r, t in zip(rows, truth)])
    assert report["truth"]["coverage"]["0.95"] == pytest.approx(inside)
    assert set(report["truth"]["uncertainty_vs_error"]) == set(against_truth.TRUTH_MEASURES)
    assert {"mutual_information", *against_truth.REFERRAL_BASELINES} <= set(report["truth"]["selective"])
    assert (out / TRUTH_PLOT_FILE).read_bytes()[:8] == PNG_MAGIC


def test_deep_ensemble_of_exports_and_its_export(trained, rank1_export, tmp_path, capsys):
    ens = tmp_path / "ensemble"
    args = ["--model", str(trained["export"]), "--model", str(trained["export"]), "--data", str(trained["data"]),
            "--samples", "2", "--bootstrap", "10", "--no-progress"]
    assert ehr_eval.main(args + ["--out", str(tmp_path / "eval"), "--export-ensemble", str(ens)]) == 0
    report = read_json(tmp_path / "eval" / "metrics.json")
    assert report["K"] == 4 and len(report["members"]) == 4
    # Both halves are the same model with the same seed: member k and member k + 2 agree.
    assert report["members"][0] == report["members"][2] and report["members"][1] == report["members"][3]
    card = read_json(ens / "model_card.json")
    assert (card["method"], card["ensemble_size"]) == ("deep_ensemble", 4)
    # The members' training population, with the ensemble's own validation mutual information.
    reference, member = read_json(ens / "reference_profile.json"), read_json(trained["export"] / "reference_profile.json")
    assert reference["codes"] == member["codes"] and reference["mi_samples"] == 2
    assert reference["mutual_information"]["n"] == 48
    records = data_folder.read_split(data_folder.load_data_files(trained["data"]), "test").records
    single = predict_probs(rank1_export, records, 2, seed=5).reshape(len(records), 2, 2)
    joined = predict_probs(ens, records, 2, seed=5).reshape(len(records), 2, 4)
    np.testing.assert_allclose(joined, np.concatenate([single, single], axis=2), atol=1e-6)
    capsys.readouterr()


def test_bad_arguments_fail_with_a_message(trained, tmp_path, capsys):
    assert ehr_eval.main(["--model", str(trained["export"]), "--data", str(trained["data"]), "--samples", "0"]) == 2
    assert ehr_eval.main(["--model", str(tmp_path), "--data", str(trained["data"])]) == 2
    assert "neither an export directory" in capsys.readouterr().err


def test_compare_two_prediction_files(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n, ids = 120, np.arange(500, 620)
    truth = rng.beta(1.0, 5.0, n)
    y = (rng.random(n) < truth).astype(int)
    probs_a = np.clip(truth[:, None] + rng.normal(0, 0.08, (n, 4)), 0.001, 0.999)
    probs_b = np.clip(truth[:, None] + rng.normal(0, 0.02, (n, 1)), 0.001, 0.999)
    evaluate.write_predictions(tmp_path / "a.csv", probs_a, y, ids, 2, 2, truth)
    order = rng.permutation(n)  # B's file lists the cases in another order
    evaluate.write_predictions(tmp_path / "b.csv", probs_b[order], y[order], ids[order], 1, 1)
    code = ehr_eval.main(["--compare", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--bootstrap", "200",
                          "--seed", "1", "--out", str(tmp_path / "cmp")])
    assert code == 0
    assert "truth_mae" in capsys.readouterr().out
    doc = read_json(tmp_path / "cmp" / evaluate.COMPARISON_FILE)
    p_a = np.round(probs_a.mean(axis=1), 6)
    p_b = np.round(probs_b[:, 0], 6)
    expected = metrics_report.paired_bootstrap(p_a, p_b, y, np.round(truth, 6), n=200, seed=1)
    for name, row in expected.items():
        assert doc["metrics"][name]["difference"] == pytest.approx(row["difference"], abs=1e-9)
        assert doc["metrics"][name]["lower"] == pytest.approx(row["lower"], abs=1e-9)
    assert doc["metrics"]["truth_mae"]["upper"] < 0  # B is closer to the truth
    # Files of different admissions cannot be paired.
    evaluate.write_predictions(tmp_path / "c.csv", probs_b[:10], y[:10], ids[:10], 1, 1)
    assert ehr_eval.main(["--compare", str(tmp_path / "a.csv"), str(tmp_path / "c.csv")]) == 2
    assert "not the admissions" in capsys.readouterr().err


def test_update_relation_finds_which_side_updates_the_other():
    update = {"method": "recalibrate", "chosen": None, "parent_name": "p", "parent_checksum": "c0", "n": 200,
              "events": 30, "weights_updated": False, "recalibration": {"intercept": 0.5, "slope": 0.9}}
    parent, child = {"checksum": "c0"}, {"checksum": "c1", "update": update}
    assert evaluate.update_relation([parent], [child]) == {"updated": "b", "update": update}
    assert evaluate.update_relation([child], [parent]) == {"updated": "a", "update": update}
    # Two updates of one parent, or an update beside an unrelated model: neither is the other's before.
    sibling = {"checksum": "c2", "update": {**update, "method": "bayes"}}
    assert evaluate.update_relation([child], [sibling]) is None
    assert evaluate.update_relation([{"checksum": "other"}], [child]) is None
    # Predictions files from elsewhere (no metrics.json beside them) have no checksums.
    assert evaluate.update_relation([], [child]) is None


def test_baseline_is_evaluated_like_a_model(trained, tmp_path, capsys):
    out = tmp_path / "logistic"
    code = ehr_eval.main(["--baseline", "logistic", "--data", str(trained["data"]), "--truth",
                          str(trained["data"] / "SYNTH_TRUTH.csv"), "--bootstrap", "20", "--out", str(out)])
    assert code == 0
    assert "logistic baseline" in capsys.readouterr().out
    report = read_json(out / "metrics.json")
    assert (report["K"], report["S"], report["baseline"]["kind"]) == (1, 1, "logistic")
    assert report["referral"]["measure"] == "predictive_entropy"  # mutual information is 0 with one probability
    assert report["truth"]["coverage"]["0.95"] is None  # no interval from one probability
    pred = baselines.fit_baseline(trained["data"], "logistic", splits=("test",)).predictions["test"]
    rows = evaluate.read_predictions(out / "predictions.csv")
    np.testing.assert_array_equal(rows.hadm_ids, pred.hadm_ids)
    np.testing.assert_allclose(rows.p, pred.p, atol=1e-6)
    assert report["overall"]["auc_roc"] == pytest.approx(metrics.auc_roc(pred.p, pred.labels))
