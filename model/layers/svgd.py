"""Stein Variational Gradient Descent (Liu & Wang, 2016) over a set of flat particles.

For P particles x_1..x_P (rows of a [P, D] matrix) and the gradients g_j = grad log p(x_j)
of the target's log density, the SVGD direction of particle i is

    phi(x_i) = (1/P) sum_j [ k(x_j, x_i) g_j + grad_{x_j} k(x_j, x_i) ],

with the RBF kernel k(x, y) = exp(-||x - y||^2 / h). The first term pulls the particles
towards high density (kernel-smoothed gradients), the second pushes them apart (for the RBF
kernel, grad_{x_j} k(x_j, x_i) = (2/h) (x_i - x_j) k(x_j, x_i)). The bandwidth is the median
heuristic of the reference implementation: h = med(||x_i - x_j||^2) / log(P + 1), treated as a
constant (no gradient through it). With P = 1 the kernel is 1 and its gradient 0, so SVGD
reduces to gradient ascent on log p.

Pure functions of tensors: ``model.layers.bella`` calls them on the flattened adapter weights of its
particles; tests call them on a known Gaussian.
"""
from __future__ import annotations

import math

import tensorflow as tf


def squared_distances(x: tf.Tensor) -> tf.Tensor:
    """Pairwise squared Euclidean distances [P, P] of the rows of x [P, D] (exactly 0 on the diagonal)."""
    x = tf.convert_to_tensor(x)
    sq = tf.reduce_sum(tf.square(x), axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * tf.matmul(x, x, transpose_b=True)
    # Round-off can make the expansion slightly negative; the diagonal is 0 by definition.
    return tf.linalg.set_diag(tf.maximum(d2, 0.0), tf.zeros_like(sq))


def median_bandwidth(d2: tf.Tensor) -> tf.Tensor:
    """h = median of the squared distances / log(P + 1); 1 when all particles coincide."""
    p = tf.shape(d2)[0]
    flat = tf.sort(tf.reshape(d2, [-1]))
    n = tf.size(flat)
    # The median of the P*P entries (diagonal zeros included, as in the reference code).
    med = 0.5 * (flat[(n - 1) // 2] + flat[n // 2])
    h = med / tf.math.log(tf.cast(p, d2.dtype) + 1.0)
    return tf.stop_gradient(tf.where(h > 0, h, tf.ones_like(h)))


def svgd_direction(particles: tf.Tensor, grad_log_p: tf.Tensor, bandwidth: tf.Tensor | float | None = None
                   ) -> tf.Tensor:
    """phi [P, D]: the SVGD ascent direction of every particle (rows of particles and grad_log_p, [P, D])."""
    x = tf.convert_to_tensor(particles)
    g = tf.convert_to_tensor(grad_log_p, x.dtype)
    d2 = squared_distances(x)
    h = median_bandwidth(d2) if bandwidth is None else tf.cast(bandwidth, x.dtype)
    k = tf.exp(-d2 / h)  # symmetric: k[i, j] = k(x_j, x_i)
    drive = tf.matmul(k, g)
    # sum_j grad_{x_j} k(x_j, x_i) = (2/h) (x_i sum_j k_ij - sum_j k_ij x_j)
    repulse = (2.0 / h) * (x * tf.reduce_sum(k, axis=1, keepdims=True) - tf.matmul(k, x))
    return (drive + repulse) / tf.cast(tf.shape(x)[0], x.dtype)


def log_normal_density(x: tf.Tensor, stddev: float) -> tf.Tensor:
    """log N(x; 0, stddev^2) summed over all but the first axis: [P] for x [P, ...] (nats)."""
    x = tf.convert_to_tensor(x)
    axes = list(range(1, x.shape.rank))
    n = tf.cast(tf.reduce_prod(tf.shape(x)[1:]), x.dtype)
    return -0.5 * tf.reduce_sum(tf.square(x / stddev), axis=axes) - n * (math.log(stddev) + 0.5 * math.log(2 * math.pi))
