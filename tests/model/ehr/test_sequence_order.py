"""Does the sequence model read the order of an admission's bags? Reversal on a temporal release.

The temporal truth (docs/synthetic.md) puts its signal in the order and timing of history bags.
A defect that loses order (bags shuffled, time dropped in encoding, a wrong mask) would leave
the trained LSTM's predictions unchanged when the bags of an admission are reversed; the
logistic baseline's window aggregates are sums, minima and maxima, so reversal leaves them
unchanged wherever the 48-h window holds one bag (its "newest value" is read by position, so
two window bags may swap it; those admissions are left out of that half of the check).
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import PipelineConfig, spec, tf_parse
from ehr_pipeline.job import run_job
from ehr_pipeline.synth import generate_release
from model.data_folder import load_data_files, read_split
from model.export.predict import ServingModule
from model.ehr.baselines import fit_baseline
from model.ehr.config import parse_config
from model.ehr.inputs import Featurizer
from model.ehr.train import load_run, train
from tests.support.ehr_testdata import tiny_config_dict

WINDOW_SECONDS = 48 * 3600.0  # the baselines' window (model.ehr.baselines' default)


def reverse_bags(parsed: dict) -> dict:
    """A parsed batch with each admission's bags in reverse order; each bag keeps its codes, values and offset.

    Ragged rows carry their own lengths, so no padding moves: bag j of a row of n bags becomes bag n-1-j.
    """
    codes = parsed[spec.BAG_CODES]  # ragged [B, (bags), (codes)]
    starts, ends = codes.row_splits[:-1], codes.row_splits[1:]
    rows = codes.value_rowids()
    bag_order = tf.gather(starts, rows) + tf.gather(ends, rows) - 1 - tf.range(codes.values.nrows())
    # Where each token of the reversed batch comes from: the tokens of the source bags, in their order.
    token_ids = codes.values.with_flat_values(tf.range(tf.size(codes.flat_values, out_type=tf.int64)))
    token_order = tf.gather(token_ids, bag_order).flat_values
    reversed_bags = tf.RaggedTensor.from_row_splits(tf.gather(codes.values, bag_order), codes.row_splits)
    out = dict(parsed)
    for key, value in parsed.items():
        if not isinstance(value, tf.RaggedTensor):
            continue
        if value.ragged_rank == 1:  # one value per bag
            out[key] = value.with_values(tf.gather(value.values, bag_order))
        else:  # one value per code of a bag: the shared partition keeps the features aligned
            out[key] = reversed_bags.with_flat_values(tf.gather(value.flat_values, token_order))
    return out


def test_reverse_bags_reverses_each_row_and_keeps_its_length():
    """Rows of 3, 1 and 2 bags: each row's bags come back in reverse, codes and offsets moving together."""
    codes = tf.ragged.constant([[[b"a", b"b"], [b"c"], [b"d", b"e", b"f"]], [[b"g"]], [[b"h"], [b"i", b"j"]]],
                               dtype=tf.string)
    offsets = tf.ragged.constant([[30.0, 20.0, 10.0], [5.0], [8.0, 1.0]])
    got = reverse_bags({spec.BAG_CODES: codes, spec.BAG_OFFSET: offsets, spec.NUM_BAGS: tf.constant([3, 1, 2])})
    assert got[spec.BAG_CODES].to_list() == [[[b"d", b"e", b"f"], [b"c"], [b"a", b"b"]], [[b"g"]],
                                             [[b"i", b"j"], [b"h"]]]
    assert got[spec.BAG_OFFSET].to_list() == [[10.0, 20.0, 30.0], [5.0], [1.0, 8.0]]
    assert reverse_bags(got)[spec.BAG_CODES].to_list() == codes.to_list()


@pytest.fixture(scope="module")
def temporal_run(tmp_path_factory):
    """A small temporal release through the Beam job, a short deterministic LSTM run and the logistic fit."""
    base = tmp_path_factory.mktemp("temporal")
    release, data, run = base / "release", base / "data", base / "run"
    generate_release(release, patients=600, seed=5, events_scale=0.2, truth="temporal", show_progress=False)
    # A large test split: the checks read test admissions, training needs only a few hundred.
    config = PipelineConfig.model_validate({"splits": {"train": 0.5, "validation": 0.1, "test": 0.4}})
    run_job(str(release), str(data), config, ["--runner=FnApiRunner"])
    # The checks read the run's checkpoint (load_run), never its test report or export: skip writing them.
    train(parse_config(tiny_config_dict("deterministic", steps=150)), data, run, progress=False, export_model=False)
    return {"data": data, "run": run}


def _test_batch(data) -> tuple[dict, dict]:
    records = read_split(load_data_files(data), "test").records
    parsed = tf_parse.parse_sequence_examples(tf.constant(records))
    return parsed, reverse_bags(parsed)


def _single_window_bag(parsed: dict) -> np.ndarray:
    """Admissions whose window holds at most one bag (window aggregates then cannot depend on bag order)."""
    in_window = tf.cast(parsed[spec.BAG_OFFSET] <= WINDOW_SECONDS, tf.int32)
    return (tf.reduce_sum(in_window, axis=1) <= 1).numpy()


@pytest.mark.slow
def test_logistic_baseline_ignores_bag_order(temporal_run):
    """Reversed bags give the logistic baseline the same window aggregates and probabilities."""
    data = temporal_run["data"]
    fitted = fit_baseline(data, "logistic", seed=0)
    featurizer = Featurizer.from_data_files(load_data_files(data), 48.0)
    parsed, reversed_ = _test_batch(data)
    same = _single_window_bag(parsed)
    assert same.sum() >= 30, f"only {same.sum()} test admissions with one window bag"
    x, x_rev = (featurizer(p)["window_aggregates"].numpy()[same] for p in (parsed, reversed_))
    np.testing.assert_array_equal(x_rev, x)
    np.testing.assert_array_equal(fitted.model.predict_proba(x_rev), fitted.model.predict_proba(x))


@pytest.mark.slow
def test_trained_lstm_reads_bag_order(temporal_run):
    """The trained LSTM's probabilities move when the bags are reversed, also where the aggregates cannot."""
    data, run = temporal_run["data"], temporal_run["run"]
    _, model, featurizer, _ = load_run(run, data)
    module = ServingModule(featurizer, [model])
    parsed, reversed_ = _test_batch(data)
    # A deterministic model draws nothing: no noise source.
    probs, probs_rev = (module.probs_batch(p, None, tf.constant(1)).numpy()[:, 0] for p in (parsed, reversed_))
    multi = parsed[spec.NUM_BAGS].numpy() >= 2
    same = _single_window_bag(parsed) & multi
    delta = np.abs(probs_rev - probs)
    print(f"mean |delta p| {delta[multi].mean():.4f} over {multi.sum()} admissions with >= 2 bags; "
          f"{delta[same].mean():.4f} over {same.sum()} with one window bag; mean p {probs.mean():.3f}")
    # One bag has no order: reversal must leave it exactly as it was (the check can fail).
    np.testing.assert_allclose(probs_rev[~multi], probs[~multi], rtol=0, atol=1e-6)
    assert delta[multi].mean() > 0.005
    assert delta[same].mean() > 0.002
