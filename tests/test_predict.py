"""The seeded prediction function: one vectorised pass for the batch, per-example reproducibility."""
from __future__ import annotations

import numpy as np
import pytest
from ehr_testdata import write_data_dir

from model import inputs
from model.config import ModelConfig
from model.ehr_model import build_model
from model.predict import Predictor, predict_probs, stateful_random_ops


@pytest.fixture(scope="module", params=["rank1", "fully_bayesian"])
def setup(request, tmp_path_factory):
    data = write_data_dir(tmp_path_factory.mktemp(f"predict_{request.param}"),
                          sizes=(("train", 24), ("validation", 8), ("test", 16)), train_shards=1)
    files = inputs.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    k = 2 if request.param == "rank1" else 1
    config = ModelConfig(method=request.param, ensemble_size=k, embedding_dim=8, rnn_dim=8, hidden_layer_dim=8)
    predictor = Predictor(featurizer, build_model(config, featurizer.vocab_size))
    records, _, _ = inputs.read_split(files, "test")
    return predictor, list(records)


def test_graph_is_stateless(setup):
    predictor, _ = setup
    assert not stateful_random_ops(predictor.module.concrete().graph.as_graph_def())


def test_the_graph_parses_each_example_once(setup):
    # The noise keys and the featurizer read the same parsed batch: one parse op per request.
    predictor, _ = setup
    graph = predictor.module.concrete().graph.as_graph_def()
    nodes = list(graph.node) + [n for fn in graph.library.function for n in fn.node_def]
    assert sum(n.op.startswith("ParseSequenceExample") for n in nodes) == 1


def test_an_example_scores_the_same_alone_and_in_any_batch(setup):
    predictor, records = setup
    # Eight different admissions (different numbers of bags and tokens), in two orders.
    batch = [r for r in records if r][:8]
    assert len(set(batch)) == 8
    together = predict_probs(predictor, batch, 5, seed=7)
    reordered = predict_probs(predictor, batch[::-1], 5, seed=7)[::-1]
    np.testing.assert_allclose(reordered, together, rtol=0, atol=1e-6)
    for i, record in enumerate(batch):
        alone = predict_probs(predictor, [record], 5, seed=7)
        np.testing.assert_allclose(alone[0], together[i], rtol=0, atol=1e-6)
    # A duplicate in the batch draws the same noise as its twin (the key is the content).
    dup = predict_probs(predictor, [batch[0], batch[1], batch[0]], 5, seed=7)
    np.testing.assert_allclose(dup[2], dup[0], rtol=0, atol=1e-6)
    # ... but the samples within one example, and other seeds, differ.
    assert np.ptp(together, axis=1).max() > 1e-6
    assert np.abs(predict_probs(predictor, batch, 5, seed=8) - together).max() > 1e-6


def test_fewer_samples_are_not_a_prefix_requirement_but_shapes_hold(setup):
    predictor, records = setup
    out = predict_probs(predictor, records[:3], 1, seed=0)
    assert out.shape == (3, predictor.ensemble_size)
    assert np.all((out >= 0) & (out <= 1))
