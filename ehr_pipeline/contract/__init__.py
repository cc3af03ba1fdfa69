"""The contract between the Beam job, the trainer and the service: what a data folder holds and how to read it.

The modules: ``spec`` names the SequenceExample's features, their types and allowed values
(``AdmissionContext``) and imports nothing of the project; ``config`` is the pipeline
configuration (pydantic, from YAML); ``layout`` names the files of a data folder and reads and
writes them; ``integrity`` checks a folder against its manifest (checksums, schema version)
before anything reads it; ``output_folder`` writes every command's output folder whole or not at
all and refuses to replace what the command did not write; ``splits`` says which split and shard a patient's records land in; ``protos``
declares TensorFlow's Example protos with protobuf alone and ``tfrecord`` frames records
without TensorFlow; ``tf_parse`` parses the records into tensors.

Cheap to import (no Beam, no TensorFlow): the service loads it. ``tf_parse`` imports TensorFlow
at module level, so it is not re-exported here: the trainer imports it by its path.
"""
from __future__ import annotations

from ehr_pipeline.contract import integrity, layout, output_folder, protos, spec, tfrecord
from ehr_pipeline.contract.config import (
    SPLIT_NAMES,
    BaggingConfig,
    PipelineConfig,
    load_pipeline_config,
    parse_pipeline_config,
)
from ehr_pipeline.contract.integrity import DataIntegrityError, verify_folder
from ehr_pipeline.contract.spec import AdmissionContext
from ehr_pipeline.contract.splits import assign_split, shard_of

__all__ = [
    "SPLIT_NAMES",
    "AdmissionContext",
    "BaggingConfig",
    "DataIntegrityError",
    "PipelineConfig",
    "assign_split",
    "integrity",
    "layout",
    "load_pipeline_config",
    "output_folder",
    "parse_pipeline_config",
    "protos",
    "shard_of",
    "spec",
    "tfrecord",
    "verify_folder",
]
