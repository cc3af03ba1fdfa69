"""The one training loop of the EHR and image trainers: ELBO step, checkpoints, best checkpoint, early stop.

A trainer builds its model, optimizers and data, and hands them to ``run`` with its likelihood
(``Likelihood``: the NLL of its logits) and its validation (a function returning metrics).
Everything else is here, once: the loss (NLL + annealed KL / N_train + L2, or Bella's particle
objective), the slow / fast-weight optimizer split, float16 loss scaling, the cross-replica
gradient sum and global-norm clip, resume from the newest checkpoint, periodic validation
with the best checkpoint kept (``BestTracker``) and early stopping, TensorBoard scalars, the
progress bar and the NaN guard.

Run folder OUT/ (both trainers; each adds its own evaluation and export):
  config.json   the resolved experiment config (a restart must use the same one)
  checkpoints/  tf.train.CheckpointManager (model, both optimizers, step)
  best/         the checkpoint with the best validation NLL so far, and
  best.json     its step and NLL, the validations since, and whether training stopped early
  tensorboard/  scalars: loss terms, KL weight, gradient norm, learning rate, validation metrics

A run killed at any point and restarted with the same command resumes from the newest
checkpoint and continues to the same max_steps. The input order after a restart is a fresh
shuffle: the trainer's dataset is built for the resume step (``run``'s ``train_data``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import time
from typing import Any, Callable, Protocol

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from model.layers import FACTOR_SITES
from model.fit import devices as device_layout
from model.fit import losses
from model.fit.experiment import ExperimentBase

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
BEST_FILE = "best.json"
TENSORBOARD_DIR = "tensorboard"


class ConfigMismatchError(RuntimeError):
    """A restart into a run folder that was started with a different config."""


def check_run_folder(out: pathlib.Path, config: ExperimentBase) -> None:
    """Writes config.json, or checks that a restart uses the same config (EHR and image runs alike)."""
    path = out / CONFIG_FILE
    if not path.exists() and any(out.iterdir()):
        # Checkpoints and reports written among someone else's files would mix two things in one folder.
        raise ConfigMismatchError(f"{out} is not empty and holds no {CONFIG_FILE} (not a training run folder): "
                                  "use a new --out")
    if path.exists():
        previous = type(config).parse(json.loads(path.read_text()), source=str(path))
        if previous != config:
            raise ConfigMismatchError(f"{out} holds a run with a different config ({path}); use a new --out "
                                      "or the same config to resume")
    else:
        path.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")


def start_run(out_dir: str | os.PathLike[str], config: ExperimentBase, seed: int) -> pathlib.Path:
    """Creates (or checks, on resume) the run folder and seeds the run; returns the folder."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_run_folder(out, config)
    # Entry point of a run: initialisation is reproducible. tf-keras initialisers without a seed
    # draw theirs from Python's generator, or, once anything in the process has called
    # set_random_seed, from tf-keras' own (thread-local) generator: this seeds both, numpy and TF.
    tf.keras.utils.set_random_seed(seed)
    return out


def training_strategy(devices: str | None, batch_size: int, *, bella: bool) -> tf.distribute.Strategy:
    """The strategy of `devices` (model.fit.devices); refuses layouts this loop cannot train on."""
    strategy = device_layout.strategy(devices)
    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        # Uneven per-replica batches would weight the replicas' mean NLLs wrongly (each counts 1 / replicas).
        raise ValueError(f"train.batch_size {batch_size} is not divisible by the {replicas} devices")
    if bella and replicas > 1:
        # The particle update (kernel over particles) is computed per replica: not validated across devices.
        raise ValueError("Bella (method 'bella') trains on one device: use --devices auto, cpu or gpu:1")
    return strategy


def fast_weight_refs(model: tf.Module) -> set:
    """Refs of the rank-1 factors (alpha/gamma) and their posterior parameters under `model`."""
    refs = set()
    for module in (model, *model.submodules):
        for site in FACTOR_SITES:
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


@dataclasses.dataclass(frozen=True)
class StopRule:
    """When validation has stopped improving: early stopping and the plateau schedule, in validations."""

    patience: int = 0  # stop after this many validations without a significant improvement; 0 = never stop
    min_delta: float = 0.0  # nats per example: an NLL counts as an improvement only when lower by more than this
    decay_patience: int = 0  # plateau schedule: decay after this many validations without one; 0 = no decay
    decay_factor: float = 1.0  # plateau schedule: the learning rate's factor at each decay
    min_steps: int = 0  # neither a stop nor a decay before this training step (BestTracker.update)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a run's validations stand under a StopRule (``advance`` folds one validation in)."""

    validations: int = 0
    best_nll: float = float("inf")  # the lowest NLL so far: its checkpoint is the one kept
    best_index: int | None = None  # the validation (0-based) that reached it
    reference_nll: float = float("inf")  # the last significant improvement's NLL: patience counts from it
    since_improvement: int = 0  # validations since the last significant improvement
    since_decay: int = 0  # validations since that improvement or the last decay, whichever came later
    decays: int = 0  # plateau decays so far: the learning rate is decay_factor ** decays of its start
    stop: bool = False
    new_best: bool = False  # this validation is the lowest so far (save its checkpoint)
    decayed: bool = False  # this validation decayed the learning rate


def advance(progress: Progress, nll: float, rule: StopRule) -> Progress:
    """The Progress after one more validation NLL (nats per example); pure, so a run's stop is replayable.

    The best checkpoint is the lowest NLL, however small the gain; patience and the plateau
    decay count from the last NLL that beat its reference by more than min_delta. A NaN never
    improves. With min_delta 0 and no decay this is plain patience on the lowest NLL.
    """
    p = progress
    new_best = nll < p.best_nll
    significant = nll < p.reference_nll - rule.min_delta
    since_improvement = 0 if significant else p.since_improvement + 1
    since_decay = 0 if significant else p.since_decay + 1
    decayed = bool(rule.decay_patience) and since_decay >= rule.decay_patience
    return Progress(
        validations=p.validations + 1,
        best_nll=nll if new_best else p.best_nll,
        best_index=p.validations if new_best else p.best_index,
        reference_nll=nll if significant else p.reference_nll,
        since_improvement=since_improvement,
        since_decay=0 if decayed else since_decay,
        decays=p.decays + int(decayed),
        stop=bool(rule.patience) and since_improvement >= rule.patience,
        new_best=new_best, decayed=decayed)


def replay(nlls, rule: StopRule) -> Progress:
    """The Progress after a sequence of validation NLLs, stopping where the rule stops (what a run does)."""
    progress = Progress()
    for nll in nlls:
        progress = advance(progress, float(nll), rule)
        if progress.stop:
            break
    return progress


@dataclasses.dataclass
class BestTracker:
    """Keeps the checkpoint with the lowest validation NLL; applies the StopRule (early stop, plateau decay)."""

    out: pathlib.Path
    patience: int  # 0 = never stop early
    step: int | None = None
    validation_nll: float = float("inf")
    since_best: int = 0  # validations since the last significant improvement (StopRule.min_delta)
    stopped_early: bool = False
    rule: StopRule | None = None  # None: StopRule(patience)
    progress: Progress = dataclasses.field(default_factory=Progress)
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        if self.rule is None:
            self.rule = StopRule(self.patience)

    @classmethod
    def load(cls, out: pathlib.Path, patience: int, rule: StopRule | None = None) -> BestTracker:
        """The tracker of a run folder, resumed from BEST_FILE when there is one."""
        path = out / BEST_FILE
        if not path.exists():
            return cls(out, patience, rule=rule)
        doc = json.loads(path.read_text())
        best = float("inf") if doc["validation_nll"] is None else doc["validation_nll"]
        reference = doc.get("reference_nll")
        # Folders written before the plateau schedule lack its keys: their counts start where patience stood.
        progress = Progress(validations=doc.get("validations", 0), best_nll=best,
                            reference_nll=best if reference is None else reference,
                            since_improvement=doc["validations_since_best"],
                            since_decay=doc.get("validations_since_decay", doc["validations_since_best"]),
                            decays=doc.get("learning_rate_decays", 0), stop=doc["stopped_early"])
        return cls(out, patience, doc["step"], best, doc["validations_since_best"], doc["stopped_early"],
                   rule=rule, progress=progress, stop_reason=doc.get("stop_reason"))

    def update(self, step: int, validation_nll: float, checkpoint: tf.train.Checkpoint) -> bool:
        """Records one validation (saving the model if it is the best); True when training should stop."""
        before = self.progress
        self.progress = advance(before, validation_nll, self.rule)
        if step < self.rule.min_steps and (self.progress.stop or self.progress.decayed):
            # A network can sit on a plateau before it finds a slower signal: stopping or slowing it
            # there would end the run before it learns it. Patience counts on.
            self.progress = dataclasses.replace(self.progress, stop=False, decayed=False, decays=before.decays)
        if self.progress.new_best:
            self.step, self.validation_nll = step, validation_nll
            # max_to_keep=1: only the best survives, whatever the periodic manager deletes.
            tf.train.CheckpointManager(checkpoint, str(self.out / BEST_DIR), max_to_keep=1).save(
                checkpoint_number=step)
        self.since_best = self.progress.since_improvement
        self.stopped_early = self.progress.stop
        if self.stopped_early:
            self.stop_reason = (f"early stop at step {step}: no validation NLL lower by more than "
                                f"{self.rule.min_delta:g} in {self.rule.patience} validations "
                                f"(best {self.validation_nll:.4f} at step {self.step})")
        self.write()
        return self.stopped_early

    @property
    def learning_rate_factor(self) -> float:
        """The plateau schedule's factor on the starting learning rate (1.0 without decays)."""
        return self.rule.decay_factor ** self.progress.decays

    def write(self) -> None:
        """Writes BEST_FILE."""
        (self.out / BEST_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of BEST_FILE."""
        p = self.progress
        return {"step": self.step, "validation_nll": self.validation_nll if self.step is not None else None,
                "validations_since_best": self.since_best, "patience": self.patience,
                "stopped_early": self.stopped_early, "stop_reason": self.stop_reason,
                "min_delta": self.rule.min_delta, "validations": p.validations,
                "reference_nll": p.reference_nll if p.validations else None,
                "validations_since_decay": p.since_decay, "learning_rate_decays": p.decays,
                "learning_rate_factor": self.learning_rate_factor}

    def restore_into(self, model: tf.keras.Model) -> None:
        """Loads the best checkpoint's weights into model (no-op when nothing was validated)."""
        path = tf.train.latest_checkpoint(str(self.out / BEST_DIR))
        if path is not None:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()


def model_checkpoint(out_dir: str | os.PathLike[str]) -> str | None:
    """Prefix of a run's model checkpoint: the best validated one (what is evaluated), else the newest."""
    out = pathlib.Path(out_dir)
    return tf.train.latest_checkpoint(str(out / BEST_DIR)) or tf.train.latest_checkpoint(str(out / CHECKPOINT_DIR))


def _scalar_metadata() -> bytes:
    """SummaryMetadata marking a tensor as a TensorBoard scalar."""
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR).SerializeToString()


def write_scalars(writer, prefix: str, values: dict[str, float], step: int) -> None:
    """Writes TensorBoard scalars without the tensorboard package (not in the pinned stack).

    tf.summary.scalar lives in the tensorboard package; tf.summary.write with the scalar
    plugin's metadata writes the same event records from TensorFlow alone.
    """
    metadata = _scalar_metadata()
    with writer.as_default(step=step):
        for key, value in values.items():
            if value is not None and np.isfinite(value):
                tf.summary.write(f"{prefix}/{key}", tf.constant(float(value), tf.float32), metadata=metadata)


class Likelihood(Protocol):
    """The data term of a model's loss, from its training logits (every member sees the batch)."""

    def nll(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """The NLL the loss minimises: a scalar, nats per example."""

    def member_nll(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Mean NLL of each member, [K] (nats per example): what Bella's particles minimise."""

    def stats(self, logits: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """Extra per-step scalars to log (e.g. training accuracy); {} for none."""


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """What the loop needs of a trainer's config, in steps."""

    name: str  # the progress bar's label
    max_steps: int
    num_train_examples: int  # N_train: the KL (or Bella's -log prior) is divided by it
    kl_scale: float
    kl_annealing_steps: int
    clip_norm: float | None  # global-norm clip of the summed gradient; None = off
    log_every_steps: int
    eval_every_steps: int  # 0 = no validation (then no best checkpoint either)
    checkpoint_every_steps: int
    keep_checkpoints: int
    early_stopping_patience: int  # 0 = never stop early
    best_metric: str  # the validation key whose minimum is the best checkpoint (an NLL)
    early_stopping_min_delta: float = 0.0  # nats per example (StopRule.min_delta)
    lr_decay_patience: int = 0  # the plateau schedule's patience in validations; 0 = no plateau schedule
    lr_decay_factor: float = 1.0
    early_stopping_min_steps: int = 0  # StopRule.min_steps

    @property
    def first_eligible_step(self) -> int:
        """Validations at or before this step keep no checkpoint and count no patience: the KL warm-up (steps)."""
        return self.kl_annealing_steps if 0 < self.kl_annealing_steps < self.max_steps else 0

    @property
    def stop_rule(self) -> StopRule:
        """The rule BestTracker applies to the validations."""
        return StopRule(self.early_stopping_patience, self.early_stopping_min_delta, self.lr_decay_patience,
                        self.lr_decay_factor, self.early_stopping_min_steps)

    @classmethod
    def of(cls, train_config, *, name: str, max_steps: int, num_train_examples: int, kl_annealing_steps: int,
           best_metric: str) -> LoopSettings:
        """The settings of a trainer's train config (EHR or image: the fields share their names)."""
        tc = train_config
        # The image trainer's config has its own epoch-based schedule and no plateau fields.
        plateau = getattr(tc, "lr_schedule", None) == "plateau"
        return cls(name, max_steps, num_train_examples, tc.kl_scale, kl_annealing_steps, tc.clip_norm,
                   tc.log_every_steps, tc.eval_every_steps, tc.checkpoint_every_steps, tc.keep_checkpoints,
                   tc.early_stopping_patience, best_metric, getattr(tc, "early_stopping_min_delta", 0.0),
                   tc.lr_decay_patience if plateau else 0, tc.lr_decay_factor if plateau else 1.0,
                   getattr(tc, "early_stopping_min_steps", 0))


@dataclasses.dataclass
class LoopResult:
    """What the loop leaves: the final step, the logged rows and the best-checkpoint tracker."""

    step: int
    history: list[dict[str, float]]  # one row per logged step: loss terms, learning rate, steps/s
    validation: list[dict[str, float]]  # one row per periodic validation
    best: BestTracker


# long: one loop owns the step, logs, validation, decays and the stop; split, its state would travel to every piece
def run(model: tf.keras.Model, *, slow_opt, fast_opt, learning_rate, step: tf.Variable,
        strategy: tf.distribute.Strategy, train_data: Callable[[int], tf.data.Dataset], likelihood: Likelihood,
        validate: Callable[[], dict[str, float]] | None, settings: LoopSettings, out: pathlib.Path,
        particles=None, progress: bool = True) -> LoopResult:
    """Trains (or resumes) `model` to settings.max_steps or an early stop; returns the logs and the best tracker.

    fast_opt carries the rank-1 factors and their posteriors (``fast_weight_refs``), slow_opt
    the rest; a LossScaleOptimizer as slow_opt (float16) carries every weight (model.ehr.mixed_precision).
    learning_rate: slow_opt's rate or schedule, logged. Under the plateau schedule (settings.lr_decay_patience)
    both optimizers' rates are plain values the loop multiplies by lr_decay_factor at each decay.
    train_data(resume_step): an endless
    dataset of (inputs, labels) batches. particles: Bella's bella.ParticleUpdate, or None.
    """
    s = settings
    # The starting rates, read before a restore: a resumed run sets them from best.json's decay count.
    start_rates = ((float(slow_opt.learning_rate), float(fast_opt.learning_rate)) if s.lr_decay_patience
                   else None)
    checkpoint = tf.train.Checkpoint(model=model, slow_optimizer=slow_opt, fast_optimizer=fast_opt, step=step)
    manager = tf.train.CheckpointManager(checkpoint, str(out / CHECKPOINT_DIR), max_to_keep=s.keep_checkpoints)
    # Optimizer slots exist before the restore, so it fills them instead of deferring.
    train_step = _train_step(model, slow_opt=slow_opt, fast_opt=fast_opt, learning_rate=learning_rate, step=step,
                             strategy=strategy, likelihood=likelihood, settings=s, particles=particles)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("resumed from %s at step %d", manager.latest_checkpoint, int(step.numpy()))
    start = int(step.numpy())
    dist_ds = strategy.experimental_distribute_dataset(train_data(start))

    writer = tf.summary.create_file_writer(str(out / TENSORBOARD_DIR))
    history: list[dict[str, float]] = []
    validation: list[dict[str, float]] = []
    best = BestTracker.load(out, s.early_stopping_patience, s.stop_rule)
    if start_rates is not None:
        _scale_rates(slow_opt, fast_opt, start_rates, best.learning_rate_factor)
    if best.stopped_early:
        log.info("run stopped early at step %d (best step %s): not training further", start, best.step)
    iterator = iter(dist_ds)
    bar = tqdm(total=s.max_steps, initial=start, desc=f"train {s.name}", unit="step", disable=not progress,
               dynamic_ncols=True)
    started = time.time()
    while int(step.numpy()) < s.max_steps and not best.stopped_early:
        try:
            stats = {key: float(v) for key, v in train_step(iterator).items()}
        except tf.errors.OutOfRangeError:
            # A finite stream ends like a Python iterator (the trainers' datasets repeat forever).
            raise StopIteration(f"the training data ran out at step {int(step.numpy()) + 1}") from None
        current = int(step.numpy())
        bar.update(1)
        if not np.isfinite(stats["loss"]):
            raise FloatingPointError(f"loss is {stats['loss']} at step {current}: lower the learning rate or clip_norm")
        if current % s.log_every_steps == 0 or current == s.max_steps:
            rate = (current - start) / max(time.time() - started, 1e-9)  # includes the first trace
            history.append({"step": current, **stats, "steps_per_second": rate})
            bar.set_postfix({key: f"{stats[key]:.4f}" for key in ("loss", "nll", *_likelihood_keys(stats))})
            write_scalars(writer, "train", {**stats, "steps_per_second": rate}, current)
        stop = False
        if validate is not None and s.eval_every_steps and (current % s.eval_every_steps == 0
                                                            or current == s.max_steps):
            row = {"step": current, **validate()}
            validation.append(row)
            log.info("step %d validation %s", current, {k: round(v, 4) for k, v in row.items() if k != "step"})
            write_scalars(writer, "validation", {k: v for k, v in row.items() if k != "step"}, current)
            # Under KL annealing the loss is not yet the ELBO: a checkpoint from the warm-up scores well on
            # NLL because the prior has not pulled on it, so neither it nor patience counts until the
            # warm-up ends (unless the whole run is warm-up).
            if current > s.first_eligible_step:
                stop = best.update(current, row.get(s.best_metric, float("inf")), checkpoint)
            if best.progress.decayed and start_rates is not None and not stop:
                _scale_rates(slow_opt, fast_opt, start_rates, best.learning_rate_factor)
                log.info("learning rate x%g at step %d (now %.3g): no validation NLL lower by more than %g in %d "
                         "validations", s.lr_decay_factor, current, start_rates[0] * best.learning_rate_factor,
                         s.early_stopping_min_delta, s.lr_decay_patience)
            if stop:
                log.info("%s", best.stop_reason)
        if current % s.checkpoint_every_steps == 0 or stop:
            manager.save(checkpoint_number=current)
    bar.close()
    final_step = int(step.numpy())
    if not best.stopped_early:
        best.stop_reason = f"max_steps {s.max_steps} reached" + (
            f" (best validation NLL {best.validation_nll:.4f} at step {best.step})" if best.step is not None else "")
        log.info("training ended at step %d: %s", final_step, best.stop_reason)
    if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{final_step}"):
        manager.save(checkpoint_number=final_step)
    writer.flush()
    best.write()
    return LoopResult(final_step, history, validation, best)


def _scale_rates(slow_opt, fast_opt, start_rates: tuple[float, float], factor: float) -> None:
    """Sets both optimizers' learning rates to their starting rates times factor (the plateau schedule)."""
    slow_opt.learning_rate = start_rates[0] * factor
    fast_opt.learning_rate = start_rates[1] * factor


def _train_step(model: tf.keras.Model, *, slow_opt, fast_opt, learning_rate, step: tf.Variable,
                strategy: tf.distribute.Strategy, likelihood: Likelihood, settings: LoopSettings,
                particles) -> Callable:
    """Builds both optimizers over their weights and returns the traced step: iterator -> summed stats."""
    s = settings
    variables = model.trainable_variables
    loss_scaled = isinstance(slow_opt, tf.keras.mixed_precision.LossScaleOptimizer)
    # Under loss scaling every weight goes to the one (scaled) optimizer: multiplier 1 (model.ehr.mixed_precision).
    fast = set() if loss_scaled else fast_weight_refs(model)
    fast_mask = [v.ref() in fast for v in variables]
    with strategy.scope():
        # Slots created now, not inside the first traced step: a tf.function that creates
        # variables is traced twice, and a trace of a rank-1 network costs seconds.
        slow_opt.build([v for v, fast in zip(variables, fast_mask) if not fast])
        fast_opt.build([v for v, fast in zip(variables, fast_mask) if fast])
    replicas = strategy.num_replicas_in_sync

    def replica_step(inputs, labels):
        # Each replica sees B / replicas examples. Its NLL is a mean over those, so the global
        # mean is the replicas' sum of nll / replicas. The KL and L2 terms belong to the whole
        # batch once: each replica carries 1 / replicas of them, and the SUM all-reduce below
        # adds them back to one full copy (not one per replica).
        with tf.GradientTape() as tape:
            logits = model(inputs, num_samples=1, training=True)  # every member sees the batch
            nll = likelihood.nll(logits, labels)
            kl = losses.kl_divergence(model)
            weight = losses.kl_weight(step, kl_scale=s.kl_scale, annealing_steps=s.kl_annealing_steps,
                                      num_train_examples=s.num_train_examples)
            l2 = losses.l2_penalty(model)
            loss = nll + weight * kl + l2
            if particles is not None:  # Bella: the sum of the particles' losses; "kl" reports their -log prior
                (loss, kl, weight), l2 = particles.objective(likelihood.member_nll(logits, labels)), tf.constant(0.0)
            per_replica = loss / replicas  # inside the tape: ops outside it have no gradient
            if loss_scaled:
                per_replica = slow_opt.get_scaled_loss(per_replica)
        grads = tape.gradient(per_replica, variables)
        pairs = [(g, v, fast) for g, v, fast in zip(grads, variables, fast_mask) if g is not None]
        grads = [tf.convert_to_tensor(g) for g, _, _ in pairs]
        if loss_scaled:
            grads = slow_opt.get_unscaled_gradients(grads)
        if replicas > 1:
            # Sum across replicas BEFORE clipping: the clip is on the global gradient norm.
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if particles is not None:  # after the all-reduce: the SVGD kernel needs the summed gradients
            grads = particles.gradients(grads, [v for _, v, _ in pairs])
        if s.clip_norm is not None:
            grads, norm = tf.clip_by_global_norm(grads, s.clip_norm)
        else:
            norm = tf.linalg.global_norm(grads)
        slow = [(g, v) for g, (_, v, fast) in zip(grads, pairs) if not fast]
        fast_pairs = [(g, v) for g, (_, v, fast) in zip(grads, pairs) if fast]
        slow_opt.apply_gradients(slow, skip_gradients_aggregation=True)
        if fast_pairs:
            fast_opt.apply_gradients(fast_pairs, skip_gradients_aggregation=True)
        rate = learning_rate(step) if callable(learning_rate) else learning_rate
        stats = {"loss": loss, "nll": nll, "kl": kl, "kl_weight": weight, "l2": l2, "grad_norm": norm,
                 **likelihood.stats(logits, labels), "learning_rate": tf.cast(rate, tf.float32)}
        # Reported per replica so that the SUM in train_step gives: the global batch's mean NLL, one
        # KL / weight / L2 (equal on every replica), and the norm of the summed gradient (all-reduced).
        return {key: value / replicas for key, value in stats.items()}

    # autograph=False: the step has no data-dependent Python control flow, and converting
    # edward2/TFP code with autograph doubles the (long) first trace. The batch is taken in the
    # step: inputs whose shapes vary per batch (EHR sequences) would otherwise retrace it.
    @tf.function(autograph=False)
    def train_step(iterator):
        inputs, labels = next(iterator)
        stats = strategy.run(replica_step, args=(inputs, labels))
        step.assign_add(1)
        return {key: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None) for key, value in stats.items()}

    return train_step


_LOSS_KEYS = ("loss", "nll", "kl", "kl_weight", "l2", "grad_norm", "learning_rate")


def _likelihood_keys(stats: dict[str, float]) -> list[str]:
    """The keys of a step's stats that the likelihood added (shown in the progress bar)."""
    return [key for key in stats if key not in _LOSS_KEYS]


def count_parameters(model: tf.keras.Model) -> int:
    """Number of trainable scalars (weights, factor posteriors, embedding table)."""
    return int(sum(v.shape.num_elements() for v in model.trainable_variables))
