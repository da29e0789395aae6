"""Emulated element types (bfloat16, float8, int4, ...; see ``aotc.ir.dtypes``) outside fused loops.

Fused loops convert emulated values to their compute type on every read, but kernels written by an
op's ``emit``, GEMM and convolution compute on their operands' C type, which for an emulated type is
only its storage container. Such an op gets widened operands instead: a Cast to float32 (int32 for
the small integers) before it and a Cast back after it, so it runs on a type C has and its result is
rounded once, as the reference rounds each op. Data-movement kernels (Gather, Concat, ...) stay exact
through the round trip, since every value of an emulated type is a float32 (int32) value. Softmax and
Attention are not widened: their kernels read the emulated type and round each step of their own, as
the reference does (one rounding at the end differs from it by an ulp).

float16 has a C type, but the normalization row kernels are written for float and double: they get
float32 operands the same way (onnxruntime also normalizes float16 in float32 and rounds once).
"""

from __future__ import annotations

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value
from aotc.ops import OPS

# Kinds whose code goes through the loop emitter, which handles emulated types itself.
_LOOP_KINDS = ("elementwise", "view", "alias", "reduce", "static")
# Kernels that compute on emulated types themselves, rounding each step as the reference does.
_ROUNDING_KERNELS = ("Softmax", "Attention")
# Kernels without a float16 path.
_FLOAT_KERNELS = ("LayerNormalization", "InstanceNormalization", "GroupNormalization")


def _wide(dt: np.dtype, op: str) -> np.dtype | None:
    """The type ``op`` computes a ``dt`` operand in, or None when it takes ``dt`` as it is."""
    if dt == np.float16 and op in _FLOAT_KERNELS:
        return np.dtype(np.float32)
    em = dtypes.emulated(dt)
    if em is None:
        return None
    return np.dtype(np.float32 if em.compute == "float" else np.int32)


def _cast(src: Value, out: Value, name: str) -> Node:
    # saturate=0: an op's overflow gives inf/NaN, as the reference's ml_dtypes arithmetic does.
    node = Node("Cast", [src], [out], {"to": dtypes.onnx_type(out.dtype), "saturate": 0}, name)
    out.producer = node
    return node


def widen_emulated(graph: Graph) -> bool:
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        if OPS[node.op].kind in _LOOP_KINDS or node.op in _ROUNDING_KERNELS or not any(
                v is not None and _wide(v.dtype, node.op) for v in [*node.inputs, *node.outputs]):
            nodes.append(node)
            continue
        changed = True
        after = []
        for i, v in enumerate(node.inputs):
            wide = None if v is None else _wide(v.dtype, node.op)
            if v is None or wide is None:
                continue
            if v.is_const:
                node.inputs[i] = Graph.constant(v.const.astype(wide), f"{v.name}_wide")
            else:
                w = Value(f"{v.name}_wide", v.shape, wide)
                nodes.append(_cast(v, w, f"{node.name}_widen{i}"))
                node.inputs[i] = w
        for j, out in enumerate(node.outputs):
            wide = _wide(out.dtype, node.op)
            if wide is None:
                continue
            w = Value(f"{out.name}_wide", out.shape, wide, node)
            node.outputs[j] = w
            after.append(_cast(w, out, f"{node.name}_narrow{j}"))
        nodes += [node, *after]
    graph.nodes = nodes
    return changed
