"""The Beam jobs at scale: rows per second, CPU seconds, peak memory and temporary disk, at several sizes.

    python bench/data_jobs/full_scale.py [--job run|to-meds|meds-run] [--patients 2000] [--events-scale 3] [--fractions 1]
                               [--workers N] [--mimic-dir DIR] [--code DIR --label NAME] [--work-dir DIR]
                               [--dask-workers N [--dask-memory-limit 1GiB]] [--keep-output] [--no-write]

Each size is a synthetic release (``ehr-pipeline synth --seed 1 --events-scale S`` at
``patients x fraction``, kept in --work-dir for the next run) or, with --mimic-dir, that release;
the job runs in a fresh process: ``ehr-pipeline run`` on the release, ``ehr-pipeline to-meds`` of it
(--job to-meds), or ``ehr-pipeline run --meds-dir`` on its MEDS conversion (--job meds-run; the
conversion is made once, unmeasured, and kept in --work-dir). Measured per run: wall seconds; CPU
seconds of the whole process tree (the runner's worker processes included: rusage of the waited
children); peak RSS, the largest sum of the tree's RSS over samples every 0.2 s; the temporary
disk each stage left (the job's log line), and the largest size of the output folder seen while
sampling. ``--code DIR`` runs the job from another checkout (e.g. a git worktree of an older
commit, to compare roads); its rows go to the table under --label. Results accumulate in
--work-dir/results.jsonl; the table of all of them goes to docs/benchmarks.md. The machine is
shared: the load average is printed beside every run. ``--dask-workers N`` runs the job on a real
dask.distributed cluster started for it (a scheduler and N worker processes with Dask's memory
limit, on 127.0.0.1); the cluster's processes count in CPU seconds and peak RSS, and the shards are
compared with the local run's.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pathlib
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

import psutil
from distributed import Client

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, machine_info, publish  # noqa: E402

_TEMP_LINE = "temporary bytes per stage: "
_SAMPLE_S = 0.2
# Walking a spill folder of thousands of files every 0.2 s cost the sampler ~15% of a core at full
# size (CPU the job then lacked); the folder's size changes slowly, so it is read every 2 s.
_DISK_EVERY = 10


def release_for(patients: int, events_scale: float, work_dir: pathlib.Path) -> pathlib.Path:
    """A synthetic release of this size in work_dir, generated once (seed 1)."""
    folder = work_dir / f"release-p{patients}-x{events_scale:g}"
    if not (folder / "SYNTH_MANIFEST.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "ehr_pipeline.cli", "synth", "--patients", str(patients), "--seed", "1",
                        "--events-scale", str(events_scale), "--out", str(folder)], cwd=ROOT, check=True)
    return folder


def _rss(proc: psutil.Process) -> int:
    """Bytes resident in one process now; 0 once it has exited."""
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def _tree_rss(proc: psutil.Process) -> int:
    """Bytes resident in a process and all its descendants now."""
    return sum(map(_rss, [proc, *proc.children(recursive=True)]))  # an exited one counts 0


def _folder_bytes(folder: pathlib.Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
    return total


def meds_folder(release: pathlib.Path, work_dir: pathlib.Path) -> pathlib.Path:
    """Where a release's MEDS conversion is kept in work_dir."""
    return work_dir / f"meds-{release.name}"


def meds_for(release: pathlib.Path, work_dir: pathlib.Path) -> pathlib.Path:
    """The MEDS conversion of a release in work_dir, made once with this checkout's to-meds."""
    folder = meds_folder(release, work_dir)
    if not (folder / "to_meds_manifest.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "ehr_pipeline.cli", "to-meds", "--mimic-dir", str(release), "--out",
                        str(folder)], cwd=ROOT, check=True)
    return folder


@contextlib.contextmanager
def dask_cluster(workers: int, memory_limit: str, folder: pathlib.Path):
    """A dask.distributed scheduler and `workers` one-thread worker processes on 127.0.0.1, each a process of its own.

    Yields (scheduler address, the cluster's root processes). The workers run under a nanny with
    Dask's memory limit: they spill their data to --local-directory at 60% of it, pause at 80% and
    are restarted at 95%, so a job that needed more than the limit would fail or crawl, not pass.
    """
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "cluster.log", "w")
    with socket.socket() as s:  # a free port; the scheduler binds it a moment later
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--no-dashboard"], stdout=log, stderr=subprocess.STDOUT, cwd=folder)]
    procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers",
                                   str(workers), "--nthreads", "1", "--memory-limit", memory_limit, "--no-dashboard",
                                   "--local-directory", str(folder / "spill")], stdout=log, stderr=subprocess.STDOUT,
                                  cwd=folder))
    try:
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(workers, timeout=120)
        yield address, procs
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=60)
        log.close()


def _tree_cpu_s(procs: list[psutil.Process]) -> float:
    """CPU seconds (user + system) of these processes and their living descendants so far."""
    total = 0.0
    for root in procs:
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
    return total


def run_job(release: pathlib.Path, out: pathlib.Path, code: pathlib.Path | None, job_args: list[str],
            job: str = "run", cluster: list[subprocess.Popen] = ()) -> dict:
    """Runs `ehr-pipeline <job>` in a fresh process; returns wall s, CPU s, peak RSS and disk bytes.

    `cluster`: processes outside the job's tree that do its work (a Dask cluster); their RSS counts
    in the peak (largest one alone as well) and their CPU seconds in the CPU seconds.
    """
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if code is not None:  # that checkout's package first on the path
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    source = ["run", "--meds-dir", str(release)] if job == "meds-run" else [job, "--mimic-dir", str(release)]
    argv = [sys.executable, "-m", "ehr_pipeline.cli", *source, "--out", str(out), *job_args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, load = time.perf_counter(), os.getloadavg()[0]
    log = open(out.parent / f"{out.name}.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=code or ROOT)
    peaks = {"rss": 0, "disk": 0, "worker_rss": 0}
    done = threading.Event()
    helpers = [psutil.Process(p.pid) for p in cluster]
    cluster_cpu = _tree_cpu_s(helpers)

    def sample() -> None:
        root = psutil.Process(proc.pid)
        ticks = 0
        while not done.is_set():
            try:
                # One walk of the cluster: each process read once (its workers are the helpers' descendants).
                worker_rss = [_rss(p) for h in helpers for p in h.children(recursive=True)]
                peaks["worker_rss"] = max([peaks["worker_rss"], *worker_rss])
                peaks["rss"] = max(peaks["rss"], _tree_rss(root) + sum(map(_rss, helpers)) + sum(worker_rss))
            except psutil.Error:
                pass
            if ticks % _DISK_EVERY == 0:
                peaks["disk"] = max(peaks["disk"], _folder_bytes(out))
            ticks += 1
            done.wait(_SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code_rc = proc.wait()
    cluster_cpu = _tree_cpu_s(helpers) - cluster_cpu
    done.set()
    sampler.join()
    log.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = (out.parent / f"{out.name}.log").read_text()
    if code_rc:
        raise RuntimeError(f"the job failed ({code_rc}): {text[-3000:]}")
    temp = next((json.loads(line.split(_TEMP_LINE, 1)[1]) for line in text.splitlines() if _TEMP_LINE in line), {})
    return {"wall_s": time.perf_counter() - started, "load": load,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + cluster_cpu,
            "peak_rss_mb": peaks["rss"] / 2**20,
            **({"peak_worker_rss_mb": peaks["worker_rss"] / 2**20} if cluster else {}), "peak_out_mb": peaks["disk"] / 2**20, "temp_bytes": temp,
            **(_meds_outputs(out) if job == "to-meds" else _job_outputs(out))}


def _job_outputs(out: pathlib.Path) -> dict:
    """Event rows read, examples and shard digests of a job's manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    return {"event_rows": sum(t["rows_read"] for t in manifest["tables"].values() if "cohort_filter" in t),
            "examples": sum(s["examples"] for s in manifest["splits"].values()),
            "shards": {n: f["sha256"] for s in manifest["splits"].values() for n, f in s["files"].items()}}


def _meds_outputs(out: pathlib.Path) -> dict:
    """Event rows read, MEDS rows written and the data files' digests of a to-meds output."""
    manifest = json.loads((out / "to_meds_manifest.json").read_text())
    tables = [t for t in manifest["tables"].values() if "meds_rows_written" in t]
    return {"event_rows": sum(t["rows_read"] for t in tables),
            "examples": sum(t["meds_rows_written"] for t in tables),
            "shards": {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted((out / "data").rglob("*.parquet"))}}


def to_markdown(results: list[dict], command: str) -> str:
    """The section of docs/benchmarks.md: every run in results.jsonl, by release then job."""
    lines = ["## The Beam jobs at scale (`bench/data_jobs/full_scale.py`)", "", f"Command (last run): `{command}`  ",
             "Synthetic releases `ehr-pipeline synth --seed 1`; each job in a fresh process. CPU s: the whole "
             "process tree; peak RSS: the largest sum of the tree's RSS (sampled every 0.2 s); temp MiB: the "
             "spill folder per stage as the job logs it (split parts, events, record runs, dead-value runs; "
             "to-meds: split parts, MEDS row runs); out "
             "MiB: the output folder's largest size seen, temporary files included (read every 2 s; every 0.2 s "
             "in the runs below, where that walk took ~15% of a core at full size). Load: the 1-minute load "
             "average when the run started (a shared machine: wall seconds are noisy, CPU s and RSS are not). "
             "Command: `run` (the job on the release: SequenceExample shards), `to-meds` (MEDS parquet files, whose "
             "digests are compared) or `meds-run` (`run --meds-dir` on the release's MEDS conversion).", "",
             "| release | command | job | event rows | wall s | load | CPU s | rows / wall s | rows / CPU s | peak RSS MiB "
             "| temp MiB by stage | out MiB | shards as the grouped (else local) job's |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    # Each run's shards against the grouped job's (the design before spilling) or, where that did not
    # run, the local spilling job's: a cluster run must write the same bytes as the local one.
    reference = {(r["release"], r.get("command", "run")): r["shards"] for r in results if r["job"] == "spilling"}
    reference.update({(r["release"], r.get("command", "run")): r["shards"] for r in results
                      if r["job"].startswith("grouped")})
    for r in sorted(results, key=lambda r: (r["event_rows"], r.get("command", "run"), r["job"])):
        kind = r.get("command", "run")
        t = r["temp_bytes"]
        temp = ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in t.items()) if t else "-"
        same = "-" if (r["release"], kind) not in reference or r["shards"] is reference[(r["release"], kind)] else (
            "yes" if r["shards"] == reference[(r["release"], kind)] else "NO")
        if "peak_worker_rss_mb" in r:
            kind += f" (largest worker {r['peak_worker_rss_mb']:,.0f} MiB)"
        lines.append(f"| {r['release']} | {kind} | {r['job']} | {r['event_rows']:,} | {r['wall_s']:.0f} | {r['load']:.1f} "
                     f"| {r['cpu_s']:.0f} | {r['event_rows'] / r['wall_s']:,.0f} | {r['event_rows'] / r['cpu_s']:,.0f} "
                     f"| {r['peak_rss_mb']:,.0f} | {temp} | {r['peak_out_mb']:,.0f} | {same} |")
    lines += ["", "Targets: peak RSS <= 2 GB at every size; >= 200k rows per wall second on 2 cores.",
              "", "Machine:", "", machine_info()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--job", choices=("run", "to-meds", "meds-run"), default="run",
                   help="the command measured: the Beam job on the release (SequenceExamples), its MEDS "
                        "conversion, or the Beam job on that conversion (run --meds-dir)")
    p.add_argument("--patients", type=int, default=2000, help="patients of the synthetic release at fraction 1")
    p.add_argument("--events-scale", type=float, default=3.0, help="synth --events-scale (3: MIMIC-III's density)")
    p.add_argument("--fractions", default="1", help="comma-separated fractions of --patients, one run each")
    p.add_argument("--mimic-dir", type=pathlib.Path, default=None, help="run on this release instead of synthetic ones")
    p.add_argument("--workers", type=int, default=None, help="the job's --workers (default: the job's default)")
    p.add_argument("--code", type=pathlib.Path, default=None,
                   help="run the job from this checkout (e.g. a git worktree of an older commit); default: this one")
    p.add_argument("--label", default=None,
                   help="the job's name in the table (default: spilling, or dask (N x LIMIT) with --dask-workers)")
    p.add_argument("--dask-workers", type=int, default=None,
                   help="run on a dask.distributed cluster of this many one-thread worker processes on 127.0.0.1, "
                        "started for the run (default: the local runner)")
    p.add_argument("--dask-memory-limit", default="1GiB", help="each Dask worker's memory limit (with --dask-workers)")
    p.add_argument("--work-dir", type=pathlib.Path, default=ROOT / "out" / "bench_full_scale",
                   help="releases, outputs, logs and results.jsonl")
    p.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    p.add_argument("--keep-output", action="store_true",
                   help="keep each run's output folder (for training on it); default: deleted after measuring")
    args = p.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    job_args = [] if args.workers is None else ["--workers", str(args.workers)]
    label = args.label or ("spilling" if args.dask_workers is None
                           else f"dask ({args.dask_workers} x {args.dask_memory_limit})")
    results_file = args.work_dir / "results.jsonl"
    sizes = [(args.mimic_dir.name, args.mimic_dir)] if args.mimic_dir else [
        (f"{round(args.patients * float(f)):,} p x{args.events_scale:g}",
         release_for(round(args.patients * float(f)), args.events_scale, args.work_dir))
        for f in args.fractions.split(",")]
    for name, release in sizes:
        if args.job == "meds-run":
            release = meds_for(release, args.work_dir)
        out = args.work_dir / f"out-{release.name}-{args.job}-{label.split()[0]}"
        with contextlib.ExitStack() as stack:
            cluster, runner = [], []
            if args.dask_workers:
                address, cluster = stack.enter_context(
                    dask_cluster(args.dask_workers, args.dask_memory_limit, args.work_dir / "dask"))
                runner = ["--runner=DaskRunner", f"--dask_client_address={address}",
                          f"--dask_npartitions={4 * args.dask_workers}"]
            r = {"release": name, "command": args.job, "job": label,
                 **run_job(release, out, args.code, job_args + runner, args.job, cluster)}
        meds = meds_folder(release, args.work_dir)
        if args.job == "to-meds" and not (meds / "to_meds_manifest.json").exists():
            out.rename(meds)  # the measured conversion is the release's conversion: meds-run need not redo it
        elif not args.keep_output:
            shutil.rmtree(out, ignore_errors=True)
        print(f"{name} {args.job} {label}: {r['event_rows']:,} rows, {r['wall_s']:.0f} s wall (load {r['load']:.1f}), "
              f"{r['cpu_s']:.0f} CPU s, peak RSS {r['peak_rss_mb']:,.0f} MiB, temp {r['temp_bytes']}", flush=True)
        with open(results_file, "a") as f:
            f.write(json.dumps(r) + "\n")
    results = [json.loads(line) for line in results_file.read_text().splitlines()]
    publish("full_scale", to_markdown(results, command_line(__file__, argv)), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
