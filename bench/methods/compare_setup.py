"""The method comparison's grid: its rows (methods, variants, baselines), scales, sites, and the
names of its runs and test splits; bench/methods/compare_methods.py runs it, bench/methods/compare_report.py
writes its tables.
"""
from __future__ import annotations

import pathlib

# Table 4's rows in its order (configs/ehr_<name>.yaml), then the methods of the other papers.
# ktied_normal: paper 003, fully_bayesian with stddevs of rank 2 (k1 / k3: ranks 1 and 3).
METHODS = ("deterministic", "batchensemble", "bayesian_embeddings", "fully_bayesian", "rank1_normal",
           "rank1_cauchy", "ktied_normal", "ktied_normal_k1", "ktied_normal_k3", "rank1_normal_wide",
           "rank1_normal_laplace")
# Rows that are another row's config with a model setting changed: {row: (config name, model overrides)}.
# rank1_normal_wide: with a linear part on the admission window's aggregates (ModelConfig.wide),
# trained with the LSTM; rank1_normal_laplace: that part fitted first as the logistic regression
# with its Laplace posterior (model.ehr.wide), the LSTM learning the residual.
VARIANTS = {"ktied_normal_k1": ("ktied_normal", {"ktied_rank": 1}),
            "ktied_normal_k3": ("ktied_normal", {"ktied_rank": 3}),
            "rank1_normal_wide": ("rank1_normal", {"wide": True}),
            "rank1_normal_laplace": ("rank1_normal", {"wide": True, "wide_posterior": "laplace"})}
DEFAULT_METHODS = ("deterministic", "batchensemble", "rank1_normal")
# --- Bella (configs/ehr_bella_<update>.yaml): adapts the deterministic run of the same seed, which
# run_grid trains first whenever "deterministic" is among --methods.
BELLA_METHODS = ("bella_ensemble", "bella_svgd")


def bella_base_dir(work: pathlib.Path, method: str, seed: int) -> pathlib.Path | None:
    """The run folder a Bella method adapts (the deterministic row of `seed`); None for other methods."""
    return work / "runs" / run_name("deterministic", seed, ENSEMBLE_SIZE * seed) if method in BELLA_METHODS else None
# --- end Bella
DEEP_ENSEMBLE = "deep_ensemble"
ENSEMBLE_SIZE = 4  # members of a deep ensemble: the rank-1 models' K
BASELINES = ("logistic", "gbm")
# The truth's own logistic design (its nine terms, recomputed from the tables) with coefficients
# fitted on the training split: the well-specified model, so its error is the estimation error
# any model pays at this training-set size.
WELL_SPECIFIED = "well_specified_logistic"

# Model sizes and optimisation per scale, applied over each method's config. medium: the
# sizes of configs/ehr_demo.yaml; the step size, schedule and pooling were chosen on site A's
# validation split (docs/results.md says how). releases: site -> (patients, one release seed per
# seed of a method at site A, or per release of a shifted site).
SCALES = {
    "tiny": {"releases": {"A": (700, (1, 2, 3)), "B": (700, (4,)), "C": (700, (5,))}, "steps": 600,
             "model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32},
             "train": {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 100,
                       "early_stopping_patience": 4, "checkpoint_every_steps": 200, "log_every_steps": 50,
                       "shuffle_buffer": 1024, "kl_annealing_steps": 300}},
    "medium": {"releases": {"A": (7000, (11, 21, 31)), "B": (7000, (12, 22, 32)), "C": (7000, (13, 23, 33))},
               "steps": 4000,
               "model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32, "pooling": "attention",
                         "attention_heads": 4},
               "train": {"batch_size": 32, "learning_rate": 3e-3, "lr_schedule": "cosine", "eval_every_steps": 250,
                         "early_stopping_patience": 4, "checkpoint_every_steps": 500, "log_every_steps": 50,
                         "shuffle_buffer": 4096, "kl_annealing_steps": 1000, "kl_scale": 0.3}},
    "paper": {"releases": {"A": (40000, (11, 21, 31)), "B": (7000, (12, 22, 32)), "C": (7000, (13, 23, 33))},
              "steps": None, "model": {}, "train": {}},
}
SHIFTED = ("B", "C")
# Sites whose units differ from site A's: also bagged as they come (their own units), the data a
# site would feed a model without harmonising; "Craw" in the tables.
RAW_SITES = ("C",)
RAW = "raw"


# The releases' truth families (ehr-pipeline synth --truth). Each writes its own section of
# docs/results.md and keeps its own work folder, so one never overwrites the other's tables or runs.
TRUTHS = ("linear", "temporal")


def section_name(truth: str) -> str:
    """The docs/results.md section a truth family's tables go to (the linear one keeps its old name)."""
    return "compare_methods" if truth == "linear" else f"compare_methods_{truth}"


def default_work(truth: str) -> str:
    """The default work folder of a truth family's grid (relative to the current directory)."""
    return f"out/{section_name(truth)}"


def run_name(method: str, seed: int, model_seed: int | None = None) -> str:
    """runs/ folder of a method's seed-th row (trained on release `seed`); deep-ensemble members differ by model seed."""
    return f"{method}_r{seed}_s{seed if model_seed is None else model_seed}"


def split_names(site: str, releases: int) -> list[str]:
    """The test splits a run is scored on at a site: 'A' (its own release), else 'B0', 'B1', ... / 'Craw0', ..."""
    return ["A"] if site == "A" else [f"{site}{j}" for j in range(releases)]
