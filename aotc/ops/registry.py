"""The op table: every op aotc supports is one ``OpDef`` registered here by a module of ``aotc.ops``.

An op's rules live together: how it infers shapes and dtypes, how it is folded at compile time, and
how it lowers to C. Lowering comes in kinds that the fusion pass understands:

- ``elementwise``: ``expr`` maps C expressions of the inputs to a C expression; fused into loops.
- ``view``: ``view`` remaps output indices to input indices (transpose, broadcast, slice); fused.
- ``alias``: the output is the input's bytes with another shape (reshape); costs nothing.
- ``reduce``: ``reduction`` describes map/combine/finalize; fused with its producers and consumers.
- ``gemm`` / ``conv``: template kernels (matrix product, convolution) that may take an elementwise
  epilogue; a ``conv`` op's ``emit`` writes the kernel with it (``aotc.ops.conv.conv_kernel``).
- ``kernel``: a template kernel written by ``emit`` (softmax, concat, ...).

What a kernel may hold is decided by its emitter, next to it, through two hooks the fusion pass asks
(so it never builds a kernel the emitter cannot write): ``can_take_epilogue`` and ``can_take_prologue``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aotc.ir.graph import Node, Value

if TYPE_CHECKING:
    from aotc.target import Target

Shape = tuple[int, ...]
InferFn = Callable[[Node], list[tuple[Shape, np.dtype]]]


@dataclass(frozen=True)
class Reduction:
    """A reduction as map -> combine -> finalize, each a format string over C expressions."""

    init: str              # e.g. "0" or "-INFINITY"; "{lowest}"/"{highest}" filled per dtype
    combine: str           # "{a} + {b}"
    pre: str = "{x}"       # applied to every input element
    post: str = "{acc}"    # applied to the result; may use {n}, the number of elements reduced
    int_ok: bool = True


@dataclass
class OpDef:
    name: str
    kind: str
    infer: InferFn
    expr: Callable[[Node, list[str], str], str] | None = None
    view: Callable[[Node], Any] | None = None
    reduction: Reduction | None = None
    emit: Callable[..., Any] | None = None
    # Optional numpy evaluation; by default constant folding runs onnx.reference on the node.
    fold: Callable[[Node, list[np.ndarray]], list[np.ndarray]] | None = None
    # Inputs that must be compile-time constants (e.g. Reshape's shape).
    const_inputs: tuple[int, ...] = ()
    # ``kernel`` ops only: bytes of scratch one task needs (the emitted code gets ``scratch``).
    scratch: Callable[[Node], int] | None = None
    # ``gemm``/``conv`` ops: whether the op's kernel can apply a fused elementwise chain (at the op's
    # output shape) whose result is ``out`` to each value before storing it.
    can_take_epilogue: Callable[[Node, Value, Target], bool] | None = None
    # Whether the op's kernel can compute its first input itself from ``producer`` (the node writing
    # that input, read by this op alone): an elementwise node, or the head of another kernel.
    can_take_prologue: Callable[[Node, Node, Target], bool] | None = None
    # ``conv`` ops: the weights packed at compile time into the layout of the kernel's path, or None.
    pack: Callable[[Node, str, Target], np.ndarray | None] | None = None
    # Reverse-mode rule (aotc/ops/grads/): (builder, node, output cotangents, inputs needing one) ->
    # one cotangent Value (or None) per input, built from ordinary nodes by the builder.
    grad: Callable[..., list[Value | None]] | None = None


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    assert op.name not in OPS, f"op {op.name} registered twice"
    OPS[op.name] = op
    return op


def get(name: str) -> OpDef:
    return OPS[name]
