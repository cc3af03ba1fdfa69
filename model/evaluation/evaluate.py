"""Evaluation of predictions [N, S*K]: metrics (model.evaluation.statistics), referral at a stored threshold, plots.

Shared by ``ehr-eval`` and by the trainer's final evaluation. Every number comes from
``model.evaluation.statistics.metrics``; this module only gathers predictions, picks the referral threshold on
validation and writes the report files.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import ehr_base
from ehr_pipeline.shift import population as population_stats
from model.evaluation import dataset_identity
from model.evaluation.report import plots, report_html
from model.evaluation.statistics import against_truth, clinical_stats, curves, metrics, metrics_report
from model.evaluation.statistics import paired_clinical, referral_choice, small_sample
from model.export_layout import DECISION_THRESHOLD, UNCERTAINTY_MEASURES, json_ready

if TYPE_CHECKING:  # annotations only: reading a data folder needs TensorFlow, writing a report does not
    from model.data_folder import DataFiles, SplitRecords

log = logging.getLogger(__name__)

REPORT_FILE = "metrics.json"
PLOT_FILES = {"reliability": "reliability.png", "uncertainty_vs_error": "uncertainty_vs_error.png",
              "risk_coverage": "risk_coverage.png", "uncertainty_histogram": "uncertainty_histogram.png"}
# Written only with a known truth: kept cases' error vs truth against the referral rate.
TRUTH_PLOT_FILE = "referral_vs_truth.png"
PREDICTIONS_FILE = "predictions.csv"
# The same cases in meds-evaluation's prediction schema (MEDS label columns + predicted_boolean_*):
# `meds-evaluation-cli predictions_path=...`. That schema refuses extra columns, so the uncertainty
# measures and hadm_id go beside it, row for row, keyed by the same subject_id and prediction_time.
MEDS_PREDICTIONS_FILE = "predictions.meds.parquet"
MEDS_UNCERTAINTY_FILE = "predictions.meds_uncertainty.parquet"
COMPARISON_FILE = "comparison.json"
# The one page a clinical reviewer reads (model.evaluation.report.report_html renders metrics.json / comparison.json).
REPORT_HTML = "report.html"
# predictions.csv columns of who each case is (from its SequenceExample), for --compare's subgroups.
ATTRIBUTE_COLUMNS = {"gender": "GENDER", "age_years": "AGE_YEARS", "admission_type": "ADMISSION_TYPE",
                     "ethnicity": "ETHNICITY", "insurance": "INSURANCE"}
REFERRED_COLUMN = "REFERRED"
# Quantiles of the S x K sampled probabilities kept per case in predictions.csv: the ends of
# the central 50 / 80 / 95 % intervals, so coverage can be recomputed from the file.
PREDICTION_QUANTILES: tuple[float, ...] = tuple(
    q for level in against_truth.COVERAGE_LEVELS for q in ((1.0 - level) / 2.0, (1.0 + level) / 2.0))
# Headline numbers of the truth report that go into summaries and export metrics.json.
TRUTH_SUMMARY_KEYS = ("mae", "rmse", "nll_truth", "nll_excess", "kl_truth", "coverage")


def load_truth(path: str | os.PathLike[str], hadm_ids: Sequence[int]) -> np.ndarray:
    """P_DEATH per admission from a known-truth CSV (HADM_ID,P_DEATH,...), in the order of hadm_ids."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing_cols = {"HADM_ID", "P_DEATH"} - set(reader.fieldnames or ())
        if missing_cols:
            raise ValueError(f"{path}: truth CSV lacks columns {sorted(missing_cols)}")
        truth = {int(row["HADM_ID"]): float(row["P_DEATH"]) for row in reader}
    absent = [h for h in hadm_ids if int(h) not in truth]
    if absent:
        raise ValueError(f"{path}: no P_DEATH for {len(absent)} admissions, e.g. HADM_ID {absent[:3]}")
    return np.array([truth[int(h)] for h in hadm_ids], dtype=np.float64)


def referral_threshold(probs: np.ndarray, rate: float, measure: str) -> float:
    """Uncertainty threshold (measure in UNCERTAINTY_MEASURES) referring at most `rate` of these cases."""
    return float(metrics.referral_threshold(metrics.uncertainties(probs)[measure], rate))


def referral_report(probs: np.ndarray, labels: np.ndarray, threshold: float, measure: str, rate: float,
                    num_bins: int = metrics.NUM_BINS) -> dict[str, Any]:
    """What a stored validation threshold does on these cases: fraction referred, metrics of the kept ones."""
    u = metrics.uncertainties(probs)[measure]
    referred = metrics.refer(u, threshold)
    kept = ~referred
    p = metrics.predictive_mean(probs)
    return json_ready({
        "measure": measure, "rate": rate, "threshold": threshold,
        "referred_fraction": float(referred.mean()) if referred.size else 0.0,
        "kept": metrics.scalar_metrics(p[kept], labels[kept], num_bins),
    })


def evaluate_predictions(probs: np.ndarray, labels: Sequence[int], ensemble_size: int, num_samples: int, *,
                         threshold: float, measure: str, rate: float, truth: np.ndarray | None = None,
                         num_bins: int = metrics.NUM_BINS, n_bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """metrics_report.evaluate's report plus "referral" at the given (validation-chosen) threshold."""
    y = np.asarray(labels)
    if np.any((y != 0) & (y != 1)):
        raise ValueError("labels must be 0/1 for evaluation (unknown labels, -1, are serving-only)")
    report = metrics_report.evaluate(probs, y, ensemble_size, num_samples, truth, num_bins=num_bins,
                              n_bootstrap=n_bootstrap, seed=seed)
    report["referral"] = referral_report(probs, y, threshold, measure, rate, num_bins)
    return report


def write_report(out_dir: str | os.PathLike[str], report: Mapping[str, Any], probs: np.ndarray,
                 labels: Sequence[int], hadm_ids: Sequence[int], measure: str, num_bins: int = metrics.NUM_BINS,
                 extra: Mapping[str, Any] | None = None, truth: np.ndarray | None = None,
                 attributes: Mapping[str, np.ndarray] | None = None, referred: np.ndarray | None = None,
                 html: bool = False) -> dict[str, pathlib.Path]:
    """Writes metrics.json, the PNG plots, predictions.csv (one row per case) and with html report.html; returns paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    y = np.asarray(labels, dtype=np.float64)
    p = metrics.predictive_mean(probs)
    u = metrics.uncertainties(probs)
    doc = {**report, "software_version": ehr_base.__version__}
    if extra:
        doc.update(extra)
    paths = {"metrics": out / REPORT_FILE}
    with open(paths["metrics"], "w", encoding="utf-8") as f:
        json.dump(json_ready(doc), f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")
    paths["reliability"] = plots.reliability_diagram(metrics.calibration_bins(p, y, num_bins),
                                                     float(metrics.ece(p, y, num_bins)),
                                                     path=out / PLOT_FILES["reliability"])
    paths["uncertainty_vs_error"] = plots.uncertainty_vs_error(
        metrics.error_by_uncertainty(p, y, u[measure]), path=out / PLOT_FILES["uncertainty_vs_error"], name=measure)
    paths["risk_coverage"] = plots.risk_coverage_plot(report["selective"], path=out / PLOT_FILES["risk_coverage"])
    correct = (p > 0.5) == (y > 0.5)
    paths["uncertainty_histogram"] = plots.uncertainty_histogram(
        u[measure], correct, path=out / PLOT_FILES["uncertainty_histogram"], name=measure)
    if report.get("truth"):
        paths["referral_vs_truth"] = plots.referral_vs_truth_plot(report["truth"]["selective"],
                                                                  path=out / TRUTH_PLOT_FILE)
    paths["predictions"] = write_predictions(out / PREDICTIONS_FILE, probs, labels, hadm_ids, report["K"],
                                             report["S"], truth, attributes, referred)
    if html:
        paths["report"] = report_html.write(out / REPORT_HTML, json_ready(doc))
    return paths


def write_meds_predictions(path: str | os.PathLike[str], probs: np.ndarray, labels: Sequence[int],
                           hadm_ids: Sequence[int], subject_ids: Sequence[int], prediction_times_us: Sequence[int],
                           ensemble_size: int, num_samples: int) -> pathlib.Path:
    """predictions.meds.parquet: subject_id, prediction_time (microseconds: the label row's own, so rows join back
    to their label rows; meds_labels.exact_prediction_times), boolean_value, the predictive
    mean as predicted_boolean_probability, p > DECISION_THRESHOLD as predicted_boolean_value; every uncertainty
    measure in MEDS_UNCERTAINTY_FILE beside it, row for row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = metrics.predictive_mean(probs)
    columns = {
        "subject_id": pa.array(subject_ids, pa.int64()),
        "prediction_time": pa.array(np.asarray(prediction_times_us, dtype=np.int64), pa.timestamp("us")),
        "boolean_value": pa.array(np.asarray(labels, dtype=np.int64) == 1, pa.bool_()),
        "predicted_boolean_value": pa.array(p > DECISION_THRESHOLD, pa.bool_()),
        "predicted_boolean_probability": pa.array(p, pa.float64()),
    }
    path = pathlib.Path(path)
    pq.write_table(pa.table(columns), path)
    beside = {"subject_id": columns["subject_id"], "prediction_time": columns["prediction_time"],
              "hadm_id": pa.array(hadm_ids, pa.int64())}
    for name, values in against_truth.all_uncertainties(probs, ensemble_size, num_samples).items():
        beside[name] = pa.array(values, pa.float64())
    pq.write_table(pa.table(beside), path.with_name(MEDS_UNCERTAINTY_FILE))
    return path


def write_predictions(path: str | os.PathLike[str], probs: np.ndarray, labels: Sequence[int],
                      hadm_ids: Sequence[int], ensemble_size: int, num_samples: int,
                      truth: np.ndarray | None = None, attributes: Mapping[str, np.ndarray] | None = None,
                      referred: np.ndarray | None = None) -> pathlib.Path:
    """predictions.csv: HADM_ID, LABEL, P_MEAN, [P_TRUTH], sample quantiles Q<q>, every uncertainty measure,
    [REFERRED (1 = referred by the validation-chosen rule)] and [who the case is: ATTRIBUTE_COLUMNS]."""
    measures = against_truth.all_uncertainties(probs, ensemble_size, num_samples)
    quantiles = np.quantile(probs, PREDICTION_QUANTILES, axis=1)
    p = metrics.predictive_mean(probs)
    who = [(ATTRIBUTE_COLUMNS[k], attributes[k]) for k in ATTRIBUTE_COLUMNS if attributes and k in attributes]
    columns = ["HADM_ID", "LABEL", "P_MEAN"] + (["P_TRUTH"] if truth is not None else [])
    columns += [f"Q{q:g}" for q in PREDICTION_QUANTILES] + list(measures)
    columns += ([REFERRED_COLUMN] if referred is not None else []) + [name for name, _ in who]
    path = pathlib.Path(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for i, h in enumerate(hadm_ids):
            row = [int(h), int(labels[i]), f"{p[i]:.6f}"] + ([f"{truth[i]:.6f}"] if truth is not None else [])
            row += [f"{v:.6f}" for v in quantiles[:, i]] + [f"{measures[name][i]:.6f}" for name in measures]
            row += [int(referred[i])] if referred is not None else []
            row += [f"{v[i]:.4f}" if isinstance(v[i], (float, np.floating)) else v[i] for _, v in who]
            writer.writerow(row)
    return path


@dataclasses.dataclass(frozen=True)
class Predictions:
    """One predictions.csv: per case id, label, predictive mean and (when written) the truth."""

    path: str
    hadm_ids: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N]
    p: np.ndarray  # float64 [N]
    truth: np.ndarray | None  # float64 [N], from the P_TRUTH column
    # Uncertainty measures (UNCERTAINTY_MEASURES columns the file has), float64 [N] each.
    uncertainties: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    referred: np.ndarray | None = None  # bool [N], from the REFERRED column
    attributes: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # ATTRIBUTE_COLUMNS present


def read_predictions(path: str | os.PathLike[str]) -> Predictions:
    """Reads a predictions.csv written by ehr-eval, the trainer or a baseline; errors name the file and row."""
    path = os.fspath(path)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"HADM_ID", "LABEL", "P_MEAN"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a predictions file, missing columns {sorted(missing)}")
        fields = set(reader.fieldnames or ())
        has_truth = "P_TRUTH" in fields
        measures = [m for m in UNCERTAINTY_MEASURES if m in fields]
        who = {k: c for k, c in ATTRIBUTE_COLUMNS.items() if c in fields}
        has_referred = REFERRED_COLUMN in fields
        rows, extra = [], []
        for line, row in enumerate(reader, start=2):
            try:
                rows.append((int(row["HADM_ID"]), int(row["LABEL"]), float(row["P_MEAN"]),
                             float(row["P_TRUTH"]) if has_truth else float("nan")))
                extra.append(([float(row[m]) for m in measures], int(row[REFERRED_COLUMN]) if has_referred else 0,
                              {k: float(row[c]) if k == "age_years" else row[c] for k, c in who.items()}))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}, row {line}: {err}") from None
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    if len(set(ids.tolist())) != ids.size:
        raise ValueError(f"{path}: HADM_ID repeated")
    return Predictions(
        path=path, hadm_ids=ids, labels=np.array([r[1] for r in rows], dtype=np.int64),
        p=np.array([r[2] for r in rows]), truth=np.array([r[3] for r in rows]) if has_truth else None,
        uncertainties={m: np.array([e[0][j] for e in extra]) for j, m in enumerate(measures)},
        referred=np.array([e[1] == 1 for e in extra]) if has_referred else None,
        attributes={k: np.array([e[2][k] for e in extra], dtype=np.float64 if k == "age_years" else object)
                    for k in who})


def _reordered(pred: Predictions, order: np.ndarray) -> Predictions:
    """The same predictions with every per-case array taken in `order`."""
    return dataclasses.replace(
        pred, hadm_ids=pred.hadm_ids[order], labels=pred.labels[order], p=pred.p[order],
        truth=None if pred.truth is None else pred.truth[order],
        uncertainties={k: v[order] for k, v in pred.uncertainties.items()},
        referred=None if pred.referred is None else pred.referred[order],
        attributes={k: v[order] for k, v in pred.attributes.items()})


def compare_predictions(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str], *,
                        truth_path: str | os.PathLike[str] | None = None, n_bootstrap: int = 1000, seed: int = 0,
                        num_bins: int = metrics.NUM_BINS, target_coverage: float = clinical_stats.TARGET_COVERAGE,
                        target_risk: float = clinical_stats.TARGET_RISK,
                        threshold: str = small_sample.DEFAULT_THRESHOLD) -> dict[str, Any]:
    """Paired bootstrap of model B minus model A (metrics_report.paired_bootstrap) on the cases both files hold.

    ``threshold``: ehr-eval --threshold; a rule needs a validation split, which two predictions files have not,
    so only a probability is applied (the record says so otherwise).

    The two files must hold the same admissions with the same labels (order may differ). The
    truth comes from ``truth_path`` or else from A's P_TRUTH column; without either,
    "truth_mae" is left out.
    """
    a, b = read_predictions(path_a), read_predictions(path_b)
    if set(a.hadm_ids.tolist()) != set(b.hadm_ids.tolist()):
        only_a = sorted(set(a.hadm_ids.tolist()) - set(b.hadm_ids.tolist()))[:3]
        only_b = sorted(set(b.hadm_ids.tolist()) - set(a.hadm_ids.tolist()))[:3]
        raise ValueError(f"{b.path}: not the admissions of {a.path} (only in A e.g. {only_a}, only in B e.g. {only_b})")
    order = np.argsort(b.hadm_ids)[np.searchsorted(np.sort(b.hadm_ids), a.hadm_ids)]
    if not np.array_equal(a.labels, b.labels[order]):
        raise ValueError(f"{b.path}: labels differ from {a.path} for the same HADM_IDs")
    truth = load_truth(truth_path, a.hadm_ids.tolist()) if truth_path is not None else a.truth
    b = _reordered(b, order)
    diffs = metrics_report.paired_bootstrap(a.p, b.p, a.labels, truth, n=n_bootstrap, seed=seed, num_bins=num_bins)
    settings = dict(truth=truth, n_bootstrap=n_bootstrap, seed=seed, num_bins=num_bins,
                    target_coverage=target_coverage, target_risk=target_risk,
                    operating=small_sample.choose_threshold(small_sample.parse_rule(threshold)))
    clinical = {"a": clinical_stats.clinical_report(a.p, a.labels, a.uncertainties, referred=a.referred,
                                                    attributes=a.attributes or None, **settings),
                "b": clinical_stats.clinical_report(b.p, b.labels, b.uncertainties, referred=b.referred,
                                                    attributes=b.attributes or None, **settings),
                "selective_difference": clinical_stats.paired_selective(
                    clinical_stats.error_loss(a.p, a.labels), {**a.uncertainties, clinical_stats.RISK_SCORE: a.p},
                    clinical_stats.error_loss(b.p, b.labels), {**b.uncertainties, clinical_stats.RISK_SCORE: b.p},
                    target_coverage=target_coverage, target_risk=target_risk, n_bootstrap=n_bootstrap, seed=seed),
                "paired_clinical": paired_clinical.paired_calibration_and_benefit(
                    a.p, b.p, a.labels, n_bootstrap=n_bootstrap, seed=seed),
                "absent_scores": paired_clinical.absent_scores(a.uncertainties, b.uncertainties)}
    # The ROC curve of each side, so the page's figure of both is drawn from this file alone.
    for side, pred in (("a", a), ("b", b)):
        clinical[side]["curves"] = curves.report_curves(pred.p, pred.labels)
    members = {side: _members_beside(path) for side, path in (("a", a.path), ("b", b.path))}
    return json_ready({"a": a.path, "b": b.path, "names": {"a": model_name(a.path), "b": model_name(b.path)},
                       "cards": {side: model_card_beside(path) for side, path in (("a", a.path), ("b", b.path))},
                       "software_version": ehr_base.__version__,
                       "data_manifest_sha256": _metrics_beside(a.path).get("data_manifest_sha256"),
                       "updates": {side: [m["update"] for m in ms if m.get("update")] for side, ms in members.items()},
                       "relation": update_relation(members["a"], members["b"]),
                       "population": _population_beside(a.path), "n": int(a.labels.size), "n_bootstrap": n_bootstrap, "seed": seed,
                       "difference": "b - a", "metrics": diffs, "truth_known": truth is not None,
                       "clinical": clinical})


def _metrics_beside(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The metrics.json ehr-eval wrote beside a predictions.csv, or {} (a file from elsewhere)."""
    beside = pathlib.Path(path).with_name(REPORT_FILE)
    if not beside.is_file():
        return {}
    with open(beside, encoding="utf-8") as f:
        return json.load(f)


def _members_beside(path: str | os.PathLike[str]) -> list[Mapping[str, Any]]:
    """The model_description members of the evaluation that wrote a predictions file ([] for a file from elsewhere)."""
    return list((_metrics_beside(path).get("model") or {}).get("members") or [])


def model_card_beside(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What identifies a predictions file's model, from the metrics.json beside it: an export's members (name,
    version, method, training data's manifest sha256, export checksum) or a baseline fitted on the spot (estimator,
    features, how its settings were chosen, the data it was fitted on); {"kind": "unknown"} for a file from
    elsewhere."""
    doc = _metrics_beside(path)
    dataset = ((doc.get("population") or {}).get("dataset") or {}).get("name")
    if doc.get("baseline"):
        b = doc["baseline"]
        tried = b.get("validation_nll") or {}
        return {"kind": "baseline", "estimator": b.get("kind"), "num_features": b.get("num_features"),
                "params": b.get("params"), "settings_tried": len(tried), "seed": b.get("seed"),
                "chosen_by": "lowest validation-split NLL", "training_data": dataset,
                "data_manifest_sha256": doc.get("data_manifest_sha256")}
    members = _members_beside(path)
    if not members:
        return {"kind": "unknown"}
    return {"kind": "export", "evaluated_on": dataset, "members": [
        {"name": m.get("name"), "version": m.get("version"), "method": ((m.get("config") or {}).get("model") or {})
         .get("method") or m.get("method"), "training_data_sha256": m.get("data_manifest_sha256"),
         "checksum": m.get("checksum"), "num_parameters": m.get("num_parameters")} for m in members]}


def model_name(path: str | os.PathLike[str]) -> str:
    """A predictions file's model as its model card names it ('name version', ' + ' between members), else its path."""
    members = _members_beside(path)
    names = [f"{m.get('name', '?')} {m.get('version', '')}".strip() for m in members]
    return " + ".join(names) if names else str(path)


def _population_beside(path: str | os.PathLike[str]) -> Mapping[str, Any] | None:
    """The cohort of the evaluation that wrote a predictions file, for the comparison's participants section."""
    return _metrics_beside(path).get("population")


def case_attributes(split: SplitRecords, hadm_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """A split's case attributes in the order of hadm_ids (report keys: gender, age_years, ...)."""
    position = {int(h): i for i, h in enumerate(split.hadm_ids)}
    missing = [h for h in hadm_ids if int(h) not in position]
    if missing:
        raise ValueError(f"no SequenceExample for {len(missing)} evaluated admissions, e.g. HADM_ID {missing[:3]}")
    rows = np.array([position[int(h)] for h in hadm_ids], dtype=np.int64)
    return {key: values[rows] for key, values in split.attributes.items()}


def population(files: DataFiles, splits: Mapping[str, SplitRecords], vocabulary: Collection[str]) -> dict[str, Any]:
    """clinical_stats.population_profile of a data folder (manifest, every split's cases) and the data's name;
    each split also counts its events whose code is outside `vocabulary` ("source:code", what the model knows)."""
    identity = dataset_identity.dataset_identity(files.manifest, dataset_identity.read_release_manifest(files.manifest))
    return {"dataset": identity, **clinical_stats.population_profile(files.manifest, {
        name: {**clinical_stats.split_characteristics(np.asarray(c.labels, np.int64), c.attributes,
                                                      np.asarray(c.trigger_times, np.int64), c.num_bags,
                                                      c.sources_present),
               "unknown_codes": population_stats.unknown_codes(c.code_events, vocabulary)}
        for name, c in splits.items()})}


def model_description(cards: Sequence[Mapping[str, Any]], metrics_docs: Sequence[Mapping[str, Any]], *,
                      checksums: Sequence[str] = (), updates: Sequence[Mapping[str, Any] | None] = ()) -> dict:
    """What the report says about the model(s): each member's card (method, size, config), its export's checksum,
    how it was updated at a new site (Adaptation.summary, none for a trained export), and stored referral rule."""
    keep = ("name", "method", "ensemble_size", "num_parameters", "version", "created", "data_manifest_sha256",
            "intended_use", "limitations", "config")
    members = [{k: card[k] for k in keep if k in card} for card in cards]
    for member, checksum in zip(members, checksums):
        member["checksum"] = checksum
    for member, update in zip(members, updates):
        if update is not None:
            member["update"] = dict(update)
    return {"members": members, "referral_rules": [dict(m.get("referral") or {}) for m in metrics_docs]}


def update_relation(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """{"updated": "a" | "b", "update": ...} when one side's model is the other's updated at a new site (its
    adaptation's parent checksum is the other's export checksum); None otherwise. a, b: model_description members."""
    for updated, mine, other in (("b", b, a), ("a", a, b)):
        parents = {m.get("checksum") for m in other} - {None}
        for member in mine:
            update = member.get("update")
            if update and update.get("parent_checksum") in parents:
                return {"updated": updated, "update": update}
    return None


def add_clinical(report: dict[str, Any], probs: np.ndarray, labels: Sequence[int], *, measure: str,
                 threshold: float, attributes: Mapping[str, np.ndarray] | None, truth: np.ndarray | None,
                 n_bootstrap: int, seed: int, num_bins: int, target_coverage: float,
                 target_risk: float, operating: Mapping[str, Any] | None = None) -> np.ndarray:
    """Puts clinical_stats.clinical_report into report["clinical"] (at the small_sample.choose_threshold record
    `operating`, None: the default); returns the referred mask it used."""
    u = metrics.uncertainties(probs)
    referred = metrics.refer(u[measure], threshold)
    report["clinical"] = clinical_stats.clinical_report(
        metrics.predictive_mean(probs), np.asarray(labels), u, referred=referred, attributes=attributes,
        truth=truth, n_bootstrap=n_bootstrap, seed=seed, num_bins=num_bins, target_coverage=target_coverage,
        target_risk=target_risk, operating=operating)
    # The decision-aligned view of referral (Brier of the kept cases), beside the 0/1 error one.
    report["clinical"]["selective_brier"] = json_ready(referral_choice.brier_selective(
        metrics.predictive_mean(probs), np.asarray(labels), {**u, clinical_stats.RISK_SCORE: metrics.predictive_mean(
            probs)}, target_coverage=target_coverage, n_bootstrap=n_bootstrap, seed=seed))
    report["clinical"]["curves"] = curves.report_curves(metrics.predictive_mean(probs), np.asarray(labels))
    return referred


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The headline numbers of a report (for model cards and tables)."""
    keys = ("ece", "nll", "auc_pr", "auc_roc", "brier", "accuracy")
    out = {k: report["overall"].get(k) for k in keys}
    out["per_component_nll"] = report["overall"].get("per_component_nll")
    out["n"] = report["n"]
    out["prevalence"] = report["prevalence"]
    if "truth" in report:
        out["truth"] = {k: report["truth"][k] for k in TRUTH_SUMMARY_KEYS if k in report["truth"]}
    return out


def metrics_document(test_report: Mapping[str, Any], *, measure: str, rate: float, threshold: float,
                     choice: Mapping[str, Any] | None = None) -> dict:
    """An export's metrics.json: the test summary, the referral rule chosen on validation, the decision threshold.

    ``choice``: referral_choice.choose on the validation split (with "configured": True where the config named
    the measure), recorded as referral.chosen_on_validation; None leaves it out (baselines, older callers).
    """
    referral = {"measure": measure, "rate": rate, "threshold": threshold}
    if choice is not None:
        referral["chosen_on_validation"] = json_ready(dict(choice))
    return {"test": summary(test_report), "referral": referral, "decision_threshold": DECISION_THRESHOLD}
