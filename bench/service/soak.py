"""Soak of the prediction service: 8 clients for 10 minutes against a real `ehr-serve`, monitor and /metrics included.

Starts ``python -m serving`` (the ehr-serve CLI) on 127.0.0.1 with an export and drives it from
this process with --clients threads (8) for --duration seconds (600). Each client draws, per
call, one of: ``POST /v1/predict`` (one admission), ``POST /v1/predict/batch`` (2-8 admissions),
``GET /metrics`` and ``GET /v1/monitor``. The admissions are real MIMIC-III-style records sent as
a hospital would send them: every cohort admission of the demo release (--mimic-dir) and of a
synthetic release made for the run (--synthetic-patients), their events before the prediction
time read from the raw tables by the Beam job's own extractors (``ehr_pipeline.mimic.events``), values
with the unit they were recorded in. Codes whose training values are all one value (the demo's
lab:50819, input:222011, ...) travel with them; the table says how many admissions carry one.

Prints a table (requests by route and status, latency, non-2xx on /metrics and /v1/monitor, the
monitor's levels and errors, the server's RSS at start / middle / end and its slope) and writes
the "soak" section of docs/benchmarks.md (bench/harness.py).

    python bench/service/soak.py --model out/demo/run/export            # the export `make demo` trains
    python bench/service/soak.py --model EXPORT --duration 30 --no-write
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import logging
import os
import pathlib
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the repo packages and bench/

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before anything imports TensorFlow)
import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench import harness  # noqa: E402

ROUTES = ("/v1/predict", "/v1/predict/batch", "/metrics", "/v1/monitor")
WEIGHTS = (0.45, 0.25, 0.15, 0.15)  # share of calls per route
MONITORED = ("/metrics", "/v1/monitor")  # the routes that summarise what the others sent: never non-2xx
# "Flat" RSS, both over the second half (the first holds the warm-up: TensorFlow's and the monitor's
# first allocations): a least-squares slope of at most 1 MiB/min, which a week without restart turns
# into at most ~10 GiB only if it never levels off, and end - middle of at most 10 MiB, under 1% of
# the ~1.2 GiB process, the size of one report's temporaries. A leak of the 18-34 MiB/min measured
# before the arena cap (serving/monitoring/malloc.py) breaks both by an order of magnitude.
RSS_SLOPE_LIMIT = 1.0  # MiB per minute over the second half
RSS_GROWTH_LIMIT = 10.0  # MiB, end - middle


def _iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(int(seconds), tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def release_requests(mimic_dir: pathlib.Path, max_events: int) -> list[dict]:
    """A /v1/predict body per cohort admission of a MIMIC-III release: its events before the prediction time.

    The cohort and the events are the Beam job's (``cohort.build_cohort``, ``events.extract``,
    ``events.filter_to_cohort``), read in one pass per table; the newest `max_events` events of
    an admission are kept (the server's limit).
    """
    import pyarrow as pa

    from ehr_pipeline.mimic import events as ev
    from ehr_pipeline.mimic import build_cohort
    from ehr_pipeline.reader import TableReader, locate_table, read_table

    adm, _ = read_table(locate_table(mimic_dir, "ADMISSIONS"), "ADMISSIONS")
    pat, _ = read_table(locate_table(mimic_dir, "PATIENTS"), "PATIENTS")
    cohort = build_cohort(adm, pat)
    parts = []
    for table in ev.TABLE_SOURCE:
        path = locate_table(mimic_dir, table)
        if path is None:
            continue
        for batch in TableReader(path, table, columns=ev.EXTRACTORS[table][1]):
            out, _ = ev.extract(table, batch, cohort.discharges)
            kept, _ = ev.filter_to_cohort(out, cohort.table)
            parts.append(kept)
    by_hadm = {}
    if parts:
        merged = pa.concat_tables(parts)
        merged = merged.take(np.lexsort((merged["time"].to_numpy(), merged["HADM_ID"].to_numpy())))
        by_hadm = {h: rest for h, *rest in ev.split_by_admission(merged)}
    bodies = []
    for row in cohort.table.to_pylist():
        times, codes, values, units = by_hadm.get(row["HADM_ID"], (np.zeros(0, np.int64), [], [], []))
        events = []
        for t, code, value, unit in list(zip(times, codes, values, units))[-max_events:]:
            source, item = str(code).split(":", 1)
            event = {"time": _iso(t), "source": source, "code": item}
            if value == value:  # not NaN
                event["value"] = float(value)
                if unit is not None:
                    event["unit"] = str(unit)
            events.append(event)
        bodies.append({"id": f"{mimic_dir.name}-{row['HADM_ID']}",
                       "patient": {"gender": row["gender"], "age_years": float(row["age_years"])},
                       "admission": {"admit_time": _iso(row["ADMITTIME"]), "admission_type": row["admission_type"]},
                       "events": events})
    return bodies


def constant_codes(model_dir: pathlib.Path) -> set[str]:
    """Codes of the export's reference whose training values all fall in one bin (one value), >= 20 admissions."""
    from model.export.load import read_export

    reference = read_export(model_dir).reference
    if reference is None:
        return set()
    out = set()
    for code, stats in reference.codes.items():
        d = stats.values
        if d is not None and d.n >= 20 and max(d.counts) == d.n and (len(d.counts) == 1 or d.counts[1] == d.n):
            out.add(code)
    return out


def carries(body: dict, codes: set[str]) -> bool:
    """Whether a request has a value of one of `codes`."""
    return any("value" in e and f"{e['source']}:{e['code']}" in codes for e in body["events"])


class RssSampler(threading.Thread):
    """Samples a process's resident set size (MiB) every `every` seconds: [(seconds since start, MiB)]."""

    def __init__(self, pid: int, every: float):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._t0 = time.monotonic()

    def rss(self) -> float:
        """VmRSS of the process now, MiB."""
        for line in pathlib.Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise RuntimeError(f"no VmRSS for process {self.pid}")

    def run(self) -> None:
        """Samples until stop()."""
        while not self._done.is_set():
            self.samples.append((time.monotonic() - self._t0, self.rss()))
            self._done.wait(self.every)

    def stop(self) -> None:
        """Takes a last sample and ends the thread."""
        self._done.set()
        self.join()
        self.samples.append((time.monotonic() - self._t0, self.rss()))


def rss_summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    """RSS at start / middle / end (MiB) and least-squares slopes (MiB/min) over the run and its second half."""
    t = np.array([s[0] for s in samples])
    m = np.array([s[1] for s in samples])
    half = t >= t[-1] / 2.0

    def slope(mask: np.ndarray) -> float:
        return float(np.polyfit(t[mask] / 60.0, m[mask], 1)[0]) if mask.sum() >= 2 else float("nan")

    return {"start": float(m[0]), "middle": float(m[int(np.searchsorted(t, t[-1] / 2.0))]), "end": float(m[-1]),
            "slope": slope(np.ones_like(half)), "slope_second_half": slope(half), "samples": len(samples)}


def is_flat(rss: dict[str, float]) -> bool:
    """Whether an rss_summary is flat: second-half slope <= RSS_SLOPE_LIMIT and end - middle <= RSS_GROWTH_LIMIT."""
    return rss["slope_second_half"] <= RSS_SLOPE_LIMIT and rss["end"] - rss["middle"] <= RSS_GROWTH_LIMIT


def client(base_url: str, bodies: list[dict], seed: int, deadline: float, num_samples: int,
           results: list[tuple[str, int, float, str | None]]) -> None:
    """One client: calls drawn by WEIGHTS until `deadline`; appends (route, status, ms, monitor level)."""
    rng = np.random.default_rng(seed)
    params = {"num_samples": num_samples}
    with httpx.Client(base_url=base_url, timeout=120.0) as http:
        while time.monotonic() < deadline:
            route = ROUTES[int(rng.choice(len(ROUTES), p=WEIGHTS))]
            t0 = time.perf_counter()
            level = None
            try:
                if route == "/v1/predict":
                    r = http.post(route, json=bodies[int(rng.integers(len(bodies)))], params=params)
                elif route == "/v1/predict/batch":
                    picked = rng.choice(len(bodies), size=int(rng.integers(2, 9)), replace=False)
                    r = http.post(route, json={"patients": [bodies[int(i)] for i in picked]}, params=params)
                else:
                    r = http.get(route)
                    if route == "/v1/monitor" and r.status_code == 200:
                        level = r.json()["level"]
                status = r.status_code
            except httpx.HTTPError:
                status = 0  # no answer (connection refused, reset, timeout)
            results.append((route, status, (time.perf_counter() - t0) * 1000.0, level))


def run_soak(base_url: str, pid: int, bodies: list[dict], args: argparse.Namespace) -> dict:
    """Drives the server with args.clients clients for args.duration seconds; the results and the RSS samples."""
    results: list[tuple[str, int, float, str | None]] = []
    sampler = RssSampler(pid, args.rss_every)
    sampler.start()
    deadline = time.monotonic() + args.duration
    threads = [threading.Thread(target=client, args=(base_url, bodies, args.seed + i, deadline, args.num_samples,
                                                     results)) for i in range(args.clients)]
    progress = _progress(args.duration)
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        progress(len(results))
    sampler.stop()
    with httpx.Client(base_url=base_url, timeout=60.0) as http:
        metrics = http.get("/metrics").text
    return {"results": results, "rss": rss_summary(sampler.samples), "metrics": metrics}


def _progress(duration: float):
    """A progress bar on stderr over the soak's seconds (the requests so far in its postfix)."""
    from tqdm import tqdm

    bar = tqdm(total=int(duration), unit="s", desc="soak", file=sys.stderr)
    t0 = time.monotonic()

    def update(requests: int) -> None:
        if bar.disable:
            return
        bar.n = min(int(time.monotonic() - t0), int(duration))
        bar.set_postfix(requests=requests)
        if bar.n >= int(duration):
            bar.close()  # once: a closed bar is disabled

    return update


def summarise(out: dict) -> dict:
    """Per route: requests, status classes, p50 / p95 ms; the monitor's levels; non-2xx of MONITORED."""
    by_route: dict[str, dict] = {}
    for route in ROUTES:
        rows = [r for r in out["results"] if r[0] == route]
        ms = np.array([r[2] for r in rows]) if rows else np.zeros(1)
        statuses = collections.Counter(r[1] for r in rows)
        by_route[route] = {"requests": len(rows), "2xx": sum(n for s, n in statuses.items() if 200 <= s < 300),
                           "4xx": sum(n for s, n in statuses.items() if 400 <= s < 500),
                           "5xx": sum(n for s, n in statuses.items() if s >= 500),
                           "no_answer": statuses.get(0, 0), "p50": float(np.percentile(ms, 50)),
                           "p95": float(np.percentile(ms, 95))}
    levels = collections.Counter(r[3] for r in out["results"] if r[3] is not None)
    errors = sum(float(line.rsplit(" ", 1)[1]) for line in out["metrics"].splitlines()
                 if line.startswith("ehr_monitor_errors_total{"))
    return {"routes": by_route, "levels": dict(levels), "monitor_errors": errors,
            "non_2xx": {r: by_route[r]["requests"] - by_route[r]["2xx"] for r in MONITORED}}


def to_markdown(s: dict, rss: dict, meta: dict, args: argparse.Namespace) -> str:
    """The soak's section of docs/benchmarks.md."""
    lines = ["## Soak of the service (`bench/service/soak.py`)", "", f"Soak of `ehr-serve` ({meta['model']}) on 127.0.0.1: {args.clients} clients for {args.duration:g} s, "
             f"num_samples={args.num_samples}, `--monitor-window {args.monitor_window}`. Admissions: "
             f"{meta['admissions']} ({meta['sources']}); {meta['constant_carriers']} of them carry a value of one "
             f"of the {meta['constant_codes']} codes whose training values are all one value "
             f"({meta['constant_examples']}). Each client draws /v1/predict, /v1/predict/batch (2-8 admissions), "
             f"/metrics and /v1/monitor with shares {', '.join(f'{w:.0%}' for w in WEIGHTS)}.", "",
             "| route | requests | 2xx | 4xx | 5xx | no answer | p50 ms | p95 ms |", "|---|---|---|---|---|---|---|---|"]
    for route, r in s["routes"].items():
        lines.append(f"| `{route}` | {r['requests']} | {r['2xx']} | {r['4xx']} | {r['5xx']} | {r['no_answer']} | "
                     f"{r['p50']:.0f} | {r['p95']:.0f} |")
    flat = is_flat(rss)
    checks = [("non-2xx answers on /metrics", s["non_2xx"]["/metrics"], "0", s["non_2xx"]["/metrics"] == 0),
              ("non-2xx answers on /v1/monitor", s["non_2xx"]["/v1/monitor"], "0", s["non_2xx"]["/v1/monitor"] == 0),
              ("ehr_monitor_errors_total at the end", f"{s['monitor_errors']:g}", "0", s["monitor_errors"] == 0),
              ("server RSS start / middle / end (MiB)", f"{rss['start']:.0f} / {rss['middle']:.0f} / {rss['end']:.0f}",
               "flat", flat),
              ("RSS slope, whole run / second half (MiB/min)",
               f"{rss['slope']:+.2f} / {rss['slope_second_half']:+.2f}", f"second half <= {RSS_SLOPE_LIMIT:g}",
               rss["slope_second_half"] <= RSS_SLOPE_LIMIT),
              ("RSS end - middle (MiB)", f"{rss['end'] - rss['middle']:+.0f}", f"<= {RSS_GROWTH_LIMIT:g}",
               rss["end"] - rss["middle"] <= RSS_GROWTH_LIMIT)]
    lines += ["", "| check | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {target} | {'yes' if ok else 'NO'} |" for name, value, target, ok in checks]
    levels = ", ".join(f"{k} {v}" for k, v in sorted(s["levels"].items())) or "none answered"
    lines += ["", f"/v1/monitor levels answered: {levels}. RSS sampled every {args.rss_every:g} s "
              f"({rss['samples']} samples, /proc/PID/status VmRSS of the server process).", "",
              f"Run on {dt.date.today().isoformat()} with `{harness.command_line(__file__, args.argv, drop=('--no-write',))}` "
              f"(1-minute load average at start: {args.load_at_start:.1f}; clients and server share the machine):", "",
              harness.machine_info()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """Flags of the soak; every default is shown by --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="out/demo/run/export",
                   help="export directory to serve (the default is what `make demo` trains)")
    p.add_argument("--mimic-dir", default="../shared/mimic-iii-demo",
                   help="a MIMIC-III release whose cohort admissions are sent (skipped when it holds none)")
    p.add_argument("--synthetic-patients", type=int, default=300,
                   help="patients of a synthetic release made for the run, whose admissions are sent too (0: none)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds the clients run")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients")
    p.add_argument("--num-samples", type=int, default=5, help="samples per ensemble member per prediction")
    p.add_argument("--monitor-window", type=int, default=500, help="the server's --monitor-window")
    p.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples of the server")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' draws (client i uses seed + i)")
    p.add_argument("--no-write", action="store_true", help="print the markdown instead of writing docs/benchmarks.md")
    return p


def _admissions(args: argparse.Namespace, tmp: pathlib.Path) -> tuple[list[dict], str]:
    """The request bodies of the demo release and of a synthetic one, and where they came from."""
    from ehr_pipeline import cli as pipeline_cli
    from ehr_pipeline.reader import locate_table
    from serving.settings import Settings

    max_events = Settings.model_fields["max_events"].default
    bodies, sources = [], []
    demo = pathlib.Path(args.mimic_dir)
    if demo.is_dir() and locate_table(demo, "ADMISSIONS") is not None:
        bodies += release_requests(demo, max_events)
        sources.append(f"{len(bodies)} of the MIMIC-III demo")
    if args.synthetic_patients:
        release = tmp / "synthetic"
        rc = pipeline_cli.main(["synth", "--patients", str(args.synthetic_patients), "--seed", str(args.seed + 17),
                                "--out", str(release), "--no-progress"])
        if rc:
            raise SystemExit(rc)
        synthetic = release_requests(release, max_events)
        bodies += synthetic
        sources.append(f"{len(synthetic)} of a synthetic release of {args.synthetic_patients} patients")
    if not bodies:
        raise SystemExit("soak: no admissions to send (no release at --mimic-dir and --synthetic-patients 0)")
    return bodies, " and ".join(sources)


def main(argv: list[str] | None = None) -> int:
    """Runs the soak; returns 0 when every check is met, 1 otherwise."""
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would bury the table
    args.load_at_start = os.getloadavg()[0]
    model = pathlib.Path(args.model)
    if not (model / "manifest.json").is_file():
        print(f"soak: {model} is not an export directory (run `make demo` or pass --model)", file=sys.stderr)
        return 2
    from model.export.load import read_export
    from serving.tools.server_process import ServerProcess

    export = read_export(model)
    constant = constant_codes(model)
    with tempfile.TemporaryDirectory(prefix="ehr-soak-") as tmp:
        bodies, sources = _admissions(args, pathlib.Path(tmp))
        server_args = ["--model", str(model), "--no-auth", "--log-level", "warning",
                       "--monitor-window", str(args.monitor_window)]
        with ServerProcess(server_args, log_path=pathlib.Path(tmp) / "server.log", cwd=ROOT) as server:
            out = run_soak(server.base_url, server.proc.pid, bodies, args)
    summary = summarise(out)
    meta = {"model": f"`{export.card.name}` {export.card.version}, K={export.ensemble_size}, "
                     f"{'with' if export.reference is not None else 'WITHOUT'} a reference population",
            "admissions": len(bodies), "sources": sources, "constant_codes": len(constant),
            "constant_carriers": sum(carries(b, constant) for b in bodies),
            "constant_examples": ", ".join(sorted(constant)[:4]) or "none in this export's reference"}
    harness.publish("soak", to_markdown(summary, out["rss"], meta, args), write=not args.no_write)
    met = (all(n == 0 for n in summary["non_2xx"].values()) and summary["monitor_errors"] == 0
           and is_flat(out["rss"]))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
