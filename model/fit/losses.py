"""The training objective: likelihood term + annealed KL / N_train + L2 (paper Eq. 2, App. D).

Kept apart from the trainer so tests can check each term's scaling directly.
"""
from __future__ import annotations

import tensorflow as tf

from model.layers import factory
from model.layers.weight_posteriors import is_weight_posterior_layer


def nll_loss(logits: tf.Tensor, labels: tf.Tensor, kind: str = "average") -> tf.Tensor:
    """Bernoulli NLL (nats per example) of logits [B, M] for labels [B]: "average" or "mixture" over M."""
    # A cast, not a conversion: logits of a mixed-precision model may arrive in bfloat16/float16,
    # and the likelihood of small probabilities must be computed in float32.
    logits = tf.cast(logits, tf.float32)
    y = tf.broadcast_to(tf.cast(labels, tf.float32)[:, None], tf.shape(logits))
    per_member = tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)  # -log p(y | member)
    if kind == "average":  # App. D.4: mean per-component NLL (what the paper trains with)
        return tf.reduce_mean(per_member)
    if kind == "mixture":  # App. D.5: -log (1/M) sum_m p(y | m), via logsumexp for stability
        m = tf.cast(tf.shape(logits)[1], tf.float32)
        return tf.reduce_mean(-tf.reduce_logsumexp(-per_member, axis=1) + tf.math.log(m))
    raise ValueError(f"loss kind must be 'average' or 'mixture', got {kind!r}")


def member_nll(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean Bernoulli NLL of each member (column) of logits [B, M] for labels [B]: [M], nats per example."""
    logits = tf.convert_to_tensor(logits, tf.float32)
    y = tf.broadcast_to(tf.cast(labels, tf.float32)[:, None], tf.shape(logits))
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits), axis=0)


def kl_divergence(model: tf.Module) -> tf.Tensor:
    """Unscaled KL(q || prior) of every stochastic part (rank-1 factors, embeddings, mean-field / k-tied weights), nats."""
    total = factory.kl_loss(model)
    for layer in [m for m in model.submodules if is_weight_posterior_layer(m)]:
        # edward2 registers its weight KL as the layer's regularisation loss.
        for term in layer.losses:
            total = total + tf.reduce_sum(term)
    return tf.cast(total, tf.float32)


def kl_weight(step, *, kl_scale: float, annealing_steps: int, num_train_examples: int) -> tf.Tensor:
    """Weight of the KL term at a (0-based) step: kl_scale * min(1, (step+1)/annealing_steps) / N_train."""
    if num_train_examples < 1:
        raise ValueError(f"num_train_examples must be >= 1, got {num_train_examples}")
    step = tf.cast(step, tf.float32)
    anneal = 1.0 if annealing_steps <= 0 else tf.minimum(1.0, (step + 1.0) / float(annealing_steps))
    # Dividing by N_train turns the sum over the data set (Eq. 2) into the per-example
    # loss the NLL above is: the KL is paid once per data set, not once per minibatch.
    return tf.cast(kl_scale * anneal / float(num_train_examples), tf.float32)


def l2_penalty(model: tf.Module) -> tf.Tensor:
    """The L2 penalty on the point-estimated shared weights (the Normal prior on W)."""
    return tf.cast(factory.l2_loss(model), tf.float32)

