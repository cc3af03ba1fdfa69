"""Command lines of the image models, reached through ``ehr-train`` / ``ehr-eval`` for ``task: image`` configs.

  ehr-train --config configs/image_digits_rank1_normal.yaml --out runs/digits_r1 [--steps N] [--seed S]
  ehr-train --config configs/image_digits_bella_svgd.yaml --out runs/digits_bella --base runs/digits_det
  ehr-train --config configs/image_cifar10_wrn28-10_rank1.yaml --data ~/data/cifar-10-batches-py --out runs/c10
  ehr-eval --run runs/c10 --data ~/data/cifar-10-batches-py --corrupted-dir ~/data/CIFAR-10-C --samples 4

``wants_image(argv)`` tells the EHR entry points which one to run: a ``--config`` whose YAML
says ``task: image``, or a ``--run`` / ``--model`` run folder whose config.json does.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys

from ehr_base import console
from ehr_base.cli_args import DefaultsOnceFormatter, OneLineParser, setup_logging, usage_error
from ehr_base.yaml_config import ConfigError, read_yaml
from model.export_layout import MAX_SAMPLES
from model.image.config import is_image_config, load_config

log = logging.getLogger("model.image")


def _option_values(argv: list[str], names: tuple[str, ...]) -> list[str]:
    values = []
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                values.append(argv[i + 1])
            elif arg.startswith(name + "="):
                values.append(arg.split("=", 1)[1])
    return values


def wants_image(argv: list[str] | None = None) -> bool:
    """Whether an ehr-train / ehr-eval command line is about an image model (cheap: reads YAML/JSON only)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    for value in _option_values(argv, ("--config",)):
        try:
            if is_image_config(read_yaml(value)):
                return True
        except ConfigError:  # unreadable / malformed: let the EHR parser report it
            continue
    for value in _option_values(argv, ("--run", "--model")):
        path = pathlib.Path(value) / "config.json"
        try:
            if is_image_config(json.loads(path.read_text())):
                return True
        except (OSError, ValueError):
            continue
    return False


def _logging(verbose: bool) -> None:
    setup_logging(verbose)
    console.load_tensorflow(verbose)


def build_train_parser() -> argparse.ArgumentParser:
    """The argument parser of `ehr-train` for image configs."""
    p = OneLineParser(
        prog="ehr-train",
        description="Train a rank-1 Bayesian (or baseline) image classifier (task: image configs), then evaluate it "
                    "on the clean and corrupted test sets. Re-running the same command resumes from the newest "
                    "checkpoint.",
        formatter_class=DefaultsOnceFormatter)
    p.add_argument("--config", required=True, help="image experiment YAML (configs/image_*.yaml)")
    p.add_argument("--out", required=True, help="run folder: config.json, checkpoints, tensorboard, eval")
    p.add_argument("--data", default=None, help="CIFAR python-pickle folder (overrides data.data_dir; digits: unused)")
    p.add_argument("--steps", type=int, default=None, help="override train.max_steps")
    p.add_argument("--seed", type=int, default=None, help="override train.seed")
    p.add_argument("--patience", type=int, default=None,
                   help="override train.early_stopping_patience: stop after this many validations without a better "
                        "validation NLL (needs train.eval_every_steps > 0; 0 = never)")
    p.add_argument("--base", default=None,
                   help="trained deterministic run folder that a posterior.method 'bella' config adapts (frozen; "
                        "required for bella, refused otherwise)")
    p.add_argument("--devices", default="auto",
                   help="where to train: auto, cpu, cpu:N (the CPU split into N logical devices, mirrored), gpu, "
                        "gpu:N (model.fit.devices)")
    p.add_argument("--no-eval", action="store_true", help="stop after training")
    p.add_argument("--no-corruptions", action="store_true", help="evaluate the clean test set only")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")
    return p


def train_main(argv: list[str] | None = None) -> int:
    """`ehr-train` for image configs; returns the exit code."""
    args = build_train_parser().parse_args(argv)
    _logging(args.verbose)
    try:
        config = load_config(args.config).with_train_overrides(
            max_steps=args.steps, seed=args.seed, early_stopping_patience=args.patience)
    except ConfigError as err:
        return usage_error("ehr-train", err)

    # why: TensorFlow loads only once the arguments and the config are valid
    from model.fit import devices
    from model.image.evaluate import format_report

    try:
        devices.configure(args.devices)  # before any TensorFlow work (model.fit.devices)
    except (ValueError, RuntimeError) as err:
        print(f"ehr-train: {err}", file=sys.stderr)
        return 2
    # why: after devices.configure, which must run before anything sets up TensorFlow's devices
    from model.fit.training_loop import ConfigMismatchError
    from model.image.train import train

    try:
        result = train(config, args.out, data_dir=args.data, progress=not args.no_progress,
                       evaluate=not args.no_eval, corrupted=not args.no_corruptions, base_dir=args.base,
                       devices=args.devices)
    except (ConfigMismatchError, FileNotFoundError, ValueError) as err:
        return usage_error("ehr-train", err)
    log.info("finished at step %d in %s (%.0f s)", result.step, result.out_dir, result.wall_s)
    if result.report is not None:
        print(format_report(result.report))
    return 0


# Flags alike in shape to build_train_parser's and model.cli's: each command's --help reads as a
# flat list of its own flags.
def build_eval_parser() -> argparse.ArgumentParser:
    """The argument parser of `ehr-eval` for image runs."""
    p = OneLineParser(
        prog="ehr-eval",
        description="Evaluate a trained image model (a run folder of ehr-train with a task: image config): NLL, "
                    "accuracy and ECE on the clean test set and on every corruption and intensity, with their "
                    "means cNLL / cA / cECE.",
        formatter_class=DefaultsOnceFormatter)
    p.add_argument("--run", "--model", dest="run", required=True, help="run folder written by ehr-train")
    p.add_argument("--data", default=None, help="CIFAR python-pickle folder (default: the run's data.data_dir)")
    p.add_argument("--corrupted-dir", default=None,
                   help="real CIFAR-10-C / CIFAR-100-C .npy folder (default: the run's data.corrupted_dir, "
                        "else corruptions computed from the test set)")
    p.add_argument("--samples", type=int, default=None, help="S samples per member (default: the run's eval config)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the run's eval config)")
    p.add_argument("--batch-size", type=int, default=None, help="images per prediction call")
    p.add_argument("--out", default=None, help="write metrics.json and summary.md here")
    p.add_argument("--no-corruptions", action="store_true", help="evaluate the clean test set only")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")
    return p


def eval_main(argv: list[str] | None = None) -> int:
    """`ehr-eval` for image runs; returns the exit code."""
    args = build_eval_parser().parse_args(argv)
    _logging(args.verbose)
    if args.samples is not None and not 1 <= args.samples <= MAX_SAMPLES:
        print(f"ehr-eval: --samples must be in [1, {MAX_SAMPLES}]", file=sys.stderr)
        return 2
    # why: these import TensorFlow, which loads only once the arguments are valid
    from model.image import evaluate as evaluation
    from model.image.train import load_run

    try:
        config, model, data, step = load_run(args.run, data_dir=args.data)
        report = evaluation.evaluate_model(model, config, data, num_samples=args.samples, seed=args.seed,
                                           batch_size=args.batch_size, corrupted=not args.no_corruptions,
                                           corrupted_dir=args.corrupted_dir, progress=not args.no_progress)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        return usage_error("ehr-eval", err)
    report["step"] = step
    print(evaluation.format_report(report))
    if args.out:
        print(f"report: {evaluation.write_report(args.out, report)}")
    return 0
