"""Bella: SVGD against a known Gaussian and a naive reference, adapters against per-particle manual
computations, and a tiny base -> Bella run (frozen base, export = ehr-eval = service)."""
from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest
import tensorflow as tf

from model import data_folder
from model.layers import bella, svgd
from model.layers.posterior import PosteriorConfig
from model.layers.rank1_lstm import Rank1LSTM
from tests.support.ehr_testdata import read_json, tiny_config_dict

# --------------------------------------------------------------------------- SVGD


def _naive_svgd(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """phi(x_i) = 1/P sum_j [k(x_j, x_i) g_j + grad_{x_j} k(x_j, x_i)], pair by pair, with the median bandwidth."""
    p = x.shape[0]
    d2 = np.array([[np.sum((a - b) ** 2) for b in x] for a in x])
    h = np.median(d2) / np.log(p + 1)
    h = h if h > 0 else 1.0
    phi = np.zeros_like(x)
    for i, j in itertools.product(range(p), range(p)):
        k = np.exp(-np.sum((x[j] - x[i]) ** 2) / h)
        phi[i] += k * g[j] + (-2.0 / h) * (x[j] - x[i]) * k
    return phi / p


def test_svgd_direction_matches_a_pairwise_reference():
    rng = np.random.default_rng(0)
    x, g = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    np.testing.assert_allclose(svgd.svgd_direction(tf.constant(x), tf.constant(g)).numpy(), _naive_svgd(x, g),
                               rtol=1e-10, atol=1e-12)


def test_svgd_with_one_particle_is_gradient_ascent():
    x, g = tf.constant([[0.3, -1.0, 2.0]]), tf.constant([[1.5, 0.2, -0.7]])
    np.testing.assert_array_equal(svgd.svgd_direction(x, g).numpy(), g.numpy())


MU = np.array([1.0, -2.0])
SIGMA = np.array([[1.0, 0.6], [0.6, 2.0]])


def _run_particles(direction, steps: int = 1500, lr: float = 0.1) -> np.ndarray:
    """50 particles from N(0, 0.5^2 I) moved along direction(x, grad log N(MU, SIGMA)) with plain steps."""
    precision = tf.constant(np.linalg.inv(SIGMA))
    mu = tf.constant(MU)

    @tf.function
    def step(x):
        grad = -tf.matmul(x - mu, precision)  # grad log N(x; MU, SIGMA)
        return x + lr * direction(x, grad)

    x = tf.constant(np.random.default_rng(1).normal(scale=0.5, size=(50, 2)))
    for _ in range(steps):
        x = step(x)
    return x.numpy()


def test_svgd_particles_reach_the_mean_and_covariance_of_a_gaussian():
    x = _run_particles(svgd.svgd_direction)
    np.testing.assert_allclose(x.mean(axis=0), MU, atol=0.02)
    # 50 particles under-spread a little (about 12 % here, a known finite-particle bias of SVGD).
    np.testing.assert_allclose(np.cov(x, rowvar=False), SIGMA, rtol=0.2)
    # Without the repulsive term (the drive alone) the same run collapses onto the mode.
    drive_only = _run_particles(lambda x, g: tf.matmul(tf.exp(-svgd.squared_distances(x) / svgd.median_bandwidth(
        svgd.squared_distances(x))), g) / 50.0)
    assert np.linalg.det(np.cov(drive_only, rowvar=False)) < 0.01 * np.linalg.det(SIGMA)


def test_particle_update_with_one_particle_descends_the_loss_gradient():
    layer = bella.BellaDense(3, PosteriorConfig(method="bella", ensemble_size=1, prior_mean=0.0, adapter_rank=2))
    layer.build([None, 4])
    layer.adapter_b.assign(tf.random.normal(layer.adapter_b.shape))
    model = tf.keras.Sequential([layer])
    x, y = tf.random.normal([6, 4]), tf.random.normal([6, 3])
    variables = bella.adapter_variables(model)
    for update in ("ensemble", "svgd"):
        particles = bella.ParticleUpdate(model, update, num_train_examples=100)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(particles.particle_losses(tf.reduce_mean(tf.square(layer(x) - y))[None]))
        grads = tape.gradient(loss, variables)
        for got, want in zip(particles.gradients(grads, variables), grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- adapters

P, R = 3, 2


def _config(**kw) -> PosteriorConfig:
    return PosteriorConfig(method="bella", ensemble_size=P, prior_mean=0.0, adapter_rank=R, **kw)


def _randomise_b(layer) -> None:
    for v in layer.adapter_variables():
        if "adapter_b" in v.name:
            v.assign(tf.random.normal(v.shape, stddev=0.3))


def test_dense_and_conv_adapters_are_the_per_particle_weights():
    x = tf.random.normal([P * 5, 6])
    dense = bella.BellaDense(4, _config(), activation="tanh")
    dense(x)
    dense.bias.assign(tf.random.normal([4]))
    _randomise_b(dense)
    w, a, b = dense.kernel.numpy(), dense.adapter_a.numpy(), dense.adapter_b.numpy()
    want = np.concatenate([np.tanh(xp @ (w + a[p] @ b[p]) + dense.bias.numpy())
                           for p, xp in enumerate(np.split(x.numpy(), P))])
    np.testing.assert_allclose(dense(x).numpy(), want, rtol=1e-5, atol=1e-5)

    images = tf.random.normal([P * 2, 7, 7, 3])
    conv = bella.BellaConv2D(5, 3, _config(), strides=2, padding="same", use_bias=False)
    conv(images)
    _randomise_b(conv)
    delta = np.matmul(conv.adapter_a.numpy(), conv.adapter_b.numpy()).reshape(P, 3, 3, 3, 5)
    want = np.concatenate([tf.nn.conv2d(xp, conv.kernel.numpy() + delta[p], 2, "SAME").numpy()
                           for p, xp in enumerate(tf.split(images, P))])
    np.testing.assert_allclose(conv(images).numpy(), want, rtol=1e-5, atol=1e-5)


def test_lstm_adapters_equal_a_keras_lstm_per_particle():
    cell = bella.BellaLSTMCell(8, _config())
    layer = Rank1LSTM(cell)
    x = tf.random.normal([P * 4, 5, 6])
    lengths = tf.constant([5, 3, 1, 4] * P)
    layer(x, lengths=lengths)
    cell.bias.assign(tf.random.normal(cell.bias.shape))
    _randomise_b(cell)
    got = layer(x, lengths=lengths).numpy()
    kernels, recurrent = (k.numpy() for k in cell.particle_kernels())
    for p in range(P):
        plain = tf.keras.layers.LSTMCell(8)
        rnn = tf.keras.layers.RNN(plain)
        rows = slice(4 * p, 4 * (p + 1))
        mask = tf.sequence_mask(lengths[rows], 5)
        rnn(x[rows], mask=mask)
        plain.set_weights([kernels[p], recurrent[p], cell.bias.numpy()])
        np.testing.assert_allclose(got[rows], rnn(x[rows], mask=mask).numpy(), rtol=1e-5, atol=1e-5)
    # The cell's own step (tf.keras.layers.RNN) computes the same.
    np.testing.assert_allclose(tf.keras.layers.RNN(cell)(x, mask=tf.sequence_mask(lengths, 5)).numpy(), got,
                               rtol=1e-5, atol=1e-5)
    # The bfloat16 inference path projects all steps with the per-particle kernels at once.
    low = tf.function(lambda: layer(x, lengths=lengths, matmul_dtype="bfloat16"))().numpy()
    np.testing.assert_allclose(low, got, atol=2e-2)


def test_zero_b_leaves_the_base_image_model_unchanged():
    from model.image.config import ImageModelConfig
    from model.image.models import build_model

    base = build_model(ImageModelConfig(depth=10, width=1, posterior=PosteriorConfig(method="deterministic",
                                                                                      ensemble_size=1)), (8, 8, 1), 10)
    model = build_model(ImageModelConfig(depth=10, width=1, posterior=PosteriorConfig(
        method="bella", ensemble_size=P, prior_mean=0.0, adapter_rank=R)), (8, 8, 1), 10)
    # Train-mode batch norm statistics once, so the moving statistics are not the identity.
    base(tf.random.uniform([16, 8, 8, 1]), training=True)
    assert bella.copy_base_weights(base, model) == len(base.variables)
    bella.freeze_base(model)
    images = tf.random.uniform([6, 8, 8, 1])
    want = base.predict_logits(images, 1).numpy()  # [6, 1, 10]
    got = model.predict_logits(images, 1).numpy()  # [6, P, 10]
    np.testing.assert_allclose(got, np.repeat(want, P, axis=1), rtol=1e-5, atol=1e-5)
    # Only the adapters train; a frozen batch norm normalises with the base's moving statistics.
    assert {v.ref() for v in model.trainable_variables} == {v.ref() for v in bella.adapter_variables(model)}
    np.testing.assert_allclose(model(images, training=True).numpy(), got, rtol=1e-5, atol=1e-5)


def test_bella_needs_a_zero_prior_mean_and_a_shared_batch_norm():
    with pytest.raises(ValueError, match="prior_mean must be 0"):
        PosteriorConfig(method="bella", prior_mean=1.0)
    with pytest.raises(ValueError, match="particle_update"):
        PosteriorConfig(method="bella", prior_mean=0.0, particle_update="adam")
    from ehr_base.yaml_config import ConfigError
    from model.image.config import parse_config

    with pytest.raises(ConfigError, match="batch_norm 'shared'"):
        parse_config({"task": "image", "model": {"batch_norm": "per_member", "posterior": {
            "method": "bella", "prior_mean": 0.0}}})


# --------------------------------------------------------------------------- a tiny base -> Bella run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic_data):
    from model.ehr.config import parse_config
    from model.ehr.train import train

    base = tmp_path_factory.mktemp("bella")
    data = synthetic_data
    # Short runs: the checks are on which weights move and on the export, not on what was learnt.
    det = train(parse_config(tiny_config_dict("deterministic", steps=10)), data, base / "det", export_model=False)
    config = tiny_config_dict("deterministic", steps=10)
    config["name"] = "tiny_bella"
    config["model"].update(method="bella", ensemble_size=3, prior_mean=0.0, prior_stddev=1.0, adapter_rank=2,
                           particle_update="svgd")
    config["eval"]["num_samples"] = 1
    result = train(parse_config(config), data, base / "bella", progress=False, base_dir=det.out_dir)
    return {"data": data, "det": det.out_dir, "bella": result.out_dir, "export": result.export_dir}


@pytest.mark.slow
def test_training_moves_only_the_adapters_and_records_the_base(runs):
    from model.ehr.train import load_run
    from model.fit.training_loop import model_checkpoint

    _, det_model, _, _ = load_run(runs["det"], runs["data"])
    _, model, _, step = load_run(runs["bella"], runs["data"])
    assert step == 10
    adapters = {v.ref() for v in bella.adapter_variables(model)}
    by_name = {v.name: v for v in det_model.variables}
    frozen = [v for v in model.variables if v.ref() not in adapters]
    assert len(frozen) == len(by_name)
    for v in frozen:  # bit for bit: the optimizer never saw them
        np.testing.assert_array_equal(v.numpy(), by_name[v.name].numpy(), err_msg=v.name)
    b_norms = [np.abs(v.numpy()).max() for v in bella.adapter_variables(model) if "adapter_b" in v.name]
    assert min(b_norms) > 0  # every B left zero: the particles moved
    card = read_json(runs["export"] / "model_card.json")
    assert card["base"]["checkpoint_sha256"] == bella.checkpoint_sha256(model_checkpoint(runs["det"]))
    assert (card["method"], card["ensemble_size"]) == ("bella_svgd", 3)
    assert card["num_parameters"] == sum(v.shape.num_elements() for v in bella.adapter_variables(model))


@pytest.mark.slow
def test_export_serves_what_ehr_eval_reports(runs, tmp_path):
    from model.cli.ehr_eval import main as eval_main
    from serving.inference.served_model import ServedModel, summarise

    out = tmp_path / "eval"
    assert eval_main(["--model", str(runs["export"]), "--data", str(runs["data"]), "--samples", "1", "--seed", "7",
                      "--bootstrap", "20", "--out", str(out), "--no-progress"]) == 0
    with open(out / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    split_records = data_folder.read_split(data_folder.load_data_files(runs["data"]), "test")
    records, hadm_ids = split_records.records, split_records.hadm_ids
    assert [int(r["HADM_ID"]) for r in rows] == [int(h) for h in hadm_ids]
    served = ServedModel.load(runs["export"])
    probs = served.forward(records, 1, 7)  # [N, K]: one sample per particle
    summary = summarise(probs, served.export, 1)
    np.testing.assert_allclose(summary.probability, [float(r["P_MEAN"]) for r in rows], atol=2e-6)
    np.testing.assert_allclose(summary.epistemic, [float(r["mutual_information"]) for r in rows], atol=2e-6)
    np.testing.assert_array_equal(summary.members, probs)  # S = 1: member k is particle k
    assert summary.epistemic.max() > 0  # the particles disagree
