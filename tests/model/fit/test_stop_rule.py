"""The stopping rule and plateau schedule of the training loop, on given sequences of validation NLLs,
and a tiny real run that ends on the rule before its max_steps."""
from __future__ import annotations

import dataclasses
import math

import pytest
import tensorflow as tf

from model.fit.training_loop import BEST_FILE, BestTracker, LoopSettings, Progress, StopRule, advance, replay
from model.ehr.config import parse_config
from model.ehr.train import train
from tests.support.ehr_testdata import read_json, tiny_config_dict


def test_patience_counts_from_the_last_improvement_larger_than_min_delta():
    nlls = [0.70, 0.60, 0.59, 0.585, 0.62, 0.50]
    # min_delta 0.02: 0.59 and 0.585 are below 0.60 but by less, so they count against patience.
    p = replay(nlls, StopRule(patience=3, min_delta=0.02))
    assert p.stop and p.validations == 5  # 0.59, 0.585, 0.62: three in a row; 0.50 is never seen
    assert p.best_nll == 0.585 and p.best_index == 3  # the checkpoint kept is the lowest, however small the gain
    assert p.reference_nll == 0.60 and p.since_improvement == 3
    # Without min_delta the same sequence keeps going: each of them was a new best.
    p0 = replay(nlls, StopRule(patience=3))
    assert not p0.stop and p0.validations == 6 and p0.best_nll == 0.50 and p0.since_improvement == 0


def test_the_plateau_schedule_decays_every_decay_patience_validations_without_improvement():
    rule = StopRule(patience=5, min_delta=0.0, decay_patience=2, decay_factor=0.5)
    steps = []
    p = Progress()
    for nll in [1.0, 0.9, 0.95, 0.96, 0.97, 0.98, 0.8, 0.85, 0.86]:
        p = advance(p, nll, rule)
        steps.append((p.decayed, p.decays, p.stop))
    assert [d for d, _, _ in steps] == [False, False, False, True, False, True, False, False, True]
    assert steps[-1][1] == 3 and not any(stop for _, _, stop in steps)
    assert 0.5 ** p.decays == 0.125


def test_a_nan_never_improves_and_patience_zero_never_stops():
    p = replay([0.5, math.nan, math.nan, math.nan], StopRule(patience=3))
    assert p.stop and p.best_nll == 0.5
    p = replay([1.0 + i for i in range(50)], StopRule(patience=0, decay_patience=0))
    assert not p.stop and p.decays == 0 and p.best_index == 0


def test_the_tracker_applies_the_same_rule_and_resumes_it(tmp_path):
    rule = StopRule(patience=3, min_delta=0.02, decay_patience=1, decay_factor=0.5)
    tracker = BestTracker(tmp_path, patience=3, rule=rule)
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    nlls = [0.70, 0.60, 0.59, 0.585, 0.62]
    stops = [tracker.update(10 * (i + 1), nll, checkpoint) for i, nll in enumerate(nlls)]
    assert stops == [False] * 4 + [True]
    expected = replay(nlls, rule)
    assert (tracker.step, tracker.validation_nll) == (40, expected.best_nll)
    assert tracker.progress.decays == expected.decays == 3
    assert "early stop at step 50" in tracker.stop_reason and "best 0.5850 at step 40" in tracker.stop_reason
    resumed = BestTracker.load(tmp_path, patience=3, rule=rule)
    assert resumed.to_dict() == tracker.to_dict() and resumed.learning_rate_factor == 0.125


def test_no_stop_and_no_decay_before_min_steps_while_patience_counts_on(tmp_path):
    # A first plateau: the NLL sits still for six validations, then falls once the network finds its signal.
    rule = StopRule(patience=2, decay_patience=1, decay_factor=0.5, min_steps=70)
    tracker = BestTracker(tmp_path, patience=2, rule=rule)
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    nlls = [0.36, 0.36, 0.36, 0.36, 0.36, 0.36, 0.30, 0.31, 0.32]
    stops = [tracker.update(10 * (i + 1), nll, checkpoint) for i, nll in enumerate(nlls)]
    # Without min_steps the rule would stop at the third validation (step 30), two decays in.
    assert replay(nlls, StopRule(patience=2, decay_patience=1, decay_factor=0.5)).validations == 3
    assert stops == [False] * 8 + [True]  # patience 2 from the fall at step 70: the stop at step 90
    assert (tracker.step, tracker.validation_nll) == (70, 0.30)
    assert tracker.progress.decays == 2  # steps 80 and 90 only: none on the plateau before step 70
    assert "early stop at step 90" in tracker.stop_reason
    # Patience counted on the plateau: a run still on it at min_steps stops there.
    still = BestTracker(tmp_path / "still", patience=2, rule=dataclasses.replace(rule, min_steps=60))
    (tmp_path / "still").mkdir()
    assert [still.update(10 * (i + 1), 0.36, checkpoint) for i in range(6)] == [False] * 5 + [True]


def test_the_kl_warm_up_keeps_no_best_checkpoint_unless_it_is_the_whole_run():
    def settings(annealing, max_steps):
        return LoopSettings("run", max_steps, 100, 1.0, annealing, None, 10, 10, 10, 1, 3, "nll")

    assert settings(300, 2000).first_eligible_step == 300
    # All warm-up (or none): every validation counts, as before the rule.
    assert settings(3000, 2000).first_eligible_step == settings(2000, 2000).first_eligible_step == 0
    assert settings(0, 2000).first_eligible_step == 0


@pytest.mark.slow
def test_a_tiny_run_stops_on_the_rule_long_before_max_steps(tmp_path, synthetic_data):
    every, patience, min_delta, max_steps = 5, 2, 0.05, 3000
    config = parse_config(tiny_config_dict(
        "deterministic", steps=max_steps, eval_every_steps=every, log_every_steps=every,
        early_stopping_patience=patience, early_stopping_min_delta=min_delta, lr_schedule="plateau",
        lr_decay_patience=1, lr_decay_factor=0.5, checkpoint_every_steps=1000))
    result = train(config, synthetic_data, tmp_path / "run", progress=False, export_model=False)
    best = read_json(tmp_path / "run" / BEST_FILE)
    assert best["stopped_early"] and best["stop_reason"].startswith(f"early stop at step {result.step}")
    # A bound that holds for any optimiser path: each significant improvement lowers the NLL by more than
    # min_delta from the first validation's, and an NLL is >= 0, so at most first / min_delta + 1 of them,
    # each followed by at most `patience` validations.
    first = result.validation[0]["mixture_nll"]
    bound = every * (math.floor(first / min_delta) + 2) * (patience + 1)
    assert result.step <= bound < max_steps
    assert result.validation[-1]["step"] == result.step
    assert best["validation_nll"] == min(row["mixture_nll"] for row in result.validation)
    assert best["learning_rate_decays"] >= patience  # each validation without improvement decayed it
    rates = [row["learning_rate"] for row in result.history]
    # The logged rate halves at each decay (at least one falls between two logged steps).
    assert rates[0] == pytest.approx(0.01) and min(rates) < 0.0075
    assert all(any(r == pytest.approx(0.01 * 0.5 ** k, rel=1e-5) for k in range(40)) for r in rates)
