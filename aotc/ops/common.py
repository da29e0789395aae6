"""Helpers shared by op definitions: broadcasting, attribute and constant-input access, C literals."""

from __future__ import annotations

import math

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value

FLOAT_CTYPES = ("float", "double", "_Float16")


def broadcast_shapes(*shapes: tuple[int, ...], where: str = "") -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise AotcError(f"{where}: shapes {', '.join(map(str, shapes))} do not broadcast") from None


def optional_input(node: Node, i: int) -> Value | None:
    """Input ``i``, or None when the node has fewer inputs or the slot is empty."""
    return node.inputs[i] if i < len(node.inputs) else None


def const_input(node: Node, i: int, what: str) -> np.ndarray | None:
    """The constant value of optional input ``i`` (None when absent); an error when not constant."""
    if i >= len(node.inputs) or node.inputs[i] is None:
        return None
    v = node.inputs[i]
    assert v is not None
    if not v.is_const:
        raise AotcError(f"{node.op} node {node.name!r}: {what} must be a compile-time constant")
    return v.const


def norm_axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < max(rank, 1):
        raise AotcError(f"{node.op} node {node.name!r}: axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> list[int]:
    """Element strides of a C-contiguous tensor of ``shape``."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def c_array(ctype: str, name: str, values: np.ndarray) -> str:
    """A ``static const`` C array of ``values`` (at least one element, as C requires)."""
    vals = np.asarray(values).reshape(-1)
    if ctype in ("float", "double"):
        body = ", ".join(c_literal(float(v), ctype) for v in vals)
    else:
        body = ", ".join(f"{int(v)}" for v in vals)
    return f"static const {ctype} {name}[{max(len(vals), 1)}] = {{{body or '0'}}};"


def c_bytes(data: bytes) -> str:
    """A C string literal of ``data`` with every byte octal-escaped (keys and other byte strings from a
    model file: no quote, backslash, newline, ``*/`` or ``??`` trigraph can break out)."""
    return '"' + "".join(f"\\{b:03o}" for b in data) + '"'


def c_literal(x: float | int | bool, ctype: str) -> str:
    """A C literal of type ``ctype`` for a Python number (inf/nan spelled with math.h macros)."""
    if ctype == "_Float16":
        return f"((_Float16){c_literal(float(np.float16(x)), 'float')})"
    if ctype in ("float", "double"):
        x = float(x)
        suffix = "f" if ctype == "float" else ""
        if math.isnan(x):
            return "NAN" if ctype == "float" else "(double)NAN"
        if math.isinf(x):
            inf = "INFINITY" if ctype == "float" else "(double)INFINITY"
            return inf if x > 0 else f"(-{inf})"
        return f"{float(np.float32(x)) if ctype == 'float' else x!r}{suffix}"
    if ctype == "_Bool":
        return "1" if x else "0"
    v = int(x)
    if ctype == "int64_t":
        return f"INT64_C({v})"
    if ctype == "uint64_t":
        return f"UINT64_C({v})"
    return f"({ctype})({v})"


def lowest(ctype: str) -> str:
    return {"float": "(-INFINITY)", "double": "(-(double)INFINITY)", "_Float16": "(-(_Float16)INFINITY)",
            "int64_t": "INT64_MIN",
            "int32_t": "INT32_MIN", "int16_t": "INT16_MIN", "int8_t": "INT8_MIN", "_Bool": "0"}.get(
        ctype, "0")


def highest(ctype: str) -> str:
    return {"float": "INFINITY", "double": "((double)INFINITY)", "_Float16": "((_Float16)INFINITY)",
            "int64_t": "INT64_MAX",
            "int32_t": "INT32_MAX", "int16_t": "INT16_MAX", "int8_t": "INT8_MAX", "uint8_t": "UINT8_MAX",
            "uint16_t": "UINT16_MAX", "uint32_t": "UINT32_MAX", "uint64_t": "UINT64_MAX",
            "_Bool": "1"}[ctype]


def axis_layout(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, n, inner): a loop over ``axis`` visits n elements spaced ``inner`` apart."""
    return int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))


def row_loop_head(outer: int, inner: int) -> str:
    """Opens a kernel loop over the (outer, inner) rows of an axis_layout, split over tasks; the row
    starts at ``o * n * inner + k``. The caller closes the brace."""
    split = "o = r, k = 0" if inner <= 1 else f"o = r / {inner}, k = r % {inner}"
    return f"for (size_t r = task; r < {outer * inner}; r += ntasks) {{\n  const size_t {split};\n"


def aligned_inputs(node: Node, ins: list[str]) -> list[str | None]:
    """A kernel emitter's input names (``ins`` holds the present inputs only) aligned with
    ``node.inputs``: None where an optional input is absent."""
    it = iter(ins)
    return [None if v is None else next(it) for v in node.inputs]
