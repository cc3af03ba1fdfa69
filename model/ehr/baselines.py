"""Scikit-learn baselines on bag aggregates: logistic regression and gradient boosting.

The examples come from the pipeline's TFRecords through ``ehr_pipeline.contract.spec``'s parser (the
parser the trainer and the service use), and the predictions go through ``model.evaluation.statistics.metrics``
and the same report files as the LSTMs, so a baseline sits in the same tables.

The features are the Featurizer's "window_aggregates" (``model.ehr.inputs``), the columns the EHR
model's linear part reads: per code id (vocabulary codes and one out-of-vocabulary column per
source) log(1 + events) inside the admission window (bags whose newest event lies at most
``window_hours`` before the trigger) and in older history; per code with training statistics
the window's min / max / count-weighted mean / newest z-score and a "no value in the window"
indicator (severity scores keep the worst value per window); age, gender, admission type.
Hyperparameters are chosen by validation NLL; the test split is only predicted.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ehr_pipeline.contract import spec, tf_parse
from model.evaluation.statistics import metrics
from model.ehr.config import BASELINE_KINDS
from model.data_folder import DataFiles, load_data_files, read_split
from model.ehr.inputs import Featurizer

log = logging.getLogger(__name__)

KINDS = BASELINE_KINDS
SPLITS = ("train", "validation", "test")
DEFAULT_WINDOW_HOURS = 48.0
# (penalty, inverse strength) tried for logistic regression on standardised features. L1 is in
# the grid because mortality hangs on a few analytes among hundreds of columns: on the medium
# synthetic release it chose 111 of ~700 columns and cut abs(p - P_DEATH) from 0.039 (L2) to 0.030.
LOGISTIC_SETTINGS = (*(("l2", c) for c in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)),
                     *(("l1", c) for c in (0.01, 0.02, 0.05, 0.1, 0.2)))
# (learning rate, max leaf nodes) tried for gradient boosting; the number of trees is chosen
# on validation too, up to GBM_MAX_ITER.
GBM_SETTINGS = ((0.05, 15), (0.1, 31))
GBM_MAX_ITER = 300
_PARSE_BATCH = 512


@dataclasses.dataclass(frozen=True)
class SplitFeatures:
    """Aggregate features of one split, rows in file order."""

    hadm_ids: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N]
    x: np.ndarray  # float32 [N, F]


@dataclasses.dataclass(frozen=True)
class SplitPredictions:
    """A baseline's predicted probabilities of one split, rows in file order."""

    hadm_ids: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N]
    p: np.ndarray  # float64 [N]

    @property
    def probs(self) -> np.ndarray:
        """The probabilities as an [N, 1] matrix (metrics' layout with S = K = 1)."""
        return self.p[:, None]


@dataclasses.dataclass(frozen=True)
class BaselineResult:
    """A fitted baseline: its chosen setting, the validation scores behind the choice, per-split predictions."""

    kind: str
    seed: int
    params: dict[str, Any]
    validation_nll: dict[str, float]  # setting -> validation NLL (nats)
    feature_names: list[str]
    predictions: dict[str, SplitPredictions]  # split -> its predictions
    model: Any  # the fitted scikit-learn estimator
    featurizer: Featurizer  # the training data's vocabulary, statistics and window

    def predict_data(self, data_dir: str | os.PathLike[str], split: str) -> np.ndarray:
        """Probabilities [N] (file order) for a split of another data folder, featurized as at training.

        A model trained at one site keeps its own vocabulary and z-score statistics, as an
        export does; the other folder's side files are not used.
        """
        features = read_features(load_data_files(data_dir), split, self.featurizer)
        with threadpool_limits(limits=1):
            return self.model.predict_proba(features.x)[:, 1].astype(np.float64)

    @property
    def num_parameters(self) -> int:
        """Fitted numbers: coefficients + intercept (logistic); nodes of all trees (gradient boosting)."""
        if self.kind == "logistic":
            estimator = self.model[-1]
            return int(estimator.coef_.size + estimator.intercept_.size)
        # scikit-learn has no public node count; its fitted predictors (one per tree) know theirs.
        return int(sum(2 * tree.get_n_leaf_nodes() - 1 for trees in self.model._predictors for tree in trees))


def read_features(files: DataFiles, split: str, featurizer: Featurizer | None = None,
                  window_hours: float = DEFAULT_WINDOW_HOURS) -> SplitFeatures:
    """The window aggregates of every example of a split (file order, as model.data_folder.read_split).

    featurizer: one with a window (another folder's, to featurize with its vocabulary and
    statistics); None: this folder's, with a window of window_hours.
    """
    import tensorflow as tf

    featurizer = featurizer or Featurizer.from_data_files(files, window_hours)
    split_records = read_split(files, split)
    records, labels, hadm_ids = split_records.records, split_records.labels, split_records.hadm_ids
    blocks = [featurizer(tf_parse.parse_sequence_examples(tf.constant(records[start:start + _PARSE_BATCH])))
              ["window_aggregates"].numpy() for start in range(0, len(records), _PARSE_BATCH)]
    x = np.concatenate(blocks) if blocks else np.zeros((0, featurizer.window_aggregate_dim), np.float32)
    return SplitFeatures(np.asarray(hadm_ids, np.int64), np.asarray(labels, np.int64), x)


def fit_logistic(train: SplitFeatures, val: SplitFeatures, seed: int):
    """Standardised logistic regression; penalty and C by validation NLL. Returns (model, params, scores)."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scores, fitted = {}, {}
    for penalty, c in LOGISTIC_SETTINGS:
        model = make_pipeline(StandardScaler(), logistic_regression(penalty, c, seed))
        model.fit(train.x, train.labels)
        name = f"penalty={penalty},C={c:g}"
        scores[name] = float(metrics.nll(model.predict_proba(val.x)[:, 1], val.labels))
        fitted[name] = (model, {"penalty": penalty, "C": c})
    best = min(scores, key=scores.get)
    return fitted[best][0], fitted[best][1], scores


def logistic_regression(penalty: str, c: float, seed: int):
    """An unfitted scikit-learn LogisticRegression with an L1 or L2 penalty of inverse strength c."""
    from sklearn.linear_model import LogisticRegression

    # lbfgs has no L1; liblinear's coordinate descent does and converges on these sizes.
    solver = "liblinear" if penalty == "l1" else "lbfgs"
    return LogisticRegression(C=c, l1_ratio=1.0 if penalty == "l1" else 0.0, solver=solver, max_iter=5000,
                              random_state=seed)


def _fit_gbm(train: SplitFeatures, val: SplitFeatures, seed: int):
    """HistGradientBoostingClassifier; learning rate, leaves and number of trees by validation NLL."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    scores, best = {}, None
    for lr, leaves in GBM_SETTINGS:
        model = HistGradientBoostingClassifier(learning_rate=lr, max_leaf_nodes=leaves, max_iter=GBM_MAX_ITER,
                                               l2_regularization=1.0, early_stopping=False, random_state=seed)
        model.fit(train.x, train.labels)
        # One fit scores every number of trees: staged predictions on validation.
        stage_nll = [float(metrics.nll(p[:, 1], val.labels)) for p in model.staged_predict_proba(val.x)]
        n_trees = int(np.argmin(stage_nll)) + 1
        name = f"learning_rate={lr:g},max_leaf_nodes={leaves},max_iter={n_trees}"
        scores[name] = stage_nll[n_trees - 1]
        if best is None or scores[name] < scores[best[0]]:
            best = (name, {"learning_rate": lr, "max_leaf_nodes": leaves, "max_iter": n_trees})
    params = best[1]
    # Without early stopping or subsampling the refit with the chosen tree count is the same model, truncated.
    model = HistGradientBoostingClassifier(learning_rate=params["learning_rate"],
                                           max_leaf_nodes=params["max_leaf_nodes"], max_iter=params["max_iter"],
                                           l2_regularization=1.0, early_stopping=False, random_state=seed)
    model.fit(train.x, train.labels)
    return model, params, scores


def fit_baseline(data_dir: str | os.PathLike[str], kind: str, seed: int = 0, *,
                 splits: Sequence[str] = SPLITS, window_hours: float = DEFAULT_WINDOW_HOURS) -> BaselineResult:
    """Fits a baseline ("logistic" or "gbm") on train, chooses its setting on validation, predicts `splits`."""
    if kind not in KINDS:
        raise ValueError(f"baseline kind must be one of {KINDS}, got {kind!r}")
    files = load_data_files(data_dir)
    featurizer = Featurizer.from_data_files(files, window_hours)
    features = {s: read_features(files, s, featurizer) for s in dict.fromkeys(("train", "validation", *splits))}
    train, val = features["train"], features["validation"]
    if np.unique(train.labels).size < 2:
        raise ValueError(f"{files.data_dir}: the train split has one class only; a baseline cannot be fitted")
    fit = fit_logistic if kind == "logistic" else _fit_gbm
    # One native thread: on a shared, oversubscribed machine OpenMP's spinning workers turned a
    # 20-s gradient boosting fit into many minutes; these fits are small enough for one core.
    with threadpool_limits(limits=1):
        model, params, scores = fit(train, val, seed)
    log.info("%s baseline: chose %s (validation NLL %.4f)", kind, params, min(scores.values()))
    with threadpool_limits(limits=1):
        predictions = {s: SplitPredictions(features[s].hadm_ids, features[s].labels,
                                           model.predict_proba(features[s].x)[:, 1].astype(np.float64))
                       for s in splits}
    return BaselineResult(kind=kind, seed=seed, params=params, validation_nll=scores,
                          feature_names=featurizer.window_aggregate_names(), predictions=predictions, model=model,
                          featurizer=featurizer)
