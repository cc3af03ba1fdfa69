"""`ehr-train`: train (or resume) one EHR model run, then evaluate it and write its export.

  ehr-train --config configs/ehr_rank1_normal.yaml --data out/demo/data --out runs/rank1 [--steps N] [--seed S] \
            [--patience P] [--devices cpu:2] [--set model.rnn_dim=64 --set train.learning_rate=1e-3 ...]
  ehr-train --config configs/ehr_bella_svgd.yaml --data out/demo/data --out runs/bella --base runs/deterministic

Killed and restarted with the same command, a run resumes from its newest checkpoint.
"""
from __future__ import annotations

import argparse
import logging
import sys

import yaml

from ehr_base import console
from ehr_base.cli_args import (DefaultsOnceFormatter, OneLineParser, existing_dir, existing_file, output_dir, positive_int,
                                      setup_logging, usage_error)
from ehr_base.yaml_config import ConfigError
from model.evaluation.report import formatting
from model.image import cli as image_cli
from model.ehr.config import load_config

log = logging.getLogger("model.ehr.train")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `ehr-train`."""
    parser = OneLineParser(
        prog="ehr-train",
        description="Train a rank-1 Bayesian (or baseline) LSTM on bagged MIMIC-III SequenceExamples, evaluate it "
                    "on the validation and test splits, and write the export the prediction service loads "
                    "(OUT/export). Re-running the same command resumes from the newest checkpoint.",
        formatter_class=DefaultsOnceFormatter,
    )
    parser.add_argument("--config", required=True, type=existing_file, help="experiment YAML (configs/ehr_*.yaml)")
    parser.add_argument("--data", required=True, type=existing_dir,
                        help="output folder of the Beam job (ehr-pipeline run/demo)")
    parser.add_argument("--out", required=True, type=output_dir,
                        help="run folder: checkpoints, tensorboard, eval reports, export")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="override train.max_steps of the config (None: keep the config's)")
    parser.add_argument("--seed", type=int, default=None,
                        help="override train.seed of the config (None: keep the config's)")
    parser.add_argument("--patience", type=int, default=None,
                        help="override train.early_stopping_patience: stop after this many validations without a "
                             "better validation NLL (0 = never; None: keep the config's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config value, e.g. --set model.rnn_dim=64 --set eval.num_samples=10 "
                             "(VALUE is read as YAML; repeatable; validated like the file)")
    parser.add_argument("--truth", default=None, type=existing_file,
                        help="known-truth CSV (HADM_ID,P_DEATH,...) of a synthetic release: adds error vs truth "
                             "to the final reports")
    parser.add_argument("--base", default=None, type=existing_dir,
                        help="trained deterministic run folder that a 'bella' config adapts (frozen; required for "
                             "bella, refused otherwise)")
    parser.add_argument("--devices", default="auto",
                        help="where to train: auto (every GPU, mirrored when several; else the CPU), cpu, cpu:N "
                             "(the CPU split into N logical devices, mirrored: the multi-device path without a "
                             "GPU), gpu or gpu:N; not part of the run's config, so a run resumes on any count")
    parser.add_argument("--no-export", action="store_true", help="stop after training (no evaluation, no export)")
    parser.add_argument("--no-progress", action="store_true", help="hide the tqdm progress bars")
    parser.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")
    return parser


def parse_overrides(items: list[str]) -> dict[str, dict[str, object]]:
    """['model.rnn_dim=64', ...] -> {'model': {'rnn_dim': 64}}; values read as YAML scalars."""
    sections: dict[str, dict[str, object]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and section and name):
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. model.rnn_dim=64")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {item!r}: value is not valid YAML: {err}") from None
        if isinstance(value, str):
            # YAML 1.1 reads "1e-3" (no dot) as a string; on a command line it means a number.
            try:
                value = float(value)
            except ValueError:
                pass
        sections.setdefault(section, {})[name] = value
    return sections


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ehr-train`; returns the exit code."""
    # One command for both families: a task: image config (or run folder) goes to the image models.
    if image_cli.wants_image(argv):
        return image_cli.train_main(argv)
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    console.load_tensorflow(args.verbose)
    try:
        config = load_config(args.config).with_overrides(**parse_overrides(args.overrides))
        config = config.with_train_overrides(max_steps=args.steps, seed=args.seed,
                                             early_stopping_patience=args.patience)
    except ConfigError as err:
        return usage_error("ehr-train", err)

    # why: TensorFlow loads only once the arguments and the config are valid
    from model.fit import devices

    try:
        # Before any TensorFlow work: logical devices cannot be changed once TensorFlow has set up its own.
        devices.configure(args.devices)
    except (ValueError, RuntimeError) as err:
        print(f"ehr-train: {err}", file=sys.stderr)
        return 2
    # why: after devices.configure, which must run before anything sets up TensorFlow's devices
    from model.fit.training_loop import ConfigMismatchError
    from model.ehr.train import train

    try:
        result = train(config, args.data, args.out, progress=not args.no_progress,
                       export_model=not args.no_export, truth_path=args.truth, base_dir=args.base,
                       devices=args.devices)
    except (ConfigMismatchError, FileNotFoundError, ValueError) as err:
        return usage_error("ehr-train", err)
    log.info("finished at step %d in %s", result.step, result.out_dir)
    if result.best.get("stop_reason"):
        print(f"stopped: {result.best['stop_reason']}")
    if result.test_report is not None:
        print(formatting.format_table(result.test_report))
        print(f"export: {result.export_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
