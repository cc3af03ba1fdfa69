"""ehr-eval's data in the model's units: converted before scoring, or refused with the fix, before any metric.

A model reads a value in the unit it learnt (its export's units.json). Data prepared at another
site without ``--units-from MODEL_DIR`` holds some codes in other units, and the predictions on
it look plausible while being wrong (mean |p - p_harmonised| 0.138 on an SI-unit release); the
shift report's unit mismatch came last, after the metrics. ``plan_units`` compares the two
units.json files before anything is scored (``ehr_pipeline.shift.unit_mismatch``):

* every mismatched code convertible (mass, substance, temperature; molar masses by LOINC): the
  records are converted to the model's units as they are read (``ScoringUnits.convert``), and the
  log says which codes, from what, by what factor;
* a conversion that would move a code's values outside the plausibility bound around the model's
  training median (``ehr_pipeline.encode.magnitudes``) is not made: the bound is the one the job and
  the service apply, judged by the same ``units.Harmoniser.implausible`` on the data folder's own
  median of the code (its units.json "medians"; a folder without them is not judged), and the code
  counts as one that cannot be converted, its reason in the line;
* any code that cannot be converted: ``UnitMismatchError``, one line naming the codes and the fix
  (``ehr-pipeline run --units-from MODEL_DIR``);
* ``force``: the records are scored as they are (the old behaviour), with a warning.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ehr_pipeline.contract import layout
from ehr_pipeline.encode import units
from ehr_pipeline.shift import population, unit_mismatch
from ehr_pipeline.shift.unit_mismatch import Mismatch

log = logging.getLogger(__name__)
_LISTED = 3  # codes named in one line; the rest counted


class UnitMismatchError(ValueError):
    """Data in units the model cannot be given; the message is one line with the fix."""


@dataclasses.dataclass(frozen=True)
class ScoringUnits:
    """What ehr-eval does to a data folder's values before the model reads them."""

    mismatched: tuple[Mismatch, ...]
    canonical: Mapping[str, str]  # code -> the unit the scored values are in (the model's, where converted)
    forced: bool = False

    @property
    def conversions(self) -> dict[str, Any]:
        """code -> units.Conversion of the codes converted (none when forced)."""
        return {} if self.forced else {m.code: m.conversion for m in self.mismatched}

    def convert(self, records: Sequence[bytes]) -> list[bytes]:
        """The records with every mismatched code's values in the model's unit (as they are when nothing is)."""
        if not self.conversions:
            return list(records)
        converted, entries = unit_mismatch.convert_records(records, self.conversions)
        log.info("converted %d bag entries of %d records to the model's units", entries, len(records))
        return converted


def plan_units(exports: Sequence[Any], data_dir: str | os.PathLike[str], *, force: bool = False) -> ScoringUnits:
    """The ScoringUnits of scoring `data_dir` with `exports` (LoadedExport, one or an ensemble's members)."""
    first = exports[0].files
    for other in exports[1:]:
        if dict(other.files.units) != dict(first.units):
            raise UnitMismatchError(f"{other.path} and {first.directory} were trained in different units "
                                    "(their units.json differ): evaluate them one at a time")
    _, data_canonical = population.data_units(data_dir)
    harmoniser = first.harmoniser
    found = unit_mismatch.mismatches(first.units, data_canonical, harmoniser.converter, harmoniser.loinc)
    found = _judged(found, harmoniser, _data_medians(data_dir))
    if not found:
        return ScoringUnits((), dict(data_canonical))
    fix = f"prepare the data with `ehr-pipeline run --units-from {first.directory}`"
    if force:
        log.warning("--force: %s holds %d code(s) in other units than the model (%s), scored as they are: "
                    "predictions that use them are unreliable (%s)", data_dir, len(found), _listed(found), fix)
        return ScoringUnits(tuple(found), dict(data_canonical), forced=True)
    lost = [m for m in found if m.conversion is None]
    if lost:
        raise UnitMismatchError(f"{data_dir} holds {len(lost)} code(s) in units that cannot be converted to the "
                                f"model's ({_listed(lost)}): {fix} (values it cannot convert are dead-lettered "
                                "there), or pass --force to score them as they are")
    log.warning("%s holds %d code(s) in other units than the model: converted to its units before scoring (%s)",
                data_dir, len(found), _listed(found, limit=10))
    return ScoringUnits(tuple(found), {**data_canonical, **{m.code: m.model_unit for m in found}})


def _data_medians(data_dir: str | os.PathLike[str]) -> dict[str, float]:
    """'source:code' -> median |value| in the data's canonical unit (the data folder's units.json); {} without."""
    path = os.path.join(os.fspath(data_dir), layout.UNITS)
    return units.read_medians(layout.read_json(path)) if os.path.exists(path) else {}


def _judged(found: Sequence[Mismatch], harmoniser: units.Harmoniser,
            data_medians: Mapping[str, float]) -> list[Mismatch]:
    """`found` with each conversion that breaks the plausibility bound made not convertible, its reason kept."""
    # The model's training medians and the data's own median of the code in its unit: what the job's
    # census gives the job's Harmoniser (the values themselves are bagged by now).
    judge = units.Harmoniser(harmoniser.canonical, harmoniser.loinc, harmoniser.converter, medians=harmoniser.medians,
                             unit_medians={m.code: {harmoniser.converter.key(m.data_unit) or "": data_medians[m.code]}
                                           for m in found if m.code in data_medians})
    out = []
    for m in found:
        why = "" if m.conversion is None else judge.implausible(m.code, m.data_unit, m.conversion, np.zeros(0))
        out.append(dataclasses.replace(m, conversion=None, why=f"the conversion x{m.conversion.scale:.4g} is "
                                                               f"implausible: {why}") if why else m)
    return out


def _listed(found: Sequence[Mismatch], limit: int = _LISTED) -> str:
    text = "; ".join(m.describe() for m in found[:limit])
    return text + (f"; and {len(found) - limit} more" if len(found) > limit else "")
