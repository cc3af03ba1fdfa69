"""What one Beam job process costs before it reads a row, and its peak memory on the MIMIC-III demo.

    python bench/data_jobs/job_footprint.py [--mimic-dir ../shared/mimic-iii-demo] [--repeat 5] [--no-write]

Two sides, measured in one run, each in fresh processes: "before" imports TensorFlow first, as
the job did when it built its SequenceExample protos with ``tf.train``, and keeps Arrow's default
allocator (mimalloc); "now" is the job as it is (protobuf alone, ``ehr_pipeline/contract/protos.py``;
the system allocator that ``ehr_base`` picks). Import + start-up is
the wall time of a process that imports everything the job's driver and its in-process workers
import (the CLI, the job, its transforms, Beam's local runner) and exits; the job's peak RSS is
that of ``ehr-pipeline run`` on the demo. Medians over --repeat runs; the table goes to
docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, machine_info, publish, run_child  # noqa: E402

_JOB_IMPORTS = ("import ehr_pipeline.cli, ehr_pipeline.job, ehr_pipeline.job.items, ehr_pipeline.encode.seqex; "
                "import apache_beam.runners.portability.fn_api_runner")
_WITH_TF = "import tensorflow; "
# The job's CLI, with TensorFlow imported first on the "with" side.
_RUN = "import runpy, sys; {pre}sys.argv = ['ehr-pipeline', *sys.argv[1:]]; runpy.run_module('ehr_pipeline.cli', run_name='__main__')"


def measure(mimic_dir: pathlib.Path, with_tf: bool, repeat: int) -> dict[str, float]:
    """Median import + start-up (s) and the job's peak RSS on the demo (MiB) for one side."""
    pre = _WITH_TF if with_tf else ""
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"} if with_tf else None
    starts, peaks = [], []
    for _ in range(repeat):
        start = run_child([sys.executable, "-c", pre + _JOB_IMPORTS], env=env, cwd=ROOT)
        if start.returncode:
            raise RuntimeError(start.stderr[-2000:])
        starts.append(start.wall_s)
        with tempfile.TemporaryDirectory(prefix="ehr-footprint-") as out:
            job = run_child([sys.executable, "-c", _RUN.format(pre=pre), "run", "--mimic-dir", str(mimic_dir),
                             "--out", out], env=env, cwd=ROOT)
        if job.returncode:
            raise RuntimeError(job.stderr[-2000:])
        peaks.append(job.peak_rss_mb)
    return {"start_s": statistics.median(starts), "peak_mb": statistics.median(peaks)}


def to_markdown(rows: dict[str, dict[str, float]], command: str, repeat: int) -> str:
    """The section of docs/benchmarks.md."""
    lines = ["## The Beam job's footprint (`bench/data_jobs/job_footprint.py`)", "", f"Command: `{command}`  ",
             f"Median of {repeat} fresh processes per side, on the MIMIC-III demo (100 patients).", "",
             "| side | import + start-up (s) | job peak RSS (MiB) |", "|---|---|---|"]
    lines += [f"| {side} | {r['start_s']:.2f} | {r['peak_mb']:,.0f} |" for side, r in rows.items()]
    lines += ["", "Targets: import + start-up <= 1.5 s, peak RSS <= 350 MiB without TensorFlow.", "",
              "Machine:", "", machine_info()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mimic-dir", type=pathlib.Path, default=ROOT.parent / "shared" / "mimic-iii-demo",
                   help="MIMIC-III tables the job reads")
    p.add_argument("--repeat", type=int, default=5, help="fresh processes per side; the median is kept")
    p.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    rows = {"before: TensorFlow imported, Arrow's mimalloc": measure(args.mimic_dir, True, args.repeat),
            "now: no TensorFlow, the system allocator": measure(args.mimic_dir, False, args.repeat)}
    publish("job_footprint", to_markdown(rows, command_line(__file__, argv), args.repeat), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
