"""The prediction use case: requests -> encoded examples -> micro-batched forward passes -> predictions.

/v1/predict, /v1/predict/batch, the FHIR operation and the CDS Hooks services all call
``predict_admissions``: each request is encoded by ``serving.inference.encoding`` (the training data's own
bagging), run through the micro-batcher, summarised by ``serving.inference.served_model.summarise``, counted in
the metrics and recorded by the population monitor. The routes only translate HTTP in and out.
"""
from __future__ import annotations

import asyncio

import numpy as np
from starlette.concurrency import run_in_threadpool

from model.export.load import Export
from serving.inference import admission_type
from serving.inference.batching import Arrival, MicroBatcher
from serving.inference.encoding import Encoded, encode
from serving.monitoring.telemetry import ServiceMetrics
from serving.monitoring.monitor import Monitor
from serving.monitoring.outcome_store import OutcomeStore
from serving.inference.served_model import ServedModel, Summary, summarise
from serving.schemas import (
    Calibration,
    EventCounts,
    InputError,
    Interval,
    ModelIdentity,
    OutOfVocabulary,
    PatientPrediction,
    PredictRequest,
    Referral,
)
from serving.settings import Settings

# Up to this many events per request are bagged on the event loop (~1 ms per 100 events).
INLINE_ENCODE_EVENTS = 2000


def model_identity(predictor: ServedModel, selected_by: str = "default") -> ModelIdentity:
    """Name, version, checksum and served precision of the version that answered, and how it was chosen."""
    return ModelIdentity(name=predictor.name, version=predictor.version, checksum=predictor.export.checksum,
                         precision=predictor.precision, selected_by=selected_by)


def calibration(export: Export) -> Calibration:
    """The export's ECE and NLL and the admissions they were measured on, as its metrics.json states them.

    metrics.json's "test" names its split and whether it was held out. An export written before it did
    is read by what made it: an updated one (adaptation.json) scored the local admissions it was fitted
    on, as every ehr-adapt method did; a trained or ensemble one, its data's test split.
    """
    test, adaptation = export.metrics.test, export.adaptation
    held_out = test.held_out if test.held_out is not None else adaptation is None
    if held_out:
        n, split = test.n, test.split or "test"
        source = f"the held-out {split} split" + (f" ({n} admissions)" if n is not None else "")
    else:
        local = (adaptation.model_extra or {}).get("local_data", {}) if adaptation is not None else {}
        n = test.n if test.n is not None or adaptation is None else adaptation.n
        split = test.split or local.get("split") or "local"
        source = (f"the {'' if n is None else f'{n} '}local admissions ({split} split) the update was fitted on: "
                  "in-sample, not held out")
    return Calibration(split=split, held_out=held_out, admissions=n, source=source, ece=test.ece, nll=test.nll)


def resolve_num_samples(requested: int | None, settings: Settings) -> int:
    """Samples per ensemble member: the request's, else the server's default; InputError above the limit."""
    if requested is None:
        return settings.default_num_samples
    if requested > settings.max_num_samples:
        raise InputError(("query", "num_samples"), f"num_samples must be at most {settings.max_num_samples}, "
                                                   f"got {requested}", "less_than_equal")
    return requested


def check_event_limit(request: PredictRequest, settings: Settings, loc: tuple[str | int, ...]) -> None:
    """InputError naming loc's events when a request holds more events than the server takes."""
    if len(request.events) > settings.max_events:
        raise InputError(loc + ("events",), f"at most {settings.max_events} events per patient, got "
                                            f"{len(request.events)}", "too_long")


async def predict_admissions(
    requests: list[PredictRequest],
    locs: list[tuple[str | int, ...]],
    *,
    num_samples: int,
    seed: int | None,
    include_samples: bool,
    predictor: ServedModel,
    batcher: MicroBatcher,
    arrival: Arrival,
    metrics: ServiceMetrics,
    monitor: Monitor | None = None,
    outcomes: OutcomeStore | None = None,
) -> list[PatientPrediction]:
    """Encodes, runs (micro-batched) and summarises requests; predictions in request order (each joins the monitor).

    A request without an admission type is encoded once per training type and its samples are
    drawn from each in proportion to the type's training frequency (serving.inference.admission_type).
    """
    export = predictor.export
    for r, loc in zip(requests, locs):
        admission_type.check(r, export, loc)
    unknown = {i for i, r in enumerate(requests) if r.admission.admission_type is None}
    allocation = admission_type.allocate(export.admission_types, num_samples) if unknown else []
    # (request index, type to encode it with or None for its own, samples per member)
    jobs = [(i, None, num_samples) for i, r in enumerate(requests) if r.admission.admission_type is not None]
    jobs += [(i, t, n) for t, n in allocation for i in sorted(unknown)]
    variants = await _encode_jobs(requests, locs, jobs, export)
    rows = await _run_jobs(jobs, variants, batcher, seed, arrival)
    probs = np.stack([admission_type.mixed([rows[i, t] for t, _ in allocation]) if i in unknown else rows[i, None]
                      for i in range(len(requests))])
    first = {}
    for j, (i, _, _) in enumerate(jobs):
        first.setdefault(i, variants[j])
    encoded = [first[i] for i in range(len(requests))]
    s = summarise(probs, export, num_samples)
    mixed_warning = [admission_type.warning(export.admission_types, allocation, num_samples)] if unknown else []
    out = []
    for i, (req, enc) in enumerate(zip(requests, encoded)):
        mixed = i in unknown
        out.append(_prediction(req, enc, s, i, export, warnings=[*enc.warnings, *mixed_warning] if mixed
                               else enc.warnings, samples=probs[i] if include_samples else None))
        _count_inputs(enc, metrics, [*enc.warning_kinds, *([admission_type.KIND] if mixed else [])])
        if monitor is not None:
            monitor.record(enc.context, enc.bags, enc.unit_rows, float(s.epistemic[i]), probs[i])
    metrics.predictions.inc(len(out))
    metrics.referrals.inc(sum(p.refer for p in out))
    if outcomes is not None:
        # Off the event loop: the row is on disk (fsync) before the answer names it.
        ids = await run_in_threadpool(outcomes.record_predictions,
                                      export.card.version, [p.probability for p in out], probs,
                                      [e.example for e in encoded], model_checksum=export.checksum)
        out = [p.model_copy(update={"prediction_id": i}) for p, i in zip(out, ids)]
    return out


async def _encode_jobs(requests: list[PredictRequest], locs: list[tuple[str | int, ...]],
                       jobs: list[tuple[int, str | None, int]], export: Export) -> list[Encoded]:
    """Each job's request encoded (with the job's admission type where it names one), in job order."""
    def encode_all() -> list[Encoded]:
        return [encode(_with_type(requests[i], t), export, locs[i]) for i, t, _ in jobs]

    if sum(len(requests[i].events) for i, _, _ in jobs) <= INLINE_ENCODE_EVENTS:
        # Small inputs are bagged right here: pure-Python work gains nothing from a thread
        # (the GIL), and many threads would starve the event loop of it under load.
        return encode_all()
    return await run_in_threadpool(encode_all)  # a big input would stall every other request for its whole encoding


async def _run_jobs(jobs: list[tuple[int, str | None, int]], variants: list[Encoded], batcher: MicroBatcher,
                    seed: int | None, arrival: Arrival) -> dict[tuple[int, str | None], np.ndarray]:
    """(request, type encoded) -> its sampled probabilities; one forward pass per distinct sample count."""
    groups: dict[int, list[int]] = {}  # samples per member -> positions in jobs (one forward pass each)
    for j, (_, _, n) in enumerate(jobs):
        groups.setdefault(n, []).append(j)
    results = await asyncio.gather(*(batcher.submit([variants[j].example for j in js], n, seed, arrival=arrival)
                                     for n, js in groups.items()))
    rows: dict[tuple[int, str | None], np.ndarray] = {}
    for js, probs_n in zip(groups.values(), results):
        for j, row in zip(js, probs_n):
            rows[jobs[j][:2]] = row
    return rows


def _prediction(req: PredictRequest, enc: Encoded, s: Summary, i: int, export: Export, *, warnings: list[str],
                samples: np.ndarray | None) -> PatientPrediction:
    """The answer for request i of a summarised batch."""
    policy = export.metrics.referral
    return PatientPrediction(
        id=req.id,
        probability=float(s.probability[i]),
        std=float(s.std[i]),
        interval=Interval(lower=float(s.lower[i]), upper=float(s.upper[i])),
        predictive_entropy=float(s.predictive_entropy[i]),
        aleatoric=float(s.aleatoric[i]),
        epistemic=float(s.epistemic[i]),
        member_probabilities=[float(v) for v in s.members[i]],
        decision_threshold=export.metrics.decision_threshold,
        predicted_positive=bool(s.predicted_positive[i]),
        samples_across_threshold=float(s.across_threshold[i]),
        refer=bool(s.refer[i]),
        referral=Referral(refer=bool(s.refer[i]), measure=policy.measure, value=float(s.referral_value[i]),
                          threshold=policy.threshold, rate=policy.rate),
        events=EventCounts(received=enc.events_received, used=enc.events_used, ignored=enc.ignored,
                           values=enc.unit_outcomes),
        out_of_vocabulary=OutOfVocabulary(count=enc.oov_count, codes=enc.oov_codes),
        prediction_time=enc.prediction_time,
        age_years=enc.age_years,
        warnings=warnings,
        samples=[float(v) for v in samples] if samples is not None else None,
    )


def _count_inputs(enc: Encoded, metrics: ServiceMetrics, warning_kinds: list[str]) -> None:
    """What one request's input held, in the metrics: ignored events, unknown codes, warnings (counts only)."""
    for reason, n in enc.ignored.items():
        if n:
            metrics.events_ignored.labels(reason=reason).inc(n)
    metrics.oov_codes.inc(enc.oov_count)
    for kind in warning_kinds:
        metrics.input_warnings.labels(kind=kind).inc()


def _with_type(request: PredictRequest, admission_type_: str | None) -> PredictRequest:
    """The request as sent (None), or with the admission type it did not know."""
    if admission_type_ is None:
        return request
    return request.model_copy(update={"admission": request.admission.model_copy(
        update={"admission_type": admission_type_})})
