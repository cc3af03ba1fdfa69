"""Data nobody here wrote: meds-testing-helpers' static MEDS sample and a larger dataset from its generator,
with ACES labels, through run -> train -> eval -> serve; ehr-eval's MEDS predictions scored by meds-evaluation."""
from __future__ import annotations

import json
import pathlib

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from ehr_pipeline.contract import PipelineConfig, spec
from ehr_pipeline.job import run_meds_job
from ehr_pipeline.meds import code_map
from tests.support.job_outputs import read_examples

HERE = pathlib.Path(__file__).resolve().parent
# The sample's codes: ADMISSION//<type>, DISCHARGE, HR and TEMP (chart values), MEDS_BIRTH, static EYE_COLOR.
SAMPLE_CODES = {"admission": ["ADMISSION"], "discharge": ["DISCHARGE"], "died_discharge": [],
                "events": [{"prefix": "HR", "source": "chart"}, {"prefix": "TEMP", "source": "chart"}]}
CONFIG = {"num_shards": {"train": 1, "validation": 1, "test": 1}, "vocab": {"min_count": 1},
          "bagging": {"bagging_time_precision": 600}}


# The generator's codes: static//i (no time) and dynamic//i; births through its own Hydra config.
GENERATED_CODES = {"events": [{"prefix": "dynamic", "source": "chart"}]}
GENERATOR_BIRTHS = [
    "dataset_spec.data_generator.birth_codes_vocab_size=1", "dataset_spec.data_generator.frac_subjects_with_birth=1.0",
    "+dataset_spec.data_generator.birth_datetime_per_subject={_target_:meds_testing_helpers.dataset_generator."
    'DatetimeGenerator,X:["1950-01-01T00:00:00","1960-06-01T00:00:00","1970-03-01T00:00:00"],freq:[1,1,1]}',
    "+dataset_spec.data_generator.time_between_birth_and_data_per_subject={_target_:meds_testing_helpers."
    'dataset_generator.PositiveTimeDeltaGenerator,X:["1000000000s","1500000000s"],freq:[1,1]}']


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory):
    import subprocess
    import sys

    from tests.support.meds_data import aces_labels

    base = tmp_path_factory.mktemp("generated")
    tool = pathlib.Path(sys.executable).with_name("build_sample_MEDS_dataset")
    subprocess.run([str(tool), "seed=1", "N_subjects=400", f"output_dir={base / 'meds'}", *GENERATOR_BIRTHS],
                   check=True, capture_output=True, cwd=base)
    labels = aces_labels(base / "meds", HERE / "data" / "generated_task.yaml", base / "labels")
    manifest = run_meds_job(str(base / "meds"), str(base / "data"), PipelineConfig.model_validate(
        {**CONFIG, "bagging": {"bagging_time_precision": 365 * 86400}}), labels_dir=str(labels),
        codes=code_map.parse_meds_codes(GENERATED_CODES))
    return base, labels, manifest


def test_generated_dataset_with_aces_labels_every_label_row_is_an_example(generated_run):
    base, labels, manifest = generated_run
    rows = pq.read_table(labels).num_rows
    examples = read_examples(base / "data")
    assert manifest["balanced"] and manifest["labels"]["outcome"]["example"] == rows == len(examples) > 300
    assert {e["split"] for e in examples.values()} == {"train", "validation", "test"}
    # static//i rows have no time and no rule: counted, not events.
    assert manifest["tables"]["MEDS"]["extract"]["unmapped_code"] > 0
    labels_seen = {e[spec.LABEL] for e in examples.values() if e["split"] == "test"}
    assert labels_seen == {0, 1}


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    from meds_testing_helpers.dataset import MEDSDataset
    from meds_testing_helpers.static_sample_data import SIMPLE_STATIC_SHARDED_BY_SPLIT

    from tests.support.meds_data import aces_labels

    base = tmp_path_factory.mktemp("static_sample")
    MEDSDataset.from_yaml(SIMPLE_STATIC_SHARDED_BY_SPLIT).write(base / "meds")
    labels = aces_labels(base / "meds", HERE / "data" / "static_sample_task.yaml", base / "labels")
    codes = code_map.parse_meds_codes(SAMPLE_CODES)
    manifest = run_meds_job(str(base / "meds"), str(base / "data"), PipelineConfig.model_validate(CONFIG),
                            labels_dir=str(labels), codes=codes)
    return base, labels, manifest


def test_static_sample_with_aces_labels_becomes_one_example_per_label_row(sample_run):
    base, labels, manifest = sample_run
    table = pq.read_table(labels)
    examples = read_examples(base / "data")
    assert manifest["balanced"] and manifest["labels"]["outcome"]["example"] == table.num_rows == len(examples) > 10
    got = sorted((e[spec.SUBJECT_ID], e[spec.TRIGGER_TIME], e[spec.LABEL]) for e in examples.values())
    want = sorted((s, int(t.timestamp()) if t.tzinfo else int(t.replace(tzinfo=__import__("datetime").timezone.utc)
                   .timestamp()), int(v)) for s, t, v in zip(*(table.column(c).to_pylist() for c in
                                                              ("subject_id", "prediction_time", "boolean_value"))))
    assert got == want
    # The sample's own split file: subjects of held_out are the test split.
    split_of = {e[spec.SUBJECT_ID]: e["split"] for e in examples.values()}
    assert split_of[1500733] == "test" and split_of[754281] == "validation" and split_of[239684] == "train"
    # Events strictly before each prediction time: the HR read at the trigger itself is not used.
    for e in examples.values():
        assert all(off > 0 for off in e[spec.BAG_OFFSET])
    assert manifest["tables"]["MEDS"]["extract"]["unmapped_code"] > 0  # EYE_COLOR, HEIGHT: counted, not events


def _join_keys(table) -> set[tuple[int, int]]:
    """(subject_id, prediction_time in microseconds) of a label or prediction table."""
    times = table.column("prediction_time").cast(pa.timestamp("us")).cast(pa.int64())
    return set(zip(table.column("subject_id").to_pylist(), times.to_pylist()))


# One request per dataset, in its own MEDS codes (plus a code its map does not read as an event).
REQUESTS = {
    "sample_run": {"patient": {"gender": "F", "date_of_birth": "1986-07-20"},
                   "admission": {"admit_time": "2010-06-03T14:54:38", "admission_type": "ORTHOPEDIC"},
                   "prediction_time": "2010-06-03T16:00:00",
                   "events": [{"time": "2010-06-03T14:54:38", "code": "HR", "value": 91.4},
                              {"time": "2010-06-03T15:39:49", "code": "TEMP", "value": 100.3},
                              {"time": "2010-06-03T15:00:00", "code": "EYE_COLOR//BROWN"}]},
    "generated_run": {"patient": {"gender": "U", "date_of_birth": "1960-06-01"},
                      "admission": {"admit_time": "2020-01-01T00:00:00", "admission_type": "UNKNOWN"},
                      "prediction_time": "2020-01-01T00:00:00",
                      "events": [{"time": "2015-01-01T00:00:00", "code": "dynamic//3"},
                                 {"time": "2018-01-01T00:00:00", "code": "dynamic//6", "value": 0.4},
                                 {"time": "2019-01-01T00:00:00", "code": "static//1"}]},
}


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["sample_run", "generated_run"])
def test_trains_evaluates_and_serves_meds_codes(dataset, request, tmp_path):
    from tests.support.ehr_testdata import tiny_config_dict

    from model.evaluation.evaluate import MEDS_PREDICTIONS_FILE
    from model.evaluation.run_evaluation import EvaluationRequest, evaluate_exports
    from model.ehr.config import parse_config
    from model.ehr.train import train
    from serving.api.app import create_app
    from serving.inference.served_model import ServedModel
    from serving.settings import make_settings
    from tests.support.serving_fixtures import ThreadedServer

    base, labels, _ = request.getfixturevalue(dataset)
    config = parse_config(tiny_config_dict("rank1", steps=10, kl_scale=0.05, checkpoint_every_steps=10))
    train(config, base / "data", tmp_path / "run", progress=False)
    export = tmp_path / "run" / "export"
    assert (export / "meds_codes.json").is_file()
    report = evaluate_exports(EvaluationRequest(model_dirs=(export,), data_dir=base / "data", split="test",
                                                num_samples=3, n_bootstrap=20, out_dir=tmp_path / "eval")).report
    predictions = pq.read_table(tmp_path / "eval" / MEDS_PREDICTIONS_FILE)
    assert predictions.num_rows == report["n"] > 0
    # Every prediction joins its label row on (subject_id, prediction_time), to the microsecond.
    label_rows = pq.read_table(labels)
    assert _join_keys(predictions) <= _join_keys(label_rows)
    assert any(t % 1_000_000 for _, t in _join_keys(label_rows)) or dataset == "sample_run"  # sub-second times

    key = "test-key-meds-0123456789abcdef"
    body = REQUESTS[dataset]
    # max_batch 1: the warm-up compiles one pass per batch size up to it (docs/serving.md), and the requests
    # here come one at a time.
    settings = make_settings(api_keys=[key], model_dir=export, max_batch=1)
    with ThreadedServer(create_app(settings, ServedModel.load(export))) as srv:
        r = httpx.post(f"{srv.base_url}/v1/predict", json=body, headers={"X-API-Key": key}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["events"]["used"] == 2  # the two event codes; the third is no event
        assert any("not read as events" in w for w in out["warnings"])
        wrong = {**body, "events": [{**body["events"][0], "source": "chart"}]}
        r = httpx.post(f"{srv.base_url}/v1/predict", json=wrong, headers={"X-API-Key": key}, timeout=60)
        assert r.status_code == 422 and "MEDS" in r.text
    assert 0.0 <= out["probability"] <= 1.0 and np.isfinite(out["epistemic"])


def test_meds_evaluation_scores_ehr_evals_predictions_alike(rank1_test_evaluation):
    """ehr-eval's predictions.meds.parquet through meds-evaluation: the same AUROC, AUPRC and Brier."""
    import polars as pl
    from meds_evaluation.evaluate import evaluate_binary_classification

    from model.evaluation.evaluate import MEDS_PREDICTIONS_FILE, MEDS_UNCERTAINTY_FILE

    # The session's one ehr-eval of the trained rank-1 run on its test split (tests/conftest.py).
    out = rank1_test_evaluation["out"]
    assert rank1_test_evaluation["code"] == 0
    report = json.loads((out / "metrics.json").read_text())
    predictions = pl.read_parquet(out / MEDS_PREDICTIONS_FILE)
    beside = pl.read_parquet(out / MEDS_UNCERTAINTY_FILE)
    assert {"predictive_entropy", "mutual_information", "hadm_id"} <= set(beside.columns)
    assert beside.select("subject_id", "prediction_time").equals(predictions.select("subject_id", "prediction_time"))
    theirs = evaluate_binary_classification(predictions)["samples_equally_weighted"]
    ours = report["overall"]
    assert theirs["roc_auc_score"] == pytest.approx(ours["auc_roc"], abs=1e-6)
    assert theirs["average_precision_score"] == pytest.approx(ours["auc_pr"], abs=1e-6)
    assert theirs["brier_score"] == pytest.approx(ours["brier"], abs=1e-6)
