"""Setting bad rows aside: which records of a block are dead, their dead letters, and the rows
that a stray quote had merged into one record, re-read line by line.

Arrow numbers every record it parses, the ones it rejects included, and a record spans
``1 + (newlines inside its fields)`` physical lines; so a block that holds a suspect row is laid
out on physical lines (``block_layout``) and only its suspect rows are cut out of the window
and judged (``judge_block``). The functions here decide; the scan applies their verdict.
"""
from __future__ import annotations

import csv
import dataclasses
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ehr_pipeline.reader.columns import Problem, per_row_newlines
from ehr_pipeline.reader.dead_letters import BAD_QUOTING, BLANK_LINE, FIELD_COUNT, DeadLetter

_MAX_RAW = 1 << 16  # characters of a dead letter's raw text kept for a huge line

# (row of the block to insert before, [(physical line, fields)] of the records re-read from it)
Recovered = tuple[int, list[tuple[int, list[str]]]]


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """The records of one block, Arrow's rejected ones among them, laid out on physical lines."""

    first_line: int  # physical line of the block's first record
    is_valid: np.ndarray  # per record: False where Arrow rejected it
    spans: np.ndarray  # per record: physical lines
    starts: np.ndarray  # per record: physical line it starts on
    rejected_at: np.ndarray  # record index of each rejected row, in Arrow's order
    row_starts: np.ndarray  # per row Arrow kept: physical line it starts on
    row_spans: np.ndarray  # per row Arrow kept: physical lines
    rows_before: np.ndarray  # per record: rows Arrow kept before it

    @property
    def records(self) -> int:
        """Records in the block, kept and rejected."""
        return len(self.spans)

    @property
    def next_line(self) -> int:
        """Physical line just after the block's last record."""
        return int(self.starts[-1] + self.spans[-1]) if self.records else self.first_line


@dataclasses.dataclass
class Verdict:
    """What becomes of a block's suspect records, before recovered lines are typed."""

    letters: list[DeadLetter]  # in the order found; emitted sorted by line
    recovered: list[Recovered]
    dead: np.ndarray  # per row Arrow kept: set aside as a dead letter
    replaced: np.ndarray  # per row Arrow kept: re-read as the records in ``recovered``
    extra: int  # physical records beyond Arrow's count, from re-read records


def blank_rows(batch: pa.RecordBatch) -> np.ndarray | None:
    """Rows where every field is null: a blank line, or a line of empty fields; None if there are none."""
    if batch.num_rows == 0 or batch.column(0).null_count == 0:
        return None
    mask = batch.column(0).is_null()
    for i in range(1, batch.num_columns):
        mask = pc.and_(mask, batch.column(i).is_null())
    out = mask.to_numpy(zero_copy_only=False)
    return out if out.any() else None


def rejected_in_block(rejected: Sequence[pacsv.InvalidRow], first_number: int, rows: int) -> int:
    """How many of the rejected rows (in Arrow's order) fall among a block's records numbered from ``first_number``."""
    end = first_number + rows
    count = 0
    for row in rejected:
        if row.number is None or row.number >= end:  # None: Arrow's last record of the file
            break
        count += 1
        end += 1
    return count


def block_layout(rows: int, rejected: Sequence[pacsv.InvalidRow], first_number: int, first_line: int,
                 nl_columns: Sequence[pa.Array]) -> BlockLayout:
    """Lays out ``rows`` kept rows and the ``rejected`` ones among them from ``first_line`` on."""
    total = rows + len(rejected)
    is_valid = np.ones(total, dtype=bool)
    spans = np.ones(total, dtype=np.int64)
    rejected_at = np.array([r.number - first_number for r in rejected], dtype=np.int64)
    is_valid[rejected_at] = False
    if nl_columns:
        row_nl = np.zeros(rows, dtype=np.int64)
        for arr in nl_columns:
            row_nl += per_row_newlines(arr)
        spans[is_valid] += row_nl
    for p, r in zip(rejected_at, rejected):
        spans[p] = 1 + r.text.count("\n")
    starts = first_line + np.concatenate(([0], np.cumsum(spans)[:-1]))
    return BlockLayout(first_line=first_line, is_valid=is_valid, spans=spans, starts=starts,
                       rejected_at=rejected_at, row_starts=starts[is_valid], row_spans=spans[is_valid],
                       rows_before=np.cumsum(is_valid) - is_valid)


def judge_block(layout: BlockLayout, rejected: Sequence[pacsv.InvalidRow], problems: Sequence[Problem],
                blank: np.ndarray | None, text: Callable[[int, int], str], file: str, width: int) -> Verdict:
    """Judges the rejected records of a block, then its suspect rows; ``text(line, span)`` quotes the file."""
    rows = len(layout.row_spans)
    verdict = Verdict(letters=[], recovered=[], dead=np.zeros(rows, dtype=bool),
                      replaced=np.zeros(rows, dtype=bool), extra=0)
    _judge_rejected(verdict, layout, rejected, file, width)
    for i in np.flatnonzero(suspect_rows(layout, problems, blank)):
        line, span = int(layout.row_starts[i]), int(layout.row_spans[i])
        raw_text = text(line, span)
        split = resync(file, raw_text, line, width) if span > 1 else None
        if split is not None:
            verdict.letters += split[0]
            verdict.recovered.append((int(i), split[1]))
            verdict.replaced[i] = True
            verdict.extra += raw_text.count("\n")  # not span - 1: a quote open at the end takes the last newline
            continue
        letter = _suspect_letter(file, problems, blank, i, line, span, raw_text)
        if letter is not None:  # None: a line of empty fields whose requested columns are all nullable
            verdict.letters.append(letter)
            verdict.dead[i] = True
    return verdict


def suspect_rows(layout: BlockLayout, problems: Sequence[Problem], blank: np.ndarray | None) -> np.ndarray:
    """Rows Arrow kept that may be dead: over several lines, failing a check, or all null."""
    candidates = layout.row_spans > 1
    for prob in problems:
        candidates |= prob.mask
    if blank is not None:
        candidates |= blank
    return candidates


def _judge_rejected(verdict: Verdict, layout: BlockLayout, rejected: Sequence[pacsv.InvalidRow],
                    file: str, width: int) -> None:
    """Adds to ``verdict`` what becomes of the records Arrow rejected for their field count."""
    for p, r in zip(layout.rejected_at, rejected):
        line = int(layout.starts[p])
        split = resync(file, r.text, line, width)
        if split is None:
            verdict.letters.append(field_count_letter(file, line, r))
            continue
        verdict.letters += split[0]
        verdict.recovered.append((int(layout.rows_before[p]), split[1]))
        verdict.extra += int(layout.spans[p]) - 1


def _suspect_letter(file: str, problems: Sequence[Problem], blank: np.ndarray | None, i: int, line: int,
                    span: int, raw_text: str) -> DeadLetter | None:
    """The dead letter of suspect row i, one record after all; None when it has no problem."""
    if blank is not None and blank[i] and raw_text.strip() == "":
        return DeadLetter(file, line, raw_text, BLANK_LINE, "blank line")
    if span > 1 and raw_text.count('"') % 2:  # Arrow closed it at the end of the file
        return DeadLetter(file, line, raw_text, BAD_QUOTING,
                          "a quote opened in this record never closes before the end of the file")
    return problem_letter(file, problems, i, line, raw_text)


def field_count_letter(file: str, line: int, row: pacsv.InvalidRow) -> DeadLetter:
    """The dead letter of a record Arrow rejected for its number of fields."""
    if row.text.count('"') % 2:  # e.g. the file's last record, its quote still open at the end
        return DeadLetter(file, line, row.text, BAD_QUOTING, "a quote opened in this record never closes")
    return DeadLetter(file, line, row.text, FIELD_COUNT,
                      f"expected {row.expected_columns} fields, found {row.actual_columns}")


def problem_letter(file: str, problems: Sequence[Problem], i: int, line: int, raw_text: str) -> DeadLetter | None:
    """The dead letter of row i of a block, or None when it has no problem."""
    found = [p for p in problems if p.mask[i]]
    if not found:
        return None
    detail = "; ".join(
        f"{p.column} {short(p.raw[i].as_py()) + ' ' if p.raw is not None else ''}{p.message}"
        for p in found
    )
    return DeadLetter(file, line, raw_text, found[0].reason, detail)


def resync(file: str, text: str, first_line: int,
           width: int) -> tuple[list[DeadLetter], list[tuple[int, list[str]]]] | None:
    """Re-reads a record of several lines line by line, if it is rows merged by a stray quote.

    Returns None when the quotes close and no line holds a whole record of ``width`` fields on
    its own (a genuine multi-line value, such as a note's text); else (dead letters of the lines
    that are no record, [(line, fields)] of those that are). A quote still open at the end of
    the file opened no value: each line is then a physical record of its own.
    """
    if "\n" not in text:
        return None
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    fields = [split_line(line) if line.count(",") >= width - 1 else None for line in lines]
    if not text.count('"') % 2 and not any(f is not None and len(f) == width for f in fields):
        return None
    letters, rows = [], []
    for k, (line, f) in enumerate(zip(lines, fields)):
        number = first_line + k
        if f is not None and len(f) == width:
            rows.append((number, f))
        elif not line.strip():
            letters.append(DeadLetter(file, number, line, BLANK_LINE, "blank line"))
        elif line.count('"') % 2:
            letters.append(DeadLetter(file, number, line, BAD_QUOTING,
                                      "a quote opened on this line never closes on it; it had joined "
                                      "the lines after it into one record"))
        else:
            found = split_line(line)
            letters.append(DeadLetter(file, number, line, FIELD_COUNT,
                                      f"expected {width} fields, found "
                                      f"{len(found) if found is not None else 'unparseable quoting'}"))
    return letters, rows


def split_line(line: str) -> list[str] | None:
    """One physical line parsed alone as a CSV record; None when its quotes do not balance."""
    try:
        rows = list(csv.reader([line], strict=True))
    except csv.Error:
        return None
    return rows[0] if rows else []


def splice(batch: pa.RecordBatch, keep: np.ndarray, pieces: list[tuple[int, pa.RecordBatch]]) -> pa.RecordBatch:
    """The kept rows of ``batch`` with each piece inserted before row ``pos`` (file order)."""
    if not pieces:
        return batch if keep.all() else batch.filter(pa.array(keep))
    parts, prev = [], 0
    for pos, piece in sorted(pieces, key=lambda pp: pp[0]):
        parts.append(batch.slice(prev, pos - prev).filter(pa.array(keep[prev:pos])))
        parts.append(piece)
        prev = pos
    parts.append(batch.slice(prev).filter(pa.array(keep[prev:])))
    table = pa.Table.from_batches(parts, schema=batch.schema).combine_chunks()
    return table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=batch.schema)


def splice_lines(lines: np.ndarray, keep: np.ndarray, pieces: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """``splice`` on the rows' physical line numbers: the kept ones with each piece's lines inserted before ``pos``."""
    if not pieces:
        return lines[keep]
    parts, prev = [], 0
    for pos, piece in sorted(pieces, key=lambda pp: pp[0]):
        parts += [lines[prev:pos][keep[prev:pos]], piece]
        prev = pos
    parts.append(lines[prev:][keep[prev:]])
    return np.concatenate(parts).astype(np.int64)


def clip(raw: str) -> str:
    """``raw`` cut to its first 64 Ki characters, saying how many more there were."""
    return raw if len(raw) <= _MAX_RAW else raw[:_MAX_RAW] + f"... [{len(raw) - _MAX_RAW} more characters]"


def short(value: object) -> str:
    """The repr of ``value``, cut to 80 characters for a dead letter's detail."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
