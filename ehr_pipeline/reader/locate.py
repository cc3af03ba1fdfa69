"""Which file (or which parts) of a release directory hold a table.

A table is ``TABLE.csv.gz`` or ``TABLE.csv`` in any case, or parts ``TABLE-*.csv(.gz)`` that
``ehr-pipeline shard`` writes. Two candidates for one table are an error rather than a guess:
reading either would silently ignore the other.
"""
from __future__ import annotations

import collections
import logging
import pathlib

from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.errors import MissingTableError, ReaderError

# The package's logger, not this module's: what the reader logs keeps one name for filters.
logger = logging.getLogger(__package__)


def locate_table(mimic_dir: str | pathlib.Path, table: str) -> pathlib.Path | None:
    """Finds TABLE.csv.gz or TABLE.csv (any case) in mimic_dir; None if an optional table is absent."""
    schema = table_schemas.get(table)
    directory = _release_dir(mimic_dir)
    files_by_name: dict[str, list[pathlib.Path]] = collections.defaultdict(list)
    for p in directory.iterdir():
        if p.is_file():
            files_by_name[p.name.lower()].append(p)
    found = [p for name in schema.file_names for p in sorted(files_by_name.get(name.lower(), []))]
    if len(found) > 1:
        # TABLE.csv beside TABLE.csv.gz is as ambiguous as two spellings of one name: which
        # one is the release? Reading either would silently ignore the other.
        raise ReaderError(f"{directory}: several files hold table {schema.name}: "
                          f"{', '.join(p.name for p in found)}; keep one")
    if found:
        return found[0]
    expected = " or ".join(schema.file_names)
    if schema.required:
        raise MissingTableError(f"required MIMIC-III table {schema.name} not found in {directory}: expected {expected}")
    logger.info("optional table %s absent from %s (looked for %s); skipping it", schema.name, directory, expected)
    return None


def locate_table_files(mimic_dir: str | pathlib.Path, table: str) -> list[pathlib.Path]:
    """All files of a table: [TABLE.csv(.gz)] or its parts TABLE-*.csv(.gz); [] for an absent optional table.

    Parts let one huge table (CHARTEVENTS: 330M rows) be read by many workers at once: a gzip
    file can only be read from its start, so one file is one unit of work. Each part is a
    complete CSV with its own header (``ehr-pipeline shard`` writes them).
    """
    schema = table_schemas.get(table)
    directory = _release_dir(mimic_dir)
    parts = _parts(directory, schema)
    if not parts:
        whole = locate_table(directory, table)
        return [] if whole is None else [whole]
    whole = [n for n in schema.file_names if (directory / n).exists() or (directory / n.lower()).exists()]
    if whole:
        raise ReaderError(
            f"{directory}: {schema.name} is given both whole ({whole[0]}) and in {len(parts)} part(s) "
            f"({parts[0].name}, ...); keep one or the other")
    return parts


def _release_dir(mimic_dir: str | pathlib.Path) -> pathlib.Path:
    """mimic_dir as a path; MissingTableError when it is no directory."""
    directory = pathlib.Path(mimic_dir)
    if not directory.is_dir():
        raise MissingTableError(f"MIMIC-III directory {directory} does not exist or is not a directory")
    return directory


def _parts(directory: pathlib.Path, schema: table_schemas.TableSchema) -> list[pathlib.Path]:
    """The part files of a table in name order; ReaderError when one part has two files."""
    prefix = schema.name.lower() + "-"
    parts = sorted(
        p for p in directory.iterdir()
        if p.is_file() and p.name.lower().startswith(prefix)
        and (p.name.lower().endswith(".csv") or p.name.lower().endswith(".csv.gz"))
    )
    stems: dict[str, list[str]] = collections.defaultdict(list)
    for p in parts:
        stems[p.name.lower().removesuffix(".gz")].append(p.name)
    doubled = [names for names in stems.values() if len(names) > 1]
    if doubled:
        raise ReaderError(f"{directory}: several files hold one part of {schema.name}: "
                          f"{', '.join(doubled[0])}; keep one")
    return parts
