"""Which path a Conv takes (``conv_path``), its scratch, its packed weights and its kernel, and what
its kernel may hold (the fusion hooks registered on its OpDef)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.conv.common import Epilogue, Geometry, fast_rows, geometry
from aotc.ops.conv.depthwise import depthwise_conv, phase_scratch, use_phase
from aotc.ops.conv.direct import generic_conv, pack_conv_weights, tile_plan, tiled_conv, tiled_scratch_floats
from aotc.ops.conv.expand_depthwise import fusable
from aotc.ops.conv.pointwise import pointwise_conv, pointwise_plan, pointwise_scratch_floats
from aotc.ops.conv.rows import pack_rows_weights, rows_chunk, rows_conv, rows_pack, rows_plan
from aotc.ops.conv.winograd import pack_winograd_weights, winograd_conv, winograd_plan, winograd_scratch_floats

if TYPE_CHECKING:
    from aotc.target import Target


def conv_scratch_floats(g: Geometry, path: str, target: Target) -> int:
    """Scratch floats per task: the zero-padded input planes of the tiled path, the input panels of
    the 1x1 path."""
    if path == "rows":
        plan = rows_plan(g, target)
        assert plan is not None
        pv = plan[1] * plan[2]
        if not rows_pack(g, plan):
            return 0
        return rows_chunk(g, g.c // g.group, pv, target) * (g.c // g.group)
    if path == "depthwise":
        return phase_scratch(g) if use_phase(g) else 0
    if path == "winograd":
        return winograd_scratch_floats(g, winograd_plan(g, target))
    if path == "tiled" and pointwise_plan(g, target) is not None:
        return pointwise_scratch_floats(g, target)
    return tiled_scratch_floats(g, target) if path == "tiled" else 0


def conv_path(node: Node, target: Target) -> str:
    """Which code path ``conv_kernel`` takes: "winograd", "rows", "tiled", "depthwise" or "generic"."""
    x, w = node.inputs[0], node.inputs[1]
    if x.dtype != np.float32:
        return "generic"
    g = geometry(node)
    if not fast_rows(g):
        return "generic"
    if g.c // g.group == 1:
        return "depthwise"
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if not w.is_const or (b is not None and not b.is_const):
        return "generic"
    if winograd_plan(g, target) is not None:
        return "winograd"
    if pointwise_plan(g, target) is not None:
        return "tiled"
    return "rows" if rows_plan(g, target) is not None else "tiled"


def conv_kernel(node: Node, path: str, x: str, w: str, b: str | None, y: str, target: Target, fn: str,
                epi: Epilogue | None = None, packed: str | None = None) -> tuple[str, str]:
    """(helpers, body) of a Conv kernel on ``path`` (``conv_path``'s choice, kept in the kernel's plan);
    helpers are named after ``fn``. ``packed`` names ``pack_weights``'s output."""
    g = geometry(node)
    if path == "winograd":
        assert packed is not None
        return winograd_conv(g, x, packed, y, target, epi, f"{fn}_wg", winograd_plan(g, target))
    if path == "rows":
        assert packed is not None
        return rows_conv(g, x, packed, y, target, epi, f"{fn}_rows")
    if path == "tiled" and pointwise_plan(g, target) is not None:
        assert packed is not None
        return pointwise_conv(g, x, packed, y, target, epi, f"{fn}_pw")
    if path == "tiled":
        assert packed is not None
        return tiled_conv(g, x, packed, y, target, epi, f"{fn}_tile")
    if path == "depthwise":
        return depthwise_conv(g, x, w, b, y, target, epi, fn)
    return "", generic_conv(g, x, w, b, y, dtypes.c_type(node.outputs[0].dtype), epi)


def pack_weights(node: Node, path: str, target: Target) -> np.ndarray | None:
    """Conv ``node``'s weights (and bias) packed at compile time into the layout of ``path``, or None
    for the paths that read them as they are (depthwise, generic)."""
    if path not in ("tiled", "rows", "winograd"):
        return None
    g = geometry(node)
    w, b = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    bc = None if b is None else b.const
    if path == "winograd":
        return pack_winograd_weights(w.const, bc, g, winograd_plan(g, target))
    rows = rows_plan(g, target) if path == "rows" else None
    if rows is not None:
        return pack_rows_weights(w.const, bc, g, rows[0])
    return pack_conv_weights(w.const, bc, g, tile_plan(g, target))


def can_take_epilogue(node: Node, out: Value, target: Target) -> bool:
    """Every conv path applies an elementwise chain to each output value before its store, in the
    Conv's own dtype."""
    y = node.outputs[0]
    return out.shape == y.shape and out.dtype == y.dtype


def can_take_prologue(node: Node, producer: Node, target: Target) -> bool:
    """A depthwise conv computes its input inside when that is an expanding 1x1 Conv
    (expand_depthwise.py)."""
    return producer.op == "Conv" and fusable(producer, node, target)
