"""Clean and corrupted evaluation of an image model: NLL, accuracy, ECE per corruption and intensity.

Predictions are S samples x K members of every image in one vectorised forward pass
(``ImageModel(images, num_samples=S)``). Every metric is of the predictive mixture over
those M = S*K components, from ``model.evaluation.statistics.metrics``: the mixture NLL (App. D.5), and accuracy
and top-label ECE of the mean probability. The paper's cNLL / cA / cECE are the means over
all (corruption, intensity) pairs; ``by_severity`` gives the curves of its Figure 8.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from model.evaluation.statistics import metrics, multiclass
from model.export_layout import MAX_SAMPLES, json_ready
from model.image import corruptions
from model.image.config import ImageExperimentConfig
from model.image.data import ImageData

METRICS = ("nll", "accuracy", "ece", "mutual_information")
REPORT_FILE = "metrics.json"
SUMMARY_FILE = "summary.md"


def predict_logits(model: tf.keras.Model, images: np.ndarray, *, num_samples: int = 1,
                   batch_size: int = 256) -> np.ndarray:
    """Logits [N, S*K, C] (sample-major) of `images`, in batches of `batch_size` images."""
    s = tf.constant(num_samples, tf.int32)
    out = []
    for start in range(0, images.shape[0], batch_size):
        out.append(model.predict_logits(tf.constant(images[start:start + batch_size], tf.float32), s).numpy())
    if not out:
        raise ValueError("no images to predict")
    return np.concatenate(out)


def classification_metrics(logits: np.ndarray, labels: np.ndarray, num_bins: int = metrics.NUM_BINS
                           ) -> dict[str, float]:
    """Mixture NLL, accuracy, ECE and mean mutual information of logits [N, M, C] (the mixture of the M components)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=-1, keepdims=True)
    p_mean = probs.mean(axis=1)
    return {
        "nll": multiclass.categorical_mixture_nll(logits, labels, from_logits=True),
        "accuracy": multiclass.categorical_accuracy(p_mean, labels),
        "ece": multiclass.categorical_ece(p_mean, labels, num_bins),
        "per_component_nll": multiclass.categorical_per_component_nll(logits, labels, from_logits=True),
        # Epistemic part of the predictive entropy (0 for a single network): expected to grow under shift.
        "mutual_information": float(multiclass.categorical_mutual_information(probs).mean()),
    }


def effective_samples(config: ImageExperimentConfig, num_samples: int | None = None) -> int:
    """S to draw: the requested (or configured) count, 1 for a method whose passes never differ."""
    s = config.eval.num_samples if num_samples is None else int(num_samples)
    if not 1 <= s <= MAX_SAMPLES:
        raise ValueError(f"num_samples must be in [1, {MAX_SAMPLES}], got {s}")
    return s if config.model.stochastic else 1


def corrupted_test_sets(config: ImageExperimentConfig, data: ImageData, corrupted_dir: str | os.PathLike | None
                        = None) -> Iterator[tuple[str, int, np.ndarray, np.ndarray]]:
    """(corruption, severity, images, labels) of every configured pair: real CIFAR-C files or computed here."""
    dc = config.data
    directory = corrupted_dir if corrupted_dir is not None else dc.corrupted_dir
    for name in dc.corruptions:
        for severity in dc.severities:
            if directory is not None:
                x, y = corruptions.load_cifar10c(directory, name, severity)
            else:
                x, y = corruptions.corrupt(data.x_test, name, severity, seed=dc.corruption_seed), data.y_test
            yield name, severity, x, y


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k in METRICS}


def evaluate_model(model: tf.keras.Model, config: ImageExperimentConfig, data: ImageData, *,
                   num_samples: int | None = None, seed: int | None = None, batch_size: int | None = None,
                   corrupted: bool = True, corrupted_dir: str | os.PathLike | None = None,
                   progress: bool = False) -> dict[str, Any]:
    """Report of one model: clean test (and validation) metrics, every corruption x intensity, their means."""
    ec = config.eval
    s = effective_samples(config, num_samples)
    tf.random.set_seed(ec.seed if seed is None else seed)  # the rank-1 / dropout draws of this evaluation
    bs = batch_size or ec.batch_size

    def score(x, y):
        return classification_metrics(predict_logits(model, x, num_samples=s, batch_size=bs), y, ec.num_bins)

    report: dict[str, Any] = {
        "name": config.name, "method": config.model.method_name, "dataset": config.data.dataset,
        "K": model.ensemble_size, "S": s, "num_bins": ec.num_bins, "n_test": int(data.y_test.shape[0]),
        "test": score(data.x_test, data.y_test),
    }
    if data.y_val.size:
        report["validation"] = score(data.x_val, data.y_val)
    if corrupted and config.data.corruptions:
        per: dict[str, dict[str, dict[str, float]]] = {}
        pairs = corrupted_test_sets(config, data, corrupted_dir)
        total = len(config.data.corruptions) * len(config.data.severities)
        for name, severity, x, y in tqdm(pairs, total=total, desc="corrupted", disable=not progress):
            per.setdefault(name, {})[str(severity)] = score(x, y)
        rows = [row for by_sev in per.values() for row in by_sev.values()]
        report["corrupted"] = per
        report["by_severity"] = {str(sev): _mean([per[c][str(sev)] for c in per]) for sev in config.data.severities}
        report["mean_corrupted"] = _mean(rows)  # the paper's cNLL / cA / cECE
        report["corruption_source"] = "files" if (corrupted_dir or config.data.corrupted_dir) else "computed"
    return report


def _fmt(value: float, digits: int = 4) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def format_report(report: dict[str, Any]) -> str:
    """Markdown tables of a report: clean and corrupted means, then accuracy per corruption and intensity."""
    lines = [f"**{report['name']}** ({report['method']}, {report['dataset']}, K={report['K']}, S={report['S']}, "
             f"n_test={report['n_test']})", "",
             "| split | NLL | accuracy | ECE |", "|---|---|---|---|"]
    for split in ("validation", "test"):
        if split in report:
            r = report[split]
            lines.append(f"| {split} | {_fmt(r['nll'])} | {_fmt(r['accuracy'])} | {_fmt(r['ece'])} |")
    if "mean_corrupted" in report:
        r = report["mean_corrupted"]
        lines.append(f"| corrupted (mean: cNLL / cA / cECE) | {_fmt(r['nll'])} | {_fmt(r['accuracy'])} | "
                     f"{_fmt(r['ece'])} |")
        sevs = list(report["by_severity"])
        lines += ["", "| accuracy | " + " | ".join(f"sev {s}" for s in sevs) + " |",
                  "|---|" + "---|" * len(sevs)]
        for name, by_sev in report["corrupted"].items():
            lines.append(f"| {name} | " + " | ".join(_fmt(by_sev[s]["accuracy"], 3) for s in sevs) + " |")
        lines.append("| **mean** | " + " | ".join(_fmt(report["by_severity"][s]["accuracy"], 3) for s in sevs) + " |")
    return "\n".join(lines)


def write_report(directory: str | os.PathLike[str], report: dict[str, Any]) -> pathlib.Path:
    """Writes metrics.json and summary.md into `directory`; returns it."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_FILE).write_text(json.dumps(json_ready(report), indent=2, allow_nan=False) + "\n")
    (out / SUMMARY_FILE).write_text(format_report(report) + "\n")
    return out
