"""The posterior-rank analysis (paper 003, Section 2): a planted rank is recovered, the rank-k
replacement is the truncated SVD clipped at zero, and ehr-analyze re-evaluates real runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from model.cli import ehr_analyze
from model.evaluation import posterior_rank as pr
from model.layers import factory
from model.layers.posterior import PosteriorConfig
from tests.support.paths import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"


def _planted(m, n, rank, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.1, 1.0, (m, rank)) @ rng.uniform(0.1, 1.0, (rank, n)) * 0.05


def test_spectrum_helpers_against_numpy():
    a = np.random.default_rng(1).uniform(size=(7, 4))
    values = pr.singular_values(a)
    np.testing.assert_allclose(values, np.sqrt(np.sort(np.linalg.eigvalsh(a.T @ a))[::-1]), rtol=1e-10)
    assert pr.variance_explained(values, 4) == pytest.approx(1.0)
    assert pr.variance_explained(values, 1) == pytest.approx(values[0] ** 2 / np.sum(a ** 2))
    # Rank-k replacement = truncated SVD, negatives clipped (App. D.3).
    low = pr.low_rank_stddevs(a, 1)
    u, s, vt = np.linalg.svd(a)
    np.testing.assert_allclose(low, np.maximum(s[0] * np.outer(u[:, 0], vt[0]), 0))
    assert low.min() >= 0


@pytest.mark.parametrize("planted", [1, 2, 3])
def test_planted_rank_is_recovered_from_a_mean_field_layer(planted):
    layer = factory.dense(12, PosteriorConfig(method="mean_field", ensemble_size=1), use_bias=False)
    model = tf.keras.Sequential([layer])
    model(tf.zeros([1, 20]))
    (site,) = pr.stddev_sites(model)
    assert (site.name.endswith("/kernel"), site.family) == (True, "mean_field")
    a = _planted(20, 12, planted)
    site.assign(a)
    np.testing.assert_allclose(site.matrix(), a, rtol=1e-4, atol=1e-6)  # float32 softplus round trip
    (row,) = pr.spectrum_table([site], ranks=(1, 2, 3))
    assert pr.numerical_rank(np.array(row["singular_values"]), 1e-4) == planted
    assert row[f"variance_rank{planted}"] == pytest.approx(1.0, abs=1e-6)
    if planted > 1:
        assert row[f"variance_rank{planted - 1}"] < 1 - 1e-4
    raw_before = site.raw.numpy().copy()
    with pr.replaced_by_rank([site], planted):  # the planted rank loses nothing
        np.testing.assert_allclose(site.matrix(), a, rtol=1e-3, atol=1e-6)
    with pr.replaced_by_rank([site], 1):
        np.testing.assert_allclose(site.matrix(), np.maximum(pr.low_rank_stddevs(a, 1), pr.MIN_STDDEV),
                                   rtol=1e-3, atol=1e-6)
    np.testing.assert_array_equal(site.raw.numpy(), raw_before)  # restored exactly


def test_ktied_sites_are_reported_not_replaced():
    layer = factory.dense(6, PosteriorConfig(method="ktied_normal", ensemble_size=1, ktied_rank=2))
    model = tf.keras.Sequential([layer])
    model(tf.zeros([1, 9]))
    (site,) = pr.stddev_sites(model)
    assert site.family == "ktied_normal" and site.raw is None
    assert pr.numerical_rank(pr.singular_values(site.matrix()), 1e-5) <= 2
    with pr.replaced_by_rank([site], 1) as ctx:
        assert ctx.sites == []


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    from model.image.config import load_config
    from model.image.train import train

    config = load_config(CONFIGS / "image_digits_mean_field.yaml").with_overrides(
        model={"architecture": "mlp", "depth": 2, "width": 16,
               "posterior": {"method": "mean_field", "ensemble_size": 1, "prior_stddev": 0.3,
                             "dropout_rate": 1e-4, "l2": 0.0}},
        train={"epochs": 1.0, "max_steps": 8, "kl_annealing_epochs": 0.0},
        eval={"num_samples": 2})
    out = tmp_path_factory.mktemp("rank_image") / "run"
    train(config, out, progress=False, evaluate=False)
    return out


def test_ehr_analyze_posterior_rank_on_an_image_run(image_run, tmp_path, capsys):
    out = tmp_path / "analysis"
    code = ehr_analyze.main(["posterior-rank", "--model", str(image_run), "--split", "validation",
                             "--ranks", "1", "2", "--seed", "5", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "posterior_rank.json").read_text())
    assert [row["site"].split("/")[0] for row in report["sites"]] == ["dense1", "dense2", "head"]
    assert [row["shape"] for row in report["sites"]] == [[64, 16], [16, 16], [16, 10]]
    assert set(report["evaluation"]) == {"full", "rank 1", "rank 2"}
    assert (out / "singular_values.png").read_bytes()[:4] == b"\x89PNG"
    assert "variance rank 2" in capsys.readouterr().out
    # "full" is the unmodified run evaluated with the same seed by the image evaluation code.
    from model.image import evaluate as evaluation
    from model.image.train import load_run

    config, model, data, _ = load_run(image_run)
    tf.random.set_seed(5)
    logits = evaluation.predict_logits(model, data.x_val, num_samples=2, batch_size=config.eval.batch_size)
    direct = evaluation.classification_metrics(logits, data.y_val, config.eval.num_bins)
    assert report["evaluation"]["full"]["accuracy"] == pytest.approx(direct["accuracy"])
    assert report["evaluation"]["full"]["nll"] == pytest.approx(direct["nll"], rel=1e-5)


def test_ehr_analyze_refuses_runs_without_gaussian_stddevs_and_ehr_runs_without_data(tmp_path, capsys):
    assert ehr_analyze.main(["posterior-rank", "--model", str(tmp_path)]) == 2
    assert "--data" in capsys.readouterr().err
