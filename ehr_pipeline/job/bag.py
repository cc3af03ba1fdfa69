"""The job's bagging step: each example's events -> its SequenceExample record, through ``encode_admission``.

``UnitPlan`` sums the sources' unit census into the plan (each code's canonical unit, LOINC and
training medians), known only once every file is read; the bagging stage
(``spill_bag.BagBuckets``) joins it to every bucket by key, and ``BagExample`` encodes each
example with ``encode.encode_admission``, the function the service calls too. What it yields
besides the record: counts, the values set aside for their unit (dead letters,
``sinks.DeadValue``) and the train split's code statistics.
"""
from __future__ import annotations

import apache_beam as beam

from ehr_pipeline.contract import PipelineConfig, assign_split, shard_of, spec
from ehr_pipeline.encode import encode_admission, magnitudes
from ehr_pipeline.encode import units as units_mod  # 'units' names the events' unit arrays here
from ehr_pipeline.job import vocab
from ehr_pipeline.job.chunks import concat_chunks
from ehr_pipeline.job.sinks import DEAD_VALUES, DeadValue
from ehr_pipeline.job.items import COUNTS, DEAD, KV, RECORDS, STATS, UNITS, OneList, Select, Tagged, count, counted


@beam.typehints.with_input_types(KV, dict)  # the example, then the unit plan (BagBucket passes it)
@beam.typehints.with_output_types(Tagged)
class BagExample(beam.DoFn):
    """(example key, [cohort row, event chunks]) -> its SequenceExample record, counts, code statistics."""

    def __init__(self, config_dict: dict):
        self._config_dict = config_dict

    def setup(self):
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
        encoded = encode_admission(times, codes, values, units, admission_context(hadm, meta),
                                   self._harmoniser_for(plan), cfg.bagging)
        harmonised, bags = encoded.harmonised, encoded.bags
        for key, n in harmonised.counts(codes).items():
            yield COUNTS, count(f"units/{key}", n)
        for problem in harmonised.problems:
            yield DEAD, (DEAD_VALUES, _dead_value(meta, hadm, times, codes, values, problem))
        # A MEDS dataset names each subject's split (subject_splits.parquet); MIMIC-III's is hashed.
        split = meta.get("split") or assign_split(meta["SUBJECT_ID"], cfg.splits.model_dump(), cfg.split_salt)
        shard = shard_of(hadm, getattr(cfg.num_shards, split))
        yield RECORDS, ((split, shard), (hadm, encoded.record))
        yield COUNTS, count(f"examples/{split}/written", 1)
        yield COUNTS, count(f"examples/{split}/positive", meta["label"])
        yield COUNTS, count("bagging/events_in", times.size)
        yield COUNTS, count("bagging/used", bags.n_events_used)
        yield from counted("bagging/dropped", bags.n_dropped_by_reason)
        if split == "train":
            for code, st in vocab.example_code_stats(encoded.codes, encoded.values).items():
                yield STATS, (code, vocab.exact_stats(st))


def admission_context(hadm: int, meta: dict) -> spec.AdmissionContext:
    """The context of one example from its cohort row (the sources' row: times in seconds)."""
    return spec.AdmissionContext(
        subject_id=meta["SUBJECT_ID"], hadm_id=hadm, label=meta["label"], trigger_time=meta["trigger_time"],
        admit_offset_seconds=meta["trigger_time"] - meta["ADMITTIME"], age_years=meta["age_years"],
        gender=meta["gender"], admission_type=meta["admission_type"], ethnicity=meta["ethnicity"],
        insurance=meta["insurance"], previous_discharge_seconds=meta["previous_discharge_seconds"])


def _dead_value(meta: dict, hadm: int, times, codes, values, problem) -> DeadValue:
    """The dead letter of one value units.Harmoniser did not use (a units.UnusedValue), with its reason."""
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


class SumCodeStats(beam.CombineFn):
    """Train-split code statistics (exact: vocab.exact_stats) -> their sum per code, rounded once at the end.

    The same sum whatever the bundles and their order, so numeric_stats.json is byte-identical
    for any number of workers.
    """

    def create_accumulator(self):
        return vocab.EXACT_ZERO

    def add_input(self, accumulator, element):
        return vocab.add_exact(accumulator, element)

    def merge_accumulators(self, accumulators):
        total = vocab.EXACT_ZERO
        for accumulator in accumulators:
            total = vocab.add_exact(total, accumulator)
        return total

    def extract_output(self, accumulator):
        return vocab.rounded_stats(accumulator)


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
            | "UnitCensusList" >> OneList()
            | "Plan" >> beam.Map(unit_plan, self._loinc, self._reference, self._medians)
        )
