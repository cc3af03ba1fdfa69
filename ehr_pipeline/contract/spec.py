"""The SequenceExample spec: the one contract between the Beam job, the trainer and the service.

One ``tensorflow.SequenceExample`` per hospital admission. Context features describe the
admission; each step of the sequence is one time bag (oldest first). Within a bag, the
per-code lists (codes, counts, numeric aggregates) are aligned index by index.

This module holds the contract only: feature names and types, allowed values, file names, and
``AdmissionContext``, the admission-level fields that the job and the service both build.
It imports nothing of the project, no TensorFlow and no Beam. ``ehr_pipeline.encode.seqex`` writes
the protos (protobuf alone), ``ehr_pipeline.contract.tf_parse`` parses them for training (TensorFlow).
"""
from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Mapping
from typing import Any

# 2: per-code value_min / value_max and the admission's start (admit_offset_seconds).
# 3: ethnicity and insurance as ADMISSIONS records them (for subgroup reports, never model inputs).
# 4: the previous admission's discharge (previous_discharge_seconds).
SCHEMA_VERSION = 4

# --- context features (one value per admission) ---
SUBJECT_ID = "subject_id"  # int64
HADM_ID = "hadm_id"  # int64
LABEL = "label"  # int64, 1 = in-hospital death after the trigger time, 0 = not, -1 = unknown (serving)
TRIGGER_TIME = "trigger_time"  # int64, seconds since 1970-01-01 (shifted MIMIC dates)
AGE_YEARS = "age_years"  # float, age at admission in years, capped at 90
GENDER = "gender"  # bytes, "M" / "F" / "U"
ADMISSION_TYPE = "admission_type"  # bytes, e.g. "EMERGENCY"
# Who the admission is, as ADMISSIONS records it: the evaluation reports metrics per group of
# these. No model reads them (model.ehr.inputs and the noise key in model.export.predict leave them out),
# and the service, which is not told them, writes NOT_RECORDED.
ETHNICITY = "ethnicity"  # bytes, ADMISSIONS.ETHNICITY as written, e.g. "WHITE"
INSURANCE = "insurance"  # bytes, ADMISSIONS.INSURANCE as written, e.g. "Medicare"
NUM_BAGS = "num_bags"  # int64, sequence length
# int64, trigger time minus admission time, seconds (>= 0): bags newer than this lie in the
# current admission, older ones are history. Relative, like BAG_OFFSET, so the job and the
# service (whose ids and clocks differ) write the same value for the same admission.
ADMIT_OFFSET = "admit_offset_seconds"
# int64, trigger time minus the discharge of the subject's previous admission, seconds (>= ADMIT_OFFSET:
# that discharge is at or before this admission's start), or NO_PREVIOUS_DISCHARGE when there is none
# (ehr_pipeline.encode.previous_stay says which admission is the previous one). Relative to the trigger,
# like ADMIT_OFFSET.
PREVIOUS_DISCHARGE = "previous_discharge_seconds"
NO_PREVIOUS_DISCHARGE = -1

# --- sequence features (one entry per bag, oldest bag first) ---
BAG_OFFSET = "bag_offset_seconds"  # float [1]: seconds from the bag's newest event to the trigger
BAG_CODES = "codes"  # bytes [n_codes]: distinct codes "source:code", e.g. b"lab:50912"
BAG_COUNTS = "code_counts"  # int64 [n_codes]: events of that code in the bag
BAG_VALUE_COUNT = "value_count"  # int64 [n_codes]: numeric values seen (0 = no numeric value)
BAG_VALUE_MEAN = "value_mean"  # float [n_codes]: mean of numeric values (0 when value_count = 0)
BAG_VALUE_LAST = "value_last"  # float [n_codes]: newest numeric value (0 when value_count = 0)
# Extremes: severity scores (SAPS-II, APACHE) use the worst value of each measurement, and a
# mean dilutes one abnormal value among normal ones.
BAG_VALUE_MIN = "value_min"  # float [n_codes]: smallest numeric value (0 when value_count = 0)
BAG_VALUE_MAX = "value_max"  # float [n_codes]: largest numeric value (0 when value_count = 0)

CONTEXT_INT = (SUBJECT_ID, HADM_ID, LABEL, TRIGGER_TIME, NUM_BAGS, ADMIT_OFFSET, PREVIOUS_DISCHARGE)
CONTEXT_FLOAT = (AGE_YEARS,)
CONTEXT_BYTES = (GENDER, ADMISSION_TYPE, ETHNICITY, INSURANCE)
SEQUENCE_INT = (BAG_COUNTS, BAG_VALUE_COUNT)
SEQUENCE_FLOAT = (BAG_OFFSET, BAG_VALUE_MEAN, BAG_VALUE_LAST, BAG_VALUE_MIN, BAG_VALUE_MAX)
SEQUENCE_BYTES = (BAG_CODES,)

# Event sources, used as code namespaces ("lab:50912") and in the service's request schema.
SOURCES = ("lab", "chart", "input", "output", "prescription", "diagnosis", "procedure")
CODE_SEPARATOR = ":"  # codes read "source:code"; the source is everything before the first ":"
# No code may hold a control character (C0, DEL): NUL ends C strings ("50912\0" would be read
# as "50912"), and tabs or newlines make codes that print alike but differ. The job drops
# such events (events.BAD_CODE), the service refuses them (422).
CODE_CONTROL_CHARACTERS = "[\x00-\x1f\x7f]"
# Whitespace trimmed from both ends of a code's text, by the job and the service alike, so
# " 50912" and "50912" are one code. Spelled out (Python's str.isspace characters, which are
# also what pyarrow's utf8_trim_whitespace trims) so the job's vectorised trim and
# code_text read one list.
CODE_WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                   "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

# Allowed context values. The service fills LABEL with LABEL_UNKNOWN: the outcome is not known yet.
LABEL_UNKNOWN = -1
LABELS = (0, 1, LABEL_UNKNOWN)
GENDERS = ("M", "F", "U")
# Ethnicity / insurance when nobody recorded them: a null in ADMISSIONS, or a service request.
NOT_RECORDED = "UNKNOWN"
# Context features that older records lack: ethnicity and insurance (before version 3) parse as
# NOT_RECORDED, so such data still trains and evaluates (its subgroup report then has one group);
# a previous discharge (before version 4) as none.
CONTEXT_DEFAULTS = {ETHNICITY: NOT_RECORDED, INSURANCE: NOT_RECORDED, PREVIOUS_DISCHARGE: NO_PREVIOUS_DISCHARGE}
AGE_CAP_YEARS = 90.0  # MIMIC shifts ages over 89 to ~300 years; they are capped to this

# --- files: the Beam job writes them, the trainer reads them ---
COMPRESSION = "GZIP"  # tf.io / tf.data compression_type of every TFRecord file
TFRECORD_SUFFIX = ".tfrecord.gz"  # Beam infers GZIP from ".gz" (compression AUTO)
# Beam's shard template: the job writes `{split}{SHARD_NAME_TEMPLATE}{TFRECORD_SUFFIX}`.
SHARD_NAME_TEMPLATE = "-SSSSS-of-NNNNN"
_SHARD_DIGITS = 5

# The context's keys that AdmissionContext holds (NUM_BAGS is derived from the bags).
CONTEXT_INPUT_KEYS = (SUBJECT_ID, HADM_ID, LABEL, TRIGGER_TIME, ADMIT_OFFSET, AGE_YEARS, GENDER,
                      ADMISSION_TYPE, ETHNICITY, INSURANCE, PREVIOUS_DISCHARGE)
SEQUENCE_KEYS = SEQUENCE_FLOAT + SEQUENCE_INT + SEQUENCE_BYTES
# Sequence features that hold exactly one value per bag; the others hold one per code.
ONE_PER_BAG = (BAG_OFFSET,)


def code_text(code: object) -> str:
    """A code's text as bags hold it: CODE_WHITESPACE trimmed; blank or control characters refused (ValueError)."""
    text = str(code).strip(CODE_WHITESPACE)
    if not text:
        raise ValueError("empty or blank code")
    if re.search(CODE_CONTROL_CHARACTERS, text):
        raise ValueError("code must not hold control characters (U+0000-U+001F, U+007F)")
    return text


def format_code(source: str, code: object) -> str:
    """The event code 'source:code' (e.g. 'lab:50912') that bags and vocabularies use; code_text normalises the code."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {SOURCES}")
    try:
        text = code_text(code)
    except ValueError as err:
        raise ValueError(f"{err} for source {source!r}: {str(code)!r}") from None
    return f"{source}{CODE_SEPARATOR}{text}"


def shard_file_name(split: str, shard: int, num_shards: int) -> str:
    """File name of one shard, e.g. 'train-00003-of-00008.tfrecord.gz'."""
    _check_split(split)
    if not 0 <= shard < num_shards < 10**_SHARD_DIGITS:
        raise ValueError(f"need 0 <= shard < num_shards < {10**_SHARD_DIGITS}, "
                         f"got shard={shard}, num_shards={num_shards}")
    middle = (SHARD_NAME_TEMPLATE.replace("S" * _SHARD_DIGITS, f"{shard:0{_SHARD_DIGITS}d}")
              .replace("N" * _SHARD_DIGITS, f"{num_shards:0{_SHARD_DIGITS}d}"))
    return f"{split}{middle}{TFRECORD_SUFFIX}"


def split_file_pattern(split: str) -> str:
    """Glob matching every shard of one split, e.g. 'train-?????-of-?????.tfrecord.gz'."""
    _check_split(split)
    middle = SHARD_NAME_TEMPLATE.replace("S", "?").replace("N", "?")
    return f"{split}{middle}{TFRECORD_SUFFIX}"


def _check_split(split: str) -> None:
    # '-' would make the pattern of one split match another's files ("train" vs "train-x").
    if not split or not split.replace("_", "").isalnum():
        raise ValueError(f"split name must be letters, digits or '_', got {split!r}")


@dataclasses.dataclass(frozen=True)
class AdmissionContext:
    """One admission's context features (times in seconds), checked against the contract when built.

    The Beam job builds it from the cohort row, the service from a request; both hand it to
    ``seqex.serialize`` so the two cannot assemble the context differently.
    """

    subject_id: int
    hadm_id: int
    label: int  # 0, 1 or LABEL_UNKNOWN
    trigger_time: int  # seconds since 1970-01-01
    admit_offset_seconds: int  # trigger time minus admission time (>= 0)
    age_years: float  # in [0, AGE_CAP_YEARS]
    gender: str  # one of GENDERS
    admission_type: str
    ethnicity: str = NOT_RECORDED
    insurance: str = NOT_RECORDED
    # trigger time minus the previous admission's discharge (>= admit_offset_seconds), or NO_PREVIOUS_DISCHARGE
    previous_discharge_seconds: int = NO_PREVIOUS_DISCHARGE

    def __post_init__(self) -> None:
        _check_context(self.features())

    def features(self) -> dict[str, Any]:
        """{feature name: value} for CONTEXT_INPUT_KEYS, in that order (the fields are named as the features)."""
        return {key: getattr(self, key) for key in CONTEXT_INPUT_KEYS}

    @classmethod
    def from_features(cls, features: Mapping[str, Any]) -> AdmissionContext:
        """An AdmissionContext from {feature name: value}; ValueError names missing or unknown keys.

        PREVIOUS_DISCHARGE may be left out: no previous discharge.
        """
        features = {PREVIOUS_DISCHARGE: NO_PREVIOUS_DISCHARGE, **features}
        missing = [k for k in CONTEXT_INPUT_KEYS if k not in features]
        unknown = sorted(set(features) - set(CONTEXT_INPUT_KEYS))
        if missing or unknown:
            hint = f" ({NUM_BAGS} is filled from the bags)" if NUM_BAGS in unknown else ""
            raise ValueError(f"context keys: missing {missing}, unknown {unknown}{hint}")
        return cls(**{key: features[key] for key in CONTEXT_INPUT_KEYS})


def _check_context(context: Mapping[str, Any]) -> None:
    """Raises ValueError/TypeError naming the first context key that breaks the contract."""
    for key in CONTEXT_INPUT_KEYS:
        value = context[key]
        if key in CONTEXT_INT and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TypeError(f"context[{key!r}] must be an integer, got {value!r}")
        if key in CONTEXT_FLOAT and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise TypeError(f"context[{key!r}] must be a number, got {value!r}")
        if key in CONTEXT_BYTES and not (isinstance(value, str) and value):
            raise TypeError(f"context[{key!r}] must be a non-empty str, got {value!r}")
    if context[LABEL] not in LABELS:
        raise ValueError(f"context[{LABEL!r}] must be one of {LABELS}, got {context[LABEL]!r}")
    if context[GENDER] not in GENDERS:
        raise ValueError(f"context[{GENDER!r}] must be one of {GENDERS}, got {context[GENDER]!r}")
    if context[ADMIT_OFFSET] < 0:
        raise ValueError(f"context[{ADMIT_OFFSET!r}] (trigger minus admission, s) must be >= 0, "
                         f"got {context[ADMIT_OFFSET]!r}")
    previous = context[PREVIOUS_DISCHARGE]
    if previous != NO_PREVIOUS_DISCHARGE and previous < context[ADMIT_OFFSET]:
        raise ValueError(f"context[{PREVIOUS_DISCHARGE!r}] (trigger minus the previous discharge, s) must be >= "
                         f"{ADMIT_OFFSET} ({context[ADMIT_OFFSET]}: that discharge precedes this admission) or "
                         f"{NO_PREVIOUS_DISCHARGE} (none), got {previous!r}")
    if not 0.0 <= context[AGE_YEARS] <= AGE_CAP_YEARS:  # also false for NaN
        raise ValueError(f"context[{AGE_YEARS!r}] must be in [0, {AGE_CAP_YEARS}], "
                         f"got {context[AGE_YEARS]!r}")
