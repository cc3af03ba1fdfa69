"""Bella (ensemble / SVGD particles on a frozen base) vs its base, a deep ensemble, BatchEnsemble, rank-1 on digits.

  python bench/image_models/bella_digits.py --seeds 3            # ~35 min on 2 CPU cores

Per seed s: the deterministic base (configs/image_digits_deterministic.yaml, seed s); Bella
ensemble and Bella SVGD (configs/image_digits_bella_*.yaml, seed s) adapting that base; a deep
ensemble of 4 deterministic runs (seeds s, s+n, s+2n, s+3n for n seeds, so the ensembles of
different seeds share no member); BatchEnsemble and rank-1 Normal (their digits configs). Every
run is evaluated on the clean test set and the 8 computed corruptions x 5 intensities. The
``bella_digits`` section of docs/results.md gets mean +- SEM over seeds of NLL / accuracy /
ECE / mean mutual information, clean and corrupted, the trainable parameters and the training
time (Bella's own time, and with its base's).
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.harness import cell  # noqa: E402

log = logging.getLogger("bench.image_models.bella_digits")

BELLA = ("bella_ensemble", "bella_svgd")
OTHERS = ("batchensemble", "rank1_normal")
DEEP_ENSEMBLE_SIZE = 4
COLUMNS = (("nll", "NLL"), ("accuracy", "Acc"), ("ece", "ECE"), ("mutual_information", "MI"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds (>= 3 for a SEM)")
    p.add_argument("--others", nargs="*", default=list(OTHERS), choices=OTHERS,
                   help="other K = 4 methods to train for comparison (none: only base, deep ensemble, Bella)")
    p.add_argument("--bella-epochs", type=float, default=None, help="override the Bella configs' train.epochs")
    p.add_argument("--work", default="out/bella_digits", help="folder for the run folders (replaced per run)")
    p.add_argument("--output", default="docs/results.md", help="results file (its bella_digits section is rewritten)")
    p.add_argument("--reuse", action="store_true",
                   help=f"keep runs in --work that finished earlier ({TIME_FILE} written) instead of retraining")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    return p


class _DeepEnsemble:
    """Members' logits side by side along the component axis: what evaluate_model needs of a model."""

    def __init__(self, members):
        self.members = members
        self.ensemble_size = sum(m.ensemble_size for m in members)

    def predict_logits(self, images, num_samples):
        import tensorflow as tf

        return tf.concat([m.predict_logits(images, num_samples) for m in self.members], axis=1)


TIME_FILE = "train_seconds.json"


def _train(config, out: pathlib.Path, data, base: pathlib.Path | None = None, reuse: bool = False) -> float:
    """Trains one fresh run without evaluation (or, with reuse, keeps a finished one); returns its train time (s)."""
    from model.image.train import train

    if reuse and (out / TIME_FILE).exists():
        return float(json.loads((out / TIME_FILE).read_text())["train_s"])
    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume of an older one
    started = time.time()
    train(config, out, data=data, progress=False, evaluate=False, base_dir=base)
    seconds = time.time() - started
    (out / TIME_FILE).write_text(json.dumps({"train_s": seconds}))
    return seconds


def _evaluate(run: pathlib.Path, data) -> tuple[dict, object]:
    from model.image import evaluate as evaluation
    from model.image.train import load_run

    config, model, _, _ = load_run(run, data=data)
    return evaluation.evaluate_model(model, config, data), model


def run_all(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Rows per method: one dict per seed with the report, trainable parameters and train time."""
    import tensorflow as tf

    from model.image.config import load_config
    from model.image.data import load_data
    from model.image.evaluate import evaluate_model
    from model.fit.training_loop import count_parameters
    from model.layers import bella

    work = pathlib.Path(args.work)
    det_config = load_config(ROOT / "configs" / "image_digits_deterministic.yaml")
    data = load_data(det_config.data)
    n = args.seeds
    rows: dict[str, list[dict]] = {}
    det_time: dict[int, float] = {}
    for seed in range(n * DEEP_ENSEMBLE_SIZE):
        det_time[seed] = _train(det_config.with_overrides(train={"seed": seed}), work / f"det_s{seed}", data,
                                reuse=args.reuse)
        log.info("deterministic seed %d: %.0f s", seed, det_time[seed])
    for seed in range(n):
        report, model = _evaluate(work / f"det_s{seed}", data)
        params = count_parameters(model)
        rows.setdefault("deterministic (base)", []).append({"report": report, "params": params,
                                                            "train_s": det_time[seed]})
        members = [seed + i * n for i in range(DEEP_ENSEMBLE_SIZE)]
        ensemble = _DeepEnsemble([_evaluate(work / f"det_s{m}", data)[1] for m in members])
        report = evaluate_model(ensemble, det_config, data)
        rows.setdefault(f"deep ensemble ({DEEP_ENSEMBLE_SIZE} deterministic)", []).append(
            {"report": report, "params": DEEP_ENSEMBLE_SIZE * params, "train_s": sum(det_time[m] for m in members)})
        for method in BELLA:
            config = load_config(ROOT / "configs" / f"image_digits_{method}.yaml")
            train_over = {"seed": seed} if args.bella_epochs is None else {"seed": seed, "epochs": args.bella_epochs}
            config = config.with_overrides(train=train_over)
            own = _train(config, work / f"{method}_s{seed}", data, base=work / f"det_s{seed}", reuse=args.reuse)
            report, model = _evaluate(work / f"{method}_s{seed}", data)
            rows.setdefault(method, []).append({"report": report, "params": bella.count_trainable(model),
                                                "train_s": own, "with_base_s": own + det_time[seed]})
            log.info("%s seed %d: %.0f s, acc %.4f nll %.4f, cA %.4f", method, seed, own, report["test"]["accuracy"],
                     report["test"]["nll"], report["mean_corrupted"]["accuracy"])
        for method in args.others:
            config = load_config(ROOT / "configs" / f"image_digits_{method}.yaml").with_overrides(train={"seed": seed})
            own = _train(config, work / f"{method}_s{seed}", data, reuse=args.reuse)
            report, model = _evaluate(work / f"{method}_s{seed}", data)
            rows.setdefault(method, []).append({"report": report, "params": count_parameters(model), "train_s": own})
        tf.keras.backend.clear_session()
    return rows


def markdown(rows: dict[str, list[dict]], command: str, wall_s: float, bella_epochs: float | None) -> str:
    """The bella_digits section of docs/results.md."""
    from bench.harness import machine_info
    from model.image.config import load_config

    det = load_config(ROOT / "configs" / "image_digits_deterministic.yaml")
    svgd = load_config(ROOT / "configs" / "image_digits_bella_svgd.yaml")
    p = svgd.model.posterior
    epochs = bella_epochs if bella_epochs is not None else svgd.train.epochs
    first = next(iter(rows.values()))[0]["report"]
    n_seeds = len(next(iter(rows.values())))
    lines = [
        "## Bella on digits: low-rank particles on a frozen base vs " + ", ".join(
            m for m in rows if not m.startswith("bella")),
        "",
        f"Command (repo root): `{command}`",
        "",
        f"Data: scikit-learn digits, fixed stratified split, test n = {first['n_test']}; corrupted = mean over "
        f"{len(det.data.corruptions)} computed corruptions x {len(det.data.severities)} intensities "
        "(model/image/corruptions.py). Model: WRN-10-2. Base: configs/image_digits_deterministic.yaml "
        f"({det.train.epochs:g} epochs). Bella: P = {p.ensemble_size} particles, rank r = {p.adapter_rank} "
        f"adapters on every conv and the dense head, N(0, {p.prior_stddev:g}^2) prior, {epochs:g} epochs on the "
        "frozen base (its batch norms frozen too), configs/image_digits_bella_{ensemble,svgd}.yaml. Deep "
        f"ensemble: {DEEP_ENSEMBLE_SIZE} deterministic runs per seed, disjoint across seeds. K = 4 and S = 1 for "
        f"every ensemble. Mean +- SEM over {n_seeds} seeds. NLL: mixture NLL over the K members; Acc / ECE "
        "(15 bins, top label) of the predictive mean; MI: mean mutual information between label and member "
        "(the epistemic part). Params: trainable scalars. Train s: this run's training wall time (Bella: "
        "adapters only; + base: with its base's), evaluation excluded; the machine is shared, so times are rough.",
        f"Wall time {wall_s / 60:.1f} min.",
        "",
        "| Method | " + " | ".join(h for _, h in COLUMNS) + " | c" + " | c".join(h for _, h in COLUMNS)
        + " | Params | Train s | + base s |",
        "|---|" + "---|" * (2 * len(COLUMNS) + 3),
    ]
    for method, runs in rows.items():
        cells = [cell([r["report"]["test"][k] for r in runs]) for k, _ in COLUMNS]
        cells += [cell([r["report"]["mean_corrupted"][k] for r in runs]) for k, _ in COLUMNS]
        with_base = cell([r["with_base_s"] for r in runs], 0) if "with_base_s" in runs[0] else ""
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {runs[0]['params']:,} | "
                     f"{cell([r['train_s'] for r in runs], 0)} | {with_base} |")
    lines += ["", "Machine:", "", machine_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.harness import command_line, publish

    from model.export_layout import json_ready

    from ehr_base.cli_args import setup_logging

    setup_logging()
    if args.seeds < 1:
        print("bella_digits: --seeds must be >= 1", file=sys.stderr)
        return 2
    started = time.time()
    rows = run_all(args)
    # Kept beside the runs: the table can be re-made from it without retraining.
    (pathlib.Path(args.work) / "rows.json").write_text(json.dumps(json_ready(rows), indent=1))
    md = markdown(rows, command_line(__file__, argv), time.time() - started, args.bella_epochs)
    publish("bella_digits", md, args.output, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
