"""bench/methods/site_update.py's arithmetic: paired differences over the same cells, and the targets read from them."""
from __future__ import annotations


import numpy as np
import pytest
from scipy import stats

from tests.support.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/methods/site_update.py", "bench_site_update_under_test")


def _cell(method: str, train: int, error: float, *, site: str = "D", size: int = 100, coverage: float = 0.5) -> dict:
    key = {"train": train, "site": site, "release": train, "size": size, "draw": train, "method": method}
    return {"key": key, "abs_error": error, "nll": 0.3, "calibration_slope": 1.0, "coverage95": coverage,
            "seconds": 2.0}


def test_the_paired_interval_is_the_t_interval_of_the_differences_on_shared_cells(bench):
    bayes, closed = [0.050, 0.061, 0.047, 0.070], [0.060, 0.066, 0.049]
    cells = [_cell("bayes", t, e) for t, e in enumerate(bayes)] + [_cell("closed-test", t, e)
                                                                   for t, e in enumerate(closed)]
    got = bench.paired(cells, "bayes", "closed-test")
    diff = np.array(bayes[:3]) - np.array(closed)  # the fourth bayes cell has no partner: left out
    half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
    assert got["cells"] == 3
    assert got["mean"] == pytest.approx(diff.mean())
    assert (got["low"], got["high"]) == pytest.approx((diff.mean() - half, diff.mean() + half))


def _crossed(method: str, error) -> list[dict]:
    """27 cells: 3 models x 3 releases of site D x 3 draws, abs error from error(train, release, draw)."""
    return [{"key": {"train": t, "site": "D", "release": r, "size": 100, "draw": d, "method": method},
             "abs_error": error(t, r, d), "nll": 0.3, "calibration_slope": 1.0, "coverage95": 0.5, "seconds": 2.0}
            for t in range(3) for r in range(3) for d in range(3)]


def test_the_crossed_grid_interval_counts_models_and_releases_not_cells(bench):
    # The difference is mostly a per-model effect: 27 cells, but only 3 models to learn it from.
    effect = {0: -0.02, 1: 0.0, 2: 0.015}
    cells = _crossed("closed-test", lambda t, r, d: 0.06) + _crossed(
        "bayes", lambda t, r, d: 0.06 + effect[t] + 0.001 * r - 0.0005 * d)
    got = bench.paired(cells, "bayes", "closed-test")
    diff = np.array([effect[t] + 0.001 * r - 0.0005 * d for t in range(3) for r in range(3) for d in range(3)])
    naive = stats.t.ppf(0.975, 26) * diff.std(ddof=1) / np.sqrt(27)
    assert (got["cells"], got["models"], got["releases"]) == (27, 3, 3)
    assert got["mean"] == pytest.approx(diff.mean())
    # By hand: the two-way variance with 2 degrees of freedom.
    residual = diff.reshape(3, 3, 3) - diff.mean()
    def one_way(sums):
        return len(sums) / (len(sums) - 1) * np.sum(np.square(sums)) / 27 ** 2
    var = one_way(residual.sum(axis=(1, 2))) + one_way(residual.sum(axis=(0, 2))) - one_way(
        residual.sum(axis=2).ravel())
    half = stats.t.ppf(0.975, 2) * np.sqrt(var)
    assert (got["low"], got["high"]) == pytest.approx((diff.mean() - half, diff.mean() + half))
    assert got["high"] - got["low"] > 4 * 2 * naive  # the per-model effect is not averaged away 27 times


def test_the_crossed_grid_interval_is_never_narrower_than_the_cells_taken_as_independent(bench):
    # Only the local draw moves the difference, and the draws of each (model, release) sum to the same
    # value: every cluster sum of residuals is 0, so the clustered variance alone would be 0.
    cells = _crossed("closed-test", lambda t, r, d: 0.06) + _crossed(
        "bayes", lambda t, r, d: 0.05 + 0.004 * (d - 1) * (1 + 0.5 * t + 0.25 * r))
    got = bench.paired(cells, "bayes", "closed-test")
    diff = np.array([-0.01 + 0.004 * (d - 1) * (1 + 0.5 * t + 0.25 * r)
                     for t in range(3) for r in range(3) for d in range(3)])
    naive = stats.t.ppf(0.975, 26) * diff.std(ddof=1) / np.sqrt(27)
    assert naive > 0.001
    assert (got["low"], got["high"]) == pytest.approx((diff.mean() - naive, diff.mean() + naive))


def test_the_design_sentence_says_which_sizes_are_crossed(bench):
    matched = [_cell("bayes", t, 0.05, size=1000) for t in range(3)]
    partial = [c for c in _crossed("bayes", lambda t, r, d: 0.05) if c["key"]["train"] < 2][:10]
    for c in partial:
        c["key"]["size"] = 500
    # A grid that has reached site D but not yet site E at this size.
    partial += [_cell("bayes", t, 0.05, site="E", size=500) for t in range(3)]
    text = bench.designs(_crossed("bayes", lambda t, r, d: 0.05) + matched + partial)
    assert text == ("n = 100: crossed, 27 cells (3 training x 3 site releases x 3 draws) per site and method; "
                    "n = 500: site D partly crossed, 10 cells (2 training x 3 site releases x 3 draws), "
                    "site E matched, 3 cells (3 training x 3 site releases x 3 draws) per method; "
                    "n = 1000: matched, 3 cells (3 training x 3 site releases x 3 draws) per site and method")


def test_the_targets_name_where_they_are_met_and_where_not(bench, tmp_path):
    cells = []
    for t in range(3):
        # D: bayes clearly better than every other method at n = 100; at n = 1,000 no better than closed-test.
        cells += [_cell("bayes", t, 0.05 + 0.001 * t, coverage=0.93), _cell("closed-test", t, 0.07 + 0.002 * t),
                  _cell("finetune", t, 0.08 + 0.001 * t), _cell("retrain", t, 0.15 + 0.01 * t)]
        cells += [_cell("bayes", t, 0.06 + 0.003 * t, size=1000, coverage=0.6),
                  _cell("closed-test", t, 0.05 + 0.001 * t, size=1000)]
    (tmp_path / "adapt").mkdir()
    table, summary = bench.report(cells, tmp_path)
    lines = bench.target_lines(summary)
    # At n = 1,000 bayes is worse on every cell: its interval lies wholly above 0, so not even "as good".
    assert lines[0].startswith("- bayes at least as good as closed-test") and "met at 1 of 2 (site, n): D 100;" in lines[0]
    assert lines[0].endswith("not at D 1000.")
    assert lines[1].startswith("- bayes better than closed-test") and "met at 1 of 2 (site, n): D 100;" in lines[1]
    # Below 1,000 only: n = 1,000 is not a case of the finetune and retrain targets.
    assert "met at 1 of 1 (site, n): D 100; not at none." in lines[2]
    assert "met at 1 of 1 (site, n): D 100; not at none." in lines[3]
    assert "at 1 of 2 (site, n); its coverage ranges 0.60-0.93." in lines[4]
    assert "| D | 100 | bayes - closed-test | -0.0210 |" in table
    assert (tmp_path / "adapt" / "adapt.png").exists() and (tmp_path / "adapt" / "adapt.json").exists()


def test_the_unscored_part_of_the_grid_is_counted_and_timed_from_measured_cells(bench):
    args = bench.build_parser().parse_args(["--sizes", "100,250", "--sites", "D", "--methods", "none,bayes"])
    cells = _crossed("bayes", lambda t, r, d: 0.05)[:20] + [_cell("none", t, 0.05) for t in range(3)]
    for c in cells:
        c["seconds"] = 36.0 if c["key"]["method"] == "bayes" else 3.6
    full, missing, hours = bench.remaining(cells, args)
    assert (full, missing) == (2 * 2 * 27, 108 - 23)
    # 7 bayes and 24 none cells missing at 100; nothing measured at 250, so its time is unknown.
    assert np.isnan(hours)
    full, missing, hours = bench.remaining(cells, bench.build_parser().parse_args(
        ["--sizes", "100", "--sites", "D", "--methods", "none,bayes"]))
    assert (full, missing) == (54, 31) and hours == pytest.approx((7 * 36.0 + 24 * 3.6) / 3600)
