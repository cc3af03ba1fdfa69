"""From one admission's events to its SequenceExample record: what the Beam job and the service both do.

The modules: ``units`` moves values to their codes' canonical units (``Harmoniser``), reading
unit strings with ``unit_strings`` and judging conversions with ``magnitudes``; ``ages`` computes
ages on the calendar; ``previous_stay`` finds an admission's previous discharge; ``bagging`` puts events into
time bags; ``seqex`` writes the record with
protobuf alone; ``admission`` holds ``encode_admission``, the one function the job's bagging step
and the service's encoding call, so the two roads cannot skew.

Pure numpy and protobuf: no Beam, no TensorFlow; cheap enough for the service's start-up.
"""
from __future__ import annotations

from ehr_pipeline.encode import ages, bagging, magnitudes, previous_stay, seqex, unit_strings, units
from ehr_pipeline.encode.admission import EncodedAdmission, encode_admission
from ehr_pipeline.encode.bagging import Bags, bag_events
from ehr_pipeline.encode.units import Converter, Harmonised, Harmoniser

__all__ = [
    "Bags",
    "Converter",
    "EncodedAdmission",
    "Harmonised",
    "Harmoniser",
    "ages",
    "bag_events",
    "bagging",
    "encode_admission",
    "magnitudes",
    "previous_stay",
    "seqex",
    "unit_strings",
    "units",
]
