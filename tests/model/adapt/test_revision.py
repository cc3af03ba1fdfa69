"""Model revision: the logit layers run apart from the trunk draw and score what the whole network does."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import tf_parse
from model import data_folder
from model.adapt.local_data import LocalSample
from model.adapt.recalibration import fit_intercept_slope, logits_of
from model.adapt.revision import fit_revision, revision_variables
from model.export.predict import Predictor, example_noise, predict_probs
from model.ehr import inputs
from model.ehr.config import parse_config
from model.ehr.ehr_model import build_model
from tests.support.ehr_testdata import tiny_config_dict, write_data_dir

SAMPLES, SEED = 4, 7
# (method, model overrides): rank-1 factors (K = 2) under both kinds of wide part revision also moves.
VARIANTS = [("rank1", {"wide": True}), ("rank1", {"wide": True, "wide_posterior": "laplace"})]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    path = write_data_dir(tmp_path_factory.mktemp("revision_data"), sizes=(("train", 48), ("validation", 4),
                                                                           ("test", 4)))
    files = data_folder.load_data_files(path)
    split = data_folder.read_split(files, "train")
    return files, LocalSample(list(split.records), np.asarray(split.labels), np.asarray(split.hadm_ids))


def _network(files, method: str, overrides: dict):
    """(featurizer, model) of a variant, the featurizer built as training builds it."""
    cfg = tiny_config_dict(method)
    cfg["model"].update(overrides)
    config = parse_config(cfg).model
    featurizer = inputs.Featurizer.from_data_files(files, config.wide_window_hours if config.wide else None)
    return featurizer, build_model(config, featurizer.vocab_size,
                                   featurizer.window_aggregate_dim if config.wide else None)


def _log_likelihood(probs: np.ndarray, labels: np.ndarray) -> float:
    mean = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7).mean(axis=1)
    return float(np.sum(labels * np.log(mean) + (1 - labels) * np.log(1 - mean)))


@pytest.mark.parametrize("method, overrides", VARIANTS)
def test_the_head_on_the_trunk_is_the_whole_network(local, method, overrides):
    files, sample = local
    featurizer, model = _network(files, method, overrides)
    parsed = tf_parse.parse_sequence_examples(tf.constant(sample.records))
    noise = example_noise(parsed, tf.constant(SEED, tf.int64))
    features = featurizer(parsed)
    whole = model(features, num_samples=SAMPLES, noise=noise).numpy()
    apart = model.head(model.trunk(features, SAMPLES, noise=noise), noise=noise).numpy()
    np.testing.assert_array_equal(apart, whole)
    assert whole.shape == (sample.n, SAMPLES * model.ensemble_size)


def test_revision_reports_the_likelihood_of_the_weights_it_keeps(local):
    files, sample = local
    featurizer, model = _network(files, *VARIANTS[1])
    trained = model.get_weights()
    predictor = Predictor(featurizer, model)  # reads the variables: one trace before and after
    before = predict_probs(predictor, sample.records, SAMPLES, SEED)
    start = fit_intercept_slope(logits_of(before), sample.labels)
    at_start = fit_revision(featurizer, model, sample, start, samples=SAMPLES, seed=SEED, steps=0)
    # Zero steps: the weights sit at the recalibration, so the likelihood is the recalibration's on the same draws.
    assert at_start.log_likelihood == pytest.approx(start.log_likelihood, rel=1e-4)
    assert at_start.parameters == sum(int(np.prod(v.shape)) for v in revision_variables(model))

    model.set_weights(trained)  # revision starts from the network it is given
    revised = fit_revision(featurizer, model, sample, start, samples=SAMPLES, seed=SEED, steps=30)
    assert revised.log_likelihood > at_start.log_likelihood  # 30 Adam steps on a few dozen weights gain
    # The export's own seeded predictions with the kept weights score what revision reported.
    after = predict_probs(predictor, sample.records, SAMPLES, SEED)
    assert _log_likelihood(after, sample.labels) == pytest.approx(revised.log_likelihood, rel=1e-4)
