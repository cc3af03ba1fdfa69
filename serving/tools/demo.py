"""The last step of `make demo`: serve the demo model, score one demo admission, stop.

The request is built from the raw MIMIC-III tables (not from the TFRecords), so it travels
the same road a hospital's request would: raw events -> the service's bagging -> the model.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import sys
import tempfile

import ehr_base  # noqa: F401  (pins the Keras flavour before anything imports TensorFlow)
from ehr_base.cli_args import DefaultsOnceFormatter
from ehr_pipeline.contract import spec, tfrecord
from ehr_pipeline.encode import seqex
from serving.tools.server_process import ServerProcess


def _iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(int(seconds), tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def first_test_admission(data_dir: pathlib.Path) -> tuple[int, int]:
    """(SUBJECT_ID, HADM_ID) of the first example of the test split."""
    for path in sorted(data_dir.glob(spec.split_file_pattern("test"))):
        with open(path, "rb") as f:
            for rec in tfrecord.read_records(f):
                ex = seqex.sequence_example_to_dict(rec)
                return ex[spec.SUBJECT_ID], ex[spec.HADM_ID]
    raise SystemExit(f"no test examples in {data_dir}")


def build_request(mimic_dir: pathlib.Path, subject_id: int, hadm_id: int, after_hours: float = 12.0) -> dict:
    """A /v1/predict body for one admission from the raw tables, with events up to trigger + after_hours."""
    import pyarrow.compute as pc

    # why: the raw-table reader loads pyarrow, which the demo needs only here
    from ehr_pipeline.mimic import build_cohort
    from ehr_pipeline.mimic import events as ev
    from ehr_pipeline.reader import TableReader, locate_table, read_table

    adm, _ = read_table(locate_table(mimic_dir, "ADMISSIONS"), "ADMISSIONS")
    pat, _ = read_table(locate_table(mimic_dir, "PATIENTS"), "PATIENTS")
    coh = build_cohort(adm, pat)
    row = adm.filter(pc.equal(adm["HADM_ID"], hadm_id)).to_pylist()[0]
    # The previous stay's discharge as the job found it (the admission is a test example, so in the cohort).
    (kept,) = coh.table.filter(pc.equal(coh.table["HADM_ID"], hadm_id)).to_pylist() or [None]
    previous = None if kept is None or kept["previous_discharge_seconds"] == spec.NO_PREVIOUS_DISCHARGE \
        else kept["trigger_time"] - kept["previous_discharge_seconds"]
    person = pat.filter(pc.equal(pat["SUBJECT_ID"], subject_id)).to_pylist()[0]
    horizon = row["ADMITTIME"] + 86400 + int(after_hours * 3600)
    events = []
    for table in ev.TABLE_SOURCE:
        path = locate_table(mimic_dir, table)
        if path is None:
            continue
        for batch in TableReader(path, table, columns=ev.EXTRACTORS[table][1]):
            out, _ = ev.extract(table, batch, coh.discharges)
            out = out.filter(pc.and_(pc.equal(out["SUBJECT_ID"], subject_id), pc.less(out["time"], horizon)))
            for e in out.to_pylist():
                source, code = e["code"].split(":", 1)
                item = {"time": _iso(e["time"]), "source": source, "code": code}
                if e["value"] == e["value"]:  # not NaN
                    item["value"] = e["value"]
                    if e["unit"] is not None:  # the service converts it as the job does
                        item["unit"] = e["unit"]
                events.append(item)
    return {
        "id": f"demo-{hadm_id}",
        "patient": {"gender": person["GENDER"],
                    "date_of_birth": _iso(person["DOB"])[:10]},
        "admission": {"admit_time": _iso(row["ADMITTIME"]), "admission_type": row["ADMISSION_TYPE"],
                      "previous_discharge_time": None if previous is None else _iso(previous)},
        "events": sorted(events, key=lambda e: e["time"]),
    }


def main(argv: list[str] | None = None) -> int:
    """Starts ehr-serve on loopback, posts one demo admission, prints the answer, stops the server."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=DefaultsOnceFormatter)
    parser.add_argument("--model", required=True, help="export directory written by ehr-train")
    parser.add_argument("--data", required=True, help="the Beam job's output (to pick a test admission)")
    parser.add_argument("--mimic-dir", required=True, help="the raw release the request is built from")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the server")
    args = parser.parse_args(argv)

    import httpx

    subject_id, hadm_id = first_test_admission(pathlib.Path(args.data))
    body = build_request(pathlib.Path(args.mimic_dir), subject_id, hadm_id)
    with tempfile.TemporaryDirectory(prefix="ehr-demo-serve-") as tmp:
        server = ServerProcess(["--model", args.model, "--no-auth", "--log-level", "warning"],
                               log_path=pathlib.Path(tmp) / "server.log", startup_timeout_s=args.timeout)
        with server:
            resp = httpx.post(f"{server.base_url}/v1/predict", json=body,
                              params={"num_samples": 25, "seed": 0}, timeout=60)
    print(f"POST /v1/predict  (admission {hadm_id}, {len(body['events'])} raw events) -> {resp.status_code}")
    answer = resp.json()
    keep = ("probability", "std", "interval", "predictive_entropy", "aleatoric", "epistemic",
            "member_probabilities", "refer", "referral", "events", "out_of_vocabulary", "calibration",
            "num_samples", "ensemble_size", "model")
    print(json.dumps({k: answer[k] for k in keep if k in answer}, indent=2))
    return 0 if resp.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
