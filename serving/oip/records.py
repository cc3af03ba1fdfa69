"""Serialized SequenceExamples sent as they are (as TF Serving's users send them): checked, then scored.

A record that did not come through the service's own encoding (``serving.inference.encoding``) may have
been written by another version of the pipeline, for another model, or by hand. Before it reaches the
model it is read with the pipeline's own protos (``ehr_pipeline.contract.protos``) and checked against
the contract the export was trained on: the spec's schema version (when the client states it), every
context and sequence feature of ``ehr_pipeline.contract.spec`` with its kind, one value per context
feature, one step per bag in every sequence, a context that ``spec.AdmissionContext`` accepts, bags
that ``bagging.Bags`` accepts, codes of the export's code sources, and an admission type of its training
data. Codes outside the vocabulary are counted, as the JSON road counts them (they share the unknown
embedding), not refused.

Scored records then take the road every prediction takes: the micro-batcher, ``summarise``, the
metrics, the population monitor and, when the server keeps outcomes, the outcome store (the record
itself is the encoded admission, kept only with --outcome-keep-admissions).
"""
from __future__ import annotations

import dataclasses

import numpy as np
from google.protobuf.message import DecodeError
from starlette.concurrency import run_in_threadpool

from ehr_pipeline.contract import protos, spec
from ehr_pipeline.encode import bagging
from model.export.load import Export
from serving.inference.batching import Arrival, MicroBatcher
from serving.inference.served_model import Summary, summarise
from serving.monitoring.monitor import Monitor
from serving.monitoring.outcome_store import OutcomeStore
from serving.monitoring.telemetry import ServiceMetrics
from serving.oip.tensors import ProtocolError

_KINDS = {**{k: "int64_list" for k in spec.CONTEXT_INT}, **{k: "float_list" for k in spec.CONTEXT_FLOAT},
          **{k: "bytes_list" for k in spec.CONTEXT_BYTES}}
_SEQUENCE_KINDS = {**{k: "int64_list" for k in spec.SEQUENCE_INT}, **{k: "float_list" for k in spec.SEQUENCE_FLOAT},
                   **{k: "bytes_list" for k in spec.SEQUENCE_BYTES}}


@dataclasses.dataclass(frozen=True)
class CheckedRecord:
    """A record that passed the checks: its bytes as sent, and what the monitor and the answer read from it."""

    example: bytes
    context: spec.AdmissionContext
    bags: bagging.Bags
    oov_count: int  # distinct codes outside the export's vocabulary


def check_record(example: bytes, export: Export, where: str, schema_version: int | None) -> CheckedRecord:
    """The record checked against the export's contract; ProtocolError naming `where` and the feature."""
    trained = export.schema_version if export.schema_version is not None else spec.SCHEMA_VERSION
    if schema_version is not None and schema_version != trained:
        raise ProtocolError(f"{where}: schema_version {schema_version}, but the model was trained on records of "
                            f"schema_version {trained}")
    try:
        proto = protos.SequenceExample.FromString(example)
    except DecodeError:
        raise ProtocolError(f"{where}: not a serialized tf.train.SequenceExample") from None
    context = _context(proto, where)
    bags = _bags(proto, context[spec.NUM_BAGS], where)
    try:
        admission = spec.AdmissionContext.from_features({k: context[k] for k in spec.CONTEXT_INPUT_KEYS})
    except (ValueError, TypeError) as err:
        raise ProtocolError(f"{where}: context: {err}") from None
    known_types = export.admission_types
    if known_types and admission.admission_type not in known_types:
        raise ProtocolError(f"{where}: context {spec.ADMISSION_TYPE} {admission.admission_type[:40]!r} never occurs in "
                            f"this model's training data ({', '.join(sorted(known_types))})")
    distinct = set(bags.codes.tolist())
    sources = {c.split(spec.CODE_SEPARATOR, 1)[0] for c in export.vocabulary}
    foreign = sorted(c for c in distinct if c.split(spec.CODE_SEPARATOR, 1)[0] not in sources)
    if foreign:
        raise ProtocolError(f"{where}: {len(foreign)} code(s) of no source of the model's vocabulary "
                            f"({', '.join(sorted(sources))}), e.g. {foreign[0][:60]!r}")
    return CheckedRecord(example, admission, bags, sum(c not in export.vocabulary for c in distinct))


def admission_key(example: bytes) -> str | None:
    """The key a record's admission is routed by under a traffic split, 'subject=<id>|hadm=<id>' from its context;
    None when it is not a record with both ids (check_record then names what is wrong)."""
    try:
        features = protos.SequenceExample.FromString(example).context.feature
    except DecodeError:
        return None
    ids = [list(features[k].int64_list.value) if k in features else [] for k in (spec.SUBJECT_ID, spec.HADM_ID)]
    if any(len(v) != 1 for v in ids):
        return None
    return f"subject={ids[0][0]}|hadm={ids[1][0]}"


def _context(proto, where: str) -> dict:
    """Context feature -> its one value; every feature of the spec, of its kind, and no other."""
    features = proto.context.feature
    missing, unknown = sorted(set(_KINDS) - set(features)), sorted(set(features) - set(_KINDS))
    if missing or unknown:
        raise ProtocolError(f"{where}: context features: missing {missing}, unknown {unknown} (spec schema_version "
                            f"{spec.SCHEMA_VERSION})")
    out = {}
    for key, kind in _KINDS.items():
        feature = features[key]
        values = getattr(feature, kind).value if feature.WhichOneof("kind") == kind else None
        if values is None or len(values) != 1:
            raise ProtocolError(f"{where}: context feature {key!r} must hold one {kind} value")
        value = values[0]
        if kind == "bytes_list":
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(f"{where}: context feature {key!r} is not UTF-8 text") from None
        out[key] = value
    return out


def _bags(proto, num_bags: int, where: str) -> bagging.Bags:
    """The record's bags; every sequence feature of the spec with one step per bag, per-code lists of one length."""
    lists = proto.feature_lists.feature_list
    missing, unknown = sorted(set(_SEQUENCE_KINDS) - set(lists)), sorted(set(lists) - set(_SEQUENCE_KINDS))
    if missing or unknown:
        raise ProtocolError(f"{where}: sequence features: missing {missing}, unknown {unknown}")
    steps = {}
    for key, kind in _SEQUENCE_KINDS.items():
        feature_list = lists[key].feature
        if len(feature_list) != num_bags:
            raise ProtocolError(f"{where}: sequence feature {key!r} has {len(feature_list)} steps, "
                                f"{spec.NUM_BAGS} says {num_bags}")
        if any(f.WhichOneof("kind") not in (kind, None) for f in feature_list):
            raise ProtocolError(f"{where}: sequence feature {key!r} must hold {kind} values")
        steps[key] = [list(getattr(f, kind).value) for f in feature_list]
    if any(len(v) != 1 for v in steps[spec.BAG_OFFSET]):
        raise ProtocolError(f"{where}: sequence feature {spec.BAG_OFFSET!r} must hold one value per bag")
    lengths = [len(c) for c in steps[spec.BAG_CODES]]
    for key in _SEQUENCE_KINDS:
        if key != spec.BAG_OFFSET and [len(v) for v in steps[key]] != lengths:
            raise ProtocolError(f"{where}: sequence feature {key!r} must hold one value per code of each bag")
    try:
        codes = [c.decode("utf-8") for bag in steps[spec.BAG_CODES] for c in bag]
    except UnicodeDecodeError:
        raise ProtocolError(f"{where}: a code is not UTF-8 text") from None
    flat = {key: [v for bag in steps[key] for v in bag] for key in _SEQUENCE_KINDS if key != spec.BAG_OFFSET}
    try:
        return bagging.Bags(
            offset_seconds=np.asarray([v[0] for v in steps[spec.BAG_OFFSET]], np.int64),
            row_splits=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), codes=np.asarray(codes, object),
            counts=flat[spec.BAG_COUNTS], value_count=flat[spec.BAG_VALUE_COUNT], value_mean=flat[spec.BAG_VALUE_MEAN],
            value_last=flat[spec.BAG_VALUE_LAST], value_min=flat[spec.BAG_VALUE_MIN],
            value_max=flat[spec.BAG_VALUE_MAX],
            has_history_bag=False, n_events_used=int(sum(flat[spec.BAG_COUNTS])), n_dropped_by_reason={})
    except ValueError as err:
        raise ProtocolError(f"{where}: bags: {err}") from None


async def predict_records(records: list[CheckedRecord], *, num_samples: int, seed: int | None, export: Export,
                          batcher: MicroBatcher, arrival: Arrival, metrics: ServiceMetrics,
                          monitor: Monitor | None, outcomes: OutcomeStore | None = None,
                          ) -> tuple[np.ndarray, Summary, list[str] | None]:
    """Sampled probabilities [N, S*K], their summary and the prediction identifiers (None without an outcome
    store) for checked records, micro-batched; counted, monitored and kept as the JSON road keeps its answers."""
    probs = await batcher.submit([r.example for r in records], num_samples, seed, arrival=arrival)
    summary = summarise(probs, export, num_samples)
    for i, record in enumerate(records):
        metrics.oov_codes.inc(record.oov_count)
        if monitor is not None:
            monitor.record(record.context, record.bags, {}, float(summary.epistemic[i]), probs[i])
    metrics.predictions.inc(len(records))
    metrics.referrals.inc(int(np.sum(summary.refer)))
    ids = None
    if outcomes is not None:
        # The checked record is the encoded admission the JSON road stores (the same bytes reach the model),
        # so it is kept under the same rule; off the event loop: the row is on disk before the answer names it.
        ids = await run_in_threadpool(outcomes.record_predictions,
                                      export.card.version,
                                      [float(v) for v in summary.probability], probs, [r.example for r in records],
                                      model_checksum=export.checksum)
    return probs, summary, ids
