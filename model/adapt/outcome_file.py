"""The service's outcome store file (``outcomes.sqlite``): its schema, and the one reader of its kept admissions.

The service (``serving.monitoring.outcome_store``) writes the file; ``ehr-adapt --outcomes`` reads it
as a site's local data. The schema lives here, below both, so that writer and reader share it
(``model`` may not import ``serving``). Cheap to import: sqlite3 and the standard library only, as the
service imports it on its road.

A row holds one answered prediction: its identifier, the model version and export checksum (the SHA-256
of its manifest.json: two exports of one package version differ in it) that answered, the time
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
    model_checksum TEXT,
    predicted_at REAL NOT NULL,
    probability REAL NOT NULL,
    samples BLOB NOT NULL,
    admission BLOB,
    outcome INTEGER,
    outcome_at REAL
);
CREATE INDEX IF NOT EXISTS predicted_at ON {TABLE} (predicted_at);
"""
# Files written before the store recorded the export's checksum lack the column: their rows read as
# NULL there, answered by an export that can no longer be told apart from another of its version.
CHECKSUM_COLUMN = "model_checksum"


def has_checksum_column(db: sqlite3.Connection) -> bool:
    """Whether the store's table has the model_checksum column (files from before it do not)."""
    return any(row[1] == CHECKSUM_COLUMN for row in db.execute(f"PRAGMA table_info({TABLE})"))


def add_checksum_column(db: sqlite3.Connection) -> None:
    """Adds the model_checksum column to a store file written before it (a no-op on newer ones)."""
    if not has_checksum_column(db):
        db.execute(f"ALTER TABLE {TABLE} ADD COLUMN {CHECKSUM_COLUMN} TEXT")


class OutcomeFileError(ValueError):
    """An outcome store that cannot serve as local data; the message names the file and what is missing."""


@dataclasses.dataclass(frozen=True)
class KeptAdmissions:
    """The kept admissions of one export with their outcomes, oldest first, and every row counted."""

    records: list[bytes]
    outcomes: list[int]
    counts: dict[str, int]  # read, without_outcome, admission_not_kept, other_model, model_not_recorded, used


def read_kept_admissions(folder: str | os.PathLike[str], model_checksum: str) -> KeptAdmissions:
    """The encoded admissions the export with `model_checksum` answered whose outcomes arrived, from
    folder/outcomes.sqlite (rows of another export, or of one the store did not record, are counted, not used).

    Every row is used or counted by reason; OutcomeFileError when the file is missing or holds none."""
    path = pathlib.Path(folder) / STORE_FILE
    if not path.is_file():
        raise OutcomeFileError(f"{path}: no outcome store here (the service writes it with --outcome-dir)")
    # Read-only, and never creating the file: the service may be writing it (WAL lets both proceed).
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
        checksum = CHECKSUM_COLUMN if has_checksum_column(db) else "NULL"
        rows = db.execute(f"SELECT {checksum}, admission, outcome FROM {TABLE} ORDER BY predicted_at, "
                          "prediction_id").fetchall()
    counts = {"read": len(rows), "without_outcome": 0, "admission_not_kept": 0, "other_model": 0,
              "model_not_recorded": 0}
    records, outcomes, others = [], [], set()
    for answered_by, admission, outcome in rows:
        if outcome is None:
            counts["without_outcome"] += 1
        elif admission is None:
            counts["admission_not_kept"] += 1
        elif answered_by is None:
            counts["model_not_recorded"] += 1
        elif answered_by != model_checksum:
            counts["other_model"] += 1
            others.add(answered_by[:12])
        else:
            records.append(bytes(admission))
            outcomes.append(int(outcome))
    counts["used"] = len(records)
    if not records:
        why = (f"its {counts['other_model']} kept admissions with outcomes were answered by other export(s) "
               f"(checksum {', '.join(sorted(others))}...), not {model_checksum[:12]}..." if others else
               f"its {counts['model_not_recorded']} kept admissions with outcomes were stored before the store "
               "recorded which export answered, so none can be attributed to this one"
               if counts["model_not_recorded"] else
               f"none of its {counts['read']} predictions has both a kept admission and an outcome "
               f"({counts['admission_not_kept']} outcomes without their admission: the service keeps admissions "
               "only with --outcome-keep-admissions)")
        raise OutcomeFileError(f"{path}: {why}")
    return KeptAdmissions(records, outcomes, counts)
