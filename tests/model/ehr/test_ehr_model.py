"""The EHR model's inputs, forward layout, loss terms and seeded prediction, on real TFRecords."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import PipelineConfig, spec, tf_parse
from ehr_pipeline.encode import bagging, seqex
from model import data_folder
from model.evaluation.statistics import metrics
from model.export.predict import Predictor, predict_probs, stateful_random_ops
from model.layers import factory
from model.layers.noise import Noise
from model.ehr import train as train_module
from model.fit import losses
from model.ehr import inputs
from model.ehr.config import parse_config
from model.ehr.ehr_model import bag_vector_dim, build_model
from model.fit.training_loop import fast_weight_refs
from tests.support.ehr_testdata import tiny_config_dict, write_data_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = write_data_dir(tmp_path_factory.mktemp("ehr_model_data"), sizes=(("train", 40), ("validation", 8),
                                                                            ("test", 12)))
    files = data_folder.load_data_files(path)
    featurizer = inputs.Featurizer.from_data_files(files)
    split_records = data_folder.read_split(files, "test")
    records, labels = split_records.records, split_records.labels
    return files, featurizer, records, np.asarray(labels)


def _features(featurizer, records):
    return featurizer(tf_parse.parse_sequence_examples(tf.constant(records)))


def _model(featurizer, method, **model):
    cfg = tiny_config_dict(method)
    cfg["model"].update(model)
    return build_model(parse_config(cfg).model, featurizer.vocab_size)


def _example(codes, values, trigger=1_000_000, age=70.0, gender="F", adm="URGENT"):
    times = np.full(len(codes), trigger - 3600, np.int64)
    bags = bagging.bag_events(times, np.asarray(codes, dtype=object), np.asarray(values, float), trigger,
                              PipelineConfig().bagging)
    context = {spec.SUBJECT_ID: 1, spec.HADM_ID: 2, spec.LABEL: 0, spec.TRIGGER_TIME: trigger,
               spec.ADMIT_OFFSET: 86400, spec.AGE_YEARS: age, spec.GENDER: gender, spec.ADMISSION_TYPE: adm,
               spec.ETHNICITY: "WHITE", spec.INSURANCE: "Medicare"}
    return seqex.make_sequence_example(context, bags).SerializeToString()


def test_featurizer_looks_up_codes_zscores_values_and_encodes_context():
    vocab = {"lab": ["lab:50813"], "chart": ["chart:211"]}
    stats = {"lab:50813": {"mean": 1.5, "std": 0.5, "n": 10}}
    fz = inputs.Featurizer(vocab, stats, clip_z=3.0)
    record = _example(["lab:50813", "lab:50813", "lab:77777", "chart:211", "chart:211"],
                      [2.5, 99.0, 4.0, np.nan, np.nan])
    feats = _features(fz, [record])
    ids = feats["code_ids"].flat_values.numpy()  # one bag; codes sorted: chart:211, lab:50813, lab:77777
    codes = seqex.sequence_example_to_dict(record)[spec.BAG_CODES][0]
    assert codes == ["chart:211", "lab:50813", "lab:77777"]
    # Sorted sources give chart the first vocabulary id; an unknown lab gets the lab OOV id.
    assert ids.tolist() == [fz.num_oov, fz.num_oov + 1, spec.SOURCES.index("lab")]
    assert fz.code_ids(tf.constant(["weird:1", "prescription:X"])).numpy().tolist() == [
        len(spec.SOURCES), spec.SOURCES.index("prescription")]
    values = feats["code_values"].flat_values.numpy()
    # lactate: mean (2.5 + 99) / 2 -> z = 97.25 clipped to 3; last = 99 (same time: input order) -> 3;
    # min 2.5 -> z = 2; max 99 -> clipped to 3.
    np.testing.assert_allclose(values[1], [3.0, 3.0, 2.0, 3.0, 1.0, math.log(3.0)], rtol=1e-6)
    # chart:211 has no value; lab:77777 has a value but no statistics: z = 0, has_value kept.
    np.testing.assert_allclose(values[0], [0.0, 0.0, 0.0, 0.0, 0.0, math.log(3.0)], rtol=1e-6)
    np.testing.assert_allclose(values[2], [0.0, 0.0, 0.0, 0.0, 1.0, math.log(2.0)], rtol=1e-6)
    bag = feats["bag_features"].flat_values.numpy()[0]
    # One hour before the trigger, inside the admission (admit_offset 1 day); 2 chart and 3 lab events.
    per_source = np.zeros(len(spec.SOURCES))
    per_source[spec.SOURCES.index("chart")] = math.log1p(2.0) / 10
    per_source[spec.SOURCES.index("lab")] = math.log1p(3.0) / 10
    np.testing.assert_allclose(bag, [math.log1p(1.0) / 10, math.log1p(3.0) / 10, 1.0, *per_source], rtol=1e-6)
    context = feats["context"].numpy()[0]
    expected_context = np.zeros(inputs.CONTEXT_DIM)
    expected_context[0] = 70.0 / 90.0
    expected_context[1 + spec.GENDERS.index("F")] = 1.0
    expected_context[1 + len(spec.GENDERS) + inputs.ADMISSION_TYPES.index("URGENT")] = 1.0
    np.testing.assert_allclose(context, expected_context, rtol=1e-6)


def test_data_files_take_clip_z_from_the_pipeline_config(tmp_path):
    path = write_data_dir(tmp_path, sizes=(("train", 6), ("validation", 2), ("test", 2)))
    assert data_folder.load_data_files(path).clip_z == PipelineConfig().numeric.clip_z
    (path / "vocabulary.json").unlink()
    with pytest.raises(FileNotFoundError, match="vocabulary.json"):
        data_folder.load_data_files(path)


def test_output_is_sample_major_with_one_column_per_member(data):
    _, fz, records, _ = data
    feats = _features(fz, records)
    model = _model(fz, "batchensemble")  # point-mass members: every sample of member k is identical
    one = model(feats, num_samples=1).numpy()
    three = model(feats, num_samples=3).numpy()
    assert one.shape == (len(records), 2) and three.shape == (len(records), 6)
    for s in range(3):
        np.testing.assert_allclose(three[:, s * 2:(s + 1) * 2], one, rtol=1e-5, atol=1e-6)
    assert np.abs(one[:, 0] - one[:, 1]).max() > 1e-4  # the members are different networks


def test_an_admission_does_not_see_its_batch_neighbours(data):
    _, fz, records, _ = data
    model = _model(fz, "deterministic")
    together = model(_features(fz, records), num_samples=1).numpy()
    alone = np.concatenate([model(_features(fz, [r]), num_samples=1).numpy() for r in records[:4]])
    np.testing.assert_allclose(alone, together[:4], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["deterministic", "batchensemble"])
def test_training_and_inference_lstm_loops_compute_the_same_network(data, method):
    # Training runs keras' RNN, inference Rank1LSTM, over one cell: without factor noise
    # (plain and point-mass members) the two passes must agree exactly, padding included.
    _, fz, records, _ = data
    feats = _features(fz, records)
    model = _model(fz, method)
    assert model.fast_lstm.cell is model.lstm.cell
    np.testing.assert_allclose(model(feats, num_samples=2, training=True).numpy(),
                               model(feats, num_samples=2).numpy(), rtol=1e-5, atol=1e-6)


def test_training_and_inference_lstm_loops_sample_the_same_posterior(data):
    # With rank-1 noise the two loops draw differently; per admission and member the S
    # logits must still follow one distribution (means within 5 standard errors, equal spread).
    _, fz, records, _ = data
    feats = _features(fz, records)
    model = _model(fz, "rank1", dropout_rate=0.05)
    s, k = 400, model.ensemble_size
    train = model(feats, num_samples=s, training=True).numpy().reshape(len(records), s, k)
    infer = model(feats, num_samples=s).numpy().reshape(len(records), s, k)
    error = np.sqrt((train.var(axis=1) + infer.var(axis=1)) / s)
    assert np.all(np.abs(train.mean(axis=1) - infer.mean(axis=1)) <= 5 * error + 1e-6)
    assert np.all(train.std(axis=1) > 1e-3)  # the factors really are sampled
    np.testing.assert_allclose(infer.std(axis=1), train.std(axis=1), rtol=0.25)


def test_zero_bag_admissions_are_predicted():
    fz = inputs.Featurizer({"lab": ["lab:1"]}, {})
    record = _example([], [])
    model = _model(fz, "rank1")
    out = model(_features(fz, [record, record]), num_samples=2).numpy()
    assert out.shape == (2, 4) and np.all(np.isfinite(out))


def test_kl_collects_every_stochastic_part_and_nothing_else(data):
    _, fz, _, _ = data
    assert float(losses.kl_divergence(_model(fz, "deterministic"))) == 0.0
    assert float(losses.kl_divergence(_model(fz, "batchensemble"))) == 0.0
    emb_only = _model(fz, "bayesian_embeddings")
    np.testing.assert_allclose(float(losses.kl_divergence(emb_only)), float(emb_only.embedding.kl_divergence()),
                               rtol=1e-6)
    r1 = _model(fz, "rank1")
    np.testing.assert_allclose(float(losses.kl_divergence(r1)), float(factory.kl_loss(r1)), rtol=1e-6)
    assert float(factory.kl_loss(r1)) > float(r1.embedding.kl_divergence()) > 0  # factors + embeddings
    mf = _model(fz, "fully_bayesian")
    # The mean-field weights' KL comes on top of the embeddings' (edward2 keeps it in layer.losses).
    assert float(losses.kl_divergence(mf)) > float(mf.embedding.kl_divergence()) + 1.0


def test_kl_weight_is_annealed_and_divided_by_n_train():
    w = [float(losses.kl_weight(s, kl_scale=2.0, annealing_steps=10, num_train_examples=500)) for s in (0, 4, 9, 50)]
    np.testing.assert_allclose(w, [2.0 * 0.1 / 500, 2.0 * 0.5 / 500, 2.0 / 500, 2.0 / 500], rtol=1e-6)
    assert float(losses.kl_weight(0, kl_scale=1.0, annealing_steps=0, num_train_examples=4)) == 0.25
    with pytest.raises(ValueError):
        losses.kl_weight(0, kl_scale=1.0, annealing_steps=1, num_train_examples=0)


def test_losses_match_the_metrics_module():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(20, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=20)
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    np.testing.assert_allclose(float(losses.nll_loss(logits, y, "average")), metrics.per_component_nll(probs, y),
                               rtol=1e-5)
    np.testing.assert_allclose(float(losses.nll_loss(logits, y, "mixture")), metrics.mixture_nll(probs, y), rtol=1e-5)
    assert float(losses.nll_loss(logits, y, "mixture")) <= float(losses.nll_loss(logits, y, "average"))
    with pytest.raises(ValueError, match="average"):
        losses.nll_loss(logits, y, "sum")


def test_fast_weights_are_exactly_the_rank1_factors(data):
    _, fz, _, _ = data
    model = _model(fz, "rank1")
    refs = fast_weight_refs(model)
    fast = sorted(v.name for v in model.trainable_variables if v.ref() in refs)
    assert fast and all(("alpha" in n or "gamma" in n) for n in fast)
    assert not any(v.ref() in refs for v in model.trainable_variables
                   if "kernel" in v.name or "bias" in v.name or "embedding" in v.name)


def test_seeded_prediction_is_reproducible_and_independent_of_the_batch(data):
    _, fz, records, _ = data
    predictor = Predictor(fz, _model(fz, "rank1"))
    a = predict_probs(predictor, records, 4, seed=7, batch_size=5)
    b = predict_probs(predictor, records[::-1], 4, seed=7, batch_size=len(records))[::-1]
    c = predict_probs(predictor, records, 4, seed=8)
    assert a.shape == (len(records), 8)
    # Same example + seed -> same noise, whatever the batch; batched matmuls may round differently.
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert np.abs(a - c).max() > 1e-4  # another seed draws other samples
    assert np.abs(a[:, 0] - a[:, 2]).max() > 1e-5  # samples s=0 and s=1 of member 0 differ
    assert not stateful_random_ops(predictor.module.concrete().graph.as_graph_def())
    with pytest.raises(ValueError, match="num_samples"):
        predict_probs(predictor, records, 0, seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_samples"):
        predictor(tf.constant(records[:1]), 101, 0)


@pytest.mark.parametrize("pooling, heads", [("mean", 1), ("sum", 1), ("max", 1), ("mean_max", 1), ("attention", 1),
                                            ("attention", 3)])
def test_bag_pooling_matches_a_per_bag_computation(data, pooling, heads):
    _, featurizer, _, _ = data
    model = _model(featurizer, "deterministic", pooling=pooling, attention_heads=heads)
    rng = np.random.default_rng(0)
    tokens = np.tanh(rng.normal(size=(9, 16))).astype(np.float32)
    segments = np.array([0, 0, 0, 2, 2, 3, 3, 3, 3], np.int32)  # bag 1 is empty
    pooled = model._pool(tf.constant(tokens), tf.constant(segments), 4).numpy()
    for bag in range(4):
        members = tokens[segments == bag]
        if not len(members):
            np.testing.assert_array_equal(pooled[bag], 0.0)
            continue
        if pooling == "attention":
            expected = []
            for head in range(heads):
                scores = members @ model.attention.kernel.numpy()[:, head]
                w = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
                expected.append(w @ members)
            expected = np.concatenate(expected)
        else:
            expected = {"mean": members.mean(0), "sum": members.sum(0), "max": members.max(0),
                        "mean_max": np.concatenate([members.mean(0), members.max(0)])}[pooling]
        np.testing.assert_allclose(pooled[bag], expected, rtol=1e-5, atol=1e-6)
    assert pooled.shape[1] + inputs.NUM_BAG_FEATURES == bag_vector_dim(model.config)


def test_featurizer_gives_extremes_and_the_admission_window(data):
    _, featurizer, _, _ = data
    trigger = 1_000_000
    times = np.array([trigger - 3600, trigger - 7200, trigger - 3 * 86400], np.int64)
    bags = bagging.bag_events(times, np.array(["lab:50813"] * 3, dtype=object), np.array([1.0, 5.0, 2.0]),
                              trigger, PipelineConfig().bagging)
    context = {spec.SUBJECT_ID: 1, spec.HADM_ID: 2, spec.LABEL: 0, spec.TRIGGER_TIME: trigger,
               spec.ADMIT_OFFSET: 86400, spec.AGE_YEARS: 60.0, spec.GENDER: "M", spec.ADMISSION_TYPE: "URGENT",
               spec.ETHNICITY: spec.NOT_RECORDED, spec.INSURANCE: spec.NOT_RECORDED}
    feats = _features(featurizer, [seqex.make_sequence_example(context, bags).SerializeToString()])
    values = feats["code_values"].flat_values.numpy()  # [2 tokens, NUM_VALUE_FEATURES], oldest bag first
    newest = values[1]
    z_mean, z_last, z_min, z_max = newest[:4]
    assert z_min < z_mean < z_max and z_last == pytest.approx(z_min)  # 1.0 is the newest, 5.0 the largest
    assert feats["bag_features"].flat_values.numpy()[:, 2].tolist() == [0.0, 1.0]  # history, then admission


def test_only_a_featurizer_with_a_window_writes_window_aggregates(data):
    files, plain, records, _ = data
    parsed = tf_parse.parse_sequence_examples(tf.constant(records))
    assert "window_aggregates" not in plain(parsed)
    windowed = inputs.Featurizer.from_data_files(files, window_hours=48.0)(parsed)["window_aggregates"]
    assert windowed.shape == (len(records), inputs.Featurizer.from_data_files(files).window_aggregate_dim)


def _wide_model(featurizer, method, **model):
    cfg = tiny_config_dict(method)
    cfg["model"].update(wide=True, **model)
    return build_model(parse_config(cfg).model, featurizer.vocab_size, featurizer.window_aggregate_dim)


@pytest.mark.parametrize("method", ["deterministic", "batchensemble"])
def test_the_wide_part_adds_each_members_linear_logit(data, method):
    files, _, records, _ = data
    featurizer = inputs.Featurizer.from_data_files(files, window_hours=48.0)
    model = _wide_model(featurizer, method)
    feats = _features(featurizer, records)
    logits = model(feats, num_samples=1).numpy()  # [N, K]: no sampling in these methods
    x, kernel = feats["window_aggregates"].numpy(), model.wide.kernel.numpy()
    model.wide.kernel.assign(tf.zeros_like(model.wide.kernel))
    without = model(feats, num_samples=1).numpy()
    if method == "deterministic":
        want = x @ kernel
    else:  # member k: ((x * r_k) W) * s_k, computed one member at a time
        alpha, gamma = model.wide.alpha.numpy(), model.wide.gamma.numpy()
        want = np.stack([((x * alpha[k]) @ kernel)[:, 0] * gamma[k, 0] for k in range(model.ensemble_size)],
                        axis=1)
        assert np.abs(want[:, 0] - want[:, 1]).max() > 1e-4  # the members differ
    np.testing.assert_allclose(logits - without, want.reshape(logits.shape), rtol=0, atol=1e-4)


def test_wide_l1_replaces_l2_on_the_wide_kernel_only(data):
    files, _, _, _ = data
    featurizer = inputs.Featurizer.from_data_files(files, window_hours=48.0)
    model = _wide_model(featurizer, "rank1", wide_l1=0.01, l2=1e-3)
    others = [layer for layer in model.layers if layer is not model.wide]
    kernel = model.wide.kernel.numpy()
    want = float(factory.l2_loss(others)) + 0.01 * np.abs(kernel).sum()
    assert float(losses.l2_penalty(model)) == pytest.approx(want, rel=1e-5)
    assert float(factory.l2_loss(others)) > 0


def test_a_laplace_wide_part_starts_the_model_as_the_fitted_regression(data):
    files, _, records, _ = data
    featurizer = inputs.Featurizer.from_data_files(files, window_hours=48.0)
    model = _wide_model(featurizer, "rank1", wide_posterior="laplace")
    train_module.start_from_laplace_fit(model, files, featurizer, seed=0)
    assert not model.wide.trainable_weights
    feats = _features(featurizer, records)
    n, s, k = len(records), 3, model.ensemble_size
    noise = Noise.from_fingerprints(tf.range(n, dtype=tf.int64), tf.constant(5, tf.int64))
    logits = model(feats, num_samples=s, noise=noise).numpy()  # [N, S*K]
    # At the start the LSTM head adds exactly 0: every row is [1, x] . (mean + A eps), its own eps.
    x = np.c_[np.ones(n), feats["window_aggregates"].numpy()]
    eps = noise.fold_in("wide_logit").normal(k * s * n, [x.shape[1]]).numpy()  # rows: (k, s, i)
    rows = np.sum(np.tile(x, (k * s, 1)) * (model.wide.mean.numpy() + eps @ model.wide.scale.numpy().T), axis=1)
    want = rows.reshape(k, s, n).transpose(2, 1, 0).reshape(n, s * k)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)
    assert logits.std(axis=1).min() > 0  # the posterior spreads every case's samples
