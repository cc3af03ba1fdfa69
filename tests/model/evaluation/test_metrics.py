"""model.evaluation.statistics.metrics against direct float64 computations, scikit-learn and hand-worked cases."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score

from model.export_layout import UNCERTAINTY_MEASURES
from model.evaluation.report import formatting
from model.evaluation.statistics import metrics as m, metrics_report, multiclass


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


@pytest.fixture
def synthetic():
    """A small ensemble prediction (N=400, K=3 members, S=4 samples) with known true p."""
    rng = np.random.default_rng(7)
    n, k, s = 400, 3, 4
    truth = rng.beta(1.0, 5.0, n)
    y = (rng.random(n) < truth).astype(int)
    logit = np.log(truth / (1 - truth))
    member_shift = rng.normal(0, 0.3, (n, 1, k))
    probs = _sigmoid(logit[:, None, None] + member_shift + rng.normal(0, 0.1, (n, s, k))).reshape(n, s * k)
    return probs, y, k, s, truth


# --------------------------------------------------------------------------- NLL


def test_mixture_nll_matches_direct_float64():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (50, 6))
    y = rng.integers(0, 2, 50)
    p = _sigmoid(logits)
    lik = np.where(y[:, None] == 1, p, 1 - p)
    direct = -np.mean(np.log(lik.mean(axis=1)))
    assert m.mixture_nll(logits, y, from_logits=True) == pytest.approx(direct, rel=1e-12)
    assert m.mixture_nll(p, y) == pytest.approx(direct, rel=1e-9)


def test_mixture_nll_extreme_logits_hand_case():
    # y = 1 with logits -1000 and -1001: log p = -1000 - log1p(e^-1000) ~ -1000, -1001.
    # -log((e^-1000 + e^-1001) / 2) = 1000 - log(1 + e^-1) + log 2, far beyond exp's range.
    value = m.mixture_nll(np.array([[-1000.0, -1001.0]]), np.array([1]), from_logits=True)
    assert np.isfinite(value)
    assert value == pytest.approx(1000.0 - math.log1p(math.exp(-1.0)) + math.log(2.0), rel=1e-14)
    # Confidently right at the extremes costs ~0, never NaN.
    right = m.mixture_nll(np.array([[800.0, 1e4], [-1e4, -800.0]]), np.array([1, 0]), from_logits=True)
    assert right == pytest.approx(0.0, abs=1e-300)


def test_mixture_nll_probs_clipped_not_inf():
    value = m.mixture_nll(np.array([[0.0, 0.0]]), np.array([1]))
    assert value == pytest.approx(-math.log(m.EPS))


def test_per_component_nll_is_mean_of_member_nlls_and_bounds_mixture():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 0.95, (30, 5))
    y = rng.integers(0, 2, 30)
    direct = -np.mean(y[:, None] * np.log(p) + (1 - y[:, None]) * np.log(1 - p))
    assert m.per_component_nll(p, y) == pytest.approx(direct, rel=1e-12)
    assert m.per_component_nll(p, y) >= m.mixture_nll(p, y)  # Jensen


def test_nll_single_prediction_is_binary_cross_entropy():
    p = np.array([0.9, 0.2, 0.6])
    y = np.array([1, 0, 0])
    assert m.nll(p, y) == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3)


# --------------------------------------------------------------------------- point metrics


def test_aucs_match_sklearn_including_ties():
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(5, 80))
        p = np.round(rng.random(n), 1)  # rounding forces tied scores
        y = (rng.random(n) < 0.3).astype(int)
        y[0], y[1] = 0, 1
        assert m.auc_roc(p, y) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
        assert m.auc_pr(p, y) == pytest.approx(average_precision_score(y, p), abs=1e-12)


def test_auc_one_class_is_nan():
    p = np.array([0.1, 0.4, 0.8])
    assert np.isnan(m.auc_roc(p, np.zeros(3)))
    assert np.isnan(m.auc_pr(p, np.zeros(3)))
    assert np.isnan(m.auc_roc(p, np.ones(3)))


def test_batched_metrics_equal_row_by_row():
    rng = np.random.default_rng(3)
    p = rng.random((4, 25))
    y = rng.integers(0, 2, (4, 25))
    for fn in (m.auc_roc, m.auc_pr, m.brier, m.accuracy, m.ece, m.nll):
        np.testing.assert_allclose(fn(p, y), [fn(p[i], y[i]) for i in range(4)], rtol=1e-12)


def test_brier_and_accuracy():
    p = np.array([0.9, 0.2, 0.6, 0.5])
    y = np.array([1, 0, 0, 1])
    assert m.brier(p, y) == pytest.approx((0.01 + 0.04 + 0.36 + 0.25) / 4)
    assert m.brier(p, y) == pytest.approx(brier_score_loss(y, p))
    # p = 0.5 is a negative prediction (strict >), so only 0.9 and 0.2 are right.
    assert m.accuracy(p, y) == pytest.approx(0.5)
    assert m.accuracy(p, y, threshold=0.55) == pytest.approx(0.5)
    assert m.accuracy(p, y, threshold=0.1) == pytest.approx(0.5)
    assert m.accuracy(p, y, threshold=0.7) == pytest.approx(0.75)


def test_ece_hand_computed():
    # 5 bins of width 0.2 on confidence max(p, 1 - p):
    #   p=0.9,y=1 conf .9 right  -> bin 4 | p=0.85,y=0 conf .85 wrong -> bin 4
    #   p=0.3,y=0 conf .7 right  -> bin 3 | p=0.55,y=0 conf .55 wrong -> bin 2
    # bin 4: |0.5 - 0.875| * 2/4 ; bin 3: |1 - 0.7| * 1/4 ; bin 2: |0 - 0.55| * 1/4
    p = np.array([0.9, 0.85, 0.3, 0.55])
    y = np.array([1, 0, 0, 0])
    assert m.ece(p, y, num_bins=5) == pytest.approx(0.375 * 0.5 + 0.3 * 0.25 + 0.55 * 0.25)


def test_ece_default_15_bins_hand_computed():
    # 15 bins: conf 0.95 and 0.96 share bin 14 ([14/15, 1]), conf 0.7 is bin 10 ([10/15, 11/15)).
    # bin 14: acc 1/2, conf 0.955 -> 0.455 * 2/3 ; bin 10: acc 1, conf 0.7 -> 0.3 * 1/3.
    p = np.array([0.95, 0.04, 0.7])
    y = np.array([1, 1, 1])
    assert m.ece(p, y) == pytest.approx(0.455 * 2 / 3 + 0.3 / 3)


def test_ece_confidence_one_in_last_bin_and_perfect_is_zero():
    assert m.ece(np.array([1.0, 0.0]), np.array([1, 0])) == pytest.approx(0.0)
    assert m.ece(np.array([1.0]), np.array([0])) == pytest.approx(1.0)


# --------------------------------------------------------------------------- decomposition


def test_decomposition_hand_case_and_identity():
    # Two members at 0.1 and 0.9: mean 0.5 -> H = log 2; each has entropy h(0.1).
    probs = np.array([[0.1, 0.9], [0.3, 0.3]])
    h01 = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    np.testing.assert_allclose(m.predictive_entropy(probs)[0], math.log(2))
    np.testing.assert_allclose(m.expected_entropy(probs)[0], h01)
    np.testing.assert_allclose(m.mutual_information(probs), [math.log(2) - h01, 0.0], atol=1e-15)
    np.testing.assert_allclose(m.predictive_std(probs), [0.4, 0.0], atol=1e-15)


# No subnormal probabilities: the mean of 5e-324 and 0 underflows to 0, and the reference's KL
# (not the metric) turns infinite; a model's sigmoid never gives such values.
@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 6)),
                  elements=st.floats(0, 1, allow_subnormal=False)))
def test_entropy_splits_into_aleatoric_and_epistemic_as_scipy_computes_them(probs):
    # Independent definitions: scipy's entropies (nats) and the mutual information as the mean KL
    # of each sampled Bernoulli from the mixture's, I(y; m) = E_m KL(p_m || p_bar).
    def bernoulli(p):
        return np.stack([p, 1.0 - p])

    p_bar = probs.mean(axis=1)
    np.testing.assert_allclose(m.predictive_entropy(probs), scipy.stats.entropy(bernoulli(p_bar)), atol=1e-12)
    np.testing.assert_allclose(m.expected_entropy(probs), scipy.stats.entropy(bernoulli(probs)).mean(axis=1),
                               atol=1e-12)
    kl = scipy.special.rel_entr(bernoulli(probs), bernoulli(p_bar)[:, :, None]).sum(axis=0).mean(axis=1)
    np.testing.assert_allclose(m.mutual_information(probs), kl, atol=1e-12)


def test_mutual_information_zero_when_members_agree():
    probs = np.repeat(np.array([[0.0], [0.2], [0.7], [1.0]]), 5, axis=1)
    np.testing.assert_array_equal(m.mutual_information(probs), np.zeros(4))
    assert np.all(np.isfinite(m.predictive_entropy(probs)))


def test_member_means_sample_major_and_disagreement():
    # N=1, K=2 members, S=3 samples; column m = s*K + k.
    probs = np.array([[0.1, 0.5, 0.2, 0.6, 0.3, 0.7]])
    np.testing.assert_allclose(m.member_means(probs, K=2, S=3), [[0.2, 0.6]])
    np.testing.assert_allclose(m.member_disagreement(probs, K=2, S=3), [0.4])
    three = np.array([[0.1, 0.4, 0.9]])  # pairs: .3, .8, .5 -> mean 1.6/3
    np.testing.assert_allclose(m.member_disagreement(three, K=3, S=1), [1.6 / 3])
    np.testing.assert_array_equal(m.member_disagreement(three, K=1, S=3), [0.0])
    with pytest.raises(ValueError):
        m.member_means(probs, K=4, S=2)


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_contains_estimate_and_narrows_with_data():
    rng = np.random.default_rng(4)

    def width(n):
        truth = rng.beta(1, 4, n)
        y = (rng.random(n) < truth).astype(int)
        ci = m.bootstrap_ci(m.auc_roc, truth, y, n=300, seed=1)
        assert ci["lower"] <= ci["estimate"] <= ci["upper"]
        assert ci["estimate"] == pytest.approx(roc_auc_score(y, truth))
        return ci["upper"] - ci["lower"]

    assert width(4000) < 0.5 * width(250)


def test_bootstrap_batched_equals_loop_and_is_seeded():
    rng = np.random.default_rng(5)
    p = rng.random(60)
    y = rng.integers(0, 2, 60)
    a = m.bootstrap_ci(m.brier, p, y, n=200, seed=3)
    b = m.bootstrap_ci(m.brier, p, y, n=200, seed=3, batched=False)
    assert a == pytest.approx(b)
    assert a["n_valid"] == 200


def test_bootstrap_drops_one_class_resamples():
    p = np.array([0.2, 0.3, 0.4, 0.9])
    y = np.array([0, 0, 0, 1])  # P(no positive in a resample) = (3/4)^4 ~ 0.32
    ci = m.bootstrap_ci(m.auc_roc, p, y, n=500, seed=0)
    assert 0 < ci["n_valid"] < 500
    assert ci["lower"] == pytest.approx(1.0) and ci["upper"] == pytest.approx(1.0)


def test_bootstrap_mixture_nll_on_matrix():
    rng = np.random.default_rng(6)
    probs = rng.uniform(0.05, 0.95, (40, 4))
    y = rng.integers(0, 2, 40)
    ci = m.bootstrap_ci(m.mixture_nll, probs, y, n=100, seed=0)
    assert ci["estimate"] == pytest.approx(m.mixture_nll(probs, y))
    assert ci["lower"] < ci["estimate"] < ci["upper"]


# --------------------------------------------------------------------------- referral


def test_referral_threshold_refers_configured_fraction():
    u = np.random.default_rng(8).random(200)
    for rate in m.REFERRAL_RATES:
        t = m.referral_threshold(u, rate)
        assert m.refer(u, t).sum() == round(rate * 200)
    assert m.referral_threshold(u, 0.0) == u.max()
    # When rate * n is not whole the count rounds down: never more than the configured fraction.
    seven = np.arange(7.0)
    for rate in m.REFERRAL_RATES:
        assert m.refer(seven, m.referral_threshold(seven, rate)).sum() == math.floor(rate * 7 + 1e-9)
    assert m.refer(u, m.referral_threshold(u, 1.0)).all()


def test_referral_threshold_keeps_ties():
    u = np.array([0.0, 0.0, 0.0, 0.5, 1.0])
    assert m.refer(u, m.referral_threshold(u, 0.2)).tolist() == [False, False, False, False, True]
    # 60 % would cut through the tie at 0: the tied cases are kept, so only 2 are referred.
    assert m.refer(u, m.referral_threshold(u, 0.6)).sum() == 2


def test_selective_prediction_rate_zero_is_full_and_coverage_decreases(synthetic):
    probs, y, _, _, _ = synthetic
    p = m.predictive_mean(probs)
    rows = m.selective_prediction(p, y, m.predictive_entropy(probs))
    full = m.scalar_metrics(p, y)
    for name in m.SCALAR_METRICS:
        assert rows[0][name] == pytest.approx(full[name])
    assert rows[0]["coverage"] == 1.0
    coverage = [row["coverage"] for row in rows]
    assert all(a > b for a, b in zip(coverage, coverage[1:]))
    assert rows[-1]["coverage"] == pytest.approx(0.5)
    # Kept cases at 10 % referral are exactly the 360 least uncertain.
    keep = np.argsort(m.predictive_entropy(probs))[:360]
    assert rows[2]["auc_roc"] == pytest.approx(roc_auc_score(y[keep], p[keep]))


def test_selective_prediction_entropy_referral_lowers_nll(synthetic):
    probs, y, _, _, _ = synthetic
    p = m.predictive_mean(probs)
    rows = m.selective_prediction(p, y, m.predictive_entropy(probs), referral_rates=[0.0, 0.5])
    assert rows[1]["nll"] < rows[0]["nll"]
    assert rows[1]["accuracy"] > rows[0]["accuracy"]


# --------------------------------------------------------------------------- report


def test_evaluate_report(synthetic):
    probs, y, k, s, truth = synthetic
    report = metrics_report.evaluate(probs, y, k, s, truth=truth, n_bootstrap=200)
    json.dumps(report, allow_nan=False)
    p = probs.mean(axis=1)
    assert report["overall"]["auc_roc"] == pytest.approx(roc_auc_score(y, p))
    assert report["overall"]["nll"] == pytest.approx(m.mixture_nll(probs, y))
    assert report["overall"]["per_component_nll"] == pytest.approx(m.per_component_nll(probs, y))
    member0 = probs.reshape(-1, s, k)[:, :, 0].mean(axis=1)
    assert report["members"][0]["auc_pr"] == pytest.approx(average_precision_score(y, member0))
    assert len(report["members"]) == k
    u = report["uncertainty"]
    assert u["predictive_entropy"] == pytest.approx(u["expected_entropy"] + u["mutual_information"])
    assert set(report["selective"]) == set(UNCERTAINTY_MEASURES)
    assert report["truth"]["mae"] == pytest.approx(np.mean(np.abs(p - truth)))
    assert report["truth"]["rmse"] == pytest.approx(np.sqrt(np.mean((p - truth) ** 2)))
    assert report["truth"]["nll_truth"] == pytest.approx(m.nll(truth, y))
    for name in m.SCALAR_METRICS:
        ci = report["ci"][name]
        assert ci["lower"] <= ci["upper"]
    table = formatting.format_table(report)
    assert "auc_pr" in table and "member" in table and "nll_truth" in table


def test_evaluate_undefined_metrics_become_null():
    probs = np.full((6, 2), 0.3)
    report = metrics_report.evaluate(probs, np.zeros(6), K=2, S=1, n_bootstrap=20)
    assert report["overall"]["auc_roc"] is None
    json.dumps(report, allow_nan=False)
    assert "n/a" in formatting.format_table(report)


def test_the_comparison_table_prints_no_signed_zero():
    # Two models equal to four decimals: B - A of -0.00004 is "0.0000", the interval's ends keep their sign.
    row = {"a": 0.12345, "b": 0.12341, "difference": -0.00004, "lower": -0.0213, "upper": 0.0000001}
    text = formatting.format_comparison({"a": "a/export", "b": "b/export", "n": 40, "n_bootstrap": 200,
                                         "metrics": {"brier": row}})
    line = [t for t in text.splitlines() if t.startswith("brier")][0]
    assert line.split() == ["brier", "0.1235", "0.1234", "0.0000", "[-0.0213,", "0.0000]"]


def test_labels_validated():
    with pytest.raises(ValueError):
        m.brier(np.array([0.5]), np.array([2]))
    with pytest.raises(ValueError):
        m.brier(np.array([0.5, 0.2]), np.array([1]))


# --------------------------------------------------------------------------- multi-class


def _softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_categorical_mixture_nll_matches_direct_float64_and_logits():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (50, 6, 4))
    y = rng.integers(0, 4, 50)
    probs = _softmax(logits)
    direct = -np.mean(np.log(probs.mean(axis=1)[np.arange(50), y]))
    assert multiclass.categorical_mixture_nll(probs, y) == pytest.approx(direct, rel=1e-10)
    assert multiclass.categorical_mixture_nll(logits, y, from_logits=True) == pytest.approx(direct, rel=1e-10)
    per_comp = -np.mean(np.log(probs[np.arange(50), :, y]))
    assert multiclass.categorical_per_component_nll(probs, y) == pytest.approx(per_comp, rel=1e-10)
    assert multiclass.categorical_per_component_nll(probs, y) >= multiclass.categorical_mixture_nll(probs, y)
    # An [N, C] input is a one-component mixture: plain cross-entropy.
    assert multiclass.categorical_mixture_nll(probs[:, 0], y) == pytest.approx(-np.mean(np.log(probs[np.arange(50), 0, y])))


def test_categorical_nll_extreme_logits_stay_finite():
    logits = np.array([[[1e4, -1e4, 0.0], [0.0, 0.0, 0.0]]])  # one component is certain of the wrong class
    value = multiclass.categorical_mixture_nll(logits, [1], from_logits=True)
    assert value == pytest.approx(-np.log(0.5 * (1 / 3)), rel=1e-9)


def test_categorical_accuracy_and_ece_hand_computed():
    p = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.1, 0.8], [0.5, 0.5, 0.0]])
    y = np.array([0, 1, 2, 1])
    assert multiclass.categorical_accuracy(p, y) == pytest.approx(0.5)  # the tie at row 3 goes to class 0
    # 10 bins: conf 0.7 (bin 7, correct), 0.4 (bin 4, wrong), 0.8 (bin 8, correct), 0.5 (bin 5, wrong).
    expected = (abs(1 - 0.7) + abs(0 - 0.4) + abs(1 - 0.8) + abs(0 - 0.5)) / 4
    assert multiclass.categorical_ece(p, y, num_bins=10) == pytest.approx(expected)
    assert multiclass.categorical_ece(np.eye(3)[[0, 1, 2]], [0, 1, 2]) == pytest.approx(0.0)


def test_categorical_ece_equals_binary_ece_for_two_classes():
    rng = np.random.default_rng(5)
    p1 = rng.random(300)
    y = (rng.random(300) < p1).astype(int)
    two = np.stack([1 - p1, p1], axis=1)
    # Ties at exactly 0.5 differ by convention (argmax vs p > 0.5); random floats have none.
    assert multiclass.categorical_ece(two, y) == pytest.approx(m.ece(p1, y), rel=1e-12)
    assert multiclass.categorical_accuracy(two, y) == pytest.approx(m.accuracy(p1, y))


def test_categorical_labels_validated():
    p = np.full((2, 3), 1 / 3)
    for bad in ([0, 3], [0, -1], [0.5, 1], [0]):
        with pytest.raises(ValueError):
            multiclass.categorical_accuracy(p, bad)
    with pytest.raises(ValueError):
        multiclass.categorical_mixture_nll(np.full((2, 1), 1.0), [0, 0])
