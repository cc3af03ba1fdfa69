"""The MIMIC-III job's stage A (``SpillSource``): read every event file, spill its events to bucket frame files.

    SpillSource   one element per input file or part, files grouped onto the workers by size
                  (``SlotFiles``); reads, extracts and cuts to the cohort exactly as
                  ``sources.ReadMimicTable`` does, and appends each admission's packed chunks to its
                  bucket's frame file (``SpillTable``). Only (bucket, file) references leave it,
                  beside the unit census, counts and dead rows; ``bucket_items`` gathers them into
                  one BUCKET item per bucket, stage C's element (``spill_bag``).

``SlotFiles`` and ``bucket_items`` serve the MEDS job's and the MEDS conversion's stage A too
(``meds_stages``, ``to_meds``). A worker holds one file's blocks, whatever the release's size.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from ehr_pipeline.contract import layout
from ehr_pipeline.job import spill
from ehr_pipeline.job.items import EVENTS, FATAL, KV, Select, Tagged
from ehr_pipeline.job.sources import ReadMimicTable
from ehr_pipeline.job.spill import BUCKET, EVENTS_DIR, SPILL, bucket_folder
from ehr_pipeline.reader import ReaderError


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class SpillTable(ReadMimicTable):
    """(table, file) -> ReadMimicTable's items, its events appended to bucket frame files: SPILL references."""

    def __init__(self, cohort_index, discharges, block_size_bytes: int, spill_dir: str, bounds: np.ndarray,
                 files: list[tuple[str, str]] | None = None):
        super().__init__(cohort_index, discharges, block_size_bytes, files)
        self._spill, self._bounds = spill_dir, bounds

    def process(self, element):
        table, path = element
        writer = spill.FrameWriter(layout.join(self._spill, EVENTS_DIR), bucket_folder)
        try:
            for kind, payload in self.read_items(table, path):
                if kind == EVENTS:
                    hadm, chunk = payload
                    writer.write(spill.bucket_of(self._bounds, hadm), hadm, chunk)
                else:
                    yield kind, payload
        except ReaderError as e:
            yield FATAL, str(e)  # the driver's one-line error, as ReadMimicTable's
        for bucket, frames in sorted(writer.close().items()):
            yield SPILL, (bucket, frames)


class SlotFiles(beam.PTransform):
    """(slot, files) groups -> the files, each group on one worker.

    The local runner hands key k of a grouped stage to worker k mod workers, so files grouped by
    size (spill.lpt_slots) are spread by size rather than at random.
    """

    def __init__(self, slots: list[tuple[int, list]]):
        super().__init__()
        self._slots = slots

    def expand(self, p):
        return (
            p
            | "Slots" >> beam.Create(self._slots).with_output_types(KV)
            | "GroupSlots" >> beam.GroupByKey()
            | "SlotFiles" >> beam.FlatMap(lambda kv: [f for group in kv[1] for f in group])
        )


class SpillSource(beam.PTransform):
    """MIMIC-III event files -> tagged items: one BUCKET per bucket (its frame files), census, counts, dead rows.

    ``slots`` groups of files of similar size, one key each: the local runner gives key k to
    worker k mod workers, so the files are spread by size rather than at random.
    """

    def __init__(self, slots: list[tuple[int, list]], cohort_index, discharges, spill_dir: str, bounds: np.ndarray,
                 block_size_bytes: int, files: list[tuple[str, str]] | None = None):
        super().__init__()
        self._slots, self._cohort, self._discharges = slots, cohort_index, discharges
        self._spill, self._bounds, self._block, self._files = spill_dir, bounds, block_size_bytes, files

    def expand(self, p):
        read = (
            p
            | "EventFiles" >> SlotFiles(self._slots)
            | "SpillTables" >> beam.ParDo(SpillTable(self._cohort, self._discharges, self._block, self._spill,
                                                     self._bounds, self._files))
        )
        return bucket_items(read, len(self._bounds) + 1)


def bucket_items(read, buckets: int):
    """Stage A's items with its SPILL references grouped into one BUCKET item per bucket (an empty one too)."""
    every = [(bucket, None) for bucket in range(buckets)]
    grouped = (
        (read | "SpillRefs" >> Select(SPILL), read.pipeline | "AllBuckets" >> beam.Create(every).with_output_types(KV))
        | "JoinBuckets" >> beam.Flatten()
        | "GroupByBucket" >> beam.GroupByKey()
        | "TagBuckets" >> beam.Map(lambda kv: (BUCKET, kv)).with_output_types(Tagged)
    )
    others = read | "NotRefs" >> beam.Filter(lambda item: item[0] != SPILL).with_output_types(Tagged)
    return (grouped, others) | "SourceItems" >> beam.Flatten()
