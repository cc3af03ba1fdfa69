"""model.evaluation.report.plots writes real, non-empty PNG files and returns their paths."""
from __future__ import annotations

import numpy as np
import pytest

from model.evaluation.report import plots
from model.evaluation.statistics import against_truth, metrics, metrics_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path, expected):
    assert path == expected
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000  # a blank canvas with axes alone is already several kB


@pytest.fixture(scope="module")
def prediction():
    """N=300 predictions from K=2 members x S=3 samples, with labels drawn from the truth."""
    rng = np.random.default_rng(11)
    truth = rng.beta(1.0, 4.0, 300)
    y = (rng.random(300) < truth).astype(int)
    probs = np.clip(truth[:, None] + rng.normal(0, 0.05, (300, 6)), 0.001, 0.999)
    return probs, y


def test_reliability_diagram(tmp_path, prediction):
    probs, y = prediction
    target = tmp_path / "nested" / "reliability.png"
    p = metrics.predictive_mean(probs)
    _assert_png(plots.reliability_diagram(metrics.calibration_bins(p, y, 15), float(metrics.ece(p, y, 15)), target),
                target)


def test_uncertainty_vs_error(tmp_path, prediction):
    probs, y = prediction
    target = tmp_path / "uve.png"
    binned = metrics.error_by_uncertainty(metrics.predictive_mean(probs), y, metrics.predictive_entropy(probs))
    path = plots.uncertainty_vs_error(binned, path=target, name="entropy")
    _assert_png(path, target)


def test_risk_coverage_plot_accepts_evaluate_report(tmp_path, prediction):
    probs, y = prediction
    report = metrics_report.evaluate(probs, y, K=2, S=3, n_bootstrap=10)
    target = tmp_path / "rc.png"
    _assert_png(plots.risk_coverage_plot(report["selective"], path=target), target)


def test_uncertainty_histogram_split_and_plain(tmp_path, prediction):
    probs, y = prediction
    p = metrics.predictive_mean(probs)
    mi = metrics.mutual_information(probs)
    split = tmp_path / "hist_split.png"
    _assert_png(plots.uncertainty_histogram(mi, (p > 0.5) == (y == 1), path=split, name="MI"), split)
    plain = tmp_path / "hist.png"
    _assert_png(plots.uncertainty_histogram(mi, path=str(plain)), plain)


def test_referral_vs_truth_plot_accepts_truth_report(tmp_path, prediction):
    probs, y = prediction
    truth = np.clip(probs[:, 0] + 0.01, 0.0, 1.0)
    tables = against_truth.truth_report(probs, y, truth, K=2, S=3)["selective"]
    target = tmp_path / "rvt.png"
    _assert_png(plots.referral_vs_truth_plot(tables, path=target), target)
