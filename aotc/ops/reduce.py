"""Reductions, fused by the loop generator with their elementwise producers and consumers."""

from __future__ import annotations

from aotc.ir.graph import Node
from aotc.ops.common import const_input, norm_axis
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
    "ReduceLogSumExp": Reduction("0", "{a} + {b}", pre="{exp}({x})", post="{log}({acc})", int_ok=False),
}
for _name, _rule in RULES.items():
    register(OpDef(_name, "reduce", _infer, reduction=_rule, const_inputs=(1,)))
