"""Pipeline config: defaults, the shipped YAML, and errors that name the offending field."""
from __future__ import annotations

import json
import re

import pydantic
import pytest
import yaml

from ehr_base.yaml_config import ConfigError
from ehr_pipeline.contract import (
    SPLIT_NAMES,
    BaggingConfig,
    PipelineConfig,
    load_pipeline_config,
    parse_pipeline_config,
    spec,
)
from tests.support.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "configs" / "pipeline.yaml"


def write(tmp_path, text: str):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def test_defaults():
    cfg = load_pipeline_config(None)
    assert cfg == PipelineConfig()
    assert cfg.trigger_offset_seconds == 86400 and cfg.min_age_years == 18.0
    assert cfg.bagging == BaggingConfig(bagging_time_precision=86400, bagging_aggregate_older_than=-1, max_bags=30)
    assert (cfg.splits.train, cfg.splits.validation, cfg.splits.test) == (0.8, 0.1, 0.1)
    assert cfg.sources == spec.SOURCES
    assert SPLIT_NAMES == ("train", "validation", "test")


def _keys(data: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in data.items():
        out.add(prefix + key)
        if isinstance(value, dict):
            out |= _keys(value, f"{prefix}{key}.")
    return out


def test_shipped_yaml_lists_every_key_with_the_default_and_a_comment():
    data = yaml.safe_load(SHIPPED.read_text())
    assert _keys(data) == _keys(PipelineConfig().to_dict())
    assert load_pipeline_config(SHIPPED) == PipelineConfig()
    lines = SHIPPED.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*[a-z_]+:", line):
            assert "#" in line or lines[i - 1].lstrip().startswith("#"), f"no comment for: {line.strip()}"


@pytest.mark.parametrize("text, field", [
    ("max_bag: 3\n", "max_bag"),
    ("bagging:\n  max_bag: 3\n", "bagging.max_bag"),
    ("vocab:\n  min_count: 5\n  maxsize: 10\n", "vocab.maxsize"),
])
def test_unknown_key_is_an_error_naming_the_key(tmp_path, text, field):
    with pytest.raises(ConfigError, match=rf"{re.escape(field)}: Extra inputs are not permitted"):
        load_pipeline_config(write(tmp_path, text))


def test_split_fractions_must_sum_to_one(tmp_path):
    with pytest.raises(ConfigError, match=r"splits: .*sum to 1"):
        load_pipeline_config(write(tmp_path, "splits: {train: 0.7, validation: 0.1, test: 0.1}\n"))
    ok = load_pipeline_config(write(tmp_path, "splits: {train: 0.7, validation: 0.2, test: 0.1}\n"))
    assert ok.splits.validation == 0.2  # 0.7 + 0.2 + 0.1 != 1.0 exactly in binary; tolerated


@pytest.mark.parametrize("data, field", [
    ({"bagging": {"bagging_time_precision": 0}}, "bagging.bagging_time_precision"),
    ({"bagging": {"bagging_time_precision": 3600.5}}, "bagging.bagging_time_precision"),
    ({"bagging": {"bagging_aggregate_older_than": -2}}, "bagging.bagging_aggregate_older_than"),
    ({"bagging": {"max_bags": True}}, "bagging.max_bags"),
    ({"bagging": {"max_bags": "30"}}, "bagging.max_bags"),
    ({"trigger_offset_seconds": -1}, "trigger_offset_seconds"),
    ({"splits": {"test": 1.5}}, "splits.test"),
    ({"num_shards": {"train": 0}}, "num_shards.train"),
    ({"numeric": {"clip_z": 0}}, "numeric.clip_z"),
    ({"sources": ["lab", "blood"]}, "sources.1"),
    ({"sources": ["lab", "lab"]}, "sources"),
    ({"sources": []}, "sources"),
    ({"split_salt": ""}, "split_salt"),
])
def test_invalid_values_are_errors_naming_the_field(data, field):
    with pytest.raises(ConfigError, match=rf"^<dict>: invalid pipeline config: (.*; )?{re.escape(field)}: "):
        parse_pipeline_config(data)


def test_a_subset_of_sources_and_ints_for_floats_are_accepted():
    cfg = parse_pipeline_config({"sources": ["lab", "chart"], "min_age_years": 16})
    assert cfg.sources == ("lab", "chart") and cfg.min_age_years == 16.0


def test_to_dict_is_json_and_round_trips():
    cfg = parse_pipeline_config({"bagging": {"bagging_aggregate_older_than": 7 * 86400, "max_bags": 12}})
    data = json.loads(json.dumps(cfg.to_dict()))
    assert parse_pipeline_config(data) == cfg
    assert data["bagging"]["max_bags"] == 12


def test_empty_file_means_defaults_and_bad_files_are_config_errors(tmp_path):
    assert load_pipeline_config(write(tmp_path, "# nothing set\n")) == PipelineConfig()
    with pytest.raises(ConfigError, match="mapping"):
        load_pipeline_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline_config(write(tmp_path, "bagging: {max_bags: [\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_pipeline_config(tmp_path / "missing.yaml")


def test_configs_are_frozen():
    cfg = PipelineConfig()
    with pytest.raises(pydantic.ValidationError):
        cfg.min_age_years = 3.0  # type: ignore[misc]


@pytest.mark.parametrize("loader, text, want", [
    ("pipeline", "bagging:\n  max_bag: 3\nsplits: {test: 1.5}\n",
     "invalid pipeline config: bagging.max_bag: Extra inputs are not permitted; splits.test: Input should be less "
     "than or equal to 1"),
    ("experiment", "model:\n  rnn_dim: 0\n", "invalid experiment config: model.rnn_dim: Input should be greater "
                                               "than 0"),
    ("image", "task: image\nmodel:\n  posterior: {ensemble_size: 2.0}\n",
     "invalid image config: model.posterior.ensemble_size: Input should be a valid integer"),
    ("image", "task: image\nmodel:\n  posterior: {method: mean_field}\n",
     "invalid image config: model.posterior: ensemble_size must be 1 for method 'mean_field'"),
])
def test_every_yaml_config_reports_the_file_and_fields_on_one_line(tmp_path, loader, text, want):
    from model.image import config as image
    from model.ehr import config as experiment

    load = {"pipeline": load_pipeline_config, "experiment": experiment.load_config, "image": image.load_config}
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load[loader](path)
    assert str(err.value).startswith(f"{path}: {want}") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^\S+: not valid YAML: [^\n]+$"):
        load[loader](write(tmp_path, "model: {rnn_dim: [\n"))
