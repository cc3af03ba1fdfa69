"""The shift report's and the service monitor's targets on synthetic releases: docs/shift.md's numbers.

  python bench/methods/shift_targets.py --work out/shift_targets                  # 2,000 patients per release
  python bench/methods/shift_targets.py --work out/shift_targets --patients 600   # a smaller, quicker check

Releases (``ehr_pipeline.synth``): site A seed S (the model's), three fresh site-A seeds,
site B (``--site B``: biased creatinine x1.15, lactate x1.2, glucose x1.1; local codes; half the
charting; older), and a site-A release rewritten in SI units (``si_release``: eleven analytes in
the units most of the world reports them in, published conventional -> SI factors), prepared
three ways: by the job on its own (its units.json says umol/L), with ``--units-from`` the model
(converted at the door), and with the SI numbers still labelled in the old units (mislabelled).
Each is bagged by the Beam job; a model (configs/ehr_demo.yaml) is trained on site A; every
other release gets ``ehr-analyze shift`` against it (all splits). Then the service monitor: a
real ``ehr-serve`` of that model receives the test admissions of a fresh site-A release and of
the SI release (values with their units, then as bare numbers without any unit) as requests, in
batches of --step, and /v1/monitor is read after each batch.

Writes WORK/results.json and, with --write-docs, the section "shift-targets" of docs/shift.md.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import json
import logging
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.harness import command_line, publish  # noqa: E402

log = logging.getLogger("shift_targets")
BIN = pathlib.Path(sys.executable).parent
# LABEVENTS ITEMID -> (SI per conventional unit, SI unit): clinical SI conversion tables (Young,
# Ann Intern Med 1987;106:114-129).
SI = {"50912": (88.4, "umol/L"), "50931": (0.0555, "mmol/L"), "51006": (0.357, "mmol/L"),
      "50893": (0.2495, "mmol/L"), "50960": (0.4114, "mmol/L"), "50970": (0.3229, "mmol/L"),
      "51222": (10.0, "g/L"), "50885": (17.1, "umol/L"), "50862": (10.0, "g/L"),
      "50818": (0.1333, "kPa"), "50821": (0.1333, "kPa")}
BIASED = ("lab:50912", "lab:50813", "lab:50931")


def si_release(site_a: pathlib.Path, out: pathlib.Path, relabel: bool = True) -> pathlib.Path:
    """site_a with the SI analytes' LABEVENTS values in SI units (4 significant digits); relabel=False keeps the old
    unit strings (a mislabelled export). The other tables are linked."""
    if out.exists():
        return out
    tmp = out.with_name(out.name + ".inprogress")
    tmp.mkdir(parents=True, exist_ok=True)
    for path in site_a.iterdir():
        if path.name != "LABEVENTS.csv.gz" and not (tmp / path.name).exists():
            (tmp / path.name).symlink_to(path.resolve())
    with gzip.open(site_a / "LABEVENTS.csv.gz", "rt", newline="") as f, \
            gzip.open(tmp / "LABEVENTS.csv.gz", "wt", newline="", compresslevel=1) as g:
        reader, writer = csv.reader(f), csv.writer(g)
        header = next(reader)
        writer.writerow(header)
        item, num, uom, val = (header.index(c) for c in ("ITEMID", "VALUENUM", "VALUEUOM", "VALUE"))
        for row in reader:
            if row[item] in SI and row[num]:
                factor, unit = SI[row[item]]
                row[num] = row[val] = f"{float(row[num]) * factor:.4g}"
                if relabel:
                    row[uom] = unit
            writer.writerow(row)
    tmp.rename(out)
    return out


def _run(argv: list[str], log_path: pathlib.Path) -> None:
    with open(log_path, "w") as f:
        subprocess.run(argv, check=True, stdout=f, stderr=subprocess.STDOUT)


def releases(work: pathlib.Path, args) -> dict[str, pathlib.Path]:
    """name -> data folder, every release generated and bagged (reused when already there)."""
    from ehr_pipeline.synth import generate_release

    raw = work / "releases"
    plan = {"site A (model)": ("A", args.seed)}
    for k in range(3):
        plan[f"site A seed {args.seed + 1 + k}"] = ("A", args.seed + 1 + k)
    plan["site B"] = ("B", args.seed)
    si_seed = args.seed + 4
    plan["_si_source"] = ("A", si_seed)
    made = {}
    for name, (site, seed) in plan.items():
        out = raw / f"{site}{seed}"
        if not (out / "SYNTH_TRUTH.csv").exists():
            generate_release(out, patients=args.patients, seed=seed, site=site, show_progress=False)
        made[name] = out
    source = made.pop("_si_source")
    made["SI units, own"] = si_release(source, raw / f"SI{si_seed}")
    made["SI units, mislabelled"] = si_release(source, raw / f"SI{si_seed}-mislabelled", relabel=False)
    data = {}
    for name, release in made.items():
        data[name] = work / "data" / release.name
        if not (data[name] / "manifest.json").exists():
            log.info("bagging %s", name)
            _run([str(BIN / "ehr-pipeline"), "run", "--mimic-dir", str(release), "--out", str(data[name])],
                 work / f"job-{release.name}.log")
    converted = work / "data" / f"SI{si_seed}-converted"
    if not (converted / "manifest.json").exists():
        _run([str(BIN / "ehr-pipeline"), "run", "--mimic-dir", str(made["SI units, own"]), "--out", str(converted),
              "--units-from", str(data["site A (model)"])], work / f"job-SI{si_seed}-converted.log")
    data["SI units, --units-from"] = converted
    return {"releases": made, "data": data}


def train(work: pathlib.Path, data: pathlib.Path, config: str) -> pathlib.Path:
    run = work / "run"
    if not (run / "export" / "manifest.json").exists():
        log.info("training %s on %s", config, data)
        _run([str(BIN / "ehr-train"), "--config", config, "--data", str(data), "--out", str(run), "--no-progress"],
             work / "train.log")
    return run / "export"


def shift_rows(export: pathlib.Path, data: dict[str, pathlib.Path]) -> list[dict]:
    from model.evaluation.run_evaluation import run_shift

    rows = []
    for name, folder in data.items():
        if name == "site A (model)":
            continue
        started = time.perf_counter()
        result = run_shift(export, folder)
        report = result.report
        named = sorted({f.subject for f in report.findings if f.kind in ("value_shift", "unit_mismatch")
                        and f.subject.startswith("lab:")})
        rows.append({"release": name, "level": report.level, "admissions": report.summary["n_current"],
                     "severe": sum(f.severity == "severe" for f in report.findings),
                     "moderate": sum(f.severity == "moderate" for f in report.findings),
                     "labs_named": named, "worst_psi": report.summary["worst_psi"],
                     "mi_above_p95": report.summary["mi_share_above_p95"],
                     "seconds": time.perf_counter() - started,
                     "findings": [f.to_json() for f in report.findings]})
        log.info("%s: %s", name, report.text(limit=8))
    return rows


def _iso(seconds: int) -> str:
    return (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=int(seconds))).isoformat()


def release_requests(mimic_dir: pathlib.Path, n: int, units: bool = True) -> list[dict]:
    """/v1/predict bodies of the first n test-split admissions of a release, from its raw tables (events as the job
    extracts them, up to the trigger time); units=False sends every value as a bare number."""
    import numpy as np
    import pyarrow as pa

    from ehr_pipeline.contract import PipelineConfig, splits
    from ehr_pipeline.mimic import cohort as cohort_mod
    from ehr_pipeline.mimic import events as ev
    from ehr_pipeline.reader import locate_table, read_table

    cfg = PipelineConfig()
    admissions, _ = read_table(locate_table(mimic_dir, "ADMISSIONS"), "ADMISSIONS")
    patients, _ = read_table(locate_table(mimic_dir, "PATIENTS"), "PATIENTS")
    coh = cohort_mod.build_cohort(admissions.select(list(cohort_mod.ADMISSION_COLUMNS)), patients,
                                  trigger_offset_seconds=cfg.trigger_offset_seconds)
    rows = sorted((r for r in coh.table.to_pylist()
                   if splits.assign_split(r["SUBJECT_ID"], cfg.splits.model_dump(), cfg.split_salt) == "test"),
                  key=lambda r: r["HADM_ID"])[:n]
    index = pa.Table.from_pylist(rows).select(["SUBJECT_ID", "HADM_ID", "trigger_time"])
    per_hadm: dict[int, list] = {r["HADM_ID"]: [] for r in rows}
    for table, (_, columns) in ev.EXTRACTORS.items():
        path = locate_table(mimic_dir, table)
        if path is None:
            continue
        block, _ = read_table(path, table, columns=columns)
        extracted, _ = ev.extract(table, block, coh.discharges)
        kept, _ = ev.filter_to_cohort(extracted, index)
        for hadm, times, codes, values, unit_names in ev.split_by_admission(kept):
            per_hadm[hadm].append((times, codes, values, unit_names))
    dob = dict(zip(patients.column("SUBJECT_ID").to_pylist(), patients.column("DOB").to_pylist()))
    bodies = []
    for row in rows:
        events = []
        for times, codes, values, unit_names in per_hadm[row["HADM_ID"]]:
            for t, c, v, u in zip(times, codes, values, unit_names):
                if t >= row["trigger_time"]:
                    continue
                source, code = str(c).split(":", 1)
                event = {"time": _iso(t), "source": source, "code": code}
                if not np.isnan(v):
                    event["value"] = float(v)
                    if units and u:
                        event["unit"] = str(u)
                events.append(event)
        bodies.append({"patient": {"gender": row["gender"], "date_of_birth": _iso(dob[row["SUBJECT_ID"]])[:10]},
                       "admission": {"admit_time": _iso(row["ADMITTIME"]), "admission_type": row["admission_type"]},
                       "events": events})
    return bodies


def monitor_rows(export: pathlib.Path, streams: dict[str, list[dict]], step: int, work: pathlib.Path) -> list[dict]:
    """Per stream: the monitor's level after every `step` requests on a fresh ehr-serve of the export."""
    import httpx

    from serving.tools.server_process import ServerProcess

    rows = []
    for name, bodies in streams.items():
        levels, findings = [], []
        with ServerProcess(["--model", str(export), "--no-auth", "--monitor-window", "500", "--max-events", "20000"],
                           log_path=work / f"serve-{len(rows)}.log", startup_timeout_s=300) as server, \
                httpx.Client(base_url=server.base_url, timeout=300.0) as client:
            for start in range(0, len(bodies), step):
                r = client.post("/v1/predict/batch", json={"patients": bodies[start:start + step]},
                                params={"seed": 0})
                r.raise_for_status()
                answer = client.get("/v1/monitor").json()
                levels.append((start + len(bodies[start:start + step]), answer["level"]))
                findings = answer["findings"]
        first = {lvl: next((n for n, got in levels if got in ({"moderate", "severe"} if lvl == "moderate"
                                                              else {"severe"})), None)
                 for lvl in ("moderate", "severe")}
        rows.append({"stream": name, "requests": levels[-1][0], "final": levels[-1][1], "levels": levels,
                     "first_moderate": first["moderate"], "first_severe": first["severe"],
                     "findings": [f["message"] for f in findings[:6]]})
        log.info("monitor %s: %s", name, levels)
    return rows


def to_markdown(results: dict, args, argv) -> str:
    lines = [f"Measured with `{command_line(__file__, argv)}` ({results['patients']} patients per release, model "
             f"`{args.config}` trained on site A seed {args.seed}; {results['date']}).", "",
             "| new data (all splits) | admissions | level | severe / moderate findings | labs named (value shift "
             "or unit mismatch) | worst PSI | MI above validation p95 |", "|---|---|---|---|---|---|---|"]
    for r in results["shift"]:
        mi = "-" if r["mi_above_p95"] is None else f"{100 * r['mi_above_p95']:.0f}%"
        lines.append(f"| {r['release']} | {r['admissions']} | **{r['level']}** | {r['severe']} / {r['moderate']} | "
                     f"{', '.join(r['labs_named']) or '-'} | {r['worst_psi']:.2f} | {mi} |")
    lines += ["", f"The service monitor (window 500) on a real `ehr-serve` of that model, {args.step} requests per "
              "batch, /v1/monitor read after each batch:", "",
              "| stream (test admissions as requests) | requests | level at the end | first moderate after | "
              "first severe after |", "|---|---|---|---|---|"]
    for r in results["monitor"]:
        lines.append(f"| {r['stream']} | {r['requests']} | **{r['final']}** | {r['first_moderate'] or '-'} | "
                     f"{r['first_severe'] or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--work", required=True, type=pathlib.Path, help="working folder (reused when re-run)")
    parser.add_argument("--patients", type=int, default=2000, help="patients per release")
    parser.add_argument("--seed", type=int, default=0, help="the model's site-A seed; fresh seeds follow it")
    parser.add_argument("--config", default="configs/ehr_demo.yaml", help="model config trained on site A")
    parser.add_argument("--requests", type=int, default=200, help="requests per monitor stream")
    parser.add_argument("--step", type=int, default=25, help="requests per batch call between monitor reads")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/shift.md's section")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    made = releases(work, args)
    export = train(work, made["data"]["site A (model)"], args.config)
    results = {"patients": args.patients, "date": dt.date.today().isoformat(),
               "shift": shift_rows(export, made["data"])}
    fresh = made["releases"][f"site A seed {args.seed + 1}"]
    si = made["releases"]["SI units, own"]
    streams = {"site A (fresh seed), units as written": release_requests(fresh, args.requests),
               "SI units, sent with their units": release_requests(si, args.requests),
               "SI units, sent as bare numbers": release_requests(si, args.requests, units=False)}
    results["monitor"] = monitor_rows(export, streams, args.step, work)
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    markdown = to_markdown(results, args, argv)
    publish("shift-targets", markdown, "docs/shift.md", write=args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
