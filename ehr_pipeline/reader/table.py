"""Reading one table file: ``TableReader`` iterates it as typed Arrow blocks and keeps the row
accounting of the pass in ``ReadStats`` (scan.py); ``read_table`` reads a small table whole.
"""
from __future__ import annotations

import logging
import pathlib
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.columns import ARROW_TYPES, as_schema, requested
from ehr_pipeline.reader.dead_letters import DeadLetterSink
from ehr_pipeline.reader.errors import CorruptFileError
from ehr_pipeline.reader.header import match_header, read_header
from ehr_pipeline.reader.scan import ReadStats, Scan
from ehr_pipeline.reader.window import DEFAULT_BLOCK_SIZE, RawWindow

# The package's logger, not this module's: what the reader logs keeps one name for filters.
logger = logging.getLogger(__package__)


class TableReader:
    """Iterates a MIMIC-III table file as typed pyarrow RecordBatches; see the package docstring.

    INT -> int64, FLOAT -> float64, TIMESTAMP -> int64 seconds since 1970-01-01, STR ->
    string, empty field -> null. ``stats`` describes the last (or running) pass.
    """

    def __init__(
        self,
        path: str | pathlib.Path,
        table: str | table_schemas.TableSchema,
        columns: Sequence[str] | None = None,
        on_dead_letter: DeadLetterSink | None = None,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE,
    ):
        self.path = pathlib.Path(path)
        self.schema = as_schema(table)
        self.columns = requested(self.schema, columns)
        self.arrow_schema = pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in self.columns])
        self.on_dead_letter = on_dead_letter
        if block_size_bytes < 1024:
            raise ValueError(f"block_size_bytes must be at least 1024, got {block_size_bytes}")
        self.block_size_bytes = int(block_size_bytes)
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """One batch per block of the file, in file order; ``stats`` starts afresh."""
        blocks = self.with_lines()
        try:
            for batch, _ in blocks:
                yield batch
        finally:
            blocks.close()  # at once, not when collected: the scan's Arrow reader must stop before the file closes

    def with_lines(self) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """As iterating the reader, each batch with the physical line (1-based, int64) where each of its rows starts.

        The line a dead letter would name: what the job names a row by once it is an event (a repeated ROW_ID).
        """
        self.stats = ReadStats()
        with RawWindow.open(self.path, self.block_size_bytes) as window:
            header_names = read_header(window, self.path)
            positions = match_header(header_names, self.schema, self.path)
            if not window.only_header_left():
                yield from Scan(self, window, header_names, positions).run()
            if window.error is not None:
                raise CorruptFileError(
                    f"{self.path}: compressed data is truncated or corrupt after line {window.complete_lines:,}, "
                    f"the last complete line (the {self.stats.rows_read:,} rows up to it were read and counted; "
                    f"the rest of the file is lost): {window.error}")
        if self.stats.rows_dead and self.on_dead_letter is None:
            logger.warning(
                "%s: %d row(s) dead-lettered %s with no sink to keep them; pass on_dead_letter",
                self.path, self.stats.rows_dead, self.stats.dead_lettered,
            )


def read_table(
    path: str | pathlib.Path,
    table: str | table_schemas.TableSchema,
    columns: Sequence[str] | None = None,
    on_dead_letter: DeadLetterSink | None = None,
) -> tuple[pa.Table, ReadStats]:
    """Reads a whole table file into memory; for small tables (dimension tables, the demo)."""
    reader = TableReader(path, table, columns=columns, on_dead_letter=on_dead_letter)
    batches = list(reader)
    return pa.Table.from_batches(batches, schema=reader.arrow_schema), reader.stats

