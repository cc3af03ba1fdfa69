"""What this project knows of MIMIC-III v1.4 beyond reading its tables: the cohort, the events, the release.

The modules: ``cohort`` decides which admissions become examples (trigger time, label, context);
``events`` turns typed rows of each event table into events (code, time known, value, unit)
and cuts them to the cohort; ``summary`` counts every row of a release (``ehr-pipeline
summarize``); ``table_parts`` cuts one big table file into parts that workers read in
parallel (the job's own parts on every run, and ``ehr-pipeline shard``'s). The MEDS source
builds its task with ``cohort`` and cuts its events with ``events`` too, so both sources follow
one set of rules (docs/task.md).

pyarrow and numpy only: no Beam, no TensorFlow.
"""
from __future__ import annotations

from ehr_pipeline.mimic import cohort, events
from ehr_pipeline.mimic.cohort import ADMISSION_COLUMNS, PATIENT_COLUMNS, Cohort, build_cohort
from ehr_pipeline.mimic.summary import summarize_command, summarize_release
from ehr_pipeline.mimic.table_parts import write_table_parts

__all__ = [
    "ADMISSION_COLUMNS",
    "PATIENT_COLUMNS",
    "Cohort",
    "build_cohort",
    "cohort",
    "events",
    "summarize_command",
    "summarize_release",
    "write_table_parts",
]
