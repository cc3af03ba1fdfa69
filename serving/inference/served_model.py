"""The served model: a verified export and its SavedModel signature, and the summaries of its samples.

Start-up fails here, with a message naming the file, when the directory is missing, a file
is absent or is not what manifest.json's SHA-256 says, the SavedModel does not load or has
the wrong signature, or a JSON file does not hold what the service needs: all checked by the
exporter's own reader (``model.export.load.load_export``), the one reader of the format.

Every uncertainty number comes from ``model.evaluation.statistics.metrics`` (never re-implemented here), so the
service reports exactly the quantities the evaluation reported.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import pathlib
from collections.abc import Sequence

import numpy as np

from model.evaluation.statistics import metrics as model_metrics
from model.export.load import Export, ExportError, LoadedExport, load_export
from serving.inference import precision as precision_choice
from serving.inference.precision import PrecisionChoice

logger = logging.getLogger(__name__)

INTERVAL_LEVEL = 0.95


class ModelDirError(RuntimeError):
    """The export directory cannot be served; the message names the file and the problem."""


# ------------------------------------------------------------------------ the model


class ServedModel:
    """A verified export plus its loaded SavedModel signature; forward() is thread-safe."""

    def __init__(self, loaded: LoadedExport, choice: PrecisionChoice | None = None, *, name: str | None = None,
                 version: str | None = None):
        self._loaded = loaded  # holds the SavedModel and its variables
        self.export: Export = loaded.files
        self.choice = choice or precision_choice.fixed(loaded.precision)
        # What answers name: a model repository's NAME/VERSION folders, else the model card's name and version.
        self.name = name or self.export.card.name
        self.version = version or self.export.card.version

    @property
    def precision(self) -> str:
        """Operand precision of the LSTM's matmuls in the signature in use ("float32" or "bfloat16")."""
        return self._loaded.precision

    @classmethod
    def load(cls, model_dir: str | pathlib.Path, precision: str = "float32", *, name: str | None = None,
             version: str | None = None) -> ServedModel:
        """Verifies every checksum, validates the side files and loads the SavedModel (model.export.load.load_export).

        name and version: what answers call it (a model repository's folders); None: its model card's.

        precision "bfloat16" serves the export's bfloat16 signature (probabilities within the
        tolerance docs/serving.md states), "float32" the exact one, "auto" float32 until
        choose_precision() has timed both (serving.inference.precision).
        """
        try:
            loaded = load_export(model_dir, "float32" if precision == precision_choice.AUTO else precision)
        except ExportError as err:
            raise ModelDirError(str(err)) from None
        export = loaded.files
        logger.info("loaded model %s %s (K=%d, --precision %s) from %s", name or export.card.name,
                    version or export.card.version, export.ensemble_size, precision, export.directory)
        choice = None
        if precision == precision_choice.AUTO:
            choice = precision_choice.fixed("float32", "auto times both signatures at warm-up; until then, or "
                                                       "with --no-warmup, float32 (exact)")
        return cls(loaded, choice, name=name, version=version)

    def choose_precision(self, examples: Sequence[bytes], num_samples: int) -> PrecisionChoice:
        """With --precision auto: times both signatures on `examples` and serves the faster (serving.inference.precision).

        Runs on the model thread (it calls forward passes); any other --precision keeps its choice.
        """
        if self.choice.requested != precision_choice.AUTO:
            return self.choice
        exact = self._loaded.with_precision("float32")
        try:
            low = exact.with_precision("bfloat16")
        except ExportError:
            self.choice = precision_choice.fixed("float32", "the export has no bfloat16 signature (an older "
                                                            "export); float32")
            return self.choice
        choice = precision_choice.measure(functools.partial(self._forward, exact),
                                          functools.partial(self._forward, low), examples, num_samples)
        self._loaded = low if choice.served == "bfloat16" else exact
        self.choice = choice
        return choice

    def forward(self, examples: Sequence[bytes], num_samples: int, seed: int) -> np.ndarray:
        """Sampled probabilities [N, num_samples * K] (float64, sample-major) for serialized SequenceExamples."""
        return self._forward(self._loaded, examples, num_samples, seed)

    def _forward(self, loaded: LoadedExport, examples: Sequence[bytes], num_samples: int, seed: int) -> np.ndarray:
        """forward() through the signature of `loaded`."""
        from model.export.predict import predict_probs  # why: TensorFlow loads with the model; the same call as ehr-eval

        out = predict_probs(loaded, list(examples), num_samples, seed,
                            batch_size=max(len(examples), 1)).astype(np.float64)
        expected = (len(examples), num_samples * self.export.ensemble_size)
        if out.shape != expected:
            raise RuntimeError(f"model returned probs of shape {out.shape}, expected {expected} "
                               f"(N, S*K with K = model_card ensemble_size)")
        if not np.all(np.isfinite(out)) or np.any((out < 0) | (out > 1)):
            raise RuntimeError("model returned probabilities outside [0, 1] or non-finite")
        return out


@dataclasses.dataclass(frozen=True)
class Summary:
    """Per-example summaries of an [N, S*K] probability matrix, each of shape [N] unless noted."""

    probability: np.ndarray
    std: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    predictive_entropy: np.ndarray
    aleatoric: np.ndarray
    epistemic: np.ndarray
    members: np.ndarray  # [N, K]
    predicted_positive: np.ndarray  # bool
    across_threshold: np.ndarray
    referral_value: np.ndarray
    refer: np.ndarray  # bool


def summarise(probs: np.ndarray, export: Export, num_samples: int) -> Summary:
    """Uncertainty summaries of sampled probabilities [N, S*K] (the definitions of the evaluation's metrics, nats)."""
    k = export.ensemble_size
    measures = model_metrics.uncertainties(probs)
    mean = model_metrics.predictive_mean(probs)
    tail = (1.0 - INTERVAL_LEVEL) / 2.0
    lower, upper = np.quantile(probs, [tail, 1.0 - tail], axis=1)
    threshold = export.metrics.decision_threshold
    positive = mean > threshold  # the strict '>' of model.evaluation.statistics.metrics.accuracy
    across = np.mean((probs > threshold) != positive[:, None], axis=1)
    policy = export.metrics.referral
    referral_threshold = -math.inf if policy.threshold is None else policy.threshold
    value = measures[policy.measure]
    return Summary(
        probability=mean,
        std=measures["predictive_std"],
        lower=lower,
        upper=upper,
        predictive_entropy=measures["predictive_entropy"],
        aleatoric=model_metrics.expected_entropy(probs),
        epistemic=measures["mutual_information"],
        members=model_metrics.member_means(probs, k, num_samples),
        predicted_positive=positive,
        across_threshold=across,
        referral_value=value,
        refer=model_metrics.refer(value, referral_threshold),
    )
