"""The outcome store on a real SQLite file: idempotent outcomes, clear refusals, retention, nothing lost on reopening."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from model.adapt.outcome_file import OutcomeFileError, read_kept_admissions
from serving.monitoring import outcome_store
from serving.monitoring.outcome_store import (ConflictingOutcome, ExpiredPrediction, OutcomeError, OutcomeStore,
                                              UnknownPrediction)

DAY = 86400.0
T0 = 1.8e9  # a fixed "now", seconds since 1970
# Export checksums (SHA-256 of manifest.json) of the exports that answer: one per version here.
SUM = {"1.0": "a1" * 32, "2.0": "b2" * 32}


def _store(folder, **kwargs) -> OutcomeStore:
    return OutcomeStore(folder, retention_s=kwargs.pop("retention_s", 30 * DAY), **kwargs)


def test_an_outcome_is_stored_once_and_the_same_outcome_again_changes_nothing(tmp_path):
    store = _store(tmp_path)
    [pid] = store.record_predictions("1.0", [0.2], [[0.1, 0.3]], model_checksum=SUM["1.0"], now=T0)
    assert len(pid) == outcome_store.ID_LENGTH and outcome_store.issued_at(pid) == pytest.approx(T0, abs=1e-3)
    assert store.record_outcome(pid, 1, now=T0 + DAY) is True
    assert store.record_outcome(pid, 1, now=T0 + 2 * DAY) is False
    with pytest.raises(ConflictingOutcome, match="already has outcome 1, not 0") as err:
        store.record_outcome(pid, 0, now=T0 + 2 * DAY)
    assert err.value.status == 409
    p, samples, y = store.matched()
    np.testing.assert_allclose(p, [0.2])
    np.testing.assert_allclose(samples, [[0.1, 0.3]], rtol=1e-6)
    assert y.tolist() == [1.0]


def test_unknown_expired_and_malformed_identifiers_say_which(tmp_path):
    store = _store(tmp_path, retention_s=10 * DAY)
    [pid] = store.record_predictions("1.0", [0.2], [[0.2]], model_checksum=SUM["1.0"], now=T0)
    with pytest.raises(UnknownPrediction, match="no prediction") as err:
        store.record_outcome(outcome_store.new_prediction_id(T0), 1, now=T0)
    assert err.value.status == 404
    with pytest.raises(UnknownPrediction):
        store.record_outcome("not-an-id", 1, now=T0)
    with pytest.raises(ExpiredPrediction, match="retention period") as err:
        store.record_outcome(pid, 1, now=T0 + 11 * DAY)  # still in the file: purge has not run
    assert err.value.status == 410
    assert store.purge(now=T0 + 11 * DAY) == 1
    with pytest.raises(ExpiredPrediction):  # deleted: its id still says when it was made
        store.record_outcome(pid, 1, now=T0 + 11 * DAY)
    with pytest.raises(OutcomeError, match="0 or 1"):
        store.record_outcome(pid, 2, now=T0)


def test_retention_deletes_exactly_the_rows_past_it(tmp_path):
    store = _store(tmp_path, retention_s=10 * DAY)
    old = store.record_predictions("1.0", [0.1, 0.2], [[0.1], [0.2]], model_checksum=SUM["1.0"], now=T0)
    new = store.record_predictions("1.0", [0.3], [[0.3]], model_checksum=SUM["1.0"], now=T0 + 5 * DAY)
    store.record_outcome(old[0], 0, now=T0 + DAY)
    assert store.purge(now=T0 + 10 * DAY - 1) == 0
    assert store.purge(now=T0 + 10 * DAY + 1) == 2
    with sqlite3.connect(store.path) as db:  # read by another connection: the rows are gone from the file
        assert [r[0] for r in db.execute("SELECT prediction_id FROM predictions")] == new


def test_reopening_the_folder_loses_nothing(tmp_path):
    store = _store(tmp_path)
    ids = store.record_predictions("1.0", [0.1, 0.9], [[0.1, 0.2], [0.8, 0.9]], model_checksum=SUM["1.0"], now=T0)
    store.record_outcome(ids[1], 1, now=T0 + 1)
    store.close()
    again = _store(tmp_path)
    assert again.counts() == {"predictions": 2, "outcomes": 1}
    assert again.record_outcome(ids[1], 1, now=T0 + 2) is False
    assert again.record_outcome(ids[0], 0, now=T0 + 2) is True


def test_admissions_are_kept_only_when_configured_and_read_through_the_one_reader(tmp_path):
    off = _store(tmp_path / "off")
    [a] = off.record_predictions("1.0", [0.5], [[0.5]], [b"encoded"], model_checksum=SUM["1.0"], now=T0)
    off.record_outcome(a, 1, now=T0)
    with pytest.raises(OutcomeFileError, match="1 outcomes without their admission: .*--outcome-keep-admissions"):
        read_kept_admissions(tmp_path / "off", SUM["1.0"])
    with sqlite3.connect(off.path) as db:
        assert db.execute("SELECT admission FROM predictions").fetchone() == (None,)
    on = _store(tmp_path / "on", keep_admissions=True)
    [b, c] = on.record_predictions("1.0", [0.5, 0.6], [[0.5], [0.6]], [b"encoded", b"second"],
                                   model_checksum=SUM["1.0"], now=T0)
    [d] = on.record_predictions("2.0", [0.7], [[0.7]], [b"other model"], model_checksum=SUM["2.0"], now=T0 + 1)
    on.record_outcome(d, 1, now=T0 + 1)
    with pytest.raises(OutcomeFileError,
                       match="answered by other export\\(s\\) \\(checksum b2b2b2b2b2b2...\\), not a1a1"):
        read_kept_admissions(tmp_path / "on", SUM["1.0"])  # nothing of this export has its outcome yet
    on.record_outcome(b, 0, now=T0 + 2)
    kept = read_kept_admissions(tmp_path / "on", SUM["1.0"])  # while the service holds the file open
    assert (kept.records, kept.outcomes) == ([b"encoded"], [0])
    assert kept.counts == {"read": 3, "without_outcome": 1, "admission_not_kept": 0, "other_model": 1,
                           "model_not_recorded": 0, "used": 1}
    with pytest.raises(OutcomeFileError, match="no outcome store here"):
        read_kept_admissions(tmp_path / "absent", SUM["1.0"])


def test_matched_keeps_one_version_and_the_samples_every_row_has(tmp_path):
    store = _store(tmp_path)
    # Sample-major rows: S = 2 and S = 1 of K = 2 members; the first S'K = 2 columns are comparable.
    a = store.record_predictions("1.0", [0.25], [[0.1, 0.2, 0.3, 0.4]], model_checksum=SUM["1.0"], now=T0)
    b = store.record_predictions("1.0", [0.55], [[0.5, 0.6]], model_checksum=SUM["1.0"], now=T0 + 1)
    c = store.record_predictions("2.0", [0.9], [[0.9, 0.9]], model_checksum=SUM["2.0"], now=T0 + 2)
    for pid in (*a, *b, *c):
        store.record_outcome(pid, 1, now=T0 + 3)
    p, samples, y = store.matched(SUM["1.0"])
    np.testing.assert_allclose(p, [0.25, 0.55])
    np.testing.assert_allclose(samples, [[0.1, 0.2], [0.5, 0.6]], rtol=1e-6)
    assert store.matched()[0].size == 3


def test_a_non_positive_retention_is_refused(tmp_path):
    with pytest.raises(ValueError, match="retention"):
        _store(tmp_path, retention_s=0)


def test_two_exports_of_one_version_keep_their_outcomes_apart(tmp_path):
    """An update (ehr-adapt) or a retrained model keeps the package's version: only the checksum tells them apart."""
    store = _store(tmp_path, keep_admissions=True)
    parent, update = "c3" * 32, "d4" * 32
    [a] = store.record_predictions("1.0", [0.2], [[0.2]], [b"parent's"], model_checksum=parent, now=T0)
    [b] = store.record_predictions("1.0", [0.8], [[0.8]], [b"update's"], model_checksum=update, now=T0 + 1)
    for pid in (a, b):
        store.record_outcome(pid, 1, now=T0 + 2)
    assert store.matched(parent)[0].tolist() == [0.2] and store.matched(update)[0].tolist() == [0.8]
    kept = read_kept_admissions(tmp_path, update)
    assert kept.records == [b"update's"] and kept.counts["other_model"] == 1


def test_a_store_from_before_the_checksum_column_is_upgraded_and_its_old_rows_stay_unattributed(tmp_path):
    old_schema = """CREATE TABLE predictions (prediction_id TEXT PRIMARY KEY, model_version TEXT NOT NULL,
        predicted_at REAL NOT NULL, probability REAL NOT NULL, samples BLOB NOT NULL, admission BLOB,
        outcome INTEGER, outcome_at REAL)"""
    with sqlite3.connect(tmp_path / "outcomes.sqlite") as db:
        db.execute(old_schema)
        db.execute("INSERT INTO predictions VALUES (?, '1.0', ?, 0.5, ?, ?, 1, ?)",
                   (outcome_store.new_prediction_id(T0), T0, np.float32([0.5]).tobytes(), b"old", T0))
    with pytest.raises(OutcomeFileError, match="1 kept admissions with outcomes were stored before the store recorded"):
        read_kept_admissions(tmp_path, SUM["1.0"])  # read-only: the old file as it is
    store = _store(tmp_path, keep_admissions=True)
    [pid] = store.record_predictions("1.0", [0.3], [[0.3]], [b"new"], model_checksum=SUM["1.0"], now=T0 + 1)
    store.record_outcome(pid, 0, now=T0 + 2)
    assert store.counts() == {"predictions": 2, "outcomes": 2}  # nothing lost by the upgrade
    assert store.matched(SUM["1.0"])[0].tolist() == [0.3]
    kept = read_kept_admissions(tmp_path, SUM["1.0"])
    assert kept.records == [b"new"] and kept.counts["model_not_recorded"] == 1
