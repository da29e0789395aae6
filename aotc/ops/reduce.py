"""Reductions, fused by the loop generator with their elementwise producers and consumers."""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Node
from aotc.ops.common import const_input, norm_axis
from aotc.ops.elementwise import math_fn
from aotc.ops.registry import OpDef, Reduction, register


def reduce_axes(node: Node) -> list[int]:
    """The reduced axes, normalised and sorted; [] means 'nothing' only with noop_with_empty_axes."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    rank = len(x.shape)
    if "axes" in node.attrs:
        axes = [int(a) for a in node.attrs["axes"]]
    else:
        a = const_input(node, 1, "axes")
        axes = [] if a is None else [int(v) for v in a.reshape(-1)]
    if not axes:
        return [] if node.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({norm_axis(a, rank, node) for a in axes})


def _infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    axes = reduce_axes(node)
    keep = node.attr("keepdims", 1)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    return [(shape, x.dtype)]


_MAX = "(({b} != {b} || {b} > {a}) ? {b} : {a})"
_MIN = "(({b} != {b} || {b} < {a}) ? {b} : {a})"

RULES = {
    "ReduceSum": Reduction("0", "{a} + {b}"),
    "ReduceMean": Reduction("0", "{a} + {b}", post="{acc} / {n}"),
    "ReduceMax": Reduction("{lowest}", _MAX),
    "ReduceMin": Reduction("{highest}", _MIN),
    "ReduceProd": Reduction("1", "{a} * {b}"),
    "ReduceL1": Reduction("0", "{a} + {b}", pre="({x} < 0 ? -{x} : {x})"),
    "ReduceL2": Reduction("0", "{a} + {b}", pre="{x} * {x}", post="{sqrt}({acc})", int_ok=False),
    "ReduceSumSquare": Reduction("0", "{a} + {b}", pre="{x} * {x}"),
    "ReduceLogSum": Reduction("0", "{a} + {b}", post="{log}({acc})", int_ok=False),
}
for _name, _rule in RULES.items():
    register(OpDef(_name, "reduce", _infer, reduction=_rule, const_inputs=(1,)))


def _offset(index: str, dims: list[int], shape: tuple[int, ...], strides: list[int]) -> str:
    """C expression: the input offset of element ``index`` of the sub-array spanning ``dims``."""
    terms, q = [], 1
    for d in reversed(dims):
        if shape[d] > 1:
            terms.append(f"(({index} / {q}) % {shape[d]}) * {strides[d]}")
        q *= shape[d]
    return " + ".join(terms) or "0"


def _logsumexp_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    # Two passes over each reduced set, max then sum of exp(x - max), so large inputs do not
    # overflow: the one-pass Reduction rule cannot carry the running max.
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    axes = reduce_axes(node)
    if not axes and node.attr("noop_with_empty_axes", 0):
        return f"for (size_t e = task; e < {x.size}; e += ntasks) {outs[0]}[e] = {ins[0]}[e];"
    kept = [d for d in range(len(x.shape)) if d not in axes]
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(len(x.shape))]
    n_out = int(np.prod([x.shape[d] for d in kept]))
    n_red = int(np.prod([x.shape[d] for d in axes]))
    exp, log = math_fn("exp", ctype), math_fn("log", ctype)
    return (f"for (size_t e = task; e < {n_out}; e += ntasks) {{\n"
            f"  const {ctype} *xr = {ins[0]} + {_offset('e', kept, x.shape, strides)};\n"
            f"  {ctype} m = -INFINITY, s = 0;\n"
            f"  for (size_t r = 0; r < {n_red}; r++) {{ const {ctype} v = xr[{_offset('r', axes, x.shape, strides)}]; "
            f"m = (v > m || v != v) ? v : m; }}\n"
            f"  if (m == INFINITY || m == -INFINITY || m != m) {{ {outs[0]}[e] = m; continue; }}\n"
            f"  for (size_t r = 0; r < {n_red}; r++) s += {exp}(xr[{_offset('r', axes, x.shape, strides)}] - m);\n"
            f"  {outs[0]}[e] = m + {log}(s);\n}}")


register(OpDef("ReduceLogSumExp", "kernel", _infer, emit=_logsumexp_emit, const_inputs=(1,)))
