"""Mixed-precision training: which Keras policy a run uses, and the loss scale float16 needs.

``train.mixed_precision`` is false (float32), true (bfloat16 where the hardware has it: CPUs
and GPUs of compute capability >= 8.0, else float16), or a policy name. Either way only the
layers compute in 16 bits: variables, logits, the log-likelihood, the KL and the loss stay
float32 (``model.fit.losses`` casts), so the small probabilities NLL is made of are not rounded.
bfloat16 keeps float32's exponent range and needs no loss scaling; float16 does (dynamic
loss scaling through ``tf.keras.mixed_precision.LossScaleOptimizer``). A loss-scale
optimizer skips a step whose gradients overflow; two of them (the fast-weight learning-rate
multiplier's second optimizer) would keep two scales and could skip a step for one half of
the weights only, so float16 trains every weight with one optimizer and rejects a
fast_weight_lr_multiplier other than 1.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import tensorflow as tf

FLOAT32, BFLOAT16, FLOAT16 = "float32", "mixed_bfloat16", "mixed_float16"


def _gpus_have_bfloat16() -> bool:
    """Whether every visible GPU computes bfloat16 natively (compute capability >= 8.0, Ampere on)."""
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0))
        if tuple(capability) < (8, 0):
            return False
    return True


def resolve(setting: bool | str) -> str:
    """The Keras policy name of a train.mixed_precision setting (False, True or a policy name)."""
    if setting is False:
        return FLOAT32
    if setting is True:
        return BFLOAT16 if _gpus_have_bfloat16() else FLOAT16
    return str(setting)


def check(policy: str, fast_weight_lr_multiplier: float) -> None:
    """Raises ValueError for combinations this trainer cannot run (float16 with two optimizers)."""
    if policy == FLOAT16 and fast_weight_lr_multiplier != 1.0:
        raise ValueError("mixed_float16 needs loss scaling, which one optimizer carries: set "
                         "train.fast_weight_lr_multiplier to 1 or use mixed_bfloat16 (no loss scaling)")


@contextlib.contextmanager
def policy_scope(policy: str) -> Iterator[None]:
    """Sets the global Keras policy while layers are created, then restores the previous one."""
    previous = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
