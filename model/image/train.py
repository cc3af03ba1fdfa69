"""Training of the image models: tiled batch, per-component NLL + annealed KL / N_train + L2, resume.

Run folder OUT/ (the same layout as the EHR trainer's, ``model.train``):
  config.json   the resolved config (a restart must use the same one)
  checkpoints/  model, both optimizers, step
  tensorboard/  loss terms, learning rate, validation metrics
  eval/         metrics.json + summary.md: clean and corrupted test metrics

The loss terms come from ``model.losses`` (KL weight and L2 are the EHR trainer's), the
config check and TensorBoard writer from ``model.train``. Two pieces are written here
generically, because the EHR versions are tied to the LSTM: which variables are "fast
weights" (found structurally, not by name: a batch norm's ``gamma`` is no rank-1 factor) and
the clipped update split over two optimizers.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import time
from typing import Any

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from model import bella, losses
from model import devices as device_layout
from model.image import evaluate as evaluation
from model.image.config import ImageExperimentConfig, TrainConfig, parse_config
from model.image.data import ImageData, load_data, train_dataset
from model.image.models import ImageModel, build_model
from model.train import (CHECKPOINT_DIR, CONFIG_FILE, TENSORBOARD_DIR, ConfigMismatchError, check_run_folder,
                         write_scalars)

log = logging.getLogger(__name__)

EVAL_DIR = "eval"
# Attribute names of edward2's rank-1 factor sites (see model.rank1._FACTOR_SITES).
_FACTOR_SITES = ("alpha", "gamma", "recurrent_alpha", "recurrent_gamma")


@dataclasses.dataclass
class TrainResult:
    """What a finished run produced."""

    out_dir: pathlib.Path
    step: int
    history: list[dict[str, float]]  # one row per logged step
    validation: list[dict[str, float]]  # one row per periodic validation
    report: dict[str, Any] | None  # the final evaluation (None with evaluate=False)
    wall_s: float


# --------------------------------------------------------------------------- generic pieces


def fast_weight_refs(model: tf.Module) -> set:
    """Refs of the rank-1 factors (alpha/gamma) and their posterior parameters under `model`."""
    refs = set()
    for module in (model, *model.submodules):
        for site in _FACTOR_SITES:
            # Only edward2 rank-1 layers record `<site>_shape`; a batch norm also has a `gamma`.
            if getattr(module, f"{site}_shape", None) is None:
                continue
            init = getattr(module, f"{site}_initializer", None)
            if isinstance(init, tf.keras.layers.Layer):  # a trainable posterior: its mean / stddev variables
                refs.update(v.ref() for v in init.trainable_variables)
            variable = getattr(module, site, None)
            if isinstance(variable, tf.Variable) and variable.trainable:  # a point-mass factor (BatchEnsemble)
                refs.add(variable.ref())
    return refs


def apply_gradients(grads, variables, fast_mask, slow_opt, fast_opt, clip_norm: float | None) -> tf.Tensor:
    """Sums over replicas, clips by global norm (if set), updates slow and fast weights; returns the norm.

    Called in a replica context; with one replica the sum is the identity.
    """
    pairs = [(g, v, fast) for g, v, fast in zip(grads, variables, fast_mask) if g is not None]
    grads = [tf.convert_to_tensor(g) for g, _, _ in pairs]
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync > 1:
        # The clip is on the norm of the summed (global-batch) gradient, not on each replica's part.
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    if clip_norm is not None:
        grads, norm = tf.clip_by_global_norm(grads, clip_norm)
    else:
        norm = tf.linalg.global_norm(grads)
    slow = [(g, v) for g, (_, v, fast) in zip(grads, pairs) if not fast]
    fast = [(g, v) for g, (_, v, fast) in zip(grads, pairs) if fast]
    slow_opt.apply_gradients(slow, skip_gradients_aggregation=True)
    if fast:
        fast_opt.apply_gradients(fast, skip_gradients_aggregation=True)
    return norm


class WarmupPiecewiseConstant(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak`, then multiplied by `ratio` at each boundary step (the CIFAR schedule)."""

    def __init__(self, peak: float, warmup_steps: int, boundaries: list[int], ratio: float):
        self.peak, self.warmup_steps, self.boundaries, self.ratio = peak, warmup_steps, list(boundaries), ratio

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        decays = tf.add_n([tf.cast(step >= b, tf.float32) for b in self.boundaries]) if self.boundaries else 0.0
        rate = self.peak * tf.pow(self.ratio, decays)
        if self.warmup_steps > 0:
            rate = rate * tf.minimum(1.0, (step + 1.0) / float(self.warmup_steps))
        return rate

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "boundaries": self.boundaries,
                "ratio": self.ratio}


def _optimizer(tc: TrainConfig, schedule) -> tf.keras.optimizers.Optimizer:
    if tc.optimizer == "sgd":
        return tf.keras.optimizers.SGD(schedule, momentum=tc.momentum, nesterov=tc.momentum > 0)
    return tf.keras.optimizers.Adam(schedule)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Epoch-denominated settings converted to steps."""

    steps_per_epoch: int
    max_steps: int
    kl_annealing_steps: int
    warmup_steps: int
    decay_steps: list[int]


def plan_steps(tc: TrainConfig, num_train: int) -> StepPlan:
    """Steps per epoch (full batches only) and every epoch setting of `tc` in steps."""
    per_epoch = num_train // tc.batch_size
    if per_epoch < 1:
        raise ValueError(f"{num_train} training images cannot fill a batch of {tc.batch_size}")
    to_steps = lambda epochs: int(round(epochs * per_epoch))  # noqa: E731
    return StepPlan(per_epoch, tc.max_steps or max(1, math.ceil(tc.epochs * per_epoch)),
                    to_steps(tc.kl_annealing_epochs), to_steps(tc.lr_warmup_epochs),
                    [to_steps(e) for e in tc.lr_decay_epochs])


# --------------------------------------------------------------------------- the run


def train(config: ImageExperimentConfig, out_dir: str | os.PathLike[str], *, data: ImageData | None = None,
          data_dir: str | os.PathLike[str] | None = None, progress: bool = True, evaluate: bool = True,
          corrupted: bool = True, base_dir: str | os.PathLike[str] | None = None,
          devices: str | None = None) -> TrainResult:
    """Trains (or resumes) a run on `devices` (model.devices), then evaluates it on clean and corrupted test sets.

    base_dir: the trained deterministic run a "bella" run adapts (required for it, refused otherwise).
    """
    started = time.time()
    if (config.model.posterior.method == "bella") != (base_dir is not None):
        raise ValueError("posterior.method 'bella' adapts a trained deterministic run: give it (and only it) "
                         "--base RUN_DIR")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_run_folder(out, config)
    tc = config.train
    tf.random.set_seed(tc.seed)  # entry point of a run: initialisation and factor draws are reproducible
    if data is None:
        data = load_data(config.data, data_dir)
    n_train = int(data.y_train.shape[0])
    plan = plan_steps(tc, n_train)
    strategy = device_layout.strategy(devices)
    replicas = strategy.num_replicas_in_sync
    if tc.batch_size % replicas:
        raise ValueError(f"train.batch_size {tc.batch_size} is not divisible by the {replicas} devices")
    if base_dir is not None and replicas > 1:
        # The particle update (kernel over particles) is computed per replica: not validated across devices.
        raise ValueError("posterior.method 'bella' trains on one device: use --devices auto, cpu or gpu:1")
    # Model, optimizers and step are mirrored variables when there are several devices.
    with strategy.scope():
        model = build_model(config.model, data.image_shape, data.num_classes)
        particles = _adapt_base(model, base_dir, data, out, config.model.posterior.particle_update, n_train) \
            if base_dir is not None else None
        schedule = WarmupPiecewiseConstant(tc.learning_rate, plan.warmup_steps, plan.decay_steps, tc.lr_decay_ratio)
        fast_schedule = WarmupPiecewiseConstant(tc.learning_rate * tc.fast_weight_lr_multiplier, plan.warmup_steps,
                                                plan.decay_steps, tc.lr_decay_ratio)
        slow_opt, fast_opt = _optimizer(tc, schedule), _optimizer(tc, fast_schedule)
        variables = model.trainable_variables
        fast = fast_weight_refs(model)
        fast_mask = [v.ref() in fast for v in variables]
        # Slots created now, not inside the first traced step: a tf.function that creates
        # variables is traced twice, and a trace of a rank-1 network costs seconds.
        slow_opt.build([v for v, is_fast in zip(variables, fast_mask) if not is_fast])
        fast_opt.build([v for v, is_fast in zip(variables, fast_mask) if is_fast])
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=model, slow_optimizer=slow_opt, fast_optimizer=fast_opt, step=step)
    manager = tf.train.CheckpointManager(checkpoint, str(out / CHECKPOINT_DIR), max_to_keep=tc.keep_checkpoints)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("resumed from %s at step %d", manager.latest_checkpoint, int(step.numpy()))
    start = int(step.numpy())

    k = model.ensemble_size

    def replica_step(images, labels):
        # Per replica: B / replicas images. The NLL mean and the whole-batch terms (KL, L2) are each
        # divided by replicas, so the SUM over replicas is one global-batch loss (see model.train).
        with tf.GradientTape() as tape:
            logits = model(images, num_samples=1, training=True)  # [B, K, C]: every member sees the batch
            tiled = tf.tile(labels[:, None], [1, k])
            # Average per-component NLL (App. D.4), not the mixture's: each member must fit on its own.
            member = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tiled, logits=logits), 0)
            nll = tf.reduce_mean(member)
            kl = losses.kl_divergence(model)
            weight = losses.kl_weight(step, kl_scale=tc.kl_scale, annealing_steps=plan.kl_annealing_steps,
                                      num_train_examples=n_train)
            l2 = losses.l2_penalty(model)
            loss = nll + weight * kl + l2
            if particles is not None:  # Bella: the sum of the particles' losses; "kl" reports their -log prior
                (loss, kl, weight), l2 = particles.objective(member), tf.constant(0.0)
            per_replica = loss / replicas  # inside the tape: ops outside it have no gradient
        grads = tape.gradient(per_replica, variables)
        if particles is not None:
            grads = particles.gradients(grads, variables)
        norm = apply_gradients(grads, variables, fast_mask, slow_opt, fast_opt, tc.clip_norm)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(tiled, tf.int64)), tf.float32))
        stats = {"loss": loss, "nll": nll, "kl": kl, "kl_weight": weight, "l2": l2, "grad_norm": norm,
                 "train_accuracy": accuracy, "learning_rate": schedule(step)}
        return {key: value / replicas for key, value in stats.items()}  # summed over replicas below

    @tf.function(autograph=False)
    def train_step(images, labels):
        stats = strategy.run(replica_step, args=(images, labels))
        step.assign_add(1)
        return {key: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for key, value in stats.items()}

    dc = config.data
    # A restart reshuffles from (seed, resume step); replaying the exact order is not needed.
    stream = train_dataset(data.x_train, data.y_train, tc.batch_size, seed=tc.seed * 1_000_003 + start,
                           flip=dc.augment_flip, crop_padding=dc.augment_crop_padding,
                           shuffle_buffer=dc.shuffle_buffer)
    writer = tf.summary.create_file_writer(str(out / TENSORBOARD_DIR))
    history: list[dict[str, float]] = []
    validation: list[dict[str, float]] = []
    bar = tqdm(total=plan.max_steps, initial=start, desc=f"train {config.name}", unit="step", disable=not progress,
               dynamic_ncols=True)
    iterator = iter(strategy.experimental_distribute_dataset(stream))
    while int(step.numpy()) < plan.max_steps:
        images, labels = next(iterator)  # in Python: a finite stream ends with StopIteration
        stats = {key: float(v) for key, v in train_step(images, labels).items()}
        current = int(step.numpy())
        bar.update(1)
        if not np.isfinite(stats["loss"]):
            raise FloatingPointError(f"loss is {stats['loss']} at step {current}: lower the learning rate or clip")
        if current % tc.log_every_steps == 0 or current == plan.max_steps:
            history.append({"step": current, **stats})
            bar.set_postfix(loss=f"{stats['loss']:.3f}", acc=f"{stats['train_accuracy']:.3f}")
            write_scalars(writer, "train", stats, current)
        if tc.eval_every_steps and current % tc.eval_every_steps == 0 and data.y_val.size:
            logits = evaluation.predict_logits(model, data.x_val, batch_size=config.eval.batch_size)
            row = {"step": current, **evaluation.classification_metrics(logits, data.y_val, config.eval.num_bins)}
            validation.append(row)
            write_scalars(writer, "validation", {key: v for key, v in row.items() if key != "step"}, current)
        if current % tc.checkpoint_every_steps == 0:
            manager.save(checkpoint_number=current)
    bar.close()
    final = int(step.numpy())
    if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{final}"):
        manager.save(checkpoint_number=final)
    writer.flush()

    report = None
    if evaluate:
        report = evaluation.evaluate_model(model, config, data, corrupted=corrupted, progress=progress)
        evaluation.write_report(out / EVAL_DIR, report)
    return TrainResult(out, final, history, validation, report, time.time() - started)


def _adapt_base(model, base_dir, data: ImageData, out: pathlib.Path, update: str, n_train: int
                ) -> bella.ParticleUpdate:
    """Loads the base run's weights into a Bella model, freezes them and records the base's checksum."""
    base_config, base_model, _, base_step = load_run(base_dir, data=data)
    if base_config.model.posterior.method != "deterministic" or base_config.model.mc_dropout_rate > 0:
        raise ValueError(f"{base_dir}: a Bella base must be a deterministic run, not {base_config.model.method_name!r}")
    prefix = tf.train.latest_checkpoint(str(pathlib.Path(base_dir) / CHECKPOINT_DIR))
    bella.record_base(out, bella.base_record(base_dir, prefix, base_step))
    bella.copy_base_weights(base_model, model)
    bella.freeze_base(model)
    return bella.ParticleUpdate(model, update, n_train)


def read_run_config(out_dir: str | os.PathLike[str]) -> ImageExperimentConfig:
    """The config a run folder was trained with."""
    path = pathlib.Path(out_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir}: no {CONFIG_FILE}: not a run folder")
    return parse_config(json.loads(path.read_text()), source=str(path))


def load_run(out_dir: str | os.PathLike[str], *, data: ImageData | None = None,
             data_dir: str | os.PathLike[str] | None = None
             ) -> tuple[ImageExperimentConfig, ImageModel, ImageData, int]:
    """(config, model restored from the newest checkpoint, its data, step) of a run folder."""
    config = read_run_config(out_dir)
    latest = tf.train.latest_checkpoint(str(pathlib.Path(out_dir) / CHECKPOINT_DIR))
    if latest is None:
        raise FileNotFoundError(f"{out_dir}: no checkpoint in {CHECKPOINT_DIR}/")
    if data is None:
        data = load_data(config.data, data_dir)
    model = build_model(config.model, data.image_shape, data.num_classes)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    # expect_partial: the optimizers' slots are in the checkpoint but not needed to predict.
    tf.train.Checkpoint(model=model, step=step).restore(latest).expect_partial()
    return config, model, data, int(step.numpy())
