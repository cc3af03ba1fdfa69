"""TableReader.with_lines: the physical line each kept row starts on, against where this file wrote it.

The text is built line by line here, so where each row starts is known without the reader; rows over
several lines, blank lines, dead rows and rows a stray quote had merged all move the later lines.
"""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from ehr_pipeline.reader import TableReader

HEADER = '"ROW_ID","SUBJECT_ID","HADM_ID","ITEMID","CHARTTIME","VALUE","VALUENUM","VALUEUOM","FLAG"'


def _row(row_id: int, value: str = "1") -> str:
    return f'{row_id},7,70,50800,2100-01-01 00:00:00,"{value}",{row_id % 13},"mg",""'


def _release(n: int, seed: int) -> tuple[str, dict[int, int]]:
    """(CSV text, ROW_ID -> the line its kept row starts on)."""
    rng = np.random.default_rng(seed)
    lines, starts = [HEADER], {}
    for row_id in range(1, n + 1):
        kind = rng.integers(0, 8)
        if kind == 0:  # a value over three lines: the row spans them
            starts[row_id] = len(lines) + 1
            lines += _row(row_id, "one\ntwo\nthree").split("\n")
        elif kind == 1:
            lines.append("")  # a blank line (dead), then the row
            starts[row_id] = len(lines) + 1
            lines.append(_row(row_id))
        elif kind == 2:  # a dead row: no integer SUBJECT_ID
            lines.append(_row(row_id).replace(",7,", ",x,", 1))
        elif kind == 3:  # a row with a field too many (dead)
            lines.append(_row(row_id) + ",extra")
        elif kind == 4:  # an unclosed quote on its own line, which would swallow the next row: both re-read
            lines.append(f'{row_id},7,70,50800,2100-01-01 00:00:00,"open,1,"mg",""')
        else:
            starts[row_id] = len(lines) + 1
            lines.append(_row(row_id))
    return "\n".join(lines) + "\n", starts


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block", [1024, 1 << 20])
def test_each_kept_row_names_the_line_it_starts_on(tmp_path, seed, block):
    text, starts = _release(600, seed)
    path = tmp_path / "LABEVENTS.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    found: dict[int, int] = {}
    reader = TableReader(path, "LABEVENTS", columns=["ROW_ID", "SUBJECT_ID", "VALUENUM"], on_dead_letter=lambda d: None,
                         block_size_bytes=block)
    for batch, lines in reader.with_lines():
        assert len(lines) == batch.num_rows and lines.dtype == np.int64
        found.update(zip(batch.column("ROW_ID").to_pylist(), lines.tolist()))
    physical = text.split("\n")
    # Every row the reader keeps starts where this file wrote it; rows it re-read out of a merged record
    # (after an unclosed quote) are not in `starts`, and must start on a line holding their ROW_ID.
    for row_id, line in found.items():
        if row_id in starts:
            assert line == starts[row_id], row_id
        else:
            assert physical[line - 1].startswith(f"{row_id},"), (row_id, line)
    assert set(starts) <= set(found)
