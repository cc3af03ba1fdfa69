"""The MEDS job's stages around its spill folder: examples spilled by key, bagged a bucket at a time, merged by key.

    MedsSource      stage A: the data files grouped onto the workers by size; each file read whole
                    (a subject's rows are in one file) into complete examples, cohort row and event
                    chunks together (``sources.ReadMedsFile``), each pickled into the frame file of
                    its bucket (example key mod buckets). Only (bucket, file) references leave it,
                    beside the unit census, counts, dead rows, each file's subjects and the labelled
                    examples' prediction times.
    BagMedsBucket   stage C: ``spill_bag.BagBucket`` with a bucket's examples read from its
                    frames, in key order.
    MergeShards     stage D (``spill_merge``, ``merge=True``): a shard's runs merged by key.

Example keys are not known before the files are read (a label row's key is a hash of its subject
and time), so buckets are hashes of keys, not ranges, and stage D merges where the MIMIC-III job
concatenates. No example crosses a GroupByKey: a worker holds one file (A), one bucket (C) or one
frame of each of a shard's runs (D).
"""
from __future__ import annotations

import math
import os
import pickle

import apache_beam as beam

from ehr_pipeline.contract import layout
from ehr_pipeline.job import spill
from ehr_pipeline.job.sources import PREDICTION_TIME, SUBJECTS, ReadMedsFile, split_subject_errors
from ehr_pipeline.job.spill import EVENTS_DIR, SPILL, bucket_folder
from ehr_pipeline.job.spill_bag import BagBucket
from ehr_pipeline.job.spill_source import SlotFiles, bucket_items
from ehr_pipeline.job.items import COUNTS, EXAMPLE, OneList, Tagged, count, select
from ehr_pipeline.meds import labels as meds_labels

# MEDS parquet bytes of input per bucket: ~6 B per row on disk, so ~5M rows, whose examples take a
# few hundred MB in stage C (chunks ~25 B per event, their bags and records).
BUCKET_INPUT_BYTES = 32 << 20


def meds_bucket_count(files: list[str], workers: int) -> int:
    """Buckets for a MEDS dataset: one per BUCKET_INPUT_BYTES of data files, at least 4 per worker."""
    return max(4 * workers, math.ceil(sum(os.path.getsize(f) for f in files) / BUCKET_INPUT_BYTES))


@beam.typehints.with_input_types(str)
@beam.typehints.with_output_types(Tagged)
class SpillMedsFile(ReadMedsFile):
    """One MEDS data file -> ReadMedsFile's items, its examples pickled to bucket frame files: SPILL references."""

    def __init__(self, reader_config: dict, spill_dir: str, buckets: int):
        super().__init__(reader_config)
        self._spill, self._buckets = spill_dir, buckets

    def process(self, path: str):
        writer = spill.FrameWriter(layout.join(self._spill, EVENTS_DIR), bucket_folder)
        for kind, payload in super().process(path):
            if kind == EXAMPLE:
                key, items = payload
                writer.write(int(key) % self._buckets, int(key), pickle.dumps(items, pickle.HIGHEST_PROTOCOL))
            else:
                yield kind, payload
        for bucket, frames in sorted(writer.close().items()):
            yield SPILL, (bucket, frames)


class MedsSource(beam.PTransform):
    """MEDS data files -> tagged items: one BUCKET per bucket (its frame files), census, counts, dead rows.

    The task (built in, or label rows) is computed per subject by the worker that reads its file, so
    examples leave the source complete: bagging needs no join. Each file's distinct subject ids meet
    in one list (one id per subject, not per row), where a subject found in two files is a FATAL
    error; with `prediction_times` (a path), the labelled examples' exact prediction times are
    written there (meds_labels.PREDICTION_TIMES) and counted as labels/prediction_times_written. Both
    come back as items of the source, so every branch ends in the job's one final sink.
    """

    def __init__(self, slots: list[tuple[int, list]], reader_config: dict, spill_dir: str, buckets: int,
                 prediction_times: str | None = None):
        super().__init__()
        self._slots, self._read = slots, SpillMedsFile(reader_config, spill_dir, buckets)
        self._buckets, self._prediction_times = buckets, prediction_times

    def expand(self, p):
        read = p | "MedsFiles" >> SlotFiles(self._slots) | "ReadMedsFiles" >> beam.ParDo(self._read)
        own = (SUBJECTS, PREDICTION_TIME)
        rest = read | "ExampleItems" >> beam.Filter(lambda item: item[0] not in own).with_output_types(Tagged)
        split = (
            read
            | "SubjectsOfFiles" >> beam.FlatMap(select(SUBJECTS))
            | "AllFiles" >> OneList()
            | "OneFilePerSubject" >> beam.FlatMap(split_subject_errors).with_output_types(Tagged)
        )
        parts = [bucket_items(rest, self._buckets), split]
        if self._prediction_times is not None:
            path = self._prediction_times

            def write(rows):
                layout.write_bytes(path, meds_labels.prediction_times_table(rows))
                return COUNTS, count("labels/prediction_times_written", len(rows))

            parts.append(
                read
                | "PredictionTimes" >> beam.FlatMap(select(PREDICTION_TIME))
                | "AllPredictionTimes" >> OneList()
                | "WritePredictionTimes" >> beam.Map(write).with_output_types(Tagged))
        return parts | "MedsItems" >> beam.Flatten()


class BagMedsBucket(BagBucket):
    """(bucket, frame files) -> RUN and DEAD_RUN references: BagBucket on the examples spilled by MedsSource."""

    def __init__(self, config_dict: dict, spill_dir: str):
        super().__init__(config_dict, spill_dir, cohort_file=None, cohort_ranges=[])

    def examples(self, bucket: int, frame_files: list[str]):
        """(example key, [cohort row, event chunks]) of a bucket's examples in key order."""
        found = [(key, pickle.loads(payload)) for path in frame_files for key, payload in spill.read_frames(path)]
        found.sort(key=lambda kv: kv[0])
        return found
