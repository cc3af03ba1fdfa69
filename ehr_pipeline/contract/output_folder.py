"""A command's output folder: one run's whole result, or untouched.

Every command that writes a folder (``ehr-pipeline run``, ``to-meds``, ``synth``, the exports of
``ehr-train``, ``ehr-adapt`` and ``ehr-eval --export-ensemble``, ``ehr-eval``'s report) writes it
through ``staged``:

* the run writes into a staging folder beside the target (``TARGET.inprogress-PID``, on the same
  filesystem), never under the target's name;
* when the run completes, the staging folder receives the marker ``ehr_output.json`` (which command
  wrote it, what kind of folder it is, every file in it) and takes the target's place in one
  rename; a previous output is moved aside in the same step and removed only then;
* a run that fails or is interrupted removes its staging folder; one that is killed leaves it, and
  the next run into the same target removes it (its staging note names a process that is gone).

So a folder is always one run's whole result (a reader never meets another run's files under a
manifest, or a half-written shard) or what it was before the run. What a command may replace:

* a missing folder, or an empty one;
* with ``overwrite``, a folder whose marker says it holds the same kind of output and whose files
  are all listed in that marker: the files this project wrote. A file someone added since, or a
  folder of another kind (a data folder named as an export's ``--out``) is refused whatever the flag,
  with one line naming it: nothing is ever deleted that the command did not write.

Remote targets (gs://, s3://) have no folder rename: they are refused as outputs of a replace
unless empty or absent, and written in place with the marker last (``staged`` yields the URL).

Standard library only (the service and ``--help`` paths import it for free).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
import pathlib
import shutil
import socket
from collections.abc import Iterable, Iterator, Sequence

log = logging.getLogger(__name__)

MARKER = "ehr_output.json"
MARKER_VERSION = 1
# The kinds of folder the project's commands write (a marker's "kind"): a command replaces only its own kind.
DATA_FOLDER = "data folder"  # ehr-pipeline run
MEDS_DATASET = "MEDS dataset"  # ehr-pipeline to-meds
SYNTHETIC_RELEASE = "synthetic release"  # ehr-pipeline synth
MODEL_EXPORT = "model export"  # ehr-train's OUT/export, ehr-adapt, ehr-eval --export-ensemble
EVALUATION = "evaluation"  # ehr-eval --out, ehr-analyze's reports
# A staging folder's own note: which process writes it, so a later run can tell a killed run's leftovers.
_STAGING_NOTE = "owner.json"
_STAGING = ".inprogress-"
_ASIDE = ".replaced-"


class OutputFolderError(ValueError):
    """An output folder this command may not write or replace; the message is one line naming it."""


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether a path is a filesystem URL (gs://, s3://, hdfs://) rather than a local path."""
    return "://" in os.fspath(path)


def read_marker(folder: str | os.PathLike[str]) -> dict | None:
    """The folder's marker (kind, command, files), or None when it has none that this code reads."""
    path = pathlib.Path(folder) / MARKER
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("files"), list) and isinstance(doc.get("kind"), str)):
        return None
    return doc


def folder_files(folder: str | os.PathLike[str]) -> list[str]:
    """Every file under a folder, as sorted POSIX paths relative to it (symbolic links count as files)."""
    root = pathlib.Path(folder)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


def unlisted_files(folder: str | os.PathLike[str]) -> list[str]:
    """Files in a marked folder that its marker does not list (files someone added), sorted; [] without a marker."""
    marker = read_marker(folder)
    if marker is None:
        return []
    listed = set(marker["files"]) | {MARKER}
    return [f for f in folder_files(folder) if f not in listed]


def check_target(target: str | os.PathLike[str], *, kind: str, overwrite: bool,
                 inputs: Sequence[str | os.PathLike[str]] = ()) -> None:
    """Refuses, with one line, a target the command may not write (module docstring); call it before any work.

    ``inputs``: the folders and files the command reads; a target equal to, inside or around one is refused.
    """
    if is_url(target):
        return _check_remote(os.fspath(target), overwrite)
    path = _real(target)
    for given in inputs:
        if given is None or is_url(given):
            continue
        source = _real(given)
        if path == source or path in source.parents or source in path.parents:
            raise OutputFolderError(f"{target}: the output folder may not be, hold or lie inside an input "
                                    f"({given}); choose another folder")
    if path == pathlib.Path.cwd() or path in pathlib.Path.cwd().parents:
        raise OutputFolderError(f"{target}: the output folder may not be the working directory or above it; "
                                "name a folder inside it")
    if not path.exists():
        return
    if not path.is_dir():
        raise OutputFolderError(f"{target} is a file, not a folder")
    if not any(path.iterdir()):
        return
    marker = read_marker(path)
    if marker is None:
        raise OutputFolderError(f"{target} is not empty and holds no {MARKER} (not an output of this project, or "
                                f"one written before outputs carried it): choose a new folder, or move its files "
                                "away first; it is never overwritten")
    if marker["kind"] != kind:
        raise OutputFolderError(f"{target} holds a {marker['kind']} (written by {marker.get('command', '?')}), "
                                f"not a {kind}: choose another folder")
    extra = unlisted_files(path)
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise OutputFolderError(f"{target} holds {extra[0]}{more}, which {marker.get('command', 'the command')} did "
                                f"not write: move it away first; it is never overwritten")
    if not overwrite:
        raise OutputFolderError(f"{target} already holds a {kind} (written by {marker.get('command', '?')}): pass "
                                "--overwrite to replace it whole, or choose another folder")


def _check_remote(target: str, overwrite: bool) -> None:
    """A remote target must be absent or empty: object stores cannot swap a folder in one step."""
    # Beam's FileSystems, imported only for a URL target: the job has imported Beam already.
    from apache_beam.io.filesystems import FileSystems

    prefix = target.rstrip("/") + "/"
    found = FileSystems.match([prefix + "**"])[0].metadata_list
    if found:
        raise OutputFolderError(f"{target} is not empty: a remote output folder must be new (object stores cannot "
                                f"replace a folder in one step{'; --overwrite does not apply there' if overwrite else ''})")


@contextlib.contextmanager
def staged(target: str | os.PathLike[str], *, kind: str, command: str, overwrite: bool,
           inputs: Sequence[str | os.PathLike[str]] = ()) -> Iterator[str]:
    """Yields a staging folder to write the output in; moves it into place whole when the block completes.

    ``kind`` names what the folder holds ('data folder', 'model export', ...), ``command`` who writes it.
    On an exception the staging folder is removed and the target is left as it was.
    """
    check_target(target, kind=kind, overwrite=overwrite, inputs=inputs)
    if is_url(target):
        yield os.fspath(target)
        _write_remote_marker(os.fspath(target), kind, command)
        return
    path = _real(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(path)
    # The staging folder holds the owner's note and the output beside it, so the output holds only its own files.
    wrapper = path.with_name(f"{path.name}{_STAGING}{os.getpid()}")
    if wrapper.exists():  # this very process's earlier attempt, e.g. a retried call in a test
        shutil.rmtree(wrapper)
    wrapper.mkdir()
    (wrapper / _STAGING_NOTE).write_text(json.dumps(_owner()), encoding="utf-8")
    staging = wrapper / path.name
    staging.mkdir()
    try:
        yield str(staging)
        write_marker(staging, kind=kind, command=command)
        # The target may have changed while the run worked (another run, a user): check it again.
        check_target(path, kind=kind, overwrite=overwrite)
        _swap_in(staging, path)
    finally:
        shutil.rmtree(wrapper, ignore_errors=True)


def write_marker(folder: str | os.PathLike[str], *, kind: str, command: str,
                 files: Iterable[str] | None = None) -> dict:
    """Writes the folder's marker listing every file in it (or ``files``); returns the marker."""
    folder = pathlib.Path(folder)
    listed = sorted(set(folder_files(folder) if files is None else files) - {MARKER})
    # No times, no paths: two runs on the same input keep byte-identical folders.
    doc = {"marker_version": MARKER_VERSION, "kind": kind, "command": command, "files": listed}
    (folder / MARKER).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return doc


def _write_remote_marker(target: str, kind: str, command: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    prefix = target.rstrip("/") + "/"
    names = sorted(m.path[len(prefix):] for m in FileSystems.match([prefix + "**"])[0].metadata_list)
    doc = {"marker_version": MARKER_VERSION, "kind": kind, "command": command,
           "files": [n for n in names if n != MARKER]}
    with FileSystems.create(prefix + MARKER) as f:
        f.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def clean_leftovers(target: str | os.PathLike[str]) -> list[str]:
    """Removes staging folders of dead runs beside ``target`` and restores an output a killed swap moved aside.

    Only folders carrying this module's staging note (or named as moved aside by it) are touched;
    returns what was removed or restored, each logged.
    """
    path = _real(target)
    done = []
    if not path.parent.is_dir():
        return done
    for sibling in sorted(path.parent.glob(f"{path.name}{_STAGING}*")):
        note = _read_owner(sibling / _STAGING_NOTE)
        if note is None or _alive(note):
            continue
        shutil.rmtree(sibling, ignore_errors=True)
        log.info("removed %s, left by a run that ended before completing (pid %s)", sibling, note.get("pid"))
        done.append(str(sibling))
    for aside in sorted(path.parent.glob(f"{path.name}{_ASIDE}*")):
        if read_marker(aside) is None or _alive({"pid": aside.name.rsplit("-", 1)[-1], "host": socket.gethostname()}):
            continue
        if not path.exists():
            aside.rename(path)
            log.warning("restored %s from %s: a run was stopped while replacing it", path, aside)
        else:
            shutil.rmtree(aside, ignore_errors=True)
            log.info("removed %s, the previous output a stopped run had replaced", aside)
        done.append(str(aside))
    return done


def _swap_in(staging: pathlib.Path, path: pathlib.Path) -> None:
    """Puts the staging folder under the target's name; a previous output is exchanged out, then removed."""
    if not path.exists():
        os.rename(staging, path)
        return
    if not any(path.iterdir()):
        path.rmdir()  # an empty folder (made by the user, or by --out's parent creation) holds nothing to keep
        os.rename(staging, path)
        return
    if _exchange(staging, path):  # one atomic step: the target is never absent; the old output is removed with
        return                    # the staging folder
    aside = path.with_name(f"{path.name}{_ASIDE}{os.getpid()}")
    os.rename(path, aside)
    # Killed between these two renames, the target is missing for an instant: clean_leftovers puts it back.
    os.rename(staging, path)
    shutil.rmtree(aside)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swaps two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where it is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.ENOTSUP):  # a filesystem or kernel without it
        return False
    raise OSError(err, os.strerror(err), str(b))


def _real(target: str | os.PathLike[str]) -> pathlib.Path:
    return pathlib.Path(os.path.realpath(os.path.abspath(os.fspath(target))))


def _owner() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _read_owner(path: pathlib.Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def process_gone(pid: int, host: str) -> bool:
    """Whether process `pid` of machine `host` has ended; another machine's, or another user's, counts as running."""
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _alive(owner: dict) -> bool:
    """Whether the process a note names may still run (another host's: assumed alive, never removed)."""
    try:
        pid = int(owner.get("pid"))
    except (TypeError, ValueError):
        return True
    if pid == os.getpid() and owner.get("host") == socket.gethostname():
        return False  # this process is starting a new run: its own earlier staging is a leftover
    return not process_gone(pid, str(owner.get("host")))
