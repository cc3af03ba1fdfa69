"""model.evaluation.statistics.clinical_stats against independent computations: net benefit by hand on a small table,
calibration slope and intercept on samples from known models (and against scikit-learn's
unpenalised logistic regression), selective prediction against a brute force over tie orders,
and subgroup gaps on a planted group."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from model.evaluation.report import formatting
from model.evaluation.statistics import clinical_stats as cs, metrics

# A small table: five cases, two deaths.
P = np.array([0.9, 0.6, 0.3, 0.2, 0.05])
Y = np.array([1, 0, 1, 0, 0])


def test_net_benefit_matches_the_closed_form_on_a_small_table():
    nb = cs.net_benefit(P, Y, [0.25, 0.5, 0.95])
    # pt = 0.25: treat the first three (p >= 0.25): TP 2, FP 1 -> 2/5 - 1/5 * 0.25/0.75.
    # pt = 0.5: treat two: TP 1, FP 1 -> 1/5 - 1/5 * 1. pt = 0.95: treat none -> 0.
    np.testing.assert_allclose(nb, [2 / 5 - (1 / 5) * (1 / 3), 1 / 5 - 1 / 5, 0.0])
    # Treat all: prevalence - (1 - prevalence) * pt / (1 - pt).
    np.testing.assert_allclose(cs.treat_all_net_benefit(Y, [0.25, 0.5]), [0.4 - 0.6 / 3, 0.4 - 0.6])
    # p exactly at the threshold is treated (Vickers' "p >= pt").
    assert cs.net_benefit(np.array([0.3]), np.array([1]), [0.3])[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="threshold"):
        cs.net_benefit(P, Y, [0.0])


def test_referral_net_benefit_by_hand():
    referred = np.array([False, True, False, False, True])
    d = cs.decision_curve(P, Y, referred, thresholds=[0.25, 0.5], table_thresholds=[0.25], n_bootstrap=20)
    # pt = 0.5, referred treated: the model treats case 0 (TP); cases 1 and 4 are treated
    # (two FP): 1/5 - 2/5 * 1. Perfect review: case 1 and 4 are survivors, left untreated: 1/5.
    assert d["referral_treated"][1] == pytest.approx(1 / 5 - 2 / 5)
    assert d["referral_perfect_review"][1] == pytest.approx(1 / 5)
    # Among the three kept cases (0, 2, 3) at pt = 0.25: treat 0 and 2, both deaths: 2/3.
    assert d["kept"]["model"][0] == pytest.approx(2 / 3) and d["kept"]["n"] == 3
    assert d["referred_fraction"] == pytest.approx(0.4)
    row = d["table"][0]
    assert row["model"]["estimate"] == pytest.approx(d["model"][0])
    assert row["gain_over_default"]["estimate"] == pytest.approx(d["model"][0] - max(d["treat_all"][0], 0.0))


def _sample(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Cases from a known calibrated model: true risks from a Beta, outcomes drawn from them."""
    rng = np.random.default_rng(seed)
    p = rng.beta(1.2, 6.0, n)
    return p, (rng.random(n) < p).astype(int)


def test_calibrated_model_has_slope_one_and_intercept_zero():
    fits = [cs.calibration_fit(*_sample(4000, seed)) for seed in range(8)]
    slopes = np.array([f["slope"]["estimate"] for f in fits])
    intercepts = np.array([f["intercept"]["estimate"] for f in fits])
    # In expectation 1 and 0: the mean over 8 samples is within ~3 of its standard errors.
    assert abs(slopes.mean() - 1.0) < 0.06 and abs(intercepts.mean()) < 0.05
    # Each 95% interval should cover the truth; allow one miss in eight.
    assert sum(f["slope"]["lower"] <= 1.0 <= f["slope"]["upper"] for f in fits) >= 7
    assert sum(f["intercept"]["lower"] <= 0.0 <= f["intercept"]["upper"] for f in fits) >= 7


def test_overfit_and_timid_models_have_slopes_below_and_above_one():
    p, y = _sample(20000, 3)
    overfit = 1.0 / (1.0 + np.exp(-2.0 * cs.logit(p)))  # logits doubled: too extreme
    timid = 1.0 / (1.0 + np.exp(-0.5 * cs.logit(p)))
    fit = cs.calibration_fit(overfit, y)
    assert fit["slope"]["upper"] < 1.0 and fit["slope"]["estimate"] == pytest.approx(0.5, abs=0.05)
    assert cs.calibration_fit(timid, y)["slope"]["lower"] > 1.0
    # The same slope from an independent fit: scikit-learn's unpenalised logistic regression.
    ref = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(cs.logit(overfit)[:, None], y)
    assert fit["slope"]["estimate"] == pytest.approx(ref.coef_[0, 0], abs=1e-4)
    # Risks under-estimated on average: calibration-in-the-large > 0.
    assert cs.calibration_fit(p * 0.7, y)["intercept"]["lower"] > 0.0


def test_one_class_gives_no_fit_but_no_error():
    fit = cs.calibration_fit([0.1, 0.2, 0.3], [0, 0, 0])
    assert np.isnan(fit["slope"]["estimate"]) and fit["observed"] == 0.0


def test_batched_estimates_equal_statsmodels_fits_row_by_row():
    # The bootstrap's Newton fits and calibration_fit's statsmodels GLM fit the same two likelihoods.
    rng = np.random.default_rng(3)
    for n in (80, 250, 900):  # large enough that no resample separates the classes
        p = rng.beta(1.0, 6.0, size=n)
        y = (rng.random(n) < np.clip(1.4 * p, 0.0, 1.0)).astype(float)
        rows = rng.integers(0, n, size=(20, n))
        intercept, slope = cs.calibration_estimates(p[rows], y[rows])
        for r, index in enumerate(rows):
            fit = cs.calibration_fit(p[index], y[index])
            assert intercept[r] == pytest.approx(fit["intercept"]["estimate"], abs=1e-6)
            assert slope[r] == pytest.approx(fit["slope"]["estimate"], abs=1e-6)


def test_batched_estimates_are_nan_for_one_class_and_separated_rows():
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4], [0.1, 0.3, 0.2, 0.6]])
    y = np.array([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 1, 0]], dtype=float)
    intercept, slope = cs.calibration_estimates(p, y)
    assert np.isnan(intercept[0]) and np.isnan(slope[0])  # one class: no fit
    assert np.isnan(slope[1])  # lp separates the classes: the slope runs off to infinity
    assert np.isfinite(intercept[2]) and np.isfinite(slope[2])


def test_smoothed_curve_follows_the_diagonal_for_a_calibrated_model():
    p, y = _sample(6000, 5)
    curve = cs.smoothed_calibration(p, y, n_bootstrap=40, seed=1)
    grid, observed = np.array(curve["p"]), np.array(curve["observed"])
    middle = grid < np.quantile(p, 0.9)  # where most cases are
    assert np.max(np.abs(observed[middle] - grid[middle])) < 0.04
    assert np.all(np.array(curve["lower"]) <= observed + 1e-9) and np.all(observed <= np.array(curve["upper"]) + 1e-9)
    bins = cs.binned_calibration(p, y)
    assert sum(b["n"] for b in bins) == p.size and all(b["lower"] <= b["observed"] <= b["upper"] for b in bins)


def _brute_kept_loss(loss, score) -> np.ndarray:
    """The mean over every order of tied scores of the summed loss of the first k kept cases."""
    values = sorted(set(score.tolist()))
    groups = [np.flatnonzero(score == v) for v in values]
    totals = []
    for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
        order = np.concatenate([np.array(o, dtype=int) for o in orders])
        totals.append(np.cumsum(loss[order]))
    return np.mean(totals, axis=0)


@pytest.mark.parametrize("seed", range(5))
def test_selective_numbers_match_a_brute_force_over_tie_orders(seed):
    rng = np.random.default_rng(seed)
    n = 7
    loss = rng.integers(0, 2, n).astype(float)
    score = rng.integers(0, 3, n).astype(float)  # many ties
    expected = _brute_kept_loss(loss, score)
    np.testing.assert_allclose(cs.kept_loss(loss, score), expected)
    out = cs.selective_numbers(loss, score, target_coverage=0.6, target_risk=0.3)
    k = np.arange(1, n + 1)
    risk = expected / k
    assert out["aurc"] == pytest.approx(risk.mean())
    assert out["augrc"] == pytest.approx(np.mean(expected / n))
    assert out["risk_at_coverage"] == pytest.approx(risk[int(np.ceil(0.6 * n)) - 1])
    ok = [kk for kk in k if risk[kk - 1] <= 0.3]
    assert out["coverage_at_risk"] == pytest.approx(max(ok) / n if ok else 0.0)
    assert out["full_coverage_risk"] == pytest.approx(loss.mean())


def test_a_constant_score_ranks_like_random_referral_and_a_perfect_one_best():
    loss = np.array([0, 0, 1, 0, 1, 0, 0, 0, 1, 0], dtype=float)
    flat = cs.selective_numbers(loss, np.zeros(10))
    assert flat["aurc"] == pytest.approx(loss.mean())  # every coverage keeps the average risk
    perfect = cs.selective_numbers(loss, loss)  # the errors referred first
    assert perfect["aurc"] < flat["aurc"] and perfect["coverage_at_risk"] == pytest.approx(0.7)
    summary = cs.selective_summary(np.full(10, 0.2), loss.astype(int), {"u": loss}, n_bootstrap=50)
    cell = summary["scores"]["u"]["aurc"]
    assert cell["lower"] <= cell["estimate"] <= cell["upper"]


def test_paired_selective_difference_is_b_minus_a():
    rng = np.random.default_rng(1)
    loss = rng.integers(0, 2, 200).astype(float)
    good, noise = loss + rng.random(200) * 0.5, rng.random(200)
    diff = cs.paired_selective(loss, {"u": noise}, loss, {"u": good}, n_bootstrap=200)["u"]["aurc"]
    assert diff["difference"] == pytest.approx(cs.selective_numbers(loss, good)["aurc"]
                                               - cs.selective_numbers(loss, noise)["aurc"])
    assert diff["upper"] < 0  # B refers its errors first: lower AURC on the same cases


def test_subgroups_name_the_planted_group_and_match_the_metrics_module():
    rng = np.random.default_rng(0)
    n = 3000
    truth = rng.beta(1.2, 6.0, n)
    y = (rng.random(n) < truth).astype(int)
    kind = rng.choice(["EMERGENCY", "ELECTIVE", "URGENT"], n, p=[0.8, 0.12, 0.08])
    p = np.clip(truth + rng.normal(0, 0.01, n), 0.001, 0.999)
    urgent = kind == "URGENT"
    p[urgent] = np.clip(1.0 - truth[urgent] * 3, 0.01, 0.99)  # served badly: wrong risks
    attributes = {"gender": rng.choice(["M", "F"], n), "age_years": rng.uniform(18, 95, n),
                  "admission_type": kind, "ethnicity": rng.choice(["WHITE", "BLACK/AFRICAN AMERICAN"], n),
                  "insurance": rng.choice(["Medicare", "Private"], n)}
    report = cs.subgroup_report(p, y, cs.subgroup_labels(attributes), truth, n_bootstrap=200)
    named = {(g["attribute"], g["group"]) for g in report["gaps"]}
    assert ("admission_type", "URGENT") in named
    assert all(group == "URGENT" for attribute, group in named if attribute == "admission_type")
    row = report["attributes"]["admission_type"]["URGENT"]
    assert row["n"] == urgent.sum() and row["events"] == y[urgent].sum()
    assert row["auc_roc"]["estimate"] == pytest.approx(metrics.auc_roc(p[urgent], y[urgent]))
    assert row["mae_truth"]["estimate"] == pytest.approx(np.mean(np.abs(p - truth)[urgent]))
    error = np.abs(np.log(p / (1 - p)) - np.log(truth / (1 - truth)))
    gap = row["gap_to_rest"]["logit_error_truth"]
    assert gap["estimate"] == pytest.approx(error[urgent].mean() - error[~urgent].mean())
    assert set(report["attributes"]["age_band"]) <= {label for label, _, _ in cs.AGE_BANDS}
    urgent_gap = next(g for g in report["gaps"] if g["group"] == "URGENT")
    assert formatting.describe_gap(urgent_gap).startswith(f"admission_type = URGENT (n = {urgent.sum()})")


def test_ethnicity_is_pooled_by_prefix():
    assert [cs.ethnicity_group(e) for e in ("WHITE - RUSSIAN", "BLACK/CAPE VERDEAN", "HISPANIC OR LATINO",
                                            "ASIAN - CHINESE", "UNKNOWN/NOT SPECIFIED", "UNABLE TO OBTAIN",
                                            "AMERICAN INDIAN/ALASKA NATIVE", "UNKNOWN")] == [
        "WHITE", "BLACK", "HISPANIC", "ASIAN", "UNKNOWN", "UNKNOWN", "OTHER", "UNKNOWN"]
    np.testing.assert_array_equal(cs.age_band([18, 44.9, 45, 79.99, 80, 90]),
                                  ["18-44", "18-44", "45-64", "65-79", "80+", "80+"])
