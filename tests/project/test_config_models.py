"""The config bases every layer's configs stand on (ehr_base.yaml_config): what they reject, and who uses which."""
from __future__ import annotations

import importlib
import inspect

import pydantic
import pytest

from ehr_base.yaml_config import ConfigModel, StrictConfigModel


class _Lax(ConfigModel):
    n: int = 1


class _Strict(StrictConfigModel):
    n: int = 1


def test_both_bases_reject_unknown_fields_and_changes():
    for model in (_Lax, _Strict):
        with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
            model.model_validate({"n": 2, "m": 3})
        with pytest.raises(pydantic.ValidationError, match="frozen"):
            model().n = 2


def test_only_the_strict_base_refuses_to_convert():
    assert _Lax.model_validate({"n": "3"}).n == 3
    with pytest.raises(pydantic.ValidationError, match="valid integer"):
        _Strict.model_validate({"n": "3"})


# Each module's config sections and the base they kept when four private copies of it became these two.
@pytest.mark.parametrize("module, base", [
    ("ehr_pipeline.contract.config", StrictConfigModel),
    ("ehr_pipeline.meds.code_map", StrictConfigModel),
    ("model.ehr.config", ConfigModel),
    ("model.image.config", ConfigModel),
])
def test_each_config_module_keeps_its_base(module, base):
    sections = [c for _, c in inspect.getmembers(importlib.import_module(module), inspect.isclass)
                if c.__module__ == module and issubclass(c, pydantic.BaseModel)]
    assert sections
    for section in sections:
        assert section.model_config["extra"] == "forbid" and section.model_config["frozen"], section
        assert section.model_config.get("strict", False) == (base is StrictConfigModel), section
