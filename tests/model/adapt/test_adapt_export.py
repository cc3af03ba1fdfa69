"""The updated export on the tiny trained model: what it records, that it loads, that it predicts the parent moved."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from model import data_folder
from model.adapt.config import AdaptConfig
from model.adapt.rebuild import rebuild
from model.adapt.local_data import read_local
from model.adapt.update import adapt
from model.adapt.run_update import run_update
from model.cli import ehr_adapt, ehr_eval
from model.evaluation.statistics import metrics
from model.export.load import ExportError, load_export
from model.export.predict import Predictor, predict_probs
from model.export.write import write_ensemble_export
from serving.monitoring.outcome_store import OutcomeStore
from tests.support.adapt_data import relabelled_copy


@pytest.fixture(scope="module")
def site(trained_rank1, tmp_path_factory):
    """The model's own admissions with four in five dying: a site whose baseline risk is far higher."""
    return relabelled_copy(trained_rank1["data"], tmp_path_factory.mktemp("adapt") / "site", death_rate=0.8, seed=1)


@pytest.fixture(scope="module")
def recalibrated(trained_rank1, site, tmp_path_factory):
    """The model recalibrated on the site through ehr-adapt's command line, as a user runs it."""
    out = tmp_path_factory.mktemp("adapted") / "recalibrated"
    assert ehr_adapt.main(["--model", str(trained_rank1["export"]), "--data", str(site), "--out", str(out),
                           "--method", "recalibrate", "--samples", "3", "--no-progress"]) == 0
    return types.SimpleNamespace(export_dir=out)


def test_the_export_records_its_parent_method_and_local_data(rank1_export, site, recalibrated):
    parent = rank1_export
    adapted = load_export(recalibrated.export_dir)
    record = adapted.files.adaptation
    train = data_folder.read_split(data_folder.load_data_files(site), "train")
    assert record.parent_checksum == parent.files.checksum
    assert (record.method, record.n, record.events) == ("recalibrate", len(train.labels), sum(train.labels))
    assert record.model_extra["local_data"]["records"] == {"read": 160, "unlabelled": 0, "not_drawn": 0, "used": 160}
    assert adapted.model_card["parent"]["checksum"] == parent.files.checksum
    # Four in five die here, far more than in training: the intercept moves the risk up.
    assert record.recalibration.intercept > 0.5
    assert adapted.files.reference.n == 160


def test_the_adapted_export_predicts_the_parent_moved_by_the_stored_update(trained_rank1, rank1_export, recalibrated):
    records = data_folder.read_split(data_folder.load_data_files(trained_rank1["data"]), "test").records
    parent = predict_probs(rank1_export, records, 3, 7)
    adapted = load_export(recalibrated.export_dir)
    expected = adapted.files.adaptation.recalibration.apply(parent)
    np.testing.assert_array_equal(predict_probs(adapted, records, 3, 7), expected)
    assert metrics.predictive_mean(expected).mean() > metrics.predictive_mean(parent).mean()


def test_the_rebuilt_network_predicts_what_the_export_predicts(trained_rank1, rank1_export):
    loaded = rank1_export
    network = rebuild(loaded)
    records = data_folder.read_split(data_folder.load_data_files(trained_rank1["data"]), "test").records[:16]
    np.testing.assert_array_equal(predict_probs(Predictor(network.featurizer, network.model), records, 3, 7),
                                  predict_probs(loaded, records, 3, 7))


def test_an_ensemble_refuses_a_recalibrated_member(trained_rank1, recalibrated, tmp_path):
    with pytest.raises(ExportError, match="recalibrated exports"):
        write_ensemble_export(tmp_path / "ens", [trained_rank1["export"], recalibrated.export_dir], card={},
                              metrics_doc={})


def test_a_sample_larger_than_the_split_is_refused(trained_rank1, site, tmp_path):
    with pytest.raises(ValueError, match="160 labelled admissions, fewer than the 500"):
        run_update(trained_rank1["export"], site, tmp_path / "x", AdaptConfig(sample_size=500, samples=2))


def _service_store(folder, version: str, checksum: str, records: list[bytes], labels, *, keep: bool = True) -> None:
    """An outcome store written by the service's own class: each record answered by the export (`version`,
    `checksum`), then its outcome."""
    store = OutcomeStore(folder, retention_s=10 * 86400.0, keep_admissions=keep)
    for i, (record, label) in enumerate(zip(records, labels)):
        [pid] = store.record_predictions(version, [0.5], [[0.5, 0.5]], [record], model_checksum=checksum,
                                         now=1.8e9 + i)
        store.record_outcome(pid, int(label), now=1.8e9 + i)
    store.close()


@pytest.mark.slow
def test_ehr_adapt_reads_the_services_outcome_store_as_its_local_data(trained_rank1, rank1_export, site, recalibrated,
                                                                     tmp_path, capsys):
    parent = rank1_export
    version = parent.files.card.version
    train = data_folder.read_split(data_folder.load_data_files(site), "train")
    folder = tmp_path / "outcomes"
    _service_store(folder, version, parent.files.checksum, train.records, train.labels)
    # Rows the update cannot use, each counted by reason: another export's of the same version, an outcome still
    # to come.
    _service_store(folder, version, "0" * 64, train.records[:3], train.labels[:3])
    OutcomeStore(folder, retention_s=86400.0, keep_admissions=True).record_predictions(
        version, [0.5], [[0.5, 0.5]], [train.records[0]], model_checksum=parent.files.checksum)
    out = tmp_path / "from-store"
    assert ehr_adapt.main(["--model", str(trained_rank1["export"]), "--outcomes", str(folder), "--out", str(out),
                           "--method", "recalibrate", "--samples", "3", "--no-progress"]) == 0
    record = load_export(out).files.adaptation
    assert (record.method, record.n, record.events) == ("recalibrate", 160, sum(train.labels))
    local = record.model_extra["local_data"]
    assert local["split"] == "outcome-store"
    assert local["records"] == {"read": 164, "without_outcome": 1, "admission_not_kept": 0, "other_model": 3,
                                "model_not_recorded": 0,
                                "not_drawn": 0, "used": 160}
    # The same admissions and outcomes as the data folder's train split, in the same order: the same recalibration.
    folder_fit = load_export(recalibrated.export_dir).files.adaptation.recalibration
    assert (record.recalibration.intercept, record.recalibration.slope) == pytest.approx(
        (folder_fit.intercept, folder_fit.slope), rel=1e-6)
    capsys.readouterr()
    # One line each: a store of another export only (same version), and one that kept no admissions.
    _service_store(tmp_path / "other", version, "e5" * 32, train.records[:4], train.labels[:4])
    _service_store(tmp_path / "unkept", version, parent.files.checksum, train.records[:4], train.labels[:4],
                   keep=False)
    for name, why in (("other", "answered by other export(s) (checksum e5e5e5e5e5e5...), not "
                       + parent.files.checksum[:12]),
                      ("unkept", "only with --outcome-keep-admissions")):
        assert ehr_adapt.main(["--model", str(trained_rank1["export"]), "--outcomes", str(tmp_path / name),
                               "--out", str(tmp_path / f"x-{name}"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err
    assert not (tmp_path / "x-other").exists() and not (tmp_path / "x-unkept").exists()


@pytest.mark.slow
def test_ehr_eval_scores_and_compares_parent_and_adapted_on_the_same_cases(trained_rank1, rank1_export,
                                                                           rank1_test_evaluation, site, recalibrated,
                                                                           tmp_path, capsys):
    # The parent's evaluation of the test split is the session's (tests/conftest.py: its run, whose export this
    # is); the adapted export is evaluated here on the same 48 cases.
    parent_eval = rank1_test_evaluation["out"]
    assert rank1_test_evaluation["code"] == 0
    assert ehr_eval.main(["--model", str(recalibrated.export_dir), "--data", str(trained_rank1["data"]),
                          "--samples", "3", "--bootstrap", "20", "--out", str(tmp_path / "adapted"),
                          "--no-progress"]) == 0
    assert ehr_eval.main(["--compare", str(parent_eval / "predictions.csv"),
                          str(tmp_path / "adapted" / "predictions.csv"), "--bootstrap", "20",
                          "--out", str(tmp_path / "compare")]) == 0
    comparison = json.loads((tmp_path / "compare" / "comparison.json").read_text())
    parent = rank1_export
    assert comparison["n"] == 48
    # The comparison knows B is A updated: B's parent checksum is A's export checksum, read from the evaluations.
    relation = comparison["relation"]
    assert relation["updated"] == "b" and relation["update"]["parent_checksum"] == parent.files.checksum
    assert (relation["update"]["method"], relation["update"]["n"], relation["update"]["weights_updated"]) == (
        "recalibrate", 160, False)
    assert comparison["names"]["b"].startswith(f"{parent.files.card.name}+recalibrate")
    # The update moved the risks of the same 48 cases: the paired NLL difference is not nil.
    assert comparison["metrics"]["nll"]["difference"] != 0.0
    out = capsys.readouterr().out
    assert "B is A updated at a new site by ehr-adapt recalibrate on 160 local admissions (128 deaths)" in out
    compared = (tmp_path / "compare" / "report.html").read_text()
    assert "<b>B is A updated at a new site by ehr-adapt recalibrate" in compared
    # Each model's own report says whether it was updated (TRIPOD 24): the parent was not, the update names it.
    assert "None: the model is evaluated as exported" in (parent_eval / "report.html").read_text()
    adapted_page = (tmp_path / "adapted" / "report.html").read_text()
    assert f"(export sha256 {parent.files.checksum[:12]}) updated at a new site" in adapted_page
    assert "None: the model is evaluated as exported" not in adapted_page


@pytest.mark.slow
def test_the_weight_updates_run_and_bayes_follows_a_far_higher_local_risk(trained_rank1, rank1_export, site, tmp_path):
    records = data_folder.read_split(data_folder.load_data_files(site), "test").records
    parent = rank1_export
    before = metrics.predictive_mean(predict_probs(parent, records, 3, 7)).mean()
    # bayes goes through the written export and its reader; finetune and retrain share that writer and are
    # checked in memory (a SavedModel write costs tens of seconds here). Two epochs: the risk moves with the
    # output bias's mode, solved before the first epoch (model.adapt.bayes_update), and the fit keeps an epoch.
    # The session's loaded parent goes in, and the written export comes back as run_update read it back:
    # two loads (seconds each: every checksum, the whole SavedModel) fewer, the same reader.
    result = run_update(parent, site, tmp_path / "bayes", AdaptConfig(method="bayes", samples=3, epochs=2, patience=2))
    adapted = result.export
    assert adapted.path == result.export_dir and adapted.files.adaptation.parent_checksum == parent.files.checksum
    probs = predict_probs(adapted, records, 3, 7)
    assert np.all(np.isfinite(probs)) and adapted.files.adaptation.recalibration.is_identity
    fit = adapted.files.adaptation.model_extra["fit"]
    assert len(fit["validation_nll"]) >= 2 and 0 <= fit["best_epoch"] < len(fit["validation_nll"])
    # Training's death rate is ~0.35, the site's 0.8: the output bias alone can carry most of that.
    assert metrics.predictive_mean(probs).mean() > before + 0.1, (before, metrics.predictive_mean(probs).mean())
    assert adapted.files.adaptation.model_extra["updated_parts"]["normal_factor_sites"] > 0
    local = read_local(parent, site, "train", sample_size=None, seed=0)
    for method in ("finetune", "retrain"):  # one epoch: that the loop runs and keeps an epoch is what is checked
        update = adapt(parent, local, AdaptConfig(method=method, samples=3, epochs=1, patience=1))
        fit = update.record["fit"]
        assert update.network is not None and update.recalibration == (0.0, 1.0)
        assert len(fit["validation_nll"]) == 2 and fit["best_epoch"] in (0, 1) and fit["steps"] > 0
        # update.probs: the updated network's predictions of the local admissions, through a fresh Predictor
        assert np.all(np.isfinite(update.probs)) and len(update.probs) == local.sample.n
