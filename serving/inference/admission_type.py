"""An admission whose type nobody gave: the risk averaged over the training admission types.

The model reads the admission type as a one-hot input (``model.ehr.inputs.ADMISSION_TYPES`` and
an "other" slot). An adult MIMIC-III training split holds EMERGENCY, ELECTIVE and URGENT
only, so the NEWBORN and "other" slots never moved from their initial weights: sending an
unknown type through "other" would answer with an untrained input, and picking the most
frequent type would answer as if every such patient came through the emergency department.
The type is treated as missing data instead and marginalised over its training
distribution, p(death | x) = sum_t P_train(t) p(death | x, t), with P_train the training
split's frequencies that the export carries (``Export.admission_types``).

The S samples per member are split among the types in proportion to P_train (largest
remainder, ``allocate``), so the answer has the same S x K samples as a known type and
costs about as much; its spread includes the doubt about the type, which the referral and
the interval then show. A type the training split never held is refused: its slot is as
untrained as "other".
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from model.export.load import Export
from model.export_layout import ADMISSION_TYPES_FILE
from serving.schemas import InputError, PredictRequest

KIND = "admission_type_unknown"  # the warning's kind (ehr_input_warnings_total{kind})


def allocate(counts: Mapping[str, int], num_samples: int) -> list[tuple[str, int]]:
    """(type, samples per member) for each training type that gets any of num_samples, most frequent first.

    Largest remainder of num_samples * count / total; ties go to the more frequent type, then by name.
    """
    if num_samples < 1 or not counts:
        raise ValueError("need num_samples >= 1 and at least one training admission type")
    total = sum(counts.values())
    order = sorted(counts, key=lambda t: (-counts[t], t))
    exact = {t: num_samples * counts[t] / total for t in order}
    share = {t: int(exact[t]) for t in order}
    left = num_samples - sum(share.values())
    for t in sorted(order, key=lambda t: (-(exact[t] - share[t]), -counts[t], t))[:left]:
        share[t] += 1
    return [(t, share[t]) for t in order if share[t]]


def check(request: PredictRequest, export: Export, loc: tuple[str | int, ...]) -> None:
    """InputError (loc + admission.admission_type) for a type the model cannot answer for."""
    given = request.admission.admission_type
    known = export.admission_types
    where = loc + ("admission", "admission_type")
    if given is None and not known:
        raise InputError(where, f"admission_type is required by this model: its export has no {ADMISSION_TYPES_FILE} "
                                "(made before it existed), so an unknown type cannot be averaged over the "
                                "training types; re-export the model, or give the type", "missing")
    if given is not None and known and given not in known:
        raise InputError(where, f"admission_type {given[:40]!r} never occurs in this model's training data "
                                f"({', '.join(sorted(known, key=lambda t: -known[t]))}): give one of these, or "
                                "null when it is unknown", "value_error")


def mixed(parts: Sequence[np.ndarray]) -> np.ndarray:
    """One sample-major row [..., S*K] from the per-type parts [..., S_t*K] (sum of S_t = S), in order."""
    # Each part is sample-major (column s*K + k): appending parts appends samples, and every
    # member keeps its column k, so member means and the mixture stay as model.evaluation.statistics.metrics reads them.
    return np.concatenate(list(parts), axis=-1)


def warning(counts: Mapping[str, int], allocation: Sequence[tuple[str, int]], num_samples: int) -> str:
    """The answer's warning: what was averaged, with which weights and samples."""
    total = sum(counts.values())
    weights = ", ".join(f"{t} {100 * counts[t] / total:.0f}%" for t in sorted(counts, key=lambda t: -counts[t]))
    drawn = ", ".join(f"{t} {n}" for t, n in allocation)
    return (f"admission type unknown: the risk is the model averaged over the training admission types by "
            f"their training frequency ({weights}; samples per member of {num_samples}: {drawn}); give the type "
            "for this admission's own risk")
