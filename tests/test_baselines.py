"""model.baselines on real TFRecords: the aggregates against a plain-Python loop over each
SequenceExample, the fitted models against scikit-learn fitted directly."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from ehr_testdata import write_data_dir
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ehr_pipeline import spec
from model import baselines, inputs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("baseline_data"), seed=3)


def _naive_features(ex: dict, layout: baselines.FeatureLayout, window_hours: float) -> np.ndarray:
    """The aggregates of one example, one token at a time, from spec.sequence_example_to_dict."""
    col = {c: i for i, c in enumerate(layout.count_codes)}
    window, history = np.zeros(len(col)), np.zeros(len(col))
    seen: dict[str, list] = {c: [] for c in layout.value_codes}
    for b, offset in enumerate(ex[spec.BAG_OFFSET]):
        in_window = offset <= window_hours * 3600
        for j, code in enumerate(ex[spec.BAG_CODES][b]):
            c = col.get(code, col.get(code.split(":")[0] + ":*"))
            (window if in_window else history)[c] += ex[spec.BAG_COUNTS][b][j]
            if in_window and code in seen and ex[spec.BAG_VALUE_COUNT][b][j] > 0:
                seen[code].append([ex[k][b][j] for k in (spec.BAG_VALUE_COUNT, spec.BAG_VALUE_MIN,
                                                         spec.BAG_VALUE_MAX, spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST)])
    blocks = {name: [] for name in baselines.VALUE_STATS}
    for i, code in enumerate(layout.value_codes):
        def z(v):
            return min(max((v - layout.mean[i]) / layout.std[i], -layout.clip_z), layout.clip_z)
        rows = seen[code]
        if not rows:
            for name in baselines.VALUE_STATS:
                blocks[name].append(1.0 if name == "no_value" else 0.0)
            continue
        blocks["z_min"].append(min(z(r[1]) for r in rows))
        blocks["z_max"].append(max(z(r[2]) for r in rows))
        blocks["z_mean"].append(sum(r[0] * z(r[3]) for r in rows) / sum(r[0] for r in rows))
        blocks["z_last"].append(z(rows[-1][4]))
        blocks["no_value"].append(0.0)
    adm = ex[spec.ADMISSION_TYPE]
    context = ([ex[spec.AGE_YEARS] / spec.AGE_CAP_YEARS] + [float(ex[spec.GENDER] == g) for g in spec.GENDERS]
               + [float(adm == t) for t in inputs.ADMISSION_TYPES] + [float(adm not in inputs.ADMISSION_TYPES)])
    values = [v for name in baselines.VALUE_STATS for v in blocks[name]]
    return np.concatenate([np.log1p(window), np.log1p(history), values, context])


@pytest.mark.parametrize("window_hours", [48.0, 12.0])
def test_aggregates_match_a_per_token_loop(data, window_hours):
    files = inputs.load_data_files(data)
    layout = baselines.FeatureLayout.from_data_files(files)
    records, _, _ = inputs.read_split(files, "test")  # holds codes outside the vocabulary
    x = baselines.aggregate_features(spec.parse_sequence_examples(tf.constant(records)), layout, window_hours)
    assert x.shape == (len(records), len(layout.names()))
    expected = np.stack([_naive_features(spec.sequence_example_to_dict(r), layout, window_hours) for r in records])
    np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-5)
    history = x[:, len(layout.count_codes):2 * len(layout.count_codes)]
    assert history.sum() > 0 and x[:, :len(layout.count_codes)].sum() > 0  # both sides of the window are used


def test_logistic_baseline_is_scikit_learns_fit_at_the_validation_choice(data):
    result = baselines.fit_baseline(data, "logistic", seed=0)
    files = inputs.load_data_files(data)
    train, val, test = (baselines.read_features(files, s) for s in ("train", "validation", "test"))
    def fit(penalty, c):
        solver = "liblinear" if penalty == "l1" else "lbfgs"
        l1_ratio = {"l1": 1.0, "l2": 0.0}[penalty]
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, l1_ratio=l1_ratio, solver=solver, max_iter=5000,
                                                                  random_state=0)).fit(train.x, train.labels)

    scores = {setting: log_loss(val.labels, fit(*setting).predict_proba(val.x)[:, 1], labels=[0, 1])
              for setting in baselines.LOGISTIC_SETTINGS}
    assert {penalty for penalty, _ in scores} == {"l1", "l2"}
    best = min(scores, key=scores.get)
    assert result.params == {"penalty": best[0], "C": best[1]}
    assert result.validation_nll[f"penalty={best[0]},C={best[1]:g}"] == pytest.approx(scores[best], rel=1e-6)
    model = fit(*best)
    pred = result.predictions["test"]
    np.testing.assert_array_equal(pred.hadm_ids, test.hadm_ids)
    np.testing.assert_allclose(pred.p, model.predict_proba(test.x)[:, 1], rtol=1e-6)
    assert pred.probs.shape == (len(pred.p), 1)
    assert result.num_parameters == model[-1].coef_.size + 1
    # Another data folder is featurized with the training layout (here: the same folder).
    np.testing.assert_allclose(result.predict_data(data, "test"), pred.p, rtol=1e-6)


def test_gbm_baseline_learns_the_signal_and_chooses_on_validation(data):
    result = baselines.fit_baseline(data, "gbm", seed=0, splits=("test",))
    assert set(result.predictions) == {"test"}
    assert (result.params["learning_rate"], result.params["max_leaf_nodes"]) in baselines.GBM_SETTINGS
    assert 1 <= result.params["max_iter"] <= baselines.GBM_MAX_ITER
    assert min(result.validation_nll.values()) == pytest.approx(
        result.validation_nll[next(k for k in result.validation_nll if f"max_iter={result.params['max_iter']}" in k
                                   and f"learning_rate={result.params['learning_rate']:g}," in k)])
    pred = result.predictions["test"]
    assert roc_auc_score(pred.labels, pred.p) > 0.75  # "diagnosis:RISK" and high lactate mostly die
    assert result.num_parameters >= result.params["max_iter"]  # at least one node per tree


def test_unknown_kind_is_refused(data):
    with pytest.raises(ValueError, match="logistic"):
        baselines.fit_baseline(data, "svm")
