"""Hostile inputs, the model's side: faulted data folders and exports through `ehr-eval` and `ehr-analyze shift`.

The data side (tests/ehr_pipeline/reader/test_hostile_inputs.py) feeds faulted MIMIC-III tables to the Beam job; here
its output is faulted after the job wrote it (a shard cut short, a stray shard, a manifest of an
older job or without checksums, an empty split) or is valid but awkward (values in other units
than the model's, a code whose training values are all one value). Every case ends in exactly
one line naming the file, exit code 2, or in a run that writes its reports with the conversion
or the finding said before any metric.
"""
from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

from ehr_pipeline.contract import layout, spec
from ehr_pipeline.contract.integrity import REWRITE
from ehr_pipeline.encode import units
from ehr_pipeline.shift import population, unit_mismatch
from model.cli import ehr_analyze, ehr_eval
from tests.support.ehr_testdata import write_data_dir
from tests.support.serving_fixtures import write_manifest
from tests.support.units_model import CREATININE, LACTATE, MODEL_UNITS, PEEP, SIZES, UMOL_PER_MG_DL

EVAL = ["--split", "test", "--samples", "2", "--bootstrap", "10", "--no-progress"]


@pytest.fixture(scope="module")
def base(units_model) -> pathlib.Path:
    """A data folder, a tiny export of its vocabulary with a reference of it, in mg/dL and mmol/L (the session's)."""
    return units_model


def _copy(base: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(base / "data", tmp_path / "data"))


def _shard(data: pathlib.Path, split: str) -> pathlib.Path:
    return data / spec.shard_file_name(split, 0, 1)


def _edit_manifest(data: pathlib.Path, change) -> pathlib.Path:
    path = data / layout.MANIFEST
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return path


def _resign(data: pathlib.Path, split: str) -> None:
    """The manifest's checksum of a split's shard set to the file's (what a job writing it would record)."""
    def change(doc):
        doc["splits"][split]["files"][_shard(data, split).name]["sha256"] = layout.sha256_of(str(_shard(data, split)))
    _edit_manifest(data, change)


def _one_line(capsys, prog: str, rc: int) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err[-3000:]
    assert "Traceback" not in out + err
    return lines[0][len(f"{prog}: error: "):]


def _eval(base, data, *extra) -> int:
    return ehr_eval.main(["--model", str(base / "export"), "--data", str(data), *EVAL, *extra])


def _shift(base, data) -> int:
    return ehr_analyze.main(["shift", "--model", str(base / "export"), "--data", str(data), "--no-model",
                             "--no-progress"])


# ------------------------------------------------------------------------ the folder against its manifest


def _truncated(data: pathlib.Path) -> str:
    shard = _shard(data, "test")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return (f"{shard}: does not match its sha256 in {data / layout.MANIFEST} (truncated or altered since the job "
            f"wrote it): {REWRITE}, or restore the file")


def _stray_shard(data: pathlib.Path) -> str:
    stray = data / spec.shard_file_name("test", 1, 2)
    shutil.copyfile(_shard(data, "test"), stray)
    return (f"{stray}: not listed in {data / layout.MANIFEST} (a file the job did not write, or a manifest "
            f"without checksums): {REWRITE}")


def _older_job(data: pathlib.Path) -> str:
    path = _edit_manifest(data, lambda doc: doc.update(schema_version=2))
    return (f"{path}: schema_version 2 (written by an older job), this code reads schema_version "
            f"{spec.SCHEMA_VERSION}: {REWRITE}")


def _no_checksums(data: pathlib.Path) -> str:
    path = _edit_manifest(data, lambda doc: [s.pop("files") for s in doc["splits"].values()])
    return (f"{_shard(data, 'train')}: not listed in {path} (a file the job did not write, or a manifest without "
            f"checksums): {REWRITE}")


def _units_altered(data: pathlib.Path) -> str:
    (data / layout.UNITS).write_text((data / layout.UNITS).read_text().replace("mg/dL", "umol/L"))
    return (f"{data / layout.UNITS}: does not match its sha256 in {data / layout.MANIFEST} (truncated or altered "
            f"since the job wrote it): {REWRITE}, or restore the file")


def _nested_file_altered(data: pathlib.Path) -> str:
    # A file the manifest names deeper down (a MEDS label run's prediction times), changed after the job.
    times = data / "prediction_times.parquet"
    times.write_bytes(b"written by the job")
    digest = layout.sha256_of(str(times))
    _edit_manifest(data, lambda doc: doc.update(labels={"prediction_times": {"file": times.name, "sha256": digest}}))
    times.write_bytes(b"changed since")
    return (f"{times}: does not match its sha256 in {data / layout.MANIFEST} (truncated or altered since the job "
            f"wrote it): {REWRITE}, or restore the file")


FOLDER_FAULTS = {"truncated_shard": _truncated, "stray_shard": _stray_shard, "older_job": _older_job,
                 "manifest_without_checksums": _no_checksums, "units_json_altered": _units_altered,
                 "nested_file_altered": _nested_file_altered}


@pytest.mark.parametrize("fault", sorted(FOLDER_FAULTS))
@pytest.mark.parametrize("command", ["eval", "shift"])
def test_a_folder_that_does_not_match_its_manifest_is_one_line(fault, command, base, tmp_path, capsys):
    data = _copy(base, tmp_path)
    expected = FOLDER_FAULTS[fault](data)
    if command == "eval":
        assert _one_line(capsys, "ehr-eval", _eval(base, data)) == expected
    else:
        assert _one_line(capsys, "ehr-analyze", _shift(base, data)) == expected


def test_data_of_another_schema_than_the_model_was_trained_on_is_one_line(base, tmp_path, capsys):
    export = pathlib.Path(shutil.copytree(base / "export", tmp_path / "export"))
    vocabulary = json.loads((export / layout.VOCABULARY).read_text())
    (export / layout.VOCABULARY).write_text(json.dumps({**vocabulary, "schema_version": 2}))
    write_manifest(export)  # a consistent export of a model trained on version-2 records
    rc = ehr_eval.main(["--model", str(export), "--data", str(base / "data"), *EVAL])
    assert _one_line(capsys, "ehr-eval", rc) == (
        f"{base / 'data' / layout.MANIFEST}: schema_version {spec.SCHEMA_VERSION}, but {export} was trained on "
        f"schema_version 2 data: {REWRITE} with the version the model was trained with, or retrain the model")


def test_a_truncated_shard_read_without_its_manifest_names_the_file(base, tmp_path):
    data = _copy(base, tmp_path)
    _truncated(data)
    with pytest.raises(ValueError, match=f"^{_shard(data, 'test')}: not a readable TFRecord file "):
        population.read_records(data, "test")


def test_an_empty_split_is_one_line_not_a_shape_error(base, tmp_path, capsys):
    data = _copy(base, tmp_path)
    with open(_shard(data, "test"), "wb") as f:
        from ehr_pipeline.contract.tfrecord import write_records

        write_records(f, [])
    _resign(data, "test")
    assert _one_line(capsys, "ehr-eval", _eval(base, data)) == f"{data}: the test split has no examples: nothing to evaluate"


# ------------------------------------------------------------------------ units


def _si_data(base, tmp_path, unit: str, code: str = CREATININE, scale: float = UMOL_PER_MG_DL) -> pathlib.Path:
    """Fresh data of the same population with `code` recorded (and declared) in `unit`."""
    canonical = {**MODEL_UNITS["canonical"], code: unit}
    return write_data_dir(tmp_path / f"data_{unit.replace('/', '_')}", sizes=SIZES, seed=5, train_shards=1,
                          scale={code: scale}, units=canonical, constant={PEEP: 5.0})


def test_values_in_another_unit_are_converted_to_the_models_before_any_metric(base, tmp_path, capsys, caplog):
    si = _si_data(base, tmp_path, "umol/L")
    rc = _eval(base, si, "--out", str(tmp_path / "eval"))
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    said = [r.getMessage() for r in caplog.records if "converted to its units before scoring" in r.getMessage()]
    conversion, _ = units.Converter().conversion("umol/L", "mg/dL", "2160-0")
    assert said == [f"{si} holds 1 code(s) in other units than the model: converted to its units before scoring "
                    f"({CREATININE} umol/L -> mg/dL (x{conversion.scale:.4g}))"]
    assert abs(conversion.scale * UMOL_PER_MG_DL - 1) < 1e-3
    assert (tmp_path / "eval" / "metrics.json").is_file()
    # The records the model scored carry what the mg/dL release carries: values within the rounding
    # of 88.4 (the data's factor) against 88.42 (creatinine's molar mass).
    same = write_data_dir(tmp_path / "data_mg", sizes=SIZES, seed=5, train_shards=1, units=MODEL_UNITS["canonical"],
                          constant={PEEP: 5.0})
    converted, entries = unit_mismatch.convert_records(population.read_records(si, "test"), {CREATININE: conversion})
    assert entries > 10
    for a, b in zip(population.admissions_from_examples(converted),
                    population.admissions_from_examples(population.read_records(same, "test"))):
        np.testing.assert_allclose(a.values, b.values, rtol=1e-3)


def test_values_that_cannot_be_converted_are_refused_with_the_fix_and_forced_as_before(base, tmp_path, capsys):
    odd = _si_data(base, tmp_path, "U/L", code=LACTATE, scale=1.0)
    _, why = units.Converter().conversion("U/L", "mmol/L", "2524-7")
    assert _one_line(capsys, "ehr-eval", _eval(base, odd)) == (
        f"{odd} holds 1 code(s) in units that cannot be converted to the model's ({LACTATE} U/L -> mmol/L cannot be "
        f"converted ({why})): prepare the data with `ehr-pipeline run "
        f"--units-from {base / 'export'}` (values it cannot convert are dead-lettered there), or pass --force to "
        "score them as they are")
    assert _eval(base, odd, "--force") == 0
    out, _ = capsys.readouterr()
    assert "auc_pr" in out


# ------------------------------------------------------------------------ a code constant in training


def test_eval_and_shift_on_data_with_a_code_constant_in_training_write_their_reports(base, tmp_path, capsys):
    # A test split large enough for PEEP to be compared in ehr-eval's report of it (>= 20 admissions with it).
    fresh = write_data_dir(tmp_path / "fresh", sizes=SIZES[:2] + (("test", 60),), seed=9, train_shards=1,
                           units=MODEL_UNITS["canonical"], constant={PEEP: 10.0})
    assert _eval(base, fresh, "--out", str(tmp_path / "eval")) == 0
    report = json.loads((tmp_path / "eval" / "shift.json").read_text())
    assert (tmp_path / "eval" / "metrics.json").is_file()
    assert _shift(base, fresh) == 3
    out, _ = capsys.readouterr()
    assert f"[severe] {PEEP} values are ~2x the training median" in out
    assert report["level"] == "severe"


def test_the_reference_of_a_constant_code_is_closed_around_its_value(base):
    reference = json.loads((base / "export" / "reference_profile.json").read_text())
    values = reference["codes"][PEEP]["values"]
    assert values["edges"] == [pytest.approx(5 - 5e-3), pytest.approx(5 + 5e-3)] and values["counts"][0] == 0
