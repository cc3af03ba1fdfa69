"""FHIR R4 in and out: code systems (``codes``), Bundle -> model events (``mapping``), MIMIC -> Bundle (``convert``).

Validation uses the pinned ``fhir.resources`` models of FHIR R4B (4.3), the R4 line's
technical correction: the resources read and written here are unchanged from R4 (4.0.1).

The front door re-exports ``codes`` and ``mapping``, which the service and the job use;
``convert`` reads a MIMIC-III release with pyarrow and is imported by its path
(``ehr-pipeline to-fhir``), so the service's start-up does not pay for it.
"""
from __future__ import annotations

from ehr_pipeline.fhir import codes, mapping

__all__ = ["codes", "mapping"]
