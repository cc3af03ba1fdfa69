"""The traffic split between versions: its hash against an independent SHA-256, its share over 2,000 distinct
admissions, its stickiness, the routing key, the --traffic-split syntax, and the repository's start-up refusals.

All deterministic (the hash is fixed): no server, no model.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import logging

import pytest

from serving.inference.model_versions import admission_key, find_versions, key_of, load_versions
from serving.inference.served_model import ModelDirError
from serving.inference.traffic_split import bucket, choose_version
from serving.schemas import PredictRequest
from serving.settings import SettingsError, make_settings, parse_traffic_split

SPLIT = {1: 90, 2: 10}
ADMIT = dt.datetime(2150, 3, 1, 8, 30)


def distinct_keys(n: int) -> list[str]:
    """n distinct admissions' keys: one patient born each day, admitted at one time."""
    born = dt.date(2080, 1, 1)
    return [key_of("F", born + dt.timedelta(days=i), None, ADMIT) for i in range(n)]


def test_the_bucket_is_the_first_eight_bytes_of_sha256_modulo_100():
    for key in distinct_keys(50):
        assert bucket(key) == int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) % 100


def test_a_90_10_split_gives_2000_distinct_admissions_within_2_points_of_90_10():
    chosen = [choose_version(key, SPLIT) for key in distinct_keys(2000)]
    share = chosen.count(2) / len(chosen)
    assert abs(share - 0.10) <= 0.02, share
    assert set(chosen) == {1, 2}


def test_the_same_admission_reaches_the_same_version_every_time():
    keys = distinct_keys(2000)
    first = [choose_version(k, SPLIT) for k in keys]
    assert [choose_version(k, dict(SPLIT)) for k in keys] == first


def test_the_split_hands_out_runs_of_buckets_in_the_order_it_names_its_versions():
    for key in distinct_keys(200):
        assert choose_version(key, {1: 90, 2: 10}) == (1 if bucket(key) < 90 else 2)
        assert choose_version(key, {2: 10, 1: 90}) == (2 if bucket(key) < 10 else 1)


def request(**admission) -> PredictRequest:
    return PredictRequest.model_validate({"patient": {"gender": "M", "date_of_birth": "2080-05-17"},
                                          "admission": admission, "events": []})


def test_one_admission_has_one_key_whatever_its_events_its_type_or_the_offset_its_time_is_written_in():
    key = admission_key(request(admit_time="2150-03-01T08:30:00"))
    assert key == "M|2080-05-17|2150-03-01T08:30:00+00:00"
    assert admission_key(request(admit_time="2150-03-01T09:30:00+01:00", admission_type="URGENT")) == key
    assert admission_key(request(admit_time="2150-03-01T08:31:00")) != key


def test_the_split_syntax_and_its_one_line_errors():
    assert parse_traffic_split("1=90, 2=10") == {1: 90, 2: 10}
    assert list(parse_traffic_split("2=10,1=90")) == [2, 1]
    repo = {"model_repository": "repo", "no_auth": True}
    assert make_settings(traffic_split="1=90,2=10", **repo).traffic_split == {1: 90, 2: 10}
    for text, message in [("1=90,2=20", "sum to 100"), ("1=90;2=10", "VERSION=PERCENT"), ("1=100", "two or more"),
                          ("1=90,1=10", "named twice"), ("0=90,1=10", "positive")]:
        with pytest.raises(SettingsError, match=message):
            make_settings(traffic_split=text, **repo)
    with pytest.raises(SettingsError, match="choose among the versions of --model-repository"):
        make_settings(model_dir="export", traffic_split="1=90,2=10", no_auth=True)
    with pytest.raises(SettingsError, match="exactly one of --model DIR"):
        make_settings(no_auth=True)


def test_a_repository_is_read_as_triton_lays_it_out(tmp_path, caplog):
    for folder in ("mortality/2", "mortality/10", "mortality/1", "mortality/latest", "mortality/0"):
        (tmp_path / folder).mkdir(parents=True)
    with caplog.at_level(logging.WARNING, "serving.inference.model_versions"):
        name, versions = find_versions(tmp_path)
    assert (name, list(versions)) == ("mortality", ["1", "2", "10"])
    assert "2 entries that are not version folders" in caplog.text and "latest" in caplog.text
    (tmp_path / "other").mkdir()
    with pytest.raises(ModelDirError, match="serves one model, found 2 model folders"):
        find_versions(tmp_path)


def test_no_version_that_loads_stops_start_up_naming_each_and_why(tmp_path, caplog):
    for version in ("1", "2"):
        (tmp_path / "mortality" / version).mkdir(parents=True)
    settings = make_settings(model_repository=tmp_path, no_auth=True)
    with caplog.at_level(logging.ERROR, "serving.inference.model_versions"), \
            pytest.raises(ModelDirError, match=r"no version of mortality loads: 1: .*; 2: "):
        load_versions(settings)
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and all("\n" not in line for line in skipped)
    missing = make_settings(model_repository=tmp_path, no_auth=True, default_version=3)
    with pytest.raises(ModelDirError, match="has no version 3"):
        load_versions(missing)
