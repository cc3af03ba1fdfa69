"""Streaming, typed reader of MIMIC-III v1.4 CSV tables (gzip or plain, either dialect).

Arrow's streaming CSV reader does the parsing: every column is read as a string and cast
per block with vectorised kernels, so memory depends on the block size, never on the file.
Rows that cannot be typed are dead letters (``dead_letters``): counted by reason, handed to a
sink with file, physical line and raw text, and never fatal.

Exact line numbers come cheap: a record spans ``1 + (newlines inside its fields)`` lines and
Arrow numbers every record it parses (including the ones it rejects), so the reader walks a
line cursor block by block and only computes per-row spans in blocks that hold a dead row.
The raw text of a dead row is cut out of a small window of recently read bytes.

The modules: ``table_schemas`` types the columns of every table the job reads (the v1.4 DDL),
``locate`` finds a table's files, ``stream`` decompresses one, ``window`` keeps its recent bytes
for Arrow's thread and the reader, ``header`` checks its header, ``columns`` types blocks,
``scan`` walks the line cursor, ``dead_rows`` sets bad rows aside as ``dead_letters`` and
``table`` puts them together as ``TableReader``; ``errors`` names what can go wrong with a file.
Everything other code uses is imported from here.
"""
from __future__ import annotations

from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.columns import ARROW_TYPES, FLOAT32_MAX, arrow_schema, is_measurement
from ehr_pipeline.reader.dead_letters import DeadLetter, DeadLetterSink, JsonlDeadLetterWriter, read_dead_letters
from ehr_pipeline.reader.errors import (
    CorruptFileError,
    EmptyFileError,
    MissingTableError,
    ReaderError,
    SchemaMismatchError,
)
from ehr_pipeline.reader.header import check_header
from ehr_pipeline.reader.locate import locate_table, locate_table_files
from ehr_pipeline.reader.table import ReadStats, TableReader, read_table
from ehr_pipeline.reader.window import DEFAULT_BLOCK_SIZE

__all__ = [
    "ARROW_TYPES",
    "DEFAULT_BLOCK_SIZE",
    "FLOAT32_MAX",
    "CorruptFileError",
    "DeadLetter",
    "DeadLetterSink",
    "EmptyFileError",
    "JsonlDeadLetterWriter",
    "MissingTableError",
    "ReadStats",
    "ReaderError",
    "SchemaMismatchError",
    "TableReader",
    "arrow_schema",
    "check_header",
    "is_measurement",
    "locate_table",
    "locate_table_files",
    "read_dead_letters",
    "read_table",
    "table_schemas",
]
