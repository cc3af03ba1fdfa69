"""The use cases of ``ehr-eval`` and ``ehr-analyze shift``: a typed request in, a report out.

``evaluate_exports`` scores exports (several: a deep ensemble) on a split of a data folder;
``evaluate_baseline`` reports a baseline like a model; ``run_shift`` compares a data folder with
an export's training population. Each reads the data folder once: every split's records are read
and parsed once (``model.data_folder.read_split``), and the predictions, the case attributes,
the MEDS ids and the population profile all come from that one parse.

The road of a data folder here: the folder checked against its manifest
(``ehr_pipeline.contract.integrity``) -> its units against the model's (``unit_check``) -> its
side files and splits (``model.data_folder``) -> the predictions (``model.export.predict``) ->
the report (``evaluate``, ``clinical_stats``) -> the files (``evaluate.write_report``,
``against_reference.write_outputs``, ``model.export.write`` for an ensemble).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ehr_pipeline.contract import SPLIT_NAMES, integrity, output_folder
from ehr_pipeline.meds import labels as meds_labels
from ehr_pipeline.shift import Profile, population
from model import data_folder
from model.export_layout import MAX_SAMPLES, REFERENCE_PROFILE
from model.data_folder import DataFiles, SplitRecords
from model.evaluation import against_reference, evaluate, unit_check
from model.evaluation.statistics import clinical_stats, metrics, metrics_report, referral_choice, small_sample
from model.evaluation.against_reference import ShiftResult
from model.evaluation.report.performance_table import estimate_markdown
from model.export import write as export_writer
from model.export.load import LoadedExport, check_export, load_export, read_export
from model.export.predict import predict_probs

log = logging.getLogger(__name__)

# metrics.json's key of the expected performance beside the realized one, and its table's file.
PERFORMANCE_KEY = "performance_estimate"
PERFORMANCE_MD = "performance_estimate.md"

Measure = Literal["predictive_entropy", "mutual_information", "predictive_std"]


class ReportSettings(BaseModel):
    """What every evaluation report is made with: the split, the referral rule, the statistics, where it goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: pathlib.Path
    split: str = "test"
    seed: int = 0
    truth_path: pathlib.Path | None = None  # a known-truth CSV (HADM_ID, P_DEATH): synthetic data only
    referral_rate: float | None = Field(None, ge=0.0, le=1.0)  # None: the model's stored rule
    referral_measure: Measure | None = None
    n_bootstrap: int = Field(1000, gt=0)
    num_bins: int = Field(metrics.NUM_BINS, gt=0)
    out_dir: pathlib.Path | None = None
    overwrite: bool = False  # replace an earlier report in out_dir (and export in export_ensemble) whole
    target_coverage: float = Field(clinical_stats.TARGET_COVERAGE, gt=0.0, le=1.0)
    target_risk: float = Field(clinical_stats.TARGET_RISK, gt=0.0, lt=1.0)
    threshold: str = small_sample.DEFAULT_THRESHOLD  # a probability, or a rule on validation: small_sample.parse_rule

    @field_validator("threshold")
    @classmethod
    def _threshold_parses(cls, value: str) -> str:
        small_sample.parse_rule(value)
        return value

    def operating(self, validation: Callable[[], tuple[Any, Any]]) -> dict[str, Any]:
        """The operating threshold's record; validation() gives (p, y) of the validation split, read only for a
        rule."""
        rule = small_sample.parse_rule(self.threshold)
        return small_sample.choose_threshold(rule, *(validation() if rule.kind != "probability" else (None, None)))


class EvaluationRequest(ReportSettings):
    """Exports to evaluate (several: a deep ensemble, members side by side along K) and how."""

    model_dirs: tuple[pathlib.Path, ...] = Field(min_length=1)
    num_samples: int = Field(ge=1, le=MAX_SAMPLES)  # S per member
    batch_size: int = Field(64, gt=0)
    export_ensemble: pathlib.Path | None = None  # write the members as one deep-ensemble export here
    progress: bool = False
    force_units: bool = False  # score data whose units differ from the model's as they are


class BaselineRequest(ReportSettings):
    """A baseline of model.ehr.baselines to fit on train, choose on validation and report like a model."""

    kind: str


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What evaluate_exports found: the report, the shift report on other data, the ensemble export written."""

    report: dict[str, Any]
    shift: ShiftResult | None = None
    export_dir: pathlib.Path | None = None


@dataclasses.dataclass(frozen=True)
class _Scored:
    """One split as read, its records in the model's units, and the exports' probabilities [N, S*K] of them."""

    split: SplitRecords
    records: list[bytes]
    probs: np.ndarray


def _read_splits(files: DataFiles) -> dict[str, SplitRecords]:
    """Every split the data folder has, each read and parsed once."""
    splits = {}
    for name in SPLIT_NAMES:
        try:
            splits[name] = data_folder.read_split(files, name)
        except FileNotFoundError:
            continue
    return splits


def _score(request: EvaluationRequest, exports: Sequence[LoadedExport], splits: Mapping[str, SplitRecords],
           name: str, scoring_units: unit_check.ScoringUnits) -> _Scored:
    """The exports' probabilities of a split's records in the model's units; an empty split is a ValueError."""
    split = splits.get(name)
    if split is None or not len(split):
        raise ValueError(f"{request.data_dir}: the {name} split has no examples"
                         + (": nothing to evaluate" if name == request.split else
                            ", and the referral threshold is chosen on it (an ensemble, or a referral rate or "
                            "measure other than the model's stored rule)"))
    records = scoring_units.convert(split.records)
    probs = predict_probs(exports, records, request.num_samples, request.seed, batch_size=request.batch_size,
                          progress=request.progress)
    return _Scored(split, records, probs)


def _referral_rule(request: EvaluationRequest, exports: Sequence[LoadedExport],
                   validation: Callable[[], _Scored]) -> tuple[str, float, float]:
    """(measure, rate, threshold): a single model's stored rule unless the request changes it; an ensemble
    has none stored, so both measure and threshold are chosen on the validation split, as training does
    with referral_measure "auto" (the measure whose referral keeps the lowest Brier score)."""
    stored = exports[0].metrics.get("referral") if len(exports) == 1 else None
    rate = request.referral_rate if request.referral_rate is not None else (
        stored["rate"] if stored else metrics.DEFAULT_REFERRAL_RATE)
    if stored and request.referral_rate is None and request.referral_measure is None:
        threshold = float("-inf") if stored["threshold"] is None else float(stored["threshold"])
        return stored["measure"], rate, threshold
    if request.referral_measure or stored:
        measure = request.referral_measure or stored["measure"]
    else:
        scored = validation()
        measure = referral_choice.choose(scored.probs, scored.split.labels)["measure"]
        log.info("referral measure %s: chosen on the validation split by the Brier score of kept cases", measure)
    return measure, rate, evaluate.referral_threshold(validation().probs, rate, measure)


def evaluate_exports(request: EvaluationRequest) -> Evaluation:
    """Evaluates exports on a split: metrics, clinical statistics, population, model cards; files with out_dir.

    First the folder is checked against its manifest and the models' schema version, then its units against
    the models' (unit_check.plan_units; force_units scores them as they are).
    """
    # The folder is checked before any SavedModel is read (a load reads its whole graph library, seconds): the
    # exports' checked side files name the schema version their models were trained on.
    checked = [check_export(d)[1] for d in request.model_dirs]
    integrity.verify_folder(request.data_dir, SPLIT_NAMES,
                            models={str(e.directory): e.schema_version for e in checked})
    exports = [load_export(d) for d in request.model_dirs]
    scoring_units = unit_check.plan_units(exports, request.data_dir, force=request.force_units)
    files = data_folder.load_data_files(request.data_dir)
    splits = _read_splits(files)
    scored: dict[str, _Scored] = {}

    def scores(name: str) -> _Scored:
        if name not in scored:
            scored[name] = _score(request, exports, splits, name, scoring_units)
        return scored[name]

    measure, rate, threshold = _referral_rule(request, exports, lambda: scores("validation"))
    k = sum(e.ensemble_size for e in exports)

    def report_of(name: str) -> dict[str, Any]:
        got = scores(name)
        return evaluate.evaluate_predictions(
            got.probs, got.split.labels, k, request.num_samples, threshold=threshold, measure=measure, rate=rate,
            truth=_truth(request, got.split.hadm_ids), num_bins=request.num_bins, n_bootstrap=request.n_bootstrap,
            seed=request.seed)

    report = report_of(request.split)
    evaluated = scores(request.split)
    truth = _truth(request, evaluated.split.hadm_ids)
    operating = request.operating(lambda: (metrics.predictive_mean(scores("validation").probs),
                                           scores("validation").split.labels))
    referred = evaluate.add_clinical(
        report, evaluated.probs, evaluated.split.labels, measure=measure, threshold=threshold,
        attributes=evaluated.split.attributes, truth=truth, n_bootstrap=request.n_bootstrap, seed=request.seed,
        num_bins=request.num_bins, target_coverage=request.target_coverage, target_risk=request.target_risk,
        operating=operating)
    report[PERFORMANCE_KEY] = performance_beside_outcomes(
        evaluated.probs, evaluated.split.labels, truth, decision_threshold=exports[0].files.metrics.decision_threshold,
        seed=request.seed)
    # A code is known only if every member knows it: one that does not reads it as out-of-vocabulary.
    known = frozenset.intersection(*(e.files.vocabulary for e in exports))
    report["population"] = evaluate.population(files, splits, known)
    report["model"] = evaluate.model_description(
        [e.model_card for e in exports], [e.metrics for e in exports], checksums=[e.files.checksum for e in exports],
        updates=[None if e.files.adaptation is None else e.files.adaptation.summary() for e in exports])
    data_sha = data_folder.manifest_sha256(files.data_dir)
    shifted = None
    if _trained_on_other_data(exports, data_sha):
        shifted = _shift_of_split(exports, request, evaluated, scoring_units.canonical)
    if request.out_dir is not None:
        with report_folder(request, [*request.model_dirs, request.data_dir]) as out:
            _write_outputs(request, out, report, evaluated, shifted, exports, data_sha=data_sha, measure=measure,
                           truth=truth, referred=referred, ensemble_size=k)
    export_dir = None
    if request.export_ensemble is not None:
        test_report = report if request.split == "test" else report_of("test")
        validation_probs = scored["validation"].probs if "validation" in scored else None
        export_dir = _export_ensemble(request, exports, test_report, validation_probs, measure=measure, rate=rate,
                                      threshold=threshold, data_sha=data_sha)
    return Evaluation(report, shifted, export_dir)


def performance_beside_outcomes(probs: np.ndarray, labels: Sequence[int], truth: np.ndarray | None, *,
                                decision_threshold: float, seed: int = 0) -> dict[str, Any]:
    """The performance the model expected on these cases before their labels, the realized one beside it and,
    with a known truth, the truth-expected one (outcomes drawn from it): metrics.json's performance_estimate."""
    thresholds = metrics_report.decision_thresholds(decision_threshold)
    estimate = metrics_report.estimate_performance(probs, thresholds=thresholds, seed=seed)
    p = metrics.predictive_mean(probs)
    out = {"estimate": estimate, "realized": metrics_report.realized_beside(estimate["posterior"], p, labels)}
    if truth is not None:
        out["truth_expected"] = metrics_report.expected_performance(p, truth, thresholds=thresholds, seed=seed)
    return out


def _truth(request: ReportSettings, hadm_ids: Sequence[int]) -> np.ndarray | None:
    return evaluate.load_truth(request.truth_path, hadm_ids) if request.truth_path is not None else None


def _trained_on_other_data(exports: Sequence[LoadedExport], data_sha: str) -> list[LoadedExport]:
    """The exports whose training data is not this folder (each said in the log)."""
    other = [e for e in exports if e.model_card.get("data_manifest_sha256") != data_sha]
    for e in other:
        log.warning("%s was trained on other data (data manifest checksum differs): evaluating anyway, with a "
                    "shift report of this data against the model's training population", e.path)
    return other


@contextlib.contextmanager
def report_folder(request: ReportSettings, inputs: Sequence[Any]) -> Iterator[pathlib.Path]:
    """The staging folder of request.out_dir: in place whole once the report is written (output_folder.staged)."""
    with output_folder.staged(request.out_dir, kind=output_folder.EVALUATION, command="ehr-eval",
                              overwrite=request.overwrite, inputs=[os.fspath(i) for i in inputs]) as staging:
        yield pathlib.Path(staging)


def _write_outputs(request: EvaluationRequest, out: pathlib.Path, report: dict, evaluated: _Scored,
                   shifted: ShiftResult | None, exports: Sequence[LoadedExport], *, data_sha: str, measure: str,
                   truth: np.ndarray | None, referred: np.ndarray, ensemble_size: int) -> None:
    """The report files of the evaluated split in `out`, its MEDS predictions and, on other data, its shift report."""
    split = evaluated.split
    shift = {"shift": {"level": shifted.report.level, "counts": shifted.report.counts()}} if shifted else {}
    extra = {"models": [str(e.path) for e in exports], "split": request.split, "seed": request.seed,
             "data_manifest_sha256": data_sha, **shift}
    evaluate.write_report(out, report, evaluated.probs, split.labels, split.hadm_ids, measure,
                          request.num_bins, extra=extra, truth=truth, attributes=split.attributes,
                          referred=referred, html=True)
    # The label row's own prediction time where the data was made from MEDS labels, so rows join back to it.
    times = meds_labels.exact_prediction_times(str(request.data_dir), split.hadm_ids, split.trigger_times)
    evaluate.write_meds_predictions(out / evaluate.MEDS_PREDICTIONS_FILE, evaluated.probs, split.labels,
                                    split.hadm_ids, split.subject_ids, times, ensemble_size, request.num_samples)
    if shifted is not None:
        against_reference.write_outputs(out, shifted)
    performance = report[PERFORMANCE_KEY]
    (out / PERFORMANCE_MD).write_text(estimate_markdown(performance["estimate"], performance["realized"],
                                                        performance.get("truth_expected")) + "\n", encoding="utf-8")


def _export_ensemble(request: EvaluationRequest, exports: Sequence[LoadedExport], test_report: Mapping[str, Any],
                     validation_probs: np.ndarray | None, *, measure: str, rate: float, threshold: float,
                     data_sha: str) -> pathlib.Path:
    """Joins the evaluated exports into one deep-ensemble export, with this evaluation as its metrics."""
    metrics_doc = evaluate.metrics_document(test_report, measure=measure, rate=rate, threshold=threshold)
    methods = sorted({e.model_card.get("method", "?") for e in exports})
    card = export_writer.model_card(
        name=f"deep_ensemble_{len(exports)}", method="deep_ensemble",
        ensemble_size=sum(e.ensemble_size for e in exports),
        data_sha256=exports[0].model_card.get("data_manifest_sha256", data_sha), metrics_doc=metrics_doc,
        members=[f"{e.model_card.get('name')} ({', '.join(methods)}) {e.path}" for e in exports])
    # The members' training population, with the ensemble's own validation mutual information.
    reference = exports[0].files.reference
    if reference is not None and validation_probs is not None:
        reference = reference.with_mutual_information(metrics.mutual_information(validation_probs),
                                                      request.num_samples)
    return export_writer.write_ensemble_export(request.export_ensemble, [e.path for e in exports], card=card,
                                               metrics_doc=metrics_doc, reference=reference,
                                               overwrite=request.overwrite, data_dir=request.data_dir,
                                               members=exports)


def _shift_of_split(exports: Sequence[LoadedExport], request: EvaluationRequest, evaluated: _Scored,
                    canonical: Mapping[str, str]) -> ShiftResult | None:
    """The shift report of the evaluated split (its values in `canonical` units) against the (first) export's
    reference; None when it has none."""
    export = exports[0].files
    if export.reference is None:
        log.warning("%s has no reference profile (exported before the shift report existed): no shift report; "
                    "`ehr-analyze shift --model %s --data %s --reference-data TRAINING_DATA` makes one",
                    export.directory, export.directory, request.data_dir)
        return None
    # The reference's mutual information is one export's: an ensemble's is not comparable with it.
    mi = metrics.mutual_information(evaluated.probs) if len(exports) == 1 else None
    current = against_reference.current_profile(
        export, export.reference, evaluated.records, str(request.data_dir), mutual_information=mi,
        samples=request.num_samples, description=f"{request.split} split of {request.data_dir}", canonical=canonical)
    return ShiftResult(against_reference.compare(export, export.reference, current), export.reference, current)


def evaluate_baseline(request: BaselineRequest, fit: Callable[..., Any]) -> dict[str, Any]:
    """Fits a baseline with `fit` (model.ehr.baselines.fit_baseline: the caller's, as training sits above
    evaluation) and reports it like a model (S = K = 1), with the same files; returns the report."""
    integrity.verify_folder(request.data_dir, SPLIT_NAMES)
    result = fit(request.data_dir, request.kind, request.seed, splits=tuple(dict.fromkeys(("validation",
                                                                                          request.split))))
    # One probability per case: mutual information is 0, so entropy is the default measure here.
    measure = request.referral_measure or "predictive_entropy"
    rate = metrics.DEFAULT_REFERRAL_RATE if request.referral_rate is None else request.referral_rate
    threshold = evaluate.referral_threshold(result.predictions["validation"].probs, rate, measure)
    pred = result.predictions[request.split]
    truth = _truth(request, pred.hadm_ids.tolist())
    report = evaluate.evaluate_predictions(pred.probs, pred.labels, 1, 1, threshold=threshold, measure=measure,
                                           rate=rate, truth=truth, num_bins=request.num_bins,
                                           n_bootstrap=request.n_bootstrap, seed=request.seed)
    report["baseline"] = {"kind": request.kind, "seed": request.seed, "params": result.params,
                          "validation_nll": result.validation_nll, "num_features": len(result.feature_names)}
    files = data_folder.load_data_files(request.data_dir)
    splits = _read_splits(files)
    attributes = evaluate.case_attributes(splits[request.split], pred.hadm_ids.tolist())
    validation = result.predictions["validation"]
    referred = evaluate.add_clinical(
        report, pred.probs, pred.labels, measure=measure, threshold=threshold, attributes=attributes, truth=truth,
        n_bootstrap=request.n_bootstrap, seed=request.seed, num_bins=request.num_bins,
        target_coverage=request.target_coverage, target_risk=request.target_risk,
        operating=request.operating(lambda: (metrics.predictive_mean(validation.probs), validation.labels)))
    # The baseline's candidate features are the data folder's vocabulary (built on its train split).
    features = {code for codes in files.vocabulary.values() for code in codes}
    report["population"] = evaluate.population(files, splits, features)
    if request.out_dir is not None:
        with report_folder(request, [request.data_dir]) as out:
            evaluate.write_report(out, report, pred.probs, pred.labels.tolist(), pred.hadm_ids.tolist(),
                                  measure, request.num_bins, extra={"split": request.split,
                                                                    "data": os.fspath(request.data_dir),
                                                                    "data_manifest_sha256":
                                                                        data_folder.manifest_sha256(request.data_dir)},
                                  truth=truth, attributes=attributes, referred=referred, html=True)
    return report


# ----------------------------------------------------------------------------- ehr-analyze shift


def reference_from_data(data_dir: str | os.PathLike[str], model: LoadedExport | None, *, samples: int, seed: int = 0,
                        batch_size: int = 64, progress: bool = False) -> Profile:
    """A reference made now from the data folder a model was trained on; model adds the validation split's MI."""
    files = data_folder.load_data_files(data_dir)
    mi = None
    if model is not None:
        records = data_folder.read_split(files, "validation").records
        probs = predict_probs(model, records, samples, seed, batch_size=batch_size, progress=progress)
        mi = metrics.mutual_information(probs)
    return against_reference.reference_profile(files, validation_mi=mi, samples=samples if mi is not None else None)


def run_shift(model_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str], *,
              splits: Sequence[str] = SPLIT_NAMES, use_model: bool = True, samples: int | None = None,
              seed: int = 0, batch_size: int = 64, reference_data: str | os.PathLike[str] | None = None,
              progress: bool = False) -> ShiftResult:
    """The shift report of `splits` of a data folder against an export (its reference, or one from reference_data)."""
    export = read_export(model_dir)
    if export.reference is None and reference_data is None:
        raise ValueError(f"{model_dir} has no {REFERENCE_PROFILE} (exported before the shift report existed): "
                         "pass --reference-data with the data folder it was trained on")
    models = {str(model_dir): export.schema_version}
    integrity.verify_folder(data_dir, splits, models=models)
    if reference_data is not None:
        integrity.verify_folder(reference_data, ("train", "validation"), models=models)
    loaded = load_export(model_dir) if use_model else None
    records: list[bytes] = []
    for split in splits:
        try:
            records += population.read_records(data_dir, split)
        except FileNotFoundError:
            log.warning("%s has no %s split: left out", data_dir, split)
    if not records:
        raise FileNotFoundError(f"{data_dir}: no examples in the splits {list(splits)}")
    if reference_data is not None:
        if export.card_raw.get("data_manifest_sha256") not in (None, data_folder.manifest_sha256(reference_data)):
            log.warning("%s is not the data %s was trained on (data manifest checksum differs): the reference "
                        "describes it, not the model's training data", reference_data, export.directory)
        reference = reference_from_data(reference_data, loaded, samples=samples or 25, seed=seed,
                                        batch_size=batch_size, progress=progress)
    else:
        reference = export.reference
    mi = None
    estimate = None
    s = samples or reference.mi_samples or 25
    if loaded is not None:
        log.info("scoring %d admissions (S = %d) for the model's mutual information and expected performance",
                 len(records), s)
        probs = predict_probs(loaded, records, s, seed, batch_size=batch_size, progress=progress)
        if reference.mutual_information is not None:
            mi = metrics.mutual_information(probs)
        estimate = metrics_report.estimate_performance(
            probs, thresholds=metrics_report.decision_thresholds(export.metrics.decision_threshold), seed=seed)
    current = against_reference.current_profile(export, reference, records, data_dir, mutual_information=mi,
                                                samples=s, description=f"{', '.join(splits)} of {data_dir}")
    return ShiftResult(against_reference.compare(export, reference, current), reference, current, estimate)
