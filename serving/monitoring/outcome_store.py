"""The predictions the service made, kept until their outcomes arrive: SQLite under a configured folder.

Outcomes (death, discharge) arrive days or weeks after the answer, long after the monitor's window
has moved on, so each is matched to the prediction it belongs to by the identifier the service
returned with that answer, never to whatever the window holds when it arrives.

Privacy by design (docs/serving.md "Outcomes"): the store is off unless ``Settings.outcome_dir``
names a folder; a row holds the prediction identifier (random, carrying its creation time and
nothing about the patient), the model version and the export's checksum, the time, the predicted
probability and the model's sampled probabilities, and, only when ``keep_admissions`` is set (for
updating the model), the encoded admission (the model's own tensors: no names, raw identifiers or
free text). Rows older than the retention period are deleted (``purge``, run at start and then
hourly by the app).

The file's schema is ``model.adapt.outcome_file``'s, whose reader ``ehr-adapt --outcomes`` uses to
take the kept admissions as a site's local data.

SQLite in WAL mode with ``synchronous=FULL``: a row is on disk when ``record_*`` returns, so a
restart loses nothing; one connection behind a lock serves the event loop's threads.
"""
from __future__ import annotations

import os
import pathlib
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence

import numpy as np

from model.adapt.outcome_file import SCHEMA, STORE_FILE, TABLE, add_checksum_column

# Twelve hex digits of milliseconds since 1970 (until the year 10889) and 20 random hex digits
# (80 bits): the time says whether an identifier the store no longer holds has expired (410) or
# was never issued (404), and the random part cannot be guessed.
_TIME_DIGITS = 12
_RANDOM_BYTES = 10
ID_LENGTH = _TIME_DIGITS + 2 * _RANDOM_BYTES


class OutcomeError(ValueError):
    """An outcome the store refuses; ``status`` is the HTTP status that says why."""

    status = 400


class UnknownPrediction(OutcomeError):
    status = 404


class ExpiredPrediction(OutcomeError):
    status = 410


class ConflictingOutcome(OutcomeError):
    status = 409


def new_prediction_id(now: float) -> str:
    """A fresh identifier: creation time (ms, hex) then 80 random bits, 32 lowercase hex digits."""
    return f"{int(now * 1000):0{_TIME_DIGITS}x}{secrets.token_hex(_RANDOM_BYTES)}"


def issued_at(prediction_id: str) -> float | None:
    """The creation time (seconds since 1970) an identifier carries, or None when it is not one of ours."""
    if len(prediction_id) != ID_LENGTH or any(c not in "0123456789abcdef" for c in prediction_id):
        return None
    return int(prediction_id[:_TIME_DIGITS], 16) / 1000.0


class OutcomeStore:
    """Predictions and their outcomes in ``folder/outcomes.sqlite``; rows older than retention_s deleted by purge."""

    def __init__(self, folder: str | os.PathLike[str], *, retention_s: float, keep_admissions: bool = False):
        if retention_s <= 0:
            raise ValueError(f"retention must be positive, got {retention_s} s")
        self.path = pathlib.Path(folder) / STORE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.retention_s = float(retention_s)
        self.keep_admissions = keep_admissions
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        add_checksum_column(self._db)  # a file from before the column: its old rows stay unattributed (NULL)

    def close(self) -> None:
        """Closes the database (everything written is already on disk)."""
        with self._lock:
            self._db.close()

    def record_predictions(self, model_version: str, probabilities: Sequence[float], samples,
                           admissions: Sequence[bytes] | None = None, *, model_checksum: str,
                           now: float | None = None) -> list[str]:
        """Stores predictions (samples [n, M]) the export with `model_checksum` answered, in one transaction;
        returns their new identifiers.

        `admissions` (encoded examples) are kept only when the store keeps admissions."""
        now = time.time() if now is None else now
        samples = np.asarray(samples, dtype=np.float32)
        ids = [new_prediction_id(now) for _ in probabilities]
        kept = admissions if (self.keep_admissions and admissions is not None) else [None] * len(ids)
        rows = [(i, model_version, model_checksum, now, float(p), samples[j].tobytes(), kept[j])
                for j, (i, p) in enumerate(zip(ids, probabilities))]
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(f"INSERT INTO {TABLE} (prediction_id, model_version, model_checksum, predicted_at, "
                                 "probability, samples, admission) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")
        return ids

    def record_outcome(self, prediction_id: str, outcome: int, *, now: float | None = None) -> bool:
        """Stores the outcome (0 or 1) of a prediction; True when new, False when the same outcome was stored
        before (idempotent). Unknown, expired or conflicting: an OutcomeError saying which."""
        now = time.time() if now is None else now
        if outcome not in (0, 1):
            raise OutcomeError(f"outcome must be 0 or 1, got {outcome!r}")
        with self._lock:
            row = self._db.execute(f"SELECT predicted_at, outcome FROM {TABLE} WHERE prediction_id = ?",
                                   (prediction_id,)).fetchone()
            if row is None:
                created = issued_at(prediction_id)
                if created is not None and created < now - self.retention_s:
                    raise ExpiredPrediction(f"prediction {prediction_id} is older than the retention period "
                                            f"({self.retention_s / 86400:g} days): its row was deleted")
                raise UnknownPrediction(f"no prediction {prediction_id} in the outcome store")
            if row[0] < now - self.retention_s:
                raise ExpiredPrediction(f"prediction {prediction_id} is older than the retention period "
                                        f"({self.retention_s / 86400:g} days)")
            if row[1] is not None:
                if row[1] != outcome:
                    raise ConflictingOutcome(f"prediction {prediction_id} already has outcome {row[1]}, "
                                             f"not {outcome}")
                return False
            self._db.execute(f"UPDATE {TABLE} SET outcome = ?, outcome_at = ? WHERE prediction_id = ?",
                             (outcome, now, prediction_id))
        return True

    def purge(self, *, now: float | None = None) -> int:
        """Deletes every row older than the retention period; returns how many."""
        now = time.time() if now is None else now
        with self._lock:
            return self._db.execute(f"DELETE FROM {TABLE} WHERE predicted_at < ?",
                                    (now - self.retention_s,)).rowcount

    def counts(self) -> dict[str, int]:
        """Predictions held and how many of them have their outcome."""
        with self._lock:
            total, with_outcome = self._db.execute(
                f"SELECT COUNT(*), COUNT(outcome) FROM {TABLE}").fetchone()
        return {"predictions": int(total), "outcomes": int(with_outcome)}

    def matched(self, model_checksum: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(probability [n], sampled probabilities [n, M], outcome [n]) of every prediction with its outcome,
        oldest first; only the export with `model_checksum`'s when given (another export's probabilities say
        nothing of this one's calibration, and its samples may have another M)."""
        query = f"SELECT probability, samples, outcome FROM {TABLE} WHERE outcome IS NOT NULL"
        args: tuple = ()
        if model_checksum is not None:
            query += " AND model_checksum = ?"
            args = (model_checksum,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY predicted_at", args).fetchall()
        if not rows:
            return np.zeros(0), np.zeros((0, 0)), np.zeros(0)
        p = np.array([r[0] for r in rows], dtype=np.float64)
        columns = [np.frombuffer(r[1], dtype=np.float32) for r in rows]
        # Requests may ask for other numbers of samples S: the first S'K columns of a sample-major row are
        # S' samples of every member, so the fewest any row has keep the columns comparable.
        m = min(c.size for c in columns)
        samples = np.stack([c[:m].astype(np.float64) for c in columns])
        y = np.array([r[2] for r in rows], dtype=np.float64)
        return p, samples, y

