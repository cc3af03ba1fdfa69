"""The MIMIC-III CSV reader: exact row accounting on the real demo, both dialects, hostile input.

Expected values are computed independently with Python's csv/datetime modules, never by the
code under test.
"""
from __future__ import annotations

import calendar
import csv
import datetime as dt
import gc
import gzip
import io
import logging
import threading
import time
import weakref

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ehr_pipeline import reader as reader_module
from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.dead_letters import DeadLetter, JsonlDeadLetterWriter, read_dead_letters
from ehr_pipeline.reader import (
    CorruptFileError,
    EmptyFileError,
    MissingTableError,
    ReaderError,
    SchemaMismatchError,
    TableReader,
    arrow_schema,
    locate_table,
    read_table,
)
from ehr_pipeline.reader.window import Feed, RawWindow

DEMO_TABLES = sorted(n for n in table_schemas.TABLES if n != "CHARTEVENTS")  # CHARTEVENTS: not in the demo
LAB_HEADER = ["ROW_ID", "SUBJECT_ID", "HADM_ID", "ITEMID", "CHARTTIME", "VALUE", "VALUENUM", "VALUEUOM", "FLAG"]
LAB_STR = {"VALUE", "VALUEUOM", "FLAG"}


# ------------------------------------------------------------------ independent oracle


def _demo_records(path) -> tuple[list[str], list[list[str]]]:
    with gzip.open(path, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def _expected(value: str, typ: table_schemas.ColType):
    if value == "":
        return None
    if typ is table_schemas.ColType.INT:
        return int(value)
    if typ is table_schemas.ColType.FLOAT:
        return float(value)
    if typ is table_schemas.ColType.TIMESTAMP:
        return calendar.timegm(dt.datetime.strptime(value, "%Y-%m-%d %H:%M:%S").timetuple())
    return value


def _read(path, table="LABEVENTS", **kwargs):
    """Reads a file fully; returns (pyarrow.Table, stats, dead letters) and checks the row invariant."""
    letters: list[DeadLetter] = []
    reader = TableReader(path, table, on_dead_letter=letters.append, **kwargs)
    result = pa.Table.from_batches(list(reader), schema=reader.arrow_schema)
    _check_invariant(reader.stats)
    assert result.num_rows == reader.stats.rows_parsed
    return result, reader.stats, letters


def _check_invariant(stats) -> None:
    assert stats.rows_read == stats.rows_parsed + sum(stats.dead_lettered.values())


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def _lab_file(tmp_path, lines: list[str], name="LABEVENTS.csv", newline="\n", gz=False, header=None):
    """Writes a LABEVENTS file from already-formatted data lines (demo dialect header)."""
    header = header if header is not None else ",".join(_quote(h) for h in LAB_HEADER)
    text = newline.join([header, *lines]) + newline
    path = tmp_path / name
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


GOOD = '{id},10006,142345,50912,2164-10-23 21:09:00,"1.2",.207,"mg/dL",'


# ------------------------------------------------------------------ the real demo


@pytest.mark.parametrize("table", DEMO_TABLES)
def test_demo_table_reads_every_row_with_independently_checked_values(demo_dir, table):
    path = locate_table(demo_dir, table)
    header, records = _demo_records(path)
    result, stats, letters = _read(path, table)
    assert letters == [] and stats.dead_lettered == {}
    assert stats.rows_read == stats.rows_parsed == len(records)
    schema = table_schemas.TABLES[table]
    assert result.schema == arrow_schema(table)
    for i, col in enumerate(schema.columns):
        assert header[i].upper() == col.name
        expected = [_expected(r[i], col.type) for r in records]
        assert result.column(col.name).to_pylist() == expected, col.name


def test_demo_known_facts(demo_dir):
    labs, stats, _ = _read(locate_table(demo_dir, "LABEVENTS"), "LABEVENTS")
    assert stats.rows_read == 76_074
    assert labs.column("HADM_ID").null_count == 14_262
    adm, stats, _ = _read(locate_table(demo_dir, "ADMISSIONS"), "ADMISSIONS")
    assert stats.rows_read == 129
    assert sum(adm.column("HOSPITAL_EXPIRE_FLAG").to_pylist()) == 40
    row = [r for r in adm.to_pylist() if r["HADM_ID"] == 129273][0]
    assert row["DEATHTIME"] > row["DISCHTIME"]


def test_demo_leading_dot_decimal_parses(demo_dir):
    path = locate_table(demo_dir, "LABEVENTS")
    header, records = _demo_records(path)
    col = header.index("VALUENUM")
    dotted = {int(r[0]): r[col] for r in records if r[col].startswith(".")}
    assert dotted, "the demo should contain .207-style decimals"
    labs, _, _ = _read(path, "LABEVENTS", columns=["ROW_ID", "VALUENUM"])
    got = dict(zip(labs.column("ROW_ID").to_pylist(), labs.column("VALUENUM").to_pylist()))
    for row_id, text in dotted.items():
        assert got[row_id] == float("0" + text)
    assert labs.schema.field("VALUENUM").type == pa.float64()


def test_demo_shifted_dob_is_negative_seconds_not_nanoseconds(demo_dir):
    patients, _, _ = _read(locate_table(demo_dir, "PATIENTS"), "PATIENTS", columns=["SUBJECT_ID", "DOB"])
    assert patients.schema.field("DOB").type == pa.int64()
    dobs = patients.column("DOB").to_pylist()
    old = [d for d in dobs if d < 0]
    assert old, "patients over 89 have DOBs shifted ~300 years back"
    before_1900 = calendar.timegm((1900, 1, 1, 0, 0, 0))
    assert all(d < before_1900 for d in old)
    # Exact seconds, leap day included. (In nanoseconds, DOB-to-admission spans of ~300 years
    # overflow int64; in seconds they are nowhere near.)
    assert calendar.timegm((1844, 7, 18, 0, 0, 0)) in old
    assert calendar.timegm((1880, 2, 29, 0, 0, 0)) in old


def test_column_selection_keeps_callers_order_and_schema_names(demo_dir):
    path = locate_table(demo_dir, "ADMISSIONS")
    result, stats, _ = _read(path, "ADMISSIONS", columns=["hadm_id", "ADMITTIME", "Row_Id"])
    assert result.schema.names == ["HADM_ID", "ADMITTIME", "ROW_ID"]
    assert [f.type for f in result.schema] == [pa.int64(), pa.int64(), pa.int64()]
    assert stats.rows_read == 129
    with pytest.raises(KeyError, match="ADMISSIONS has no column 'NOPE'"):
        TableReader(path, "ADMISSIONS", columns=["NOPE"])


def test_read_table_and_small_blocks_agree_with_one_block(demo_dir):
    path = locate_table(demo_dir, "LABEVENTS")
    whole, stats = read_table(path, "LABEVENTS")
    small, small_stats, _ = _read(path, "LABEVENTS", block_size_bytes=64 * 1024)
    assert whole.equals(small)
    assert stats == small_stats


def test_no_arrow_reader_outlives_the_iteration(demo_dir, monkeypatch):
    """Arrow's read-ahead has let go of the file feed when iteration ends: released later, at interpreter exit, it aborts."""
    def live_feeds() -> int:
        return sum(type(o) is Feed for o in gc.get_objects())

    read = RawWindow.read

    def slow_read(self, nbytes=-1):  # a slow disk: the read-ahead is still in flight when the consumer stops
        time.sleep(0.05)
        return read(self, nbytes)

    monkeypatch.setattr(RawWindow, "read", slow_read)
    before = live_feeds()
    batches = iter(TableReader(locate_table(demo_dir, "LABEVENTS"), "LABEVENTS", block_size_bytes=64 * 1024))
    next(batches)
    batches.close()
    assert live_feeds() == before


# ------------------------------------------------------------------ dialects


def _physionet_lines(header: list[str], records: list[list[str]], schema: table_schemas.TableSchema) -> list[str]:
    """The current PhysioNet dialect: lowercase bare header, minimal quoting, 0.207."""
    floats = {i for i, c in enumerate(schema.columns) if c.type is table_schemas.ColType.FLOAT}
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    writer.writerow([h.lower() for h in header])
    for r in records:
        writer.writerow([("0" + v if v.startswith(".") else v.replace("-.", "-0.", 1)) if i in floats else v
                         for i, v in enumerate(r)])
    return out.getvalue()


@pytest.mark.parametrize("table", ["ICUSTAYS", "D_ITEMS", "LABEVENTS"])
def test_both_dialects_gz_or_plain_lf_or_crlf_read_identically(demo_dir, tmp_path, table):
    path = locate_table(demo_dir, table)
    header, records = _demo_records(path)
    records = records[:3000]
    with gzip.open(path, "rt", newline="") as fh:  # the demo's own bytes, cut to the same rows
        demo_text = "".join(fh.readline() for _ in range(len(records) + 1))
    texts = {"demo": demo_text, "physionet": _physionet_lines(header, records, table_schemas.TABLES[table])}
    assert texts["demo"] != texts["physionet"]
    results = {}
    for dialect, text in texts.items():
        for newline in ("\n", "\r\n"):
            for gz in (False, True):
                data = text.replace("\n", newline).encode()
                p = tmp_path / f"{dialect}{len(newline)}{gz}" / (f"{table}.csv" + (".gz" if gz else ""))
                p.parent.mkdir()
                p.write_bytes(gzip.compress(data) if gz else data)
                result, stats, letters = _read(p, table)
                assert letters == [] and stats.rows_read == len(records)
                results[(dialect, newline, gz)] = result
    reference = results[("demo", "\n", False)]
    for key, result in results.items():
        assert result.equals(reference), key


# ------------------------------------------------------------------ hostile input


def test_ragged_rows_are_dead_lettered_with_line_and_raw_text(tmp_path):
    short = '2,10006,142345,50912,2164-10-23 21:09:00,"1.2",.207'
    long = GOOD.format(id=4) + ',"surplus"'
    path = _lab_file(tmp_path, [GOOD.format(id=1), short, GOOD.format(id=3), long, GOOD.format(id=5)])
    result, stats, letters = _read(path)
    assert result.column("ROW_ID").to_pylist() == [1, 3, 5]
    assert [(d.line, d.reason, d.raw) for d in letters] == [(3, "field_count", short), (5, "field_count", long)]
    assert letters[0].detail == "expected 9 fields, found 7"
    assert letters[0].file == str(path)
    assert stats.dead_lettered == {"field_count": 2}


@pytest.mark.parametrize("column, value, reason", [
    ("CHARTTIME", "2164-02-30 00:00:00", "bad_timestamp"),
    ("CHARTTIME", "2164-10-23 25:00:00", "bad_timestamp"),
    ("CHARTTIME", "yesterday", "bad_timestamp"),
    ("VALUENUM", "1.2.3", "bad_number"),
    ("ITEMID", "50912a", "bad_number"),
    ("ROW_ID", "99999999999999999999", "bad_number"),  # overflows int64
    ("SUBJECT_ID", "", "missing_required"),
])
def test_bad_values_are_dead_lettered_naming_the_field(tmp_path, column, value, reason):
    fields = next(csv.reader([GOOD.format(id=2)]))
    fields[LAB_HEADER.index(column)] = value
    bad = ",".join(_quote(v) if LAB_HEADER[i] in LAB_STR and v else v for i, v in enumerate(fields))
    path = _lab_file(tmp_path, [GOOD.format(id=1), bad, GOOD.format(id=3)])
    result, stats, letters = _read(path)
    assert result.column("ROW_ID").to_pylist() == [1, 3]
    assert [(d.line, d.reason, d.raw) for d in letters] == [(3, reason, bad)]
    assert column in letters[0].detail
    assert stats.dead_lettered == {reason: 1}


def test_several_problems_in_one_row_report_the_first_and_list_all(tmp_path):
    bad = '1,,142345,x,2164-13-01 00:00:00,"v",.2.,"mg",'
    _, _, letters = _read(_lab_file(tmp_path, [bad]))
    (letter,) = letters
    assert letter.reason == "missing_required"  # SUBJECT_ID comes first in the schema
    for col in ("SUBJECT_ID", "ITEMID", "CHARTTIME", "VALUENUM"):
        assert col in letter.detail


def test_invalid_utf8_in_a_string_column_is_one_dead_row(tmp_path):
    lines = [GOOD.format(id=1), '2,10006,142345,50912,,"caf\xe9",1,"mg",', GOOD.format(id=3)]
    path = tmp_path / "LABEVENTS.csv"
    header = ",".join(_quote(h) for h in LAB_HEADER)
    path.write_bytes(header.encode() + b"\n" + "\n".join(lines).encode("latin-1") + b"\n")
    result, _, letters = _read(path)
    assert result.column("ROW_ID").to_pylist() == [1, 3]
    assert [(d.line, d.reason) for d in letters] == [(3, "bad_encoding")]


def test_blank_lines_are_dead_lettered_not_skipped(tmp_path):
    path = _lab_file(tmp_path, [GOOD.format(id=1), "", GOOD.format(id=3), ""], newline="\r\n")
    result, stats, letters = _read(path)
    assert result.column("ROW_ID").to_pylist() == [1, 3]
    assert [(d.line, d.reason, d.raw) for d in letters] == [(3, "blank_line", ""), (5, "blank_line", "")]


def test_a_line_of_empty_fields_is_missing_required_not_blank(tmp_path):
    _, _, letters = _read(_lab_file(tmp_path, [",,,,,,,,", GOOD.format(id=2)]))
    assert [(d.line, d.reason, d.raw) for d in letters] == [(2, "missing_required", ",,,,,,,,")]


def test_only_requested_columns_are_validated(tmp_path):
    path = _lab_file(tmp_path, ['1,,142345,50912,,"v",oops,"mg",'])
    result, stats, letters = _read(path, columns=["ROW_ID", "HADM_ID"])
    assert result.to_pylist() == [{"ROW_ID": 1, "HADM_ID": 142345}]
    assert letters == [] and stats.rows_parsed == 1


def test_embedded_newlines_and_commas_keep_values_and_line_numbers(tmp_path):
    lines = [
        '1,10006,,50912,,"two\nlines, with comma",1,"mg",',
        '2,10006,,50912,,"three\r\nlines\n""quoted""",1,"mg",',
        '3,10006,,x,,"bad itemid after newlines",1,"mg",',
        '4,10006,,50912,,"last",1,"mg",',
    ]
    for newline in ("\n", "\r\n"):
        path = _lab_file(tmp_path, lines, newline=newline, name=f"L{len(newline)}.csv")
        result, _, letters = _read(path, block_size_bytes=1024)
        assert result.column("VALUE").to_pylist() == ["two\nlines, with comma", 'three\r\nlines\n"quoted"', "last"]
        # header 1, row 1 on lines 2-3, row 2 on lines 4-6: the bad row starts on line 7
        assert [(d.line, d.reason, d.raw) for d in letters] == [(7, "bad_number", lines[2])]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("block", [1024, 4096])
def test_quoted_crlf_split_between_read_buffers_is_not_corrupted(tmp_path, block, gz):
    # apache/arrow#51368: Arrow drops the "\n" that starts a buffer after one ending in "\r",
    # even inside quotes. Pad values so a quoted CRLF straddles the 1st and 2nd buffer ends.
    text = ",".join(_quote(h) for h in LAB_HEADER) + "\r\n"
    values = []
    for boundary in (block, 2 * block):
        prefix = f'{len(values) + 1},10006,,50912,,"'
        pad = boundary - 1 - len(text.encode()) - len(prefix)
        values.append("p" * pad + "\r\nq")
        text += prefix + values[-1].replace('"', '""') + '",1,"mg",\r\n'
        assert text.encode().index(b"\r\nq", boundary - 2) == boundary - 1
    text += '3,10006,,bad,,"z",1,"mg",\r\n'
    path = tmp_path / ("LABEVENTS.csv" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    result, _, letters = _read(path, block_size_bytes=block)
    assert result.column("VALUE").to_pylist() == values
    assert [(d.line, d.reason) for d in letters] == [(6, "bad_number")]


def test_unknown_extra_columns_are_ignored_with_a_notice(tmp_path, caplog):
    header = ",".join(_quote(h) for h in [*LAB_HEADER[:3], "NOTE", *LAB_HEADER[3:]])
    lines = ['1,10006,,"a\nmultiline note",50912,,"v",1,"mg",', '2,10006,,"n",bad,,"v",1,"mg",']
    with caplog.at_level(logging.WARNING, logger="ehr_pipeline.reader"):
        result, _, letters = _read(_lab_file(tmp_path, lines, header=header))
    assert "NOTE" in caplog.text
    assert result.schema.names == LAB_HEADER
    assert result.column("VALUE").to_pylist() == ["v"]
    assert [(d.line, d.reason) for d in letters] == [(4, "bad_number")]  # the note's newline counts


@pytest.mark.parametrize("drop", ["SUBJECT_ID", "FLAG"])
def test_missing_schema_column_is_an_error_naming_file_and_column(tmp_path, drop):
    header = ",".join(_quote(h) for h in LAB_HEADER if h != drop)
    path = _lab_file(tmp_path, [], header=header)
    with pytest.raises(SchemaMismatchError, match=rf"LABEVENTS\.csv.*{drop}"):
        list(TableReader(path, "LABEVENTS"))


def test_duplicate_header_column_is_an_error(tmp_path):
    header = ",".join([*LAB_HEADER, "row_id"])
    with pytest.raises(SchemaMismatchError, match="ROW_ID twice"):
        list(TableReader(_lab_file(tmp_path, [], header=header), "LABEVENTS"))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_header_only_table_yields_zero_rows(tmp_path, gz, ending):
    data = (",".join(_quote(h) for h in LAB_HEADER) + ending).encode()
    path = tmp_path / ("LABEVENTS.csv" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    table, stats = read_table(path, "LABEVENTS")
    assert table.num_rows == 0 and table.schema == arrow_schema("LABEVENTS")
    assert stats.rows_read == 0 and stats.dead_lettered == {}


@pytest.mark.parametrize("data", [b"", b"\n\n"])
@pytest.mark.parametrize("gz", [False, True])
def test_file_without_header_is_a_clear_error(tmp_path, data, gz):
    path = tmp_path / ("LABEVENTS.csv" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(EmptyFileError, match="LABEVENTS.csv"):
        list(TableReader(path, "LABEVENTS"))


def test_truncated_gzip_raises_naming_the_file_after_counting(demo_dir, tmp_path):
    data = locate_table(demo_dir, "LABEVENTS").read_bytes()
    path = tmp_path / "LABEVENTS.csv.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    reader = TableReader(path, "LABEVENTS", block_size_bytes=64 * 1024)
    seen = 0
    with pytest.raises(CorruptFileError, match=r"LABEVENTS\.csv\.gz.*truncated or corrupt"):
        for batch in reader:
            seen += batch.num_rows
    assert 0 < seen == reader.stats.rows_parsed < 76_074
    _check_invariant(reader.stats)


def test_a_feed_that_met_a_truncated_stream_is_freed_with_its_reader(demo_dir, tmp_path):
    # The reader waits until nothing holds its feed before it returns or raises: a feed kept alive by
    # the stream's error (its traceback's frames) made every truncated file wait 30 s to fail.
    data = locate_table(demo_dir, "ADMISSIONS").read_bytes()
    path = tmp_path / "ADMISSIONS.csv.gz"
    path.write_bytes(data[: len(data) // 2])
    with RawWindow.open(path, 4096) as window:
        feed = window.feed()
        while len(feed.read(4096)):
            pass
        assert window.error is not None
        freed = weakref.ref(feed)
        del feed
        assert freed() is None


def test_corrupt_gzip_raises_naming_the_file(demo_dir, tmp_path):
    data = bytearray(locate_table(demo_dir, "ADMISSIONS").read_bytes())
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "ADMISSIONS.csv.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"ADMISSIONS\.csv\.gz"):
        list(TableReader(path, "ADMISSIONS"))


@pytest.mark.parametrize("block", [4096, 1 << 20])
def test_unclosed_quote_costs_only_its_own_line(tmp_path, block):
    # Whether the quote outruns a block (the reader restarts after the line) or closes far
    # later (the merged record is re-read line by line), only the bad line is lost.
    lines = ['1,10006,,50912,,"never closed,1,mg,', *(f"{i},10006,,50912,,v,1,mg," for i in range(2, 3000))]
    path = _lab_file(tmp_path, lines)
    result, stats, letters = _read(path, block_size_bytes=block)
    assert [(d.line, d.reason) for d in letters] == [(2, "bad_quoting")]
    assert result.column("ROW_ID").to_pylist() == list(range(2, 3000))
    assert stats.rows_read == len(lines)
    _check_invariant(stats)


def test_gzip_is_detected_by_content_not_name(tmp_path):
    path = _lab_file(tmp_path, [GOOD.format(id=7)], name="LABEVENTS.csv", gz=True)
    result, _, _ = _read(path)
    assert result.column("ROW_ID").to_pylist() == [7]


@pytest.mark.parametrize("name, gz", [("LABEVENTS.csv.gz", False), ("LABEVENTS.csv", True),
                                      ("labevents.CSV.GZ", False), ("LABEVENTS.csv.gz", True)])
def test_a_file_is_read_by_its_content_whatever_its_name(demo_dir, tmp_path, name, gz):
    # Another site's export tool: plain text under .csv.gz (Arrow guesses gzip from the
    # name) or gzip under .csv. Every row must come out as from the demo's own file.
    original = locate_table(demo_dir, "LABEVENTS")
    text = gzip.decompress(original.read_bytes())
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if gz else text)
    reader_module.check_header(path, "LABEVENTS")
    result, stats, letters = _read(path, block_size_bytes=64 * 1024)
    header, rows = _demo_records(original)
    assert not letters and stats.rows_read == len(rows) == result.num_rows
    assert result.column("ROW_ID").to_pylist() == [int(r[header.index("ROW_ID")]) for r in rows]


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("name", ["LABEVENTS-00000-of-00002.csv.zst", "LABEVENTS.csv.gz"])
def test_zstd_is_read_by_its_magic_bytes(demo_dir, tmp_path, name):
    """The job's split parts are zstd (mimic/table_parts.py): every row as from the demo's gzip file."""
    original = locate_table(demo_dir, "LABEVENTS")
    path = tmp_path / name
    path.write_bytes(_zstd(gzip.decompress(original.read_bytes())))
    reader_module.check_header(path, "LABEVENTS")
    result, stats, letters = _read(path, block_size_bytes=64 * 1024)
    header, rows = _demo_records(original)
    assert not letters and stats.rows_read == len(rows) == result.num_rows
    assert result.column("ROW_ID").to_pylist() == [int(r[header.index("ROW_ID")]) for r in rows]


def test_truncated_zstd_is_named_in_one_line(demo_dir, tmp_path):
    data = _zstd(gzip.decompress(locate_table(demo_dir, "LABEVENTS").read_bytes()))
    path = tmp_path / "LABEVENTS.csv.zst"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match=r"LABEVENTS.csv.zst: compressed data is truncated or corrupt") as err:
        list(TableReader(path, "LABEVENTS", block_size_bytes=64 * 1024))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("magic, what", [(b"PK\x03\x04", "zip archive"), (b"BZh91AY&SY", "bzip2"),
                                         (b"\xfd7zXZ\x00\x00", "xz")])
def test_another_container_is_named_in_one_line(tmp_path, magic, what):
    path = tmp_path / "LABEVENTS.csv.gz"
    path.write_bytes(magic + bytes(range(256)) * 4)
    for attempt in (lambda: reader_module.check_header(path, "LABEVENTS"), lambda: list(TableReader(path, "LABEVENTS"))):
        with pytest.raises(ReaderError, match=f"LABEVENTS.csv.gz: the file holds .*{what}") as err:
            attempt()
        assert "\n" not in str(err.value)


def test_gzip_compressed_twice_is_named(tmp_path):
    text = (",".join(_quote(h) for h in LAB_HEADER) + "\n" + GOOD.format(id=1) + "\n").encode()
    path = tmp_path / "LABEVENTS.csv.gz"
    path.write_bytes(gzip.compress(gzip.compress(text)))
    with pytest.raises(ReaderError, match="LABEVENTS.csv.gz: the decompressed content is gzip data again"):
        reader_module.check_header(path, "LABEVENTS")


# ------------------------------------------------------------------ block edges and Arrow's read-ahead

_ROW = "{id},10006,,50912,2164-10-23 21:09:00,{value},.5,\"mg\","
_STRAY = "{id},10006,,50912,2164-10-23 21:09:00,\"never closed,.5,mg,"
_EDGE_CASES = {
    # (lines after the filler rows: ("row", id, value) | ("blank",) | ("stray", id); final newline)
    "blank_then_multiline_last": ([("blank",), ("row", 100, "two\nlines")], False),
    "blank_then_multiline": ([("blank",), ("row", 100, "two\nlines"), ("row", 101, "after")], True),
    "blanks_then_multiline": ([("blank",), ("blank",), ("blank",), ("row", 100, "a\n\nb"), ("row", 101, "x")], True),
    "blank_then_stray_quote": ([("blank",), ("stray", 100), ("row", 101, "after"), ("row", 102, "two\nlines")], True),
}


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("case", sorted(_EDGE_CASES))
def test_records_after_blank_lines_read_the_same_wherever_a_block_edge_falls(tmp_path, case, newline):
    # Found by the property test below: a blank line, then a valid record whose quoted value
    # spans two lines, was dead-lettered as bad_quoting when the record crossed the first block
    # edge (Arrow got it in three pieces). Slide the records across that edge byte by byte.
    tail, final_newline = _EDGE_CASES[case]
    block = 1024
    filler = [_ROW.format(id=i, value=_quote("v")) for i in range(1, 15)]
    texts, expected, kept = [], [], []
    line = 2 + len(filler)
    for item in tail:
        if item[0] == "blank":
            text = ""
            expected.append((line, "blank_line", text))
        elif item[0] == "stray":
            text = _STRAY.format(id=item[1])
            expected.append((line, "bad_quoting", text))
        else:
            value = item[2].replace("\n", newline)
            text = _ROW.format(id=item[1], value=_quote(value))
            kept.append((item[1], value))
        texts.append(text)
        line += 1 + text.count("\n")
    header = ",".join(_quote(h) for h in LAB_HEADER)
    start = len(newline.join([header, *filler, ""]).encode())  # where the tail begins, unpadded
    tail_bytes = len(newline.join(texts).encode())
    assert start < block
    for pad in range(max(0, block - start - tail_bytes), block - start + 2):
        first = _ROW.format(id=1, value=_quote("p" * pad))
        data = newline.join([header, first, *filler[1:], *texts]) + (newline if final_newline else "")
        path = tmp_path / f"edge{pad}.csv"
        path.write_bytes(data.encode())
        result, stats, letters = _read(path, block_size_bytes=block)
        assert [(d.line, d.reason, d.raw) for d in letters] == expected, pad
        rows = list(zip(result.column("ROW_ID").to_pylist(), result.column("VALUE").to_pylist()))
        assert rows == [(1, "p" * pad), *((i, "v") for i in range(2, 15)), *kept], pad
        assert stats.rows_read == len(filler) + len(tail)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("after", [["", "3,10006,,50912"], ["", "3,10006,,50912", "4,10006,,50912,,v,.5,mg,", ""]])
def test_a_quote_open_at_the_end_of_the_file_costs_only_its_own_line(tmp_path, after, newline):
    # Found by a longer property run: a stray quote near the end took the lines after it (a
    # blank line, a short row) into one dead record when none of them was a whole record.
    lines = [GOOD.format(id=1), _STRAY.format(id=2), *after]
    _, stats, letters = _read(_lab_file(tmp_path, lines, newline=newline))
    expected = [(3, "bad_quoting", lines[1])]
    for k, text in enumerate(after):
        if text == "":
            expected.append((4 + k, "blank_line", ""))
        elif text.count(",") < 8:
            expected.append((4 + k, "field_count", text))
    assert [(d.line, d.reason, d.raw) for d in letters] == expected
    assert stats.rows_read == len(lines) and stats.rows_parsed == len(lines) - len(expected)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("before", [0, 7])
def test_a_line_is_too_long_from_twice_the_block_size_on(tmp_path, before, gz):
    block = 4096
    for length, too_long in ((block - 1, False), (block + 1, False), (2 * block - 1, False), (2 * block, True)):
        rows = [_ROW.format(id=i, value=_quote("v" * i)) for i in range(1, before + 1)]
        head = "999,10006,,50912,2164-10-23 21:09:00,"
        long_line = head + "x" * (length - len(head) - len(",.5,mg,")) + ",.5,mg,"
        assert len(long_line) == length
        path = _lab_file(tmp_path, [*rows, long_line, "1000,10006,,50912,,v,.5,mg,"], name=f"long{length}.csv", gz=gz)
        result, stats, letters = _read(path, block_size_bytes=block)
        assert [(d.line, d.reason) for d in letters] == ([(before + 2, "line_too_long")] if too_long else []), length
        assert result.column("ROW_ID").to_pylist()[before:] == ([1000] if too_long else [999, 1000])
        assert stats.rows_read == before + 2


def _window_lines(n_before: int, long_line: int, n_after: int) -> list[bytes]:
    rows = [f"{i},10006,,50912,2164-10-23 21:09:00,\"{i % 97}\",.5,\"mg\",\n".encode() for i in range(n_before + n_after)]
    return [b"ROW_ID,SUBJECT_ID,HADM_ID,ITEMID,CHARTTIME,VALUE,VALUENUM,VALUEUOM,FLAG\n", *rows[:n_before],
            b"0,10006,,50912,," + b"x" * long_line + b",.5,mg,\n", *rows[n_before:]]


@pytest.mark.parametrize("gz", [False, True])
def test_what_a_fresh_reader_gets_does_not_depend_on_the_old_readers_read_ahead(tmp_path, gz):
    # After a line too long for a block, Arrow's read-ahead thread for the reader that gave up
    # keeps reading for a while; how far it got depends on thread timing. The buffers the next
    # reader gets must not: they decide which records straddle a block edge.
    lines = _window_lines(n_before=40, long_line=5000, n_after=400)
    data = b"".join(lines)
    path = tmp_path / "w.csv"
    path.write_bytes(gzip.compress(data) if gz else data)
    long_line = 42  # physical line number: header, 40 rows, then the long line
    size = 1024
    seen = set()
    for ahead in (0, 1, 2, 3, 5, 8, 13, 21, 34):
        with RawWindow.open(path, size) as window:
            window.probe()  # the header, as the reader reads it first
            old = window.feed()
            for _ in range(ahead):
                old.read(size)
            window.retire_feeds()
            assert len(old.read(size)) == 0
            window.read_through(long_line)
            window.rewind_to(long_line + 1)
            new = window.feed()
            buffers = list(iter(lambda: new.read(size).to_pybytes(), b""))
        assert b"".join(buffers) == b"".join(lines[long_line:])
        assert all(len(b) <= size and b.endswith(b"\n") for b in buffers)
        seen.add(tuple(len(b) for b in buffers))
    assert len(seen) == 1


def test_read_ahead_racing_the_reader_keeps_the_window_in_file_order(tmp_path, monkeypatch):
    # Arrow's I/O thread reading through one feed while the reader reads ahead itself (as it
    # does to quote a skipped line) once recorded blocks out of order: the next reader then
    # saw a line spliced from two places and dead-lettered a valid row as line_too_long.
    # The race, made to happen on every run: the I/O thread stops between cutting its first
    # buffer and recording it, until the reader has recorded one of its own. With the cut and
    # its record one step under the window's I/O lock, the reader cannot get in and the wait
    # times out; without the lock, the reader's later buffer is recorded first.
    lines = _window_lines(n_before=300, long_line=20000, n_after=3000)
    path = tmp_path / "race.csv.gz"
    path.write_bytes(gzip.compress(b"".join(lines)))
    io_thread_cut, reader_recorded = threading.Event(), threading.Event()
    cut, read_new = RawWindow._cut, RawWindow._read_new

    def gated_cut(self):
        out = cut(self)
        if threading.current_thread().name == "arrow-io" and not io_thread_cut.is_set():
            io_thread_cut.set()
            reader_recorded.wait(timeout=1.0)
        return out

    def signalling_read_new(self):
        out = read_new(self)
        if threading.current_thread().name != "arrow-io":
            reader_recorded.set()
        return out

    monkeypatch.setattr(RawWindow, "_cut", gated_cut)
    monkeypatch.setattr(RawWindow, "_read_new", signalling_read_new)
    with RawWindow.open(path, 4096) as window:
        feed = window.feed()
        drain = threading.Thread(target=lambda: list(iter(lambda: len(feed.read(4096)), 0)), name="arrow-io")
        drain.start()
        assert io_thread_cut.wait(timeout=30)
        window.read_through(len(lines))
        drain.join()
        text = window.text(2, len(lines) - 1)  # every line after the header
    assert text.encode() == b"".join(lines[1:])[:-1]


# ------------------------------------------------------------------ line numbers, property-based

_GOOD_VALUES = ["plain", "with,comma", 'has "quotes"', "two\nlines", "crlf\r\ninside", "\n", "ünï", "a\n\nb"]


@st.composite
def _lab_rows(draw):
    rows = []
    for i in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["good"] * 6 + ["short", "long", "bad_number", "bad_timestamp",
                                                       "missing_required", "blank"]))
        value = draw(st.sampled_from(_GOOD_VALUES))
        rows.append((kind, i + 1, value))
    return rows


def _render(kind: str, row_id: int, value: str) -> tuple[str, str | None]:
    if kind == "blank":
        return "", "blank_line"
    fields = [str(row_id), "10006", "", "50912", "2164-10-23 21:09:00", _quote(value), ".5", '"mg"', ""]
    reason = None
    if kind == "short":
        fields, reason = fields[:-2], "field_count"
    elif kind == "long":
        fields, reason = fields + ['"x\ny"'], "field_count"
    elif kind == "bad_number":
        fields[6], reason = "1.2.3", "bad_number"
    elif kind == "bad_timestamp":
        fields[4], reason = "2164-02-30 12:00:00", "bad_timestamp"
    elif kind == "missing_required":
        fields[1], reason = "", "missing_required"
    return ",".join(fields), reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_lab_rows(), newline=st.sampled_from(["\n", "\r\n"]), gz=st.booleans(),
       block=st.sampled_from([1024, 1500, 4096, 1 << 20]), final_newline=st.booleans())
def test_dead_letter_lines_match_physical_lines(tmp_path, rows, newline, gz, block, final_newline):
    texts, expected, kept = [], [], []
    line = 2
    for kind, row_id, value in rows:
        text, reason = _render(kind, row_id, value)
        text = text.replace("\r\n", "\n").replace("\n", newline)  # a converted file converts quoted newlines too
        texts.append(text)
        if reason:
            expected.append((line, reason, text))
        else:
            kept.append((row_id, value.replace("\r\n", "\n").replace("\n", newline)))
        line += 1 + text.count("\n")
    header = ",".join(_quote(h) for h in LAB_HEADER)
    data = newline.join([header, *texts])
    if final_newline or (rows and rows[-1][0] == "blank"):
        data += newline
    path = tmp_path / f"prop{len(newline)}{gz}{block}.csv"
    path.write_bytes(gzip.compress(data.encode()) if gz else data.encode())
    result, stats, letters = _read(path, block_size_bytes=block)
    assert [(d.line, d.reason, d.raw) for d in letters] == expected
    assert list(zip(result.column("ROW_ID").to_pylist(), result.column("VALUE").to_pylist())) == kept
    assert stats.rows_read == len(rows)


# ------------------------------------------------------------------ sinks and locating tables


def test_jsonl_dead_letter_writer_round_trips(tmp_path):
    lines = [GOOD.format(id=1), '2,x,,50912,,"a\nb",1,"mg",', '3,10006,,50912,,"c",1']
    target = tmp_path / "out" / "dead.jsonl"
    with JsonlDeadLetterWriter(target) as sink:
        list(TableReader(_lab_file(tmp_path, lines), "LABEVENTS", on_dead_letter=sink))
    letters = read_dead_letters(target)
    assert [(d.line, d.reason, d.raw) for d in letters] == [(3, "bad_number", lines[1]), (5, "field_count", lines[2])]
    assert sink.count == 2
    with JsonlDeadLetterWriter(tmp_path / "empty.jsonl"):
        pass
    assert (tmp_path / "empty.jsonl").read_text() == ""  # exists: "no dead letters", not "no sink"


def test_locate_table_matches_case_insensitively_and_refuses_plain_beside_gzip(tmp_path):
    (tmp_path / "admissions.csv").write_text("x")
    assert locate_table(tmp_path, "ADMISSIONS") == tmp_path / "admissions.csv"
    (tmp_path / "Admissions.CSV.GZ").write_bytes(b"x")
    with pytest.raises(ReaderError, match=r"Admissions\.CSV\.GZ, admissions\.csv; keep one"):
        locate_table(tmp_path, "admissions")


def test_locate_table_missing_required_names_directory_and_files(tmp_path):
    with pytest.raises(MissingTableError, match=rf"ADMISSIONS.*{tmp_path}.*ADMISSIONS\.csv\.gz or ADMISSIONS\.csv"):
        locate_table(tmp_path, "ADMISSIONS")


def test_locate_table_optional_absent_is_none_with_notice(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="ehr_pipeline.reader"):
        assert locate_table(tmp_path, "CHARTEVENTS") is None
    assert "CHARTEVENTS" in caplog.text


def test_locate_table_refuses_ambiguous_names(tmp_path):
    (tmp_path / "ADMISSIONS.csv").write_text("x")
    (tmp_path / "admissions.csv").write_text("x")
    with pytest.raises(ReaderError, match="several files"):
        locate_table(tmp_path, "ADMISSIONS")
