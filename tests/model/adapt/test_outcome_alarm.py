"""The O/E alarm: its exact interval against the Poisson distribution itself, its false-alarm rate on calibrated
streams, its power on a site that dies more, and the closed test among recalibrations."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from model.adapt.closed_test import recalibration_closed_test
from model.adapt import outcome_alarm as oa


@pytest.mark.parametrize("observed", [0, 1, 7, 40])
def test_the_interval_is_the_exact_poisson_one(observed):
    lower, upper = oa.poisson_interval(observed, 0.05)
    # Garwood: at each bound the observed count is exactly alpha/2 in the tail.
    assert stats.poisson.cdf(observed, upper) == pytest.approx(0.025, rel=1e-6)
    if observed == 0:
        assert lower == 0.0
    else:
        assert stats.poisson.sf(observed - 1, lower) == pytest.approx(0.025, rel=1e-6)


def test_looks_double_and_their_levels_sum_to_alpha():
    assert oa.looks(99) == [] and oa.looks(850) == [100, 200, 400, 800]
    assert sum(oa.look_level(i) for i in range(60)) == pytest.approx(oa.ALPHA)


def test_a_calibrated_model_raises_at_most_alpha_false_alarms_over_long_streams():
    rng = np.random.default_rng(0)
    fired = 0
    streams = 300
    for _ in range(streams):
        p = rng.beta(1.0, 8.0, size=1600)
        y = (rng.random(p.size) < p).astype(float)
        fired += oa.first_alarm(p, y) is not None
    # The bound is 5 % (conservative Poisson tests make it lower); 300 streams: 9 % is 3 sds above 5 %.
    assert fired / streams <= 0.09


def test_a_site_dying_sixty_percent_more_is_named_within_a_few_hundred_outcomes():
    rng = np.random.default_rng(1)
    p = rng.beta(1.0, 8.0, size=400)
    y = (rng.random(p.size) < np.minimum(1.6 * p, 1.0)).astype(float)
    alarm = oa.oe_alarm(p, y)
    assert alarm["fires"] and alarm["direction"] == "under-predicts" and alarm["look"] == 400
    assert alarm["first_fired_at"] in (100, 200, 400)
    assert alarm["words"].startswith("the model under-predicts deaths at this site: O/E ")
    assert "over 400 outcomes" in alarm["words"]
    over = oa.oe_alarm(p, (rng.random(p.size) < 0.4 * p).astype(float))
    assert over["fires"] and over["direction"] == "over-predicts"


def test_before_the_first_look_nothing_is_tested():
    alarm = oa.oe_alarm([0.1] * 50, [1] * 50)
    assert alarm["fires"] is False and alarm["look"] is None and "100" in alarm["words"]


def test_observed_expected_counts():
    got = oa.observed_expected([0.1, 0.2, 0.2], [0, 1, 1])
    assert got["observed"] == 2 and got["expected"] == pytest.approx(0.5) and got["ratio"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="expect no deaths"):
        oa.observed_expected([0.0, 0.0], [0, 1])


@pytest.mark.parametrize("ll, step", [
    ({"none": -100.0, "recalibrate-intercept": -99.9, "recalibrate": -99.5}, "none"),
    ({"none": -110.0, "recalibrate-intercept": -100.2, "recalibrate": -100.0}, "recalibrate-intercept"),
    ({"none": -110.0, "recalibrate-intercept": -108.0, "recalibrate": -100.0}, "recalibrate"),
])
def test_the_closed_test_among_recalibrations_picks_the_first_rung_not_rejected(ll, step):
    result = recalibration_closed_test(ll)
    assert result.step == step
    first = result.tests[0]
    assert first.df == 2 and first.p_value == pytest.approx(stats.chi2.sf(2 * (ll["recalibrate"] - ll["none"]), 2))
