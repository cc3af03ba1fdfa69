"""The SequenceExample spec: the one contract between the Beam job, the trainer and the service.

One ``tf.train.SequenceExample`` per hospital admission. Context features describe the
admission; each step of the sequence is one time bag (oldest first). Within a bag, the
per-code lists (codes, counts, numeric aggregates) are aligned index by index.

This module must stay cheap to import: no Beam, no Keras. TensorFlow is imported lazily,
only by the functions that build or parse protos.
"""
from __future__ import annotations

SCHEMA_VERSION = 1

# --- context features (one value per admission) ---
SUBJECT_ID = "subject_id"  # int64
HADM_ID = "hadm_id"  # int64
LABEL = "label"  # int64, 1 = in-hospital death after the trigger time
TRIGGER_TIME = "trigger_time"  # int64, seconds since 1970-01-01 (shifted MIMIC dates)
AGE_YEARS = "age_years"  # float, age at admission in years, capped at 90
GENDER = "gender"  # bytes, "M" / "F" / "U"
ADMISSION_TYPE = "admission_type"  # bytes, e.g. "EMERGENCY"
NUM_BAGS = "num_bags"  # int64, sequence length

# --- sequence features (one entry per bag, oldest bag first) ---
BAG_OFFSET = "bag_offset_seconds"  # float [1]: seconds from the bag's newest event to the trigger
BAG_CODES = "codes"  # bytes [n_codes]: distinct codes "source:code", e.g. b"lab:50912"
BAG_COUNTS = "code_counts"  # int64 [n_codes]: events of that code in the bag
BAG_VALUE_COUNT = "value_count"  # int64 [n_codes]: numeric values seen (0 = no numeric value)
BAG_VALUE_MEAN = "value_mean"  # float [n_codes]: mean of numeric values (0 when value_count = 0)
BAG_VALUE_LAST = "value_last"  # float [n_codes]: newest numeric value (0 when value_count = 0)

CONTEXT_INT = (SUBJECT_ID, HADM_ID, LABEL, TRIGGER_TIME, NUM_BAGS)
CONTEXT_FLOAT = (AGE_YEARS,)
CONTEXT_BYTES = (GENDER, ADMISSION_TYPE)
SEQUENCE_INT = (BAG_COUNTS, BAG_VALUE_COUNT)
SEQUENCE_FLOAT = (BAG_OFFSET, BAG_VALUE_MEAN, BAG_VALUE_LAST)
SEQUENCE_BYTES = (BAG_CODES,)

# Event sources, used as code namespaces ("lab:50912") and in the service's request schema.
SOURCES = ("lab", "chart", "input", "output", "prescription", "diagnosis", "procedure")
