"""bench/methods/performance_estimate.py's pure parts: a cell's numbers against their definitions, the alarm streams,
the tables."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from tests.support.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/methods/performance_estimate.py", "bench_performance_estimate_under_test")


def test_a_model_that_is_the_truth_is_estimated_at_the_truth_and_covered(bench):
    rng = np.random.default_rng(0)
    truth = rng.beta(1.0, 7.0, size=1500)
    labels = (rng.random(truth.size) < truth).astype(float)
    probs = np.repeat(truth[:, None], 4, axis=1)  # four identical posterior columns: no doubt about the risks
    args = argparse.Namespace(draws=400, streams=10, nannyml_python=None)
    cell = bench.score_cell(args, probs, labels, truth, truth[:500], labels[:500], 0.5, seed=3)
    for name in bench.METRICS:
        row = cell["metrics"][name]
        assert row["covered"], (name, row)
        # Same generating probabilities, different draws: the two means agree to Monte-Carlo error.
        assert abs(row["estimate"] - row["truth_expected"]) < 0.25 * row["realized_width"], (name, row)
        assert row["width"] / row["realized_width"] == pytest.approx(1.0, abs=0.3)
    assert cell["cbpe_auroc"] is None and cell["n"] == 1500


def test_streams_of_a_calibrated_model_rarely_fire_and_those_of_a_site_dying_twice_as_often_do(bench):
    rng = np.random.default_rng(1)
    p = rng.beta(1.0, 7.0, size=400)
    calm = bench.stream_power(p, p, streams=20, seed=0)
    loud = bench.stream_power(p, np.minimum(2.0 * p, 1.0), streams=20, seed=0)
    assert calm["oe"]["3000"] <= 0.15  # at most 5 % expected; 20 streams
    assert loud["oe"]["300"] >= 0.9 and loud["oe"]["3000"] == 1.0
    assert list(calm["oe"]) == ["300", "1000", "3000"] and calm["oe"]["300"] <= calm["oe"]["1000"] <= calm["oe"]["3000"]
    assert max(calm["slope"].values()) <= 0.2  # one 5 % test per size; 20 streams


def test_the_slope_test_sees_a_site_whose_predictors_act_half_as_strongly_where_the_oe_alarm_does_not(bench):
    rng = np.random.default_rng(4)
    p = rng.beta(1.0, 4.0, size=400)
    logit = np.log(p) - np.log1p(-p)
    # Half the model's log-odds around the logit of its mean risk: the same share of deaths, flatter risks.
    centre = np.log(p.mean()) - np.log1p(-p.mean())
    flat = 1.0 / (1.0 + np.exp(-(centre + 0.5 * (logit - centre))))
    power = bench.stream_power(p, flat, streams=20, seed=0)
    assert power["slope"]["3000"] >= 0.9 and power["slope"]["300"] <= power["slope"]["3000"]
    assert power["oe"]["3000"] < power["slope"]["3000"]


def test_the_tables_show_every_site_and_cell(bench):
    rng = np.random.default_rng(2)
    truth = rng.beta(1.0, 7.0, size=300)
    labels = (rng.random(truth.size) < truth).astype(float)
    args = argparse.Namespace(draws=100, streams=2, nannyml_python=None)
    cells = [{"site": site, "seed": seed, **bench.score_cell(args, truth[:, None], labels, truth, truth, labels, 0.5,
                                                             seed)} for site, seed in (("A", 1), ("D", 2))]
    doc = {"command": "python bench/methods/performance_estimate.py --quick", "patients": 300, "releases": 1,
           "steps": 60, "samples": 1, "draws": 100, "streams": 2, "seconds": 1.0, "cells": cells}
    text = bench.format_tables(doc)
    # three metrics, one paired row and one release row each
    assert text.count("| A | ") == 5 and text.count("| D | ") == 5
    assert "--quick" in text.splitlines()[0]
