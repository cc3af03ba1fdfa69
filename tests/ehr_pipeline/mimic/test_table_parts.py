"""Sharding a table keeps every row, and the job reads the parts like the whole file."""
import csv
import gzip
import io

import pyarrow as pa
import pytest

from ehr_pipeline import reader
from ehr_pipeline.mimic import table_parts


def test_parts_hold_every_row_once(demo_dir, tmp_path, monkeypatch):
    src = demo_dir / "LABEVENTS.csv.gz"
    monkeypatch.setattr(table_parts, "ROWS_PER_BLOCK", 1000)  # several blocks per part on a small table
    paths, rows = table_parts.write_table_parts(src, "LABEVENTS", tmp_path, parts=4, show_progress=False)
    assert rows == 76074
    assert [p.name for p in paths] == [table_parts.part_name("LABEVENTS", i, 4, "gz") for i in range(4)]
    assert reader.locate_table_files(tmp_path, "LABEVENTS") == paths
    whole, _ = reader.read_table(src, "LABEVENTS")
    pieces = [reader.read_table(p, "LABEVENTS")[0] for p in paths]
    assert sum(t.num_rows for t in pieces) == whole.num_rows
    assert sorted(sum((t.column("ROW_ID").to_pylist() for t in pieces), [])) == sorted(
        whole.column("ROW_ID").to_pylist())


def test_whole_and_parts_together_is_an_error(demo_dir, tmp_path):
    table_parts.write_table_parts(demo_dir / "PRESCRIPTIONS.csv.gz", "PRESCRIPTIONS", tmp_path, parts=2,
                      show_progress=False)
    (tmp_path / "PRESCRIPTIONS.csv.gz").write_bytes((demo_dir / "PRESCRIPTIONS.csv.gz").read_bytes())
    with pytest.raises(reader.ReaderError, match="both whole"):
        reader.locate_table_files(tmp_path, "PRESCRIPTIONS")


def test_malformed_rows_are_copied_not_repaired(tmp_path):
    src = tmp_path / "src" / "DIAGNOSES_ICD.csv"
    src.parent.mkdir()
    src.write_text('"ROW_ID","SUBJECT_ID","HADM_ID","SEQ_NUM","ICD9_CODE"\n1,2,3,1,"4280"\n2,2,3\n')
    paths, rows = table_parts.write_table_parts(src, "DIAGNOSES_ICD", tmp_path / "out", parts=1, show_progress=False)
    assert rows == 2
    dead = []
    table, stats = reader.read_table(paths[0], "DIAGNOSES_ICD", on_dead_letter=dead.append)
    assert table.num_rows == 1 and stats.rows_read == 2 and dead[0].reason == "field_count"
    assert gzip.open(paths[0], "rt").read().count("\n") == 3


def test_split_parts_hold_every_record_once_and_cut_outside_quotes(tmp_path):
    rows = [["ROW_ID", "TEXT"]] + [[str(i), f'line one\nline "two" of {i}' if i % 7 == 0 else f"plain {i}"]
                                   for i in range(3000)]
    rows[1500][1] = 'a field longer than a block,\n"quoted",\n' * 100  # its newlines span several blocks
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    src = tmp_path / "T.csv.gz"
    src.write_bytes(gzip.compress(buf.getvalue().encode()))
    parts = table_parts.split_file(str(src), "LABEVENTS", str(tmp_path / "parts"), parts=3, block=1000)
    got = []
    for part in parts:
        records = list(csv.reader(io.StringIO(pa.input_stream(part, compression="zstd").read().decode())))
        assert records[0] == rows[0] and len(records) > 1  # each part: the header, then whole records
        got.extend(records[1:])
    assert sorted(got, key=lambda r: int(r[0])) == rows[1:]
