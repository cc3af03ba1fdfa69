"""The seeded prediction function: one vectorised pass for the batch, per-example reproducibility."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import tf_parse
from model import data_folder
from model.export import predict as predict_module
from model.export.predict import Predictor, predict_probs, stateful_random_ops
from model.ehr import inputs
from model.ehr.config import ModelConfig
from model.ehr.ehr_model import build_model
from tests.support.ehr_testdata import write_data_dir


# Every test runs on both methods unless it checks the Predictor's threading, a wrapper layer or the
# noise keys' spelling of the records (the same records under both): those take no method-specific
# branch (the model is called the same way), so they run on rank-1 only (ONE_METHOD), saving a trace
# and a prediction pass of the fully Bayesian network each.
ONE_METHOD = pytest.mark.parametrize("setup", ["rank1"], indirect=True)


@pytest.fixture(scope="module", params=["rank1", "fully_bayesian"])
def setup(request, tmp_path_factory):
    data = write_data_dir(tmp_path_factory.mktemp(f"predict_{request.param}"),
                          sizes=(("train", 24), ("validation", 8), ("test", 16)), train_shards=1)
    files = data_folder.load_data_files(data)
    featurizer = inputs.Featurizer.from_data_files(files)
    k = 2 if request.param == "rank1" else 1
    config = ModelConfig(method=request.param, ensemble_size=k, embedding_dim=8, rnn_dim=8, hidden_layer_dim=8)
    model = build_model(config, featurizer.vocab_size)
    records = data_folder.read_split(files, "test").records
    return Predictor(featurizer, model), list(records), featurizer, model


def test_graph_is_stateless(setup):
    predictor, *_ = setup
    assert not stateful_random_ops(predictor.module.concrete().graph.as_graph_def())


def test_the_graph_parses_each_example_once(setup):
    # The noise keys and the featurizer read the same parsed batch: one parse op per request.
    predictor = setup[0]
    graph = predictor.module.concrete().graph.as_graph_def()
    nodes = list(graph.node) + [n for fn in graph.library.function for n in fn.node_def]
    assert sum(n.op.startswith("ParseSequenceExample") for n in nodes) == 1


def test_an_example_scores_the_same_alone_and_in_any_batch(setup):
    predictor, records, *_ = setup
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
    predictor, records, *_ = setup
    out = predict_probs(predictor, records[:3], 1, seed=0)
    assert out.shape == (3, predictor.ensemble_size)
    assert np.all((out >= 0) & (out <= 1))


def _in_threads(*calls):
    """Runs the calls in threads released together; returns their results in order."""
    start = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(i, call):
        start.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


@ONE_METHOD
def test_concurrent_threads_with_different_seeds_get_the_sequential_results(setup):
    predictor, records, featurizer, model = setup
    batch = records[:6]
    sequential = [predict_probs(predictor, batch, 3, seed=s) for s in (1, 2)]
    # A fresh predictor: both threads trace and then predict at the same time.
    fresh = Predictor(featurizer, model)
    concurrent = _in_threads(*[lambda s=s: [predict_probs(fresh, batch, 3, seed=s) for _ in range(2)] for s in (1, 2)])
    for outs, expected in zip(concurrent, sequential):
        for out in outs:
            np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


class _PausedTrace(tf.keras.Model):
    """The model, but its trace waits (up to 60 s) until `resume` is set."""

    def __init__(self, model, resume: threading.Event):
        super().__init__()
        self.model, self.resume = model, resume
        self.ensemble_size = model.ensemble_size

    def call(self, features, num_samples=1, matmul_dtype=None, noise=None):
        assert self.resume.wait(timeout=60), "another thread could not predict while this one was tracing"
        return self.model(features, num_samples=num_samples, matmul_dtype=matmul_dtype, noise=noise)


@ONE_METHOD
def test_a_thread_predicts_while_another_is_tracing(setup):
    """Nothing process-wide is held while a prediction graph is traced (the old sampler's lock was)."""
    predictor, records, featurizer, model = setup
    batch = records[:4]
    resume = threading.Event()

    def other_thread():
        out = predict_probs(Predictor(featurizer, model), batch, 2, seed=4)  # traces and runs meanwhile
        resume.set()
        return out

    paused, other = _in_threads(lambda: predict_probs(Predictor(featurizer, _PausedTrace(model, resume)), batch, 2,
                                                      seed=3), other_thread)
    np.testing.assert_allclose(paused, predict_probs(predictor, batch, 2, seed=3), rtol=0, atol=1e-6)
    np.testing.assert_allclose(other, predict_probs(predictor, batch, 2, seed=4), rtol=0, atol=1e-6)


class _StatefulLayer(tf.keras.Model):
    """The model plus noise drawn with tf.random.normal, ignoring the explicit source."""

    def __init__(self, model):
        super().__init__()
        self.model, self.ensemble_size = model, model.ensemble_size

    def call(self, features, num_samples=1, matmul_dtype=None, noise=None):
        logits = self.model(features, num_samples=num_samples, matmul_dtype=matmul_dtype, noise=noise)
        return logits + tf.random.normal(tf.shape(logits))


@ONE_METHOD
def test_a_layer_drawing_statefully_fails_at_trace_time(setup):
    _, records, featurizer, model = setup
    with pytest.raises(RuntimeError, match="RandomStandardNormal"):
        predict_probs(Predictor(featurizer, _StatefulLayer(model)), records[:2], 2, seed=0)


def _reduce_join_content(parsed: dict) -> tf.Tensor:
    """The noise keys' content strings as first written, with ragged reduce_join: the draws depend on every byte."""
    columns = []
    for name in predict_module._KEY_FEATURES:
        value = parsed[name]
        if isinstance(value, tf.RaggedTensor):
            flat = value.merge_dims(1, -1) if value.ragged_rank > 1 else value
            text = flat if flat.dtype == tf.string else tf.strings.as_string(flat)
            columns.append(tf.strings.reduce_join(text, axis=1, separator=","))
            if value.ragged_rank > 1:
                columns.append(tf.strings.reduce_join(tf.strings.as_string(value.row_lengths(axis=2)), axis=1,
                                                      separator=","))
        else:
            columns.append(value if value.dtype == tf.string else tf.strings.as_string(value))
    return tf.strings.join(columns, separator="|")


@ONE_METHOD
def test_the_noise_keys_spell_each_example_as_ragged_reduce_join_did(setup):
    # The content strings feed the fingerprint every draw is keyed by: one byte off and every answer moves.
    records = tf.constant(setup[1])
    parsed = tf_parse.parse_sequence_examples(records)
    np.testing.assert_array_equal(predict_module._content_strings(parsed).numpy(),
                                  _reduce_join_content(parsed).numpy())
    # Empty rows, an empty inner row and an empty batch join as reduce_join joins them.
    ragged = tf.ragged.constant([[["a", "b"], []], [], [["c"]], [[], []]])
    for value in (ragged, ragged[:0], ragged.merge_dims(1, -1)):
        joined = predict_module._join_rows(value.flat_values, predict_module._flat_row_splits(value))
        expected = tf.strings.reduce_join(value.merge_dims(1, -1) if value.ragged_rank > 1 else value, axis=1,
                                          separator=",")
        np.testing.assert_array_equal(joined.numpy(), expected.numpy())
