"""New data against the population a model learnt from: the reference an export carries, and the report.

The statistics and their comparison live in the data layer (``ehr_pipeline.shift.population``,
``ehr_pipeline.shift.compare``); this module ties them to models, as ``against_truth`` ties
predictions to a known truth:

* ``reference_profile``: the training split of a data folder, with the model's mutual
  information on the validation split, as training's export writes it (reference_profile.json);
* ``current_profile``: new data (serialized examples, their units.json) binned on the reference,
  in the model's vocabulary, with the model's mutual information when it scored them;
* ``compare`` and ``ShiftResult``: the report, the performance the model expects on the new data
  (``statistics.metrics_report.estimate_performance``, when it scored them), and whether the report reaches a
  command's ``--fail-on`` level;
* ``write_outputs``: shift.json, shift.md and shift.png.

The use cases that score data for it (``ehr-analyze shift``, ``ehr-eval`` on other data) are
``model.evaluation.run_evaluation``'s. Importing this module loads no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ehr_pipeline import shift
from ehr_pipeline.shift import Profile, population
from model.evaluation.report.performance_table import estimate_markdown
from model.evaluation.report.plots import shift_plot
from model.export.load import vocabulary_ranks

log = logging.getLogger(__name__)

SHIFT_JSON = "shift.json"
SHIFT_MD = "shift.md"
SHIFT_PNG = "shift.png"


@dataclasses.dataclass(frozen=True)
class ShiftResult:
    """A report with the two profiles it compared, and the performance expected on the new data (or None)."""

    report: shift.ShiftReport
    reference: Profile
    current: Profile
    performance: dict[str, Any] | None = None

    def text(self) -> str:
        """The report in words, then the expected performance's table when the model scored the data."""
        if self.performance is None:
            return self.report.text()
        return self.report.text() + "\n\n" + estimate_markdown(self.performance)

    def fails(self, fail_on: str) -> bool:
        """True when the report's level reaches `fail_on` ('never' never does)."""
        return fail_on != "never" and self.report.at_least(fail_on)


def _vocabulary(files: Any) -> set[str]:
    return set(vocabulary_ranks({"sources": files.vocabulary}, files.path("vocabulary.json")))


def reference_profile(files: Any, *, validation_mi: np.ndarray | None = None, samples: int | None = None) -> Profile:
    """The reference of a model trained on `files` (model.data_folder.DataFiles): its training split, in its vocabulary.

    validation_mi: the model's mutual information on the validation split (nats), estimated with
    `samples` samples per member.
    """
    vocabulary = _vocabulary(files)
    profile = population.profile_of_data(files.data_dir, ["train"], vocabulary=vocabulary, keep=vocabulary,
                                         description=f"training split of {files.data_dir}")
    if validation_mi is not None:
        profile = profile.with_mutual_information(np.asarray(validation_mi), samples)
    return profile


def current_profile(export: Any, reference: Profile, records: Sequence[bytes], data_dir: str | os.PathLike[str],
                    *, mutual_information: np.ndarray | None = None, samples: int | None = None,
                    description: str = "", canonical: Mapping[str, str] | None = None) -> Profile:
    """New data's profile: `records` of `data_dir` (whose units.json says what their values were converted to;
    `canonical` instead, when the records were converted since)."""
    counts, written = population.data_units(data_dir)
    canonical = written if canonical is None else canonical
    admissions = population.admissions_from_examples(records, mutual_information)
    return Profile.build(admissions, vocabulary=export.vocabulary, bins_from=reference, units=counts,
                         canonical=canonical, mi_samples=samples if mutual_information is not None else None,
                         description=description or str(data_dir))


def compare(export: Any, reference: Profile, current: Profile) -> shift.ShiftReport:
    """shift.compare with the export's LOINC codes (unit hints use the analyte's molar mass)."""
    return shift.compare(reference, current, loinc=export.harmoniser.loinc, converter=export.harmoniser.converter)


def write_outputs(out_dir: str | os.PathLike[str], result: ShiftResult,
                  extra: dict[str, Any] | None = None) -> dict[str, pathlib.Path]:
    """Writes shift.json (report and the new data's profile), shift.md and shift.png; returns their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {**result.report.to_json(), "current_profile": result.current.to_json(), **(extra or {})}
    if result.performance is not None:
        doc["performance_estimate"] = result.performance
    paths = {"json": out / SHIFT_JSON, "markdown": out / SHIFT_MD, "plot": out / SHIFT_PNG}
    paths["json"].write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    markdown = result.report.markdown()
    if result.performance is not None:
        markdown += "\n## Expected performance (before outcomes)\n\n" + estimate_markdown(result.performance) + "\n"
    paths["markdown"].write_text(markdown, encoding="utf-8")
    shift_plot(result.report, paths["plot"])
    return paths
