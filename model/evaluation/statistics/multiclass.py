"""Multi-class metrics of the image models: mixture and per-component NLL, accuracy, top-label ECE, MI.

The image models predict C classes. Here ``values`` holds per-sample class probabilities
(or logits with from_logits=True) of shape [N, M, C], M = S * K sample-major as in
model.evaluation.statistics.metrics; an [N, C] input counts as M = 1. ``y`` holds integer class labels
in [0, C), shape [N].
"""
from __future__ import annotations

import numpy as np

from model.evaluation.statistics.metrics import EPS, NUM_BINS, logsumexp


def _class_log_likelihood(values, y, from_logits: bool, eps: float) -> np.ndarray:
    """log p_m(y_n) for every example and sample, shape [N, M]."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 2:
        values = values[:, None, :]
    if values.ndim != 3 or values.shape[0] == 0 or values.shape[1] == 0 or values.shape[2] < 2:
        raise ValueError(f"values must have shape [N, M, C] or [N, C] with N, M >= 1, C >= 2, got {values.shape}")
    labels = _class_labels(y, values.shape[0], values.shape[2])
    picked = np.take_along_axis(values, np.broadcast_to(labels[:, None, None], values.shape[:2] + (1,)), axis=2)
    picked = picked[..., 0]
    if from_logits:
        # log softmax at the label: z_y - logsumexp(z); exact for logits of any magnitude.
        return picked - logsumexp(values, axis=-1)
    return np.log(np.clip(picked, eps, 1.0))


def _class_labels(y, n: int, num_classes: int) -> np.ndarray:
    """Integer labels of shape [n] in [0, num_classes), refusing anything else."""
    y = np.asarray(y)
    if y.shape != (n,):
        raise ValueError(f"labels have shape {y.shape}, expected ({n},)")
    if not np.all(np.isfinite(y.astype(np.float64))) or not np.all(y == np.round(y)):
        raise ValueError("class labels must be integers")
    y = y.astype(np.int64)
    if np.any((y < 0) | (y >= num_classes)):
        raise ValueError(f"class labels must lie in [0, {num_classes})")
    return y


def categorical_mixture_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> float:
    """Mean over examples of -log((1/M) sum_m p_m(y)): the NLL of the C-class predictive mixture."""
    log_lik = _class_log_likelihood(values, y, from_logits, eps)
    return float(-np.mean(logsumexp(log_lik, axis=-1) - np.log(log_lik.shape[-1])))


def categorical_per_component_nll(values, y, *, from_logits: bool = False, eps: float = EPS) -> float:
    """Average of the M per-component C-class NLLs (the training loss, App. D.4); >= the mixture NLL."""
    return float(-np.mean(_class_log_likelihood(values, y, from_logits, eps)))


def _class_probs(p) -> np.ndarray:
    """Validate an [N, C] matrix of predictive class probabilities."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] < 2:
        raise ValueError(f"p must have shape [N, C] with N >= 1, C >= 2, got {p.shape}")
    if np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError("class probabilities must lie in [0, 1]")
    return p


def categorical_accuracy(p, y) -> float:
    """Fraction of examples whose most probable class (first on ties) is the label; p has shape [N, C]."""
    p = _class_probs(p)
    return float(np.mean(np.argmax(p, axis=1) == _class_labels(y, p.shape[0], p.shape[1])))


def categorical_ece(p, y, num_bins: int = NUM_BINS) -> float:
    """Top-label ECE of [N, C] class probabilities: sum_b (n_b/N)|acc_b - conf_b|, confidence = max_c p_c.

    Same binning as :func:`ece` (equal-width bins [i/B, (i+1)/B) on [0, 1], the last closed),
    which is ``ed.metrics.ExpectedCalibrationError`` as the paper's image tables use it; with
    C classes the confidence can fall below 0.5, so the low bins are no longer empty.
    """
    p = _class_probs(p)
    labels = _class_labels(y, p.shape[0], p.shape[1])
    confidence = p.max(axis=1)
    correct = (np.argmax(p, axis=1) == labels).astype(np.float64)
    bins = np.clip(np.floor(confidence * num_bins).astype(np.int64), 0, num_bins - 1)
    sum_conf = np.bincount(bins, confidence, minlength=num_bins)
    sum_correct = np.bincount(bins, correct, minlength=num_bins)
    return float(np.abs(sum_correct - sum_conf).sum() / p.shape[0])


def categorical_mutual_information(probs) -> np.ndarray:
    """Per-example MI between label and component, [N] nats: H(mean_m p_m) - mean_m H(p_m), probs [N, M, C]."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3:
        raise ValueError(f"probs must have shape [N, M, C], got {probs.shape}")

    def entropy(p):
        return -np.sum(np.where(p > 0, p * np.log(np.clip(p, 1e-300, None)), 0.0), axis=-1)

    return np.maximum(entropy(probs.mean(axis=1)) - entropy(probs).mean(axis=1), 0.0)
