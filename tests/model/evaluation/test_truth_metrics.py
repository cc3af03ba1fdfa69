"""model.evaluation.statistics.metrics against a known truth, paired comparisons and the ECE interval, checked against
scipy, scikit-learn and naive loops."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from model.evaluation.report import formatting
from model.evaluation.statistics import against_truth, metrics as m, metrics_report


@pytest.fixture(scope="module")
def ensemble():
    """N=300 cases, K=3 members x S=4 samples around a known truth, with labels drawn from it."""
    rng = np.random.default_rng(21)
    n, k, s = 300, 3, 4
    logit = rng.normal(-2.0, 1.0, n)
    truth = 1.0 / (1.0 + np.exp(-logit))
    y = (rng.random(n) < truth).astype(int)
    z = logit[:, None, None] + rng.normal(0, 0.4, (n, 1, k)) + rng.normal(0, 0.2, (n, s, k))
    return 1.0 / (1.0 + np.exp(-z)).reshape(n, s * k), y, k, s, truth


def test_rank_and_spearman_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 6, 80).astype(float)  # many ties
    b = a + rng.integers(0, 4, 80)
    np.testing.assert_allclose(against_truth.rank(a), stats.rankdata(a))
    assert against_truth.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, rel=1e-12)
    assert np.isnan(against_truth.spearman(np.ones(5), np.arange(5.0)))


def test_interval_coverage_matches_a_loop(ensemble):
    probs, _, _, _, truth = ensemble
    cov = against_truth.interval_coverage(probs, truth)
    for level in against_truth.COVERAGE_LEVELS:
        inside = [np.percentile(row, 50 * (1 - level)) <= t <= np.percentile(row, 50 * (1 + level))
                  for row, t in zip(probs, truth)]
        assert cov[f"{level:g}"] == pytest.approx(np.mean(inside))
    assert cov["0.5"] <= cov["0.8"] <= cov["0.95"]
    # One sample per case has no interval: coverage is undefined, not 0.
    assert all(np.isnan(v) for v in against_truth.interval_coverage(probs[:, :1], truth).values())


def test_all_uncertainties(ensemble):
    probs, _, k, s, _ = ensemble
    u = against_truth.all_uncertainties(probs, k, s)
    assert set(u) == set(against_truth.TRUTH_MEASURES)
    np.testing.assert_allclose(u["predictive_entropy"], u["expected_entropy"] + u["mutual_information"], atol=1e-12)
    lo, hi = np.percentile(probs, [2.5, 97.5], axis=1)
    np.testing.assert_allclose(u["interval_width_95"], hi - lo)


def test_uncertainty_error_correlation_overall_and_within_p_groups(ensemble):
    probs, _, _, _, truth = ensemble
    p = probs.mean(axis=1)
    u = {"std": probs.std(axis=1), "constant": np.zeros(len(p))}
    out = against_truth.uncertainty_error_correlation(p, truth, u, num_groups=5)
    err = np.abs(p - truth)
    assert out["std"]["overall"] == pytest.approx(stats.spearmanr(u["std"], err).statistic)
    groups = np.array_split(np.argsort(p, kind="stable"), 5)
    per_group = [stats.spearmanr(u["std"][g], err[g]).statistic for g in groups]
    np.testing.assert_allclose(out["std"]["per_group"], per_group, rtol=1e-10)
    assert out["std"]["within_p_groups"] == pytest.approx(np.mean(per_group))
    # A constant measure (mutual information of one deterministic network) has no correlation.
    assert np.isnan(out["constant"]["overall"]) and np.isnan(out["constant"]["within_p_groups"])


def test_kl_bernoulli_matches_scipy_entropy():
    t = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    q = np.array([0.2, 0.3, 0.5, 0.6, 0.7])
    expected = [stats.entropy([ti, 1 - ti], [qi, 1 - qi]) for ti, qi in zip(t, q)]
    np.testing.assert_allclose(against_truth.kl_bernoulli(t, q), expected, rtol=1e-12)


def test_selective_vs_truth_matches_naive_referral(ensemble):
    probs, y, k, s, truth = ensemble
    p = probs.mean(axis=1)
    u = against_truth.all_uncertainties(probs, k, s)
    rates = (0.0, 0.1, 0.3)
    tables = against_truth.selective_vs_truth(p, y, truth, {"mutual_information": u["mutual_information"]}, rates,
                                  n_random=200, seed=1)
    assert set(tables) == {"mutual_information", *against_truth.REFERRAL_BASELINES}
    full_mae = np.mean(np.abs(p - truth))
    for name, score in (("mutual_information", u["mutual_information"]), ("risk", p),
                        ("oracle", np.abs(p - truth))):
        for rate, row in zip(rates, tables[name]):
            keep = np.argsort(-score, kind="stable")[int(round(rate * len(p))):]  # no ties in these scores
            assert row["n_kept"] == keep.size
            assert row["mae_truth"] == pytest.approx(np.mean(np.abs(p[keep] - truth[keep])))
            assert row["auc_roc"] == pytest.approx(roc_auc_score(y[keep], p[keep]))
            assert row["kl_truth"] == pytest.approx(np.mean(against_truth.kl_bernoulli(truth[keep], p[keep])))
    # The oracle removes the most error; random referral removes none on average.
    for rate_i in range(1, len(rates)):
        best = tables["oracle"][rate_i]["mae_truth"]
        assert all(best <= tables[name][rate_i]["mae_truth"] + 1e-12 for name in tables)
        assert tables["random"][rate_i]["mae_truth"] == pytest.approx(full_mae, rel=0.03)
    assert tables["random"][0]["mae_truth"] == pytest.approx(full_mae)


def test_truth_report_in_evaluate(ensemble):
    probs, y, k, s, truth = ensemble
    report = metrics_report.evaluate(probs, y, k, s, truth=truth, n_bootstrap=50)
    json.dumps(report, allow_nan=False)
    t = report["truth"]
    assert t["mae"] == pytest.approx(np.mean(np.abs(probs.mean(axis=1) - truth)))
    assert t["coverage"] == pytest.approx(against_truth.interval_coverage(probs, truth))
    assert set(t["uncertainty_vs_error"]) == set(against_truth.TRUTH_MEASURES)
    assert t["auc_roc_truth"] == pytest.approx(roc_auc_score(y, truth))
    assert "coverage of truth" in formatting.format_table(report)


def test_paired_bootstrap_matches_a_loop_and_cancels_shared_noise(ensemble):
    _, y, _, _, truth = ensemble
    rng = np.random.default_rng(3)
    p_a = np.clip(truth + rng.normal(0, 0.05, truth.size), 0.001, 0.999)
    p_b = np.clip(truth + rng.normal(0, 0.02, truth.size), 0.001, 0.999)
    out = metrics_report.paired_bootstrap(p_a, p_b, y, truth, n=300, seed=4)
    assert set(out) == set(metrics_report.PAIRED_METRICS)
    assert out["auc_roc"]["difference"] == pytest.approx(roc_auc_score(y, p_b) - roc_auc_score(y, p_a))
    # The same resamples, drawn the same way, one at a time.
    idx = np.random.default_rng(4).integers(0, y.size, size=(300, y.size))
    diffs = [np.mean(np.abs(p_b[i] - truth[i])) - np.mean(np.abs(p_a[i] - truth[i])) for i in idx]
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    assert (out["truth_mae"]["lower"], out["truth_mae"]["upper"]) == pytest.approx((lo, hi))
    assert out["truth_mae"]["upper"] < 0  # B is clearly closer to the truth
    nll_diffs = [m.nll(p_b[i], y[i]) - m.nll(p_a[i], y[i]) for i in idx]
    assert out["nll"]["lower"] == pytest.approx(np.quantile(nll_diffs, 0.025))
    # A model compared with itself differs by exactly 0 on every resample.
    same = metrics_report.paired_bootstrap(p_a, p_a, y, n=50)
    assert "truth_mae" not in same
    assert all(row["lower"] == row["upper"] == row["difference"] == 0 for row in same.values())


def test_bootstrap_interval_basic_is_reflected_and_clipped():
    values = np.array([0.02, 0.03, 0.04, 0.05, 0.06])
    pct = m.bootstrap_interval(values, 0.03, alpha=0.5)
    assert (pct["lower"], pct["upper"]) == pytest.approx((0.03, 0.05))
    basic = m.bootstrap_interval(values, 0.03, alpha=0.5, method="basic", bounds=(0.0, 1.0))
    assert (basic["lower"], basic["upper"]) == pytest.approx((0.01, 0.03))
    assert basic["bias_corrected"] == pytest.approx(0.02)
    assert m.bootstrap_interval(values, 0.01, method="basic", bounds=(0.0, 1.0))["lower"] == 0.0
    with pytest.raises(ValueError, match="percentile"):
        m.bootstrap_interval(values, 0.03, method="bca")


def _population_ece(model, rng) -> float:
    """ECE of a model of the truth on the population: expected correctness instead of sampled labels."""
    t = rng.beta(0.6, 4.0, 400_000)
    p = model(t)
    conf = np.maximum(p, 1 - p)
    expected_correct = np.where(p > 0.5, t, 1 - t)
    bins = np.clip(np.floor(conf * m.NUM_BINS).astype(int), 0, m.NUM_BINS - 1)
    gap = np.bincount(bins, expected_correct - conf, minlength=m.NUM_BINS)
    return float(np.abs(gap).sum() / t.size)


def test_ece_interval_covers_the_population_ece_where_the_percentile_interval_does_not():
    # ECE is biased upwards, and a resample adds its own bias: percentile intervals sit above
    # the population value. The basic interval reflects them around the estimate.
    rng = np.random.default_rng(0)

    def model(t):
        return np.clip(1.15 * t, 0.0, 0.999)

    population = _population_ece(model, rng)
    hits = {"percentile": 0, "basic": 0}
    replicates = 30
    for _ in range(replicates):
        t = rng.beta(0.6, 4.0, 600)
        y = (rng.random(t.size) < t).astype(int)
        idx = rng.integers(0, t.size, size=(200, t.size))
        estimate, resampled = m.ece(model(t), y), m.ece(model(t)[idx], y[idx])
        for method in hits:
            ci = m.bootstrap_interval(resampled, estimate, method=method, bounds=(0.0, 1.0))
            hits[method] += ci["lower"] <= population <= ci["upper"]
    # Measured with these seeds: basic 27 / 30, percentile 0 / 30 (nominal 0.95).
    assert hits["basic"] / replicates >= 0.6
    assert hits["percentile"] / replicates <= 0.2


def test_evaluate_uses_the_basic_interval_for_ece(ensemble):
    probs, y, k, s, _ = ensemble
    report = metrics_report.evaluate(probs, y, k, s, n_bootstrap=100, seed=2)
    p = probs.mean(axis=1)
    expected = m.bootstrap_ci(lambda q, lab: m.ece(q, lab), p, y, n=100, seed=2, method="basic", bounds=(0.0, 1.0))
    assert report["ci"]["ece"] == pytest.approx(expected)
    assert report["ci"]["ece"]["lower"] <= report["ci"]["ece"]["bias_corrected"] <= report["ci"]["ece"]["upper"]
