"""The service's outcome store file (``outcomes.sqlite``): its schema, and the one reader of its kept admissions.

The service (``serving.monitoring.outcome_store``) writes the file; ``ehr-adapt --outcomes`` reads it
as a site's local data. The schema lives here, below both, so that writer and reader share it
(``model`` may not import ``serving``). Cheap to import: sqlite3 and the standard library only, as the
service imports it on its road.

A row holds one answered prediction: its identifier, the model version that answered, the time
(seconds since 1970), the predictive mean, the sampled probabilities (float32 bytes), the encoded
admission (a serialized SequenceExample in the model's units, only when the service keeps
admissions) and, once it arrived, the outcome (0 or 1) and its time.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import sqlite3

STORE_FILE = "outcomes.sqlite"
TABLE = "predictions"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    prediction_id TEXT PRIMARY KEY,
    model_version TEXT NOT NULL,
    predicted_at REAL NOT NULL,
    probability REAL NOT NULL,
    samples BLOB NOT NULL,
    admission BLOB,
    outcome INTEGER,
    outcome_at REAL
);
CREATE INDEX IF NOT EXISTS predicted_at ON {TABLE} (predicted_at);
"""


class OutcomeFileError(ValueError):
    """An outcome store that cannot serve as local data; the message names the file and what is missing."""


@dataclasses.dataclass(frozen=True)
class KeptAdmissions:
    """The kept admissions of one model version with their outcomes, oldest first, and every row counted."""

    records: list[bytes]
    outcomes: list[int]
    counts: dict[str, int]  # read, without_outcome, admission_not_kept, other_model_version, used


def read_kept_admissions(folder: str | os.PathLike[str], model_version: str) -> KeptAdmissions:
    """The encoded admissions `model_version` answered whose outcomes arrived, from folder/outcomes.sqlite.

    Every row is used or counted by reason; OutcomeFileError when the file is missing or holds none."""
    path = pathlib.Path(folder) / STORE_FILE
    if not path.is_file():
        raise OutcomeFileError(f"{path}: no outcome store here (the service writes it with --outcome-dir)")
    # Read-only, and never creating the file: the service may be writing it (WAL lets both proceed).
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
        rows = db.execute(f"SELECT model_version, admission, outcome FROM {TABLE} ORDER BY predicted_at, "
                          "prediction_id").fetchall()
    counts = {"read": len(rows), "without_outcome": 0, "admission_not_kept": 0, "other_model_version": 0}
    records, outcomes, versions = [], [], set()
    for version, admission, outcome in rows:
        if outcome is None:
            counts["without_outcome"] += 1
        elif admission is None:
            counts["admission_not_kept"] += 1
        elif version != model_version:
            counts["other_model_version"] += 1
            versions.add(version)
        else:
            records.append(bytes(admission))
            outcomes.append(int(outcome))
    counts["used"] = len(records)
    if not records:
        why = (f"its {counts['other_model_version']} kept admissions with outcomes were answered by model version(s) "
               f"{', '.join(sorted(versions))}, not {model_version}" if versions else
               f"none of its {counts['read']} predictions has both a kept admission and an outcome "
               f"({counts['admission_not_kept']} outcomes without their admission: the service keeps admissions "
               "only with --outcome-keep-admissions)")
        raise OutcomeFileError(f"{path}: {why}")
    return KeptAdmissions(records, outcomes, counts)
