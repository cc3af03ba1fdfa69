"""A MIMIC-III v1.4 release as a MEDS 0.4 dataset: its rows, files and metadata (what ``ehr-pipeline to-meds`` writes).

What is written (docs/meds.md has the table and the reasons):

* ``data/{train,tuning,held_out}/<shard>.parquet``: ``subject_id``, ``time`` (timestamp[us], null for
  static rows), ``code``, ``numeric_value`` (float32), plus ``hadm_id`` and ``unit`` (as the MIMIC-IV
  ETL keeps them); a subject's rows in one file, sorted by time (``sorted_rows``).
* Each event is the very event the job extracts (``mimic.events.EXTRACTORS``: same columns, same drops,
  timed when it was KNOWN by ``bagging.known_time``), written with the MIMIC-IV MEDS ETL's code
  (``code_map.MIMIC_III_TEMPLATES``; ``event_rows``). Per admission (``task_rows``):
  ``HOSPITAL_ADMISSION//<type>//<location>`` at ADMITTIME and ``HOSPITAL_DISCHARGE//<location>``
  (``//DIED`` after an in-hospital death) at the effective discharge, max(DISCHTIME, DEATHTIME), which
  is when the job knows the stay's codes; per patient ``MEDS_BIRTH`` at DOB, ``GENDER//<M|F>`` (static)
  and ``MEDS_DEATH`` at the first in-hospital death (DEATHTIME, or DISCHTIME with only the expire flag),
  else at the end of DOD's day.
* ``metadata/codes.parquet``: every code, described from D_LABITEMS, D_ITEMS, D_ICD_DIAGNOSES and
  D_ICD_PROCEDURES; labs carry their LOINC code as parent ``LOINC/<code>``.
* ``metadata/subject_splits.parquet``: the project's split of every subject (splits.assign_split):
  train -> train, validation -> tuning, test -> held_out; ``metadata/dataset.json``.
* ``to_meds_manifest.json``: every row read, by table, as written or dropped by reason
  (``conversion_manifest``).

Only pyarrow writes it: the ``meds`` package is not needed (the tests validate with it). The Beam
job that runs the conversion is ``ehr_pipeline.job.to_meds``.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ehr_base import __version__
from ehr_pipeline.contract import assign_split, shard_of
from ehr_pipeline.meds import code_map
from ehr_pipeline.mimic.events import KEPT
from ehr_pipeline.reader import locate_table

MEDS_SPLITS = {"train": "train", "validation": "tuning", "test": "held_out"}
MANIFEST = "to_meds_manifest.json"
ETL_NAME = "ehr-uncertainty to-meds"
MEDS_VERSION = "0.4"
DATA_SCHEMA = pa.schema([
    pa.field("subject_id", pa.int64(), nullable=False),
    pa.field("time", pa.timestamp("us")),
    pa.field("code", pa.string(), nullable=False),
    pa.field("numeric_value", pa.float32()),
    pa.field("hadm_id", pa.int64()),
    pa.field("unit", pa.string()),
    # On admission rows only, as ADMISSIONS records them (the MIMIC-IV ETL writes race and insurance
    # there the same way): subgroup reports read them back; they are no model input.
    pa.field("ethnicity", pa.string()),
    pa.field("insurance", pa.string()),
])
# Description columns of the D_ tables: (table, key column, label column, code template).
DESCRIPTION_TABLES = (
    ("D_LABITEMS", "ITEMID", "LABEL", "lab"),
    ("D_ITEMS", "ITEMID", "LABEL", None),
    ("D_ICD_DIAGNOSES", "ICD9_CODE", "LONG_TITLE", "diagnosis"),
    ("D_ICD_PROCEDURES", "ICD9_CODE", "LONG_TITLE", "procedure"),
)


def meds_codes_of(source: str, texts: np.ndarray, units: np.ndarray) -> np.ndarray:
    """MEDS codes of one source's events (code texts without 'source:', units as written or None)."""
    template = code_map.MIMIC_III_TEMPLATES[source]
    if "{unit}" not in template:
        prefix = template.replace("{code}", "")
        return np.char.add(prefix, texts.astype(str)).astype(object)
    unit = np.asarray([code_map.UNKNOWN_PART if u is None else u for u in units], dtype=object)
    head, tail = template.split("{code}")
    tail = tail.replace("{unit}", "")
    return (np.char.add(np.char.add(np.char.add(head, texts.astype(str)), tail), unit.astype(str))).astype(object)


def event_rows(events: pa.Table) -> pa.Table:
    """EVENT_SCHEMA rows (what the job extracts) -> MEDS rows (DATA_SCHEMA), one per event."""
    code = events.column("code").to_numpy(zero_copy_only=False).astype(str)
    source, _, text = (np.asarray(a) for a in np.char.partition(code, ":").T) if code.size else (
        np.zeros(0, str), None, np.zeros(0, str))
    unit = events.column("unit").to_numpy(zero_copy_only=False).astype(object)
    out = np.empty(code.size, dtype=object)
    unit_col = np.full(code.size, None, dtype=object)
    for name in np.unique(source).tolist():
        at = source == name
        out[at] = meds_codes_of(name, text[at], unit[at])
        if name in code_map.UNIT_IN_COLUMN:
            unit_col[at] = unit[at]
    value = events.column("value").to_numpy(zero_copy_only=False)
    written = value.astype(np.float32)
    if not np.all(np.isfinite(written) | np.isnan(value)):
        # The reader refuses what float32 cannot hold (reader.columns.is_measurement): never written as infinity.
        raise ValueError(f"{int(np.count_nonzero(~np.isfinite(written) & ~np.isnan(value)))} event values beyond "
                         "float32's range reached to-meds: the reader should have dead-lettered their rows")
    return pa.table([
        events.column("SUBJECT_ID"),
        pa.array(events.column("time").to_numpy(zero_copy_only=False) * 1_000_000, pa.timestamp("us")),
        pa.array(out, pa.string()),
        pa.array(value, pa.float32(), mask=np.isnan(value)),
        events.column("HADM_ID"),
        pa.array(unit_col, pa.string()),
        pa.nulls(len(out), pa.string()), pa.nulls(len(out), pa.string()),
    ], schema=DATA_SCHEMA)


def _part(values: list) -> list[str]:
    """Code parts from a column: MEDS-Transforms writes UNK for a null or blank one."""
    return [code_map.UNKNOWN_PART if v is None or not str(v).strip() else str(v).strip() for v in values]


def _text(value) -> str | None:
    """A descriptive column's value as written (trimmed); None when null or blank."""
    text = None if value is None else str(value).strip()
    return text or None


def task_rows(admissions: pa.Table, patients: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """ADMISSIONS and PATIENTS (times in s) -> admission, discharge, death, birth and gender rows; counts."""
    a = {c: admissions.column(c).to_pylist() for c in admissions.column_names}
    rows: list[tuple] = []
    counts = {"admissions/written": 0, "admissions/missing_time": 0, "patients/written": 0}
    death_of: dict[int, int] = {}
    for i, sid in enumerate(a["SUBJECT_ID"]):
        admit, disch, death = a["ADMITTIME"][i], a["DISCHTIME"][i], a["DEATHTIME"][i]
        if admit is None or disch is None:
            counts["admissions/missing_time"] += 1
            continue
        died = death is not None or a["HOSPITAL_EXPIRE_FLAG"][i] == 1
        # The job's cohort: a patient who dies is in hospital until death; death at DISCHTIME
        # when only the flag is set. The discharge code goes at that effective discharge.
        effective = max(disch, death) if death is not None else disch
        hadm = a["HADM_ID"][i]
        kind, where = _part([a["ADMISSION_TYPE"][i], a["ADMISSION_LOCATION"][i]])
        attributes = tuple(_text(a.get(column, [None] * len(a["SUBJECT_ID"]))[i]) for column in ("ETHNICITY", "INSURANCE"))
        rows.append((sid, admit, f"HOSPITAL_ADMISSION//{kind}//{where}", hadm, *attributes))
        out = "DIED" if died else _part([a["DISCHARGE_LOCATION"][i]])[0]
        rows.append((sid, effective, f"HOSPITAL_DISCHARGE//{out}", hadm, None, None))
        if died:
            at = death if death is not None else disch
            death_of[sid] = min(at, death_of.get(sid, at))
        counts["admissions/written"] += 1
    p = {c: patients.column(c).to_pylist() for c in patients.column_names}
    for i, sid in enumerate(p["SUBJECT_ID"]):
        gender = (p["GENDER"][i] or "").strip().upper()
        rows.append((sid, None, f"GENDER//{gender if gender in ('M', 'F') else code_map.UNKNOWN_PART}", None,
                     None, None))
        if p["DOB"][i] is not None:
            rows.append((sid, p["DOB"][i], code_map.MEDS_BIRTH, None, None, None))
        dod = p["DOD"][i]
        if sid in death_of:
            rows.append((sid, death_of[sid], code_map.MEDS_DEATH, None, None, None))
        elif dod is not None:  # a date: known at its day's end, like every dated record
            rows.append((sid, int(dod) // 86400 * 86400 + 86399, code_map.MEDS_DEATH, None, None, None))
        counts["patients/written"] += 1
    sid, t, code, hadm, ethnicity, insurance = (list(col) for col in zip(*rows)) if rows else ([],) * 6
    table = pa.table([
        pa.array(sid, pa.int64()),
        pa.array([None if x is None else x * 1_000_000 for x in t], pa.timestamp("us")),
        pa.array(code, pa.string()), pa.nulls(len(sid), pa.float32()), pa.array(hadm, pa.int64()),
        pa.nulls(len(sid), pa.string()), pa.array(ethnicity, pa.string()), pa.array(insurance, pa.string())],
        schema=DATA_SCHEMA)
    return table, counts


def subject_place(subject_ids: np.ndarray, config) -> tuple[np.ndarray, np.ndarray]:
    """(MEDS split name, shard) of each subject: the project's split (splits.assign_split), hashed shards."""
    fractions, salt = config.splits.model_dump(), config.split_salt
    names, shards = [], []
    for sid in subject_ids.tolist():
        split = assign_split(sid, fractions, salt)
        names.append(MEDS_SPLITS[split])
        shards.append(shard_of(sid, getattr(config.num_shards, split)))
    return np.asarray(names, dtype=object), np.asarray(shards, dtype=np.int64)


def subject_buckets(subject_ids: np.ndarray, config, per_bucket: int) -> dict[tuple[str, int], np.ndarray]:
    """Upper-exclusive subject_id bounds of each (split, shard)'s ranges of about `per_bucket` known subjects.

    A shard is written bucket by bucket: rows sorted by subject_id first, so buckets sorted one at
    a time and concatenated in range order are the whole shard sorted, and the writer holds one
    bucket. A subject not among `subject_ids` still falls in exactly one range of its shard.
    """
    ids = np.unique(np.asarray(subject_ids, dtype=np.int64))
    names, shards = subject_place(ids, config)
    bounds: dict[tuple[str, int], np.ndarray] = {}
    for name in MEDS_SPLITS.values():
        for shard in np.unique(shards[names == name]).tolist():
            members = ids[(names == name) & (shards == shard)]
            bounds[(name, shard)] = members[per_bucket::per_bucket].copy()
    return bounds


def subject_cuts(subject_ids: np.ndarray, rows: np.ndarray, limit: int) -> np.ndarray:
    """Upper-exclusive subject_id bounds cutting ascending subjects (with their row counts) into runs of <= `limit` rows.

    A subject's rows are never cut apart: a subject with more than `limit` rows is a run of its own.
    """
    bounds, held = [], 0
    for sid, n in zip(np.asarray(subject_ids).tolist(), np.asarray(rows).tolist()):
        if held and held + n > limit:
            bounds.append(sid)
            held = 0
        held += n
    return np.asarray(bounds, dtype=np.int64)


def by_bucket(rows: pa.Table, config, bounds: dict[tuple[str, int], np.ndarray]
              ) -> list[tuple[tuple[str, int, int], pa.Table]]:
    """MEDS rows -> ((split, shard, bucket), rows) per shard bucket they belong to (subject_buckets' ranges)."""
    if rows.num_rows == 0:
        return []
    sid = rows.column("subject_id").to_numpy()
    uniq, inv = np.unique(sid, return_inverse=True)
    names, shards = subject_place(uniq, config)
    empty = np.zeros(0, np.int64)
    buckets = np.asarray([np.searchsorted(bounds.get((n, s), empty), u, side="right")
                          for n, s, u in zip(names.tolist(), shards.tolist(), uniq.tolist())], dtype=np.int64)
    place = np.char.add(np.char.add(np.char.add(np.char.add(names.astype(str), "/"), shards.astype(str)), "/"),
                        buckets.astype(str))[inv]
    out = []
    for key in np.unique(place).tolist():
        split, shard, bucket = key.split("/")
        out.append(((split, int(shard), int(bucket)), rows.filter(pa.array(place == key))))
    return sorted(out, key=lambda kv: kv[0])


def to_ipc(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes of a table, lz4-compressed: how MEDS rows wait in the spill folder.

    lz4 keeps a row at ~10 bytes on disk instead of ~62 (synthetic release) for ~0.1 s of CPU per
    million rows each way: the spill of a full-size release fits a laptop's disk.
    """
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(blob: bytes) -> pa.Table:
    """The table of to_ipc's bytes."""
    return pa.ipc.open_stream(io.BytesIO(blob)).read_all()


def sorted_rows(tables: list[pa.Table]) -> pa.Table:
    """One shard's rows: subjects together, static rows first, then by time, code and value (stable bytes)."""
    table = pa.concat_tables(tables) if tables else DATA_SCHEMA.empty_table()
    keys = [(c, "ascending", "at_start") for c in ("subject_id", "time", "code", "numeric_value", "unit", "hadm_id")]
    return table.take(pc.sort_indices(table, sort_keys=keys))


# pq.write_table's default row-group length: a shard written in groups of exactly this many rows
# has the bytes of one write_table of the whole sorted shard.
ROW_GROUP_ROWS = 1 << 20


def write_sorted_shard(buckets: Iterable[list[pa.Table]], where, row_group_rows: int = ROW_GROUP_ROWS) -> int:
    """Writes one shard's buckets (subject ranges in order, each a list of row tables) sorted; returns rows.

    Holds one bucket and at most one row group: the file is what ``pq.write_table(sorted_rows(all))``
    writes, whatever the shard's size.
    """
    writer, pending, held, total = None, [], 0, 0
    for tables in buckets:
        part = sorted_rows(tables)
        if part.num_rows == 0:
            continue
        pending.append(part)
        held += part.num_rows
        while held >= row_group_rows:
            group = pa.concat_tables(pending)
            writer = writer or pq.ParquetWriter(where, group.schema)
            writer.write_table(group.slice(0, row_group_rows).combine_chunks())
            pending, held = [group.slice(row_group_rows)], held - row_group_rows
            total += row_group_rows
    if held:
        group = pa.concat_tables(pending).combine_chunks()
        writer = writer or pq.ParquetWriter(where, group.schema)
        writer.write_table(group)
        total += held
    if writer is None:  # no row: the file of an empty table, as write_table makes it
        pq.write_table(DATA_SCHEMA.empty_table(), where)
    else:
        writer.close()
    return total


def conversion_manifest(counts: dict, task_counts: dict, stats: dict, event_tables: list[str], mimic_dir: str,
                        group: Callable[[dict, str], dict[str, int]]) -> dict[str, Any]:
    """Every row read, by table: written as MEDS rows or dropped by reason; balanced when the sums hold."""
    tables = {}
    for table in event_tables:
        rows, dead, extract = group(counts, f"rows/{table}"), group(counts, f"rows/{table}/dead_letter"), group(
            counts, f"events/{table}/extract")
        written = counts.get(f"events/{table}/written", 0)
        problems = []
        if rows.get("read", 0) != rows.get("parsed", 0) + sum(dead.values()):
            problems.append("rows read != parsed + dead-lettered")
        if rows.get("parsed", 0) != sum(extract.values()):
            problems.append("rows parsed != events extracted + dropped")
        if extract.get(KEPT, 0) != written:
            problems.append("events kept != MEDS rows written")
        tables[table] = {"rows_read": rows.get("read", 0), "rows_parsed": rows.get("parsed", 0),
                         "dead_lettered": dead, "extract": extract, "meds_rows_written": written,
                         "balanced": not problems, "problems": problems}
    for name, st in sorted(stats.items()):
        tables[name] = {"rows_read": st.rows_read, "rows_parsed": st.rows_parsed,
                        "dead_lettered": dict(sorted(st.dead_lettered.items())), "balanced": True, "problems": []}
    files = {k: v for k, v in group(counts, "files").items()}
    return {"input": {"mimic_dir": mimic_dir, "event_tables": event_tables}, "tables": tables,
            "task_rows": dict(sorted(task_counts.items())), "files": files,
            "balanced": all(t["balanced"] for t in tables.values())}


def write_code_metadata(out_dir: str, mimic_dir: str, codes: list[str], lab_bridge: dict[str, list[str]]) -> None:
    """metadata/codes.parquet: every code of the data, its description from the D_ tables, LOINC parents for labs."""
    descriptions = _descriptions(mimic_dir)
    loinc_of = {item: code for code, items in lab_bridge.items() for item in items}
    mapper = code_map.CodeMapper(code_map.MedsCodes())
    desc, parents = [], []
    for code in codes:
        mapped = mapper(code)
        text = mapped.code if mapped.kind == code_map.EVENT else None
        source, _, item = (text or "").partition(":")
        key = ("item", item) if source in ("chart", "input", "output") else (source, item)
        desc.append(descriptions.get(key))
        parents.append([f"LOINC/{loinc_of[item]}"] if source == "lab" and item in loinc_of else None)
    table = pa.table({"code": pa.array(codes, pa.string()), "description": pa.array(desc, pa.string()),
                      "parent_codes": pa.array(parents, pa.list_(pa.string()))})
    os.makedirs(os.path.join(out_dir, "metadata"), exist_ok=True)
    pq.write_table(table, os.path.join(out_dir, "metadata", "codes.parquet"))


def _descriptions(mimic_dir: str) -> dict[tuple[str, str], str]:
    """(kind, key) -> description from whichever D_ tables the release has."""
    out: dict[tuple[str, str], str] = {}
    for table, key, label, kind in DESCRIPTION_TABLES:
        try:
            path = locate_table(mimic_dir, table)
        except (KeyError, FileNotFoundError):
            path = _plain_locate(mimic_dir, table)
        if path is None:
            continue
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                k, text = (row.get(key) or "").strip(), (row.get(label) or "").strip()
                if k and text:
                    out[(kind or "item", k)] = text
    return out


def _plain_locate(mimic_dir: str, table: str):
    # The D_ tables the job does not read have no schema for locate_table: look them up by name.
    for name in (f"{table}.csv.gz", f"{table}.csv"):
        path = os.path.join(mimic_dir, name)
        if os.path.isfile(path):
            return path
    return None


def write_subject_splits(out_dir: str, tables: dict, config) -> None:
    """metadata/subject_splits.parquet: every patient's split (the project's assignment, MEDS names)."""
    subjects = np.unique(np.concatenate([tables["PATIENTS"].column("SUBJECT_ID").to_numpy(),
                                         tables["ADMISSIONS"].column("SUBJECT_ID").to_numpy()]).astype(np.int64))
    names, _ = subject_place(subjects, config)
    pq.write_table(pa.table({"subject_id": pa.array(subjects, pa.int64()), "split": pa.array(names, pa.string())}),
                   os.path.join(out_dir, "metadata", "subject_splits.parquet"))


def write_dataset_metadata(out_dir: str, mimic_dir: str) -> None:
    """metadata/dataset.json (MEDS DatasetMetadataSchema): no creation time, so reruns write the same bytes."""
    doc = {"dataset_name": os.path.basename(os.path.normpath(mimic_dir)) or "MIMIC-III",
           "dataset_version": "MIMIC-III v1.4 layout", "etl_name": ETL_NAME, "etl_version": __version__,
           "meds_version": MEDS_VERSION}
    with open(os.path.join(out_dir, "metadata", "dataset.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
