"""The machine a local run uses: a bounded --workers, the open-file limit, a full disk, and the spill folders
of runs that died (each answered in one line, nothing of another run or program removed)."""
from __future__ import annotations

import errno
import json
import os
import resource
import signal
import socket
import subprocess
import sys

import pytest
from pydantic import ValidationError

from ehr_pipeline.cli.main import build_parser
from ehr_pipeline.job import SpillOptions, spill, temp_disk
from tests.support.paths import REPO_ROOT


def test_workers_above_two_per_core_are_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert SpillOptions(workers=6).workers == 6
    with pytest.raises(ValidationError, match="7 workers is more than 6"):
        SpillOptions(workers=7)
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--mimic-dir", str(REPO_ROOT), "--out", "x", "--workers", "100000"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "100000 is more than 6" in err, err


def test_a_short_soft_open_file_limit_is_raised_to_what_the_buckets_need():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 300 + spill.BASE_OPEN_FILES
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"hard open-file limit {hard} is below {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed - 1, hard))
    try:
        assert spill.ensure_open_files(300, None) == needed
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == needed
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_open_file_limit_below_the_buckets_is_one_line_naming_the_fix():
    # A hard limit cannot be raised again: lowered in a process of its own.
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)); "
            "from ehr_pipeline.job import spill; spill.ensure_open_files(1000, 'pass a larger --bucket-admissions')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("ehr_pipeline.job.spill.OpenFilesError: 1,000 buckets need "
                                                    f"about {1000 + spill.BASE_OPEN_FILES:,} open files"), last
    assert "ulimit -n 1128" in last and "--bucket-admissions" in last


def _marked(folder, pid: int, host: str) -> None:
    folder.mkdir()
    (folder / "events").mkdir()
    (folder / "events" / "x.frames").write_bytes(b"\0" * 10)
    (folder / spill.OWNER_FILE).write_text(json.dumps({"pid": pid, "host": host, "started": 0}))


def test_only_marked_folders_of_dead_runs_on_this_machine_are_removed(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # its pid names no process now
    _marked(tmp_path / "ehr-pipeline-spill-dead", ended.pid, socket.gethostname())
    _marked(tmp_path / "ehr-pipeline-spill-alive", os.getpid(), socket.gethostname())
    _marked(tmp_path / "ehr-pipeline-spill-elsewhere", ended.pid, "another-host")
    (tmp_path / "ehr-pipeline-spill-unmarked").mkdir()
    (tmp_path / "someone-elses").mkdir()
    assert spill.remove_dead_spill_folders(str(tmp_path)) == [str(tmp_path / "ehr-pipeline-spill-dead")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ehr-pipeline-spill-alive", "ehr-pipeline-spill-elsewhere", "ehr-pipeline-spill-unmarked", "someone-elses"]


def test_a_run_marks_its_folder_and_removes_it_on_sigterm(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with spill.spill_run(str(tmp_path / "out"), str(tmp_path), [], 1 << 20) as folder:
            owner = json.loads(open(os.path.join(folder, spill.OWNER_FILE)).read())
            assert (owner["pid"], owner["host"]) == (os.getpid(), socket.gethostname())
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this thread before the next line
    assert not os.path.exists(folder)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the run's only


def test_a_full_disk_inside_the_run_is_one_line_naming_the_folder_and_the_bytes(tmp_path):
    table = tmp_path / "LABEVENTS.csv.gz"
    table.write_bytes(b"\x1f\x8b" + b"\0" * 998)
    with pytest.raises(temp_disk.NotEnoughDiskError) as err:
        with spill.spill_run(str(tmp_path / "out"), str(tmp_path / "scratch"), [("LABEVENTS", str(table))],
                             1 << 20) as folder:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    message = str(err.value)
    needed = int(temp_disk.SPILL_BYTES_PER_INPUT_BYTE * 1000)
    assert message.startswith(f"{folder}: the disk filled up") and f"about {needed:,} bytes" in message
    assert "\n" not in message and not os.path.exists(folder)


def test_a_full_disk_is_recognised_in_a_beam_workers_error_text():
    # What the local runner raises on the driver for a worker's OSError: its traceback as text.
    worker = RuntimeError("Pipeline failed: Traceback ...\n    f.write(...)\nOSError: [Errno 28] No space left on device "
                          "[while running 'Source/SpillTables']")
    assert temp_disk.is_disk_full(worker)
    assert not temp_disk.is_disk_full(RuntimeError("OSError: [Errno 2] No such file or directory"))
    try:
        raise ValueError("a bundle failed") from OSError(errno.EDQUOT, "quota")
    except ValueError as chained:
        assert temp_disk.is_disk_full(chained)
