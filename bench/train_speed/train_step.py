"""Train-step time of a rank-1 LSTM (K members) vs a deterministic one on the same tiled batch.

Usage: python bench/train_speed/train_step.py [--hidden 128 512] [--batch-size 128] [--timed-steps 20]
                                  [--vocab-sizes 848 10000 20000]

Each variant is input [K*batch, T, d] -> LSTM(hidden) -> dense(1) logits, trained with
Adam on mean sigmoid cross-entropy (+ KL / N_train for rank-1, + L2). The deterministic
network sees the same tiled batch, so the ratio is the cost of the rank-1 posterior alone.
Steps are timed one by one, round-robin across variants (the machine is shared: drift hits
every variant alike), and the median is reported.

The parameter overhead of the LSTM alone says little about the paper's claim, which is about
whole models; so the whole EHR model (``model.ehr.ehr_model.build_model`` with the model sections
of configs/ehr_rank1_normal.yaml and configs/ehr_deterministic.yaml) is also counted, per
vocabulary size.
"""
from __future__ import annotations

import argparse
import pathlib
import shlex
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import model  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
import tensorflow as tf  # noqa: E402

from bench import harness  # noqa: E402
from model.layers import factory  # noqa: E402
from model.layers.posterior import PosteriorConfig  # noqa: E402

N_TRAIN = 40_000  # KL scale 1/N_train: a MIMIC-III-sized training set
RANK1_CONFIG = "configs/ehr_rank1_normal.yaml"
DETERMINISTIC_CONFIG = "configs/ehr_deterministic.yaml"
# 848 = the demo's 841 codes + 7 OOV ids (out/demo manifest); full MIMIC-III with the
# pipeline's defaults (min_count 5, at most 10k codes per source, 6 sources) lands in the
# ~10k-20k range.
VOCAB_SIZES = (848, 10_000, 20_000)


def _build(variant: str, hidden: int, config: PosteriorConfig, input_dim: int,
           trainable_input: bool) -> tuple[tf.keras.Model, bool]:
    """(model, is_bayesian) for one variant name; trainable_input puts a Dense(input_dim) in front."""
    det = PosteriorConfig(method="deterministic", l2=config.l2)
    if variant == "deterministic, fast loop":
        layers, bayes = [factory.lstm(hidden, det), factory.dense(1, det)], False
    elif variant == "deterministic, keras LSTM":
        layers, bayes = [tf.keras.layers.LSTM(hidden, kernel_regularizer=tf.keras.regularizers.l2(config.l2),
                                              recurrent_regularizer=tf.keras.regularizers.l2(config.l2)),
                         factory.dense(1, det)], False
    elif variant == "rank-1, fast loop":
        layers, bayes = [factory.lstm(hidden, config), factory.dense(1, config)], True
    elif variant == "batchensemble, fast loop":
        be = PosteriorConfig(method="batchensemble", ensemble_size=config.ensemble_size, l2=config.l2)
        layers, bayes = [factory.lstm(hidden, be), factory.dense(1, be)], False
    elif variant == "rank-1, edward2 cell in keras RNN":
        layers, bayes = [tf.keras.layers.RNN(factory.lstm_cell(hidden, config)), factory.dense(1, config)], True
    else:
        raise ValueError(variant)
    if trainable_input:
        # As in the EHR model, whose LSTM reads pooled, projected embeddings: the gradient
        # must flow into the LSTM's input for every method, not only for the rank-1 factor.
        layers.insert(0, tf.keras.layers.Dense(input_dim, name="input_projection"))
    return tf.keras.Sequential(layers), bayes


def _train_step(net: tf.keras.Model, bayes: bool, xla: bool):
    optimizer = tf.keras.optimizers.Adam(3e-4)

    def step(x, y):
        with tf.GradientTape() as tape:
            logits = net(x, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
            loss += factory.l2_loss(net)
            if bayes:
                loss += factory.kl_loss(net) / N_TRAIN
        grads = tape.gradient(loss, net.trainable_variables)
        optimizer.apply_gradients(zip(grads, net.trainable_variables))
        return loss

    return tf.function(step, jit_compile=xla)


def run(hidden_sizes, batch_size, ensemble_size, time_steps, input_dim, timed_steps, warmup, xla, variants,
        trainable_input=True):
    """Times every variant at every hidden size; returns (markdown, rows)."""
    config = PosteriorConfig.mimic_normal(ensemble_size=ensemble_size)
    rows = []
    for hidden in hidden_sizes:
        tiled = batch_size * ensemble_size
        x = tf.random.normal([tiled, time_steps, input_dim])
        y = tf.cast(tf.random.uniform([tiled, 1]) < 0.1, tf.float32)
        runs = {}
        for variant in variants:
            net, bayes = _build(variant, hidden, config, input_dim, trainable_input)
            net(x[:ensemble_size])  # build variables
            # tf-keras' LSTM layer under XLA on CPU takes seconds per step (measured ~3.4 s CPU
            # at hidden 128): it is always timed in its normal graph mode.
            fn = _train_step(net, bayes, xla and variant != "deterministic, keras LSTM")
            for _ in range(warmup):
                fn(x, y).numpy()
            runs[variant] = dict(fn=fn, wall=[], cpu=[], params=net.count_params())
        for _ in range(timed_steps):
            for variant in variants:
                wall, cpu = time.perf_counter(), time.process_time()
                runs[variant]["fn"](x, y).numpy()
                runs[variant]["cpu"].append(time.process_time() - cpu)
                runs[variant]["wall"].append(time.perf_counter() - wall)
        base = runs.get("deterministic, fast loop") or runs[variants[0]]
        keras_det = runs.get("deterministic, keras LSTM")
        for variant in variants:
            r = runs[variant]
            row = dict(hidden=hidden, variant=variant, params=r["params"],
                       overhead=100.0 * (r["params"] - base["params"]) / base["params"])
            for clock in ("wall", "cpu"):
                ms = statistics.median(r[clock]) * 1e3
                row[f"{clock}_ms"] = ms
                row[f"{clock}_iqr"] = _iqr(r[clock]) * 1e3
                row[f"{clock}_ratio"] = ms / (statistics.median(base[clock]) * 1e3)
                row[f"{clock}_ratio_keras"] = (
                    ms / (statistics.median(keras_det[clock]) * 1e3) if keras_det else float("nan"))
            rows.append(row)
            print(f"hidden={hidden:4d} {variant:36s} wall {row['wall_ms']:8.1f} ms x{row['wall_ratio']:5.2f} | "
                  f"cpu {row['cpu_ms']:8.1f} ms x{row['cpu_ratio']:5.2f} | params {r['params']:,}", flush=True)
    return _markdown(rows, batch_size, ensemble_size, time_steps, input_dim, timed_steps, warmup, xla,
                     trainable_input), rows


def whole_model_parameters(vocab_sizes) -> list[dict]:
    """Trainable parameters of the whole EHR model, rank-1 vs deterministic, per vocabulary size.

    Also counts the rank-1 config with method ``bayesian_embeddings`` (same sizes, same
    mean-field embedding table, plain layers): the difference to it is what the rank-1
    factors alone add, separated from the embedding table's stddevs, which any Bayesian
    embedding has and which are not part of the rank-1 parameterisation.
    """
    from model.ehr.config import load_config
    from model.fit.training_loop import count_parameters
    from model.ehr.ehr_model import build_model

    rank1_cfg = load_config(ROOT / RANK1_CONFIG).model
    det_cfg = load_config(ROOT / DETERMINISTIC_CONFIG).model
    emb_cfg = rank1_cfg.model_copy(update=dict(method="bayesian_embeddings", ensemble_size=1))
    rows = []
    for vocab in vocab_sizes:
        r1, det, emb = (count_parameters(build_model(c, vocab)) for c in (rank1_cfg, det_cfg, emb_cfg))
        rows.append(dict(vocab=vocab, rank1=r1, det=det, bayes_emb=emb,
                         overhead=100.0 * (r1 - det) / det, factor_overhead=100.0 * (r1 - emb) / emb))
        print(f"vocab {vocab:6d}: rank-1 {r1:,} det {det:,} ({rows[-1]['overhead']:+.2f}%) "
              f"bayesian-embeddings {emb:,} (factors {rows[-1]['factor_overhead']:+.2f}%)", flush=True)
    return rows


def _parameters_markdown(rows) -> str:
    lines = [
        "### Parameter overhead of the whole EHR model",
        "",
        f"`model.ehr.ehr_model.build_model` with the model sections of `{RANK1_CONFIG}` (rank-1 Normal, "
        f"K=4, Table 7 sizes: embedding 32, LSTM 512, hidden 512) and `{DETERMINISTIC_CONFIG}` (same sizes); "
        "trainable scalars. 848 ids is the demo vocabulary (841 codes + 7 OOV ids); full MIMIC-III "
        "with the pipeline's defaults gives ~10k-20k ids. `bayesian embeddings` is the rank-1 config's "
        "model with plain layers (method `bayesian_embeddings`): the column against it is what the "
        "rank-1 factors alone add; the column against the deterministic model also counts the "
        "embedding table's posterior stddevs (V x 32), which grow with the vocabulary.",
        "",
        "| vocabulary ids | deterministic | bayesian embeddings | rank-1 | rank-1 vs det. | rank-1 factors alone |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['vocab']:,} | {r['det']:,} | {r['bayes_emb']:,} | {r['rank1']:,} | "
                     f"{r['overhead']:+.2f}% | {r['factor_overhead']:+.2f}% |")
    lines += ["", "Target: parameter overhead <= 1%."]
    for r in rows:
        lines.append(f"- vocabulary {r['vocab']:,}: {r['overhead']:+.2f}% vs deterministic, "
                     f"{r['factor_overhead']:+.2f}% for the rank-1 factors alone "
                     f"({'met' if r['factor_overhead'] <= 1.0 else 'NOT met'}).")
    lines.append("")
    return "\n".join(lines)


def _iqr(times):
    q = statistics.quantiles(times, n=4)
    return q[2] - q[0]


def _markdown(rows, batch_size, k, time_steps, input_dim, timed_steps, warmup, xla, trainable_input) -> str:
    lines = [
        "## Train step: rank-1 LSTM vs deterministic (`bench/train_speed/train_step.py`)",
        "",
        f"Forward + backward + Adam on a tiled batch of {batch_size} x K={k} = {batch_size * k} sequences, "
        f"{time_steps} steps, input dim {input_dim}; "
        + ("trainable Dense(input dim) -> LSTM -> dense(1) (as in the EHR model, the LSTM's input is trained, "
           "so every method back-propagates through the input matmul). " if trainable_input else
           "constant input -> LSTM -> dense(1) (the deterministic network skips the input gradient; the rank-1 "
           "one needs it for its input factor: one extra matmul per step). ")
        + f"Median of {timed_steps} timed steps "
        f"after {warmup} warm-up steps, variants timed round-robin; XLA {'on (not for Keras LSTM)' if xla else 'off'}; "
        "CPU, 2 cores shared with other jobs, so wall time is noisy: the process CPU time per step "
        "(all threads) is reported next to it and is the steadier measure. Ratios are against the "
        "deterministic network run by the same fast loop (`x det.`) and against Keras' LSTM layer "
        "(`x keras`). Parameter overhead is against the deterministic network (LSTM + head only, "
        "no embedding table).",
        "",
        "| hidden | variant | wall ms (IQR) | CPU ms (IQR) | x det. wall / CPU | x keras wall / CPU "
        "| params | param overhead |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['hidden']} | {r['variant']} | {r['wall_ms']:.0f} ({r['wall_iqr']:.0f}) | "
            f"{r['cpu_ms']:.0f} ({r['cpu_iqr']:.0f}) | {r['wall_ratio']:.2f} / {r['cpu_ratio']:.2f} | "
            f"{r['wall_ratio_keras']:.2f} / {r['cpu_ratio_keras']:.2f} | {r['params']:,} | {r['overhead']:+.2f}% |")
    lines += ["", "Targets: rank-1 step <= 1.10 x deterministic, parameter overhead <= 1%."]
    for r in rows:
        if r["variant"] == "rank-1, fast loop":
            step_ok = max(r["wall_ratio"], r["cpu_ratio"]) <= 1.10
            lines.append(
                f"- hidden {r['hidden']}: step x{r['wall_ratio']:.2f} wall / x{r['cpu_ratio']:.2f} CPU "
                f"({'met' if step_ok else 'NOT met'}); parameter overhead {r['overhead']:+.2f}% "
                f"({'met' if r['overhead'] <= 1.0 else 'NOT met'}).")
    lines.append("")
    return "\n".join(lines)


def write_markdown(md: str) -> None:
    """Writes the train_step section of docs/benchmarks.md (bench/harness.py)."""
    print(f"wrote {harness.write_section('train_step', md)}")


VARIANTS = ("deterministic, fast loop", "deterministic, keras LSTM", "rank-1, fast loop",
            "rank-1, edward2 cell in keras RNN", "batchensemble, fast loop")
# The last one is opt-in (--variants) to keep the default run under ~5 minutes on 2 cores.
DEFAULT_VARIANTS = VARIANTS[:4]


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512], help="LSTM sizes to time")
    parser.add_argument("--batch-size", type=int, default=128, help="examples per member (tiled K times)")
    parser.add_argument("--ensemble-size", type=int, default=4, help="K, rank-1 members")
    parser.add_argument("--time-steps", type=int, default=30, help="sequence length (bags)")
    parser.add_argument("--input-dim", type=int, default=64, help="LSTM input width")
    parser.add_argument("--input", choices=["trainable", "constant"], default="trainable",
                        help="LSTM input from a trainable Dense layer (as in the EHR model) or a constant tensor")
    parser.add_argument("--timed-steps", type=int, default=20, help="timed train steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="untimed train steps per variant first")
    # Off by default: on this 2-core CPU, XLA lowers CPU time a little but runs the loop
    # mostly on one thread, so wall time per step gets worse.
    parser.add_argument("--xla", action="store_true", help="jit_compile the train steps (not Keras' LSTM)")
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=VARIANTS,
                        help="which networks to time")
    parser.add_argument("--vocab-sizes", type=int, nargs="*", default=list(VOCAB_SIZES),
                        help="vocabulary sizes for the whole-model parameter count (none: skip it)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="print only")
    args = parser.parse_args(argv)
    md, _ = run(args.hidden, args.batch_size, args.ensemble_size, args.time_steps, args.input_dim,
                args.timed_steps, args.warmup, args.xla, args.variants, args.input == "trainable")
    if args.vocab_sizes:
        md += "\n" + _parameters_markdown(whole_model_parameters(args.vocab_sizes))
    md += "\nCommand: `" + shlex.join(["python", "bench/train_speed/train_step.py", *(argv if argv is not None else sys.argv[1:])]) + "`\n"
    md += "\nMachine:\n\n" + harness.machine_info() + "\n"
    print(md)
    if args.write:
        write_markdown(md)


if __name__ == "__main__":
    main()
