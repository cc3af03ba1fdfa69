"""The Beam jobs: MIMIC-III CSVs or a MEDS dataset -> bagged SequenceExamples, and MIMIC-III -> MEDS.

The modules: ``run`` builds and runs the bagging job (``run_job``, ``run_meds_job``) and writes
the data folder's side files and manifest (``manifest``); its named composite transforms are the
two readers (``sources``), the bagging step (``bag``, which calls ``encode.encode_admission``),
and the dead-letter files (``sinks``), all speaking the items and counters of ``items``.
Every job spills events, examples, records and dead values to disk instead of shuffling them
(``spill``: frame files, buckets, options): the MIMIC-III job's stages have a module each, read and
spill ``spill_source``, bag a bucket ``spill_bag``, merge a shard ``spill_merge`` (big gzip tables
first cut into parts, ``mimic.table_parts``, the temporary disk checked by ``temp_disk``); the MEDS
job's are ``meds_stages`` (sharing stages C and D); ``chunks`` packs an example's events; ``dedup``
uses a repeated row (table, ROW_ID) once and dead-letters the rest; ``vocab`` builds the vocabulary
and the numeric statistics from the train split; ``to_meds`` runs the MIMIC-III -> MEDS conversion
(``run_to_meds``) on the rows ``meds.from_mimic`` makes, spilled and sorted a bucket of subjects
at a time.

Beam runs here, TensorFlow never: a worker installs the job's dependency group alone. Beam
pickles the DoFns by reference to these modules, so a worker needs the package importable.
"""
from __future__ import annotations

from ehr_pipeline.job.manifest import format_manifest_summary
from ehr_pipeline.job.run import pipeline_options, run_job, run_meds_job
from ehr_pipeline.job.spill import SpillOptions
from ehr_pipeline.job.to_meds import run_to_meds

__all__ = ["SpillOptions", "format_manifest_summary", "pipeline_options", "run_job", "run_meds_job", "run_to_meds"]
