"""The Beam job: MIMIC-III tables -> one bagged SequenceExample per cohort admission.

Shape of the pipeline (every arrow a PCollection):

  driver: ADMISSIONS + PATIENTS -> cohort (small: ~60k admissions in the full release)
  (table, file) --ReadAndExtract--> (hadm_id, event chunk)      [+ dead letters, counts]
  cohort rows  --------------------> (hadm_id, cohort row)
        \\-- Flatten -> GroupByKey(hadm_id) -> BagAdmission -> (split, shard, hadm, record)
                                                           [+ train-split code stats, counts]
  records -> GroupByKey(split, shard) -> WriteShard (sorted by hadm_id: byte-identical reruns)
  code stats -> CombinePerKey -> vocabulary.json, numeric_stats.json
  counts -> CombinePerKey(sum) -> the manifest (written by the driver after the run)

Each worker parses whole blocks of a CSV file with pyarrow and drops events of patients
outside the cohort and at or after their trigger BEFORE the shuffle, so the grouped state is
only what reaches an example, packed as one bytes object per (block, admission) chunk.
"""
from __future__ import annotations

import logging
import struct
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Counters are keyed "stage/source/reason"; they also land in the manifest.
# Every DoFn emits (kind, payload) pairs on ONE output and consumers select their kind:
# the Dask runner does not route Beam's tagged outputs (all tags reach every consumer).
EVENTS = "events"
RECORDS = "records"
COUNTS = "counts"
DEAD = "dead"
STATS = "stats"
UNITS = "units"
FATAL = "fatal"  # a file that cannot be read: its one-line error, raised by the driver after the run


def select(kind: str):
    """A FlatMap function keeping the payloads of one kind."""
    def keep(item):
        if item[0] == kind:
            yield item[1]
    return keep


# One admission's events from one block, packed for the shuffle as ONE bytes object. The local
# runner's GroupByKey keeps every grouped value as a decoded Python object, so a chunk made of
# arrays, tuples and one str per code costs hundreds of bytes of object headers; a single
# bytes value costs one. Layout (little-endian):
#   header <q t0 seconds, B time width (4|8), B index width (2|4), I events, I codes, I code-blob bytes>
#   code blob (codes joined by NUL), time deltas, code indices, float64 values
EventChunk = bytes
_HEADER = struct.Struct("<qBBIII")
_T_DTYPES = {4: "<u4", 8: "<i8"}
_I_DTYPES = {2: "<u2", 4: "<i4"}


def pack_chunk(times: np.ndarray, codes: np.ndarray, values: np.ndarray) -> EventChunk:
    """Packs (times s, codes, values) compactly: time deltas and small code indices, exact values."""
    uniq, inv = np.unique(np.asarray(codes, dtype=np.str_), return_inverse=True)
    times = np.asarray(times, dtype=np.int64)
    t0 = int(times.min()) if times.size else 0
    delta = times - t0
    t_width = 4 if times.size == 0 or int(delta.max()) < 2**32 else 8
    i_width = 2 if len(uniq) < 2**16 else 4
    blob = "\0".join(str(c) for c in uniq).encode("utf-8")
    if blob.count(b"\0") != max(len(uniq) - 1, 0):
        raise ValueError(f"an event code contains a NUL character: {[c for c in uniq if chr(0) in c][:3]}")
    return b"".join((
        _HEADER.pack(t0, t_width, i_width, times.size, len(uniq), len(blob)), blob,
        delta.astype(_T_DTYPES[t_width]).tobytes(), inv.astype(_I_DTYPES[i_width]).tobytes(),
        np.asarray(values, dtype="<f8").tobytes()))


def unpack_chunk(chunk: EventChunk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of pack_chunk: (times int64 s, codes fixed-width str array, values float64)."""
    t0, t_width, i_width, n, n_codes, blob_len = _HEADER.unpack_from(chunk)
    pos = _HEADER.size
    # Fixed-width str from here on: ordering, bagging and statistics then use it without a copy.
    codes = np.asarray(chunk[pos:pos + blob_len].decode("utf-8").split("\0") if n_codes else [], dtype=np.str_)
    pos += blob_len
    times = np.frombuffer(chunk, _T_DTYPES[t_width], n, pos).astype(np.int64) + t0
    pos += n * t_width
    index = np.frombuffer(chunk, _I_DTYPES[i_width], n, pos)
    pos += n * i_width
    values = np.frombuffer(chunk, "<f8", n, pos).copy()
    return times, codes[index], values


def concat_chunks(chunks: list[EventChunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unpacks and concatenates chunks into (times, codes, values) arrays."""
    if not chunks:
        return np.zeros(0, np.int64), np.zeros(0, np.str_), np.zeros(0, np.float64)
    parts = [unpack_chunk(c) for c in chunks]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def _counter(name: str):
    from apache_beam.metrics import Metrics

    return Metrics.counter("ehr_pipeline", name)


def _count(name: str, n: int):
    """Bumps a Beam counter and returns the (name, n) pair that also flows into the manifest."""
    if n:
        _counter(name).inc(int(n))
    return name, int(n)


# ----------------------------------------------------------------------------- DoFns


def _make_dofns():
    """The job's DoFns, defined inside a function so importing this module needs no Beam."""
    import apache_beam as beam
    from ehr_pipeline import events as ev
    from ehr_pipeline.reader import ReaderError, TableReader

    class _ReadAndExtract(beam.DoFn):
        def __init__(self, cohort_table, discharges, block_size_bytes: int):
            self._cohort = cohort_table
            self._discharges = discharges
            self._block = block_size_bytes

        def process(self, element):
            table, path = element
            try:
                yield from self._read(table, path)
            except ReaderError as e:
                # Raised here it would reach the driver as a runner-specific traceback (or
                # not at all); as an output it becomes the driver's one-line error.
                yield FATAL, str(e)

        def _read(self, table, path):
            dead: list = []
            _, columns = ev.EXTRACTORS[table]
            unit_column = ev.UNIT_COLUMNS[table][1:] if table in ev.UNIT_COLUMNS else ()
            reader = TableReader(path, table, columns=columns + unit_column, on_dead_letter=dead.append,
                                 block_size_bytes=self._block)
            for batch in reader:
                events, extract_counts = ev.extract(table, batch, self._discharges)
                for pair, n in ev.unit_counts(table, batch).items():
                    yield UNITS, (pair, n)
                kept, cohort_counts = ev.filter_to_cohort(events, self._cohort)
                for hadm, times, codes, values in ev.split_by_admission(kept):
                    yield EVENTS, (hadm, pack_chunk(times, codes, values))
                for reason, n in extract_counts.items():
                    yield (COUNTS, _count(f"events/{table}/extract/{reason}", n))
                for reason, n in cohort_counts.items():
                    yield (COUNTS, _count(f"events/{table}/cohort/{reason}", n))
                for letter in dead:
                    yield (DEAD, (table, letter))
                dead.clear()
            # Rows rejected after the last block (the file's last lines) come after the loop.
            for letter in dead:
                yield (DEAD, (table, letter))
            stats = reader.stats
            yield (COUNTS, _count(f"rows/{table}/read", stats.rows_read))
            yield (COUNTS, _count(f"rows/{table}/parsed", stats.rows_parsed))
            for reason, n in stats.dead_lettered.items():
                yield (COUNTS, _count(f"rows/{table}/dead_letter/{reason}", n))

    class _BagAdmission(beam.DoFn):
        def __init__(self, config_dict: dict):
            self._config_dict = config_dict

        def setup(self):
            from ehr_pipeline.config import PipelineConfig

            self._config = PipelineConfig.model_validate(self._config_dict)

        def process(self, element):
            from ehr_pipeline import bagging, spec, splits, vocab

            hadm, items = element
            meta, chunks = None, []
            for item in items:  # the cohort row (a dict) and the event chunks (bytes)
                if isinstance(item, dict):
                    meta = item
                else:
                    chunks.append(item)
            if meta is None:  # cannot happen: filter_to_cohort only keys cohort admissions
                yield (COUNTS, _count("examples/orphan_events", len(chunks)))
                return
            cfg = self._config
            # Bags do not depend on the event order, but the code statistics sum floats over
            # events: the canonical order keeps them independent of the shuffle's chunk order.
            times, codes, values = bagging.canonical_order(*concat_chunks(chunks))
            bags = bagging.bag_events(times, codes, values, meta["trigger_time"], cfg.bagging)
            context = {
                spec.SUBJECT_ID: meta["SUBJECT_ID"], spec.HADM_ID: hadm, spec.LABEL: meta["label"],
                spec.TRIGGER_TIME: meta["trigger_time"], spec.ADMIT_OFFSET: meta["trigger_time"] - meta["ADMITTIME"],
                spec.AGE_YEARS: meta["age_years"],
                spec.GENDER: meta["gender"], spec.ADMISSION_TYPE: meta["admission_type"],
            }
            record = spec.make_sequence_example(context, bags).SerializeToString(deterministic=True)
            split = splits.assign_split(meta["SUBJECT_ID"], cfg.splits.model_dump(), cfg.split_salt)
            shard = splits.shard_of(hadm, getattr(cfg.num_shards, split))
            yield RECORDS, ((split, shard), (hadm, record))
            yield (COUNTS, _count(f"examples/{split}/written", 1))
            yield (COUNTS, _count(f"examples/{split}/positive", meta["label"]))
            yield (COUNTS, _count("bagging/events_in", times.size))
            yield (COUNTS, _count("bagging/used", bags.n_events_used))
            for reason, n in bags.n_dropped_by_reason.items():
                yield (COUNTS, _count(f"bagging/dropped/{reason}", n))
            if split == "train":
                for code, st in vocab.example_code_stats(codes, values).items():
                    yield (STATS, (code, st))

    class _WriteShard(beam.DoFn):
        def __init__(self, out_dir: str, config_dict: dict):
            self._out = out_dir
            self._config_dict = config_dict

        def process(self, element):
            from apache_beam.io.filesystems import FileSystems

            from ehr_pipeline import outputs, spec, tfrecord

            (split, shard), items = element
            records = sorted((kv for kv in items if kv is not None), key=lambda kv: kv[0])
            n_shards = self._config_dict["num_shards"][split]
            name = spec.shard_file_name(split, shard, n_shards)
            path = outputs.join(self._out, name)
            tmp = path + ".inprogress"
            with FileSystems.create(tmp) as f:
                n = tfrecord.write_records(f, (r for _, r in records))
            if FileSystems.exists(path):
                FileSystems.delete([path])
            FileSystems.rename([tmp], [path])
            yield _count(f"files/{split}/records_written", n)

    class _WriteDeadLetters(beam.DoFn):
        def __init__(self, out_dir: str):
            self._out = out_dir

        def process(self, element):
            from ehr_pipeline import outputs

            table, letters = element
            letters = sorted(letters, key=lambda d: (d.file, d.line))
            body = "".join(d.to_json() + "\n" for d in letters).encode("utf-8")
            outputs.write_bytes(outputs.join(self._out, outputs.DEAD_LETTER_DIR, f"{table}.jsonl"), body)
            yield _count(f"dead_letters_written/{table}", len(letters))

    return _ReadAndExtract, _BagAdmission, _WriteShard, _WriteDeadLetters


# ----------------------------------------------------------------------------- driver

COHORT_TABLES = ("ADMISSIONS", "PATIENTS")
DEFAULT_RUNNER = "FnApiRunner"  # in-process and local: nothing to download (see README)
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


def pipeline_options(beam_args: list[str]):
    """Beam options from command-line style args, defaulting to the local FnApiRunner."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    beam_args = list(beam_args)
    if any("DaskRunner" in a for a in beam_args):
        # Beam knows the Dask runner only by its full name, and parses --dask_* flags only
        # once its options class has been imported.
        from apache_beam.runners.dask import dask_runner

        beam_args = [f"--runner={DASK_RUNNER}" if a in ("--runner=DaskRunner",) else a for a in beam_args]
        del dask_runner
    options = PipelineOptions(beam_args)
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    return options


def _read_cohort_tables(mimic_dir: str, dead: list) -> tuple[dict, dict]:
    from ehr_pipeline import cohort
    from ehr_pipeline.reader import locate_table, read_table

    tables, stats = {}, {}
    for name, columns in (("ADMISSIONS", cohort.ADMISSION_COLUMNS), ("PATIENTS", cohort.PATIENT_COLUMNS)):
        path = locate_table(mimic_dir, name)
        tables[name], stats[name] = read_table(
            path, name, columns=columns, on_dead_letter=lambda d, n=name: dead.append((n, d)))
    return tables, stats


def run_job(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None = None) -> dict[str, Any]:
    """Runs the whole job and writes the manifest; returns the manifest dict.

    Local mimic_dir / out_dir may be relative: they are made absolute against this process's working
    directory before the pipeline is built, whatever the runner (the manifest records the absolute path).
    """
    import time

    import apache_beam as beam

    from ehr_pipeline import cohort as cohort_mod
    from ehr_pipeline import events as ev
    from ehr_pipeline import outputs, spec, vocab
    from ehr_pipeline.config import SPLIT_NAMES
    from ehr_pipeline.reader import ReaderError, check_header, locate_table_files

    started = time.time()
    # Before anything reaches a runner: a worker resolves a relative path against its own working
    # directory (a Dask worker's is where it was started), so it would read or write elsewhere.
    mimic_dir, out_dir = outputs.absolute(mimic_dir), outputs.absolute(out_dir)
    log.info("input %s, output %s", mimic_dir, out_dir)
    cfg_dict = config.to_dict()

    # Locate every table first: a missing required table fails before any work is done.
    enabled = set(config.sources)
    event_inputs = []
    for table, source in ev.TABLE_SOURCE.items():
        if source in enabled:
            event_inputs.extend((table, str(path)) for path in locate_table_files(mimic_dir, table))
    for table, path in event_inputs:  # empty files and missing columns fail before any work
        check_header(path, table)

    dead_driver: list = []
    cohort_tables, cohort_stats = _read_cohort_tables(mimic_dir, dead_driver)
    coh = cohort_mod.build_cohort(
        cohort_tables["ADMISSIONS"], cohort_tables["PATIENTS"],
        trigger_offset_seconds=config.trigger_offset_seconds, min_age_years=config.min_age_years)
    log.info("cohort: %d of %d admissions kept; excluded %s", coh.counts.get(cohort_mod.KEPT, 0),
             sum(coh.counts.values()), {k: v for k, v in coh.counts.items() if k != cohort_mod.KEPT and v})
    meta_cols = ("SUBJECT_ID", "HADM_ID", "ADMITTIME", "trigger_time", "label", "age_years", "gender",
                 "admission_type")
    metas = [(r["HADM_ID"], r) for r in coh.table.select(list(meta_cols)).to_pylist()]
    # Only what the workers need to filter events travels with the DoFn.
    cohort_index = coh.table.select(["SUBJECT_ID", "HADM_ID", "trigger_time"])

    ReadAndExtract, BagAdmission, WriteShard, WriteDeadLetters = _make_dofns()
    empty_shards = [((split, shard), None)
                    for split in SPLIT_NAMES for shard in range(cfg_dict["num_shards"][split])]
    tmp_dir = outputs.join(out_dir, outputs.TMP_DIR)

    def write_json_list(items, name):
        outputs.write_json(outputs.join(tmp_dir, name), sorted(items))
        return name

    KV = tuple[Any, Any]  # inferred hints cannot see through select(); the payloads are pairs
    options = pipeline_options(beam_args or [])
    p = beam.Pipeline(options=options)
    extracted = (
        p
        | "EventFiles" >> beam.Create(sorted(event_inputs))
        # One file is one unit of work: gzip cannot be split, and a reshuffle spreads files.
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadAndExtract" >> beam.ParDo(ReadAndExtract(cohort_index, coh.discharges, 4 << 20))
    )
    chunks = extracted | "Chunks" >> beam.FlatMap(select(EVENTS)).with_output_types(KV)
    cohort_rows = p | "CohortRows" >> beam.Create(metas)
    bagged = (
        (chunks, cohort_rows)
        | "JoinAdmission" >> beam.Flatten()
        | "GroupByAdmission" >> beam.GroupByKey()
        | "Bag" >> beam.ParDo(BagAdmission(cfg_dict))
    )
    records = bagged | "Records" >> beam.FlatMap(select(RECORDS)).with_output_types(KV)
    written = (
        (records, p | "AllShards" >> beam.Create(empty_shards).with_output_types(KV))
        | "JoinShards" >> beam.Flatten()
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(out_dir, cfg_dict))
    )
    dead_written = (
        extracted
        | "DeadLetters" >> beam.FlatMap(select(DEAD)).with_output_types(KV)
        | "GroupDeadLetters" >> beam.GroupByKey()
        | "WriteDeadLetters" >> beam.ParDo(WriteDeadLetters(out_dir))
    )
    counts_done = (
        (extracted | "ExtractCounts" >> beam.FlatMap(select(COUNTS)),
         bagged | "BagCounts" >> beam.FlatMap(select(COUNTS)), written, dead_written)
        | "AllCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombinePerKey(sum)
        | "CountsList" >> beam.combiners.ToList()
        | "WriteCounts" >> beam.Map(write_json_list, "counts.json")
    )
    def combined_to_tmp(source, label: str, kind: str, combine, name: str):
        """Payloads of one kind, combined per key and written to _tmp/name as one sorted list."""
        return (
            source
            | label >> beam.FlatMap(select(kind)).with_output_types(KV)
            | f"Sum{label}" >> beam.CombinePerKey(combine)
            | f"{label}List" >> beam.combiners.ToList()
            | f"Write{label}" >> beam.Map(write_json_list, name)
        )

    stats_done = combined_to_tmp(bagged, "Stats", STATS, _combine_stats, "code_stats.json")
    units_done = combined_to_tmp(extracted, "Units", UNITS, sum, "units.json")
    errors_done = (
        extracted
        | "Fatal" >> beam.FlatMap(select(FATAL))
        | "ErrorsList" >> beam.combiners.ToList()
        | "WriteErrors" >> beam.Map(write_json_list, "errors.json")
    )
    # One final sink that depends on every branch: the Dask runner computes only the
    # last transform's graph, so a branch left dangling would silently never run.
    _ = (counts_done, stats_done, units_done, errors_done) | "Finish" >> beam.Flatten()
    result = p.run()
    result.wait_until_finish()
    # The Dask runner opens its own client and never closes it; left open, it keeps trying
    # to reconnect after the cluster is gone and floods the log.
    client = getattr(result, "client", None)
    if client is not None:
        client.close()

    errors = outputs.read_json(outputs.join(tmp_dir, "errors.json"))
    if errors:
        raise ReaderError(errors[0] if len(errors) == 1 else f"{errors[0]} (and {len(errors) - 1} more file(s))")
    counts = dict(outputs.read_json(outputs.join(tmp_dir, "counts.json")))
    stats = {code: tuple(st) for code, st in outputs.read_json(outputs.join(tmp_dir, "code_stats.json"))}
    vocabulary = vocab.build_vocabulary(stats, config.vocab.min_count, config.vocab.max_size_per_source)
    outputs.write_json(outputs.join(out_dir, outputs.VOCABULARY), {
        "schema_version": spec.SCHEMA_VERSION, "sources": vocabulary,
        "min_count": config.vocab.min_count, "built_on": "train"})
    outputs.write_json(outputs.join(out_dir, outputs.NUMERIC_STATS), {
        "schema_version": spec.SCHEMA_VERSION, "clip_z": config.numeric.clip_z,
        "codes": vocab.normalisation_stats(stats), "built_on": "train"})
    _write_lab_loinc(mimic_dir, out_dir, dead_driver)
    units: dict[str, dict[str, int]] = {}
    for (code, unit), n in outputs.read_json(outputs.join(tmp_dir, "units.json")):
        units.setdefault(code, {})[unit] = n
    outputs.write_json(outputs.join(out_dir, outputs.UNITS), {
        "schema_version": spec.SCHEMA_VERSION, "codes": dict(sorted(units.items())),
        "note": "rows with a numeric value per unit as written in the release"})
    _write_driver_dead_letters(out_dir, dead_driver)
    from ehr_pipeline import manifest as manifest_mod

    manifest = manifest_mod.build_manifest(
        out_dir=out_dir, mimic_dir=mimic_dir, config=config, counts=counts, cohort=coh,
        cohort_stats=cohort_stats, event_tables=sorted({t for t, _ in event_inputs}),
        vocabulary=vocabulary, seconds=time.time() - started, runner=str(
            options.get_all_options().get("runner")))
    outputs.write_json(outputs.join(out_dir, outputs.MANIFEST), manifest)
    return manifest


def _write_lab_loinc(mimic_dir: str, out_dir: str, dead: list) -> None:
    """lab_loinc.json: LOINC -> lab ITEMIDs from D_LABITEMS (empty without it), shipped with every export."""
    from ehr_pipeline import outputs, spec
    from ehr_pipeline.fhir import codes
    from ehr_pipeline.reader import locate_table, read_table

    path = locate_table(mimic_dir, "D_LABITEMS")
    bridge: dict[str, list[str]] = {}
    if path is not None:
        table, _ = read_table(path, "D_LABITEMS", columns=("ITEMID", "LOINC_CODE"),
                              on_dead_letter=lambda d: dead.append(("D_LABITEMS", d)))
        bridge = codes.lab_loinc_bridge(table.to_pylist())
    outputs.write_json(outputs.join(out_dir, outputs.LAB_LOINC), {
        "schema_version": spec.SCHEMA_VERSION, "system": codes.LOINC, "source": "D_LABITEMS.LOINC_CODE",
        "codes": bridge})


def _combine_stats(values):
    from ehr_pipeline import vocab

    total = vocab.ZERO
    for v in values:
        total = vocab.add_stats(total, v)
    return total


def _write_driver_dead_letters(out_dir: str, dead: list) -> None:
    from ehr_pipeline import outputs

    by_table: dict[str, list] = {}
    for table, letter in dead:
        by_table.setdefault(table, []).append(letter)
    for table, letters in by_table.items():
        body = "".join(d.to_json() + "\n" for d in letters).encode("utf-8")
        outputs.write_bytes(outputs.join(out_dir, outputs.DEAD_LETTER_DIR, f"{table}.jsonl"), body)
