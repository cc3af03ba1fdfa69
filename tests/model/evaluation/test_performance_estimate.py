"""The performance estimate against independent computations: every outcome enumerated on a tiny case,
closed forms where the model is the truth, intervals that shrink with the population."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from model.evaluation.statistics import metrics_report as pe

THRESHOLDS = (0.1, 0.3)


def _enumerated(p: np.ndarray, columns: np.ndarray) -> dict[str, tuple[float, float]]:
    """(mean, variance) of each metric over every outcome vector, a column drawn uniformly first.

    Scikit-learn scores the rankings; AUROC and AUC-PR are conditioned on both classes present,
    as the estimate's mean over draws with both classes is.
    """
    sums: dict[str, list[tuple[float, float]]] = {name: [] for name in
                                                  ("auc_roc", "auc_pr", "brier", "observed_expected",
                                                   *(f"nb{t}" for t in THRESHOLDS))}
    for column in columns.T:
        for outcome in itertools.product((0, 1), repeat=p.size):
            y = np.array(outcome, dtype=float)
            weight = np.prod(np.where(y == 1, column, 1 - column)) / columns.shape[1]
            both = 0 < y.sum() < y.size
            if both:
                sums["auc_roc"].append((weight, roc_auc_score(y, p)))
                sums["auc_pr"].append((weight, average_precision_score(y, p)))
            sums["brier"].append((weight, float(np.mean((p - y) ** 2))))
            sums["observed_expected"].append((weight, y.sum() / p.sum()))
            for t in THRESHOLDS:
                treat = p >= t
                n = p.size
                nb = np.sum(treat & (y == 1)) / n - np.sum(treat & (y == 0)) / n * t / (1 - t)
                sums[f"nb{t}"].append((weight, nb))
    out = {}
    for name, rows in sums.items():
        w = np.array([r[0] for r in rows])
        v = np.array([r[1] for r in rows])
        mean = float(np.sum(w * v) / w.sum())
        out[name] = (mean, float(np.sum(w * (v - mean) ** 2) / w.sum()))
    return out


@pytest.mark.parametrize("columns", [1, 3])
def test_estimate_matches_every_outcome_enumerated(columns):
    rng = np.random.default_rng(7)
    n = 7
    probs = rng.uniform(0.05, 0.9, size=(n, columns))
    p = probs.mean(axis=1)
    exact = _enumerated(p, probs)
    n_draws = 20_000
    got = pe.expected_performance(p, probs, thresholds=THRESHOLDS, n_draws=n_draws, seed=3)
    rows = {**got["metrics"], **{f"nb{row['threshold']}": row for row in got["net_benefit"]}}
    for name, (mean, variance) in exact.items():
        # Five Monte-Carlo standard errors: a bound that a correct estimator leaves with probability ~1e-6.
        tolerance = 5.0 * np.sqrt(variance / rows[name]["n_draws"]) + 1e-12
        assert abs(rows[name]["estimate"] - mean) <= tolerance, (name, rows[name]["estimate"], mean, tolerance)


def test_model_equal_to_truth_expects_the_truths_metrics():
    rng = np.random.default_rng(11)
    truth = rng.beta(1.0, 6.0, size=1500)
    got = pe.expected_performance(truth, truth, thresholds=THRESHOLDS, n_draws=1000, seed=0)["metrics"]
    # Closed forms when p is the truth: E (t - y)^2 = t(1 - t); E sum y = sum t; AUROC as the ratio of the
    # expected concordant pairs to the expected mixed pairs (exact as N grows).
    assert got["brier"]["estimate"] == pytest.approx(np.mean(truth * (1 - truth)), abs=5e-4)
    assert got["observed_expected"]["estimate"] == pytest.approx(1.0, abs=0.01)
    order = np.argsort(truth)
    t_sorted = truth[order]
    below = np.concatenate([[0.0], np.cumsum(1 - t_sorted)[:-1]])  # expected negatives ranked below each case
    concordant = np.sum(t_sorted * below)
    mixed = truth.sum() * (1 - truth).sum() - np.sum(truth * (1 - truth))
    assert got["auc_roc"]["estimate"] == pytest.approx(concordant / mixed, abs=0.005)
    for row in got.values():
        assert row["lower"] <= row["estimate"] <= row["upper"]


def test_realized_on_truth_drawn_outcomes_falls_inside_the_interval_about_as_often_as_stated():
    rng = np.random.default_rng(5)
    truth = rng.beta(1.0, 6.0, size=400)
    estimate = pe.expected_performance(truth, truth, thresholds=THRESHOLDS, n_draws=1000, level=0.9, seed=1)
    inside = []
    for _ in range(200):
        y = (rng.random(truth.size) < truth).astype(float)
        inside.append(pe.realized_beside(estimate, truth, y)["metrics"]["brier"]["inside"])
    # 90 % nominal; 200 draws give a binomial sd of 2 %: 80 % is five sds below.
    assert np.mean(inside) >= 0.8


def test_intervals_shrink_with_the_population():
    rng = np.random.default_rng(2)
    base = rng.beta(1.0, 5.0, size=(100, 1))
    widths = []
    for repeat in (1, 4, 16):
        probs = np.tile(base, (repeat, 1))
        got = pe.expected_performance(probs[:, 0], probs, n_draws=800, seed=0)["metrics"]
        widths.append({name: row["upper"] - row["lower"] for name, row in got.items()})
    for name in pe.ESTIMATED_METRICS:
        # Outcome noise alone: width ~ 1/sqrt(N), halving per fourfold N; 0.75 leaves room for quantile noise.
        assert widths[1][name] < 0.75 * widths[0][name], name
        assert widths[2][name] < 0.75 * widths[1][name], name


def test_posterior_spread_widens_the_interval_and_mean_only_ignores_it():
    rng = np.random.default_rng(4)
    n = 2000
    p = rng.beta(1.0, 6.0, size=n)
    # Two posterior columns that disagree about the population's whole risk level, by a factor 0.6 and 1.4.
    probs = np.stack([0.6 * p, np.minimum(1.4 * p, 1.0)], axis=1)
    got = pe.estimate_performance(probs, n_draws=600, seed=0)
    post = got["posterior"]["metrics"]["observed_expected"]
    mean_only = got["mean_only"]["metrics"]["observed_expected"]
    assert post["lower"] < 0.7 and post["upper"] > 1.3
    assert mean_only["upper"] - mean_only["lower"] < 0.5 * (post["upper"] - post["lower"])
    assert got["posterior"]["columns"] == 2 and got["mean_only"]["columns"] == 1


def test_same_seed_same_numbers_and_chunking_does_not_change_them(monkeypatch):
    rng = np.random.default_rng(9)
    probs = rng.uniform(0.0, 0.5, size=(50, 4))
    first = pe.estimate_performance(probs, n_draws=300, seed=12)
    assert pe.estimate_performance(probs, n_draws=300, seed=12) == first
    assert pe.estimate_performance(probs, n_draws=300, seed=13) != first
    monkeypatch.setattr(pe, "_CHUNK_CELLS", 50 * 7)  # seven draws per batch instead of all at once
    assert pe.estimate_performance(probs, n_draws=300, seed=12) == first


def test_one_class_draws_are_left_out_of_the_rankings_and_counted():
    p = np.array([1e-6, 2e-6, 3e-6])
    got = pe.expected_performance(p, p, n_draws=200, seed=0)["metrics"]
    assert got["auc_roc"] == {"estimate": None, "lower": None, "upper": None, "n_draws": 0}
    assert got["brier"]["n_draws"] == 200


def test_decision_thresholds_hold_the_models_threshold_once():
    assert pe.decision_thresholds(0.5) == (0.05, 0.1, 0.2, 0.3, 0.5)
    assert pe.decision_thresholds(0.2) == (0.05, 0.1, 0.2, 0.3)


@pytest.mark.parametrize("bad, match", [
    (dict(p=np.array([0.1, 0.2]), outcome_probs=np.array([0.1, 0.2, 0.3])), "rows"),
    (dict(p=np.array([0.1, 1.2]), outcome_probs=np.array([0.1, 0.2])), "probabilities"),
    (dict(p=np.array([0.1, 0.2]), outcome_probs=np.array([0.1, 0.2]), n_draws=0), "n_draws"),
])
def test_bad_input_is_one_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        pe.draw_metrics(**bad)
