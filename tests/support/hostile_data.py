"""Faulted copies of the MIMIC-III demo, one fault each, written to a test's tmp_path.

Each fault rewrites one table (the others are symlinks to the demo) and returns what a
correct reader must make of it: the exit code, the file (and line) a fatal error names, and
for readable faults the physical records of the table and the dead letters by line and reason.
Line numbers count the header as line 1, like the reader's dead letters.
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import pathlib
import zipfile
import zlib
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Expect:
    table: str
    file: str  # the file name a message or dead letter names
    exit_code: int = 0
    line: int | None = None  # the line a fatal error names
    message: str = ""  # a fragment the fatal error holds
    records: int | None = None  # physical records (data rows) of the faulted table
    dead: tuple[tuple[int, str], ...] = ()  # (line, reason) of every dead letter of the table


def _lines(demo: pathlib.Path, table: str) -> list[str]:
    """The demo table's physical lines without terminators (header first)."""
    return gzip.decompress((demo / f"{table}.csv.gz").read_bytes()).decode("utf-8").rstrip("\n").split("\n")


def _copy_except(demo: pathlib.Path, dest: pathlib.Path, *tables: str) -> None:
    """dest holds links to every demo table but `tables` (the ones the caller rewrites)."""
    dest.mkdir(parents=True, exist_ok=True)
    skip = {f"{table}.csv.gz" for table in tables}
    for p in demo.glob("*.csv.gz"):
        if p.name not in skip:
            (dest / p.name).symlink_to(p)


def _write(dest: pathlib.Path, name: str, lines: list[str], ending: str = "\n", gz: bool = True,
           raw: bytes | None = None) -> None:
    data = raw if raw is not None else (ending.join(lines) + ending).encode("utf-8")
    (dest / name).write_bytes(gzip.compress(data, mtime=0) if gz else data)


LAB = "LABEVENTS"
LAB_GZ = "LABEVENTS.csv.gz"


def truncated_gzip(demo, dest) -> Expect:
    data = (demo / LAB_GZ).read_bytes()[: (demo / LAB_GZ).stat().st_size // 2]
    _copy_except(demo, dest, LAB)
    (dest / LAB_GZ).write_bytes(data)
    complete = zlib.decompressobj(wbits=31).decompress(data).count(b"\n")  # lines ended before the cut
    return Expect(LAB, LAB_GZ, 2, line=complete, message="truncated")


def missing_column(demo, dest) -> Expect:
    rows = list(csv.reader(io.StringIO("\n".join(_lines(demo, LAB)))))
    drop = rows[0].index("VALUEUOM")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([r[:drop] + r[drop + 1:] for r in rows])
    _copy_except(demo, dest, LAB)
    _write(dest, LAB_GZ, [], raw=out.getvalue().encode())
    return Expect(LAB, LAB_GZ, 2, message="VALUEUOM")


def empty_file(demo, dest) -> Expect:
    _copy_except(demo, dest, LAB)
    (dest / LAB_GZ).write_bytes(b"")
    return Expect(LAB, LAB_GZ, 2, message="empty")


def plain_beside_gzip(demo, dest) -> Expect:
    _copy_except(demo, dest, LAB)
    (dest / LAB_GZ).symlink_to(demo / LAB_GZ)
    _write(dest, "LABEVENTS.csv", _lines(demo, LAB), gz=False)
    return Expect(LAB, "LABEVENTS.csv", 2, message=LAB_GZ)


def zip_named_gz(demo, dest) -> Expect:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("LABEVENTS.csv", "\n".join(_lines(demo, LAB)) + "\n")
    _copy_except(demo, dest, LAB)
    (dest / LAB_GZ).write_bytes(buf.getvalue())
    return Expect(LAB, LAB_GZ, 2)


def _faulted_lab(demo, dest, edit: Callable[[list[str]], list[tuple[int, str]]], ending="\n") -> Expect:
    lines = _lines(demo, LAB)
    dead = edit(lines)
    _copy_except(demo, dest, LAB)
    _write(dest, LAB_GZ, lines, ending=ending)
    return Expect(LAB, LAB_GZ, records=len(lines) - 1, dead=tuple(sorted(dead)))


def _at_end(lines):
    n = len(lines)
    lines += ["1,10006,,50912,2164-10-23 21:09:00,x,1.2.3,mg,", "2,10006,,50912", "3,x,,50912,,,,,"]
    return [(n + 1, "bad_number"), (n + 2, "field_count"), (n + 3, "bad_number")]


def dead_letters_at_end(demo, dest) -> Expect:
    return _faulted_lab(demo, dest, _at_end)


def _non_finite(lines):
    out = []
    for k, text in zip((10, 20, 30), ("inf", "1e400", "nan")):
        fields = lines[k].split(",")
        fields[6] = text  # VALUENUM
        lines[k] = ",".join(fields)
        out.append((k + 1, "bad_number"))
    return out


def non_finite_numbers(demo, dest) -> Expect:
    return _faulted_lab(demo, dest, _non_finite)


def stray_quote_physionet(demo, dest) -> Expect:
    """The current PhysioNet dialect (lowercase header, minimal quoting), one field opening a quote."""
    rows = list(csv.reader(io.StringIO("\n".join(_lines(demo, LAB)))))
    rows[0] = [h.lower() for h in rows[0]]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    lines = out.getvalue().rstrip("\n").split("\n")
    fields = lines[1001].split(",")
    fields[5] = '"' + fields[5]  # VALUE opens a quote that never closes on its line
    lines[1001] = ",".join(fields)
    _copy_except(demo, dest, LAB)
    _write(dest, LAB_GZ, lines)
    return Expect(LAB, LAB_GZ, records=len(lines) - 1, dead=((1002, "bad_quoting"),))


def _lost_quote(lines):
    k = next(i for i in range(1000, len(lines)) if lines[i].endswith('"mg/dL",'))
    lines[k] = lines[k][:-2] + ","
    return [(k + 1, "bad_quoting")]


def stray_quote_quoted(demo, dest) -> Expect:
    """The demo's quoted dialect: a unit's closing quote lost, so two rows would read as one."""
    return _faulted_lab(demo, dest, _lost_quote)


def unclosed_quote_at_end(demo, dest) -> Expect:
    def edit(lines):
        lines[-1] = lines[-1].rsplit(",", 1)[0] + ',"never closed'  # FLAG opens a quote
        return [(len(lines), "bad_quoting")]
    return _faulted_lab(demo, dest, edit)


def mixed_line_endings(demo, dest) -> Expect:
    lines = _lines(demo, LAB)
    text = "".join(line + ("\r\n" if i % 2 else "\n") for i, line in enumerate(lines))
    _copy_except(demo, dest, LAB)
    _write(dest, LAB_GZ, [], raw=text.encode())
    return Expect(LAB, LAB_GZ, records=len(lines) - 1)


def header_repeated(demo, dest) -> Expect:
    def edit(lines):
        lines.insert(500, lines[0])
        return [(501, "bad_number")]
    return _faulted_lab(demo, dest, edit)


def latin1_text(demo, dest) -> Expect:
    lines = _lines(demo, LAB)
    k = next(i for i in range(100, len(lines)) if '"mg/dL"' in lines[i])
    lines[k] = lines[k].replace('"mg/dL"', '"\u00b5g/dL"')
    data = "\n".join(lines).encode("utf-8").replace("\u00b5".encode("utf-8"), "\u00b5".encode("latin-1")) + b"\n"
    _copy_except(demo, dest, LAB)
    _write(dest, LAB_GZ, [], raw=data)
    return Expect(LAB, LAB_GZ, records=len(lines) - 1, dead=((k + 1, "bad_encoding"),))


def huge_single_line(demo, dest) -> Expect:
    """One 2 MB line: longer than the summary's 256 KiB blocks (a dead letter), not the job's 4 MiB."""
    def edit(lines):
        fields = lines[300].split(",")
        fields[5] = "x" * (2 << 20)  # VALUE
        lines[300] = ",".join(fields)
        return [(301, "line_too_long")]
    return _faulted_lab(demo, dest, edit)


def shuffled_columns(demo, dest) -> Expect:
    rows = list(csv.reader(io.StringIO("\n".join(_lines(demo, LAB)))))
    order = list(reversed(range(len(rows[0]))))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_MINIMAL).writerows([[r[i] for i in order] for r in rows])
    _copy_except(demo, dest, LAB)
    _write(dest, LAB_GZ, [], raw=out.getvalue().encode())
    return Expect(LAB, LAB_GZ, records=len(rows) - 1)


DIAGNOSES = "DIAGNOSES_ICD"


def _nul(lines):
    lines[40] = lines[40][:-1] + '\x00"'  # ICD9_CODE, the last field: "4019" -> "4019\0"
    return [(41, "nul_character")]


def nul_in_code(demo, dest) -> Expect:
    lines = _lines(demo, DIAGNOSES)
    dead = _nul(lines)
    _copy_except(demo, dest, DIAGNOSES)
    _write(dest, f"{DIAGNOSES}.csv.gz", lines)
    return Expect(DIAGNOSES, f"{DIAGNOSES}.csv.gz", records=len(lines) - 1, dead=tuple(dead))


FAULTS: dict[str, Callable[[pathlib.Path, pathlib.Path], Expect]] = {
    f.__name__: f for f in (
        truncated_gzip, missing_column, empty_file, plain_beside_gzip, zip_named_gz, dead_letters_at_end,
        non_finite_numbers, stray_quote_physionet, stray_quote_quoted, unclosed_quote_at_end,
        mixed_line_endings, header_repeated, latin1_text, huge_single_line, shuffled_columns, nul_in_code,
    )
}


def faulted_copy(demo: pathlib.Path, dest: pathlib.Path, fault: str) -> Expect:
    """Writes the demo with one fault to dest; returns what reading it must give."""
    return FAULTS[fault](pathlib.Path(demo), pathlib.Path(dest))


# Readable faults that can share one faulted copy: each rewrites lines no other touches (LABEVENTS' in the
# demo's own quoted dialect, appended ones last; DIAGNOSES_ICD's), so each one's dead letters stay its own.
TOGETHER: dict[str, tuple[str, Callable[[list[str]], list[tuple[int, str]]]]] = {
    "non_finite_numbers": (LAB, _non_finite), "stray_quote_quoted": (LAB, _lost_quote),
    "dead_letters_at_end": (LAB, _at_end), "nul_in_code": (DIAGNOSES, _nul)}


def faulted_together(demo: pathlib.Path, dest: pathlib.Path) -> dict[str, Expect]:
    """Writes the demo with every TOGETHER fault at once to dest; returns by fault what reading it must give:
    its table's physical records and the fault's own dead letters (a table's letters are its faults' union)."""
    demo, dest = pathlib.Path(demo), pathlib.Path(dest)
    tables = {table for table, _ in TOGETHER.values()}
    _copy_except(demo, dest, *tables)
    lines = {table: _lines(demo, table) for table in tables}
    dead = {fault: edit(lines[table]) for fault, (table, edit) in TOGETHER.items()}  # dict order: appending last
    for table, rows in lines.items():
        _write(dest, f"{table}.csv.gz", rows)
    return {fault: Expect(table, f"{table}.csv.gz", records=len(lines[table]) - 1, dead=tuple(sorted(dead[fault])))
            for fault, (table, _) in TOGETHER.items()}
