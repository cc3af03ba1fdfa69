"""MEDS 0.4 in and out: the job's MEDS source, MEDS label files, and a MIMIC-III release written as MEDS.

The modules: ``code_map`` reads MEDS codes as this project's events (the one map of the MEDS
source, the converter and the service); ``standard`` states MEDS' schemas with pyarrow and checks
files against them (``MedsError``); ``rows`` reads a block of MEDS rows through the code map;
``labels`` reads label files and keeps each example's exact prediction time; ``source`` turns a
MEDS dataset's subjects into examples with their events, as the MIMIC-III source does;
``from_mimic`` makes the rows and files of a MEDS dataset from a MIMIC-III release
(``ehr-pipeline to-meds``, run as a Beam job by ``ehr_pipeline.job.to_meds``).

This front door re-exports the code map only: the service reads a MEDS-trained model's requests
with it, and importing the pyarrow modules would add ~0.7 s to its start-up. The job, the
trainer and the tests import ``standard``, ``rows``, ``labels``, ``source`` and ``from_mimic``
by their paths. No Beam, no TensorFlow, and no ``meds`` package (a Beam worker installs the
job's dependency group alone).
"""
from __future__ import annotations

from ehr_pipeline.meds.code_map import (
    EVENT,
    MIMIC_III_TEMPLATES,
    CodeMapper,
    MappedCode,
    MedsCodes,
    load_meds_codes,
    parse_meds_codes,
)

__all__ = ["EVENT", "MIMIC_III_TEMPLATES", "CodeMapper", "MappedCode", "MedsCodes", "load_meds_codes",
           "parse_meds_codes"]
