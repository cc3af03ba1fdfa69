"""The job's two sources: MIMIC-III CSV tables or a MEDS dataset -> the same tagged items (``items``).

``ReadMimicTable`` reads one MIMIC-III table file into the events of cohort admissions (as
chunks, ``chunks``), the unit census, counts, dead letters and one-line FATAL errors; the
MIMIC-III job's stage A (``spill_source.SpillSource``) spills its events to disk. ``ReadMedsFile``
reads one MEDS data file into one EXAMPLE item per example, its cohort row and event chunks
together: it computes the task per subject on the worker that reads its file (docs/meds.md), and
the MEDS job's stage A (``meds_stages.MedsSource``) spills the examples to disk.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa

from ehr_pipeline.job.chunks import pack_chunk
from ehr_pipeline.meds import source as meds_source
from ehr_pipeline.meds.standard import MedsError
from ehr_pipeline.job.items import (
    COUNTS,
    DEAD,
    EVENTS,
    EXAMPLE,
    FATAL,
    UNITS,
    Tagged,
    count,
    counted,
)
from ehr_pipeline.mimic import events as ev
from ehr_pipeline.mimic import table_parts
from ehr_pipeline.reader import ReaderError, TableReader


# ----------------------------------------------------------------------------- the MIMIC-III source


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class ReadMimicTable(beam.DoFn):
    """(table, file) -> the events of cohort admissions before their trigger, as chunks; counts and dead letters.

    ``files``: every (table, file) input of the job in file order, as the release holds them; with it
    each chunk carries its events' origin (their file's index, ROW_IDs, lines), which the bagging stage
    drops repeats by. A part of a split table names the file it was cut from and that file's lines
    (``table_parts.part_lines``).
    """

    def __init__(self, cohort_index, discharges, block_size_bytes: int, files: list[tuple[str, str]] | None = None):
        self._cohort = cohort_index
        self._discharges = discharges
        self._block = block_size_bytes
        self._file_index = {tuple(f): i for i, f in enumerate(files)} if files is not None else None

    def process(self, element):
        table, path = element
        try:
            yield from self.read_items(table, path)
        except ReaderError as e:
            # Raised here it would reach the driver as a runner-specific traceback (or not at
            # all); as an output it becomes the driver's one-line error.
            yield FATAL, str(e)

    def read_items(self, table: str, path: str):
        """The tagged items of one file or part; a ReaderError propagates (``process`` makes it FATAL)."""
        dead: list = []
        reader, blocks, index = open_event_table(table, path, self._file_index, dead.append, self._block)
        for batch in blocks:
            events, extract_counts = ev.extract(table, batch, self._discharges)
            for pair, tally in ev.unit_counts(events).items():
                yield UNITS, (pair, tally)
            kept, cohort_counts = ev.filter_to_cohort(events, self._cohort)
            for hadm, times, codes, values, units, *origin in ev.split_by_admission(kept, origin=index is not None):
                yield EVENTS, (hadm, pack_chunk(times, codes, values, units, (index, *origin) if origin else None))
            yield from counted(f"events/{table}/extract", extract_counts)
            yield from counted(f"events/{table}/cohort", cohort_counts)
            for letter in dead:
                yield DEAD, (table, letter)
            dead.clear()
        # Rows rejected after the last block (the file's last lines) come after the loop.
        for letter in dead:
            yield DEAD, (table, letter)
        stats = reader.stats
        yield COUNTS, count(f"rows/{table}/read", stats.rows_read)
        yield COUNTS, count(f"rows/{table}/parsed", stats.rows_parsed)
        yield from counted(f"rows/{table}/dead_letter", stats.dead_lettered)


def open_event_table(table: str, path: str, file_index: dict | None, on_dead_letter, block_size_bytes: int):
    """(reader, its typed blocks for ev.extract, the file's index or None) of one event-table file or part.

    With ``file_index`` ((table, release file) -> index) the blocks carry ev.ORIGIN_COLUMNS: ROW_ID and
    the line in the release's file (a part of a split table is mapped back, ``table_parts.part_lines``).
    """
    columns = ev.EXTRACTORS[table][1]
    if file_index is None:
        reader = TableReader(path, table, columns=columns, on_dead_letter=on_dead_letter,
                             block_size_bytes=block_size_bytes)
        return reader, iter(reader), None
    found = table_parts.part_lines(path)
    source, to_file = found if found is not None else (path, None)
    reader = TableReader(path, table, columns=(*columns, ev.ROW_ID), on_dead_letter=on_dead_letter,
                         block_size_bytes=block_size_bytes)

    def blocks():
        for batch, lines in reader.with_lines():
            yield batch.append_column(ev.LINE, pa.array(to_file(lines) if to_file else lines, pa.int64()))

    return reader, blocks(), file_index[(table, source)]


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
                yield from meds_items(out)
            yield SUBJECTS, (path, np.unique(np.concatenate(subjects)) if subjects else np.zeros(0, np.int64))
        except MedsError as e:
            yield FATAL, str(e)


def meds_items(out):
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


def split_subject_errors(per_file):
    """(FATAL, one line) when a subject's rows lie in two data files (meds_source.subjects_in_two_files)."""
    problem = meds_source.subjects_in_two_files(per_file)
    if problem:
        yield FATAL, problem
