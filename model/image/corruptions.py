"""CIFAR-10-C style corruptions in numpy, and a reader for the real CIFAR-10-C / CIFAR-100-C files.

Hendrycks & Dietterich (2019) corrupt the test set with 15 corruption types at intensities
1-5; the paper's cNLL / cA / cECE average over all of them. Eight of those types are
implemented here from their published per-severity parameters (CIFAR scale), each written
for images of any size and channel count:

  gaussian_noise, shot_noise, impulse_noise   additive / Poisson / salt-and-pepper noise
  gaussian_blur                               separable Gaussian filter
  contrast, brightness                        per-channel contrast, HSV value shift
  pixelate                                    box down-sampling, nearest up-sampling
  jpeg_compression                            JPEG round trip (Pillow, matplotlib's dependency)

Parameters are in pixel units, as defined for 32x32 CIFAR: on smaller images (8x8 digits)
a blur or pixelation of the same severity is relatively stronger. Means over these eight are
therefore not the paper's numbers over fifteen; with the real CIFAR-10-C files
(``load_cifar10c``) the full set is available.

Every function takes float images in [0, 1] of shape [N, H, W, C] or [H, W, C] and returns
float32 of the same shape, clipped to [0, 1]. Randomness comes only from the ``seed``: the
same seed gives the same corruption, and within one seed the noise draws are shared across
severities, so a higher severity corrupts strictly more (the impulse mask of severity 2
contains that of severity 1).
"""
from __future__ import annotations

import io
import os
import pathlib
from typing import Callable

import numpy as np

SEVERITIES = (1, 2, 3, 4, 5)

# Per-severity parameters of the CIFAR-10-C generator (Hendrycks & Dietterich 2019, CIFAR scale).
_GAUSSIAN_NOISE_STD = (0.04, 0.06, 0.08, 0.09, 0.10)
_SHOT_NOISE_RATE = (500.0, 250.0, 100.0, 75.0, 50.0)  # photons at full intensity: fewer = noisier
_IMPULSE_AMOUNT = (0.01, 0.02, 0.03, 0.05, 0.07)
_BLUR_SIGMA = (0.4, 0.6, 0.7, 0.8, 1.0)
_CONTRAST_FACTOR = (0.75, 0.5, 0.4, 0.3, 0.15)
_BRIGHTNESS_SHIFT = (0.05, 0.1, 0.15, 0.2, 0.3)
_PIXELATE_SCALE = (0.95, 0.9, 0.85, 0.75, 0.65)
_JPEG_QUALITY = (80, 65, 58, 50, 40)

# File names of the real CIFAR-10-C / CIFAR-100-C release (one .npy per corruption).
CIFAR_C_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
    "gaussian_blur", "saturate", "spatter", "speckle_noise",
)
CIFAR_C_PER_SEVERITY = 10000  # test images per severity in the real files


def _as_batch(images) -> tuple[np.ndarray, bool]:
    """Float64 [N, H, W, C] view of the input and whether it was a single [H, W, C] image."""
    x = np.asarray(images)
    single = x.ndim == 3
    if single:
        x = x[None]
    if x.ndim != 4 or min(x.shape[1:]) < 1:
        raise ValueError(f"images must have shape [N, H, W, C] or [H, W, C], got {np.shape(images)}")
    x = x.astype(np.float64)
    if x.size and (np.isnan(x).any() or x.min() < 0.0 or x.max() > 1.0):
        raise ValueError("images must be floats in [0, 1]")
    return x, single


def _finish(x: np.ndarray, single: bool) -> np.ndarray:
    out = np.clip(x, 0.0, 1.0).astype(np.float32)
    return out[0] if single else out


def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Adds N(0, sigma^2) noise to every value."""
    return x + _GAUSSIAN_NOISE_STD[severity - 1] * rng.standard_normal(x.shape)


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson photon noise: Poisson(x * rate) / rate."""
    rate = _SHOT_NOISE_RATE[severity - 1]
    return rng.poisson(x * rate) / rate


def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Salt and pepper: a fraction `amount` of the values is set to 0 or 1 (even odds)."""
    # Both uniforms are drawn whatever the severity, so the masks are nested across severities.
    hit, salt = rng.random(x.shape), rng.random(x.shape)
    return np.where(hit < _IMPULSE_AMOUNT[severity - 1], (salt < 0.5).astype(np.float64), x)


def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = max(1, int(np.ceil(4.0 * sigma)))  # scipy.ndimage's default truncation at 4 sigma
    t = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (t / sigma) ** 2)
    return k / k.sum()


def _filter_axis(x: np.ndarray, kernel: np.ndarray, axis: int) -> np.ndarray:
    """Correlates along one axis with mirror padding (the edge pixel repeated: scipy's 'reflect')."""
    r = kernel.size // 2
    pad = [(0, 0)] * x.ndim
    pad[axis] = (r, r)
    padded = np.pad(x, pad, mode="symmetric")
    n = x.shape[axis]
    out = np.zeros_like(x)
    for i, w in enumerate(kernel):
        out += w * np.take(padded, np.arange(i, i + n), axis=axis)
    return out


def gaussian_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Separable Gaussian blur of every channel (sigma in pixels)."""
    kernel = _gaussian_kernel(_BLUR_SIGMA[severity - 1])
    return _filter_axis(_filter_axis(x, kernel, 1), kernel, 2)


def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Pulls every value towards its image's per-channel mean by a factor c < 1."""
    means = x.mean(axis=(1, 2), keepdims=True)
    return (x - means) * _CONTRAST_FACTOR[severity - 1] + means


def brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Raises the HSV value V = max over channels by c (clipped at 1), keeping hue and saturation."""
    # In HSV every channel is V times a function of (H, S), so a new V' scales all channels
    # by V'/V; a black pixel (V = 0, hue undefined) becomes grey V'. One channel: x + c.
    v = x.max(axis=3, keepdims=True)
    v_new = np.minimum(v + _BRIGHTNESS_SHIFT[severity - 1], 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v > 0, x * (v_new / np.where(v > 0, v, 1.0)), v_new)


def _box_weights(n_out: int, n_in: int) -> np.ndarray:
    """[n_out, n_in] area weights of a box down-sampling (fractional pixel overlaps, rows sum to 1)."""
    edges = np.arange(n_out + 1) * (n_in / n_out)
    lo, hi = edges[:-1, None], edges[1:, None]
    j = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(hi, j + 1) - np.maximum(lo, j), 0.0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Box down-sampling to floor(c * size) pixels per side, then nearest-neighbour up-sampling."""
    _, h, w, _ = x.shape
    scale = _PIXELATE_SCALE[severity - 1]
    hs, ws = max(1, int(h * scale)), max(1, int(w * scale))
    # Two separable matrix products (rows, then columns): O(N H W C) per product.
    small = np.einsum("ih,nhwc->niwc", _box_weights(hs, h), x, optimize=True)
    small = np.einsum("jw,niwc->nijc", _box_weights(ws, w), small, optimize=True)
    rows = np.minimum(((np.arange(h) + 0.5) * hs / h).astype(int), hs - 1)
    cols = np.minimum(((np.arange(w) + 0.5) * ws / w).astype(int), ws - 1)
    return small[:, rows][:, :, cols]


def jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """JPEG encode/decode at quality 80 ... 40 (3 channels as RGB, any other count channel by channel)."""
    from PIL import Image  # Pillow comes with matplotlib; imported here so the noise functions need numpy only

    quality = _JPEG_QUALITY[severity - 1]
    as_bytes = np.round(x * 255.0).astype(np.uint8)

    def roundtrip(img: np.ndarray) -> np.ndarray:
        buffer = io.BytesIO()
        Image.fromarray(img).save(buffer, format="JPEG", quality=quality)
        buffer.seek(0)
        return np.asarray(Image.open(buffer))

    out = np.empty_like(as_bytes)
    for n in range(x.shape[0]):
        if x.shape[3] == 3:
            out[n] = roundtrip(as_bytes[n])
        else:
            for c in range(x.shape[3]):
                out[n, :, :, c] = roundtrip(as_bytes[n, :, :, c])
    return out.astype(np.float64) / 255.0


CORRUPTIONS: dict[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "gaussian_blur": gaussian_blur,
    "contrast": contrast,
    "brightness": brightness,
    "pixelate": pixelate,
    "jpeg_compression": jpeg_compression,
}


def corrupt(images, corruption: str, severity: int, seed: int = 0) -> np.ndarray:
    """`corruption` at intensity `severity` (1-5) of float images in [0, 1]; float32, same shape, in [0, 1]."""
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; expected one of {list(CORRUPTIONS)}")
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    x, single = _as_batch(images)
    return _finish(CORRUPTIONS[corruption](x, severity, np.random.default_rng(seed)), single)


def load_cifar10c(directory: str | os.PathLike[str], corruption: str, severity: int,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [n, 32, 32, 3] in [0, 1], labels int64 [n]) of one corruption and severity.

    The release stores ``<corruption>.npy`` (uint8 [5 * n, 32, 32, 3]: the n test images at
    severity 1, then 2, ... 5) and ``labels.npy`` beside it; CIFAR-100-C has the same layout.
    """
    root = pathlib.Path(directory)
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    images_path, labels_path = root / f"{corruption}.npy", root / "labels.npy"
    missing = [p.name for p in (images_path, labels_path) if not p.is_file()]
    if missing:
        known = sorted(p.stem for p in root.glob("*.npy") if p.stem != "labels") if root.is_dir() else []
        raise FileNotFoundError(f"{root}: missing {', '.join(missing)} (CIFAR-10-C layout: <corruption>.npy + "
                                f"labels.npy; corruptions present: {known or 'none'})")
    # mmap: a corruption file is 150 MB and only a fifth of it is needed.
    images = np.load(images_path, mmap_mode="r")
    labels = np.load(labels_path, mmap_mode="r")
    if images.ndim != 4 or images.shape[0] % len(SEVERITIES) or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{images_path}: expected [5n, H, W, C] images with as many labels, got {images.shape} "
                         f"and {labels.shape}")
    n = images.shape[0] // len(SEVERITIES)
    part = slice((severity - 1) * n, severity * n)
    return np.asarray(images[part], dtype=np.float32) / 255.0, np.asarray(labels[part], dtype=np.int64)
