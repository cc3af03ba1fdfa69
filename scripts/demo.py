"""`make demo`: the whole path (bag -> train -> evaluate -> serve one admission) on one release.

  python scripts/demo.py --mimic-dir ../shared/mimic-iii-demo --out out/demo

With the MIMIC-III demo (or any MIMIC-III v1.4 release) at --mimic-dir it runs on that. Without
one it says so in one line and runs on a small synthetic release from `ehr-pipeline synth`
instead, written under OUT/synthetic/, so a fresh clone works with no data at all. Each step
prints the command that does it by hand, then runs that command's own entry point in this
process. Re-running resumes training from its last checkpoint.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import shlex
import sys

import ehr_base  # noqa: F401  (pins the Keras flavour before anything imports TensorFlow)
from ehr_pipeline.reader import MissingTableError, ReaderError, locate_table

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def has_release(mimic_dir: pathlib.Path) -> bool:
    """Whether mimic_dir holds a MIMIC-III release (its ADMISSIONS table, gzipped or not)."""
    try:
        return locate_table(mimic_dir, "ADMISSIONS") is not None
    except (MissingTableError, ReaderError):
        return False


def _step(title: str, tool: str, argv: list[str], main) -> None:
    """Prints the step and its command line, runs the tool's main(argv); stops the demo if it fails."""
    print(f"== {title}\n$ {tool} {shlex.join(argv)}", flush=True)
    rc = main(argv)
    if rc:
        raise SystemExit(rc)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the demo driver."""
    parser = argparse.ArgumentParser(prog="demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mimic-dir", default="../shared/mimic-iii-demo",
                        help="MIMIC-III release to run on; if it holds none, a synthetic one is generated "
                             "(default: %(default)s)")
    parser.add_argument("--out", default="out/demo", help="output folder (default: %(default)s)")
    parser.add_argument("--config", default="configs/ehr_demo.yaml",
                        help="ehr-train config, relative to the checkout (default: %(default)s)")
    parser.add_argument("--patients", type=int, default=500,
                        help="patients of the synthetic release, when one is needed (default: %(default)s)")
    parser.add_argument("--events-scale", type=float, default=1.0,
                        help="measurement rate of the synthetic release, 1.0 is ~300 events per ICU day; the "
                             "Beam job's time grows with it (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: the config's max_steps)")
    parser.add_argument("--samples", type=int, default=25,
                        help="evaluation samples per ensemble member (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the demo; returns the exit code (2 when --mimic-dir exists but holds no release)."""
    args = build_parser().parse_args(argv)
    mimic_dir, out = pathlib.Path(args.mimic_dir), pathlib.Path(args.out)
    # Relative to the checkout, so the script runs from any folder.
    config = pathlib.Path(args.config)
    config = config if config.is_absolute() or config.exists() else REPO_ROOT / config
    if mimic_dir.exists() and not has_release(mimic_dir):
        print(f"demo: {mimic_dir} holds no MIMIC-III ADMISSIONS table (README 'Data' says what goes there)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    # One process runs every tool: the synth summary is printed anyway, and httpx logs every poll of /readyz.
    for chatty in ("ehr_pipeline.synth", "httpx"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    from ehr_pipeline import cli as pipeline_cli
    from model.cli import ehr_eval, ehr_train
    from serving.tools import demo as serving_demo

    truth: list[str] = []
    if not has_release(mimic_dir):
        print(f"No MIMIC-III data at {mimic_dir} (README 'Data' says where to get it): "
              f"running on a synthetic release of {args.patients} patients.", flush=True)
        out = out / "synthetic"
        mimic_dir = out / "release"
        _step("0. Generate a synthetic MIMIC-III release with known death probabilities", "ehr-pipeline",
              ["synth", "--patients", str(args.patients), "--seed", "0", "--events-scale", str(args.events_scale),
               "--out", str(mimic_dir), "--overwrite", "--no-progress"],
              pipeline_cli.main)
        truth = ["--truth", str(mimic_dir / "SYNTH_TRUTH.csv")]
    data, run = out / "data", out / "run"
    _step("1. Bag every admission into SequenceExamples (Beam job)", "ehr-pipeline",
          ["demo", "--mimic-dir", str(mimic_dir), "--out", str(out)], pipeline_cli.main)
    steps = [] if args.steps is None else ["--steps", str(args.steps)]
    _step(f"2. Train {config.name} on the training split", "ehr-train",
          ["--config", str(config), "--data", str(data), "--out", str(run), *steps, *truth, "--no-progress"],
          ehr_train.main)
    _step(f"3. Evaluate on the test split with {args.samples} samples per ensemble member", "ehr-eval",
          ["--model", str(run / "export"), "--data", str(data), "--split", "test", "--samples", str(args.samples),
           "--out", str(out / "eval"), "--overwrite", *truth, "--no-progress"], ehr_eval.main)
    _step("4. Serve the model and score one test admission from the raw tables", "python -m serving.tools.demo",
          ["--model", str(run / "export"), "--data", str(data), "--mimic-dir", str(mimic_dir)], serving_demo.main)
    return 0


if __name__ == "__main__":
    sys.exit(main())
