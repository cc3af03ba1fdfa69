"""One command for a GPU machine: the medium synthetic release, the Table-7 rank-1 run, steps/s and metrics.

  make gpu-install                       # the GPU build of the pinned TensorFlow (pyproject extra `gpu`)
  python bench/train_speed/gpu_train.py --out runs/gpu_table7

Generates the release (`ehr-pipeline synth --patients 7000 --seed 11`, then `ehr-pipeline
run`), skipping what is already there, trains configs/ehr_rank1_normal.yaml on every visible
GPU (MirroredStrategy over several; bfloat16 where the GPU has it, else float16 with loss
scaling) and prints steps/s (steady state, after the first trace) and the test metrics. The
same command runs on a CPU-only machine (slowly); `--devices cpu:2` exercises the
multi-device path there.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="runs/gpu_table7", help="folder for the release, the data and the run")
    parser.add_argument("--patients", type=int, default=7000, help="synthetic patients (the medium release)")
    parser.add_argument("--seed", type=int, default=11, help="seed of the synthetic release")
    parser.add_argument("--data", default=None,
                        help="train on this `ehr-pipeline run` output instead (e.g. a full-size release's); "
                             "nothing is generated (default: OUT/data, made from a synthetic release)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "ehr_rank1_normal.yaml"), help="experiment YAML")
    parser.add_argument("--devices", default="auto", help="auto, cpu, cpu:N, gpu, gpu:N (model.fit.devices)")
    parser.add_argument("--precision", default="true",
                        help="train.mixed_precision: true (bfloat16 where supported, else float16), false, "
                             "mixed_bfloat16 or mixed_float16")
    parser.add_argument("--steps", type=int, default=None, help="override train.max_steps (None: the config's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="more config overrides, as ehr-train --set")
    parser.add_argument("--no-export", action="store_true",
                        help="train only: no final test evaluation or export (a throughput and memory run)")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    mimic, data = out / "mimic", pathlib.Path(args.data) if args.data else out / "data"
    scripts = pathlib.Path(sys.executable).parent
    if args.data is None and not (mimic / "ADMISSIONS.csv.gz").exists():
        subprocess.run([str(scripts / "ehr-pipeline"), "synth", "--patients", str(args.patients), "--seed",
                        str(args.seed), "--out", str(mimic), "--no-progress"], check=True)
    if args.data is not None and not (data / "manifest.json").exists():
        parser.error(f"--data {data}: no manifest.json there (not an `ehr-pipeline run` output)")
    if not (data / "manifest.json").exists():
        subprocess.run([str(scripts / "ehr-pipeline"), "run", "--mimic-dir", str(mimic), "--out", str(data)],
                       check=True)

    import ehr_base  # noqa: F401  (pins TF_USE_LEGACY_KERAS before TensorFlow loads)
    from model.fit import devices

    devices.configure(args.devices)  # before any TensorFlow work
    import tensorflow as tf

    from model.cli.ehr_train import parse_overrides
    from model.evaluation.report import formatting
    from model.ehr.config import load_config
    from model.ehr.train import train

    overrides = parse_overrides([f"train.mixed_precision={args.precision}", *args.overrides])
    config = load_config(args.config).with_overrides(**overrides).with_train_overrides(max_steps=args.steps)
    truth = mimic / "SYNTH_TRUTH.csv"
    started = time.time()
    result = train(config, data, out / "run", progress=True, truth_path=truth if truth.exists() else None,
                   devices=args.devices, export_model=not args.no_export)
    rows = result.history
    # Steady state: between the first and the last logged step (the first includes the trace).
    steady = None
    if len(rows) >= 2:
        t = [r["step"] / r["steps_per_second"] for r in (rows[0], rows[-1])]
        steady = (rows[-1]["step"] - rows[0]["step"]) / max(t[1] - t[0], 1e-9)
    summary = {"devices": [d.name for d in tf.config.list_logical_devices()], "requested": args.devices,
               "precision": args.precision, "steps": result.step, "batch_size": config.train.batch_size,
               "steps_per_second": steady, "examples_per_second": steady and steady * config.train.batch_size,
               "wall_s": time.time() - started, "best": result.best,
               # ru_maxrss is KiB on Linux: the peak of this process, where TensorFlow and tf.data run
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "train_examples": _train_examples(data)}
    (out / "gpu_train.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if result.test_report is not None:
        print(formatting.format_table(result.test_report))
    return 0


def _train_examples(data: pathlib.Path) -> int:
    """Examples in the training split, from the job's manifest."""
    return json.loads((data / "manifest.json").read_text())["splits"]["train"]["examples"]


if __name__ == "__main__":
    sys.exit(main())
