"""One admission's events -> its SequenceExample record: the one hop the Beam job and the service share.

Both roads do the same four steps to an admission, and do them here so they cannot drift apart:
values move to their codes' canonical units (``units.Harmoniser``), the events are put in their
canonical order (``bagging.canonical_order``), bagged before the trigger time
(``bagging.bag_events``) and written with the admission's context (``seqex.serialize``). The
callers differ only in where the events and the context come from (the job: a cohort row and
its event chunks; the service: a request) and in what they report about the result (the job
counts and dead-letters, the service warns).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from ehr_pipeline.contract import BaggingConfig, spec
from ehr_pipeline.encode import bagging, seqex, units


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: == on numpy arrays is ambiguous
class EncodedAdmission:
    """One admission's record and what was made of its events on the way."""

    record: bytes  # the serialized SequenceExample (seqex.serialize)
    bags: bagging.Bags
    # Per event in the order given: values in canonical units (NaN = none or not used), outcomes, problems.
    harmonised: units.Harmonised
    # The events in canonical order with harmonised values: what the job's code statistics sum
    # (times int64 s, codes 'source:code', values float64).
    times: np.ndarray
    codes: np.ndarray
    values: np.ndarray


def encode_admission(times: np.ndarray, codes: np.ndarray, values: np.ndarray, written_units: Iterable[object],
                     context: spec.AdmissionContext, harmoniser: units.Harmoniser,
                     config: BaggingConfig) -> EncodedAdmission:
    """Harmonises, orders and bags one admission's events (times int64 s) before the trigger; writes its record.

    The trigger time is ``context.trigger_time``; ``written_units`` are the values' units as
    recorded (None or blank: none); ``harmoniser`` holds the canonical units (the job's unit
    plan, or the export's for the service).
    """
    harmonised = harmoniser.harmonise(codes, written_units, values)
    # Bags do not depend on the event order, but the job's code statistics sum floats over
    # events: the canonical order keeps them independent of the order the events arrived in.
    times, codes, values = bagging.canonical_order(np.asarray(times, dtype=np.int64), np.asarray(codes),
                                                   harmonised.values)
    bags = bagging.bag_events(times, codes, values, context.trigger_time, config)
    return EncodedAdmission(seqex.serialize(context, bags), bags, harmonised, times, codes, values)
