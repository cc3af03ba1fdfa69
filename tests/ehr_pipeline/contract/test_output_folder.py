"""output_folder: a command's folder is one run's whole result or untouched, and nothing it did not write is deleted.

The checks compare the whole tree (every file's path and bytes) before and after, so a file lost, added or
altered anywhere fails them; killed runs are real processes killed with SIGKILL.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ehr_pipeline.contract import output_folder
from ehr_pipeline.contract.output_folder import MARKER, OutputFolderError, staged

KIND, COMMAND = "data folder", "ehr-pipeline run"


def tree(folder: pathlib.Path) -> dict[str, str]:
    """Every file under folder -> the SHA-256 of its bytes (the folder's whole content)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write_run(target: pathlib.Path, files: dict[str, str], *, overwrite: bool = False, kind: str = KIND) -> None:
    """A 'run' that writes `files` (relative path -> text) through staged."""
    with staged(target, kind=kind, command=COMMAND, overwrite=overwrite) as staging:
        for name, text in files.items():
            path = pathlib.Path(staging) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def test_a_new_folder_holds_the_run_and_a_marker_listing_every_file(tmp_path):
    write_run(tmp_path / "out", {"a.txt": "1", "dead_letter/x.jsonl": "2"})
    assert tree(tmp_path / "out").keys() == {"a.txt", "dead_letter/x.jsonl", MARKER}
    marker = json.loads((tmp_path / "out" / MARKER).read_text())
    assert marker == {"marker_version": 1, "kind": KIND, "command": COMMAND, "files": ["a.txt", "dead_letter/x.jsonl"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside it


def test_an_earlier_output_is_refused_without_overwrite_and_replaced_whole_with_it(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"train-0.rec": "old", "stale-only-in-old.rec": "old"})
    before = tree(out)
    with pytest.raises(OutputFolderError, match="--overwrite"):
        write_run(out, {"train-0.rec": "new"})
    assert tree(out) == before
    write_run(out, {"train-0.rec": "new"}, overwrite=True)
    assert (out / "train-0.rec").read_text() == "new"
    assert not (out / "stale-only-in-old.rec").exists()  # no file of the old run survives beside the new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_the_command_did_not_write_is_never_touched(tmp_path, overwrite):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputFolderError, match=f"holds no {MARKER}"):
        write_run(mine, {"a": "1"}, overwrite=overwrite)
    assert tree(mine) == {"notes.txt": hashlib.sha256(b"keep me").hexdigest()}
    # A file added to an output this project wrote is not the command's either.
    out = tmp_path / "out"
    write_run(out, {"a": "1"})
    (out / "added.txt").write_text("theirs")
    before = tree(out)
    with pytest.raises(OutputFolderError, match="added.txt, which ehr-pipeline run did not write"):
        write_run(out, {"a": "2"}, overwrite=overwrite)
    assert tree(out) == before


def test_another_kind_of_output_is_refused_whatever_the_flag(tmp_path):
    write_run(tmp_path / "data", {"a": "1"})
    before = tree(tmp_path / "data")
    with pytest.raises(OutputFolderError, match="holds a data folder .* not a model export"):
        write_run(tmp_path / "data", {"b": "1"}, overwrite=True, kind="model export")
    assert tree(tmp_path / "data") == before


def test_an_empty_folder_or_a_missing_parent_is_written(tmp_path):
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "empty", {"a": "1"})
    write_run(tmp_path / "x" / "y" / "z", {"a": "1"})
    assert (tmp_path / "empty" / "a").read_text() == (tmp_path / "x" / "y" / "z" / "a").read_text() == "1"


def test_a_failed_run_leaves_the_previous_output_and_no_staging(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"a": "old"})
    before = tree(out)
    with pytest.raises(RuntimeError, match="disk on fire"):
        with staged(out, kind=KIND, command=COMMAND, overwrite=True) as staging:
            (pathlib.Path(staging) / "a").write_text("half")
            raise RuntimeError("disk on fire")
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("target, inputs, why", [
    ("data", ["data"], "may not be, hold or lie inside an input"),
    ("data/out", ["data"], "may not be, hold or lie inside an input"),
    ("runs", ["runs/model/export"], "may not be, hold or lie inside an input"),
])
def test_an_output_overlapping_an_input_is_refused(tmp_path, target, inputs, why):
    (tmp_path / "runs" / "model" / "export").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    with pytest.raises(OutputFolderError, match=why):
        output_folder.check_target(tmp_path / target, kind=KIND, overwrite=True,
                                   inputs=[str(tmp_path / i) for i in inputs])


def test_the_working_directory_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputFolderError, match=r"^\.: the output folder may not be the working directory"):
        output_folder.check_target(".", kind=KIND, overwrite=True)


_KILLED_RUN = textwrap.dedent("""
    import os, pathlib, signal, sys
    from ehr_pipeline.contract.output_folder import staged
    with staged(sys.argv[1], kind="data folder", command="ehr-pipeline run", overwrite=True) as staging:
        (pathlib.Path(staging) / "a").write_text("half of a new run")
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_run_leaves_the_previous_output_and_the_next_run_clears_its_staging(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"a": "old"})
    before = tree(out)
    done = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(out)], cwd=pathlib.Path(__file__).parents[3])
    assert done.returncode == -signal.SIGKILL
    assert tree(out) == before
    left = [p.name for p in tmp_path.iterdir() if p.name != "out"]
    assert len(left) == 1 and left[0].startswith("out.inprogress-")
    write_run(out, {"a": "new"}, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "a").read_text() == "new"


def test_an_output_moved_aside_by_a_killed_swap_is_restored(tmp_path):
    # Where the filesystem cannot exchange two folders, the swap is two renames; a kill between them leaves
    # the previous output under TARGET.replaced-PID (a pid that no longer runs) and no target.
    out = tmp_path / "out"
    write_run(out, {"a": "old"})
    before = tree(out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    aside = tmp_path / f"out.replaced-{int(dead.stdout)}"
    out.rename(aside)
    assert output_folder.clean_leftovers(out) == [str(aside)]
    assert tree(out) == before and not aside.exists()


def test_the_two_rename_swap_replaces_like_the_exchange(tmp_path, monkeypatch):
    monkeypatch.setattr(output_folder, "_exchange", lambda a, b: False)  # a filesystem without renameat2
    out = tmp_path / "out"
    write_run(out, {"a": "old", "b": "old"})
    write_run(out, {"a": "new"}, overwrite=True)
    assert tree(out).keys() == {"a", MARKER} and (out / "a").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_folder_someone_else_named_like_a_staging_folder_is_never_removed(tmp_path):
    lookalike = tmp_path / "out.inprogress-1"
    lookalike.mkdir()
    (lookalike / "theirs").write_text("x")
    write_run(tmp_path / "out", {"a": "1"})
    assert (lookalike / "theirs").read_text() == "x"


_names = st.text(alphabet="abcdefgh._-", min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(st.lists(_names, min_size=1, max_size=3).map("/".join), st.binary(max_size=64),
                             min_size=1, max_size=6),
       overwrite=st.booleans(), with_marker=st.booleans())
def test_no_folder_with_a_file_the_command_did_not_write_is_ever_changed(tmp_path_factory, files, overwrite,
                                                                         with_marker):
    folder = tmp_path_factory.mktemp("theirs") / "out"
    if with_marker:  # an output of ours, to which someone added their files
        write_run(folder, {"ours.rec": "1"})
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        path = folder / name
        if any(parent.is_file() for parent in path.parents) or path.is_dir() or name in ("ours.rec", MARKER):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if not output_folder.unlisted_files(folder) and with_marker:
        return  # every generated file collided with the output's own: nothing of theirs to protect
    before = tree(folder)
    with pytest.raises(OutputFolderError):
        write_run(folder, {"new.rec": "2"}, overwrite=overwrite)
    assert tree(folder) == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ["out"]
