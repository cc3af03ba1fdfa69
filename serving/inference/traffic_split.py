"""Which version of the model answers an admission under a traffic split: a pure function of the admission's key.

An admission's key (``serving.inference.model_versions.admission_key``: the patient and admit time a JSON
request states, or a record's subject and hadm ids) is hashed with SHA-256; the first eight bytes, read as a
big-endian integer modulo 100, are its bucket in [0, 100). The split's versions take consecutive runs of
buckets in the order the split names them (``1=90,2=10``: buckets 0-89 to version 1, 90-99 to version 2).
The hash is fixed, so the same admission reaches the same version on every request, on every replica and
after every restart (sticky), without a table of who went where; and the share of distinct admissions a
version gets is its percentage up to sampling noise (SHA-256's output is uniform; the modulo's bias, under
100 / 2**64, is nil).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping

BUCKETS = 100  # the split's shares are whole percents


def bucket(key: str) -> int:
    """The admission's bucket in [0, 100): SHA-256 of the UTF-8 key, first 8 bytes big-endian, modulo 100."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % BUCKETS


def choose_version(key: str, split: Mapping[int, int]) -> int:
    """The version of `split` (version -> percent, summing to 100, in its order) whose run of buckets holds key's."""
    b, upper = bucket(key), 0
    for version, share in split.items():
        upper += share
        if b < upper:
            return version
    raise ValueError(f"the traffic split's shares sum to {upper}, not {BUCKETS}")
