"""Scikit-learn baselines on bag aggregates: logistic regression and gradient boosting.

The examples come from the pipeline's TFRecords through ``ehr_pipeline.spec``'s parser (the
parser the trainer and the service use), and the predictions go through ``model.metrics``
and the same report files as the LSTMs, so a baseline sits in the same tables.

Features per admission, one column block per vocabulary code (``vocabulary.json``) and one
"other" column per source for codes outside it:
  * log(1 + events) of the code in the admission window (bags whose newest event lies at most
    ``window_hours`` before the trigger) and log(1 + events) in older history;
  * per code with training statistics (``numeric_stats.json``), over the window's values:
    min, max (of the bags' spec.BAG_VALUE_MIN / MAX), count-weighted mean and last z-score
    (clipped to the data's clip_z, as the Featurizer does) and a "no value in the window"
    indicator (the z-scores are then 0): severity scores keep the worst value per window;
  * age / 90, one-hot gender, one-hot admission type (as the Featurizer encodes them).
Hyperparameters are chosen by validation NLL; the test split is only predicted.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ehr_pipeline import spec
from model import metrics
from model.inputs import ADMISSION_TYPES, DataFiles, load_data_files, read_split

log = logging.getLogger(__name__)

KINDS = ("logistic", "gbm")
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
VALUE_STATS = ("z_min", "z_max", "z_mean", "z_last", "no_value")
_PARSE_BATCH = 512


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
    """Column layout of the aggregate features of one data folder."""

    count_codes: tuple[str, ...]  # vocabulary codes, then one "source:*" bucket per source
    value_codes: tuple[str, ...]  # codes with training statistics
    mean: np.ndarray  # [len(value_codes)] training mean of each value code
    std: np.ndarray  # [len(value_codes)]
    clip_z: float

    @classmethod
    def from_data_files(cls, files: DataFiles) -> FeatureLayout:
        """The layout of a data folder's vocabulary and numeric statistics."""
        codes = [c for source in sorted(files.vocabulary) for c in files.vocabulary[source]]
        buckets = [f"{source}{spec.CODE_SEPARATOR}*" for source in spec.SOURCES]
        value_codes = sorted(files.numeric_stats)
        stats = files.numeric_stats
        return cls(tuple(codes + buckets), tuple(value_codes),
                   np.array([float(stats[c]["mean"]) for c in value_codes]),
                   np.array([float(stats[c]["std"]) for c in value_codes]), files.clip_z)

    def names(self) -> list[str]:
        """One name per feature column, in column order."""
        names = [f"window_log_count[{c}]" for c in self.count_codes]
        names += [f"history_log_count[{c}]" for c in self.count_codes]
        names += [f"{stat}[{c}]" for stat in VALUE_STATS for c in self.value_codes]
        names += ["age_years/90"] + [f"gender={g}" for g in spec.GENDERS]
        names += [f"admission_type={t}" for t in ADMISSION_TYPES] + ["admission_type=other"]
        return names


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
    layout: FeatureLayout  # the training data's vocabulary and statistics
    window_hours: float

    def predict_data(self, data_dir: str | os.PathLike[str], split: str) -> np.ndarray:
        """Probabilities [N] (file order) for a split of another data folder, featurized with the training layout.

        A model trained at one site keeps its own vocabulary and z-score statistics, as an
        export does; the other folder's side files are not used.
        """
        features = read_features(load_data_files(data_dir), split, self.layout, self.window_hours)
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


def aggregate_features(parsed: Mapping[str, Any], layout: FeatureLayout,
                       window_hours: float = DEFAULT_WINDOW_HOURS) -> np.ndarray:
    """float32 [B, F] features (columns: layout.names()) of a parse_sequence_examples batch."""
    codes = parsed[spec.BAG_CODES]
    bag_splits, code_splits = (s.numpy() for s in codes.nested_row_splits)
    flat_codes = codes.flat_values.numpy()
    batch = bag_splits.size - 1
    # Each token's example and bag: bags are ragged rows of examples, tokens of bags.
    bag_example = np.repeat(np.arange(batch), np.diff(bag_splits))
    token_bag = np.repeat(np.arange(code_splits.size - 1), np.diff(code_splits))
    token_example = bag_example[token_bag]
    offsets = parsed[spec.BAG_OFFSET].flat_values.numpy().astype(np.float64)
    in_window = offsets[token_bag] <= window_hours * 3600.0

    n_count = len(layout.count_codes)
    column = {c.encode("utf-8"): i for i, c in enumerate(layout.count_codes)}
    source_column = {s.encode("utf-8"): column[f"{s}{spec.CODE_SEPARATOR}*".encode()] for s in spec.SOURCES}
    unique, inverse = np.unique(flat_codes, return_inverse=True)
    # A code outside the vocabulary counts in its source's bucket; one of an unknown source is dropped.
    unique_col = np.array([column.get(c, source_column.get(c.split(spec.CODE_SEPARATOR.encode())[0], -1))
                           for c in unique.tolist()], dtype=np.int64)
    token_col = unique_col[inverse] if unique.size else np.zeros(0, np.int64)
    counts = parsed[spec.BAG_COUNTS].flat_values.numpy().astype(np.float64)
    known = token_col >= 0
    window_counts = np.zeros((batch, n_count))
    history_counts = np.zeros((batch, n_count))
    np.add.at(window_counts, (token_example[known & in_window], token_col[known & in_window]),
              counts[known & in_window])
    np.add.at(history_counts, (token_example[known & ~in_window], token_col[known & ~in_window]),
              counts[known & ~in_window])

    values = _window_values(parsed, layout, unique, inverse, token_example, in_window, batch)
    context = _context(parsed)
    return np.concatenate([np.log1p(window_counts), np.log1p(history_counts), values, context],
                          axis=1).astype(np.float32)


def _window_values(parsed: Mapping[str, Any], layout: FeatureLayout, unique: np.ndarray, inverse: np.ndarray,
                   token_example: np.ndarray, in_window: np.ndarray, batch: int) -> np.ndarray:
    """[B, 5 * V] blocks z_min, z_max, z_mean, z_last, no_value over the window's valued tokens."""
    n_value = len(layout.value_codes)
    value_index = {c.encode("utf-8"): i for i, c in enumerate(layout.value_codes)}
    unique_vi = np.array([value_index.get(c, -1) for c in unique.tolist()], dtype=np.int64)
    token_vi = unique_vi[inverse] if unique.size else np.zeros(0, np.int64)
    value_count = parsed[spec.BAG_VALUE_COUNT].flat_values.numpy().astype(np.float64)
    use = (token_vi >= 0) & (value_count > 0) & in_window
    ex, vi, weight = token_example[use], token_vi[use], value_count[use]

    def z(key: str) -> np.ndarray:
        raw = parsed[key].flat_values.numpy().astype(np.float64)[use]
        return np.clip((raw - layout.mean[vi]) / layout.std[vi], -layout.clip_z, layout.clip_z)

    z_min = np.full((batch, n_value), np.inf)
    z_max = np.full((batch, n_value), -np.inf)
    np.minimum.at(z_min, (ex, vi), z(spec.BAG_VALUE_MIN))
    np.maximum.at(z_max, (ex, vi), z(spec.BAG_VALUE_MAX))
    weighted = np.zeros((batch, n_value))
    total = np.zeros((batch, n_value))
    np.add.at(weighted, (ex, vi), weight * z(spec.BAG_VALUE_MEAN))
    np.add.at(total, (ex, vi), weight)
    # Bags run oldest first, so a code's last valued token in flat order is its newest value.
    z_last = np.zeros((batch, n_value))
    key = ex * max(n_value, 1) + vi
    _, first_from_end = np.unique(key[::-1], return_index=True)
    newest = key.size - 1 - first_from_end
    z_last[ex[newest], vi[newest]] = z(spec.BAG_VALUE_LAST)[newest]
    seen = total > 0
    z_min[~seen] = 0.0
    z_max[~seen] = 0.0
    z_mean = np.divide(weighted, total, out=np.zeros_like(weighted), where=seen)
    return np.concatenate([z_min, z_max, z_mean, z_last, (~seen).astype(np.float64)], axis=1)


def _context(parsed: Mapping[str, Any]) -> np.ndarray:
    """[B, 1 + genders + admission types + 1]: age / 90 and one-hots, as model.inputs.Featurizer encodes them."""
    age = parsed[spec.AGE_YEARS].numpy().astype(np.float64)[:, None] / spec.AGE_CAP_YEARS
    gender = [g.decode("utf-8") for g in parsed[spec.GENDER].numpy().tolist()]
    adm = [a.decode("utf-8") for a in parsed[spec.ADMISSION_TYPE].numpy().tolist()]
    gender_hot = np.array([[g == known for known in spec.GENDERS] for g in gender], dtype=np.float64)
    adm_hot = np.array([[a == known for known in ADMISSION_TYPES] + [a not in ADMISSION_TYPES] for a in adm],
                       dtype=np.float64)
    return np.concatenate([age, gender_hot.reshape(len(gender), -1), adm_hot.reshape(len(adm), -1)], axis=1)


def read_features(files: DataFiles, split: str, layout: FeatureLayout | None = None,
                  window_hours: float = DEFAULT_WINDOW_HOURS) -> SplitFeatures:
    """The aggregate features of every example of a split (file order, as model.inputs.read_split)."""
    import tensorflow as tf

    layout = layout or FeatureLayout.from_data_files(files)
    records, labels, hadm_ids = read_split(files, split)
    blocks = []
    for start in range(0, len(records), _PARSE_BATCH):
        parsed = spec.parse_sequence_examples(tf.constant(records[start:start + _PARSE_BATCH]))
        blocks.append(aggregate_features(parsed, layout, window_hours))
    x = np.concatenate(blocks) if blocks else np.zeros((0, len(layout.names())), np.float32)
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
    layout = FeatureLayout.from_data_files(files)
    features = {s: read_features(files, s, layout, window_hours) for s in dict.fromkeys(("train", "validation", *splits))}
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
    return BaselineResult(kind=kind, seed=seed, params=params, validation_nll=scores, feature_names=layout.names(),
                          predictions=predictions, model=model, layout=layout, window_hours=window_hours)
