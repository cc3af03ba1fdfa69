"""`ehr-pipeline to-meds`: a MIMIC-III v1.4 release (or a synthetic one) -> a MEDS 0.4 dataset, as a Beam job.

What is written (docs/meds.md has the table and the reasons):

* ``data/{train,tuning,held_out}/<shard>.parquet``: ``subject_id``, ``time`` (timestamp[us], null for
  static rows), ``code``, ``numeric_value`` (float32), plus ``hadm_id`` and ``unit`` (as the MIMIC-IV
  ETL keeps them); a subject's rows in one file, sorted by time.
* Each event is the very event the job extracts (``events.EXTRACTORS``: same columns, same drops,
  timed when it was KNOWN by ``bagging.known_time``), written with the MIMIC-IV MEDS ETL's code
  (``meds_codes.MIMIC_III_TEMPLATES``). Per admission: ``HOSPITAL_ADMISSION//<type>//<location>`` at
  ADMITTIME and ``HOSPITAL_DISCHARGE//<location>`` (``//DIED`` after an in-hospital death) at the
  effective discharge, max(DISCHTIME, DEATHTIME), which is when the job knows the stay's codes;
  per patient ``MEDS_BIRTH`` at DOB, ``GENDER//<M|F>`` (static) and ``MEDS_DEATH`` at the first
  in-hospital death (DEATHTIME, or DISCHTIME with only the expire flag), else at the end of DOD's day.
* ``metadata/codes.parquet``: every code, described from D_LABITEMS, D_ITEMS, D_ICD_DIAGNOSES and
  D_ICD_PROCEDURES; labs carry their LOINC code as parent ``LOINC/<code>``.
* ``metadata/subject_splits.parquet``: the project's split of every subject (splits.assign_split):
  train -> train, validation -> tuning, test -> held_out; ``metadata/dataset.json``.
* ``to_meds_manifest.json``: every row read, by table, as written or dropped by reason.

Only pyarrow writes it: the ``meds`` package is not needed (the tests validate with it).
"""
from __future__ import annotations

import io
import json
import logging
import os
import time
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline import events as ev
from ehr_pipeline import meds_codes
from ehr_pipeline.transforms import COUNTS, DEAD, FATAL, KV, Select, Tagged, WriteDeadLetters, count, select

log = logging.getLogger(__name__)

MEDS_SPLITS = {"train": "train", "validation": "tuning", "test": "held_out"}
ROWS = "rows"  # kind: ((split, shard), Arrow IPC bytes of MEDS rows)
CODES = "codes"  # kind: a code seen in the data
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


# ----------------------------------------------------------------------------- pure functions


def meds_codes_of(source: str, texts: np.ndarray, units: np.ndarray) -> np.ndarray:
    """MEDS codes of one source's events (code texts without 'source:', units as written or None)."""
    template = meds_codes.MIMIC_III_TEMPLATES[source]
    if "{unit}" not in template:
        prefix = template.replace("{code}", "")
        return np.char.add(prefix, texts.astype(str)).astype(object)
    unit = np.asarray([meds_codes.UNKNOWN_PART if u is None else u for u in units], dtype=object)
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
        if name in meds_codes.UNIT_IN_COLUMN:
            unit_col[at] = unit[at]
    value = events.column("value").to_numpy(zero_copy_only=False)
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
    return [meds_codes.UNKNOWN_PART if v is None or not str(v).strip() else str(v).strip() for v in values]


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
        rows.append((sid, None, f"GENDER//{gender if gender in ('M', 'F') else meds_codes.UNKNOWN_PART}", None,
                     None, None))
        if p["DOB"][i] is not None:
            rows.append((sid, p["DOB"][i], meds_codes.MEDS_BIRTH, None, None, None))
        dod = p["DOD"][i]
        if sid in death_of:
            rows.append((sid, death_of[sid], meds_codes.MEDS_DEATH, None, None, None))
        elif dod is not None:  # a date: known at its day's end, like every dated record
            rows.append((sid, int(dod) // 86400 * 86400 + 86399, meds_codes.MEDS_DEATH, None, None, None))
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
    from ehr_pipeline import splits

    fractions, salt = config.splits.model_dump(), config.split_salt
    names, shards = [], []
    for sid in subject_ids.tolist():
        split = splits.assign_split(sid, fractions, salt)
        names.append(MEDS_SPLITS[split])
        shards.append(splits.shard_of(sid, getattr(config.num_shards, split)))
    return np.asarray(names, dtype=object), np.asarray(shards, dtype=np.int64)


def by_shard(rows: pa.Table, config) -> list[tuple[tuple[str, int], bytes]]:
    """MEDS rows -> ((split, shard), Arrow IPC bytes) per shard they belong to."""
    if rows.num_rows == 0:
        return []
    sid = rows.column("subject_id").to_numpy()
    uniq, inv = np.unique(sid, return_inverse=True)
    names, shards = subject_place(uniq, config)
    out = []
    keys = np.char.add(np.char.add(names.astype(str)[inv], "/"), shards.astype(str)[inv])
    for key in np.unique(keys).tolist():
        split, shard = key.split("/")
        part = rows.filter(pa.array(keys == key))
        out.append(((split, int(shard)), _ipc(part)))
    return out


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(io.BytesIO(blob)).read_all()


def sorted_rows(tables: list[pa.Table]) -> pa.Table:
    """One shard's rows: subjects together, static rows first, then by time, code and value (stable bytes)."""
    table = pa.concat_tables(tables) if tables else DATA_SCHEMA.empty_table()
    keys = [(c, "ascending", "at_start") for c in ("subject_id", "time", "code", "numeric_value", "unit", "hadm_id")]
    return table.take(pc.sort_indices(table, sort_keys=keys))


# ----------------------------------------------------------------------------- Beam


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class ConvertTable(beam.DoFn):
    """(table, file) -> MEDS rows by shard, the codes they use, counts and dead letters (every row once)."""

    def __init__(self, discharges, config_dict: dict, block_size_bytes: int = 4 << 20):
        self._discharges = discharges
        self._config_dict = config_dict
        self._block = block_size_bytes

    def setup(self):
        from ehr_pipeline.config import PipelineConfig

        self._config = PipelineConfig.model_validate(self._config_dict)

    def process(self, element):
        from ehr_pipeline.reader import ReaderError, TableReader

        table, path = element
        dead: list = []
        try:
            reader = TableReader(path, table, columns=ev.EXTRACTORS[table][1], on_dead_letter=dead.append,
                                 block_size_bytes=self._block)
            for batch in reader:
                events, extract_counts = ev.extract(table, batch, self._discharges)
                rows = event_rows(events)
                for key_blob in by_shard(rows, self._config):
                    yield ROWS, key_blob
                for code in pc.unique(rows.column("code")).to_pylist():
                    yield CODES, (code, None)
                for reason, n in extract_counts.items():
                    yield COUNTS, count(f"events/{table}/extract/{reason}", n)
                yield COUNTS, count(f"events/{table}/written", rows.num_rows)
                for letter in dead:
                    yield DEAD, (table, letter)
                dead.clear()
        except ReaderError as e:
            yield FATAL, str(e)
            return
        for letter in dead:
            yield DEAD, (table, letter)
        stats = reader.stats
        yield COUNTS, count(f"rows/{table}/read", stats.rows_read)
        yield COUNTS, count(f"rows/{table}/parsed", stats.rows_parsed)
        for reason, n in stats.dead_lettered.items():
            yield COUNTS, count(f"rows/{table}/dead_letter/{reason}", n)


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class WriteMedsShard(beam.DoFn):
    """((split, shard), IPC blobs) -> data/<split>/<shard>.parquet, sorted, written atomically."""

    def __init__(self, out_dir: str):
        self._out = out_dir

    def process(self, element):
        import pyarrow.parquet as pq

        from ehr_pipeline import outputs

        (split, shard), blobs = element
        table = sorted_rows([_from_ipc(b) for b in blobs if b is not None])
        folder = os.path.join(self._out, "data", split)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{shard}.parquet")
        with outputs.created_atomically(path) as f:
            pq.write_table(table, f)
        yield count(f"files/{split}/rows_written", table.num_rows)


class ConvertEvents(beam.PTransform):
    """Event-table files -> tagged MEDS rows by shard, codes, counts, dead letters."""

    def __init__(self, inputs: list[tuple[str, str]], discharges, config_dict: dict):
        super().__init__()
        self._inputs, self._discharges, self._config = sorted(inputs), discharges, config_dict

    def expand(self, p):
        return (
            p
            | "EventFiles" >> beam.Create(self._inputs)
            | "SpreadFiles" >> beam.Reshuffle()
            | "Convert" >> beam.ParDo(ConvertTable(self._discharges, self._config))
        )


class WriteMedsData(beam.PTransform):
    """Tagged rows (events and the driver's task rows) -> one parquet file per (split, shard)."""

    def __init__(self, out_dir: str, task_blobs: list, shards: list[tuple[str, int]]):
        super().__init__()
        self._out, self._task, self._shards = out_dir, task_blobs, shards

    def expand(self, items):
        p = items.pipeline
        return (
            (items | "Rows" >> Select(ROWS), p | "TaskRows" >> beam.Create(self._task).with_output_types(KV),
             p | "AllShards" >> beam.Create([(s, None) for s in self._shards]).with_output_types(KV))
            | "JoinRows" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteMedsShard(self._out))
        )


def run_to_meds(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None = None) -> dict[str, Any]:
    """Converts a MIMIC-III release to a MEDS dataset in out_dir; returns the conversion manifest."""
    from ehr_pipeline import cohort as cohort_mod
    from ehr_pipeline import outputs
    from ehr_pipeline.job import _lab_loinc_bridge, manifest_group, pipeline_options
    from ehr_pipeline.reader import ReaderError, check_header, locate_table, locate_table_files, read_table

    started = time.time()
    mimic_dir, out_dir = outputs.absolute(mimic_dir), outputs.absolute(out_dir)  # as run_job, for every runner
    os.makedirs(out_dir, exist_ok=True)
    inputs = [(t, str(p)) for t in ev.TABLE_SOURCE for p in locate_table_files(mimic_dir, t)]
    for table, path in inputs:
        check_header(path, table)
    dead_driver: list = []
    tables, stats = {}, {}
    for name, columns in (("ADMISSIONS", cohort_mod.ADMISSION_COLUMNS + ("ADMISSION_LOCATION", "DISCHARGE_LOCATION")),
                          ("PATIENTS", cohort_mod.PATIENT_COLUMNS + ("DOD",))):
        tables[name], stats[name] = read_table(locate_table(mimic_dir, name), name, columns=columns,
                                               on_dead_letter=lambda d, n=name: dead_driver.append((n, d)))
    coh = cohort_mod.build_cohort(tables["ADMISSIONS"], tables["PATIENTS"],
                                  trigger_offset_seconds=config.trigger_offset_seconds,
                                  min_age_years=config.min_age_years)
    task, task_counts = task_rows(tables["ADMISSIONS"], tables["PATIENTS"])
    cfg = config.to_dict()
    shards = [(MEDS_SPLITS[s], k) for s in MEDS_SPLITS for k in range(cfg["num_shards"][s])]
    tmp = os.path.join(out_dir, outputs.TMP_DIR)
    os.makedirs(tmp, exist_ok=True)

    def to_file(name):
        def write(items):
            outputs.write_json(os.path.join(tmp, name), sorted(items))
            return name
        return write

    p = beam.Pipeline(options=pipeline_options(beam_args or []))
    items = p | "ConvertEvents" >> ConvertEvents(inputs, coh.discharges, cfg)
    written = items | "WriteMedsData" >> WriteMedsData(out_dir, by_shard(task, config), shards)
    dead = (items,) | "WriteDeadLetters" >> WriteDeadLetters(out_dir)
    counts = ((items | "Counts" >> Select(COUNTS), written, dead) | "AllCounts" >> beam.Flatten()
              | "Sum" >> beam.CombinePerKey(sum) | "CountsList" >> beam.combiners.ToList()
              | "WriteCounts" >> beam.Map(to_file("counts.json")))
    codes = (items | "Codes" >> Select(CODES) | "DistinctCodes" >> beam.CombinePerKey(lambda _: None)
             | "CodeList" >> beam.combiners.ToList() | "WriteCodes" >> beam.Map(to_file("codes.json")))
    errors = (items | "Fatal" >> beam.FlatMap(select(FATAL)) | "ErrorList" >> beam.combiners.ToList()
              | "WriteErrors" >> beam.Map(to_file("errors.json")))
    _ = (counts, codes, errors) | "Finish" >> beam.Flatten()
    p.run().wait_until_finish()

    found_errors = outputs.read_json(os.path.join(tmp, "errors.json"))
    if found_errors:
        raise ReaderError(found_errors[0])
    counts_found = dict(outputs.read_json(os.path.join(tmp, "counts.json")))
    data_codes = {c for c, _ in outputs.read_json(os.path.join(tmp, "codes.json"))}
    data_codes |= set(task.column("code").to_pylist())
    write_code_metadata(out_dir, mimic_dir, sorted(data_codes), _lab_loinc_bridge(mimic_dir, dead_driver))
    write_subject_splits(out_dir, tables, config)
    write_dataset_metadata(out_dir, mimic_dir)
    from ehr_pipeline.deadletter import write_dead_letter_files

    write_dead_letter_files(out_dir, dead_driver)
    manifest = conversion_manifest(counts_found, task_counts, stats, sorted({t for t, _ in inputs}), mimic_dir,
                                   manifest_group)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)  # MEDS readers glob the dataset folder: leave only MEDS in it
    manifest["seconds"] = round(time.time() - started, 3)
    outputs.write_json(os.path.join(out_dir, MANIFEST), manifest)
    return manifest


def conversion_manifest(counts: dict, task_counts: dict, stats: dict, event_tables: list[str], mimic_dir: str,
                        group) -> dict[str, Any]:
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
        if extract.get(ev.KEPT, 0) != written:
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
    import pyarrow.parquet as pq

    descriptions = _descriptions(mimic_dir)
    loinc_of = {item: code for code, items in lab_bridge.items() for item in items}
    mapper = meds_codes.CodeMapper(meds_codes.MedsCodes())
    desc, parents = [], []
    for code in codes:
        mapped = mapper(code)
        text = mapped.code if mapped.kind == meds_codes.EVENT else None
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
    import csv
    import gzip

    from ehr_pipeline.reader import locate_table

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
    for name in (f"{table}.csv.gz", f"{table}.csv"):
        path = os.path.join(mimic_dir, name)
        if os.path.isfile(path):
            return path
    return None


def write_subject_splits(out_dir: str, tables: dict, config) -> None:
    """metadata/subject_splits.parquet: every patient's split (the project's assignment, MEDS names)."""
    import pyarrow.parquet as pq

    subjects = np.unique(np.concatenate([tables["PATIENTS"].column("SUBJECT_ID").to_numpy(),
                                         tables["ADMISSIONS"].column("SUBJECT_ID").to_numpy()]).astype(np.int64))
    names, _ = subject_place(subjects, config)
    pq.write_table(pa.table({"subject_id": pa.array(subjects, pa.int64()), "split": pa.array(names, pa.string())}),
                   os.path.join(out_dir, "metadata", "subject_splits.parquet"))


def write_dataset_metadata(out_dir: str, mimic_dir: str) -> None:
    """metadata/dataset.json (MEDS DatasetMetadataSchema): no creation time, so reruns write the same bytes."""
    from ehr_pipeline import __version__

    doc = {"dataset_name": os.path.basename(os.path.normpath(mimic_dir)) or "MIMIC-III",
           "dataset_version": "MIMIC-III v1.4 layout", "etl_name": ETL_NAME, "etl_version": __version__,
           "meds_version": MEDS_VERSION}
    with open(os.path.join(out_dir, "metadata", "dataset.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
