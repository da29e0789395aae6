"""What gradient rules build with: ``GradBuilder`` appends ordinary IR nodes to the graph being
differentiated and infers each one's shape and dtype at once, so the next rule can read them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from aotc.ir.graph import Graph, Node, Value
from aotc.ops.registry import OPS

# Element types that carry gradients (the rest, integers and booleans, stop them).
FLOAT_TYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16))


def differentiable(v: Value | None) -> bool:
    return v is not None and v.dtype is not None and np.dtype(v.dtype) in FLOAT_TYPES


class GradBuilder:
    def __init__(self, graph: Graph, prefix: str = "grad") -> None:
        self.graph = graph
        self.prefix = prefix
        self.count = 0
        self.node: Node | None = None  # the forward node whose rule is running, for names

    def _name(self, what: str) -> str:
        self.count += 1
        base = self.node.name or self.node.op if self.node is not None else "g"
        return f"{self.prefix}/{base}/{what}{self.count}"

    def ops(self, op: str, inputs: Sequence[Value | None], n_out: int, **attrs: Any) -> list[Value]:
        """Append one ``op`` node; its outputs, shapes and dtypes inferred."""
        name = self._name(op.rpartition(".")[2])
        outs = [Value(f"{name}:{i}") for i in range(n_out)]
        attrs.setdefault("_opset", self.graph.opset)
        node = Node(op, list(inputs), outs, attrs, name)
        for v in outs:
            v.producer = node
        for v, (shape, dt) in zip(outs, OPS[op].infer(node), strict=False):
            v.shape, v.dtype = tuple(int(d) for d in shape), np.dtype(dt)
        self.graph.nodes.append(node)
        return outs

    def op(self, op: str, *inputs: Value | None, **attrs: Any) -> Value:
        return self.ops(op, inputs, 1, **attrs)[0]

    # -- constants --------------------------------------------------------------------------------
    def const(self, array: Any, dtype: Any = None) -> Value:
        return Graph.constant(np.asarray(array, dtype=dtype), self._name("c"))

    def scalar(self, x: float, like: Value) -> Value:
        return self.const(x, like.dtype)

    def ints(self, seq: Sequence[int]) -> Value:
        return self.const(np.array(list(seq), np.int64).reshape(-1))

    # -- common shapes of cotangents ----------------------------------------------------------------
    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        return v if v.shape == shape else self.op("Reshape", v, self.ints(shape))

    def transpose(self, v: Value, perm: Sequence[int]) -> Value:
        """``v`` transposed; a transpose of a Transpose becomes one (or none) on the latter's input."""
        perm = [int(p) for p in perm]
        src = v.producer
        if src is not None and src.op == "Transpose" and src.inputs[0] is not None and "perm" in src.attrs:
            v, perm = src.inputs[0], [int(src.attrs["perm"][p]) for p in perm]
        return v if perm == sorted(perm) else self.op("Transpose", v, perm=perm)

    def transpose_cost(self, v: Value) -> int:
        """Elements a transpose of ``v``'s last two axes copies (none when it undoes a Transpose)."""
        src = v.producer
        return 0 if src is not None and src.op == "Transpose" else v.size

    def swap_last(self, v: Value) -> Value:
        """The matrices of ``v`` (its last two axes) transposed."""
        r = len(v.shape)
        return self.transpose(v, [*range(r - 2), r - 1, r - 2])

    def reduce_sum(self, v: Value, axes: Sequence[int], keepdims: bool = True) -> Value:
        if not axes:
            return v
        return self.op("ReduceSum", v, self.ints(sorted(axes)), keepdims=int(keepdims))

    def sum_to(self, v: Value, shape: Sequence[int]) -> Value:
        """``v`` summed over the axes numpy broadcasting stretched to reach it from ``shape``."""
        shape = tuple(int(d) for d in shape)
        if v.shape == shape:
            return v
        lead = len(v.shape) - len(shape)
        axes = [*range(lead), *(lead + i for i, d in enumerate(shape) if d == 1 and v.shape[lead + i] != 1)]
        return self.reshape(self.reduce_sum(v, axes), shape)

    def expand(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        return v if v.shape == shape else self.op("Expand", v, self.ints(shape))

    def zeros(self, shape: Sequence[int], dtype: Any) -> Value:
        return self.expand(self.const(np.zeros((), dtype)), shape)

    # -- arithmetic, with the broadcasting of ONNX's binary ops ---------------------------------------
    def add(self, a: Value, b: Value) -> Value:
        return self.op("Add", a, b)

    def sub(self, a: Value, b: Value) -> Value:
        return self.op("Sub", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self.op("Mul", a, b)

    def div(self, a: Value, b: Value) -> Value:
        return self.op("Div", a, b)

    def neg(self, a: Value) -> Value:
        return self.op("Neg", a)

    def scale(self, a: Value, k: float) -> Value:
        return a if k == 1 else self.mul(a, self.scalar(k, a))


Grads = list[Value | None]  # one cotangent per output (what a rule gets) or per input (what it returns)
GradRule = Callable[[GradBuilder, Node, Grads, list[bool]], Grads]


def rule(*names: str) -> Callable[[GradRule], GradRule]:
    """Attach the decorated function as the gradient rule of ops ``names``."""
    def attach(fn: GradRule) -> GradRule:
        for n in names:
            OPS[n].grad = fn
        return fn
    return attach
