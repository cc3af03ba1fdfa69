"""The Beam job's parts: sources -> events -> bagging -> writing, each a named composite PTransform.

    items    = p | MimicSource(...)  or  p | MedsSource(...)   # tagged (kind, payload) items
    bagged   = items | BagExamples(config, loinc, reference_units)
    written  = bagged | WriteExamples(out_dir, config)
    ...      counts, dead letters, statistics -> files (job.run_job reads them back)

A source yields, on ONE PCollection, ``(kind, payload)`` pairs: ``EXAMPLE`` (example key, [its
cohort row (a dict), its event chunks (bytes)]), ``UNITS`` ((code, unit), (rows, magnitude
sketch)) for the unit census, ``COUNTS`` (name, n), ``DEAD`` (file, dead letter) and ``FATAL``
(a one-line error). Both sources emit the same examples, so everything after them is shared. One output with kinds rather
than Beam's tagged outputs: the Dask runner does not route tagged outputs (all tags reach every
consumer).

Every counter lives in one namespace (``ehr_pipeline``), named ``stage/source/reason``; the same
(name, n) pairs flow into the manifest, so a record dropped anywhere is counted by reason.
"""
from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from ehr_pipeline import magnitudes, meds_labels, meds_source, outputs
from ehr_pipeline import units as units_mod  # 'units' names the events' unit arrays here
from ehr_pipeline.chunks import concat_chunks, pack_chunk

NAMESPACE = "ehr_pipeline"
EXAMPLE = "example"
EVENTS = "events"
RECORDS = "records"
COUNTS = "counts"
DEAD = "dead"
STATS = "stats"
UNITS = "units"
FATAL = "fatal"  # a file that cannot be read: its one-line error, raised by the driver after the run
# Values not used because of their unit (units.NOT_USED: not convertible, ambiguous, a placeholder,
# an implausible conversion): one dead-letter file, each line with its reason.
DEAD_VALUES = "values_not_convertible"

Tagged = tuple[str, Any]
KV = tuple[Any, Any]


def count(name: str, n: int) -> tuple[str, int]:
    """Bumps a Beam counter and returns the (name, n) pair that also flows into the manifest."""
    if n:
        Metrics.counter(NAMESPACE, name).inc(int(n))
    return name, int(n)


def select(kind: str):
    """A FlatMap function keeping the payloads of one kind."""
    def keep(item):
        if item[0] == kind:
            yield item[1]
    return keep


class Select(beam.PTransform):
    """The payloads of one kind of a tagged PCollection."""

    def __init__(self, kind: str):
        super().__init__()
        self._kind = kind

    def expand(self, items):
        return items | beam.FlatMap(select(self._kind)).with_output_types(KV)


# ----------------------------------------------------------------------------- the MIMIC-III source


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class ReadMimicTable(beam.DoFn):
    """(table, file) -> the events of cohort admissions before their trigger, as chunks; counts and dead letters."""

    def __init__(self, cohort_index, discharges, block_size_bytes: int):
        self._cohort = cohort_index
        self._discharges = discharges
        self._block = block_size_bytes

    def process(self, element):
        from ehr_pipeline.reader import ReaderError

        table, path = element
        try:
            yield from self._read(table, path)
        except ReaderError as e:
            # Raised here it would reach the driver as a runner-specific traceback (or not at
            # all); as an output it becomes the driver's one-line error.
            yield FATAL, str(e)

    def _read(self, table: str, path: str):
        from ehr_pipeline import events as ev
        from ehr_pipeline.reader import TableReader

        dead: list = []
        _, columns = ev.EXTRACTORS[table]
        reader = TableReader(path, table, columns=columns, on_dead_letter=dead.append, block_size_bytes=self._block)
        for batch in reader:
            events, extract_counts = ev.extract(table, batch, self._discharges)
            for pair, tally in ev.unit_counts(events).items():
                yield UNITS, (pair, tally)
            kept, cohort_counts = ev.filter_to_cohort(events, self._cohort)
            for hadm, times, codes, values, units in ev.split_by_admission(kept):
                yield EVENTS, (hadm, pack_chunk(times, codes, values, units))
            yield from _counted(f"events/{table}/extract", extract_counts)
            yield from _counted(f"events/{table}/cohort", cohort_counts)
            for letter in dead:
                yield DEAD, (table, letter)
            dead.clear()
        # Rows rejected after the last block (the file's last lines) come after the loop.
        for letter in dead:
            yield DEAD, (table, letter)
        stats = reader.stats
        yield COUNTS, count(f"rows/{table}/read", stats.rows_read)
        yield COUNTS, count(f"rows/{table}/parsed", stats.rows_parsed)
        yield from _counted(f"rows/{table}/dead_letter", stats.dead_lettered)


def _counted(prefix: str, counts: dict[str, int]):
    for reason, n in counts.items():
        yield COUNTS, count(f"{prefix}/{reason}", n)


class MimicSource(beam.PTransform):
    """MIMIC-III event files -> tagged items: each cohort admission's row and chunks grouped as one EXAMPLE.

    The cohort (ADMISSIONS, PATIENTS) is built by the driver; each worker reads whole files, keeps
    the events of cohort admissions before their trigger and packs them, so the shuffle carries only
    what reaches an example.
    """

    def __init__(self, event_inputs: list[tuple[str, str]], cohort_index, discharges, metas: list,
                 block_size_bytes: int = 4 << 20):
        super().__init__()
        self._inputs = sorted(event_inputs)
        self._cohort, self._discharges, self._metas = cohort_index, discharges, metas
        self._block = block_size_bytes

    def expand(self, p):
        extracted = (
            p
            | "EventFiles" >> beam.Create(self._inputs)
            # One file is one unit of work: gzip cannot be split, and a reshuffle spreads files.
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadTables" >> beam.ParDo(ReadMimicTable(self._cohort, self._discharges, self._block))
        )
        examples = (
            (extracted | "Chunks" >> Select(EVENTS), p | "CohortRows" >> beam.Create(self._metas).with_output_types(KV))
            | "JoinAdmission" >> beam.Flatten()
            | "GroupByAdmission" >> beam.GroupByKey()
            | "TagExamples" >> beam.Map(lambda kv: (EXAMPLE, kv)).with_output_types(Tagged)
        )
        others = extracted | "NotChunks" >> beam.Filter(lambda item: item[0] != EVENTS).with_output_types(Tagged)
        return (examples, others) | "SourceItems" >> beam.Flatten()


# ----------------------------------------------------------------------------- the MEDS source


# The MEDS source's own kinds, consumed inside MedsSource: a data file's distinct subjects (path, ids) and
# a labelled example's (key, subject, prediction time in microseconds).
SUBJECTS = "subjects"
PREDICTION_TIME = "prediction_time"


@beam.typehints.with_input_types(str)
@beam.typehints.with_output_types(Tagged)
class ReadMedsFile(beam.DoFn):
    """One MEDS data file -> its subjects' examples (cohort row and chunk together), unit census, counts,
    dead letters, prediction times, and the file's distinct subjects."""

    def __init__(self, reader_config: dict):
        self._config_dict = reader_config

    def setup(self):
        self._reader = meds_source.MedsReader.from_dict(self._config_dict)

    def process(self, path: str):
        try:
            subjects = []
            for out in self._reader.read_file(path):
                subjects.append(out.subjects)
                yield from _meds_items(out)
            yield SUBJECTS, (path, np.unique(np.concatenate(subjects)) if subjects else np.zeros(0, np.int64))
        except meds_source.MedsError as e:
            yield FATAL, str(e)


def _meds_items(out):
    """The tagged items of one meds_source.SubjectsOut (but its subjects)."""
    for key, meta, times, codes, values, units in out.examples:
        items = [meta] + ([pack_chunk(times, codes, values, units)] if times.size else [])
        yield EXAMPLE, (key, items)
    for pair, tally in out.units.items():
        yield UNITS, (pair, tally)
    for name, n in out.counts.items():
        yield COUNTS, count(name, n)
    for letter in out.dead:
        yield DEAD, (meds_source.TABLE, letter)
    for row in out.prediction_times:
        yield PREDICTION_TIME, row


def _split_subject_errors(per_file):
    """(FATAL, one line) when a subject's rows lie in two data files (meds_source.subjects_in_two_files)."""
    problem = meds_source.subjects_in_two_files(per_file)
    if problem:
        yield FATAL, problem


class MedsSource(beam.PTransform):
    """MEDS data files -> tagged items like MimicSource's; a subject's rows are in one file, read whole.

    The task (built in, or label rows) is computed per subject by the worker that reads its file, so
    examples leave the source complete: no shuffle is needed to join them. Each file's distinct subject
    ids meet in one list (one id per subject, not per row), where a subject found in two files is a
    FATAL error; with `prediction_times` (a path), the labelled examples' exact prediction times are
    written there (meds_labels.PREDICTION_TIMES) and counted as labels/prediction_times_written. Both
    come back as items of the source, so every branch ends in the job's one final sink.
    """

    def __init__(self, files: list[str], reader_config: dict, prediction_times: str | None = None):
        super().__init__()
        self._files = sorted(files)
        self._config = reader_config
        self._prediction_times = prediction_times

    def expand(self, p):
        read = (
            p
            | "MedsFiles" >> beam.Create(self._files)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadMedsFiles" >> beam.ParDo(ReadMedsFile(self._config))
        )
        own = (SUBJECTS, PREDICTION_TIME)
        rest = read | "SourceItems" >> beam.Filter(lambda item: item[0] not in own).with_output_types(Tagged)
        split = (
            read
            | "SubjectsOfFiles" >> beam.FlatMap(select(SUBJECTS))
            | "AllFiles" >> beam.combiners.ToList()
            | "OneFilePerSubject" >> beam.FlatMap(_split_subject_errors).with_output_types(Tagged)
        )
        if self._prediction_times is None:
            return (rest, split) | "MedsItems" >> beam.Flatten()
        path = self._prediction_times

        def write(rows):
            outputs.write_bytes(path, meds_labels.prediction_times_table(rows))
            return COUNTS, count("labels/prediction_times_written", len(rows))

        times = (
            read
            | "PredictionTimes" >> beam.FlatMap(select(PREDICTION_TIME))
            | "AllPredictionTimes" >> beam.combiners.ToList()
            | "WritePredictionTimes" >> beam.Map(write).with_output_types(Tagged)
        )
        return (rest, split, times) | "MedsItems" >> beam.Flatten()


# ----------------------------------------------------------------------------- bagging


@beam.typehints.with_input_types(KV, dict)  # the example, then the unit plan (a side input)
@beam.typehints.with_output_types(Tagged)
class BagExample(beam.DoFn):
    """(example key, [cohort row, event chunks]) -> its SequenceExample record, counts, code statistics."""

    def __init__(self, config_dict: dict):
        self._config_dict = config_dict

    def setup(self):
        from ehr_pipeline.config import PipelineConfig

        self._config = PipelineConfig.model_validate(self._config_dict)
        self._converter = units_mod.Converter()  # one per worker: its cache outlives bundles
        self._plan_seen, self._harmoniser = None, None

    def _harmoniser_for(self, plan: dict):
        if plan is not self._plan_seen:
            self._plan_seen = plan
            self._harmoniser = units_mod.Harmoniser(plan["canonical"], plan["loinc"], self._converter,
                                                medians=plan.get("medians"), unit_medians=plan.get("unit_medians"))
        return self._harmoniser

    def process(self, element, plan):
        from ehr_pipeline import bagging, seqex, spec, splits, vocab

        hadm, items = element
        meta, chunks = None, []
        for item in items:  # the cohort row (a dict) and the event chunks (bytes)
            if isinstance(item, dict):
                meta = item
            else:
                chunks.append(item)
        if meta is None:  # cannot happen: the sources only key events of cohort examples
            yield COUNTS, count("examples/orphan_events", len(chunks))
            return
        cfg = self._config
        times, codes, values, units = concat_chunks(chunks)
        # Values move to their code's canonical unit before anything sums or bags them.
        harmonised = self._harmoniser_for(plan).harmonise(codes, units, values)
        for key, n in harmonised.counts(codes).items():
            yield COUNTS, count(f"units/{key}", n)
        for problem in harmonised.problems:
            yield DEAD, (DEAD_VALUES, _dead_value(meta, hadm, times, codes, values, problem))
        # Bags do not depend on the event order, but the code statistics sum floats over
        # events: the canonical order keeps them independent of the shuffle's chunk order.
        times, codes, values = bagging.canonical_order(times, codes, harmonised.values)
        bags = bagging.bag_events(times, codes, values, meta["trigger_time"], cfg.bagging)
        context = spec.AdmissionContext(
            subject_id=meta["SUBJECT_ID"], hadm_id=hadm, label=meta["label"], trigger_time=meta["trigger_time"],
            admit_offset_seconds=meta["trigger_time"] - meta["ADMITTIME"], age_years=meta["age_years"],
            gender=meta["gender"], admission_type=meta["admission_type"], ethnicity=meta["ethnicity"],
            insurance=meta["insurance"])
        record = seqex.serialize(context, bags)
        # A MEDS dataset names each subject's split (subject_splits.parquet); MIMIC-III's is hashed.
        split = meta.get("split") or splits.assign_split(meta["SUBJECT_ID"], cfg.splits.model_dump(), cfg.split_salt)
        shard = splits.shard_of(hadm, getattr(cfg.num_shards, split))
        yield RECORDS, ((split, shard), (hadm, record))
        yield COUNTS, count(f"examples/{split}/written", 1)
        yield COUNTS, count(f"examples/{split}/positive", meta["label"])
        yield COUNTS, count("bagging/events_in", times.size)
        yield COUNTS, count("bagging/used", bags.n_events_used)
        yield from _counted("bagging/dropped", bags.n_dropped_by_reason)
        if split == "train":
            for code, st in vocab.example_code_stats(codes, values).items():
                yield STATS, (code, st)


def _dead_value(meta: dict, hadm: int, times, codes, values, problem):
    """The dead letter of one value units.Harmoniser did not use (a units.Problem), with its reason."""
    from ehr_pipeline.deadletter import DeadValue

    i = problem.index
    return DeadValue(subject_id=int(meta["SUBJECT_ID"]), hadm_id=int(hadm), time=int(times[i]), code=str(codes[i]),
                     value=float(values[i]), unit=problem.unit, canonical_unit=problem.canonical, detail=problem.why,
                     reason=units_mod.NOT_USED[problem.outcome])


def unit_plan(census: list, loinc: dict, reference: dict | None, reference_medians: dict | None = None) -> dict:
    """The job's unit plan from its census [((code, unit as written), (rows, magnitude sketch))].

    Canonical units, lab LOINCs, each code's training median |value| in its canonical unit (the
    reference's where it gives one, else this release's values recorded in that unit) and the
    typical |value| of every other unit of the code: what the plausibility bound judges.
    """
    converter = units_mod.Converter()
    counts: dict[str, dict[str, int]] = {}
    sketches: dict[str, dict[str, list]] = {}  # code -> unit key -> sketches of its spellings
    for (code, unit), (rows, sketch) in census:
        counts.setdefault(code, {})[unit] = int(rows)
        key = converter.key(unit)
        if key is not None:
            sketches.setdefault(code, {}).setdefault(key, []).append(sketch)
    canonical = units_mod.canonical_units(counts, converter, reference)
    medians: dict[str, float] = {}
    unit_medians: dict[str, dict[str, float]] = {}
    for code, by_key in sorted(sketches.items()):
        canonical_key = converter.key(canonical.get(code))
        for key, found in sorted(by_key.items()):
            typical = magnitudes.typical(magnitudes.merge_sketches(found))
            if typical is None:
                continue
            if key == canonical_key:
                medians[code] = typical
            else:
                unit_medians.setdefault(code, {})[key] = typical
    for code, median in (reference_medians or {}).items():
        if reference is not None and code in reference:
            medians[code] = float(median)  # the model's training data: what its values must land near
    return {"counts": counts, "canonical": canonical, "loinc": dict(loinc), "medians": dict(sorted(medians.items())),
            "unit_medians": unit_medians}


class UnitPlan(beam.PTransform):
    """The census of units -> the one unit plan (canonical unit per code), known once every file is read."""

    def __init__(self, loinc: dict, reference_units: dict | None, reference_medians: dict | None = None):
        super().__init__()
        self._loinc, self._reference, self._medians = loinc, reference_units, reference_medians

    def expand(self, items):
        return (
            items
            | "UnitCensus" >> Select(UNITS)
            | "SumUnitCensus" >> beam.CombinePerKey(magnitudes.merge_tallies)
            | "UnitCensusList" >> beam.combiners.ToList()
            | "Plan" >> beam.Map(unit_plan, self._loinc, self._reference, self._medians)
        )


class BagExamples(beam.PTransform):
    """Source items -> (tagged records, counts, dead values and code statistics; the unit plan)."""

    def __init__(self, config_dict: dict, plan):
        super().__init__()
        self._config, self._plan = config_dict, plan

    def expand(self, items):
        return (
            items
            | "Examples" >> Select(EXAMPLE)
            # The plan reaches every worker as a side input: one small dict each.
            | "Bag" >> beam.ParDo(BagExample(self._config), beam.pvalue.AsSingleton(self._plan))
        )


# ----------------------------------------------------------------------------- writing


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class WriteShard(beam.DoFn):
    """((split, shard), records) -> one TFRecord file, sorted by example key: byte-identical reruns."""

    def __init__(self, out_dir: str, config_dict: dict):
        self._out = out_dir
        self._config_dict = config_dict

    def process(self, element):
        from ehr_pipeline import outputs, spec, tfrecord

        (split, shard), items = element
        records = sorted((kv for kv in items if kv is not None), key=lambda kv: kv[0])
        n_shards = self._config_dict["num_shards"][split]
        with outputs.created_atomically(outputs.join(self._out, spec.shard_file_name(split, shard, n_shards))) as f:
            n = tfrecord.write_records(f, (r for _, r in records))
        yield count(f"files/{split}/records_written", n)


class WriteExamples(beam.PTransform):
    """Tagged bagging output -> every shard file of every split (an empty split still gets its files)."""

    def __init__(self, out_dir: str, config_dict: dict):
        super().__init__()
        self._out, self._config = out_dir, config_dict

    def expand(self, bagged):
        from ehr_pipeline.config import SPLIT_NAMES

        empty = [((split, shard), None) for split in SPLIT_NAMES for shard in range(self._config["num_shards"][split])]
        return (
            (bagged | "Records" >> Select(RECORDS), bagged.pipeline | "AllShards" >> beam.Create(empty).with_output_types(KV))
            | "JoinShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteShard(self._out, self._config))
        )


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class WriteDeadLetterFile(beam.DoFn):
    """(file name, dead letters) -> dead_letter/<name>.jsonl, sorted."""

    def __init__(self, out_dir: str):
        self._out = out_dir

    def process(self, element):
        from ehr_pipeline.deadletter import write_dead_letter_file

        table, letters = element
        yield count(f"dead_letters_written/{table}", write_dead_letter_file(self._out, table, letters))


class WriteDeadLetters(beam.PTransform):
    """Dead letters of any number of tagged PCollections -> one JSONL file per table (or kind of value)."""

    def __init__(self, out_dir: str):
        super().__init__()
        self._out = out_dir

    def expand(self, tagged_pcolls):
        return (
            [pc | f"Dead{i}" >> Select(DEAD) for i, pc in enumerate(tagged_pcolls)]
            | "DeadLetters" >> beam.Flatten()
            | "GroupDeadLetters" >> beam.GroupByKey()
            | "WriteDeadLetters" >> beam.ParDo(WriteDeadLetterFile(self._out))
        )


class ToJsonFile(beam.PTransform):
    """A PCollection -> one JSON file (a sorted list, or the single document with ``single``); yields its name."""

    def __init__(self, path: str, single: bool = False):
        super().__init__()
        self._path, self._single = path, single

    def expand(self, pcoll):
        path, single = self._path, self._single

        def write(items):
            from ehr_pipeline import outputs

            outputs.write_json(path, items if single else sorted(items))
            return path

        if single:
            return pcoll | "Write" >> beam.Map(write)
        return pcoll | "List" >> beam.combiners.ToList() | "Write" >> beam.Map(write)


class SumCounts(beam.PTransform):
    """(name, n) pairs of every branch -> their sums per name."""

    def expand(self, pcolls):
        return pcolls | "AllCounts" >> beam.Flatten() | "Sum" >> beam.CombinePerKey(sum)


def combine_stats(values):
    """Sum of vocab code statistics (CombinePerKey function)."""
    from ehr_pipeline import vocab

    total = vocab.ZERO
    for v in values:
        total = vocab.add_stats(total, v)
    return total
