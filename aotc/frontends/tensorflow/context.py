"""What an op translation sees: one TensorFlow node, its inputs as IR values, and a way to add IR nodes.

Every IR node gets its shape and dtype as it is added (the frontend pins every input shape before it
translates), so translations can rely on ranks and sizes: TF's SAME padding, StridedSlice's masks and
Squeeze without dims need them. A node whose inputs are all small constants is folded at once, which
turns TF's shape arithmetic (Shape -> StridedSlice -> Pack -> Reshape) into constants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aotc.errors import AotcError
from aotc.frontends.tensorflow.tensors import attr_value
from aotc.ir.graph import Graph, Value
from aotc.ops import OPS
from aotc.passes.propagate import evaluate

# Folding at import is for shape arithmetic; larger constant subgraphs are left to the propagate pass.
_FOLD_ELEMENTS = 1 << 16
_REQUIRED = object()
OPSET = 21


class Ctx:
    def __init__(self, graph: Graph, node: Any, inputs: list[Value]) -> None:
        self.graph = graph
        self.op_type: str = node.op
        self.name: str = node.name
        self.inputs = inputs
        self.attrs = {k: attr_value(v, f"{node.op} node {node.name!r}: attribute {k}")
                      for k, v in node.attr.items() if not k.startswith("_")}
        self.created: list[Value] = []

    def error(self, msg: str) -> AotcError:
        return AotcError(f"{self.op_type} node {self.name!r}: {msg}")

    def attr(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.attrs and self.attrs[key] is not None:
            return self.attrs[key]
        if default is _REQUIRED:
            raise self.error(f"missing attribute {key}")
        return default

    def x(self, i: int) -> Value:
        if i >= len(self.inputs):
            raise self.error(f"has {len(self.inputs)} inputs, needs at least {i + 1}")
        v = self.inputs[i]
        assert v.shape is not None and v.dtype is not None, "every imported value has a static type"
        return v

    def const_input(self, i: int, what: str) -> np.ndarray:
        v = self.x(i)
        if not v.is_const:
            raise self.error(f"input {i} ({what}) must be a compile-time constant")
        return v.const

    def ints(self, i: int, what: str) -> list[int]:
        return [int(a) for a in self.const_input(i, what).reshape(-1)]

    def const(self, array: Any, dtype: Any = None) -> Value:
        v = Graph.constant(np.asarray(array, dtype=dtype), f"{self.name}#{len(self.created)}")
        self.created.append(v)
        return v

    def emit(self, op: str, inputs: list[Value | None], **attrs: Any) -> Value:
        """Add IR node ``op`` (an ONNX op with ONNX attributes) and return its first output, typed, or
        folded to a constant."""
        return self.emit_n(op, inputs, 1, **attrs)[0]

    def emit_n(self, op: str, inputs: list[Value | None], n: int, **attrs: Any) -> list[Value]:
        """``emit`` for an op with ``n`` outputs: all of them."""
        node = self.graph.add_node(op, inputs, n, attrs, self.name,
                                   out_names=[f"{self.name}#{len(self.created) + i}" for i in range(n)])
        self.created.extend(node.outputs)
        try:
            types = OPS[op].infer(node)
        except AotcError:
            raise
        except Exception as e:  # a shape or attribute TF allowed but the IR op does not
            raise self.error(f"{op}: {type(e).__name__}: {e}") from None
        for out, (shape, dt) in zip(node.outputs, types, strict=False):
            out.shape, out.dtype = tuple(int(d) for d in shape), np.dtype(dt)
        ins = [v for v in inputs if v is not None]
        if all(v.is_const for v in ins) and sum(out.size for out in node.outputs) <= _FOLD_ELEMENTS:
            try:
                results = evaluate(node, [None if v is None else v.const for v in inputs], OPSET)
            except Exception:  # the propagate pass folds it later, or reports it with the node named
                return list(node.outputs)
            for out, result in zip(node.outputs, results, strict=False):
                out.const, out.producer = np.asarray(result).astype(out.dtype, copy=False).reshape(out.shape), None
            self.graph.nodes.remove(node)
        return list(node.outputs)

    # -- helpers shared by several translations ----------------------------------------------------
    def transpose(self, v: Value, perm: list[int]) -> Value:
        """Transposed once here when constant (weights), else a Transpose node."""
        if list(perm) == list(range(len(perm))):
            return v
        if v.is_const:
            return self.const(np.transpose(v.const, perm))
        return self.emit("Transpose", [v], perm=list(perm))

    def reshape(self, v: Value, shape: list[int] | tuple[int, ...]) -> Value:
        if tuple(shape) == v.shape:
            return v
        if v.is_const:
            return self.const(v.const.reshape(shape))
        return self.emit("Reshape", [v, self.const(np.array(shape, np.int64))])

    def axis(self, a: int, rank: int) -> int:
        if not -rank <= a < rank:
            raise self.error(f"axis {a} is out of range for rank {rank}")
        return a % rank


Translation = Callable[[Ctx], "Value | list[Value]"]
TF_OPS: dict[str, Translation] = {}


def tf_op(*names: str) -> Callable[[Translation], Translation]:
    """Register a translation for the TF ops ``names``."""
    def register(fn: Translation) -> Translation:
        for n in names:
            assert n not in TF_OPS, f"TF op {n} translated twice"
            TF_OPS[n] = fn
        return fn
    return register
