"""Mean field vs the k-tied Normal (k = 1, 2, 3) on digits, and the gradient SNR of their stddev parameters.

  python bench/image_models/ktied_results.py --seeds 3                 # both parts, ~30 min on 2 CPU cores
  python bench/image_models/ktied_results.py --part snr --seeds 3      # only the SNR / -ELBO curves (Figure 6, right)

Part "digits": trains configs/image_digits_mean_field.yaml and configs/image_digits_ktied_normal.yaml
(k = 1, 2, 3) once per seed with model.image.train.train, evaluates clean and corrupted test sets,
and reports mean +- SEM over seeds of NLL / accuracy / ECE, their corrupted means, the parameter
count, and the training steps each run needs to reach the best validation -ELBO of the mean-field
run with the same seed (validation -ELBO = per-component NLL + kl_scale * KL / N_train, evaluated
every --eval-every steps).

Part "snr" (paper 003, Figure 6 right; App. D.4: no KL annealing here): trains the same MLP with a
fixed KL weight and records, for the second dense layer, the gradient SNR E[g^2] / Var[g] of each
stddev parameter over a window of the last 10 batches (the raw softplus parameter of each sigma_ij
for mean field, log u_ik and log v_jk for k-tied), averaged over the layer's parameters, and the
validation -ELBO, at several steps. Writes docs/figures/ktied_snr.png and a table.
"""
from __future__ import annotations

import argparse
import collections
import logging
import math
import pathlib
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.harness import mean_sem  # noqa: E402

log = logging.getLogger("bench.image_models.ktied_results")

# (row label, k): k None is the mean-field posterior.
VARIANTS = (("mean_field", None), ("1-tied", 1), ("2-tied", 2), ("3-tied", 3))
CLEAN = (("nll", "NLL"), ("accuracy", "Accuracy"), ("ece", "ECE"))
CORRUPTED = (("nll", "cNLL"), ("accuracy", "cA"), ("ece", "cECE"))
SNR_WINDOW = 10  # batches (the paper's footnote 3)
SNR_LAYER = 1  # index of the hidden layer measured: the paper's "Dense 2"
FIGURE = "docs/figures/ktied_snr.png"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", choices=("all", "digits", "snr"), default="all", help="which measurement to run")
    p.add_argument("--seeds", type=_positive, default=3, help="seeds per variant (>= 3 for a SEM)")
    p.add_argument("--epochs", type=float, default=None, help="override train.epochs of the digits configs")
    p.add_argument("--eval-every", type=int, default=50, help="steps between validation -ELBO evaluations")
    p.add_argument("--snr-steps", type=int, nargs="+", default=[50, 250, 500, 1000, 2000],
                   help="steps at which the SNR and validation -ELBO are measured (the last one ends the run)")
    p.add_argument("--work", default="out/ktied_results", help="folder for the run folders (replaced per run)")
    p.add_argument("--output", default="docs/results.md", help="results file (its ktied sections are rewritten)")
    p.add_argument("--no-write", action="store_true", help="print the tables only")
    return p


def _mean_sem(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and math.isfinite(v)]  # runs that never got there
    return mean_sem(vals) if vals else (float("nan"), float("nan"))


def _cell(values: list[float], digits: int = 4) -> str:
    mean, sem = _mean_sem(values)
    if not math.isfinite(mean):
        return "-"
    return f"{mean:.{digits}g}" + ("" if not math.isfinite(sem) else f" +- {sem:.{digits - 2}g}")


def variant_config(k: int | None, seed: int, **train):
    """The digits config of a variant (k None: mean field) with the seed and train overrides."""
    from model.image.config import load_config

    name = "mean_field" if k is None else "ktied_normal"
    config = load_config(ROOT / "configs" / f"image_digits_{name}.yaml")
    if k is not None:
        model = config.model.model_dump(mode="json")
        model["posterior"] = {**model["posterior"], "ktied_rank": k}
        config = config.with_overrides(model=model)
    return config.with_overrides(train={"seed": seed, **train}, eval={"seed": seed})


def _validation_elbo(result, config, n_train: int) -> list[tuple[int, float]]:
    """(step, validation -ELBO per example) of a run's periodic validations at full KL weight."""
    kl_at = {row["step"]: row["kl"] for row in result.history}
    return [(row["step"], row["per_component_nll"] + config.train.kl_scale * kl_at[row["step"]] / n_train)
            for row in result.validation if row["step"] in kl_at]


# --------------------------------------------------------------------------- part 1: digits


def run_digits(args: argparse.Namespace) -> tuple[dict, dict, dict, object]:
    """Every (variant, seed) run: reports, validation -ELBO curves, parameter counts, one config."""
    import tensorflow as tf

    from model.image.data import load_data
    from model.fit.training_loop import count_parameters
    from model.image.models import build_model
    from model.image.train import train

    reports, curves, params, config = {}, {}, {}, None
    train_overrides = {"eval_every_steps": args.eval_every, "log_every_steps": args.eval_every}
    if args.epochs is not None:
        train_overrides["epochs"] = args.epochs
    for label, k in VARIANTS:
        for seed in range(args.seeds):
            config = variant_config(k, seed, **train_overrides)
            data = load_data(config.data)
            if label not in params:
                params[label] = count_parameters(build_model(config.model, data.image_shape, data.num_classes))
                tf.keras.backend.clear_session()
            out = pathlib.Path(args.work) / "digits" / label / f"seed{seed}"
            shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume of an older one
            result = train(config, out, data=data, progress=False)
            tf.keras.backend.clear_session()
            r = result.report
            log.info("%s seed %d: %.0f s, test acc %.4f nll %.4f, cA %.4f cNLL %.4f", label, seed, result.wall_s,
                     r["test"]["accuracy"], r["test"]["nll"], r["mean_corrupted"]["accuracy"],
                     r["mean_corrupted"]["nll"])
            reports.setdefault(label, []).append(r)
            curves.setdefault(label, []).append(_validation_elbo(result, config, int(data.y_train.shape[0])))
    return reports, curves, params, config


def steps_to_reach(curves: dict[str, list[list[tuple[int, float]]]]) -> dict[str, list[int | None]]:
    """Per variant and seed: first step whose validation -ELBO <= the best of mean field's same-seed run."""
    reach = {}
    for label, runs in curves.items():
        reach[label] = []
        for seed, curve in enumerate(runs):
            target = min(value for _, value in curves["mean_field"][seed])
            reach[label].append(next((step for step, value in curve if value <= target), None))
    return reach


def digits_markdown(reports, curves, params, config, command: str, wall_s: float) -> str:
    """The ktied_digits section of docs/results.md."""
    from bench.harness import machine_info

    m, t, d = config.model, config.train, config.data
    first = next(iter(reports.values()))[0]
    reach = steps_to_reach(curves)
    seeds = len(next(iter(reports.values())))
    lines = [
        "## k-tied Normal vs mean field on digits (paper 003)",
        "",
        f"Command (repo root): `{command}`",
        "",
        f"Data: scikit-learn digits (8x8x1, 10 classes), fixed stratified split, test n = {first['n_test']}. "
        f"Model: MLP 64-{'-'.join([str(m.width)] * m.depth)}-10 (ReLU), every dense kernel Bayesian "
        "(configs/image_digits_mean_field.yaml, configs/image_digits_ktied_normal.yaml with ktied_rank k), "
        f"{t.epochs:g} epochs of batch {t.batch_size} (Adam {t.learning_rate:g}), prior N(0, "
        f"{m.posterior.prior_stddev:g}^2), KL weight {t.kl_scale:g} x KL / N_train annealed linearly over "
        f"{t.kl_annealing_epochs:g} epochs. S = {first['S']} samples. Mean +- SEM over {seeds} seeds. NLL is the "
        f"mixture NLL over the S samples; accuracy and ECE ({first['num_bins']} bins) of the predictive mean. "
        f"cNLL / cA / cECE: means over {len(d.corruptions)} computed corruptions x {len(d.severities)} intensities "
        "(model/image/corruptions.py). Steps to MF best: first validation step (every "
        f"{t.eval_every_steps} steps) whose -ELBO (per-component NLL + {t.kl_scale:g} KL / N_train) is at most "
        "the best of the mean-field run with the same seed; n/N = runs that got there.",
        f"Wall time {wall_s / 60:.1f} min.",
        "",
        "| Posterior | " + " | ".join(h for _, h in CLEAN + CORRUPTED)
        + " | best val -ELBO | steps to MF best | # Parameters |",
        "|---|" + "---|" * (len(CLEAN) + len(CORRUPTED) + 3),
    ]
    for label, runs in reports.items():
        cells = [_cell([r["test"][k] for r in runs]) for k, _ in CLEAN]
        cells += [_cell([r["mean_corrupted"][k] for r in runs]) for k, _ in CORRUPTED]
        cells.append(_cell([min(v for _, v in c) for c in curves[label]]))
        got = [s for s in reach[label] if s is not None]
        cells.append((_cell(got, 3) if got else "-") + f" ({len(got)}/{len(runs)})")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {params[label]:,} |")
    lines += ["", "Machine:", "", machine_info()]
    return "\n".join(lines)


# --------------------------------------------------------------------------- part 2: SNR


def snr_run(k: int | None, seed: int, measure_steps: list[int]) -> list[dict[str, float]]:
    """Train one MLP without KL annealing; SNR of Dense 2's stddev parameters and val -ELBO at each step."""
    import numpy as np
    import tensorflow as tf

    from model.image import evaluate as evaluation
    from model.image.data import load_data, train_dataset
    from model.image.models import build_model
    from model.fit import losses

    config = variant_config(k, seed, kl_annealing_epochs=0.0)
    tc = config.train
    data = load_data(config.data)
    n_train = int(data.y_train.shape[0])
    tf.random.set_seed(seed)
    model = build_model(config.model, data.image_shape, data.num_classes)
    init = model.hidden[SNR_LAYER].kernel_initializer
    tracked = [init.stddev] if k is None else [init.log_u, init.log_v]
    variables = model.trainable_variables
    where = [next(i for i, v in enumerate(variables) if v is t) for t in tracked]
    optimizer = tf.keras.optimizers.Adam(tc.learning_rate)
    kl_weight = tc.kl_scale / n_train

    @tf.function(autograph=False)
    def step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, num_samples=1, training=True)[:, 0]
            nll = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
            loss = nll + kl_weight * losses.kl_divergence(model)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return tf.concat([tf.reshape(grads[i], [-1]) for i in where], 0)

    stream = iter(train_dataset(data.x_train, data.y_train, tc.batch_size, seed=seed, flip=False,
                                crop_padding=0, shuffle_buffer=config.data.shuffle_buffer))
    window = collections.deque(maxlen=SNR_WINDOW)
    rows = []
    for current in range(1, max(measure_steps) + 1):
        window.append(step(*next(stream)).numpy())
        if current in measure_steps:
            g = np.stack(window).astype(np.float64)
            snr = np.mean(g ** 2, 0) / np.maximum(np.var(g, 0), 1e-300)  # the paper's footnote 3
            logits = evaluation.predict_logits(model, data.x_val, num_samples=1)
            metrics = evaluation.classification_metrics(logits, data.y_val, config.eval.num_bins)
            kl = float(losses.kl_divergence(model))
            rows.append({"step": current, "snr": float(np.mean(snr)), "snr_median": float(np.median(snr)),
                         "val_neg_elbo": metrics["per_component_nll"] + tc.kl_scale * kl / n_train})
    tf.keras.backend.clear_session()
    return rows


def run_snr(args: argparse.Namespace) -> dict[str, list[list[dict]]]:
    """SNR rows per variant and seed."""
    out = {}
    for label, k in VARIANTS:
        for seed in range(args.seeds):
            started = time.time()
            rows = snr_run(k, seed, sorted(args.snr_steps))
            log.info("snr %s seed %d: %.0f s, %s", label, seed, time.time() - started,
                     ", ".join(f"{r['step']}: {r['snr']:.3g}" for r in rows))
            out.setdefault(label, []).append(rows)
    return out


def snr_markdown(results: dict[str, list[list[dict]]], command: str, figure: str, wall_s: float) -> str:
    """The ktied_snr section of docs/results.md (and the figure)."""
    import numpy as np

    from model.evaluation.report.plots import curves_plot

    steps = [r["step"] for r in next(iter(results.values()))[0]]

    def series(key):
        return {label: (steps, [np.mean([run[i][key] for run in runs]) for i in range(len(steps))],
                        [_mean_sem([run[i][key] for run in runs])[1] for i in range(len(steps))])
                for label, runs in results.items()}

    curves_plot([("Dense 2 stddev parameters: median gradient SNR", series("snr_median")),
                 ("validation -ELBO (per example)", series("val_neg_elbo"))],
                xlabel="training step", path=ROOT / figure, log_y=(True, False))
    seeds = len(next(iter(results.values())))
    head = "| Posterior | " + " | ".join(f"step {s}" for s in steps) + " |"
    rule = "|---|" + "---|" * len(steps)
    lines = ["## Gradient SNR of the stddev parameters, digits MLP (paper 003, Figure 6 right)", "",
             f"Command (repo root): `{command}`", "",
             "The digits MLP of the k-tied digits section below, trained without KL annealing (App. D.4) at the fixed KL weight "
             "kl_scale x KL / N_train. SNR = E[g^2] / Var[g] (the paper's footnote 3) of each stddev parameter of the second dense layer "
             f"(400 x 400) over the last {SNR_WINDOW} batches: the raw softplus parameter of every sigma_ij for "
             "mean field (close to log sigma at these small sigmas), log u_ik and log v_jk for k-tied. The median "
             "over the layer's parameters is the robust summary: parameters whose gradient is (almost) only the "
             "analytic KL term (inputs from ReLU units that are off for the whole window) have a near-zero "
             "variance and an SNR that can be arbitrarily large, which makes the mean (the paper's statistic, "
             f"also listed) unstable. Mean +- SEM over {seeds} seeds. Wall time {wall_s / 60:.1f} min.",
             "", f"![gradient SNR and validation -ELBO]({pathlib.Path(figure).relative_to('docs')})", ""]
    for key, title in (("snr_median", "Median"), ("snr", "Mean")):
        lines += [f"{title} gradient SNR over the layer's stddev parameters:", "", head, rule]
        for label, runs in results.items():
            lines.append(f"| {label} | " + " | ".join(_cell([run[i][key] for run in runs], 3)
                                                        for i in range(len(steps))) + " |")
        lines.append("")
    lines += ["Validation -ELBO (per example):", "", head, rule]
    for label, runs in results.items():
        lines.append(f"| {label} | " + " | ".join(_cell([run[i]["val_neg_elbo"] for run in runs], 4)
                                                    for i in range(len(steps))) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench import harness

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    command = harness.command_line(__file__, argv)

    def publish(name: str, md: str) -> None:  # as soon as a part is done: a later failure keeps it
        harness.publish(name, md, args.output, write=not args.no_write)

    if args.part in ("all", "snr"):
        started = time.time()
        publish("ktied_snr", snr_markdown(run_snr(args), command, FIGURE, time.time() - started))
    if args.part in ("all", "digits"):
        started = time.time()
        reports, curves, params, config = run_digits(args)
        publish("ktied_digits", digits_markdown(reports, curves, params, config, command, time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
