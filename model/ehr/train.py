"""Training of the EHR model: its data, model and validation in the shared loop (model.fit.training_loop).

Run folder OUT/: the loop's (config.json, checkpoints/, best/, best.json, tensorboard/), and
  eval/{validation,test}/  final reports (metrics.json + plots + predictions.csv)
  export/            MODEL_DIR, the service's contract (model/export/load.py)

A restarted run resumes from its newest checkpoint; the input order after a restart is a
fresh shuffle, seeded by seed and the resume step: replaying the exact order would mean
re-reading every example seen so far.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from typing import Any

import numpy as np
import tensorflow as tf

from model import data_folder
from model.export_layout import EXPORT_DIR
from model.evaluation import against_reference
from model.evaluation import evaluate as evaluation
from model.evaluation.statistics import metrics, referral_choice
from model.export import write as export_writer
from model.export.predict import Predictor, predict_probs
from model.fit import devices as device_layout
from model.fit import losses, training_loop
from model.fit.training_loop import CHECKPOINT_DIR, CONFIG_FILE, count_parameters, model_checkpoint
from model.layers import bella, factory
from model.ehr import inputs, mixed_precision
from model.ehr.baselines import read_features
from model.ehr.config import ExperimentConfig, ModelConfig, parse_config
from model.ehr.ehr_model import build_model
from model.ehr.wide import fit_laplace

log = logging.getLogger(__name__)

EVAL_DIR = "eval"


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


def learning_rate(tc, peak: float):
    """The optimizer's learning rate: a constant, or a cosine decay from peak to 0 over max_steps.

    The plateau schedule starts as the constant peak; the training loop lowers it on validation (StopRule).
    """
    if tc.lr_schedule == "cosine":
        return tf.keras.optimizers.schedules.CosineDecay(peak, decay_steps=tc.max_steps, alpha=0.0)
    return peak


def _num_train_examples(files: data_folder.DataFiles) -> int:
    n = files.num_examples("train")
    if n:
        return int(n)
    # No manifest count: count the records (small data only; the Beam job always writes it).
    return sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(files.split_pattern("train")),
                                                  compression_type="GZIP"))


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
    """Trains (or resumes) a run on `devices` (model.fit.devices: auto, cpu:N, gpu:N); evaluates; exports.

    base_dir: the trained deterministic run a "bella" run adapts (required for it, refused otherwise).
    """
    if (config.model.method == "bella") != (base_dir is not None):
        raise ValueError("method 'bella' adapts a trained deterministic run: give it (and only it) --base RUN_DIR")
    tc, ec, mc = config.train, config.eval, config.model
    out = training_loop.start_run(out_dir, config, tc.seed)
    files = data_folder.load_data_files(data_dir)
    featurizer = featurizer_for(files, mc)
    n_train = _num_train_examples(files)

    strategy = training_loop.training_strategy(devices, tc.batch_size, bella=base_dir is not None)
    policy = mixed_precision.resolve(tc.mixed_precision)
    mixed_precision.check(policy, tc.fast_weight_lr_multiplier)
    # The policy only matters while layers are created; it is not leaked to later code.
    with mixed_precision.policy_scope(policy), strategy.scope():
        model = build_model(mc, featurizer.vocab_size, featurizer.window_aggregate_dim)
    with strategy.scope():
        slow_rate = learning_rate(tc, tc.learning_rate)
        slow_opt = tf.keras.optimizers.Adam(slow_rate)
        fast_opt = tf.keras.optimizers.Adam(learning_rate(tc, tc.learning_rate * tc.fast_weight_lr_multiplier))
        if policy == mixed_precision.FLOAT16:  # one optimizer for every weight: one loss scale
            slow_opt = tf.keras.mixed_precision.LossScaleOptimizer(slow_opt)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    if mc.wide and mc.wide_posterior == "laplace" and model_checkpoint(out) is None:
        start_from_laplace_fit(model, files, featurizer, tc.seed)
    particles = _adapt_base(model, base_dir, data_dir, out, mc.particle_update, n_train) if base_dir else None
    log.info("training on %d replica(s) (%s), policy %s", strategy.num_replicas_in_sync,
             ", ".join(device_layout.device_names(devices)), policy)
    # Without a KL term annealing changes nothing, and the warm-up must not hold back the best checkpoint.
    has_kl = float(factory.kl_loss(model)) > 0.0
    settings = training_loop.LoopSettings.of(tc, name=config.name, max_steps=tc.max_steps, num_train_examples=n_train,
                                             kl_annealing_steps=tc.kl_annealing_steps if has_kl else 0,
                                             best_metric="mixture_nll")

    def train_data(start: int) -> tf.data.Dataset:
        return inputs.dataset(files, featurizer, "train", tc.batch_size, training=True,
                              seed=tc.seed * 1_000_003 + start, shuffle_buffer=tc.shuffle_buffer,
                              cache=tc.cache_featurized)

    # Without periodic validation the loop never calls it: building the validation dataset costs seconds.
    validator = (make_validator(model, inputs.dataset(files, featurizer, "validation", ec.batch_size),
                                tc.eval_samples, ec.num_bins) if tc.eval_every_steps else None)
    # The plateau schedule changes the optimizer's own rate between steps: log that, not the starting value.
    logged_rate = (lambda _: slow_opt.learning_rate) if tc.lr_schedule == "plateau" else slow_rate
    loop = training_loop.run(model, slow_opt=slow_opt, fast_opt=fast_opt, learning_rate=logged_rate,
                             step=step, strategy=strategy, train_data=train_data,
                             likelihood=BernoulliLikelihood(tc.loss), validate=validator, settings=settings,
                             out=out, particles=particles, progress=progress)

    export_dir, test_report = None, None
    if export_model:
        # Evaluate and export the best validated weights, not merely the last ones.
        loop.best.restore_into(model)
        export_dir, test_report = finalize(config, model, featurizer, files, out, progress=progress,
                                           truth_path=truth_path)
    return TrainResult(out, loop.step, loop.history, loop.validation, loop.best.to_dict(), export_dir, test_report)


def start_from_laplace_fit(model: tf.keras.Model, files: data_folder.DataFiles, featurizer: inputs.Featurizer,
                           seed: int) -> None:
    """Fits the wide part's logistic regression and Laplace posterior (model.ehr.wide); the LSTM's output starts at 0."""
    fit = fit_laplace(*(read_features(files, split, featurizer) for split in ("train", "validation")), seed=seed)
    log.info("wide part: logistic regression %s, validation NLL %.4f, Laplace posterior over %d columns",
             fit.params, fit.validation_nll, int(np.count_nonzero(np.abs(fit.scale).sum(axis=0))))
    model.wide.set_fit(fit)
    # The model starts as the fitted regression: the LSTM head's output and bias add nothing yet.
    for variable in model.output_layer.variables:
        if variable.name.endswith("/kernel:0") or "bias" in variable.name:
            variable.assign(tf.zeros_like(variable))


def featurizer_for(files: data_folder.DataFiles, mc: ModelConfig) -> inputs.Featurizer:
    """The data folder's featurizer, writing the window aggregates when the model has a wide part."""
    return inputs.Featurizer.from_data_files(files, window_hours=mc.wide_window_hours if mc.wide else None,
                                             time_inputs=mc.time_inputs)


@dataclasses.dataclass(frozen=True)
class BernoulliLikelihood:
    """The EHR model's likelihood (model.fit.training_loop.Likelihood): Bernoulli NLL of logits [B, K]."""

    kind: str  # train.loss: "average" (per-member, App. D.4) or "mixture" (D.5)

    def nll(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """The training NLL, nats per example."""
        return losses.nll_loss(logits, labels, self.kind)

    def member_nll(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Each member's mean NLL, [K]."""
        return losses.member_nll(logits, labels)

    def stats(self, logits: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """No extra training scalars."""
        return {}


def _adapt_base(model, base_dir, data_dir, out: pathlib.Path, update: str, n_train: int) -> bella.ParticleUpdate:
    """Loads the base run's weights into a Bella model, freezes them and records the base's checksum."""
    base_config, base_model, _, base_step = load_run(base_dir, data_dir)
    if base_config.model.method != "deterministic":
        raise ValueError(f"{base_dir}: a Bella base must be a deterministic run, not {base_config.model.method!r}")
    return bella.adapt_base(model, base_model, bella.base_record(base_dir, model_checkpoint(base_dir), base_step),
                            out, update, n_train)


def load_run(out_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str]
             ) -> tuple[ExperimentConfig, tf.keras.Model, inputs.Featurizer, int]:
    """(config, model restored from the best validated (else newest) checkpoint, featurizer, step) of a run."""
    out = pathlib.Path(out_dir)
    config = parse_config(json.loads((out / CONFIG_FILE).read_text()), source=str(out / CONFIG_FILE))
    files = data_folder.load_data_files(data_dir)
    featurizer = featurizer_for(files, config.model)
    model = build_model(config.model, featurizer.vocab_size, featurizer.window_aggregate_dim)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    latest = model_checkpoint(out)
    if latest is None:
        raise FileNotFoundError(f"{out}: no checkpoint in {CHECKPOINT_DIR}/")
    # expect_partial: the optimizers' slots are in the checkpoint but not needed here.
    tf.train.Checkpoint(model=model, step=step).restore(latest).expect_partial()
    return config, model, featurizer, int(step.numpy())


def finalize(config: ExperimentConfig, model: tf.keras.Model, featurizer: inputs.Featurizer,
             files: data_folder.DataFiles, out: pathlib.Path, *, progress: bool = False,
             truth_path: str | os.PathLike[str] | None = None) -> tuple[pathlib.Path, dict]:
    """Final evaluation (seeded, S samples): referral threshold on validation, test report, export."""
    ec = config.eval
    predictor = Predictor(featurizer, model)
    reports = {}
    threshold = None
    validation_mi = None
    measure, choice = ec.referral_measure, None
    for split in ("validation", "test"):
        split_records = data_folder.read_split(files, split)
        records, labels, hadm_ids = split_records.records, split_records.labels, split_records.hadm_ids
        probs = predict_probs(predictor, records, ec.num_samples, ec.seed, batch_size=ec.batch_size,
                              progress=progress)
        if threshold is None:  # validation comes first: the measure and threshold are chosen there, used everywhere
            choice = referral_choice.choose(probs, labels)
            measure = choice["measure"] if ec.referral_measure == "auto" else ec.referral_measure
            if ec.referral_measure != "auto":
                choice = {**choice, "configured": True}
            threshold = evaluation.referral_threshold(probs, ec.referral_rate, measure)
            validation_mi = metrics.mutual_information(probs)
        truth = evaluation.load_truth(truth_path, hadm_ids) if truth_path is not None else None
        report = evaluation.evaluate_predictions(
            probs, labels, model.ensemble_size, ec.num_samples, threshold=threshold, measure=measure,
            rate=ec.referral_rate, truth=truth, num_bins=ec.num_bins, n_bootstrap=ec.n_bootstrap, seed=ec.seed)
        evaluation.write_report(out / EVAL_DIR / split, report, probs, labels, hadm_ids, measure, ec.num_bins)
        reports[split] = report
    metrics_doc = evaluation.metrics_document(reports["test"], measure=measure, rate=ec.referral_rate,
                                              threshold=threshold, choice=choice)
    card = export_writer.model_card(
        name=config.name, method=_method_name(config), ensemble_size=model.ensemble_size,
        data_sha256=data_folder.manifest_sha256(files.data_dir), metrics_doc=metrics_doc,
        config=config.to_dict(), num_parameters=count_parameters(model), base=bella.read_base_record(out))
    # The training population and the validation split's mutual information travel with the model:
    # the shift report and the service's monitor compare new data with them.
    reference = against_reference.reference_profile(files, validation_mi=validation_mi, samples=ec.num_samples)
    # The export belongs to the run: a resumed run replaces its own (output_folder refuses any other folder).
    export_dir = export_writer.write_export(out / EXPORT_DIR, predictor, data_dir=files.data_dir,
                                            pipeline_config=files.pipeline_config, card=card, metrics_doc=metrics_doc,
                                            reference=reference, overwrite=True)
    return export_dir, reports["test"]


def _method_name(config: ExperimentConfig) -> str:
    """'rank1_normal' / 'rank1_cauchy' for rank-1 runs, 'bella_ensemble' / 'bella_svgd', the method otherwise."""
    m = config.model
    if m.method == "bella":
        return f"bella_{m.particle_update}"
    return f"rank1_{m.distribution}" if m.method == "rank1" else m.method
