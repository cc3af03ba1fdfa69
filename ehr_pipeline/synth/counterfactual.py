"""A counterfactual of a temporal release: the same patients with their trajectories changed, and the truth's answer.

A model that reads the order of a patient's events should move its answer when only the order
changes. ``make_counterfactual`` copies a ``--truth temporal`` release and applies one change
whose effect on the truth is known exactly:

* ``reverse-course``: the pre-admission clinic course's creatinine results of every
  single-admission patient are put in reverse time order (each result, with its unit and flag,
  moves to the mirrored visit). The same values, so the same vocabulary and statistics; the
  course's least-squares trend changes sign with the values' order only approximately (visits
  are not evenly spaced), so the truth's change is 10 x (trend after - trend before) per admission,
  which SYNTH_COUNTERFACTUAL.csv records.
* ``delay-readmission``: each patient's k-th admission (k = 0, 1, ...) with every timed row of it
  (its events, ICU stays, prescriptions, the clinic course before it, and the dates of death after
  the last one) moves k x ``days`` later, so every readmission comes ``days`` later after the
  previous discharge: the truth's readmission term changes by ln(gap / (gap + days)), and its age
  term by the years the admission moved (date of birth stays), both as the truth's own code computes.

The truth is not re-derived here: both logits are the release's own model
(generator.release_model, the TemporalModel that wrote P_DEATH) applied to the features that
``recompute`` reads from the written tables, before and after; the logit before must reproduce
SYNTH_TRUTH.csv's P_DEATH (checked, else the release is refused). The outcome column DIED keeps
the original draw: a counterfactual release is for scoring, not for training.

Output folder (a synthetic release, written whole by output_folder.staged): every file of the
source release, LABEVENTS rewritten in its own dialect (unchanged rows byte for byte),
SYNTH_TRUTH.csv with the counterfactual P_DEATH, SYNTH_MANIFEST.json with a "counterfactual"
entry, and SYNTH_COUNTERFACTUAL.csv: HADM_ID, CHANGED (0/1), LOGIT_BEFORE, LOGIT_AFTER,
P_DEATH_BEFORE, P_DEATH_AFTER.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import pathlib
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ehr_pipeline import reader
from ehr_pipeline.contract import output_folder
from ehr_pipeline.reader import table_schemas
from ehr_pipeline.synth import catalog, recompute, writer
from ehr_pipeline.synth.config import COUNTERFACTUAL_CHANGES as CHANGES
from ehr_pipeline.synth.config import DEFAULT_DELAY_DAYS, SynthConfig
from ehr_pipeline.synth.generator import release_model
from ehr_pipeline.synth.release import MANIFEST_FILE, TRUTH_FILE
from ehr_pipeline.synth.temporal import COURSE_WINDOW_DAYS, TemporalModel

log = logging.getLogger(__name__)

COUNTERFACTUAL_FILE = "SYNTH_COUNTERFACTUAL.csv"
COUNTERFACTUAL_COLUMNS = ["HADM_ID", "CHANGED", "LOGIT_BEFORE", "LOGIT_AFTER", "P_DEATH_BEFORE", "P_DEATH_AFTER"]
# A result moves with its unit and flag: a course is the same set of results, in another order.
RESULT_COLUMNS = ("VALUE", "VALUENUM", "VALUEUOM", "FLAG")
# The truth recomputed from the tables reproduces SYNTH_TRUTH.csv to this (tests: rtol 1e-9).
TRUTH_TOLERANCE = 1e-9
DAY = 86_400


class CounterfactualError(ValueError):
    """A release the counterfactual cannot be made of, named in one line."""


@dataclasses.dataclass(frozen=True)
class CounterfactualSummary:
    """What a counterfactual changed."""

    out_dir: pathlib.Path
    change: str
    admissions: int
    changed: int  # admissions whose trajectory changed
    rows_changed: int  # rows given another result (reverse-course) or moved in time (delay-readmission)
    mean_abs_logit_change: float  # over the changed admissions
    mean_abs_p_change: float

    def format(self) -> str:
        """A one-paragraph report."""
        return (f"counterfactual ({self.change}) in {self.out_dir}: {self.changed:,} of {self.admissions:,} admissions "
                f"changed ({self.rows_changed:,} rows); the truth's logit moves by "
                f"{self.mean_abs_logit_change:.3f} on average (|dP| {self.mean_abs_p_change:.3f}) where changed")


def make_counterfactual(release: str | pathlib.Path, out: str | pathlib.Path, change: str, *,
                        days: int = DEFAULT_DELAY_DAYS, overwrite: bool = False) -> CounterfactualSummary:
    """Writes the counterfactual of a temporal release (``change`` one of CHANGES; days: delay-readmission's) to out."""
    if change not in CHANGES:
        raise CounterfactualError(f"change must be one of {CHANGES}, got {change!r}")
    if change == "delay-readmission" and not (isinstance(days, int) and days > 0):
        raise CounterfactualError(f"days must be a whole number > 0, got {days!r}")
    release = pathlib.Path(release)
    manifest = _temporal_manifest(release)
    model = release_model(_config_of(manifest))
    before = recompute.read_tables(release)
    logit_before = truth_logit(model, before, manifest)
    _check_reproduces_truth(release, logit_before)
    with output_folder.staged(out, kind=output_folder.SYNTHETIC_RELEASE, command="ehr-pipeline synth-counterfactual",
                              overwrite=overwrite, inputs=[release]) as staging:
        staging = pathlib.Path(staging)
        for path in release.iterdir():
            if path.name not in (output_folder.MARKER, MANIFEST_FILE, TRUTH_FILE) and path.is_file():
                shutil.copy2(path, staging / path.name)
        level = manifest.get("compresslevel", 1)
        if change == "reverse-course":
            lab_path = reader.locate_table(release, "LABEVENTS")
            labs, dialect = read_typed(lab_path, "LABEVENTS")
            perm = reversed_course_order(labs, before["ADMISSIONS"])
            rows_changed = int(np.count_nonzero(perm != np.arange(perm.size)))
            write_typed(_permute_results(labs, perm), staging / lab_path.name, "LABEVENTS", dialect, level)
        else:
            rows_changed = _delay_readmissions(release, staging, before["ADMISSIONS"], days, level)
        after = recompute.read_tables(staging)
        logit_after = truth_logit(model, after, manifest)
        summary = _write_truths(release, staging, manifest, change, logit_before, logit_after, rows_changed,
                                days if change == "delay-readmission" else None)
    summary = dataclasses.replace(summary, out_dir=pathlib.Path(out))
    log.info("%s", summary.format())
    return summary


def _temporal_manifest(release: pathlib.Path) -> dict:
    """The release's manifest, refused unless its truth is temporal and its labs are recorded as the truth reads them."""
    path = release / MANIFEST_FILE
    if not path.is_file():
        raise CounterfactualError(f"{release}: no {MANIFEST_FILE} (not a synthetic release)")
    manifest = json.loads(path.read_text())
    if "counterfactual" in manifest:
        raise CounterfactualError(f"{path}: already a counterfactual; make it from the original release")
    if manifest.get("truth", {}).get("family") != "temporal":
        raise CounterfactualError(f"{path}: the truth is not temporal (make it with `synth --truth temporal`)")
    site = manifest["site"]
    if site["lab_bias"] or site["lab_codes"] or site.get("lab_units"):
        # recompute reads the recorded values as the truth's inputs: true only where labs are recorded as drawn.
        raise CounterfactualError(f"{path}: site {site['name']} records labs with a bias, local codes or units; "
                                  "use a release of a site that records them as drawn (A, C, D, E)")
    return manifest


def _config_of(manifest: dict) -> SynthConfig:
    """The SynthConfig a manifest records (what release_model needs: truth, site, events_scale)."""
    planted = manifest.get("planted_subgroup", {}).get("admission_type")
    return SynthConfig(patients=manifest["patients"], seed=manifest["seed"],
                       trigger_offset_seconds=manifest["trigger_offset_seconds"], dialect=manifest["dialect"],
                       gzip=manifest["gzip"], events_scale=manifest["events_scale"],
                       compresslevel=manifest["compresslevel"], site=manifest["site"]["name"],
                       plant_subgroup=planted, truth=manifest["truth"]["family"])


def truth_logit(model: TemporalModel, tables: dict[str, pd.DataFrame], manifest: dict) -> pd.Series:
    """The release model's logit per HADM_ID (dimensionless) on the features recomputed from the tables."""
    ids, features = recompute.pre_trigger_features(tables, manifest["trigger_offset_seconds"])
    traj_ids, trajectory = recompute.trajectory_features(tables)
    if not traj_ids.equals(ids):
        raise CounterfactualError("ADMISSIONS order differs between the truth's two feature readers")
    planted_type = manifest.get("planted_subgroup", {}).get("admission_type")
    planted = None
    if planted_type is not None:
        adm = tables["ADMISSIONS"].set_index("HADM_ID").reindex(ids)
        planted = adm.ADMISSION_TYPE.eq(planted_type).to_numpy()
    return pd.Series(model.logit(features, trajectory, planted), index=ids, name="LOGIT")


def _check_reproduces_truth(release: pathlib.Path, logit: pd.Series) -> None:
    written = pd.read_csv(release / TRUTH_FILE).set_index("HADM_ID").P_DEATH.reindex(logit.index)
    recomputed = 1.0 / (1.0 + np.exp(-logit.to_numpy()))
    worst = float(np.nanmax(np.abs(recomputed - written.to_numpy())))
    if not worst <= TRUTH_TOLERANCE:
        raise CounterfactualError(f"{release / TRUTH_FILE}: P_DEATH recomputed from the tables differs by {worst:.3g} "
                                  "(the tables were changed after synth wrote them)")


def read_typed(path: pathlib.Path, table: str) -> tuple[pa.Table, str]:
    """(a table as the generator's Arrow types, its dialect) from a release file, header names UPPERCASE."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        first = f.readline()
    dialect = "demo" if first.startswith('"') else "physionet"
    types = {c.name if dialect == "demo" else c.name.lower(): catalog.arrow_type(c.type)
             for c in table_schemas.TABLES[table].columns}
    frame = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
        column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False))
    return frame.rename_columns([n.upper() for n in frame.column_names]), dialect


def write_typed(frame: pa.Table, path: pathlib.Path, table: str, dialect: str, compresslevel: int) -> None:
    """Writes a table as the generator does (writer.header + writer.format_rows), gzipped when path ends in .gz."""
    names = table_schemas.TABLES[table].column_names
    body = writer.format_rows(frame.select(list(names)), dialect)
    data = writer.header(names, dialect) + bytes(body)
    if path.suffix == ".gz":
        # As the generator's writer: mtime=0 and the table's own name, so a re-run writes the same bytes.
        with open(path, "wb") as raw, gzip.GzipFile(filename=path.name.removesuffix(".gz"), mode="wb", fileobj=raw,
                                                    compresslevel=compresslevel, mtime=0) as f:
            f.write(data)
    else:
        path.write_bytes(data)


def reversed_course_order(labs: pa.Table, admissions: pd.DataFrame) -> np.ndarray:
    """Row permutation of LABEVENTS: each single-admission patient's course creatinine results in reverse time order.

    The course is what the truth reads (recompute.trajectory_features): numeric creatinine rows
    without HADM_ID in the COURSE_WINDOW_DAYS before the ADMITTIME. Other rows map to themselves.
    """
    n = labs.num_rows
    perm = np.arange(n)
    counts = admissions.groupby("SUBJECT_ID").size()
    single = admissions[admissions.SUBJECT_ID.map(counts).eq(1)].set_index("SUBJECT_ID").ADMITTIME
    subject = labs["SUBJECT_ID"].to_numpy(zero_copy_only=False)
    chart = pc.cast(labs["CHARTTIME"], pa.int64()).to_numpy(zero_copy_only=False)
    admit = single.reindex(subject).to_numpy(dtype=float)
    before = admit - chart
    use = (pc.is_null(labs["HADM_ID"]).to_numpy(zero_copy_only=False)
           & (labs["ITEMID"].to_numpy(zero_copy_only=False) == catalog.CREATININE_ITEMID)
           & pc.is_valid(labs["VALUENUM"]).to_numpy(zero_copy_only=False)
           & (before > 0) & (before <= COURSE_WINDOW_DAYS * DAY))
    rows = np.flatnonzero(use)
    rows = rows[np.lexsort((chart[rows], subject[rows]))]
    starts = np.flatnonzero(np.r_[True, subject[rows][1:] != subject[rows][:-1]])
    for group in np.split(rows, starts[1:]):
        perm[group] = group[::-1]
    return perm


def _permute_results(labs: pa.Table, perm: np.ndarray) -> pa.Table:
    """LABEVENTS with RESULT_COLUMNS taken in perm's order (times, items and owners stay)."""
    take = pa.array(perm)
    for name in RESULT_COLUMNS:
        labs = labs.set_column(labs.column_names.index(name), name, labs[name].take(take))
    return labs


def readmission_shifts(admissions: pd.DataFrame, days: int) -> pd.Series:
    """HADM_ID -> seconds each admission moves: k x days for a patient's k-th admission (0-based, by ADMITTIME)."""
    order = admissions.groupby("SUBJECT_ID").ADMITTIME.rank(method="first").to_numpy(dtype=np.int64) - 1
    return pd.Series(order * days * DAY, index=admissions.HADM_ID.to_numpy())


def _row_shifts(frame: pa.Table, admissions: pd.DataFrame, shifts: pd.Series, time_column: str) -> np.ndarray:
    """Seconds each row moves: its admission's; a row without HADM_ID moves with the patient's next admission
    at or after its time (a clinic course precedes its admission), else with the patient's last."""
    hadm = frame["HADM_ID"].to_pandas()
    out = np.array(hadm.map(shifts), dtype=float)  # a writable copy
    loose = np.flatnonzero(hadm.isna().to_numpy())
    if loose.size:
        rows = pd.DataFrame({"SUBJECT_ID": frame["SUBJECT_ID"].to_numpy(zero_copy_only=False)[loose],
                             "t": pc.cast(frame[time_column], pa.int64()).to_numpy(zero_copy_only=False)[loose],
                             "row": loose}).sort_values("t")
        adm = pd.DataFrame({"SUBJECT_ID": admissions.SUBJECT_ID.to_numpy(), "t": admissions.ADMITTIME.to_numpy(),
                            "shift": shifts.reindex(admissions.HADM_ID).to_numpy()}).sort_values("t")
        forward = pd.merge_asof(rows, adm, on="t", by="SUBJECT_ID", direction="forward")
        backward = pd.merge_asof(rows, adm, on="t", by="SUBJECT_ID", direction="backward")
        out[forward.row.to_numpy()] = forward["shift"].fillna(backward["shift"]).to_numpy()
    if np.isnan(out).any():
        raise CounterfactualError(f"{int(np.isnan(out).sum())} rows belong to no admission of their patient")
    return out.astype(np.int64)


def _shifted(frame: pa.Table, columns: list[str], seconds: np.ndarray) -> pa.Table:
    """frame with each timestamp column moved by seconds per row (nulls stay null)."""
    for name in columns:
        moved = pc.add(pc.cast(frame[name], pa.int64()), pa.array(seconds))
        frame = frame.set_column(frame.column_names.index(name), name, pc.cast(moved, frame.schema.field(name).type))
    return frame


def _delay_readmissions(release: pathlib.Path, staging: pathlib.Path, admissions: pd.DataFrame, days: int,
                        compresslevel: int) -> int:
    """Rewrites every table with times in staging, each readmission k x days later; returns the rows moved."""
    shifts = readmission_shifts(admissions, days)
    last = shifts.groupby(admissions.set_index("HADM_ID").SUBJECT_ID.reindex(shifts.index).to_numpy()).max()
    moved = 0
    for table, schema in table_schemas.TABLES.items():
        times = [c.name for c in schema.columns if c.type == table_schemas.ColType.TIMESTAMP]
        path = reader.locate_table(release, table)
        if not times or path is None:
            continue
        frame, dialect = read_typed(path, table)
        if table == "PATIENTS":  # the dates of death follow the last admission; DOB stays
            times = [t for t in times if t != "DOB"]
            seconds = last.reindex(frame["SUBJECT_ID"].to_numpy()).fillna(0).to_numpy(dtype=np.int64)
        else:
            seconds = _row_shifts(frame, admissions, shifts, times[0])
        if seconds.any():
            write_typed(_shifted(frame, times, seconds), staging / path.name, table, dialect, compresslevel)
            moved += int(np.count_nonzero(seconds))
    return moved


def _write_truths(release: pathlib.Path, staging: pathlib.Path, manifest: dict, change: str,
                  logit_before: pd.Series, logit_after: pd.Series, rows_changed: int,
                  days: int | None) -> CounterfactualSummary:
    """SYNTH_TRUTH.csv (counterfactual P_DEATH), SYNTH_COUNTERFACTUAL.csv and the manifest, in staging."""
    truth = pacsv.read_csv(release / TRUTH_FILE)
    ids = truth["HADM_ID"].to_numpy()
    after = logit_after.reindex(ids).to_numpy()
    before = logit_before.reindex(ids).to_numpy()
    p_after, p_before = 1.0 / (1.0 + np.exp(-after)), 1.0 / (1.0 + np.exp(-before))
    truth = truth.set_column(truth.column_names.index("P_DEATH"), "P_DEATH", pa.array(p_after))
    (staging / TRUTH_FILE).write_bytes((",".join(truth.column_names) + "\n").encode()
                                       + bytes(writer.format_rows(truth, "physionet")))
    changed = after != before
    table = pa.table({"HADM_ID": pa.array(ids), "CHANGED": pa.array(changed.astype(np.int64)),
                      "LOGIT_BEFORE": pa.array(before), "LOGIT_AFTER": pa.array(after),
                      "P_DEATH_BEFORE": pa.array(p_before), "P_DEATH_AFTER": pa.array(p_after)})
    (staging / COUNTERFACTUAL_FILE).write_bytes((",".join(COUNTERFACTUAL_COLUMNS) + "\n").encode()
                                                + bytes(writer.format_rows(table, "physionet")))
    summary = CounterfactualSummary(
        out_dir=staging, change=change, admissions=int(ids.size), changed=int(changed.sum()),
        rows_changed=rows_changed,
        mean_abs_logit_change=float(np.abs(after - before)[changed].mean()) if changed.any() else 0.0,
        mean_abs_p_change=float(np.abs(p_after - p_before)[changed].mean()) if changed.any() else 0.0)
    doc = {**manifest, "counterfactual": {"change": change, "admissions_changed": summary.changed,
                                          "rows_changed": rows_changed, **({"days": days} if days else {}),
                                          "file": COUNTERFACTUAL_FILE, "outcome": "DIED is the original release's"}}
    (staging / MANIFEST_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return summary
