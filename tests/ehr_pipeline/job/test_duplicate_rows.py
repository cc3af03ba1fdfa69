"""Repeated ROW_IDs: a row whose ROW_ID its table has already given is used once, counted and dead-lettered,
by ``run --mimic-dir`` and by ``to-meds``.

The release with repeats is the clean synthetic release with rows copied, by this file's own CSV
code: each copy right after its row (the same part of a split table) and more at the end (another
part), exact or with a changed value (the copy is later in the file, so the changed value must not
be used). The job's records must then be the clean release's, byte for byte.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import pathlib

import pytest

from ehr_pipeline.contract import PipelineConfig, layout
from ehr_pipeline.job import SpillOptions, run_job, run_to_meds
from ehr_pipeline.job.manifest import format_manifest_summary
from ehr_pipeline.mimic.events import TABLE_SOURCE
from ehr_pipeline.synth import SynthConfig, write_release
from tests.support.job_outputs import CONFIG

RELEASE = {"patients": 40, "seed": 5, "events_scale": 0.3}
# Event tables big enough to split into parts at the threshold the tests use.
SPLIT_TABLES = ("CHARTEVENTS", "LABEVENTS")
STEP = 37  # every 37th row is copied right after itself


def _read_table(path: pathlib.Path) -> tuple[str, list[str], list[list[str]]]:
    """(header line, data lines, their fields) of a gzip CSV; synthetic event rows hold no newline."""
    text = gzip.decompress(path.read_bytes()).decode()
    lines = text.rstrip("\n").split("\n")
    return lines[0], lines[1:], [next(csv.reader([line])) for line in lines[1:]]


def _write_table(path: pathlib.Path, header: str, lines: list[str]) -> None:
    path.write_bytes(gzip.compress(("\n".join([header, *lines]) + "\n").encode(), mtime=0))


def _changed(line: str, header: list[str]) -> str:
    """The row with another numeric value (VALUENUM, VALUE or AMOUNT, whichever the table has): a partial repeat."""
    fields = next(csv.reader([line]))
    for name in ("VALUENUM", "VALUE", "AMOUNT"):
        if name in header and fields[header.index(name)] not in ("",):
            try:
                fields[header.index(name)] = repr(float(fields[header.index(name)]) * 3 + 1)
            except ValueError:
                continue
            break
    buf = io.StringIO()
    csv.writer(buf, lineterminator="", quoting=csv.QUOTE_MINIMAL).writerow(fields)
    return buf.getvalue()


def _with_repeats(clean: pathlib.Path, out: pathlib.Path) -> dict[str, dict[int, int]]:
    """The clean release with copied rows written to out; per table {physical line of a copy: its ROW_ID}."""
    out.mkdir()
    copies: dict[str, dict[int, int]] = {}
    for f in clean.iterdir():
        table = f.name.split(".")[0]
        if table not in TABLE_SOURCE:
            (out / f.name).symlink_to(f)
            continue
        header, lines, fields = _read_table(f)
        names = next(csv.reader([header]))
        row_id = names.index("ROW_ID")
        written: list[str] = []
        found: dict[int, int] = {}
        for i, line in enumerate(lines):
            written.append(line)
            if i % STEP == 0:
                written.append(line)
                found[len(written) + 1] = int(fields[i][row_id])  # +1: the header is line 1
        if table in SPLIT_TABLES:  # copies far from their rows: in the last part, the rows in the first ones
            for i in range(5, len(lines), len(lines) // 7):
                written.append(lines[i] if i % 2 else _changed(lines[i], names))
                found[len(written) + 1] = int(fields[i][row_id])
        _write_table(out / f.name, header, written)
        copies[table] = found
    return copies


def _run(release: pathlib.Path, out: pathlib.Path, **options) -> dict:
    return run_job(str(release), str(out), PipelineConfig.model_validate(CONFIG), resources=SpillOptions(**options))


def _shards(out: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord.gz"))}


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """(clean release, release with repeats, {table: {line of a copy: ROW_ID}}, split threshold in bytes)."""
    base = tmp_path_factory.mktemp("repeats")
    clean = base / "clean"
    write_release(SynthConfig(**RELEASE), clean, show_progress=False)
    repeated = base / "repeated"
    copies = _with_repeats(clean, repeated)
    threshold = min((clean / f"{t}.csv.gz").stat().st_size for t in SPLIT_TABLES) // 3
    return clean, repeated, copies, threshold


@pytest.fixture(scope="module")
def runs(releases, tmp_path_factory):
    """The job on both releases, the big tables split into parts: (clean output, its manifest, repeated output,
    its manifest)."""
    clean, repeated, _, threshold = releases
    base = tmp_path_factory.mktemp("repeat_runs")
    clean_manifest = _run(clean, base / "clean", workers=1, split_threshold_bytes=threshold)
    manifest = _run(repeated, base / "repeated", workers=1, split_threshold_bytes=threshold,
                    temp_dir=str(base / "scratch"))
    return base / "clean", clean_manifest, base / "repeated", manifest


def test_the_tables_were_split_into_parts(releases):
    clean, repeated, _, threshold = releases
    assert all((repeated / f"{t}.csv.gz").stat().st_size > 2 * threshold for t in SPLIT_TABLES)


def test_records_equal_the_release_without_repeats(runs):
    clean_out, _, out, _ = runs
    assert _shards(out) == _shards(clean_out) and _shards(out)
    for name in (layout.VOCABULARY, layout.NUMERIC_STATS):
        assert (out / name).read_bytes() == (clean_out / name).read_bytes()
    # The unit census counts rows as they are read, repeats included: only its row counts may differ.
    units, clean_units = (json.loads((o / layout.UNITS).read_text()) for o in (out, clean_out))
    assert units["canonical"] == clean_units["canonical"]


def test_every_repeat_is_counted_and_the_accounting_balances(runs, releases):
    _, clean_manifest, _, manifest = runs
    copies = releases[2]
    assert manifest["balanced"]
    for table, found in copies.items():
        t, c = manifest["tables"][table], clean_manifest["tables"][table]
        assert t["rows_read"] == c["rows_read"] + len(found)
        cohort, clean_cohort = t["cohort_filter"], c["cohort_filter"]
        # Each copy is used nowhere: counted a repeat where it reaches an admission, else filtered as its row is.
        assert cohort["used"] == clean_cohort["used"]
        assert cohort.get("duplicate_row_id", 0) + cohort["not_in_cohort"] + cohort["at_or_after_trigger"] == (
            clean_cohort["not_in_cohort"] + clean_cohort["at_or_after_trigger"] + len(found))
        assert t["extract"]["kept"] == sum(cohort.values())
    counted = {t: manifest["tables"][t]["cohort_filter"].get("duplicate_row_id", 0) for t in copies}
    assert all(counted[t] for t in SPLIT_TABLES), counted  # these tables' copies do reach admissions
    assert "duplicate_row_id" not in json.dumps(clean_manifest)
    summary = format_manifest_summary(manifest)
    for table in SPLIT_TABLES:
        assert f"{table}: {counted[table]:,} rows repeat a ROW_ID" in summary


def test_every_counted_repeat_is_dead_lettered_naming_its_file_and_line(runs, releases):
    _, _, out, manifest = runs
    repeated, copies = releases[1], releases[2]
    for table, found in copies.items():
        n = manifest["tables"][table]["cohort_filter"].get("duplicate_row_id", 0)
        path = out / "dead_letter" / f"{table}.duplicate_row_id.jsonl"
        if not n:
            assert not path.exists()
            continue
        letters = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(letters) == n and all(d["reason"] == "duplicate_row_id" for d in letters)
        # The release's file and the copy's line there, for split tables too (not the job's temporary parts).
        for d in letters:
            assert pathlib.Path(d["file"]) == repeated / f"{table}.csv.gz"
            assert d["line"] in found and f"ROW_ID {found[d['line']]} " in d["detail"]
        # Every letter names a different row: a repeat is dead-lettered once, however many admissions it feeds.
        assert len({(d["file"], d["line"]) for d in letters}) == len(letters)


def test_two_workers_and_a_rerun_give_the_same_bytes(runs, releases, tmp_path):
    _, _, out, manifest = runs
    _, repeated, _, threshold = releases
    again = _run(repeated, tmp_path / "again", workers=2, split_threshold_bytes=threshold)
    assert _shards(tmp_path / "again") == _shards(out)
    assert again["tables"] == json.loads(json.dumps(manifest["tables"]))

    for p in sorted((out / "dead_letter").glob("*.duplicate_row_id.jsonl")):
        assert (tmp_path / "again" / "dead_letter" / p.name).read_bytes() == p.read_bytes()


def test_to_meds_writes_the_release_without_repeats_and_dead_letters_every_one(releases, tmp_path):
    clean, repeated, copies, threshold = releases
    clean_manifest = run_to_meds(str(clean), str(tmp_path / "clean"), PipelineConfig.model_validate(CONFIG),
                                 resources=SpillOptions(workers=1, split_threshold_bytes=threshold))
    manifest = run_to_meds(str(repeated), str(tmp_path / "repeated"), PipelineConfig.model_validate(CONFIG),
                           resources=SpillOptions(workers=2, split_threshold_bytes=threshold))
    data = sorted((tmp_path / "clean" / "data").rglob("*.parquet"))
    assert data and all(p.read_bytes() == (tmp_path / "repeated" / p.relative_to(tmp_path / "clean")).read_bytes()
                        for p in data)
    assert manifest["balanced"]
    for table, found in copies.items():
        t = manifest["tables"][table]
        # to-meds writes every event, and a copy lies with its row's subject: every copy is found.
        assert t["extract"]["duplicate_row_id"] == len(found)
        assert t["meds_rows_written"] == clean_manifest["tables"][table]["meds_rows_written"]
        letters = [json.loads(x) for x in
                   (tmp_path / "repeated" / "dead_letter" / f"{table}.duplicate_row_id.jsonl").read_text().splitlines()]
        assert {d["line"]: int(d["detail"].split()[1]) for d in letters} == found
        assert {pathlib.Path(d["file"]) for d in letters} == {repeated / f"{table}.csv.gz"}
