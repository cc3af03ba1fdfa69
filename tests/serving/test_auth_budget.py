"""Failed authentications are limited per client address and logged with it, never with the key.

The window is checked against a naive reference (every failure kept in a list, the window
recounted from scratch); the budget over a real server on 127.0.0.1 (the session's fixture export).
"""
from __future__ import annotations

import logging
import time

import httpx
import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

from serving.api.app import create_app
from serving.api.auth import FailureWindow
from serving.inference.served_model import ServedModel
from serving.settings import make_settings
from tests.support.serving_fixtures import ThreadedServer

KEY = "test-key-auth-budget-0123456789"
WRONG = "not-the-key-but-long-enough-0123"
BUDGET, WINDOW_S = 3, 2.0
REQUEST = {"patient": {"gender": "F", "age_years": 70.0},
           "admission": {"admit_time": "2150-01-01T00:00:00", "admission_type": "EMERGENCY"}, "events": []}


@hyp_settings(max_examples=200, deadline=None)
@given(limit=st.integers(0, 4), window=st.sampled_from([1.0, 2.5, 10.0]),
       steps=st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.0, 3.0), st.booleans()), max_size=40))
def test_the_window_matches_a_naive_recount(limit, window, steps):
    guard, failures, now = FailureWindow(limit, window), {}, 0.0
    for address, dt, fails in steps:
        now += dt
        recent = [t for t in failures.get(address, []) if t > now - window]
        expected = min(recent) + window - now if limit and len(recent) >= limit else 0.0
        assert guard.wait_s(address, now) == pytest.approx(expected)
        if expected == 0.0 and fails:  # a waiting address is not asked for a key, so it cannot fail again
            failures.setdefault(address, []).append(now)
            assert guard.record(address, now) == (len(recent) + 1 if limit else 0)


def test_the_table_forgets_the_oldest_address_first():
    guard = FailureWindow(1, 60.0, max_addresses=2)
    for i, address in enumerate(["a", "b", "c"]):
        guard.record(address, float(i))
    assert [guard.wait_s(a, 3.0) > 0 for a in "abc"] == [False, True, True]


@pytest.fixture(scope="module")
def server(fixture_export):
    settings = make_settings(api_keys=[KEY], model_dir=fixture_export, warmup=False, auth_failures=BUDGET,
                             auth_window_s=WINDOW_S)
    with ThreadedServer(create_app(settings, ServedModel.load(fixture_export))) as srv:
        yield srv


def test_an_address_out_of_its_budget_waits_whatever_key_it_sends(server, caplog):
    caplog.set_level(logging.WARNING, logger="serving.api.auth")
    with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
        first = time.monotonic()
        statuses = [c.post("/v1/predict", json=REQUEST, headers={"X-API-Key": WRONG}).status_code,
                    c.get("/v1/model").status_code,  # no key: a failure too, counted by the route's dependency
                    c.post("/v1/predict", json=REQUEST, headers={"Authorization": f"Bearer {WRONG}"}).status_code]
        assert statuses == [401] * BUDGET
        # The right key now wins nothing: it is not even checked until the first failure is WINDOW_S old.
        limited = [c.post("/v1/predict", json=REQUEST, headers={"X-API-Key": KEY}),
                   c.get("/v1/model", headers={"X-API-Key": KEY})]
        assert [r.status_code for r in limited] == [429, 429]
        waits = [int(r.headers["retry-after"]) for r in limited]
        assert all(0 < w <= WINDOW_S for w in waits) and "retry" in limited[0].json()["detail"]
        assert c.get("/healthz").status_code == 200  # no key asked, none counted
        time.sleep(max(0.0, first + WINDOW_S - time.monotonic()) + 0.1)
        assert c.post("/v1/predict", json=REQUEST, headers={"X-API-Key": KEY}).status_code == 200
        metrics = c.get("/metrics", headers={"X-API-Key": KEY}).text
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auth_failed")]
    assert len(failed) == BUDGET and all("client=127.0.0.1" in m and "request_id=" in m for m in failed)
    assert [m.split("reason=")[1].split()[0] for m in failed] == ["invalid", "missing", "invalid"]
    assert "limited" in failed[-1] and not any(WRONG in m or KEY in m for m in caplog.messages)
    for reason, n in (("invalid", 2), ("missing", 1), ("limited", 2)):
        assert f'ehr_auth_failures_total{{reason="{reason}"}} {float(n)}' in metrics
