"""A k-tied EHR run end to end: trained by ehr-train's code, evaluated by ehr-eval, exported, served
and analysed, with the same numbers everywhere for a fixed seed."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from model import data_folder
from model.cli import ehr_analyze, ehr_eval
from tests.support.ehr_testdata import read_json, tiny_config_dict


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synthetic_data):
    from model.ehr.config import parse_config
    from model.ehr.train import train

    base = tmp_path_factory.mktemp("ktied_run")
    data, run = synthetic_data, base / "run"
    # 20 steps: the checks compare the same weights through each road, not what they learnt.
    raw = tiny_config_dict("ktied_normal", steps=20, kl_scale=0.05)
    raw["model"].update(prior_stddev=1.0, ktied_rank=2)
    train(parse_config(raw), data, run, progress=False, truth_path=data / "SYNTH_TRUTH.csv")
    # ehr-eval on the test split, S = 4, seed 3: the numbers everything else must reproduce.
    assert ehr_eval.main(["--model", str(run), "--data", str(data), "--split", "test", "--samples", "4",
                          "--seed", "3", "--out", str(base / "eval"), "--bootstrap", "20", "--no-progress"]) == 0
    return {"data": data, "run": run, "export": run / "export", "eval": base / "eval"}


@pytest.mark.slow  # ~1-2 min on 2 busy cores: the Keras-RNN Flipout LSTM traces slowly
def test_service_gives_ehr_eval_numbers(trained):
    from serving.inference.served_model import ServedModel

    card = read_json(trained["export"] / "model_card.json")
    assert (card["method"], card["ensemble_size"]) == ("ktied_normal", 1)
    with open(trained["eval"] / "predictions.csv") as f:
        p_eval = np.array([float(r["P_MEAN"]) for r in csv.DictReader(f)])
    records = data_folder.read_split(data_folder.load_data_files(trained["data"]), "test").records
    served = ServedModel.load(trained["export"]).forward(records, 4, 3)
    np.testing.assert_allclose(served.mean(axis=1), p_eval, atol=2e-6)
    # The weights are sampled: the S draws of one admission differ.
    assert np.ptp(served, axis=1).max() > 1e-6


@pytest.mark.slow
def test_posterior_rank_of_an_ehr_run(trained, tmp_path):
    out = tmp_path / "rank"
    assert ehr_analyze.main(["posterior-rank", "--model", str(trained["run"]), "--data", str(trained["data"]),
                             "--split", "test", "--samples", "4", "--seed", "3", "--out", str(out)]) == 0
    report = json.loads((out / "posterior_rank.json").read_text())
    families = {row["site"]: row["family"] for row in report["sites"]}
    assert families == {"code_embedding/embeddings": "embedding", "lstm_cell/kernel": "ktied_normal",
                        "lstm_cell/recurrent_kernel": "ktied_normal", "hidden/kernel": "ktied_normal",
                        "logit/kernel": "ktied_normal"}
    for row in report["sites"]:
        if row["family"] == "ktied_normal":  # rank <= k = 2 by construction
            assert row["variance_rank2"] == pytest.approx(1.0, abs=1e-5)
    # The unmodified posterior (restored from the checkpoint, not the export) scores what ehr-eval
    # scores for the same split, S and seed.
    ehr_eval = read_json(trained["eval"] / "metrics.json")["overall"]
    full = report["evaluation"]["full"]
    for key in ("nll", "auc_roc", "ece"):
        assert full[key] == pytest.approx(ehr_eval[key], abs=1e-5)
    # Only the embeddings are replaceable here, so the rank-k rows are the embedding replacement.
    assert set(report["evaluation"]) == {"full", "rank 1", "rank 2", "rank 3"}
