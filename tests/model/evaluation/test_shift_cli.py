"""The shift report on real exports: the reference training writes, `ehr-analyze shift`, and ehr-eval on other data.

The model is the session's tiny trained rank-1 run (tests/conftest.py); new data folders are
fresh draws of its population (tests/support/ehr_testdata.py), once as recorded, once with creatinine
(lab:50912) multiplied by 88.4, the factor from mg/dL to umol/L.
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from ehr_pipeline.shift import population
from model import data_folder
from model.cli import EXIT_SHIFT, ehr_analyze, ehr_eval
from model.evaluation.statistics import metrics
from model.evaluation.against_reference import SHIFT_JSON, SHIFT_MD, SHIFT_PNG
from model.export.load import ExportError, read_export, write_manifest
from model.export_layout import REFERENCE_PROFILE
from model.export.predict import predict_probs
from tests.support.ehr_testdata import read_json, write_data_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIZES = (("train", 120), ("validation", 40), ("test", 100))


@pytest.fixture(scope="module")
def new_data(tmp_path_factory):
    base = tmp_path_factory.mktemp("new_data")
    return {"same": write_data_dir(base / "same", sizes=SIZES, seed=7),
            "umol": write_data_dir(base / "umol", sizes=SIZES, seed=8, scale={"lab:50912": 88.4})}


def test_training_exports_its_population_with_the_validation_mutual_information(trained_rank1, rank1_export):
    export = read_export(trained_rank1["export"])
    reference = export.reference
    files = data_folder.load_data_files(trained_rank1["data"])
    assert reference.n == 160 and set(reference.codes) == {c for codes in files.vocabulary.values() for c in codes}
    # Its MI quantiles are those of the validation split's predictions with the run's S and seed.
    config = trained_rank1["config"]["eval"]
    records = data_folder.read_split(files, "validation").records
    mi = metrics.mutual_information(predict_probs(rank1_export, records, config["num_samples"],
                                                  config["seed"]))
    np.testing.assert_allclose(reference.mutual_information.edges,
                               np.quantile(mi, population.MI_QUANTILES), rtol=1e-4, atol=1e-9)
    assert reference.mi_samples == config["num_samples"] and reference.mutual_information.n == 48


def test_a_damaged_reference_is_refused_naming_its_file(trained_rank1, tmp_path):
    copy = tmp_path / "export"
    shutil.copytree(trained_rank1["export"], copy)
    doc = json.loads((copy / REFERENCE_PROFILE).read_text())
    doc["age"]["counts"] = [1]
    (copy / REFERENCE_PROFILE).write_text(json.dumps(doc))
    write_manifest(copy)
    with pytest.raises(ExportError, match=f"{REFERENCE_PROFILE}: age"):
        read_export(copy)


def test_shift_on_fresh_data_of_the_same_population_finds_nothing(trained_rank1, new_data, tmp_path, capsys):
    out = tmp_path / "shift"
    # The train split: the generator puts a rare lab (out of the vocabulary) only into the other splits.
    code = ehr_analyze.main(["shift", "--model", str(trained_rank1["run"]), "--data", str(new_data["same"]),
                             "--splits", "train", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.startswith("shift: none (120 admissions against the model's reference of 160")
    report = read_json(out / SHIFT_JSON)
    assert report["level"] == "none" and report["summary"]["mi_compared"]
    assert report["current_profile"]["n"] == 120
    assert (out / SHIFT_PNG).read_bytes()[:8] == PNG_MAGIC
    assert (out / SHIFT_MD).read_text().startswith("# Shift report: none")
    # The performance expected before outcomes: an interval around each estimate, from all 120 admissions.
    estimate = report["performance_estimate"]["posterior"]
    assert estimate["n"] == 120 and estimate["columns"] > 1
    for row in estimate["metrics"].values():
        assert row["lower"] <= row["estimate"] <= row["upper"]
    assert [row["threshold"] for row in estimate["net_benefit"]] == [0.05, 0.1, 0.2, 0.3, 0.5]
    assert "| AUROC |" in printed and "## Expected performance" in (out / SHIFT_MD).read_text()


def test_shift_names_creatinine_88_times_the_training_median_and_fails(trained_rank1, new_data, tmp_path, capsys):
    args = ["shift", "--model", str(trained_rank1["export"]), "--data", str(new_data["umol"]), "--no-progress"]
    assert ehr_analyze.main(args + ["--out", str(tmp_path / "shift")]) == EXIT_SHIFT
    printed = capsys.readouterr().out
    assert printed.startswith("shift: severe")
    assert re.search(r"\[severe\] lab:50912 values are ~(8[5-9]|9[0-2])x the training median", printed), printed
    [finding] = [f for f in read_json(tmp_path / "shift" / SHIFT_JSON)["findings"] if f["subject"] == "lab:50912"]
    assert finding["numbers"]["ratio_low"] < 88.4 < finding["numbers"]["ratio_high"]
    assert ehr_analyze.main(args + ["--fail-on", "never", "--no-model"]) == 0
    capsys.readouterr()


@pytest.mark.slow
def test_an_export_without_a_reference_needs_its_training_data(trained_rank1, new_data, tmp_path, capsys):
    old = tmp_path / "old_export"
    shutil.copytree(trained_rank1["export"], old)
    (old / REFERENCE_PROFILE).unlink()
    write_manifest(old)
    args = ["shift", "--model", str(old), "--data", str(new_data["umol"]), "--no-progress"]
    assert ehr_analyze.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--reference-data" in err
    assert ehr_analyze.main(args + ["--reference-data", str(trained_rank1["data"])]) == EXIT_SHIFT
    assert re.search(r"lab:50912 values are ~(8[5-9]|9[0-2])x", capsys.readouterr().out)


@pytest.mark.slow
def test_eval_on_other_data_writes_the_shift_report_and_fails_only_when_asked(trained_rank1, new_data, tmp_path,
                                                                             capsys):
    args = ["--model", str(trained_rank1["export"]), "--data", str(new_data["umol"]), "--samples", "3",
            "--bootstrap", "10", "--no-progress"]
    assert ehr_eval.main(args + ["--out", str(tmp_path / "eval")]) == 0
    assert "shift: severe" in capsys.readouterr().out
    assert read_json(tmp_path / "eval" / "metrics.json")["shift"]["level"] == "severe"
    shifted = read_json(tmp_path / "eval" / SHIFT_JSON)
    assert shifted["summary"]["n_current"] == 100 and shifted["summary"]["mi_compared"]
    assert (tmp_path / "eval" / SHIFT_PNG).read_bytes()[:8] == PNG_MAGIC
    # The expected performance beside the realized one, both of the predictive mean on the same 100 cases.
    performance = read_json(tmp_path / "eval" / "metrics.json")["performance_estimate"]
    assert performance["estimate"]["posterior"]["n"] == 100
    assert performance["realized"]["metrics"]["brier"]["value"] == pytest.approx(
        read_json(tmp_path / "eval" / "metrics.json")["overall"]["brier"], rel=1e-9)
    assert "| Brier score |" in (tmp_path / "eval" / "performance_estimate.md").read_text()
    assert ehr_eval.main(args + ["--fail-on-shift", "moderate"]) == EXIT_SHIFT
    capsys.readouterr()
    # On the training data itself there is nothing to compare.
    assert ehr_eval.main(["--model", str(trained_rank1["export"]), "--data", str(trained_rank1["data"]),
                          "--samples", "2", "--bootstrap", "10", "--no-progress", "--fail-on-shift", "moderate"]) == 0
    assert "shift:" not in capsys.readouterr().out
