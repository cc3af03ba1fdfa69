"""Release summary: per-table row accounting of the real demo and of damaged copies of it."""
from __future__ import annotations

import gzip

import pytest

from ehr_pipeline.mimic.summary import DEAD_LETTER_FILE, format_release_summary, summarize_command, summarize_release
from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.dead_letters import read_dead_letters


@pytest.fixture(scope="module")
def demo_summary(demo_dir):
    return summarize_release(demo_dir)


def _release_copy(demo_dir, target, replace: dict[str, bytes] | None = None, drop=()):
    """A release folder of links to the demo files, some replaced by given gzip bytes or left out."""
    target.mkdir()
    for f in demo_dir.glob("*.csv.gz"):
        name = f.name.split(".")[0]
        if name in drop:
            continue
        if replace and name in replace:
            (target / f.name).write_bytes(replace[name])
        else:
            (target / f.name).symlink_to(f)
    return target


def test_demo_summary_counts_every_table(demo_summary, demo_dir):
    by_name = {t.table: t for t in demo_summary.tables}
    assert set(by_name) == set(table_schemas.TABLES) - {"CHARTEVENTS"}
    assert demo_summary.absent == ("CHARTEVENTS",)
    assert by_name["LABEVENTS"].rows_read == 76_074
    assert by_name["ADMISSIONS"].rows_read == 129
    for t in demo_summary.tables:
        with gzip.open(demo_dir / t.file, "rb") as fh:  # rows == lines - header: the demo has no embedded newlines
            assert t.rows_read == t.rows_parsed == fh.read().count(b"\n") - 1, t.table
        assert t.dead_lettered == {}
    assert demo_summary.rows_dead == 0


def test_format_release_summary_shows_tables_total_and_absent(demo_summary):
    text = format_release_summary(demo_summary)
    lines = text.splitlines()
    assert any(line.startswith("LABEVENTS") and "76,074" in line for line in lines)
    total = sum(t.rows_read for t in demo_summary.tables)
    assert any(line.startswith("TOTAL") and f"{total:,}" in line for line in lines)
    assert lines[-1] == "absent optional tables: CHARTEVENTS"


def test_summarize_command_reports_and_writes_dead_letters(demo_dir, tmp_path, capsys):
    with gzip.open(demo_dir / "ADMISSIONS.csv.gz", "rb") as fh:
        lines = fh.read().split(b"\n")
    lines[5] = lines[5].replace(b",2", b",21xx-", 1)  # ADMITTIME of the 5th data row no longer parses
    release = _release_copy(demo_dir, tmp_path / "release", {"ADMISSIONS": gzip.compress(b"\n".join(lines))})
    rc = summarize_command(release, tmp_path / "dead")
    out = capsys.readouterr().out
    assert rc == 0
    assert any(line.startswith("ADMISSIONS") and "bad_timestamp=1" in line for line in out.splitlines())
    letters = read_dead_letters(tmp_path / "dead" / DEAD_LETTER_FILE)
    assert [(d.line, d.reason, d.raw) for d in letters] == [(6, "bad_timestamp", lines[5].decode())]


def test_summarize_command_fails_clearly_on_missing_required_table(demo_dir, tmp_path, capsys):
    release = _release_copy(demo_dir, tmp_path / "release", drop={"PATIENTS"})
    assert summarize_command(release) == 2
    err = capsys.readouterr().err
    assert "PATIENTS" in err and str(release) in err


def test_summarize_command_fails_clearly_on_truncated_gzip(demo_dir, tmp_path, capsys):
    data = (demo_dir / "ICUSTAYS.csv.gz").read_bytes()
    release = _release_copy(demo_dir, tmp_path / "release", {"ICUSTAYS": data[: len(data) // 2]})
    assert summarize_command(release) == 2
    assert "ICUSTAYS.csv.gz" in capsys.readouterr().err
