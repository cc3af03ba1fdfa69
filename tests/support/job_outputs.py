"""What the tests of the Beam job share: the demo job's config, reading its output, the cohort
recomputed from the raw tables without the project's code, and a worker's site-packages."""
from __future__ import annotations

import csv
import hashlib
import json
import datetime as dt
import gzip
import importlib.metadata
import pathlib
import tomllib

from packaging.requirements import Requirement

from ehr_pipeline.contract import spec, tfrecord
from ehr_pipeline.encode import seqex
from tests.support.paths import REPO_ROOT

# Huge max_bags so no event is dropped for age: every pre-trigger event must then appear.
CONFIG = {"num_shards": {"train": 2, "validation": 1, "test": 1},
          "bagging": {"max_bags": 100000}, "vocab": {"min_count": 1}}


def raw_rows(demo_dir, table):
    """The rows of a demo table as dicts of strings, read with the csv module only."""
    with gzip.open(demo_dir / f"{table}.csv.gz", "rt", newline="") as f:
        yield from csv.DictReader(f)


def utc_seconds(text):
    """A MIMIC timestamp (UTC, ISO) as seconds since the epoch; None for an empty field."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp() if text else None


def read_examples(out_dir) -> dict[int, dict]:
    """All examples of a job output, by HADM_ID, with their split."""
    out = {}
    for path in sorted(pathlib.Path(out_dir).glob(f"*{spec.TFRECORD_SUFFIX}")):
        split = path.name.split("-")[0]
        with open(path, "rb") as f:
            for rec in tfrecord.read_records(f):
                ex = seqex.sequence_example_to_dict(rec)
                ex["split"] = split
                ex["raw"] = rec
                out[ex[spec.HADM_ID]] = ex
    return out


def independent_cohort(demo_dir) -> dict[int, int]:
    """HADM_ID -> label from ADMISSIONS and PATIENTS, written without the project's code."""
    dob = {r["SUBJECT_ID"]: utc_seconds(r["DOB"]) for r in raw_rows(demo_dir, "PATIENTS")}
    cohort = {}
    for r in raw_rows(demo_dir, "ADMISSIONS"):
        admit, disch = utc_seconds(r["ADMITTIME"]), utc_seconds(r["DISCHTIME"])
        trigger = admit + 86400
        age = (admit - dob[r["SUBJECT_ID"]]) / (365.2425 * 86400)
        if age < 18:
            continue
        death = utc_seconds(r["DEATHTIME"])
        if death is None and r["HOSPITAL_EXPIRE_FLAG"] == "1":
            death = disch
        if death is not None and death <= trigger:
            continue
        if death is None and disch <= trigger:
            continue
        cohort[int(r["HADM_ID"])] = int(death is not None)
    return cohort


def norm(name: str) -> str:
    """A distribution name as the packaging standards compare them."""
    return name.lower().replace("_", "-").replace(".", "-")


def job_group_closure() -> set[str]:
    """Normalised names of the `job` group's distributions and everything they require, recursively."""
    todo = [(Requirement(r), "") for r in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["job"]]
    seen: set[str] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = norm(req.name)
        extras = sorted(req.extras) or [""]
        if all(f"{name}[{e}]" in seen for e in extras):
            continue
        seen.update(f"{name}[{e}]" for e in extras)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend((Requirement(r), e) for r in requires for e in extras)
    return {key.partition("[")[0] for key in seen}


def job_group_site(target: pathlib.Path) -> pathlib.Path:
    """A site-packages holding only the job group's installed distributions (as links): a worker's."""
    allowed = job_group_closure()
    target.mkdir()
    for dist in importlib.metadata.distributions():
        if norm(dist.metadata["Name"]) not in allowed:
            continue
        for top in {f.parts[0] for f in dist.files or ()}:
            source = pathlib.Path(dist.locate_file(top))
            # '..' leads to scripts outside site-packages; .pth files only extend paths we do not want.
            if top != ".." and not top.endswith(".pth") and source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
    return target


# The synthetic release the job's byte-identity tests run on (small, every event table present).
SYNTH_RELEASE = {"patients": 150, "seed": 3, "events_scale": 0.5}


def output_digests(out_dir) -> dict[str, str]:
    """sha256 of every file of a job output folder by relative path (not run_info.json); the manifest without its
    input paths.

    The manifest records where the input was read from (an absolute path): that part may differ
    between two runs on copies of one release; the rest of it, as every other file, may not.
    """
    out_dir = pathlib.Path(out_dir)
    digests = {}
    # run_info.json records how long the run took: the one file that is not the same on a rerun.
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != "run_info.json"):
        rel = path.relative_to(out_dir).as_posix()
        data = path.read_bytes()
        if rel == "manifest.json":
            doc = json.loads(data)
            doc["input"] = {k: v for k, v in doc["input"].items() if not k.endswith("_dir")}
            data = json.dumps(doc, sort_keys=True).encode()
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests
