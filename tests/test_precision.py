"""Mixed precision on the CPU: bfloat16 layers train to within a tolerance of float32, while the
loss terms stay float32; float16 goes through a loss-scale optimizer (model.precision)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ehr_testdata import tiny_config_dict, write_data_dir

from model import inputs, losses, precision
from model.config import parse_config
from model.ehr_model import build_model
from model.train import train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("precision") / "data")


def test_policy_names_and_the_float16_restriction():
    assert precision.resolve(False) == "float32"
    assert precision.resolve(True) == "mixed_bfloat16"  # no GPU here: the CPU has bfloat16
    assert precision.resolve("mixed_float16") == "mixed_float16"
    precision.check("mixed_float16", 1.0)
    with pytest.raises(ValueError, match="fast_weight_lr_multiplier"):
        precision.check("mixed_float16", 2.0)
    assert parse_config(tiny_config_dict(mixed_precision="mixed_bfloat16")).train.mixed_precision == "mixed_bfloat16"


def test_bfloat16_layers_but_float32_likelihood_and_kl(data):
    config = parse_config(tiny_config_dict())
    files = inputs.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    with precision.policy_scope("mixed_bfloat16"):
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


def test_bfloat16_training_ends_near_float32(data, tmp_path):
    ends = {}
    for policy in ("float32", "mixed_bfloat16"):
        config = parse_config(tiny_config_dict(steps=60, mixed_precision=policy if policy != "float32" else False,
                                               kl_scale=0.05, eval_every_steps=60, learning_rate=0.003))
        result = train(config, data, tmp_path / policy, progress=False, export_model=False)
        ends[policy] = result.validation[-1]["mixture_nll"], result.history[-1]["kl"]
    # Same seed and batches; only the layers' arithmetic differs: validation NLL within 0.05 nats
    # (it is ~0.66 here; a smaller learning rate keeps the short trajectories from parting),
    # the KL (of float32 variables) within 1%.
    assert ends["mixed_bfloat16"][0] == pytest.approx(ends["float32"][0], abs=0.05)
    assert ends["mixed_bfloat16"][1] == pytest.approx(ends["float32"][1], rel=0.01)


def test_float16_runs_through_one_loss_scaled_optimizer(data, tmp_path):
    config = parse_config(tiny_config_dict(steps=5, mixed_precision="mixed_float16", log_every_steps=1))
    result = train(config, data, tmp_path / "f16", progress=False, export_model=False)
    assert result.step == 5 and all(np.isfinite(row["loss"]) for row in result.history)
    names = tf.train.list_variables(str(tmp_path / "f16" / "checkpoints"))
    assert any("loss_scale" in name for name, _ in names)  # the dynamic scale is checkpointed
    # One optimizer carries every weight: the fast one has no slots.
    assert not any(name.startswith("fast_optimizer/") and "OPTIMIZER_SLOT" not in name and "iter" not in name
                   for name, _ in names if "/m/" in name or "/v/" in name)
