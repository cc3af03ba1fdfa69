"""The export layout: files and checksums, and the SavedModel predicting exactly what the
in-memory model predicts for the same examples and seed."""
from __future__ import annotations

import json
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf

from ehr_pipeline.contract import spec, tfrecord
from ehr_pipeline.encode import seqex
from model import data_folder
from model.export.load import ExportError, ReferralPolicy, load_export, write_manifest
from model.export_layout import BFLOAT16_MEAN_TOLERANCE, BFLOAT16_SAMPLE_TOLERANCE
from model.export.predict import Predictor, predict_probs
from model.ehr.config import parse_config
from model.ehr.inputs import TIME_INPUTS
from model.ehr.train import load_run, train
from tests.support.ehr_testdata import read_json, tiny_config_dict

REQUIRED = {"saved_model/saved_model.pb", "model_card.json", "pipeline_config.json", "vocabulary.json",
            "numeric_stats.json", "metrics.json"}


@pytest.fixture(scope="module")
def trained(trained_rank1):
    return trained_rank1


@pytest.fixture(scope="module")
def restored(trained):
    """load_run of the trained run, once for the module: (config, model, featurizer, step); read-only."""
    return load_run(trained["run"], trained["data"])


def test_export_holds_the_contract_files(trained, rank1_export):
    export, data = trained["export"], trained["data"]
    manifest = read_json(export / "manifest.json")
    assert manifest["format_version"] == 1 and REQUIRED <= set(manifest["files"])
    card = read_json(export / "model_card.json")
    assert (card["method"], card["ensemble_size"], card["name"]) == ("rank1_normal", 2, "tiny_rank1")
    for key in ("version", "created", "data_manifest_sha256", "intended_use", "limitations", "metrics_summary"):
        assert card[key]
    metrics = read_json(export / "metrics.json")
    assert {"ece", "nll", "auc_pr", "auc_roc", "brier"} <= set(metrics["test"])
    assert metrics["decision_threshold"] == 0.5
    referral = metrics["referral"]
    # The default: the measure whose referral keeps the lowest Brier score on validation, recorded with the comparison.
    chosen = referral["chosen_on_validation"]
    assert (referral["measure"], referral["rate"]) == (min(chosen["aurc"], key=chosen["aurc"].get), 0.1)
    assert "configured" not in chosen and chosen["loss"] == "Brier score of the kept cases"
    # The threshold is the validation split's: it refers ~10 % of the validation cases.
    validation = read_json(trained["run"] / "eval" / "validation" / "metrics.json")
    assert validation["referral"]["threshold"] == referral["threshold"]
    assert 0.0 < validation["referral"]["referred_fraction"] <= 0.1
    assert read_json(export / "pipeline_config.json") == read_json(data / "manifest.json")["config"]
    for name in ("vocabulary.json", "numeric_stats.json"):
        assert (export / name).read_bytes() == (data / name).read_bytes()
    # The training split's admission types, counted independently from its records.
    counted: dict[str, int] = {}
    for path in sorted(data.glob(spec.split_file_pattern("train"))):
        with open(path, "rb") as f:
            for record in tfrecord.read_records(f):
                kind = seqex.sequence_example_to_dict(record)[spec.ADMISSION_TYPE]
                counted[kind] = counted.get(kind, 0) + 1
    assert read_json(export / "admission_types.json") == {"split": "train", "counts": counted}
    assert sum(counted.values()) == trained["n_train"] and rank1_export.files.admission_types == counted


def test_bad_admission_types_file_is_named(trained, tmp_path):
    from model.export.load import read_export

    copy = tmp_path / "export"
    shutil.copytree(trained["export"], copy)
    (copy / "admission_types.json").write_text('{"counts": {"EMERGENCY": -1}}')
    with pytest.raises(ExportError, match=r"admission_types\.json: expected"):
        read_export(copy)


def test_export_predicts_exactly_what_the_in_memory_model_predicts(trained, rank1_export, restored):
    config, model, featurizer, step = restored
    assert step == trained["best"]["step"]  # the export holds the best validated checkpoint
    records = data_folder.read_split(data_folder.load_data_files(trained["data"]), "test").records
    in_memory = predict_probs(Predictor(featurizer, model), records, 5, seed=123)
    exported = rank1_export
    from_export = predict_probs(exported, records, 5, seed=123, batch_size=7)
    assert from_export.shape == (len(records), 5 * config.model.ensemble_size)
    np.testing.assert_allclose(from_export, in_memory, rtol=0, atol=1e-6)
    # One example alone (as the service may send it) gets the same noise as in a batch; only
    # float rounding of the larger batched matmuls may differ.
    np.testing.assert_allclose(predict_probs(exported, records[3:4], 5, seed=123), from_export[3:4],
                               rtol=0, atol=1e-6)
    assert np.abs(predict_probs(exported, records, 5, seed=124) - from_export).max() > 1e-5


# The two kinds of wide part take different branches of the model factory and of training (a penalized
# point kernel; the Laplace logistic regression), so each gets its run. The L1 run also reads every time
# input: the time inputs are the featurizer's alone (no method- or wide-specific branch), so one training
# serves test_a_run_with_every_time_input_records_them_and_exports_what_it_trained too.
WIDE_RUNS = {"wide_l1": {"wide_l1": 1e-3, "time_inputs": list(TIME_INPUTS)},
             "wide_laplace": {"wide_posterior": "laplace"}}


@pytest.fixture(scope="module", params=sorted(WIDE_RUNS))
def wide_run(request, tmp_path_factory, synthetic_data):
    """A 10-step rank-1 run of synthetic_data with a 24-hour wide part (WIDE_RUNS), trained once for the module:
    its run folder; read-only."""
    # No validation inside the loop: at step 10 of the 20-step KL warm-up it keeps no best checkpoint, so the
    # export holds the last step's weights either way (and load_run restores the newest checkpoint).
    config = parse_config(tiny_config_dict("rank1", steps=10, eval_every_steps=0))
    config = config.with_overrides(model={"wide": True, "wide_window_hours": 24.0, **WIDE_RUNS[request.param]})
    out = tmp_path_factory.mktemp(request.param) / "run"
    result = train(config, synthetic_data, out, progress=False)
    assert result.export_dir == out / "export"
    return out


@pytest.fixture(scope="module")
def wide_loaded(wide_run, synthetic_data):
    """The wide run restored (load_run) with its Predictor, its export loaded and the test records, once per run
    for the module's tests; a test that changes the model's weights puts them back."""
    _, model, featurizer, _ = load_run(wide_run, synthetic_data)
    records = data_folder.read_split(data_folder.load_data_files(synthetic_data), "test").records
    # Its traced graph reads the variables at each call: one trace serves both tests, whatever they assign.
    return types.SimpleNamespace(model=model, featurizer=featurizer, predictor=Predictor(featurizer, model),
                                 export=load_export(wide_run / "export"), records=records)


def test_a_wide_run_exports_its_window_aggregates(wide_loaded):
    model, predictor, records = wide_loaded.model, wide_loaded.predictor, wide_loaded.records
    assert wide_loaded.featurizer.window_hours == 24.0
    in_memory = predict_probs(predictor, records, 3, seed=7)
    np.testing.assert_allclose(predict_probs(wide_loaded.export, records, 3, seed=7), in_memory, rtol=0, atol=1e-6)
    trained = [weight.numpy() for weight in model.wide.weights]
    try:
        for weight in model.wide.weights:  # the export would predict otherwise without the wide part
            weight.assign(tf.zeros_like(weight))
        assert np.abs(predict_probs(predictor, records, 3, seed=7) - in_memory).max() > 1e-4
    finally:
        for weight, value in zip(model.wide.weights, trained):
            weight.assign(value)


def test_bfloat16_signature_draws_the_same_noise_and_stays_within_tolerance(trained, rank1_export, restored):
    config, model, featurizer, _ = restored
    records = data_folder.read_split(data_folder.load_data_files(trained["data"]), "test").records
    exact = predict_probs(rank1_export, records, 5, seed=123)
    low = predict_probs(load_export(trained["export"], "bfloat16"), records, 5, seed=123)
    switched = rank1_export.with_precision("bfloat16")  # what ehr-serve --precision auto does
    np.testing.assert_array_equal(predict_probs(switched, records, 5, seed=123), low)
    diff = np.abs(low - exact)
    assert 0 < diff.max() <= BFLOAT16_SAMPLE_TOLERANCE
    assert np.abs(low.mean(axis=1) - exact.mean(axis=1)).max() <= BFLOAT16_MEAN_TOLERANCE
    # Same noise: a different seed moves the probabilities far more than the precision does.
    assert np.abs(predict_probs(rank1_export, records, 5, seed=124) - exact).max() > 10 * diff.max()
    in_memory = predict_probs(Predictor(featurizer, model, precision="bfloat16"), records, 5, seed=123)
    np.testing.assert_allclose(low, in_memory, rtol=0, atol=1e-6)
    card = read_json(trained["export"] / "model_card.json")
    assert card["signature"]["precisions"] == {"float32": "serving_default", "bfloat16": "serving_bfloat16"}
    with pytest.raises(ValueError, match="precision"):
        load_export(trained["export"], "float16")


@pytest.mark.parametrize("damage, name", [
    (lambda d: (d / "vocabulary.json").write_text('{"sources": {}}'), "vocabulary.json"),
    (lambda d: (d / "metrics.json").unlink(), "metrics.json"),
    (lambda d: (d / "saved_model" / "saved_model.pb").write_bytes(b"x"), "saved_model/saved_model.pb"),
    (lambda d: (d / "notes.txt").write_text("?"), "notes.txt"),
    (lambda d: (d / "manifest.json").unlink(), "manifest.json"),
])
def test_altered_or_missing_files_are_named(trained, tmp_path, damage, name):
    copy = tmp_path / "export"
    shutil.copytree(trained["export"], copy)
    damage(copy)
    with pytest.raises(ExportError, match=name.replace(".", r"\.")):
        load_export(copy)


def test_unknown_format_version_is_refused(trained, tmp_path):
    copy = tmp_path / "export"
    shutil.copytree(trained["export"], copy)
    manifest = read_json(copy / "manifest.json")
    manifest["format_version"] = 2
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="format_version"):
        load_export(copy)


def test_range_warnings_need_a_training_distribution(tmp_path):
    """Codes with fewer than RANGE_MIN_VALUES training values get no range check (the demo has codes with 3)."""
    from model.export import load as export

    stats, clip_z = export._value_stats({"clip_z": 10.0, "codes": {
        "lab:1": {"mean": 1.0, "std": 0.1, "n": 3}, "lab:2": {"mean": 2.0, "std": 0.2, "n": export.RANGE_MIN_VALUES},
        "lab:3": {"mean": 3.0, "std": 0.3}}}, tmp_path / "numeric_stats.json")
    assert clip_z == 10.0 and stats == {"lab:2": (2.0, 0.2), "lab:3": (3.0, 0.3)}


def test_the_referral_policy_says_how_its_measure_was_chosen():
    base = {"measure": "predictive_entropy", "rate": 0.1, "threshold": 0.5}
    old = ReferralPolicy.model_validate(base).describe()
    assert "predates the choice on validation" in old
    chosen = {"loss": "Brier score of the kept cases", "aurc": {"mutual_information": 0.06, "predictive_entropy": 0.05}}
    line = ReferralPolicy.model_validate({**base, "chosen_on_validation": chosen}).describe()
    assert "chosen on validation" in line and line.index("predictive_entropy 0.0500") < line.index("mutual_information")
    override = ReferralPolicy.model_validate({**base, "chosen_on_validation": {**chosen, "configured": True}})
    assert "explicit override" in override.describe()


def _with_previous_discharge(record: bytes, seconds: int | None) -> bytes:
    """The record with spec.PREVIOUS_DISCHARGE set to seconds, or without it (as schema 3 wrote records)."""
    proto = tf.train.SequenceExample.FromString(record)
    feature = proto.context.feature
    if seconds is None:
        del feature[spec.PREVIOUS_DISCHARGE]
    else:
        feature[spec.PREVIOUS_DISCHARGE].int64_list.value[:] = [seconds]
    return proto.SerializeToString()


def test_an_export_that_records_no_time_inputs_answers_as_before(trained, rank1_export, tmp_path):
    """An export made before the time inputs has no "time_inputs" in its card: it reads none, and the
    previous discharge a newer record carries (or a schema-3 record's lack of it) changes nothing."""
    assert read_json(trained["export"] / "model_card.json")["time_inputs"] == []
    old = tmp_path / "old_export"
    shutil.copytree(trained["export"], old)
    card = read_json(old / "model_card.json")
    del card["time_inputs"]
    (old / "model_card.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_manifest(old)
    before = load_export(old)
    assert before.files.time_inputs == () and before.files.card.time_inputs is None
    records = data_folder.read_split(data_folder.load_data_files(trained["data"]), "test").records[:8]
    admit = [seqex.sequence_example_to_dict(r)[spec.ADMIT_OFFSET] for r in records]
    answers = [predict_probs(before, variant, 3, seed=11) for variant in (
        records, [_with_previous_discharge(r, None) for r in records],
        [_with_previous_discharge(r, a + 30 * 86400) for r, a in zip(records, admit)])]
    for other in answers[1:]:
        np.testing.assert_array_equal(other, answers[0])
    np.testing.assert_array_equal(answers[0], predict_probs(rank1_export, records, 3, seed=11))


@pytest.mark.parametrize("wide_run", ["wide_l1"], indirect=True)  # the run that reads every time input
def test_a_run_with_every_time_input_records_them_and_exports_what_it_trained(wide_loaded):
    assert wide_loaded.featurizer.time_inputs == TIME_INPUTS
    exported, records = wide_loaded.export, wide_loaded.records
    assert exported.files.time_inputs == TIME_INPUTS
    in_memory = predict_probs(wide_loaded.predictor, records, 2, seed=7)
    np.testing.assert_allclose(predict_probs(exported, records, 2, seed=7), in_memory, rtol=0, atol=1e-6)
    # It reads the previous discharge: the same admissions said to follow a discharge 3 days ago answer otherwise.
    moved = [_with_previous_discharge(r, seqex.sequence_example_to_dict(r)[spec.ADMIT_OFFSET] + 3 * 86400)
             for r in records]
    assert np.abs(predict_probs(exported, moved, 2, seed=7) - in_memory).max() > 1e-6
