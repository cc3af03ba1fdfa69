"""Low-rank structure of trained Gaussian posterior stddevs (paper 003, Section 2, App. D.3).

For every whole-matrix Gaussian posterior of a model (mean-field or k-tied kernels, the LSTM's
kernel and recurrent kernel, conv kernels as [h*w*c_in, c_out], the stochastic code
embeddings as [vocab, dim]) this module takes the matrix A of posterior stddevs and
  * its singular values gamma and the fraction of variance sum_{i<=k} gamma_i^2 / sum gamma^2
    that the best rank-k approximation keeps;
  * replaces A by that rank-k approximation, clipped at zero from below as the paper does
    (a truncated SVD of a positive matrix can dip below zero), so the model can be evaluated
    with the compressed posterior.

Only softplus-parameterised stddevs (mean field, embeddings) can be replaced; a k-tied
posterior already has rank <= k and is reported, not replaced.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from model.layers import weight_posteriors
from model.layers.embeddings import StochasticEmbedding
from model.layers.posterior import softplus_inverse

# A replaced stddev below this (the clipped zeros) is stored as this: softplus^-1(0) is -inf.
MIN_STDDEV = 1e-8


def singular_values(matrix: np.ndarray) -> np.ndarray:
    """Singular values of a 2-D matrix, descending."""
    return np.linalg.svd(np.asarray(matrix, np.float64), compute_uv=False)


def variance_explained(values: np.ndarray, rank: int) -> float:
    """Fraction sum_{i<=rank} gamma_i^2 / sum gamma^2 kept by the best rank-`rank` approximation."""
    energy = np.square(np.asarray(values, np.float64))
    total = float(energy.sum())
    return 1.0 if total == 0.0 else float(energy[:rank].sum() / total)


def numerical_rank(values: np.ndarray, tolerance: float = 1e-6) -> int:
    """Number of singular values above tolerance x the largest."""
    values = np.asarray(values, np.float64)
    return 0 if values.size == 0 or values[0] == 0 else int(np.sum(values > tolerance * values[0]))


def low_rank_stddevs(matrix: np.ndarray, rank: int) -> np.ndarray:
    """Best rank-`rank` approximation (truncated SVD) of a stddev matrix, clipped at 0 from below."""
    u, s, vt = np.linalg.svd(np.asarray(matrix, np.float64), full_matrices=False)
    return np.maximum((u[:, :rank] * s[:rank]) @ vt[:rank], 0.0)


@dataclasses.dataclass
class StddevSite:
    """One posterior stddev matrix of a model: its name, the matrix, and its softplus parameter (None: k-tied)."""

    name: str
    family: str  # "mean_field", "ktied_normal" or "embedding"
    matrix: Callable[[], np.ndarray]  # [m, n] stddevs
    raw: tf.Variable | None  # stddev = softplus(raw), any shape with m * n entries

    def assign(self, stddevs: np.ndarray) -> None:
        """Sets the stddevs (values below MIN_STDDEV are stored as MIN_STDDEV)."""
        raw = np.vectorize(softplus_inverse)(np.maximum(np.asarray(stddevs, np.float64), MIN_STDDEV))
        self.raw.assign(np.reshape(raw, self.raw.shape).astype(self.raw.dtype.as_numpy_dtype))


def stddev_sites(model: tf.Module) -> list[StddevSite]:
    """Every Gaussian posterior stddev matrix under `model`, in layer order."""
    sites = []
    for module in model.submodules:
        if weight_posteriors.is_weight_posterior_layer(module):
            for site, init in weight_posteriors.posterior_sites(module).items():
                ktied = isinstance(init, weight_posteriors.TrainableKTiedNormal)
                sites.append(StddevSite(
                    name=f"{module.name}/{site}", family="ktied_normal" if ktied else "mean_field",
                    matrix=lambda init=init: weight_posteriors.stddev_matrix(init).numpy(),
                    raw=None if ktied else init.stddev))
        elif isinstance(module, StochasticEmbedding) and getattr(module, "raw_stddev", None) is not None:
            sites.append(StddevSite(name=f"{module.name}/embeddings", family="embedding",
                                    matrix=lambda m=module: m.stddev().numpy(), raw=module.raw_stddev))
    return sites


def spectrum_table(sites: Sequence[StddevSite], ranks: Sequence[int] = (1, 2, 3)) -> list[dict]:
    """One row per site: shape, family, mean stddev, top singular values, variance kept by each rank."""
    rows = []
    for site in sites:
        a = site.matrix()
        values = singular_values(a)
        rows.append({"site": site.name, "family": site.family, "shape": list(a.shape),
                     "mean_stddev": float(a.mean()), "singular_values": values.tolist(),
                     **{f"variance_rank{k}": variance_explained(values, k) for k in ranks}})
    return rows


class replaced_by_rank:
    """Context: every replaceable stddev matrix is its rank-k approximation; restored on exit."""

    def __init__(self, sites: Sequence[StddevSite], rank: int):
        self.sites = [s for s in sites if s.raw is not None]
        self.rank = rank
        self.saved: list[np.ndarray] = []

    def __enter__(self) -> replaced_by_rank:
        for site in self.sites:
            self.saved.append(site.raw.numpy())
            site.assign(low_rank_stddevs(site.matrix(), self.rank))
        return self

    def __exit__(self, *exc) -> None:
        for site, raw in zip(self.sites, self.saved):
            site.raw.assign(raw)
