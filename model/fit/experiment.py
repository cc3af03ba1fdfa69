"""What every experiment config (the EHR model's and the image models') offers: ``ExperimentBase``.

The shared training loop (``training_loop``) reads a run's config through it, so the loop needs
neither trainer's own config module. Importing this module is cheap: no TensorFlow.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ehr_base.yaml_config import ConfigError


class ExperimentBase(BaseModel):
    """What every experiment config (EHR and image) offers: a JSON dict and validated overrides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def parse(cls, data: Any, source: str = "<dict>") -> ExperimentBase:
        """Validates parsed YAML/JSON into this config class; raises ConfigError naming each bad key."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every setting (for the run folder and the model card)."""
        return self.model_dump(mode="json")

    def with_overrides(self, **sections: dict[str, Any]) -> ExperimentBase:
        """A copy with some fields replaced, e.g. with_overrides(train={"max_steps": 10}); validated."""
        data = self.to_dict()
        for section, values in sections.items():
            if section not in data or not isinstance(data[section], dict):
                raise ConfigError(f"unknown config section {section!r}")
            data[section].update(values)
        return self.parse(data, source="<overrides>")

    def with_train_overrides(self, **values: Any) -> ExperimentBase:
        """A copy with the given train settings replaced; None means "keep" (CLI flags left unset)."""
        values = {k: v for k, v in values.items() if v is not None}
        return self.with_overrides(train=values) if values else self
