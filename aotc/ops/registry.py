"""The op table: every op aotc supports is one ``OpDef`` registered here by a module of ``aotc.ops``.

An op's rules live together: how it infers shapes and dtypes, how it is folded at compile time, and
how it lowers to C. Lowering comes in kinds that the fusion pass understands:

- ``elementwise``: ``expr`` maps C expressions of the inputs to a C expression; fused into loops.
- ``view``: ``view`` remaps output indices to input indices (transpose, broadcast, slice); fused.
- ``alias``: the output is the input's bytes with another shape (reshape); costs nothing.
- ``reduce``: ``reduction`` describes map/combine/finalize; fused with its producers and consumers.
- ``kernel``: a template kernel written by ``emit`` (GEMM, softmax, concat, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aotc.ir.graph import Node

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


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    assert op.name not in OPS, f"op {op.name} registered twice"
    OPS[op.name] = op
    return op


def get(name: str) -> OpDef:
    return OPS[name]
