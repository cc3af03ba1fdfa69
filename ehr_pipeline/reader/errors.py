"""What the reader raises: a file that cannot be read as its table, or a table with no file.

Rows that are merely bad are no error: they are dead letters (see ``dead_rows``).
"""
from __future__ import annotations


class ReaderError(ValueError):
    """A file that cannot be read as the MIMIC-III table it should be."""


class EmptyFileError(ReaderError):
    """The file has no header line at all."""


class SchemaMismatchError(ReaderError):
    """The header does not carry the columns the v1.4 schema requires."""


class CorruptFileError(ReaderError):
    """Truncated or corrupt compressed data, or CSV structure Arrow cannot recover from."""


class MissingTableError(FileNotFoundError):
    """A required table has no file in the release directory."""
