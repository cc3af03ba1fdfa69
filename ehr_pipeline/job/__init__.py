"""The Beam jobs: MIMIC-III CSVs or a MEDS dataset -> bagged SequenceExamples, and MIMIC-III -> MEDS.

The modules: ``run`` builds and runs the bagging job (``run_job``, ``run_meds_job``) and writes
the data folder's side files and manifest (``manifest``); its named composite transforms are the
two sources (``sources``), the bagging step (``bag``, which calls ``encode.encode_admission``),
and what is written (``sinks``: TFRecord shards and dead-letter files), all speaking the items
and counters of ``transforms``; the MIMIC-III job spills events, records and dead values to disk
instead of shuffling them (``spill``: frame files, buckets, options; ``spill_stages``: the stages
around them) after splitting big gzip tables (``gzip_split``); ``chunks`` packs an example's
events; ``vocab``
builds the vocabulary and the numeric statistics from the train split; ``to_meds`` runs the
MIMIC-III -> MEDS conversion (``run_to_meds``) on the rows ``meds.from_mimic`` makes.

Beam runs here, TensorFlow never: a worker installs the job's dependency group alone. Beam
pickles the DoFns by reference to these modules, so a worker needs the package importable.
"""
from __future__ import annotations

from ehr_pipeline.job.manifest import format_manifest_summary
from ehr_pipeline.job.run import pipeline_options, run_job, run_meds_job
from ehr_pipeline.job.spill import SpillOptions
from ehr_pipeline.job.to_meds import run_to_meds

__all__ = ["SpillOptions", "format_manifest_summary", "pipeline_options", "run_job", "run_meds_job", "run_to_meds"]
