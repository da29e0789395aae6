"""Dropout in a training step: a fresh mask every step from a counter-based generator.

A compiled model has no mutable globals, so the generator's state is the training state's step
counter: ``aotc.DropoutFactors`` hashes (seed, step, element index) with SplitMix64's finalizer into a
24-bit uniform u, and gives ``1 / (1 - ratio)`` where ``u >= ratio``, else 0. Each step draws a new
mask, the same one for the same step whatever the thread count, and the training graph multiplies
the input by these factors, so the gradient is the same product. NAME_run keeps Dropout the identity.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Graph, Node, Value
from aotc.ops.common import const_input
from aotc.ops.grads.builder import GradBuilder
from aotc.ops.registry import OpDef, register

# SplitMix64's constants (Steele, Lea and Flood, 2014): the Weyl increment and the finalizer's multipliers.
GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
MASK64 = (1 << 64) - 1


def _infer(node: Node):
    return [(tuple(node.attr("shape")), np.dtype(node.attr("dtype")))]


def _emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    n = int(np.prod(node.attr("shape"), dtype=np.int64))
    ratio = float(node.attr("ratio"))
    scale = 1 / (1 - ratio)
    key = int(node.attr("key")) & MASK64
    return "\n".join([
        "if (task != 0) return;  /* cheap next to the layer it follows */", "(void)ntasks;",
        f"const uint64_t base = UINT64_C({key}) ^ ((uint64_t){ins[0]}[0] * UINT64_C({GOLDEN}));",
        f"for (size_t e = 0; e < {n}; e++) {{",
        f"  uint64_t z = base + (uint64_t)e * UINT64_C({GOLDEN});",
        f"  z = (z ^ (z >> 30)) * UINT64_C({MIX1});",
        f"  z = (z ^ (z >> 27)) * UINT64_C({MIX2});",
        "  z ^= z >> 31;",
        f"  {outs[0]}[e] = (float)(z >> 40) * 0x1p-24f >= {ratio!r}f ? ({ctype}){scale!r} : ({ctype})0;",
        "}"])


register(OpDef("aotc.DropoutFactors", "kernel", _infer, emit=_emit))


def dropout_factors(step: int, key: int, ratio: float, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """What aotc.DropoutFactors computes, in numpy (the tests' reference)."""
    n = int(np.prod(shape, dtype=np.int64))
    with np.errstate(over="ignore"):
        base = np.uint64(key & MASK64) ^ (np.uint64(step & MASK64) * np.uint64(GOLDEN))
        z = base + np.arange(n, dtype=np.uint64) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        z ^= z >> np.uint64(31)
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    return np.where(u >= np.float32(ratio), 1 / (1 - ratio), 0).astype(dtype).reshape(shape)


def node_key(seed: int, index: int) -> int:
    """The generator key of the graph's ``index``-th Dropout, whose seed attribute is ``seed`` (0 if none)."""
    return (seed * 1000003 + index + 1) & MASK64


def dropout_ratio(node: Node) -> float:
    r = const_input(node, 1, "the ratio")
    ratio = float(node.attr("ratio", 0.5) if r is None else r.reshape(-1)[0])
    if not 0 <= ratio < 1:
        raise AotcError(f"Dropout node {node.name!r}: ratio {ratio} is not in [0, 1)")
    return ratio


def dropout_training(graph: Graph, step: Value) -> None:
    """Every Dropout of ``graph`` becomes x times factors drawn from ``step`` (its mask output, if read,
    the factors' nonzeros)."""
    b = GradBuilder(graph, "dropout")
    index = 0
    for n in list(graph.nodes):
        if n.op != "Dropout":
            continue
        x = n.inputs[0]
        assert x is not None and x.shape is not None
        f = b.op("aotc.DropoutFactors", step, shape=list(x.shape), dtype=np.dtype(x.dtype).str,
                 ratio=dropout_ratio(n), key=node_key(int(n.attr("seed", 0)), index))
        index += 1
        graph.replace_uses(n.outputs[0], b.op("Mul", x, f))
        if len(n.outputs) > 1:
            graph.replace_uses(n.outputs[1], b.op("Greater", f, b.const(0, x.dtype)))
        graph.nodes.remove(n)
    graph.toposort()


def dropout_inference(graph: Graph) -> None:
    """NAME_run applies no Dropout, whatever training_mode the model gives it."""
    for n in graph.nodes:
        if n.op == "Dropout" and len(n.inputs) > 2:
            n.inputs[2] = None
