"""Every method x several seeds on synthetic releases with known truth: docs/results.md's comparison.

  python bench/methods/compare_methods.py --scale medium              # ~8,300 admissions per release, 3 x sites A, B, C
  python bench/methods/compare_methods.py --scale tiny --seeds 3      # a few minutes, a smoke test of the grid
  python bench/methods/compare_methods.py --truth temporal --no-shift  # site A only, P_DEATH from trajectories too

Seed s of every method is trained on its OWN site-A release (``ehr-pipeline synth --patients 7000
--seed 11 / 21 / 31``: ~8,300 cohort admissions each), so a row's spread over seeds covers the
release it was trained on as well as its initialisation. Each model then predicts its release's
site-A test split and the test splits of three releases of each shifted site: site B (``--site
B``: another case mix, biased assays, unseen codes, other charting) and site C (``--site C``: site
A's hospital reporting labs in SI units). Every shifted release is bagged with the model's units
(``ehr-pipeline run --units-from``, the harmonised data a site prepares for a model); site C also
as it comes (its own units, "before harmonisation"). The truth formula is the same everywhere.
Training keeps the checkpoint with the best validation NLL; predictions use S samples per member.
Deep ensembles combine ENSEMBLE_SIZE deterministic runs of one release; the scikit-learn
baselines read the same TFRecords. Every number comes from model.evaluation.statistics.metrics on the saved per-case
predictions (WORK/preds/*.npz), so the tables can be recomputed without training
(``--report-only``).

Reported, mean +- SEM over seeds (at a shifted site, each seed's mean over the site's releases):
NLL, AUC-PR, AUC-ROC, ECE, Brier, |p - P_DEATH| and the coverage of P_DEATH by the central 50 / 80
/ 95% intervals of the S x K sampled probabilities; paired differences on the same cases
(bootstrap over cases within each test split); under the site shift, how well mutual information
(and the deterministic model's entropy) tells site-B test cases from site-A ones (AUROC), and how
much |p - P_DEATH| referring the 20% most uncertain site-B cases removes compared with referring
the 20% highest p; at site C, each method's |p - P_DEATH| against its site-A value.

The grid's rows, scales and sites are compare_setup.py, its steps (releases, data folders, runs,
predictions) compare_runs.py and its tables compare_report.py: modules beside this script, not scripts.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.methods.compare_report import report  # noqa: E402
from bench.methods.compare_runs import (Split, load_split, make_data, make_release, predict, train_run,  # noqa: E402
                                        truth_design)
from bench.methods.compare_setup import (BASELINES, BELLA_METHODS, DEEP_ENSEMBLE, DEFAULT_METHODS,  # noqa: E402
                                         ENSEMBLE_SIZE, METHODS, RAW, RAW_SITES, SCALES, SHIFTED, TRUTHS,
                                         WELL_SPECIFIED, default_work, run_name, section_name)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scale", choices=tuple(SCALES), default="medium",
                   help="tiny: ~1k admissions, minutes; medium: ~8.3k admissions per site (the issue's size); "
                        "paper: the configs as written (a GPU)")
    p.add_argument("--truth", choices=TRUTHS, default="linear",
                   help="the releases' truth family (ehr-pipeline synth --truth); temporal: P_DEATH also depends "
                        "on a creatinine trend and the days since the previous discharge (docs/synthetic.md); its "
                        "tables go to their own section of --out")
    p.add_argument("--work", default=None,
                   help="folder for releases, data, runs, predictions (default: out/compare_methods, "
                        "out/compare_methods_temporal for --truth temporal)")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=METHODS + BELLA_METHODS,
                   help="methods to train (a deep ensemble of deterministic runs is always added)")
    p.add_argument("--seeds", type=int, default=3,
                   help="seeds per method, each trained on its own site-A release (>= 3 for a SEM; at most the "
                        "scale's site-A releases)")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member (1 for deterministic)")
    p.add_argument("--steps", type=int, default=None, help="max_steps per run (default: the scale's)")
    p.add_argument("--no-shift", action="store_true", help="skip sites B and C (in-distribution tables only)")
    p.add_argument("--no-deep-ensemble", action="store_true",
                   help=f"train one deterministic run per seed, not the {ENSEMBLE_SIZE} members of a deep ensemble "
                        "(the deterministic row without the deep_ensemble row; saves the other members' time)")
    p.add_argument("--no-baselines", action="store_true",
                   help="train the methods only (e.g. a second process on other methods sharing WORK)")
    p.add_argument("--report-only", action="store_true", help="recompute the tables from WORK/preds only")
    p.add_argument("--n-bootstrap", type=int, default=2000, help="resamples of the paired bootstrap")
    p.add_argument("--out", default="docs/results.md", help="markdown file that receives the tables")
    return p


# --------------------------------------------------------------------------- the grid (compare_runs.py: its steps)


def _well_specified(work: pathlib.Path, seed: int, splits: dict[str, Split]) -> dict[str, np.ndarray]:
    """Test-split probabilities [N, 1] per split of the truth's design fitted on release `seed`'s training split."""
    from sklearn.linear_model import LogisticRegression

    rows_a = truth_design(work / f"release_A{seed}")
    train = load_split(work / f"data_A{seed}", work / f"release_A{seed}", "train")
    fit = LogisticRegression(C=1e6, max_iter=5000).fit(np.stack([rows_a[h] for h in train.hadm_ids]), train.labels)
    out = {"params": np.array(fit.coef_.size + 1)}
    designs = {}
    for name, split in splits.items():
        release = _release_of(name, work) if name != "A" else work / f"release_A{seed}"
        key = (release, RAW not in name)  # a raw split reads its labs as written, like the models' raw data
        rows = designs.setdefault(key, rows_a if name == "A" else truth_design(release, harmonised=key[1]))
        out[f"probs_{name}"] = fit.predict_proba(np.stack([rows[h] for h in split.hadm_ids]))[:, 1:]
    return out


def _save(path: pathlib.Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def make_releases(args: argparse.Namespace, work: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every release and data folder of the grid; returns {split family: data folder} for the test splits.

    Keys: 'A0', 'A1', ... (one training release per seed), 'B0', ..., 'C0', ... (harmonised to A0's
    units) and 'Craw0', ... (site C's own units).
    """
    scale = SCALES[args.scale]
    patients, seeds = scale["releases"]["A"]
    if args.seeds > len(seeds):
        raise SystemExit(f"--seeds {args.seeds}: the {args.scale} scale has {len(seeds)} site-A releases")
    data = {}
    for i in range(args.seeds):
        make_release("A", patients, seeds[i], work / f"release_A{i}", args.truth)
        make_data(work / f"release_A{i}", work / f"data_A{i}")
        data[f"A{i}"] = work / f"data_A{i}"
    units_a = [json.loads((data[f"A{i}"] / "units.json").read_text())["canonical"] for i in range(args.seeds)]
    if any(u != units_a[0] for u in units_a):
        raise RuntimeError("the site-A releases disagree on canonical units: shifted data cannot share A0's")
    for site in () if args.no_shift else SHIFTED:
        if site not in scale["releases"]:
            continue
        patients, seeds = scale["releases"][site]
        for j, seed in enumerate(seeds):
            release = work / f"release_{site}{j}"
            make_release(site, patients, seed, release, args.truth)
            make_data(release, work / f"data_{site}{j}", units_from=data["A0"])
            data[f"{site}{j}"] = work / f"data_{site}{j}"
            if site in RAW_SITES:
                make_data(release, work / f"data_{site}{RAW}{j}")
                data[f"{site}{RAW}{j}"] = work / f"data_{site}{RAW}{j}"
    return data


def trajectory_designs(work: pathlib.Path, args: argparse.Namespace) -> tuple[dict[str, np.ndarray], tuple]:
    """({'A0': the truth's design of release 0's test cases [N, terms], ...}, the two trajectory coefficients)."""
    from ehr_pipeline.synth.temporal import temporal_model

    designs = {}
    for i in range(args.seeds):
        release = work / f"release_A{i}"
        if not (work / f"data_A{i}" / "manifest.json").exists():
            continue
        rows = truth_design(release)
        designs[f"A{i}"] = np.stack([rows[h] for h in load_split(work / f"data_A{i}", release, "test").hadm_ids])
    return designs, tuple(float(c) for c in temporal_model(1.0).coefficients())


def _release_of(name: str, work: pathlib.Path) -> pathlib.Path:
    """The release folder behind a split family name ('Craw1' -> release_C1)."""
    return work / f"release_{name.replace(RAW, '')}"


def run_grid(args: argparse.Namespace, work: pathlib.Path) -> None:
    """Trains every run that is missing and saves its test predictions (WORK/preds/NAME_sSEED.npz)."""
    data = make_releases(args, work)
    tests = {name: load_split(folder, _release_of(name, work), "test") for name, folder in data.items()}
    shifted = {name: split for name, split in tests.items() if not name.startswith("A")}
    preds = work / "preds"

    def splits_of(seed: int) -> dict[str, Split]:
        return {"A": tests[f"A{seed}"], **shifted}

    def save_predictions(name: str, exports, samples: int, seed: int, params: int, seconds: float) -> None:
        target = preds / f"{name}_s{seed}.npz"
        if target.exists():
            return
        from model.export.load import load_export

        loaded = [load_export(str(e)) for e in exports]  # ~10 s each: once for the ten-odd test splits
        arrays = {f"probs_{n}": predict(loaded, split, samples, seed) for n, split in splits_of(seed).items()}
        _save(target, params=params, seconds=seconds, **arrays)

    def train_on(method: str, seed: int, model_seed: int | None = None):
        return train_run(method, seed if model_seed is None else model_seed, args, data[f"A{seed}"],
                      _release_of(f"A{seed}", work) / "SYNTH_TRUTH.csv", work, run_name(method, seed, model_seed))

    if "deterministic" in args.methods:
        for seed in range(args.seeds):
            # Release `seed`'s deep ensemble; its first member is also the deterministic row.
            members = [train_on("deterministic", seed, ENSEMBLE_SIZE * seed + k)
                       for k in range(1 if args.no_deep_ensemble else ENSEMBLE_SIZE)]
            save_predictions("deterministic", [members[0][0]], 1, seed, members[0][1], members[0][2])
            if args.no_deep_ensemble:
                continue
            save_predictions(DEEP_ENSEMBLE, [m[0] for m in members], 1, seed, sum(m[1] for m in members),
                             sum(m[2] for m in members))
    for method in args.methods:
        if method == "deterministic":
            continue
        for seed in range(args.seeds):
            export_dir, params, seconds = train_on(method, seed)
            samples = 1 if method in ("batchensemble", *BELLA_METHODS) else args.samples
            save_predictions(method, [export_dir], samples, seed, params, seconds)
    for seed in range(0 if args.no_baselines else args.seeds):
        for kind in BASELINES:
            # Both fits are deterministic for a release (lbfgs or liblinear with a fixed random_state;
            # histogram boosting without subsampling): one fit per training release.
            target = preds / f"{kind}_s{seed}.npz"
            if target.exists():
                continue
            from model.ehr.baselines import fit_baseline

            started = time.time()
            fitted = fit_baseline(data[f"A{seed}"], kind, seed=0)
            arrays = {f"probs_{n}": fitted.predict_data(data[f"A{seed}"] if n == "A" else data[n], "test")[:, None]
                      for n in splits_of(seed)}
            _save(target, params=fitted.num_parameters, seconds=time.time() - started, **arrays)
        if not (preds / f"{WELL_SPECIFIED}_s{seed}.npz").exists():
            started = time.time()
            arrays = _well_specified(work, seed, splits_of(seed))
            _save(preds / f"{WELL_SPECIFIED}_s{seed}.npz", seconds=time.time() - started, **arrays)
    _save(preds / "truth.npz", **{f"truth_{n}": sp.truth for n, sp in tests.items()},
          **{f"labels_{n}": sp.labels for n, sp in tests.items()})


def main(argv: list[str] | None = None) -> int:
    """Trains the grid (unless --report-only) and writes the tables; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.harness import command_line, publish
    from ehr_base.cli_args import setup_logging

    setup_logging()
    work = pathlib.Path(args.work or default_work(args.truth))
    started = time.time()
    timing = work / "grid_seconds.json"
    if not args.report_only:
        run_grid(args, work)
        timing.write_text(json.dumps({"seconds": time.time() - started}))
    seconds = json.loads(timing.read_text())["seconds"] if timing.exists() else time.time() - started
    command = command_line(__file__, argv, drop=("--report-only",))
    markdown = report(args, work, command, seconds, trajectory_designs(work, args) if args.truth == "temporal" else None)
    publish(section_name(args.truth), markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
