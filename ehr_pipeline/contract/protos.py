"""TensorFlow's Example protos, built with protobuf alone, so writing SequenceExamples needs no TensorFlow.

The Beam job and its workers only *write* ``tensorflow.SequenceExample`` records; importing
TensorFlow for that costs ~0.9 GB and ~4 s per process (on every Flink / Spark / Dataflow
worker). The messages below declare the same fields, numbers and types as TensorFlow's
``tensorflow/core/example/feature.proto`` and ``example.proto`` (proto3: repeated numbers
packed), so their wire bytes are the same: ``tf.train.SequenceExample.FromString`` reads what
they write, and the reverse. tests/ehr_pipeline/contract/test_spec.py pins that byte for byte.

They live in a private descriptor pool: a process that also imports TensorFlow registers
TensorFlow's own ``tensorflow.SequenceExample`` in the default pool, and the two must not clash.
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "tensorflow"
_F = descriptor_pb2.FieldDescriptorProto


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, *,
           repeated: bool = False, type_name: str | None = None, oneof: int | None = None) -> None:
    field = message.field.add(name=name, number=number, type=kind,
                              label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name is not None:
        field.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof


def _map(message: descriptor_pb2.DescriptorProto, name: str, entry: str, value_type: str) -> None:
    """A proto3 map<string, value_type> field numbered 1, as protoc lowers it (a nested *Entry message)."""
    nested = message.nested_type.add(name=entry)
    nested.options.map_entry = True
    _field(nested, "key", 1, _F.TYPE_STRING)
    _field(nested, "value", 2, _F.TYPE_MESSAGE, type_name=value_type)
    _field(message, name, 1, _F.TYPE_MESSAGE, repeated=True, type_name=f"{message.name}.{entry}")


def _file() -> descriptor_pb2.FileDescriptorProto:
    """feature.proto and example.proto's messages in one file of the private pool."""
    proto = descriptor_pb2.FileDescriptorProto(name="ehr_pipeline/example.proto", package=_PACKAGE,
                                               syntax="proto3")
    for name, kind in (("BytesList", _F.TYPE_BYTES), ("FloatList", _F.TYPE_FLOAT), ("Int64List", _F.TYPE_INT64)):
        _field(proto.message_type.add(name=name), "value", 1, kind, repeated=True)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
            (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), start=1):
        _field(feature, name, number, _F.TYPE_MESSAGE, type_name=type_name, oneof=0)
    _map(proto.message_type.add(name="Features"), "feature", "FeatureEntry", "Feature")
    _field(proto.message_type.add(name="FeatureList"), "feature", 1, _F.TYPE_MESSAGE, repeated=True,
           type_name="Feature")
    _map(proto.message_type.add(name="FeatureLists"), "feature_list", "FeatureListEntry", "FeatureList")
    _field(proto.message_type.add(name="Example"), "features", 1, _F.TYPE_MESSAGE, type_name="Features")
    sequence = proto.message_type.add(name="SequenceExample")
    _field(sequence, "context", 1, _F.TYPE_MESSAGE, type_name="Features")
    _field(sequence, "feature_lists", 2, _F.TYPE_MESSAGE, type_name="FeatureLists")
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _message(name: str) -> type:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


Feature = _message("Feature")
Features = _message("Features")
FeatureList = _message("FeatureList")
FeatureLists = _message("FeatureLists")
Example = _message("Example")
SequenceExample = _message("SequenceExample")
