"""ehr-eval on real exports: the report files, error vs a known truth, referral at the stored
threshold, and deep ensembles (members side by side, also as one ensemble export)."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from ehr_testdata import read_json, trained_rank1_run

from model import eval_cli, inputs
from model.evaluate import PLOT_FILES
from model.predict import predict_probs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_rank1_run(tmp_path_factory.getbasetemp() / "trained_rank1")


def test_eval_writes_report_plots_and_error_vs_truth(trained, tmp_path, capsys):
    out = tmp_path / "eval"
    code = eval_cli.main(["--model", str(trained["run"]), "--data", str(trained["data"]), "--split", "test",
                          "--samples", "4", "--seed", "3", "--out", str(out), "--truth",
                          str(trained["data"] / "SYNTH_TRUTH.csv"), "--bootstrap", "30", "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
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
    records, labels, hadm_ids = inputs.read_split(inputs.load_data_files(trained["data"]), "test")
    probs = predict_probs(trained["export"], records, 4, seed=3)
    assert [int(r["HADM_ID"]) for r in rows] == hadm_ids and [int(r["LABEL"]) for r in rows] == labels
    np.testing.assert_allclose([float(r["P_MEAN"]) for r in rows], probs.mean(axis=1), atol=2e-6)


def test_deep_ensemble_of_exports_and_its_export(trained, tmp_path, capsys):
    ens = tmp_path / "ensemble"
    args = ["--model", str(trained["export"]), "--model", str(trained["export"]), "--data", str(trained["data"]),
            "--samples", "2", "--bootstrap", "10", "--no-progress"]
    assert eval_cli.main(args + ["--out", str(tmp_path / "eval"), "--export-ensemble", str(ens)]) == 0
    report = read_json(tmp_path / "eval" / "metrics.json")
    assert report["K"] == 4 and len(report["members"]) == 4
    # Both halves are the same model with the same seed: member k and member k + 2 agree.
    assert report["members"][0] == report["members"][2] and report["members"][1] == report["members"][3]
    card = read_json(ens / "model_card.json")
    assert (card["method"], card["ensemble_size"]) == ("deep_ensemble", 4)
    records, _, _ = inputs.read_split(inputs.load_data_files(trained["data"]), "test")
    single = predict_probs(trained["export"], records, 2, seed=5).reshape(len(records), 2, 2)
    joined = predict_probs(ens, records, 2, seed=5).reshape(len(records), 2, 4)
    np.testing.assert_allclose(joined, np.concatenate([single, single], axis=2), atol=1e-6)
    capsys.readouterr()


def test_bad_arguments_fail_with_a_message(trained, tmp_path, capsys):
    assert eval_cli.main(["--model", str(trained["export"]), "--data", str(trained["data"]), "--samples", "0"]) == 2
    assert eval_cli.main(["--model", str(tmp_path), "--data", str(trained["data"])]) == 2
    assert "neither an export directory" in capsys.readouterr().err
