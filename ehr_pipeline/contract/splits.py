"""Train / validation / test assignment by a stable hash of SUBJECT_ID.

Hashing the patient rather than the admission keeps every admission of one patient in one
split, so no patient's history leaks between training and evaluation. SHA-256 (not Python's
``hash``) makes the assignment identical across processes, machines and runs.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping

from ehr_pipeline.contract.config import SPLIT_NAMES


def unit_hash(key: str) -> float:
    """Maps a string to a uniform number in [0, 1) that never changes between runs."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(subject_id: int, fractions: Mapping[str, float], salt: str = "") -> str:
    """The split of a patient, given split fractions that sum to 1 (ordered as config.SPLIT_NAMES)."""
    u = unit_hash(f"{salt}:{int(subject_id)}")
    edge = 0.0
    names = [s for s in SPLIT_NAMES if s in fractions]
    for name in names:
        edge += fractions[name]
        if u < edge:
            return name
    # Rounding can leave the last edge a hair below 1.
    return names[-1]


def shard_of(hadm_id: int, num_shards: int) -> int:
    """The output shard of an admission (stable, roughly uniform)."""
    return int(unit_hash(f"shard:{int(hadm_id)}") * num_shards)
