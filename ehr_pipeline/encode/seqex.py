"""Writes the spec's SequenceExamples, and reads them back as plain Python, with protobuf alone.

The one writer: the Beam job and the service both call ``serialize`` with an
``spec.AdmissionContext`` and ``bagging.Bags``, so the same admission gives the same bytes
wherever it is bagged. No TensorFlow: the protos come from ``ehr_pipeline.contract.protos``,
which TensorFlow's parser reads as its own (``ehr_pipeline.contract.tf_parse`` parses for training).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ehr_pipeline.contract import protos, spec
from ehr_pipeline.encode.bagging import Bags

_PER_CODE_FLOATS = (spec.BAG_VALUE_MEAN, spec.BAG_VALUE_LAST, spec.BAG_VALUE_MIN, spec.BAG_VALUE_MAX)


def make_sequence_example(context: spec.AdmissionContext | Mapping[str, Any], bags: Bags) -> Any:
    """One admission's SequenceExample proto: its context, one step per bag (offsets, s).

    A mapping {feature name: value} is checked as ``spec.AdmissionContext.from_features`` checks it.
    """
    if not isinstance(context, spec.AdmissionContext):
        context = spec.AdmissionContext.from_features(context)
    example = protos.SequenceExample()
    ctx = example.context.feature
    values = context.features()
    for key in spec.CONTEXT_INT:
        ctx[key].int64_list.value.append(bags.num_bags if key == spec.NUM_BAGS else int(values[key]))
    for key in spec.CONTEXT_FLOAT:
        ctx[key].float_list.value.append(float(values[key]))
    for key in spec.CONTEXT_BYTES:
        ctx[key].bytes_list.value.append(values[key].encode("utf-8"))

    lists = example.feature_lists.feature_list
    for key in spec.SEQUENCE_KEYS:
        lists[key].SetInParent()  # present even with zero bags: readers see an empty sequence
    codes = [c.encode("utf-8") for c in bags.codes]
    counts, value_count = bags.counts.tolist(), bags.value_count.tolist()
    per_code_floats = [(key, getattr(bags, key).tolist()) for key in _PER_CODE_FLOATS]
    for i in range(bags.num_bags):  # a loop over bags (tens), not over events
        s = bags.bag_slice(i)
        lists[spec.BAG_OFFSET].feature.add().float_list.value.append(float(bags.offset_seconds[i]))
        lists[spec.BAG_CODES].feature.add().bytes_list.value.extend(codes[s])
        lists[spec.BAG_COUNTS].feature.add().int64_list.value.extend(counts[s])
        lists[spec.BAG_VALUE_COUNT].feature.add().int64_list.value.extend(value_count[s])
        for key, column in per_code_floats:
            lists[key].feature.add().float_list.value.extend(column[s])
    return example


def serialize(context: spec.AdmissionContext | Mapping[str, Any], bags: Bags) -> bytes:
    """The record the job writes and the service scores; deterministic: one admission, one byte string."""
    return make_sequence_example(context, bags).SerializeToString(deterministic=True)


def sequence_example_to_dict(proto: Any) -> dict[str, Any]:
    """Plain-Python view of one SequenceExample (bytes or a proto, TensorFlow's too), for debugging and tests.

    Context features become scalars (bytes decoded to str); sequence features become one
    list per bag, except BAG_OFFSET, which becomes one float (seconds) per bag.
    """
    if not isinstance(proto, bytes):
        proto = proto.SerializeToString()
    parsed = protos.SequenceExample.FromString(proto)
    out: dict[str, Any] = {}
    for key, feature in sorted(parsed.context.feature.items()):
        values = _feature_values(feature)
        scalar = key in spec.CONTEXT_INT + spec.CONTEXT_FLOAT + spec.CONTEXT_BYTES and len(values) == 1
        out[key] = values[0] if scalar else values
    for key, feature_list in sorted(parsed.feature_lists.feature_list.items()):
        steps = [_feature_values(f) for f in feature_list.feature]
        out[key] = [s[0] for s in steps] if key in spec.ONE_PER_BAG else steps
    return out


def _feature_values(feature: Any) -> list[Any]:
    """The values of one Feature, whichever list kind it holds."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return []
    values = list(getattr(feature, kind).value)
    return [v.decode("utf-8") for v in values] if kind == "bytes_list" else values
