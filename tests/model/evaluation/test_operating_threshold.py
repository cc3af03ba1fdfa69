"""The operating threshold (--threshold), O/E with its interval and where the decision curve beats both defaults,
each against a brute-force or textbook computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from model.cli import ehr_eval
from model.evaluation.statistics import clinical_stats, small_sample


@pytest.mark.parametrize("text, kind, value", [("0.5", "probability", 0.5), ("0.07", "probability", 0.07),
                                               ("sensitivity:0.8", "sensitivity", 0.8)])
def test_parse_rule_reads_a_probability_or_a_target_sensitivity(text, kind, value):
    rule = small_sample.parse_rule(text)
    assert (rule.kind, rule.value, rule.text) == (kind, value, text)


@pytest.mark.parametrize("text", ["1.5", "0", "specificity:0.9", "sensitivity:high", "nan"])
def test_parse_rule_refuses_with_one_line(text):
    with pytest.raises(ValueError, match="--threshold") as err:
        small_sample.parse_rule(text)
    assert "\n" not in str(err.value)


def test_the_cli_refuses_a_bad_threshold_before_any_work(capsys):
    with pytest.raises(SystemExit) as code:
        ehr_eval.main(["--baseline", "logistic", "--data", ".", "--threshold", "sensitivity:2"])
    assert code.value.code == 2 and "--threshold" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(6))
def test_sensitivity_threshold_is_the_highest_candidate_that_reaches_the_target(seed):
    rng = np.random.default_rng(seed)
    n = 60
    y = (rng.random(n) < 0.3).astype(int)
    p = np.round(rng.beta(2, 5, n), 2)  # rounded: ties between deaths and survivors
    target = rng.uniform(0.3, 0.95)
    chosen = small_sample.sensitivity_threshold(p, y, target)
    naive = max(t for t in np.unique(p) if np.mean(p[y == 1] >= t) >= target)
    assert chosen == naive


def test_choose_uses_the_default_and_says_so_when_validation_is_too_small():
    y = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0])  # the demo's validation size: 9 cases, 3 deaths
    p = np.linspace(0.1, 0.5, 9)
    record = small_sample.choose_threshold(small_sample.parse_rule("sensitivity:0.8"), p, y)
    assert record["threshold"] == 0.5 and record["chosen_on"] == "default"
    assert "too small" in record["rationale"] and record["validation"] == {"n": 9, "events": 3}
    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.2).astype(int)
    p = np.clip(0.2 + 0.3 * y + rng.normal(0, 0.1, 200), 0.01, 0.99)
    record = small_sample.choose_threshold(small_sample.parse_rule("sensitivity:0.8"), p, y)
    assert record["chosen_on"] == "validation" and record["validation"]["sensitivity"] >= 0.8
    assert np.mean(p[y == 1] >= record["threshold"]) == record["validation"]["sensitivity"]


def test_observed_expected_interval_is_debray_et_al():
    cell = small_sample.observed_expected(4, 1.76, 11)
    se = math.sqrt((1 - 4 / 11) / 4)
    z = norm.ppf(0.975)
    assert cell["estimate"] == pytest.approx(4 / 1.76)
    assert cell["lower"] == pytest.approx(4 / 1.76 / math.exp(z * se))
    assert cell["upper"] == pytest.approx(4 / 1.76 * math.exp(z * se))
    assert small_sample.observed_expected(0, 1.0, 11)["estimable"] is False


def test_useful_ranges_are_the_runs_where_the_model_beats_both_defaults():
    rng = np.random.default_rng(4)
    y = (rng.random(300) < 0.25).astype(int)
    p = np.clip(0.25 + 0.2 * (y - 0.25) + rng.normal(0, 0.12, 300), 0.01, 0.99)
    curve = clinical_stats.decision_curve(p, y, n_bootstrap=5)
    runs = clinical_stats.useful_ranges(curve)
    beats = {t for t, m, a in zip(curve["thresholds"], curve["model"], curve["treat_all"]) if m > max(a, 0.0)}
    covered = {t for t in curve["thresholds"] if any(lo <= t <= hi for lo, hi in runs)}
    assert runs and covered == beats
    # Runs are maximal: the threshold after each run's end does not beat both.
    step = dict(zip(curve["thresholds"], curve["thresholds"][1:]))
    assert all(step.get(hi) not in beats for _, hi in runs)
