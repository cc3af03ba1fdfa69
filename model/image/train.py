"""Training of the image models: their data, model and validation in the shared loop (model.fit.training_loop).

Run folder OUT/: the loop's (config.json, checkpoints/, best/, best.json, tensorboard/), and
  eval/         metrics.json + summary.md: clean and corrupted test metrics

What is image-specific: the categorical likelihood (per-component NLL, App. D.4), the epoch
settings converted to steps, the warm-up + piecewise-constant learning rate of the CIFAR
recipe, and the fast weights found structurally (a batch norm's ``gamma`` is no rank-1
factor). With eval_every_steps > 0 the best validated checkpoint is the one evaluated, and
early_stopping_patience stops a run as in the EHR trainer.
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

import tensorflow as tf

from model.image import evaluate as evaluation
from model.image.config import ImageExperimentConfig, ImageTrainConfig, parse_config
from model.image.data import ImageData, load_data, train_dataset
from model.image.models import ImageModel, build_model
from model.layers import bella
from model.fit import training_loop
from model.fit.training_loop import CHECKPOINT_DIR, CONFIG_FILE, model_checkpoint

log = logging.getLogger(__name__)

EVAL_DIR = "eval"


@dataclasses.dataclass
class ImageTrainResult:
    """What a finished run produced."""

    out_dir: pathlib.Path
    step: int
    history: list[dict[str, float]]  # one row per logged step
    validation: list[dict[str, float]]  # one row per periodic validation
    report: dict[str, Any] | None  # the final evaluation (None with evaluate=False)
    wall_s: float
    best: dict[str, Any]  # BEST_FILE: step and validation NLL of the evaluated checkpoint, early stop


# --------------------------------------------------------------------------- schedule and step plan


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


def _optimizer(tc: ImageTrainConfig, schedule) -> tf.keras.optimizers.Optimizer:
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


def plan_steps(tc: ImageTrainConfig, num_train: int) -> StepPlan:
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
          devices: str | None = None) -> ImageTrainResult:
    """Trains (or resumes) a run on `devices` (model.fit.devices), then evaluates it on clean and corrupted test sets.

    base_dir: the trained deterministic run a "bella" run adapts (required for it, refused otherwise).
    """
    started = time.time()
    if (config.model.posterior.method == "bella") != (base_dir is not None):
        raise ValueError("posterior.method 'bella' adapts a trained deterministic run: give it (and only it) "
                         "--base RUN_DIR")
    tc = config.train
    out = training_loop.start_run(out_dir, config, tc.seed)
    if data is None:
        data = load_data(config.data, data_dir)
    n_train = int(data.y_train.shape[0])
    plan = plan_steps(tc, n_train)
    strategy = training_loop.training_strategy(devices, tc.batch_size, bella=base_dir is not None)
    # Model, optimizers and step are mirrored variables when there are several devices.
    with strategy.scope():
        model = build_model(config.model, data.image_shape, data.num_classes)
        particles = _adapt_base(model, base_dir, data, out, config.model.posterior.particle_update, n_train) \
            if base_dir is not None else None
        schedule = WarmupPiecewiseConstant(tc.learning_rate, plan.warmup_steps, plan.decay_steps, tc.lr_decay_ratio)
        fast_schedule = WarmupPiecewiseConstant(tc.learning_rate * tc.fast_weight_lr_multiplier, plan.warmup_steps,
                                                plan.decay_steps, tc.lr_decay_ratio)
        slow_opt, fast_opt = _optimizer(tc, schedule), _optimizer(tc, fast_schedule)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    settings = training_loop.LoopSettings.of(tc, name=config.name, max_steps=plan.max_steps, num_train_examples=n_train,
                                             kl_annealing_steps=plan.kl_annealing_steps, best_metric="nll")
    dc = config.data

    def train_data(start: int) -> tf.data.Dataset:
        # A restart reshuffles from (seed, resume step); replaying the exact order is not needed.
        return train_dataset(data.x_train, data.y_train, tc.batch_size, seed=tc.seed * 1_000_003 + start,
                             flip=dc.augment_flip, crop_padding=dc.augment_crop_padding,
                             shuffle_buffer=dc.shuffle_buffer)

    def validate() -> dict[str, float]:
        logits = evaluation.predict_logits(model, data.x_val, batch_size=config.eval.batch_size)
        return evaluation.classification_metrics(logits, data.y_val, config.eval.num_bins)

    loop = training_loop.run(model, slow_opt=slow_opt, fast_opt=fast_opt, learning_rate=schedule, step=step,
                             strategy=strategy, train_data=train_data,
                             likelihood=CategoricalLikelihood(model.ensemble_size),
                             validate=validate if data.y_val.size else None, settings=settings, out=out,
                             particles=particles, progress=progress)
    report = None
    if evaluate:
        loop.best.restore_into(model)  # the best validated weights, when there were validations
        report = evaluation.evaluate_model(model, config, data, corrupted=corrupted, progress=progress)
        evaluation.write_report(out / EVAL_DIR, report)
    return ImageTrainResult(out, loop.step, loop.history, loop.validation, report, time.time() - started,
                       loop.best.to_dict())


@dataclasses.dataclass(frozen=True)
class CategoricalLikelihood:
    """The image models' likelihood (model.fit.training_loop.Likelihood): softmax NLL of logits [B, K, C]."""

    ensemble_size: int

    def member_nll(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Each member's mean NLL, [K]."""
        tiled = tf.tile(labels[:, None], [1, self.ensemble_size])
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tiled, logits=logits), 0)

    def nll(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Average per-component NLL (App. D.4), not the mixture's: each member must fit on its own."""
        return tf.reduce_mean(self.member_nll(logits, labels))

    def stats(self, logits: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """Training accuracy of the members' argmax."""
        tiled = tf.cast(tf.tile(labels[:, None], [1, self.ensemble_size]), tf.int64)
        return {"train_accuracy": tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1), tiled), tf.float32))}


def _adapt_base(model, base_dir, data: ImageData, out: pathlib.Path, update: str, n_train: int
                ) -> bella.ParticleUpdate:
    """Loads the base run's weights into a Bella model, freezes them and records the base's checksum."""
    base_config, base_model, _, base_step = load_run(base_dir, data=data)
    if base_config.model.posterior.method != "deterministic" or base_config.model.mc_dropout_rate > 0:
        raise ValueError(f"{base_dir}: a Bella base must be a deterministic run, not {base_config.model.method_name!r}")
    return bella.adapt_base(model, base_model, bella.base_record(base_dir, model_checkpoint(base_dir), base_step),
                            out, update, n_train)


def read_run_config(out_dir: str | os.PathLike[str]) -> ImageExperimentConfig:
    """The config a run folder was trained with."""
    path = pathlib.Path(out_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir}: no {CONFIG_FILE}: not a run folder")
    return parse_config(json.loads(path.read_text()), source=str(path))


def load_run(out_dir: str | os.PathLike[str], *, data: ImageData | None = None,
             data_dir: str | os.PathLike[str] | None = None
             ) -> tuple[ImageExperimentConfig, ImageModel, ImageData, int]:
    """(config, model restored from the best validated (else newest) checkpoint, its data, step) of a run folder."""
    config = read_run_config(out_dir)
    latest = model_checkpoint(out_dir)
    if latest is None:
        raise FileNotFoundError(f"{out_dir}: no checkpoint in {CHECKPOINT_DIR}/")
    if data is None:
        data = load_data(config.data, data_dir)
    model = build_model(config.model, data.image_shape, data.num_classes)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    # expect_partial: the optimizers' slots are in the checkpoint but not needed to predict.
    tf.train.Checkpoint(model=model, step=step).restore(latest).expect_partial()
    return config, model, data, int(step.numpy())
