"""MEDS in and out: to-meds validated by the `meds` package's own schemas, the round trip on the MIMIC-III demo
(built-in task and ACES labels), the prediction-time boundary, label accounting and streaming by blocks.

What cannot survive the round trip MIMIC-III -> MEDS -> examples, and why (docs/meds.md):
* numeric values: MEDS stores float32, so every value is rounded to ~7 digits; bag codes, counts, offsets,
  contexts and labels are equal, the numeric aggregates equal to float32 precision (rel 1e-6), and the
  serialized records are byte-identical only where no rounding reached them;
* rows the job drops (rewritten MetaVision inputs, charting errors, codes without a time) are not written,
  and text values are not either (the job reads none of them);
* for an admission that ends in death after DISCHTIME, the recorded DISCHTIME (the discharge code goes at the
  death, where the job's cohort puts the end of the stay);
* ACES cannot express the cohort's age limit: its labels hold one more (under-age) admission.
"""
from __future__ import annotations

import glob
import json
import math
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ehr_pipeline.contract import PipelineConfig, spec
from ehr_pipeline.job import run_meds_job
from ehr_pipeline.meds import code_map, from_mimic, standard
from ehr_pipeline.meds.source import LABEL_EXAMPLE, TABLE, MedsReader, data_files, read_subject_splits
from tests.support.job_outputs import CONFIG, independent_cohort, read_examples
from tests.support.paths import REPO_ROOT

VALUES = (spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST, spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX)


@pytest.fixture(scope="module")
def demo_meds(demo_meds_conversion):
    """The session's `to-meds` conversion of the demo (tests/conftest.py; its bytes pinned by the job's tests):
    (folder, its manifest)."""
    return demo_meds_conversion, json.loads((demo_meds_conversion / from_mimic.MANIFEST).read_text())


@pytest.fixture(scope="module")
def mimic_examples(demo_run):
    """The CSV path's examples: the session's demo job, run with the same CONFIG."""
    return demo_run[2]


def assert_same_examples(got: dict, want: dict) -> int:
    """Equal contexts, bags, codes and counts; numeric aggregates to float32 precision. Returns byte-equal records."""
    assert got.keys() == want.keys()
    same_bytes = 0
    for key, w in want.items():
        g = got[key]
        for name in w:
            if name in ("raw",) + VALUES:
                continue
            assert g[name] == w[name], (key, name)
        for name in VALUES:
            flat_g = [x for bag in g[name] for x in bag]
            flat_w = [x for bag in w[name] for x in bag]
            assert len(flat_g) == len(flat_w)
            assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) for a, b in zip(flat_g, flat_w)), (key, name)
        same_bytes += g["raw"] == w["raw"]
    return same_bytes


def test_code_map_reads_the_mimic_iv_etl_and_to_meds_codes():
    read = code_map.CodeMapper(code_map.MedsCodes())
    cases = {
        "LAB//50912//mg/dL": ("event", "lab:50912", "mg/dL"),
        "LAB//50912//UNK": ("event", "lab:50912", None),  # MEDS-Transforms' null unit
        "LAB//220045//bpm": ("event", "chart:220045", "bpm"),  # icu/chartevents: outside the lab item range
        "LAB//211//bpm": ("event", "chart:211", "bpm"),  # a MIMIC-III CareVue chart item
        "SUBJECT_FLUID_OUTPUT//40055//ml": ("event", "output:40055", "ml"),
        "MEDICATION//START//Vancomycin//1 g": ("event", "prescription:Vancomycin//1 g", None),
        "DIAGNOSIS//ICD//9//4019": ("event", "diagnosis:4019", None),
        "DIAGNOSIS//ICD//10//I10": ("event", "diagnosis:10//I10", None),  # ICD-10 keeps its version apart
        "HOSPITAL_DISCHARGE//DIED": ("discharge", None, None),
        "MEDS_DEATH": ("death", None, None),
        "ED_REGISTRATION": ("unmapped", None, None),
    }
    for code, (kind, text, unit) in cases.items():
        got = read(code)
        assert (got.kind, got.code, got.unit) == (kind, text, unit), code
    assert read("INFUSION_END//225158").unit_from_column and read("PROCEDURE//ICD//9//9604").next_discharge
    assert read("HOSPITAL_ADMISSION//EMERGENCY//ER").detail == "EMERGENCY"
    assert read("HOSPITAL_ADMISSION//UNK//ER").detail == "UNKNOWN"
    # The converter's templates are read back to the very code they came from.
    for source, template in code_map.MIMIC_III_TEMPLATES.items():
        item = "50912" if source == "lab" else "211"
        got = read(template.format(code=item, unit="mg/dL"))
        assert got.code == f"{source}:{item}", source


def test_the_shipped_code_map_yaml_is_the_default():
    root = REPO_ROOT
    assert code_map.load_meds_codes(root / "configs" / "meds_codes.yaml") == code_map.MedsCodes()


def test_to_meds_output_passes_the_meds_schemas_and_accounts_for_every_row(demo_meds, demo_dir):
    import meds

    out, manifest = demo_meds
    assert manifest["balanced"]
    files = sorted(glob.glob(str(out / "data" / "*" / "*.parquet")))
    data_codes = set()
    subjects_seen: dict[int, str] = {}
    for path in files:
        table = pq.read_table(path)
        meds.DataSchema.validate(table)  # raises on any schema breach
        sid = table.column("subject_id").to_numpy()
        t = table.column("time").cast(pa.int64()).to_numpy(zero_copy_only=False)
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        assert len(set(sid[starts].tolist())) == starts.size, path  # a subject's rows together
        for a, b in zip(starts, list(starts[1:]) + [sid.size]):
            times = table.column("time").slice(a, b - a)
            timed = [x for x in times.cast(pa.int64()).to_pylist() if x is not None]
            assert timed == sorted(timed)  # static rows first, then by time
            assert times.null_count == 0 or times[0].as_py() is None
        for s in set(sid.tolist()):
            assert subjects_seen.setdefault(s, path) == path  # one file per subject
        data_codes |= set(table.column("code").to_pylist())
        del t
    codes = pq.read_table(out / "metadata" / "codes.parquet")
    meds.CodeMetadataSchema.validate(codes)
    assert set(codes.column("code").to_pylist()) == data_codes
    described = dict(zip(codes.column("code").to_pylist(), codes.column("description").to_pylist()))
    assert described["DIAGNOSIS//ICD//9//4019"] == "Unspecified essential hypertension"
    assert any(c.startswith("LAB//50912//") and d == "Creatinine" for c, d in described.items())
    splits = pq.read_table(out / "metadata" / "subject_splits.parquet")
    meds.SubjectSplitSchema.validate(splits)
    assert set(splits.column("split").to_pylist()) <= {"train", "tuning", "held_out"}
    assert set(splits.column("subject_id").to_pylist()) == set(subjects_seen)
    meds.DatasetMetadataSchema.validate(json.loads((out / "metadata" / "dataset.json").read_text()))
    # Every row of an event table is a MEDS row or a counted drop.
    assert manifest["tables"]["LABEVENTS"]["rows_read"] == 76074
    assert manifest["tables"]["LABEVENTS"]["meds_rows_written"] == 76074
    rewritten = manifest["tables"]["INPUTEVENTS_MV"]["extract"]["input_rewritten"]
    assert rewritten == 2910 and manifest["tables"]["INPUTEVENTS_MV"]["meds_rows_written"] == 13224 - rewritten
    assert manifest["task_rows"] == {"admissions/missing_time": 0, "admissions/written": 129, "patients/written": 100}


def test_round_trip_built_in_task_equals_the_csv_run(demo_meds, mimic_examples, demo_meds_job, demo_dir):
    meds_dir, _ = demo_meds
    # The session's MEDS job on this conversion (tests/conftest.py; its bytes pinned by the job's tests).
    out, manifest = demo_meds_job
    examples = read_examples(out)
    assert {h: e[spec.LABEL] for h, e in examples.items()} == independent_cohort(demo_dir)
    byte_equal = assert_same_examples(examples, mimic_examples)
    assert 0 < byte_equal < len(examples)  # float32 rounding reaches some records, not all
    # The same split of every subject (subject_splits.parquet carries the project's own assignment).
    assert {h: e["split"] for h, e in examples.items()} == {h: e["split"] for h, e in mimic_examples.items()}
    assert manifest["balanced"] and manifest["cohort"]["counts"]["kept"] == 117
    # The previous discharge (in the contexts compared above) from the MEDS admission and discharge codes.
    with_previous = sum(e[spec.PREVIOUS_DISCHARGE] != spec.NO_PREVIOUS_DISCHARGE for e in examples.values())
    assert manifest["cohort"]["previous_discharge"]["with_previous_discharge"] == with_previous > 0
    assert manifest["cohort"]["counts"]["under_age"] == 1 and manifest["cohort"]["counts"]["died_before_trigger"] == 9
    meds_rows = manifest["tables"][TABLE]
    assert meds_rows["rows_read"] == sum(pq.read_metadata(f).num_rows for f in glob.glob(str(meds_dir / "data/*/*")))
    assert (out / "meds_codes.json").is_file() and manifest["meds_codes"]["sha256"]


def test_round_trip_with_aces_labels_equals_the_csv_run(demo_meds, mimic_examples, tmp_path):
    from tests.support.meds_data import TASK_CONFIG, aces_labels

    meds_dir, _ = demo_meds
    labels = aces_labels(meds_dir, TASK_CONFIG, tmp_path / "labels")
    out = tmp_path / "run"
    manifest = run_meds_job(str(meds_dir), str(out), PipelineConfig.model_validate(CONFIG), labels_dir=str(labels))
    examples = read_examples(out)
    # ACES selects one admission more: the cohort's age limit (18) is not expressible in its config.
    extra = set(examples) - set(mimic_examples)
    assert len(extra) == 1 and set(mimic_examples) <= set(examples)
    (young,) = extra
    assert examples[young][spec.AGE_YEARS] < 18
    assert_same_examples({h: e for h, e in examples.items() if h != young}, mimic_examples)
    assert manifest["labels"]["outcome"][LABEL_EXAMPLE] == manifest["labels"]["rows"] == 118
    assert manifest["balanced"]


def _tiny_meds(root: pathlib.Path, rows: list[tuple], splits: dict[int, str] | None = None) -> pathlib.Path:
    """A MEDS dataset of hand-written rows (subject, time s or None, code, value, unit)."""
    (root / "data").mkdir(parents=True)
    table = pa.table({
        "subject_id": pa.array([r[0] for r in rows], pa.int64()),
        "time": pa.array([None if r[1] is None else r[1] * 1_000_000 for r in rows], pa.timestamp("us")),
        "code": pa.array([r[2] for r in rows], pa.string()),
        "numeric_value": pa.array([r[3] for r in rows], pa.float32()),
    })
    pq.write_table(table, root / "data" / "0.parquet")
    if splits:
        (root / "metadata").mkdir()
        pq.write_table(pa.table({"subject_id": pa.array(list(splits), pa.int64()),
                                 "split": pa.array(list(splits.values()))}), root / "metadata" / "subject_splits.parquet")
    return root


def _labels(path: pathlib.Path, rows: list[tuple]) -> pathlib.Path:
    pq.write_table(pa.table({
        "subject_id": pa.array([r[0] for r in rows], pa.int64()),
        "prediction_time": pa.array([None if r[1] is None else r[1] * 1_000_000 for r in rows], pa.timestamp("us")),
        "boolean_value": pa.array([r[2] for r in rows], pa.bool_())}), path)
    return path


T = 5_000_000_000  # a prediction time, s
DAY = 86400


def test_prediction_time_boundary_events_strictly_before_are_used(tmp_path):
    """MEDS allows data up to AND including prediction_time; the job uses events strictly before it,
    as for MIMIC-III. An event at T - 1 s is bagged; one at exactly T is not (counted at_or_after_trigger)."""
    rows = [(1, None, "GENDER//F", None), (1, T - 60 * DAY * 365, "MEDS_BIRTH", None),
            (1, T - DAY, "HOSPITAL_ADMISSION//EMERGENCY//ER", None),
            (1, T - 1, "LAB//50912//mg/dL", 1.0), (1, T, "LAB//50912//mg/dL", 9.0), (1, T + 1, "LAB//50813//mmol/L", 2.0),
            (1, T + DAY, "HOSPITAL_DISCHARGE//HOME", None)]
    meds_dir = _tiny_meds(tmp_path / "meds", rows, {1: "train"})
    labels = _labels(tmp_path / "labels.parquet", [(1, T, True)])
    manifest = run_meds_job(str(meds_dir), str(tmp_path / "out"), PipelineConfig.model_validate(CONFIG),
                            labels_dir=str(labels))
    (ex,) = read_examples(tmp_path / "out").values()
    assert ex[spec.TRIGGER_TIME] == T and ex[spec.LABEL] == 1 and ex["split"] == "train"
    assert ex[spec.BAG_CODES] == [["lab:50912"]] and ex[spec.BAG_VALUE_LAST] == [[1.0]]  # not the 9.0 at T
    assert ex[spec.BAG_OFFSET] == [1.0]
    assert ex[spec.ADMIT_OFFSET] == DAY and ex[spec.ADMISSION_TYPE] == "EMERGENCY" and ex[spec.GENDER] == "F"
    assert manifest["tables"][TABLE]["cohort_filter"] == {"at_or_after_trigger": 2, "not_in_cohort": 0,
                                                                      "used": 1}


def test_label_rows_that_cannot_become_examples_are_counted_by_reason(tmp_path):
    rows = [(1, T - 40 * 365 * DAY, "MEDS_BIRTH", None), (1, T - 10, "LAB//50912//mg/dL", 1.0),
            (2, T - 10, "LAB//50912//mg/dL", 1.0),  # no birth code
            (3, T + 10, "MEDS_BIRTH", None)]  # born after the prediction time
    meds_dir = _tiny_meds(tmp_path / "meds", rows)
    labels = _labels(tmp_path / "labels.parquet", [
        (1, T, True), (1, T, False),  # the second is a duplicate (subject, time)
        (1, T + DAY, None),  # no label value
        (2, T, False), (3, T, True), (4, T, True)])  # subject 4 has no rows
    manifest = run_meds_job(str(meds_dir), str(tmp_path / "out"), PipelineConfig.model_validate(CONFIG),
                            labels_dir=str(labels))
    outcome = manifest["labels"]["outcome"]
    assert outcome == {"example": 1, "duplicate": 1, "null_value": 1, "no_birth": 1, "before_birth": 1,
                       "no_subject_rows": 1, "null_prediction_time": 0}
    assert manifest["labels"]["balanced"] and manifest["balanced"]
    (ex,) = read_examples(tmp_path / "out").values()
    # No admission at the prediction time: the example still comes, with no current stay.
    assert ex[spec.ADMIT_OFFSET] == 0 and ex[spec.ADMISSION_TYPE] == "UNKNOWN" and ex[spec.LABEL] == 1
    assert ex[spec.HADM_ID] >= 2**62  # a key made from (subject, prediction time)


def test_subjects_stream_by_block_with_the_same_result(demo_meds):
    """A block of 1,000 rows (subjects carried over block ends) gives what one block per file gives."""
    meds_dir, _ = demo_meds
    def read(block_rows):
        reader = MedsReader(codes=code_map.MedsCodes(), trigger_offset_seconds=86400,
                                        min_age_years=18.0, splits=read_subject_splits(meds_dir),
                                        block_rows=block_rows)
        examples, counts = {}, {}
        for path in data_files(meds_dir):
            for out in reader.read_file(path):
                for key, meta, times, codes, values, units in out.examples:
                    examples[key] = (meta, times.tolist(), codes.tolist(), np.nan_to_num(values, nan=-1).tolist())
                for k, v in out.counts.items():
                    counts[k] = counts.get(k, 0) + v
        return examples, counts

    small, large = read(1000), read(1 << 20)
    assert small == large and len(small[0]) == 117


def test_rows_of_one_subject_apart_in_a_file_are_refused(tmp_path):
    meds_dir = _tiny_meds(tmp_path / "meds", [(1, T, "MEDS_BIRTH", None), (2, T, "MEDS_BIRTH", None),
                                               (1, T + 1, "LAB//50912//mg/dL", 1.0)])
    reader = MedsReader(codes=code_map.MedsCodes(), trigger_offset_seconds=86400, min_age_years=18.0,
                                    block_rows=1)
    with pytest.raises(standard.MedsError, match="subject 1 are not together"):
        for _ in reader.read_file(str(meds_dir / "data" / "0.parquet")):
            pass


def test_the_meds_path_needs_no_meds_package_and_the_mimic_path_imports_none_of_it():
    import subprocess
    import sys

    code = ("import sys; import ehr_pipeline.job, ehr_pipeline.meds.source, ehr_pipeline.meds.labels, "
            "ehr_pipeline.meds.standard, ehr_pipeline.job.items, ehr_pipeline.job.to_meds, ehr_pipeline.cli; "
            "print(sorted(m for m in ('meds', 'aces', 'polars', 'meds_evaluation') if m in sys.modules))")
    root = REPO_ROOT
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
