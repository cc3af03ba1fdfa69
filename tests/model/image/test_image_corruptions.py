"""CIFAR-10-C style corruptions: contract (shape, dtype, range, determinism), monotone intensity, file reader."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from model.image import corruptions as c

NAMES = tuple(c.CORRUPTIONS)
# Corruptions that move pixels by a random or structural amount that grows with severity.
MSE_MONOTONE = ("gaussian_noise", "shot_noise", "impulse_noise", "gaussian_blur", "jpeg_compression", "contrast",
                "brightness")


def _smooth_rgb(n=12, size=32, seed=0):
    """Natural-image-like inputs: blurred noise rescaled to [0.05, 0.95]."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, size, size, 3))
    kernel = c._gaussian_kernel(2.0)
    x = c._filter_axis(c._filter_axis(x, kernel, 1), kernel, 2)
    x = (x - x.min()) / (x.max() - x.min())
    return (0.05 + 0.9 * x).astype(np.float32)


@pytest.fixture(scope="module")
def digits():
    return (load_digits().images[:40, :, :, None] / 16.0).astype(np.float32)


def _mse(a, b):
    return float(np.mean((a.astype(np.float64) - b) ** 2))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(3, 8, 8, 1), (2, 32, 32, 3), (2, 5, 7, 2), (9, 6, 3)])
def test_contract_shape_dtype_range_determinism(name, shape):
    x = np.random.default_rng(1).random(shape).astype(np.float32)
    for severity in c.SEVERITIES:
        y = c.corrupt(x, name, severity, seed=3)
        assert y.shape == x.shape and y.dtype == np.float32
        assert y.min() >= 0.0 and y.max() <= 1.0 and np.isfinite(y).all()
        np.testing.assert_array_equal(y, c.corrupt(x, name, severity, seed=3))
    assert not np.array_equal(c.corrupt(x, name, 5), x)


def test_noise_depends_on_seed_and_float64_input_accepted():
    x = np.full((2, 8, 8, 3), 0.5)
    a, b = c.corrupt(x, "gaussian_noise", 3, seed=0), c.corrupt(x, "gaussian_noise", 3, seed=1)
    assert not np.array_equal(a, b) and a.dtype == np.float32


@pytest.mark.parametrize("name", MSE_MONOTONE)
def test_distance_from_clean_grows_with_severity(name, digits):
    for images in (digits, _smooth_rgb()):
        distances = [_mse(c.corrupt(images, name, s, seed=0), images) for s in c.SEVERITIES]
        assert all(b > a for a, b in zip(distances, distances[1:])), (name, distances)


def test_pixelate_monotone():
    # MSE on natural-image-like inputs; on any size, the resolution left (fewer distinct
    # neighbours) never grows. floor(c * 8) is 7, 7, 6, 6, 5 on digits, hence "never grows".
    smooth = _smooth_rgb()
    distances = [_mse(c.corrupt(smooth, "pixelate", s), smooth) for s in c.SEVERITIES]
    assert all(b > a for a, b in zip(distances, distances[1:])), distances
    for images in (smooth, np.random.default_rng(0).random((4, 8, 8, 1))):
        repeats = [np.mean(np.diff(c.corrupt(images, "pixelate", s), axis=2) == 0) for s in c.SEVERITIES]
        assert all(b >= a for a, b in zip(repeats, repeats[1:])) and repeats[-1] > repeats[0]


def test_contrast_reduces_std_and_keeps_channel_means(digits):
    stds = [c.corrupt(digits, "contrast", s).std(axis=(1, 2)).mean() for s in c.SEVERITIES]
    assert all(b < a for a, b in zip(stds, stds[1:])) and stds[0] < digits.std(axis=(1, 2)).mean()
    np.testing.assert_allclose(c.corrupt(digits, "contrast", 5).mean(axis=(1, 2)), digits.mean(axis=(1, 2)),
                               atol=1e-6)


def test_brightness_raises_value_and_keeps_hue():
    x = _smooth_rgb(4) * 0.6  # no clipping at severity 1
    y = c.corrupt(x, "brightness", 1)
    np.testing.assert_allclose(y.max(axis=3), x.max(axis=3) + 0.05, atol=1e-6)
    # Channel ratios (hue and saturation) are unchanged.
    np.testing.assert_allclose(y / y.max(axis=3, keepdims=True), x / x.max(axis=3, keepdims=True), atol=1e-5)
    black = c.corrupt(np.zeros((1, 2, 2, 3)), "brightness", 5)
    np.testing.assert_allclose(black, 0.3)  # black turns grey
    means = [c.corrupt(x, "brightness", s).mean() for s in c.SEVERITIES]
    assert all(b > a for a, b in zip(means, means[1:]))


def test_impulse_masks_nested_and_blur_keeps_constants():
    x = np.full((2, 16, 16, 3), 0.5, np.float32)
    hits = [c.corrupt(x, "impulse_noise", s, seed=4) != 0.5 for s in c.SEVERITIES]
    for lower, higher in zip(hits, hits[1:]):
        assert np.all(higher[lower])  # every value hit at a lower severity is hit again
    np.testing.assert_allclose(c.corrupt(x, "gaussian_blur", 5), x, atol=1e-6)
    np.testing.assert_allclose(c._gaussian_kernel(0.7).sum(), 1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(corruption="fog", severity=1), "unknown corruption"),
    (dict(corruption="contrast", severity=0), "severity"),
    (dict(corruption="contrast", severity=6), "severity"),
    (dict(corruption="contrast", severity=True), "severity"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        c.corrupt(np.zeros((1, 4, 4, 1)), **kwargs)


def test_invalid_images():
    for bad in (np.full((1, 4, 4, 1), 1.5), np.full((1, 4, 4, 1), np.nan), np.zeros((4, 4))):
        with pytest.raises(ValueError):
            c.corrupt(bad, "contrast", 1)


def test_load_cifar10c_reads_severity_blocks(tmp_path):
    n = 3  # images per severity (10000 in the release)
    images = np.zeros((5 * n, 32, 32, 3), np.uint8)
    for s in range(5):
        images[s * n:(s + 1) * n] = 50 * s + np.arange(n)[:, None, None, None]
    labels = np.tile(np.arange(n), 5).astype(np.int64)
    np.save(tmp_path / "contrast.npy", images)
    np.save(tmp_path / "labels.npy", labels)
    for severity in c.SEVERITIES:
        x, y = c.load_cifar10c(tmp_path, "contrast", severity)
        assert x.shape == (n, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int64
        np.testing.assert_allclose(x[:, 0, 0, 0], (50 * (severity - 1) + np.arange(n)) / 255.0)
        np.testing.assert_array_equal(y, np.arange(n))
    with pytest.raises(FileNotFoundError, match=r"fog\.npy.*contrast"):
        c.load_cifar10c(tmp_path, "fog", 1)
    with pytest.raises(ValueError, match="severity"):
        c.load_cifar10c(tmp_path, "contrast", 0)
    (tmp_path / "labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match="labels.npy"):
        c.load_cifar10c(tmp_path, "contrast", 1)
