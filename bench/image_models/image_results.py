"""Deterministic vs BatchEnsemble vs rank-1 Normal vs rank-1 Cauchy on digits, clean and corrupted.

  python bench/image_models/image_results.py --seeds 3            # ~10 min on 2 CPU cores

Trains configs/image_digits_<method>.yaml once per seed (the data split is fixed; the seed
moves initialisation, factor draws and the input order), evaluates each run on the clean
test set and on the 8 computed corruptions x 5 intensities, and writes mean +- SEM over
seeds of NLL / accuracy / ECE and of their corrupted means cNLL / cA / cECE (Table 2's
columns) into the ``image`` section of docs/results.md. It also counts the parameters of
WRN-28-10 on 32x32x3 CIFAR-10 inputs per method, the model of the paper's Tables 2-3.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.harness import cell  # noqa: E402

log = logging.getLogger("bench.image_models.image_results")

METHODS = ("deterministic", "batchensemble", "rank1_normal", "rank1_cauchy")
CLEAN = (("nll", "NLL"), ("accuracy", "Accuracy"), ("ece", "ECE"))
CORRUPTED = (("nll", "cNLL"), ("accuracy", "cA"), ("ece", "cECE"))
# WRN-28-10 variants whose parameters are counted: (label, method, distribution, K, batch norm, dropout).
WRN_VARIANTS = (
    ("deterministic", "deterministic", "normal", 1, "shared", 0.0),
    ("mc_dropout", "deterministic", "normal", 1, "shared", 0.1),
    ("batchensemble", "batchensemble", "normal", 4, "shared", 0.0),
    ("rank1_normal", "rank1", "normal", 4, "shared", 0.0),
    ("rank1_cauchy", "rank1", "cauchy", 4, "shared", 0.0),
    ("rank1_normal, per-member BN", "rank1", "normal", 4, "per_member", 0.0),
)
# The paper's Table 2 (CIFAR-10) parameter counts, for comparison.
PAPER_PARAMS = {"deterministic": "36.5M", "mc_dropout": "36.5M", "batchensemble": "36.6M", "rank1_normal": "36.6M",
                "rank1_cauchy": "36.6M"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds per method (>= 3 for a SEM)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--work", default="out/image_results", help="folder for the run folders (replaced per run)")
    p.add_argument("--output", default="docs/results.md", help="results file (its image section is rewritten)")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    return p


def wrn_parameter_counts() -> dict[str, int]:
    """Trainable parameters of WRN-28-10 for CIFAR-10 (32x32x3, 10 classes) per method."""
    import tensorflow as tf

    from model.image.config import ImageModelConfig
    from model.fit.training_loop import count_parameters
    from model.image.models import build_model
    from model.layers.posterior import PosteriorConfig

    counts = {}
    for label, method, distribution, k, bn, dropout in WRN_VARIANTS:
        config = ImageModelConfig(depth=28, width=10, batch_norm=bn, mc_dropout_rate=dropout,
                                  posterior=PosteriorConfig(method=method, distribution=distribution, ensemble_size=k))
        counts[label] = count_parameters(build_model(config, (32, 32, 3), 10))
        tf.keras.backend.clear_session()
    return counts


def run_all(args: argparse.Namespace) -> tuple[dict[str, list[dict]], dict[str, int], dict[str, object]]:
    """Every (method, seed) run: their reports, the digits model's parameter count, the configs."""
    import tensorflow as tf

    from model.image.config import load_config
    from model.image.data import load_data
    from model.fit.training_loop import count_parameters
    from model.image.models import build_model
    from model.image.train import train

    reports: dict[str, list[dict]] = {}
    params: dict[str, int] = {}
    configs: dict[str, object] = {}
    for method in args.methods:
        base = load_config(ROOT / "configs" / f"image_digits_{method}.yaml")
        configs[method] = base
        data = load_data(base.data)
        params[method] = count_parameters(build_model(base.model, data.image_shape, data.num_classes))
        for seed in range(args.seeds):
            config = base.with_overrides(train={"seed": seed})
            out = pathlib.Path(args.work) / method / f"seed{seed}"
            shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume of an older one
            started = time.time()
            result = train(config, out, data=data, progress=False)
            tf.keras.backend.clear_session()
            r = result.report
            log.info("%s seed %d: %.0f s, test acc %.4f nll %.4f, cA %.4f cNLL %.4f", method, seed,
                     time.time() - started, r["test"]["accuracy"], r["test"]["nll"],
                     r["mean_corrupted"]["accuracy"], r["mean_corrupted"]["nll"])
            reports.setdefault(method, []).append(r)
    return reports, params, configs


def markdown(reports: dict[str, list[dict]], params: dict[str, int], wrn: dict[str, int], configs: dict,
             command: str, wall_s: float) -> str:
    """The image section of docs/results.md."""
    from bench.harness import machine_info

    any_config = next(iter(configs.values()))
    m, t, d = any_config.model, any_config.train, any_config.data
    first = next(iter(reports.values()))[0]
    lines = [
        "## Image models: digits, clean and corrupted (rank-1 vs baselines)",
        "",
        f"Command (repo root): `{command}`",
        "",
        f"Data: scikit-learn digits (8x8x1, 10 classes), fixed stratified split, test n = {first['n_test']}. "
        f"Model: WRN-{m.depth}-{m.width}, {t.epochs:g} epochs of batch {t.batch_size} ({t.optimizer}), "
        f"configs/image_digits_<method>.yaml. K = 4 for the ensembles; S = {first['S']} sample per member "
        "(the paper's image setting). Mean +- SEM over "
        f"{len(next(iter(reports.values())))} seeds (initialisation, factor draws, input order). "
        f"NLL is the mixture NLL over S x K; accuracy and ECE ({first['num_bins']} bins, top label) of the "
        "predictive mean. cNLL / cA / cECE: means over "
        f"{len(d.corruptions)} corruptions ({', '.join(d.corruptions)}) x intensities "
        f"{', '.join(map(str, d.severities))}, computed by model/image/corruptions.py from the test set (CIFAR-10-C "
        "parameters in pixel units, so relatively strong on 8x8 images; not the paper's 15 CIFAR-10-C types).",
        f"Wall time {wall_s / 60:.1f} min.",
        "",
        "| Method | " + " | ".join(h for _, h in CLEAN + CORRUPTED) + " | # Parameters | runs |",
        "|---|" + "---|" * (len(CLEAN) + len(CORRUPTED) + 2),
    ]
    for method, runs in reports.items():
        cells = [cell([r["test"][k] for r in runs]) for k, _ in CLEAN]
        cells += [cell([r["mean_corrupted"][k] for r in runs]) for k, _ in CORRUPTED]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {params[method]:,} | {len(runs)} |")
    sevs = list(first["by_severity"])
    for key, label in (("accuracy", "Accuracy"), ("nll", "NLL")):
        lines += ["", f"{label} per corruption intensity (mean over corruptions; mean +- SEM over seeds):", "",
                  "| Method | clean | " + " | ".join(f"sev {s}" for s in sevs) + " |",
                  "|---|---|" + "---|" * len(sevs)]
        for method, runs in reports.items():
            cells = [cell([r["test"][key] for r in runs], 3)]
            cells += [cell([r["by_severity"][s][key] for r in runs], 3) for s in sevs]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Parameters of WRN-28-10 on CIFAR-10 inputs (32x32x3, 10 classes; built, not trained), K = 4:", "",
              "| Method | # Parameters | vs deterministic | paper (Table 2) |", "|---|---|---|---|"]
    base = wrn["deterministic"]
    for label, count in wrn.items():
        lines.append(f"| {label} | {count:,} | {100 * (count - base) / base:+.2f}% | {PAPER_PARAMS.get(label, '')} |")
    lines += ["", "Machine:", "", machine_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.harness import command_line, publish

    from ehr_base.cli_args import setup_logging

    setup_logging()
    if args.seeds < 1:
        print("image_results: --seeds must be >= 1", file=sys.stderr)
        return 2
    started = time.time()
    reports, params, configs = run_all(args)
    wrn = wrn_parameter_counts()
    md = markdown(reports, params, wrn, configs, command_line(__file__, argv), time.time() - started)
    publish("image", md, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
