"""TensorFlow's protobuf messages, from the ``tensorboard`` package (no TensorFlow needed), and reading
a GraphDef from a ``.pb`` (binary) or ``.pbtxt`` (text format) file."""

from __future__ import annotations

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
