"""Training of the EHR model: a custom loop with periodic validation, checkpoints, and resume.

Run folder OUT/:
  config.json        the resolved experiment config (a restart must use the same one)
  checkpoints/       tf.train.CheckpointManager (model, both optimizers, step)
  best/              the checkpoint with the best validation mixture NLL so far, and
  best.json          its step and NLL, the validations since, and whether training stopped early
  tensorboard/       scalars: loss terms, KL weight, gradient norm, validation metrics
  eval/{validation,test}/  final reports (metrics.json + plots + predictions.csv)
  export/            MODEL_DIR, the service's contract (model/export.py)

A run killed at any point and restarted with the same command resumes from the newest
checkpoint and continues to the same max_steps. The input order after a restart is a fresh
shuffle (seeded by seed and the resume step): replaying the exact order would mean
re-reading every example seen so far.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
import time
from typing import Any

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from model import bella
from model import evaluate as evaluation
from model import devices as device_layout
from model import export_writer, inputs, losses, metrics, precision
from model.config import ExperimentBase, ExperimentConfig, parse_config
from model.ehr_model import build_model, count_parameters
from model.predict import Predictor, predict_probs

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
BEST_FILE = "best.json"
TENSORBOARD_DIR = "tensorboard"
EVAL_DIR = "eval"
EXPORT_DIR = "export"
# Rank-1 factors and their posterior parameters ("fast weights"), e.g. "hidden/alpha/mean:0",
# "lstm/lstm_cell/recurrent_gamma:0"; they get fast_weight_lr_multiplier x the learning rate.
_FAST_WEIGHT = re.compile(r"(^|/)(recurrent_)?(alpha|gamma)(/|:)")


class ConfigMismatchError(RuntimeError):
    """A restart into a run folder that was started with a different config."""


@dataclasses.dataclass
class TrainResult:
    """What a finished run produced."""

    out_dir: pathlib.Path
    step: int
    history: list[dict[str, float]]  # one row per logged step: loss terms
    validation: list[dict[str, float]]  # one row per periodic validation
    best: dict[str, Any]  # BEST_FILE: step and validation NLL of the exported checkpoint, early stop
    export_dir: pathlib.Path | None
    test_report: dict[str, Any] | None


def is_fast_weight(variable: tf.Variable) -> bool:
    """Whether a variable is a rank-1 factor (alpha/gamma) or one of its posterior parameters."""
    return bool(_FAST_WEIGHT.search(variable.name))


def check_run_folder(out: pathlib.Path, config: ExperimentBase) -> None:
    """Writes config.json, or checks that a restart uses the same config (EHR and image runs alike)."""
    path = out / CONFIG_FILE
    if path.exists():
        previous = type(config).parse(json.loads(path.read_text()), source=str(path))
        if previous != config:
            raise ConfigMismatchError(f"{out} holds a run with a different config ({path}); use a new --out "
                                      "or the same config to resume")
    else:
        path.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")


@dataclasses.dataclass
class BestTracker:
    """Keeps the checkpoint with the lowest validation NLL; counts validations since (early stopping)."""

    out: pathlib.Path
    patience: int  # 0 = never stop early
    step: int | None = None
    validation_nll: float = float("inf")
    since_best: int = 0
    stopped_early: bool = False

    @classmethod
    def load(cls, out: pathlib.Path, patience: int) -> BestTracker:
        """The tracker of a run folder, resumed from BEST_FILE when there is one."""
        path = out / BEST_FILE
        if not path.exists():
            return cls(out, patience)
        doc = json.loads(path.read_text())
        return cls(out, patience, doc["step"], doc["validation_nll"], doc["validations_since_best"],
                   doc["stopped_early"])

    def update(self, step: int, validation_nll: float, checkpoint: tf.train.Checkpoint) -> bool:
        """Records one validation (saving the model if it is the best); True when training should stop."""
        if validation_nll < self.validation_nll:
            self.step, self.validation_nll, self.since_best = step, validation_nll, 0
            # max_to_keep=1: only the best survives, whatever the periodic manager deletes.
            tf.train.CheckpointManager(checkpoint, str(self.out / BEST_DIR), max_to_keep=1).save(
                checkpoint_number=step)
        else:
            self.since_best += 1
        self.stopped_early = bool(self.patience) and self.since_best >= self.patience
        self.write()
        return self.stopped_early

    def write(self) -> None:
        """Writes BEST_FILE."""
        (self.out / BEST_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of BEST_FILE."""
        return {"step": self.step, "validation_nll": self.validation_nll if self.step is not None else None,
                "validations_since_best": self.since_best, "patience": self.patience,
                "stopped_early": self.stopped_early}

    def restore_into(self, model: tf.keras.Model) -> None:
        """Loads the best checkpoint's weights into model (no-op when nothing was validated)."""
        path = tf.train.latest_checkpoint(str(self.out / BEST_DIR))
        if path is not None:
            tf.train.Checkpoint(model=model).restore(path).expect_partial()


def learning_rate(tc, peak: float):
    """The optimizer's learning rate: a constant, or a cosine decay from peak to 0 over max_steps."""
    if tc.lr_schedule == "cosine":
        return tf.keras.optimizers.schedules.CosineDecay(peak, decay_steps=tc.max_steps, alpha=0.0)
    return peak


def _num_train_examples(files: inputs.DataFiles) -> int:
    n = files.num_examples("train")
    if n:
        return int(n)
    # No manifest count: count the records (small data only; the Beam job always writes it).
    return sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(files.split_pattern("train")),
                                                  compression_type="GZIP"))


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


def make_validator(model: tf.keras.Model, dataset: tf.data.Dataset, num_samples: int, num_bins: int):
    """A function () -> validation metrics dict, traced once (batched, unseeded sampling: fast, not the export's)."""

    @tf.function(input_signature=[dataset.element_spec[0]], autograph=False)
    def probs_fn(features):
        return tf.sigmoid(model(features, num_samples=num_samples))

    return lambda: validate(probs_fn, dataset, num_bins)


def validate(probs_fn, dataset: tf.data.Dataset, num_bins: int) -> dict[str, float]:
    """Mixture NLL, AUCs, ECE, ... of the predictive mean over a dataset of (features, labels)."""
    probs, labels = [], []
    for features, y in dataset:
        probs.append(probs_fn(features).numpy())
        labels.append(y.numpy())
    if not probs:
        return {}
    p_all, y_all = np.concatenate(probs), np.concatenate(labels)
    out = metrics.scalar_metrics(metrics.predictive_mean(p_all), y_all, num_bins)
    out["mixture_nll"] = float(metrics.mixture_nll(p_all, y_all))
    return out


def train(config: ExperimentConfig, data_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
          progress: bool = True, export_model: bool = True,
          truth_path: str | os.PathLike[str] | None = None,
          base_dir: str | os.PathLike[str] | None = None, devices: str | None = None) -> TrainResult:
    """Trains (or resumes) a run on `devices` (model.devices: auto, cpu:N, gpu:N); evaluates; exports.

    base_dir: the trained deterministic run a "bella" run adapts (required for it, refused otherwise).
    """
    out = pathlib.Path(out_dir)
    if (config.model.method == "bella") != (base_dir is not None):
        raise ValueError("method 'bella' adapts a trained deterministic run: give it (and only it) --base RUN_DIR")
    out.mkdir(parents=True, exist_ok=True)
    check_run_folder(out, config)
    tc, mc = config.train, config.model
    tf.random.set_seed(tc.seed)  # entry point of a run: makes initialisation reproducible
    files = inputs.load_data_files(data_dir)
    featurizer = inputs.Featurizer.from_data_files(files)
    n_train = _num_train_examples(files)

    strategy = device_layout.strategy(devices)
    policy = precision.resolve(tc.mixed_precision)
    precision.check(policy, tc.fast_weight_lr_multiplier)
    # The policy only matters while layers are created; it is not leaked to later code.
    with precision.policy_scope(policy), strategy.scope():
        model = build_model(mc, featurizer.vocab_size)
    with strategy.scope():
        slow_opt = tf.keras.optimizers.Adam(learning_rate(tc, tc.learning_rate))
        fast_opt = tf.keras.optimizers.Adam(learning_rate(tc, tc.learning_rate * tc.fast_weight_lr_multiplier))
        if policy == precision.FLOAT16:  # one optimizer for every weight: one loss scale (model.precision)
            slow_opt = tf.keras.mixed_precision.LossScaleOptimizer(slow_opt)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    particles = _adapt_base(model, base_dir, data_dir, out, mc.particle_update, n_train) if base_dir else None
    if particles is not None and strategy.num_replicas_in_sync > 1:
        # The particle update (kernel over particles) is computed per replica: not validated across devices.
        raise ValueError("method 'bella' trains on one device: use --devices auto, cpu or gpu:1")
    log.info("training on %d replica(s) (%s), policy %s", strategy.num_replicas_in_sync,
             ", ".join(device_layout.device_names(devices)), policy)
    return _train_loop(config, files, featurizer, model, slow_opt, fast_opt, step, strategy, n_train, out,
                       progress=progress, export_model=export_model, truth_path=truth_path, particles=particles)


def _adapt_base(model, base_dir, data_dir, out: pathlib.Path, update: str, n_train: int) -> bella.ParticleUpdate:
    """Loads the base run's weights into a Bella model, freezes them and records the base's checksum."""
    base_config, base_model, _, base_step = load_run(base_dir, data_dir)
    if base_config.model.method != "deterministic":
        raise ValueError(f"{base_dir}: a Bella base must be a deterministic run, not {base_config.model.method!r}")
    bella.record_base(out, bella.base_record(base_dir, model_checkpoint(base_dir), base_step))
    bella.copy_base_weights(base_model, model)
    bella.freeze_base(model)
    return bella.ParticleUpdate(model, update, n_train)


def _train_loop(config, files, featurizer, model, slow_opt, fast_opt, step, strategy, n_train, out, *,
                progress, export_model, truth_path, particles=None) -> TrainResult:
    tc, ec = config.train, config.eval
    variables = model.trainable_variables
    loss_scaled = isinstance(slow_opt, tf.keras.mixed_precision.LossScaleOptimizer)
    # Under loss scaling every weight goes to the one (scaled) optimizer: multiplier 1 (model.precision).
    fast_mask = [is_fast_weight(v) and not loss_scaled for v in variables]
    checkpoint = tf.train.Checkpoint(model=model, slow_optimizer=slow_opt, fast_optimizer=fast_opt, step=step)
    manager = tf.train.CheckpointManager(checkpoint, str(out / CHECKPOINT_DIR), max_to_keep=tc.keep_checkpoints)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("resumed from %s at step %d", manager.latest_checkpoint, int(step.numpy()))
    start = int(step.numpy())

    train_ds = inputs.dataset(files, featurizer, "train", tc.batch_size, training=True,
                              seed=tc.seed * 1_000_003 + start, shuffle_buffer=tc.shuffle_buffer,
                              cache=tc.cache_featurized)
    dist_ds = strategy.experimental_distribute_dataset(train_ds)
    val_ds = inputs.dataset(files, featurizer, "validation", ec.batch_size)
    run_validation = make_validator(model, val_ds, tc.eval_samples, ec.num_bins)
    replicas = strategy.num_replicas_in_sync
    if tc.batch_size % replicas:
        # Uneven per-replica batches would weight the replicas' mean NLLs wrongly (each counts 1 / replicas).
        raise ValueError(f"train.batch_size {tc.batch_size} is not divisible by the {replicas} devices")

    def replica_step(features, labels):
        # Each replica sees B / replicas examples. Its NLL is a mean over those, so the global
        # mean is the replicas' sum of nll / replicas. The KL and L2 terms belong to the whole
        # batch once: each replica carries 1 / replicas of them, and the SUM all-reduce below
        # adds them back to one full copy (not one per replica).
        with tf.GradientTape() as tape:
            logits = model(features, num_samples=1, training=True)  # [B, K]
            nll = losses.nll_loss(logits, labels, tc.loss)
            kl = losses.kl_divergence(model)
            weight = losses.kl_weight(step, kl_scale=tc.kl_scale, annealing_steps=tc.kl_annealing_steps,
                                      num_train_examples=n_train)
            l2 = losses.l2_penalty(model)
            loss = nll + weight * kl + l2
            if particles is not None:  # Bella: the sum of the particles' losses; "kl" reports their -log prior
                (loss, kl, weight), l2 = particles.objective(losses.member_nll(logits, labels)), tf.constant(0.0)
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
        grads, norm = tf.clip_by_global_norm(grads, tc.clip_norm)
        slow = [(g, v) for g, (_, v, fast) in zip(grads, pairs) if not fast]
        fast_pairs = [(g, v) for g, (_, v, fast) in zip(grads, pairs) if fast]
        slow_opt.apply_gradients(slow, skip_gradients_aggregation=True)
        if fast_pairs:
            fast_opt.apply_gradients(fast_pairs, skip_gradients_aggregation=True)
        # Reported per replica so that the SUM in train_step gives: the global batch's mean NLL, one
        # KL / weight / L2 (equal on every replica), and the norm of the summed gradient (all-reduced).
        return {"loss": loss / replicas, "nll": nll / replicas, "kl": kl / replicas, "kl_weight": weight / replicas,
                "l2": l2 / replicas, "grad_norm": norm / replicas}

    # autograph=False: the step has no data-dependent Python control flow, and converting
    # edward2/TFP code with autograph doubles the (long) first trace.
    @tf.function(autograph=False)
    def train_step(iterator):
        features, labels = next(iterator)
        stats = strategy.run(replica_step, args=(features, labels))
        step.assign_add(1)
        return {k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in stats.items()}

    writer = tf.summary.create_file_writer(str(out / TENSORBOARD_DIR))
    history: list[dict[str, float]] = []
    validation: list[dict[str, float]] = []
    best = BestTracker.load(out, tc.early_stopping_patience)
    if best.stopped_early:
        log.info("run stopped early at step %d (best step %s): not training further", start, best.step)
    iterator = iter(dist_ds)
    bar = tqdm(total=tc.max_steps, initial=start, desc=f"train {config.name}", unit="step", disable=not progress,
               dynamic_ncols=True)
    started = time.time()
    while int(step.numpy()) < tc.max_steps and not best.stopped_early:
        stats = {k: float(v) for k, v in train_step(iterator).items()}
        current = int(step.numpy())
        bar.update(1)
        if not np.isfinite(stats["loss"]):
            raise FloatingPointError(f"loss is {stats['loss']} at step {current}: lower the learning rate or clip_norm")
        if current % tc.log_every_steps == 0 or current == tc.max_steps:
            rate = (current - start) / max(time.time() - started, 1e-9)  # includes the first trace
            history.append({"step": current, **stats, "steps_per_second": rate})
            bar.set_postfix(loss=f"{stats['loss']:.4f}", nll=f"{stats['nll']:.4f}")
            write_scalars(writer, "train", {**stats, "steps_per_second": rate}, current)
        stop = False
        if tc.eval_every_steps and (current % tc.eval_every_steps == 0 or current == tc.max_steps):
            row = {"step": current, **run_validation()}
            validation.append(row)
            log.info("step %d validation %s", current, {k: round(v, 4) for k, v in row.items() if k != "step"})
            write_scalars(writer, "validation", {k: v for k, v in row.items() if k != "step"}, current)
            stop = best.update(current, row.get("mixture_nll", float("inf")), checkpoint)
            if stop:
                log.info("early stop at step %d: no better validation NLL in %d validations (best %.4f at step %d)",
                         current, tc.early_stopping_patience, best.validation_nll, best.step)
        if current % tc.checkpoint_every_steps == 0 or stop:
            manager.save(checkpoint_number=current)
    bar.close()
    final_step = int(step.numpy())
    if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{final_step}"):
        manager.save(checkpoint_number=final_step)
    writer.flush()
    best.write()

    export_dir, test_report = None, None
    if export_model:
        # Evaluate and export the best validated weights, not merely the last ones.
        best.restore_into(model)
        export_dir, test_report = finalize(config, model, featurizer, files, out, progress=progress,
                                           truth_path=truth_path)
    return TrainResult(out, final_step, history, validation, best.to_dict(), export_dir, test_report)


def model_checkpoint(out_dir: str | os.PathLike[str]) -> str | None:
    """Prefix of a run's model checkpoint: the best validated one (what the export holds), else the newest."""
    out = pathlib.Path(out_dir)
    return tf.train.latest_checkpoint(str(out / BEST_DIR)) or tf.train.latest_checkpoint(str(out / CHECKPOINT_DIR))


def load_run(out_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str]
             ) -> tuple[ExperimentConfig, tf.keras.Model, inputs.Featurizer, int]:
    """(config, model restored from the best validated (else newest) checkpoint, featurizer, step) of a run."""
    out = pathlib.Path(out_dir)
    config = parse_config(json.loads((out / CONFIG_FILE).read_text()), source=str(out / CONFIG_FILE))
    files = inputs.load_data_files(data_dir)
    featurizer = inputs.Featurizer.from_data_files(files)
    model = build_model(config.model, featurizer.vocab_size)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    latest = model_checkpoint(out)
    if latest is None:
        raise FileNotFoundError(f"{out}: no checkpoint in {CHECKPOINT_DIR}/")
    # expect_partial: the optimizers' slots are in the checkpoint but not needed here.
    tf.train.Checkpoint(model=model, step=step).restore(latest).expect_partial()
    return config, model, featurizer, int(step.numpy())


def finalize(config: ExperimentConfig, model: tf.keras.Model, featurizer: inputs.Featurizer,
             files: inputs.DataFiles, out: pathlib.Path, *, progress: bool = False,
             truth_path: str | os.PathLike[str] | None = None) -> tuple[pathlib.Path, dict]:
    """Final evaluation (seeded, S samples): referral threshold on validation, test report, export."""
    ec = config.eval
    predictor = Predictor(featurizer, model)
    reports = {}
    threshold = None
    for split in ("validation", "test"):
        records, labels, hadm_ids = inputs.read_split(files, split)
        probs = predict_probs(predictor, records, ec.num_samples, ec.seed, batch_size=ec.batch_size,
                              progress=progress)
        if threshold is None:  # validation comes first: the threshold is chosen there, used everywhere
            threshold = evaluation.referral_threshold(probs, ec.referral_rate, ec.referral_measure)
        truth = evaluation.load_truth(truth_path, hadm_ids) if truth_path is not None else None
        report = evaluation.evaluate_predictions(
            probs, labels, model.ensemble_size, ec.num_samples, threshold=threshold, measure=ec.referral_measure,
            rate=ec.referral_rate, truth=truth, num_bins=ec.num_bins, n_bootstrap=ec.n_bootstrap, seed=ec.seed)
        evaluation.write_report(out / EVAL_DIR / split, report, probs, labels, hadm_ids, ec.referral_measure,
                                ec.num_bins)
        reports[split] = report
    metrics_doc = evaluation.metrics_document(reports["test"], measure=ec.referral_measure, rate=ec.referral_rate,
                                              threshold=threshold)
    card = export_writer.model_card(
        name=config.name, method=_method_name(config), ensemble_size=model.ensemble_size,
        data_sha256=export_writer.data_manifest_sha256(files.data_dir), metrics_doc=metrics_doc,
        config=config.to_dict(), num_parameters=count_parameters(model), base=bella.read_base_record(out))
    export_dir = export_writer.write_export(out / EXPORT_DIR, predictor, data_dir=files.data_dir,
                                            pipeline_config=files.pipeline_config, card=card, metrics_doc=metrics_doc)
    return export_dir, reports["test"]


def _method_name(config: ExperimentConfig) -> str:
    """'rank1_normal' / 'rank1_cauchy' for rank-1 runs, 'bella_ensemble' / 'bella_svgd', the method otherwise."""
    m = config.model
    if m.method == "bella":
        return f"bella_{m.particle_update}"
    return f"rank1_{m.distribution}" if m.method == "rank1" else m.method
