"""Mixed precision on the CPU: a bfloat16 gradient step stays within a tolerance of float32's, while the
loss terms stay float32; float16 goes through a loss-scale optimizer (model.ehr.mixed_precision)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from model import data_folder
from model.fit import losses
from model.ehr import inputs, mixed_precision
from model.ehr.config import parse_config
from model.ehr.ehr_model import build_model
from model.ehr.train import train
from tests.support.ehr_testdata import tiny_config_dict


@pytest.fixture(scope="module")
def data(synthetic_data):
    return synthetic_data


def test_policy_names_and_the_float16_restriction():
    assert mixed_precision.resolve(False) == "float32"
    assert mixed_precision.resolve(True) == "mixed_bfloat16"  # no GPU here: the CPU has bfloat16
    assert mixed_precision.resolve("mixed_float16") == "mixed_float16"
    mixed_precision.check("mixed_float16", 1.0)
    with pytest.raises(ValueError, match="fast_weight_lr_multiplier"):
        mixed_precision.check("mixed_float16", 2.0)
    assert parse_config(tiny_config_dict(mixed_precision="mixed_bfloat16")).train.mixed_precision == "mixed_bfloat16"


def test_bfloat16_layers_but_float32_likelihood_and_kl(data):
    config = parse_config(tiny_config_dict())
    files = data_folder.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    with mixed_precision.policy_scope("mixed_bfloat16"):
        model = build_model(config.model, featurizer.vocab_size)
    assert tf.keras.mixed_precision.global_policy().name == "float32"  # not leaked
    features, labels = next(iter(inputs.dataset(files, featurizer, "train", 16)))
    logits = model(features, num_samples=1, training=True)
    dtypes = {layer.compute_dtype for layer in model.submodules if isinstance(layer, tf.keras.layers.Layer)}
    assert "bfloat16" in dtypes
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)
    nll, kl = losses.nll_loss(logits, labels), losses.kl_divergence(model)
    assert nll.dtype == tf.float32 and kl.dtype == tf.float32
    # The likelihood of a small probability is not rounded to bfloat16's 8 bits: p = 1e-4 -> NLL 9.21.
    tiny_p = tf.constant([[np.log(1e-4 / (1 - 1e-4))]], tf.bfloat16)
    assert float(losses.nll_loss(tiny_p, tf.constant([1.0]))) == pytest.approx(-np.log(1e-4), rel=1e-2)


def test_bfloat16_gradient_matches_float32_at_the_same_weights_and_noise(data):
    # Comparing whole training runs is chaotic: 60 steps on 160 admissions part by ~0.08 nats of
    # validation NLL on another CPU's kernels. One step from identical weights and identical noise
    # isolates what bfloat16 changes: the layers' arithmetic.
    config = parse_config(tiny_config_dict())
    files = data_folder.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    features, labels = next(iter(inputs.dataset(files, featurizer, "train", 64)))
    losses_, grads, weights = {}, {}, None
    for policy in ("float32", "mixed_bfloat16"):
        tf.keras.utils.set_random_seed(0)
        with mixed_precision.policy_scope(policy):
            model = build_model(config.model, featurizer.vocab_size)
        model(features, num_samples=1, training=True)
        if weights is None:
            weights = model.get_weights()
        else:
            model.set_weights(weights)
        tf.random.set_seed(1)  # the same noise stream (drawn in float32, then cast)
        with tf.GradientTape() as tape:
            loss = losses.nll_loss(model(features, num_samples=4, training=True), labels)
        gradient = tape.gradient(loss, model.trainable_variables)
        assert all(g is not None for g in gradient)
        losses_[policy] = float(loss)
        grads[policy] = np.concatenate([tf.reshape(tf.cast(g, tf.float32), [-1]).numpy() for g in gradient])
    a, b = grads["float32"], grads["mixed_bfloat16"]
    # Measured: loss 0.6807 vs 0.6808, cosine 0.9997, relative difference 2.6% (8 mantissa bits).
    assert losses_["mixed_bfloat16"] == pytest.approx(losses_["float32"], abs=0.01)
    assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99
    assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.1


def test_bfloat16_training_runs_and_keeps_float32_variables(data, tmp_path):
    # 10 steps reach a validation and two logged rows: enough to see bfloat16 train finitely and save float32.
    config = parse_config(tiny_config_dict(steps=10, mixed_precision="mixed_bfloat16", kl_scale=0.05,
                                           eval_every_steps=10, log_every_steps=5))
    result = train(config, data, tmp_path / "bf16", progress=False, export_model=False)
    assert result.step == 10 and all(np.isfinite(row["loss"]) and np.isfinite(row["kl"]) for row in result.history)
    assert np.isfinite(result.validation[-1]["mixture_nll"])
    dtypes = tf.train.load_checkpoint(str(tmp_path / "bf16" / "checkpoints")).get_variable_to_dtype_map()
    model_dtypes = [dtype for name, dtype in dtypes.items() if name.startswith("model/")]
    assert model_dtypes and set(model_dtypes) == {tf.float32}  # the layers compute in bfloat16 only


def test_float16_runs_through_one_loss_scaled_optimizer(data, tmp_path):
    config = parse_config(tiny_config_dict(steps=5, mixed_precision="mixed_float16", log_every_steps=1))
    result = train(config, data, tmp_path / "f16", progress=False, export_model=False)
    assert result.step == 5 and all(np.isfinite(row["loss"]) for row in result.history)
    names = [name for name, _ in tf.train.list_variables(str(tmp_path / "f16" / "checkpoints"))]
    assert any("loss_scale" in name for name in names)  # the dynamic scale is checkpointed
    # One optimizer carries every weight: Adam's two slots (m, v) per trainable variable are all the
    # slow optimizer's, none the fast one's. This Keras checkpoints slots as OPT/_variables/N/...
    # (a float32 run of the same config splits them, 24 slow and 32 fast).
    files = data_folder.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    model = build_model(config.model, featurizer.vocab_size)
    model(next(iter(inputs.dataset(files, featurizer, "train", 4)))[0], num_samples=1)
    slots = {opt: sum(name.startswith(f"{opt}/_variables/") for name in names)
             for opt in ("slow_optimizer", "fast_optimizer")}
    assert slots == {"slow_optimizer": 2 * len(model.trainable_variables), "fast_optimizer": 0}
