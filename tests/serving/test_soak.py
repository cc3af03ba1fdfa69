"""bench/service/soak.py for a few seconds, so it cannot rot: a real ehr-serve, 8 clients, the monitored routes all 2xx."""
from __future__ import annotations

import json
import sys

import pytest

from tests.support.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))  # bench/ is not installed: its scripts import as bench.FAMILY.NAME from the root

from bench.service import soak  # noqa: E402


@pytest.mark.slow
def test_a_short_soak_answers_every_monitored_call_and_reports_its_table(tmp_path, capsys, reference_export):
    export = reference_export  # its training folder records chart:211 as 5.0 only
    assert soak.constant_codes(export) == {"chart:211"}
    # 3 seconds are enough: the 8 clients' first draws (seeds 0-7) are /v1/predict/batch, /v1/predict,
    # /v1/monitor and /metrics, so every route is called by the clients' first calls (checked below).
    rc = soak.main(["--model", str(export), "--mimic-dir", str(tmp_path / "no-release"), "--synthetic-patients", "15",
                    "--duration", "3", "--rss-every", "0.5", "--num-samples", "2", "--no-write"])
    out = capsys.readouterr().out
    assert "| non-2xx answers on /metrics | 0 | 0 | yes |" in out
    assert "| non-2xx answers on /v1/monitor | 0 | 0 | yes |" in out
    assert "| ehr_monitor_errors_total at the end | 0 | 0 | yes |" in out
    rows = {line.split("|")[1].strip(" `"): line for line in out.splitlines() if line.startswith("| `/")}
    assert set(rows) == set(soak.ROUTES)
    assert all(int(rows[route].split("|")[2]) >= 1 for route in soak.ROUTES), rows  # every route was called
    assert rc in (0, 1)  # 1: the RSS slope of a 3-second run (warm-up) is not a soak's


def test_rss_summary_against_its_definition():
    samples = [(0.0, 100.0), (30.0, 110.0), (60.0, 120.0), (90.0, 121.0), (120.0, 122.0)]
    s = soak.rss_summary(samples)
    assert (s["start"], s["middle"], s["end"]) == (100.0, 120.0, 122.0)
    assert s["slope_second_half"] == pytest.approx(2.0)  # 120 -> 121 -> 122 MiB over the last minute
    assert json.dumps(s)
