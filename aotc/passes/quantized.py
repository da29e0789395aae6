"""Quantized convolutions as integer kernels.

``fuse_qdq`` (before shape inference, while the weights are still int8 constants behind their
DequantizeLinear): onnxruntime's QDQ form, ``DequantizeLinear(x) -> Conv(DequantizeLinear(w),
DequantizeLinear(int32 bias)) -> [Relu] -> QuantizeLinear``, becomes the one QLinearConv it stands
for, as onnxruntime's own QDQ transformer does (the int32 bias is the accumulator's, its scale
x_scale * w_scale); a Relu before the QuantizeLinear clamps at the output zero point (``_relu``).
Without it, aotc would run the float conv between elementwise (de)quantizations. A MaxPool between a
DequantizeLinear and a QuantizeLinear of the same scale and zero point pools the 8-bit values.

``lower_qlinear`` (after inference): a 2-D QLinearConv with constant int8 weights of zero point 0 and
constant scales and zero points becomes ``aotc.QLinearConv`` (``aotc/ops/int8_conv.py``): weights
packed once for the dot-product kernels, the bias and the input zero point's correction folded into
one int32 per channel, the requantization multipliers computed as onnxruntime computes them.
"""

from __future__ import annotations

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value
from aotc.ops import int8_conv
from aotc.ops.integer import qconv_geometry

_QTYPES = (np.dtype(np.uint8), np.dtype(np.int8))


def _const(v: Value | None) -> np.ndarray | None:
    return v.const if v is not None and v.is_const else None


def _dq(v: Value | None) -> Node | None:
    """The DequantizeLinear producing ``v`` with constant scale and zero point (given)."""
    p = v.producer if v is not None else None
    if p is None or p.op != "DequantizeLinear" or len(p.inputs) < 3:
        return None
    if _const(p.inputs[1]) is None or _const(p.inputs[2]) is None or p.attr("block_size", 0):
        return None
    return p


def _only_user(v: Value, users: dict[int, list[Node]], fetched: set[int], op: str) -> Node | None:
    us = users.get(id(v), [])
    return us[0] if len(us) == 1 and us[0].op == op and id(v) not in fetched else None


def _qdq_conv(conv: Node, users: dict[int, list[Node]], fetched: set[int]) -> tuple[Node, Node] | None:
    """(the QuantizeLinear to replace, the QLinearConv replacing it) for a QDQ conv, else None."""
    dx, dw = _dq(conv.inputs[0]), _dq(conv.inputs[1])
    if dx is None or dw is None or _const(dw.inputs[0]) is None:
        return None
    sx, zx = _const(dx.inputs[1]), _const(dx.inputs[2])
    w, sw, zw = _const(dw.inputs[0]), _const(dw.inputs[1]), _const(dw.inputs[2])
    assert sx is not None and zx is not None and w is not None and sw is not None and zw is not None
    if sx.size != 1 or zx.size != 1 or zx.dtype not in _QTYPES or w.dtype not in _QTYPES or w.ndim < 3:
        return None
    if sw.size != 1 and (sw.size != w.shape[0] or int(dw.attr("axis", 1)) % w.ndim != 0):
        return None
    bias = None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        db = _dq(conv.inputs[2])
        b = _const(db.inputs[0]) if db is not None else None
        if db is None or b is None or b.dtype != np.int32 or np.any(_const(db.inputs[2])):
            return None
        sb = _const(db.inputs[1])
        assert sb is not None
        if not np.allclose(sb.reshape(-1), (np.float32(sx.reshape(-1)[0]) * sw.reshape(-1)).astype(np.float32),
                           rtol=1e-6, atol=0):
            return None
        bias = db.inputs[0]
    out, relu = conv.outputs[0], False
    nxt = _only_user(out, users, fetched, "Relu")
    if nxt is not None:
        out, relu = nxt.outputs[0], True
    q = _only_user(out, users, fetched, "QuantizeLinear")
    if q is None or len(q.inputs) < 3 or _const(q.inputs[1]) is None or _const(q.inputs[2]) is None:
        return None
    sy, zy = _const(q.inputs[1]), _const(q.inputs[2])
    assert sy is not None and zy is not None
    if sy.size != 1 or zy.size != 1 or zy.dtype not in _QTYPES or sx.dtype != np.float32 or sy.dtype != np.float32:
        return None
    inputs = [dx.inputs[0], dx.inputs[1], dx.inputs[2], dw.inputs[0], dw.inputs[1], dw.inputs[2], q.inputs[1],
              q.inputs[2]] + ([bias] if bias is not None else [])
    attrs = {k: v for k, v in conv.attrs.items()} | ({"_relu": 1} if relu else {})
    return q, Node("QLinearConv", inputs, [q.outputs[0]], attrs, f"{conv.name}/qlinear")


def _qdq_maxpool(pool: Node, users: dict[int, list[Node]], fetched: set[int]) -> tuple[Node, Node] | None:
    """``DequantizeLinear(x) -> MaxPool -> QuantizeLinear`` with the same scale (> 0) and zero point is
    MaxPool on the 8-bit ``x``: the quantization is monotonic and gives back each integer exactly."""
    dx = _dq(pool.inputs[0])
    if dx is None or len(pool.outputs) != 1:
        return None
    q = _only_user(pool.outputs[0], users, fetched, "QuantizeLinear")
    if q is None or len(q.inputs) < 3 or _const(q.inputs[1]) is None or _const(q.inputs[2]) is None:
        return None
    s, z, sq, zq = _const(dx.inputs[1]), _const(dx.inputs[2]), _const(q.inputs[1]), _const(q.inputs[2])
    assert s is not None and z is not None and sq is not None and zq is not None
    if s.size != 1 or z.size != 1 or z.dtype not in _QTYPES or s.dtype != np.float32 or not s.reshape(-1)[0] > 0:
        return None
    if sq.size != 1 or zq.size != 1 or sq.dtype != s.dtype or zq.dtype != z.dtype \
            or sq.reshape(-1)[0] != s.reshape(-1)[0] or zq.reshape(-1)[0] != z.reshape(-1)[0]:
        return None
    return q, Node("MaxPool", [dx.inputs[0]], [q.outputs[0]], dict(pool.attrs), f"{pool.name}/uint8")


def fuse_qdq(graph: Graph) -> bool:
    users = graph.consumers()
    fetched = {id(v) for v in graph.outputs}
    replaced: dict[int, Node] = {}
    for n in graph.nodes:
        if n.op in ("Conv", "MaxPool"):
            hit = (_qdq_conv if n.op == "Conv" else _qdq_maxpool)(n, users, fetched)
            if hit is not None:
                replaced[id(hit[0])] = hit[1]
    if not replaced:
        return False
    nodes = [replaced.get(id(n), n) for n in graph.nodes]
    for n in nodes:
        for v in n.outputs:
            v.producer = n
    graph.nodes = _without_dead(nodes, graph.outputs)
    return True


def _packed(node: Node) -> Node | None:
    """The ``aotc.QLinearConv`` computing the QLinearConv ``node``, if its operands allow."""
    x = node.inputs[0]
    if x is None or x.shape is None or len(x.shape) != 4 or x.dtype not in _QTYPES or len(node.inputs) < 8:
        return None
    consts = [_const(v) for v in node.inputs[1:8]]
    if any(c is None for c in consts):
        return None
    sx, zx, w, sw, zw, sy, zy = consts  # type: ignore[misc]
    if w.dtype != np.int8 or np.any(zw) or sx.size != 1 or zx.size != 1 or sy.size != 1 or zy.size != 1:
        return None
    b = _const(node.inputs[8]) if len(node.inputs) > 8 and node.inputs[8] is not None else None
    if len(node.inputs) > 8 and node.inputs[8] is not None and b is None:
        return None
    g = qconv_geometry(node)
    if g.group != 1 or g.k[0] != 1 or w.shape[0] != g.m:
        return None
    flip = x.dtype == np.int8
    zero = int(zx.reshape(-1)[0]) + (128 if flip else 0)
    cp = -(-g.c // 4) * 4
    blocks = -(-g.m // int8_conv.BLOCK)
    wsum = w.reshape(g.m, -1).astype(np.int64).sum(axis=1)
    comp = np.zeros(blocks * int8_conv.BLOCK, np.int64)
    comp[:g.m] = (b.reshape(-1).astype(np.int64) if b is not None else 0) - zero * wsum
    mul = np.zeros(blocks * int8_conv.BLOCK, np.float32)
    scale = np.broadcast_to(sw.reshape(-1).astype(np.float32), (g.m,))
    mul[:g.m] = np.float32(sx.reshape(-1)[0]) * scale / np.float32(sy.reshape(-1)[0])
    out = node.outputs[0]
    info = np.iinfo(out.dtype)
    yzp = int(zy.reshape(-1)[0])
    attrs = {"kernel_shape": [g.k[1], g.k[2]], "strides": [g.s[1], g.s[2]], "dilations": [g.d[1], g.d[2]],
             "pads": [g.pb[1], g.pb[2], g.pe[1], g.pe[2]], "m": g.m, "out_type": dtypes.onnx_type(out.dtype),
             "x_pad": zero, "flip": int(flip), "y_zero_point": yzp,
             "lo": max(int(info.min), yzp) if node.attr("_relu", 0) else int(info.min), "hi": int(info.max)}
    packed = Graph.constant(int8_conv.pack_weights(w.reshape(g.m, g.c, g.k[1], g.k[2]), cp), f"{node.name}/packed")
    c = Graph.constant(((comp + 2**31) % 2**32 - 2**31).astype(np.int32), f"{node.name}/comp")
    m = Graph.constant(mul, f"{node.name}/mul")
    new = Node("aotc.QLinearConv", [x, packed, c, m], [out], attrs, node.name)
    int8_conv.check(new)
    return new


def lower_qlinear(graph: Graph) -> bool:
    changed = False
    for i, n in enumerate(graph.nodes):
        if n.op == "QLinearConv":
            new = _packed(n)
            if new is not None:
                graph.nodes[i] = new
                new.outputs[0].producer = new
                changed = True
    return changed


def _without_dead(nodes: list[Node], outputs: list[Value]) -> list[Node]:
    live = {id(v) for v in outputs}
    keep = []
    for n in reversed(nodes):
        if any(id(v) in live for v in n.outputs):
            keep.append(n)
            live.update(id(v) for v in n.inputs if v is not None)
    return keep[::-1]
