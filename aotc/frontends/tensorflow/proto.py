"""TensorFlow's protobuf messages, from the ``tensorboard`` package (no TensorFlow needed), and reading
a GraphDef from a ``.pb`` (binary) or ``.pbtxt`` (text format) file."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

from aotc.errors import AotcError

INSTALL_HINT = "pip install 'aotc[tf]'"


def messages() -> ModuleType:
    """tensorboard's compiled ``graph_pb2``, or an error saying how to install it."""
    try:
        from tensorboard.compat.proto import graph_pb2
    except ImportError as e:
        raise AotcError(f"reading TensorFlow graphs needs the tensorboard package, which carries TensorFlow's "
                        f"message definitions ({e}): {INSTALL_HINT}") from None
    return graph_pb2


def types() -> ModuleType:
    messages()
    from tensorboard.compat.proto import types_pb2

    return types_pb2


def load_graphdef(source: str | Path | Any) -> Any:
    """A GraphDef from a path (``.pbtxt`` is text format, anything else binary) or a GraphDef message
    (tensorboard's, or TensorFlow's own, which is re-read through its bytes)."""
    graph_pb2 = messages()
    if not isinstance(source, (str, Path)):
        if isinstance(source, graph_pb2.GraphDef):
            return source
        if getattr(getattr(source, "DESCRIPTOR", None), "name", None) != "GraphDef":
            raise AotcError(f"expected a GraphDef or a path to one, got {type(source).__name__}")
        gd = graph_pb2.GraphDef()
        gd.ParseFromString(source.SerializeToString())
        return gd
    path = Path(source)
    if not path.is_file():
        raise AotcError(f"model file not found: {path}")
    gd = graph_pb2.GraphDef()
    try:
        if path.suffix == ".pbtxt":
            from google.protobuf import text_format

            text_format.Parse(path.read_text(encoding="utf-8"), gd)
        else:
            gd.ParseFromString(path.read_bytes())
    except Exception as e:  # protobuf's DecodeError/ParseError, UnicodeDecodeError
        msg = " ".join(str(e).split())
        raise AotcError(f"{path}: not a valid TensorFlow GraphDef ({type(e).__name__}: {msg})") from None
    if not gd.node:
        raise AotcError(f"{path}: not a valid TensorFlow GraphDef (no nodes)")
    return gd


# The SavedModel wrapper and the tensor bundle's messages are not in tensorboard's set: they are
# declared here, field by field as TensorFlow's saved_model.proto and tensor_bundle.proto number them,
# against tensorboard's MetaGraphDef, DataType, TensorShapeProto and VersionDef. A sliced entry's
# TensorSliceProto is only checked for presence, so it is kept as bytes (the same wire type).
_OWN_PACKAGE = "aotc.tensorflow"
_OWN_FIELDS: dict[str, list[tuple[str, int, str, str]]] = {  # message: (field, number, type, label)
    "SavedModel": [("saved_model_schema_version", 1, "int64", "optional"),
                   ("meta_graphs", 2, ".tensorboard.MetaGraphDef", "repeated")],
    "BundleHeaderProto": [("num_shards", 1, "int32", "optional"), ("endianness", 2, "int32", "optional"),
                          ("version", 3, ".tensorboard.VersionDef", "optional")],
    "BundleEntryProto": [("dtype", 1, ".tensorboard.DataType", "optional"),
                         ("shape", 2, ".tensorboard.TensorShapeProto", "optional"),
                         ("shard_id", 3, "int32", "optional"), ("offset", 4, "int64", "optional"),
                         ("size", 5, "int64", "optional"), ("crc32c", 6, "fixed32", "optional"),
                         ("slices", 7, "bytes", "repeated")],
}


@functools.cache
def own_messages() -> dict[str, type]:
    """SavedModel, BundleHeaderProto and BundleEntryProto classes, built once from _OWN_FIELDS."""
    messages()
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorboard.compat.proto import meta_graph_pb2, tensor_shape_pb2, types_pb2, versions_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    scalar = {"int64": fdp.TYPE_INT64, "int32": fdp.TYPE_INT32, "fixed32": fdp.TYPE_FIXED32, "bytes": fdp.TYPE_BYTES}
    enums = {".tensorboard.DataType"}
    f = descriptor_pb2.FileDescriptorProto(
        name="aotc/tensorflow_formats.proto", package=_OWN_PACKAGE, syntax="proto3",
        dependency=[m.DESCRIPTOR.name for m in (meta_graph_pb2, tensor_shape_pb2, types_pb2, versions_pb2)])
    for msg, fields in _OWN_FIELDS.items():
        m = f.message_type.add(name=msg)
        for field, number, kind, label in fields:
            d = m.field.add(name=field, number=number,
                            label=fdp.LABEL_REPEATED if label == "repeated" else fdp.LABEL_OPTIONAL)
            if kind in scalar:
                d.type = scalar[kind]
            else:
                d.type, d.type_name = (fdp.TYPE_ENUM if kind in enums else fdp.TYPE_MESSAGE), kind
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(f.name)
    except KeyError:
        pool.AddSerializedFile(f.SerializeToString())
    make = getattr(message_factory, "GetMessageClass", None)
    if make is None:  # protobuf before 4.21
        make = message_factory.MessageFactory(pool).GetPrototype
    return {msg: make(pool.FindMessageTypeByName(f"{_OWN_PACKAGE}.{msg}")) for msg in _OWN_FIELDS}
