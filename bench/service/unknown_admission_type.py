"""How much an unknown admission type moves the risk, answered the ways one could: docs/fhir.md.

  python bench/service/unknown_admission_type.py                 # 3 synthetic site-A releases, a rank-1 model each

A FHIR Encounter often states no admission type. The service then averages the model over the
training admission types by their training frequency, the S samples per member split among
the types (serving.inference.admission_type). This script measures, on each release's test split, how
far that answer lies from the answer with the recorded type, beside the alternatives: the
training's most frequent type, and the model's "other" slot (what any unlisted string such
as "UNKNOWN" was fed as before: a one-hot input no training admission ever set). It also
scores each answer against the known P_DEATH of the synthetic release.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.service.unknown_admission_type")

# compare_methods' medium model and training settings (docs/results.md), shorter by default.
MODEL = {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32, "pooling": "attention", "attention_heads": 4}
TRAIN = {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 250,
         "early_stopping_patience": 4, "checkpoint_every_steps": 500, "log_every_steps": 100,
         "shuffle_buffer": 4096, "kl_annealing_steps": 1000, "kl_scale": 0.3}
OTHER_SLOT = "UNKNOWN"  # a string outside model.ehr.inputs.ADMISSION_TYPES: the untrained "other" slot


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", default="out/unknown_admission_type", help="folder for releases, data and runs")
    p.add_argument("--patients", type=int, default=3000, help="patients per synthetic site-A release")
    p.add_argument("--seeds", type=int, nargs="+", default=[21, 22, 23],
                   help="release seeds; each release trains one model with the same seed")
    p.add_argument("--steps", type=int, default=2000, help="max_steps of each training run")
    p.add_argument("--samples", type=int, default=25, help="S samples per member of every answer")
    p.add_argument("--out", default="docs/fhir.md", help="markdown file that receives the table")
    return p


def _prepare(seed: int, args: argparse.Namespace, work: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """(release, data folder, export) of one seed, each made if missing."""
    from ehr_pipeline.contract import PipelineConfig
    from ehr_pipeline.job import run_job
    from ehr_pipeline.synth import SynthConfig, write_release
    from model.ehr.config import load_config
    from model.ehr.train import train

    release, data, run = work / f"release_{seed}", work / f"data_{seed}", work / f"run_{seed}"
    if not (release / "SYNTH_TRUTH.csv").exists():
        write_release(SynthConfig(patients=args.patients, seed=seed), release, show_progress=False)
    if not (data / "manifest.json").exists():
        run_job(str(release), str(data), PipelineConfig(), ["--runner=FnApiRunner"])
    if not (run / "export" / "manifest.json").exists():
        config = load_config(ROOT / "configs" / "ehr_rank1_normal.yaml").with_overrides(
            model=MODEL, train={**TRAIN, "seed": seed, "max_steps": args.steps},
            eval={"num_samples": args.samples, "seed": seed, "n_bootstrap": 100})
        started = time.time()
        train(config, data, run, progress=False, truth_path=release / "SYNTH_TRUTH.csv")
        log.info("seed %d trained in %.0f s", seed, time.time() - started)
    return release, data, run / "export"


def _with_type(records: list[bytes], kind: str) -> list[bytes]:
    from ehr_pipeline.contract import protos, spec

    out = []
    for record in records:
        example = protos.SequenceExample.FromString(record)
        feature = example.context.feature[spec.ADMISSION_TYPE].bytes_list
        del feature.value[:]
        feature.value.append(kind.encode())
        out.append(example.SerializeToString(deterministic=True))
    return out


def measure(release: pathlib.Path, data: pathlib.Path, export_dir: pathlib.Path, samples: int,
            seed: int) -> dict[str, np.ndarray]:
    """Per test case: the recorded type, P_DEATH and the sampled probabilities [N, S*K] of each answer."""
    from ehr_pipeline.contract import spec
    from ehr_pipeline.encode import seqex
    from model.evaluation.evaluate import load_truth
    from model.export.load import load_export
    from model.export.predict import predict_probs
    from model.data_folder import load_data_files, read_split
    from serving.inference import admission_type

    export = load_export(export_dir)
    counts = export.files.admission_types
    split_records = read_split(load_data_files(data), "test")
    records, hadm_ids = split_records.records, split_records.hadm_ids
    kinds = np.array([seqex.sequence_example_to_dict(r)[spec.ADMISSION_TYPE] for r in records])
    allocation = admission_type.allocate(counts, samples)
    mixture = admission_type.mixed([predict_probs(export, _with_type(records, t), n, seed) for t, n in allocation])
    frequent = max(counts, key=lambda t: counts[t])
    return {
        "kind": kinds, "truth": np.asarray(load_truth(release / "SYNTH_TRUTH.csv", hadm_ids)),
        "known": predict_probs(export, records, samples, seed),
        "averaged over the training types": mixture,
        f"most frequent type ({frequent})": predict_probs(export, _with_type(records, frequent), samples, seed),
        f"'other' slot ({OTHER_SLOT!r})": predict_probs(export, _with_type(records, OTHER_SLOT), samples, seed),
        "counts": np.array([f"{t} {counts[t]}" for t in sorted(counts, key=lambda t: -counts[t])]),
        "allocation": np.array([f"{t} {n}" for t, n in allocation]),
    }


def _mean_sem(values) -> str:
    v = np.asarray(values, dtype=float)
    sem = v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else float("nan")
    return f"{v.mean():.4f} ± {sem:.4f}"


def report(results: list[dict[str, np.ndarray]], command: str, seeds: list[int], samples: int) -> str:
    """The markdown section: per answer, distance to the known-type answer and to P_DEATH (mean ± SEM over seeds)."""
    from model.evaluation.statistics.metrics import uncertainties

    answers = [k for k in results[0] if k not in ("kind", "truth", "known", "counts", "allocation")]
    kinds = sorted({k for r in results for k in r["kind"].tolist()})
    lines = [
        f"Measured with `{command}` ({len(seeds)} synthetic site-A releases, seeds {', '.join(map(str, seeds))}; a "
        f"rank-1 Normal model trained on each, S = {samples} per member; mean ± SEM over the seeds of each "
        "test split's mean). Training admission types (examples, first seed): "
        f"{', '.join(results[0]['counts'].tolist())}; samples per member when averaged: "
        f"{', '.join(results[0]['allocation'].tolist())}.",
        "",
        "| answer for an unknown type | mean abs(p - p known type) | " +
        " | ".join(f"... {k} cases" for k in kinds) + " | 95th pct abs(p - p known) | abs(p - P_DEATH) | "
        "epistemic (MI) |",
        "|---|---|" + "---|" * len(kinds) + "---|---|---|",
    ]
    rows = [("known type (reference)", "known")] + [(a, a) for a in answers]
    for label, key in rows:
        p = [r[key].mean(axis=1) for r in results]
        known = [r["known"].mean(axis=1) for r in results]
        gap = [np.abs(a - b) for a, b in zip(p, known)]
        by_kind = [_mean_sem([g[r["kind"] == k].mean() for g, r in zip(gap, results) if (r["kind"] == k).any()])
                   for k in kinds]
        lines.append(f"| {label} | {_mean_sem([g.mean() for g in gap])} | " + " | ".join(by_kind) +
                     f" | {_mean_sem([np.quantile(g, 0.95) for g in gap])} | "
                     f"{_mean_sem([np.abs(a - r['truth']).mean() for a, r in zip(p, results)])} | "
                     f"{_mean_sem([uncertainties(r[key])['mutual_information'].mean() for r in results])} |")
    n = [int(r["kind"].size) for r in results]
    lines += ["", f"Test cases per seed: {', '.join(map(str, n))}; by recorded type (first seed): " +
              ", ".join(f"{k} {(results[0]['kind'] == k).sum()}" for k in kinds) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and writes its section of --out."""
    from bench import harness

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    work = ROOT / args.work
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        release, data, export = _prepare(seed, args, work)
        results.append(measure(release, data, export, args.samples, seed))
    markdown = report(results, harness.command_line(__file__, argv), args.seeds,
                      args.samples)
    harness.publish("unknown_admission_type", markdown, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
