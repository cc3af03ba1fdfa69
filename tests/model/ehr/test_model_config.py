"""Experiment configs: every shipped YAML validates, Table 7 values are what the paper says,
and a bad key or value fails naming the key (no TensorFlow needed)."""
from __future__ import annotations


import pytest
import yaml

from ehr_base.yaml_config import ConfigError
from model.ehr.config import ExperimentConfig, load_config, parse_config
from tests.support.paths import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"
METHOD_FILES = {
    "ehr_deterministic.yaml": ("deterministic", "normal"),
    "ehr_batchensemble.yaml": ("batchensemble", "normal"),
    "ehr_bayesian_embeddings.yaml": ("bayesian_embeddings", "normal"),
    "ehr_fully_bayesian.yaml": ("fully_bayesian", "normal"),
    "ehr_rank1_normal.yaml": ("rank1", "normal"),
    "ehr_rank1_cauchy.yaml": ("rank1", "cauchy"),
    "ehr_ktied_normal.yaml": ("ktied_normal", "normal"),
}


@pytest.mark.parametrize("name", sorted(METHOD_FILES) + ["ehr_demo.yaml"])
def test_every_shipped_config_loads(name):
    config = load_config(CONFIGS / name)
    assert isinstance(config, ExperimentConfig)
    if name in METHOD_FILES:
        assert (config.model.method, config.model.distribution) == METHOD_FILES[name]


def test_rank1_configs_carry_table_7():
    normal = load_config(CONFIGS / "ehr_rank1_normal.yaml")
    cauchy = load_config(CONFIGS / "ehr_rank1_cauchy.yaml")
    for c in (normal, cauchy):
        assert (c.model.ensemble_size, c.model.rnn_dim, c.model.hidden_layer_dim) == (4, 512, 512)
        assert c.model.l2 == 1e-4 and c.model.random_sign_init == 0.5 and c.eval.num_bins == 15
    assert (normal.model.prior_mean, normal.model.prior_stddev, normal.model.dropout_rate) == (1.0, 0.1, 1e-3)
    assert (normal.train.batch_size, normal.train.learning_rate, normal.train.clip_norm) == (128, 3.0352e-4, 7.29199)
    assert (normal.train.kl_annealing_steps, normal.train.max_steps, normal.model.embedding_dim) == (20000, 25000, 32)
    assert (cauchy.model.prior_mean, cauchy.model.prior_stddev, cauchy.model.dropout_rate) == (0.5, 1e-4, 5e-7)
    assert (cauchy.train.batch_size, cauchy.train.learning_rate, cauchy.train.clip_norm) == (32, 1e-3, 1.83987)
    assert (cauchy.train.fast_weight_lr_multiplier, cauchy.train.kl_annealing_steps) == (0.575, 694216)
    assert (cauchy.train.max_steps, cauchy.model.embedding_dim) == (12000, 16)


@pytest.mark.parametrize("data, key", [
    ({"train": {"learning_rat": 1e-3}}, "train.learning_rat"),
    ({"model": {"rnn_dims": 8}}, "model.rnn_dims"),
    ({"evaluation": {}}, "evaluation"),
    ({"model": {"method": "mc_dropout"}}, "model.method"),
    ({"model": {"rnn_dim": 0}}, "model.rnn_dim"),
    ({"model": {"rnn_dim": 1.5}}, "model.rnn_dim"),
    ({"model": {"dropout_rate": 1.0}}, "model.dropout_rate"),
    ({"train": {"loss": "logmix"}}, "train.loss"),
    ({"train": {"max_steps": True}}, "train.max_steps"),
    ({"eval": {"num_samples": 101}}, "eval.num_samples"),
    ({"eval": {"referral_measure": "variance"}}, "eval.referral_measure"),
])
def test_bad_keys_and_values_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config(data, source="x.yaml")


@pytest.mark.parametrize("model, match", [
    ({"method": "deterministic", "ensemble_size": 4}, "ensemble_size must be 1"),
    ({"method": "batchensemble", "distribution": "cauchy"}, "only applies to method 'rank1'"),
    ({"method": "bella", "ensemble_size": 4}, "model: prior_mean must be 0 for method 'bella', got 1.0"),
    ({"method": "fully_bayesian", "ensemble_size": 1, "wide": True, "wide_l1": 0.01}, "has none"),
    ({"wide_posterior": "laplace"}, "needs wide: true"),
])
def test_inconsistent_method_settings_are_refused(model, match):
    with pytest.raises(ConfigError, match=match):
        parse_config({"model": model})


def test_yaml_file_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "train": {"batch_sise": 4}}))
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid experiment config: train\.batch_sise: Extra inputs"):
        load_config(path)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_overrides_are_validated_and_leave_the_original_alone():
    base = parse_config({"train": {"max_steps": 100}})
    changed = base.with_overrides(train={"max_steps": 7, "seed": 3})
    assert (changed.train.max_steps, changed.train.seed, base.train.max_steps) == (7, 3, 100)
    with pytest.raises(ConfigError, match="train.max_stepz"):
        base.with_overrides(train={"max_stepz": 7})
    assert parse_config(base.to_dict()) == base  # the run folder's config.json round-trips
