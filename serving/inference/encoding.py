"""Request -> serialized SequenceExample, through the very functions that built the training data.

Training/serving skew is the bug this module exists to prevent: codes are normalised by
``ehr_pipeline.contract.spec.format_code``, the age is computed by ``ehr_pipeline.encode.ages``
at the admission time (as the cohort builder does), and the admission goes through
``ehr_pipeline.encode.encode_admission``, the hop the Beam job's bagging step takes too: values
move to the units the model was trained in (``units.Harmoniser`` with the export's canonical
units), events are bagged with the export's own bagging config (each source's known-time rule
applied, the event order irrelevant) and the record is written from a ``spec.AdmissionContext``.
Nothing here re-implements any of them.
"""
from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import ages, bagging, encode_admission, units
from ehr_pipeline.meds import code_map
from model.export.load import Export
from serving.schemas import InputError, PredictRequest

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
ONE_SECOND = dt.timedelta(seconds=1)
MAX_SECONDS = (dt.datetime.max.replace(tzinfo=dt.timezone.utc) - EPOCH) // ONE_SECOND  # end of year 9999
MIN_SECONDS = (dt.datetime.min.replace(tzinfo=dt.timezone.utc) - EPOCH) // ONE_SECOND  # start of year 1
MAX_OOV_LISTED = 50  # the response lists this many unknown codes at most (the count is exact)
# Context ids the service cannot know; LABEL_UNKNOWN marks a live prediction in the proto.
_SERVING_ID = 0


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One request as the model sees it, plus what the response reports about the input."""

    example: bytes  # serialized tf.train.SequenceExample
    prediction_time: dt.datetime  # UTC
    age_years: float  # fed to the model (capped)
    events_received: int
    events_used: int
    ignored: dict[str, int]  # bagging.DROP_REASONS -> count
    oov_codes: list[str]  # sorted, at most MAX_OOV_LISTED
    oov_count: int
    warnings: list[str]  # most important first (WARNING_RANK)
    warning_kinds: list[str]  # one per warning, the label of ehr_input_warnings_total
    unit_outcomes: dict[str, int]  # units.OUTCOMES -> values (every outcome listed)
    # What the population monitor summarises (serving.monitoring.monitor): the context the record was
    # written from, its bags, and its values with a unit: (code, unit as written) -> values.
    context: spec.AdmissionContext
    bags: bagging.Bags
    unit_rows: dict[tuple[str, str], int]


# Warnings most likely to mean a wrong answer come first: a value the model could not read or
# reads far outside anything it saw, then a patient outside the cohort, then the rest.
WARNING_RANK = (*units.NOT_USED.values(), "value_out_of_range", "admission_type_unknown", "age_below_cohort",
                "prediction_time_not_trained", "no_events", "meds_code_not_event")


# One message per reason a value is not used; {why} is units.Harmoniser's own explanation.
_UNIT_MESSAGES = {
    units.NOT_CONVERTIBLE: "{n} value(s) of {code} in {unit!r} cannot be converted to {canonical!r}, the unit the "
                           "model was trained on ({why}): not used",
    units.AMBIGUOUS: "{n} value(s) of {code} in {unit!r} were not converted to {canonical!r}, the unit the model was "
                     "trained on: {why}: not used",
    units.PLACEHOLDER: "{n} value(s) of {code} came with {unit!r}, a placeholder rather than a unit, where the model "
                       "was trained on {canonical!r}: not used",
    units.IMPLAUSIBLE: "{n} value(s) of {code} in {unit!r} were not converted to {canonical!r}, the unit the model "
                       "was trained on: {why}: not used",
}


def ranked(warnings: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(messages, kinds) of (kind, message) pairs, most important kind first (stable within a kind)."""
    order = {k: i for i, k in enumerate(WARNING_RANK)}
    pairs = sorted(warnings, key=lambda km: order.get(km[0], len(order)))
    return [m for _, m in pairs], [k for k, _ in pairs]


def to_seconds(value: dt.datetime | dt.date) -> int:
    """Whole seconds since 1970-01-01 UTC (floor); a time without an offset is taken as UTC."""
    if not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    # timedelta arithmetic, not .timestamp(): no float rounding and no overflow at year 1 or 9999.
    return (value - EPOCH) // ONE_SECOND


def encode(request: PredictRequest, export: Export, loc: tuple[str | int, ...] = ("body",)) -> Encoded:
    """Bags a request's events and builds its SequenceExample; raises InputError (with loc) on nonsense input."""
    admit = to_seconds(request.admission.admit_time)
    pipeline = export.pipeline
    trigger = _prediction_seconds(request, admit, pipeline.trigger_offset_seconds, loc)
    patient = request.patient
    raw_age = _raw_age(request, admit, loc)
    age = float(ages.cap_age(raw_age))

    events, not_events = _model_events(request.events, export, loc)
    times = np.fromiter((to_seconds(e.time) for e, _, _ in events), dtype=np.int64, count=len(events))
    codes = np.array([code for _, code, _ in events], dtype=object)
    values = np.fromiter((np.nan if e.value is None else e.value for e, _, _ in events), dtype=np.float64,
                         count=len(events))
    written = [unit for _, _, unit in events]
    # Ethnicity and insurance stay NOT_RECORDED: a request does not carry them (they serve the
    # training data's subgroup reports, never the model).
    context = spec.AdmissionContext(
        subject_id=_SERVING_ID, hadm_id=_SERVING_ID, label=spec.LABEL_UNKNOWN, trigger_time=trigger,
        admit_offset_seconds=trigger - admit, age_years=age, gender=patient.gender,
        admission_type=request.admission.admission_type,
        previous_discharge_seconds=_previous_discharge(request, admit, trigger, loc))
    # The job's own hop: the same admission gives the same bytes.
    encoded = encode_admission(times, codes, values, written, context, export.harmoniser, pipeline.bagging)
    harmonised, bags = encoded.harmonised, encoded.bags
    unit_rows = _unit_rows(codes, written, values)
    values = harmonised.values  # per request event, in the request's order (as codes)

    # Only codes the model actually sees (kept bags) can be out of its vocabulary.
    unknown = sorted(set(bags.codes.tolist()) - export.vocabulary)
    found: list[tuple[str, str]] = _unit_problems(codes, harmonised, export.harmoniser)
    if not_events:
        found.append(("meds_code_not_event", f"{len(not_events)} MEDS code(s) the model's code map does not read as "
                      f"events, not used (first: {not_events[0]})"))
    if raw_age < pipeline.min_age_years:
        found.append(("age_below_cohort", f"age {raw_age:.1f} years is below the training cohort's minimum of "
                                          f"{pipeline.min_age_years:g} years"))
    if trigger != admit + pipeline.trigger_offset_seconds:
        found.append(("prediction_time_not_trained", f"prediction_time is not admit_time + "
                      f"{pipeline.trigger_offset_seconds} s, the time point the model was trained for"))
    if bags.num_bags == 0:
        found.append(("no_events", "no events before the prediction time: the model sees only age, gender and "
                                   "admission type"))
    far = _far_values(codes, values, export)
    if far:
        code, value = far[0]
        found.append(("value_out_of_range", f"{len(far)} value(s) lie more than {export.clip_z:g} training "
                      f"standard deviations from their code's training mean (first: {code} = {value:g} "
                      f"{export.harmoniser.canonical.get(code, '')}".rstrip() + "); the model caps them there"))
    warnings, kinds = ranked(found)
    return Encoded(
        example=encoded.record,
        prediction_time=EPOCH + dt.timedelta(seconds=trigger),
        age_years=age,
        events_received=len(request.events),
        events_used=bags.n_events_used,
        ignored=dict(bags.n_dropped_by_reason),
        oov_codes=unknown[:MAX_OOV_LISTED],
        oov_count=len(unknown),
        warnings=warnings,
        warning_kinds=kinds,
        unit_outcomes=harmonised.counts(),
        context=context,
        bags=bags,
        unit_rows=unit_rows,
    )


def _prediction_seconds(request: PredictRequest, admit: int, offset_s: int, loc: tuple[str | int, ...]) -> int:
    """The prediction time, seconds since the epoch: as requested, else admission + the model's offset (s)."""
    if request.prediction_time is None:
        trigger = admit + offset_s
        if trigger > MAX_SECONDS:  # the response could not even write the default time down
            raise InputError(loc + ("admission", "admit_time"), "admit_time is too late to add the "
                             f"model's trigger offset of {offset_s} s")
        return trigger
    trigger = to_seconds(request.prediction_time)
    if not MIN_SECONDS <= trigger <= MAX_SECONDS:  # its UTC offset moved it out of years 1-9999
        raise InputError(loc + ("prediction_time",), "prediction_time is outside years 1-9999 in UTC")
    if trigger < admit:
        raise InputError(loc + ("prediction_time",), "prediction_time must not precede admission.admit_time")
    return trigger


def _previous_discharge(request: PredictRequest, admit: int, trigger: int, loc: tuple[str | int, ...]) -> int:
    """The record's spec.PREVIOUS_DISCHARGE: prediction time minus the previous discharge (s), or none."""
    given = request.admission.previous_discharge_time
    if given is None:
        return spec.NO_PREVIOUS_DISCHARGE
    previous = to_seconds(given)
    if previous > admit:  # the job skips such a stay (encode.previous_stay): a request must say which one it means
        raise InputError(loc + ("admission", "previous_discharge_time"),
                         "previous_discharge_time must not be after admission.admit_time")
    return trigger - previous


def _raw_age(request: PredictRequest, admit: int, loc: tuple[str | int, ...]) -> float:
    """The patient's age at admission in years, before the cohort's cap."""
    patient = request.patient
    if patient.date_of_birth is None:
        return float(patient.age_years)
    raw_age = float(ages.age_years(to_seconds(patient.date_of_birth), admit))
    if raw_age < 0:
        raise InputError(loc + ("patient", "date_of_birth"), "date_of_birth is after admission.admit_time")
    return raw_age


def _model_events(events, export: Export, loc: tuple[str | int, ...]) -> tuple[list[tuple], list[str]]:
    """(event, 'source:code', unit) per request event the model reads, and the MEDS codes it does not read.

    A model trained on MIMIC-III tables reads 'source' + 'code'; one trained on MEDS data reads the MEDS
    code with its code map (ehr_pipeline.meds.code_map), the very map the job read its training codes with:
    'LAB//50912//mg/dL' is 'lab:50912' in mg/dL (a unit given in the event wins over the code's).
    """
    mapper = export.meds_mapper
    out, skipped = [], []
    for i, e in enumerate(events):
        if mapper is None:
            if e.source is None:
                raise InputError(loc + ("events", i, "source"), "source is required: this model reads "
                                 "'source' + 'code' (it was trained on MIMIC-III tables)", "missing")
            out.append((e, spec.format_code(e.source, e.code), e.unit))
            continue
        if e.source is not None:
            raise InputError(loc + ("events", i, "source"), "this model was trained on MEDS data: give the MEDS code "
                             "(e.g. 'LAB//50912//mg/dL') in 'code' and leave 'source' out")
        mapped = mapper(e.code)
        if mapped.kind != code_map.EVENT:
            skipped.append(e.code)
            continue
        out.append((e, mapped.code, e.unit if e.unit is not None else mapped.unit))
    return out, skipped


def _unit_rows(codes: np.ndarray, written: list[str | None], values: np.ndarray) -> dict[tuple[str, str], int]:
    """(code, unit as written, trimmed) -> values that came with that unit, as the job's units.json counts rows."""
    rows: dict[tuple[str, str], int] = {}
    for code, unit, value in zip(codes, written, values):
        text = unit.strip() if unit else ""
        if text and not np.isnan(value):
            rows[(str(code), text)] = rows.get((str(code), text), 0) + 1
    return rows


def _unit_problems(codes: np.ndarray, harmonised: units.Harmonised,
                   harmoniser: units.Harmoniser) -> list[tuple[str, str]]:
    """(kind, message) per (code, unit, reason) whose values are not used; the kind is the job's dead-letter reason.

    A unit the training data also had for the code is no news: its values were set aside in
    training too (MetaVision's 'dose' beside mg), so the model never learnt from them; they are
    counted in the answer's events.values, without a warning. An implausible conversion is
    always news: training judged its values over the whole release, the service over one request.
    """
    by_pair: dict[tuple[str, str, str, str, str], int] = {}
    for p in harmonised.problems:
        if p.outcome != units.IMPLAUSIBLE and harmoniser.seen_in_training(str(codes[p.index]), p.unit):
            continue
        key = (p.outcome, str(codes[p.index]), p.unit, p.canonical, p.why)
        by_pair[key] = by_pair.get(key, 0) + 1
    return [(units.NOT_USED[outcome], _UNIT_MESSAGES[outcome].format(n=n, code=code, unit=unit, canonical=canonical,
                                                                     why=why))
            for (outcome, code, unit, canonical, why), n in sorted(by_pair.items())]


def _far_values(codes: np.ndarray, values: np.ndarray, export: Export) -> list[tuple[str, float]]:
    """(code, value) of the events whose value is beyond the export's clip_z of its training distribution."""
    if export.clip_z is None:
        return []
    far = []
    for code, value in zip(codes, values):
        stats = export.value_stats.get(code)
        if np.isnan(value):
            continue
        # Both sides divided by std: (value - mean) itself overflows for values near 1e308.
        if stats is not None and abs(value / stats[1] - stats[0] / stats[1]) > export.clip_z:
            far.append((str(code), float(value)))
    return far
