"""model.ehr.baselines on real TFRecords: the aggregates against a plain-Python loop over each
SequenceExample, the fitted models against scikit-learn fitted directly."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import seqex
from model import data_folder
from model.ehr import baselines, inputs
from tests.support.ehr_testdata import write_data_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("baseline_data"), seed=3)


def _naive_features(ex: dict, files: data_folder.DataFiles, window_hours: float) -> dict[str, float]:
    """The aggregates of one example by column name, one token at a time, from seqex.sequence_example_to_dict."""
    vocabulary = {c for codes in files.vocabulary.values() for c in codes}
    stats = files.numeric_stats
    out: dict[str, float] = {}
    seen: dict[str, list] = {}
    for b, offset in enumerate(ex[spec.BAG_OFFSET]):
        in_window = offset <= window_hours * 3600
        for j, code in enumerate(ex[spec.BAG_CODES][b]):
            column = code if code in vocabulary else code.split(":")[0] + ":<oov>"
            name = f"{'window' if in_window else 'history'}_log_count[{column}]"
            out[name] = out.get(name, 0.0) + ex[spec.BAG_COUNTS][b][j]
            if in_window and code in stats and ex[spec.BAG_VALUE_COUNT][b][j] > 0:
                seen.setdefault(code, []).append([ex[k][b][j] for k in (
                    spec.BAG_VALUE_COUNT, spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX, spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST)])
    out = {name: float(np.log1p(v)) for name, v in out.items()}
    for code in stats:
        def z(v):
            return min(max((v - stats[code]["mean"]) / stats[code]["std"], -files.clip_z), files.clip_z)
        rows = seen.get(code)
        out[f"no_value[{code}]"] = 0.0 if rows else 1.0
        if rows:
            out[f"z_min[{code}]"] = min(z(r[1]) for r in rows)
            out[f"z_max[{code}]"] = max(z(r[2]) for r in rows)
            out[f"z_mean[{code}]"] = sum(r[0] * z(r[3]) for r in rows) / sum(r[0] for r in rows)
            out[f"z_last[{code}]"] = z(rows[-1][4])
    adm = ex[spec.ADMISSION_TYPE]
    out["age_years/90"] = ex[spec.AGE_YEARS] / spec.AGE_CAP_YEARS
    out.update({f"gender={g}": float(ex[spec.GENDER] == g) for g in spec.GENDERS})
    out.update({f"admission_type={t}": float(adm == t) for t in inputs.ADMISSION_TYPES})
    out["admission_type=other"] = float(adm not in inputs.ADMISSION_TYPES)
    return out  # columns not named here are 0


@pytest.mark.parametrize("window_hours", [48.0, 12.0])
def test_aggregates_match_a_per_token_loop(data, window_hours):
    files = data_folder.load_data_files(data)
    features = baselines.read_features(files, "test", window_hours=window_hours)  # codes outside the vocabulary
    records = data_folder.read_split(files, "test").records
    names = inputs.Featurizer.from_data_files(files, window_hours).window_aggregate_names()
    assert features.x.shape == (len(records), len(names))
    expected = np.array([[naive.get(name, 0.0) for name in names] for naive in
                         (_naive_features(seqex.sequence_example_to_dict(r), files, window_hours) for r in records)])
    np.testing.assert_allclose(features.x, expected, rtol=1e-5, atol=1e-5)
    window, history = (features.x[:, [i for i, n in enumerate(names) if n.startswith(side)]]
                       for side in ("window_log_count", "history_log_count"))
    assert history.sum() > 0 and window.sum() > 0  # both sides of the window are used


def test_logistic_baseline_is_scikit_learns_fit_at_the_validation_choice(data):
    result = baselines.fit_baseline(data, "logistic", seed=0)
    files = data_folder.load_data_files(data)
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
