"""Where string tensors may go.

A string element is a pointer to the caller's NUL-terminated bytes (``aotc_string``). The library can
read strings (compare them, look them up, move the pointers around), but it cannot make a new one:
that needs memory for the bytes, and the library never allocates. So strings are accepted as graph
inputs flowing into ops that only read or move them, and refused everywhere else with an error that
names the node. Called by shape inference, once every value's dtype is known.
"""

from __future__ import annotations

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value

# Ops that move string pointers without looking at the bytes: views, aliases and copying kernels
# whose emitters copy ``sizeof(element)`` bytes. Shape and Size read only the static shape.
_MOVE_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand",
                       "Slice", "Gather", "Concat", "Shape", "Size"})
# Ops that read the bytes (strcmp); the operands that must then all be strings.
_READ_OPS = {"Equal": (0, 1), "ai.onnx.ml.LabelEncoder": (0,)}
_NO_ALLOC = "string outputs need allocation, which the library never does"


def _is_str(v: Value | None) -> bool:
    return v is not None and dtypes.is_string(v.dtype)


def _check_node(node: Node) -> None:
    ins, outs = [_is_str(v) for v in node.inputs], [_is_str(v) for v in node.outputs]
    if not any(ins) and not any(outs):
        return
    where = f"{node.op} node {node.name!r}"
    if node.op in _MOVE_OPS or node.op in _READ_OPS:
        operands = _READ_OPS.get(node.op, (0,))
        if node.op == "Concat":
            operands = tuple(i for i, v in enumerate(node.inputs) if v is not None)
        if not all(i < len(ins) and ins[i] for i in operands):
            raise AotcError(f"{where}: mixes string and non-string operands")
        return
    if node.op == "Where":  # selects a pointer: both branches must be strings, the condition not
        if len(ins) == 3 and not ins[0] and ins[1] and ins[2]:
            return
        raise AotcError(f"{where}: mixes string and non-string operands")
    if any(outs) and not any(ins):
        raise AotcError(f"{where} makes new string values: {_NO_ALLOC}")
    raise AotcError(f"{where}: string tensors are not supported by {node.op} (strings may only flow "
                    "into Equal, LabelEncoder, Where and ops that move elements)")


def check_strings(graph: Graph) -> None:
    """Raise AotcError at the first node or graph output that would need a new string."""
    for node in graph.nodes:
        _check_node(node)
    for v in graph.outputs:
        if _is_str(v):
            src = f"{v.producer.op} node {v.producer.name!r}" if v.producer is not None else "a graph input"
            raise AotcError(f"output {v.name!r} (from {src}) is a string tensor: {_NO_ALLOC}")
