"""Algebraic simplification: remove no-ops, canonicalise, and fold scale/shift into weights.

- Identity and inference Dropout disappear; the reshape family becomes one canonical Reshape, and
  chains of reshapes collapse into one.
- Gemm becomes MatMul (+ scale and bias as elementwise ops the GEMM epilogue absorbs).
- BatchNormalization becomes ``x * s + t`` with per-channel constants; a per-column scale right
  after a MatMul by constant weights is folded into the weights (BN after Gemm/Linear), and a
  per-channel scale or shift right after a Conv with constant weights into its weights and bias.
"""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Graph, Node, Value
from aotc.ops.nn import bn_training, dropout_mask


class _Rewriter:
    """Builds the new node list; replacement nodes are emitted where the old node stood."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.changed = False

    def node(self, op: str, inputs: list[Value | None], attrs: dict | None = None, name: str = "",
             out: Value | None = None) -> Value:
        """Emit a node; with ``out`` the node defines that existing value (keeping its identity)."""
        outputs = [out] if out is not None else [Value(f"{name}:{op}")]
        n = Node(op, inputs, outputs, {"_opset": self.graph.opset, **(attrs or {})}, name)
        for v in outputs:
            v.producer = n
        self.nodes.append(n)
        return outputs[0]


def _const(arr: np.ndarray | float, like: Value | None = None, name: str = "c") -> Value:
    """A constant with ``like``'s dtype (or the array's own, for shape tensors)."""
    dt = like.dtype if like is not None else np.asarray(arr).dtype
    return Graph.constant(np.asarray(arr, dtype=dt), name)


def simplify(graph: Graph) -> bool:
    rw = _Rewriter(graph)
    users = graph.consumers()
    replace: dict[int, Value] = {}

    def get(v: Value | None) -> Value | None:
        while v is not None and id(v) in replace:
            v = replace[id(v)]
        return v

    for n in graph.nodes:
        n.inputs = [get(v) for v in n.inputs]
        x = n.inputs[0] if n.inputs else None
        if n.op in ("Identity", "Dropout"):
            drawn = dropout_mask(n) if n.op == "Dropout" else None
            if drawn is None:
                replace[id(n.outputs[0])] = x  # type: ignore[assignment]
            else:
                rw.node("Mul", [x, Graph.constant(drawn[1], "dropout_factor")], {}, n.name, out=n.outputs[0])
            if len(n.outputs) > 1 and (id(n.outputs[1]) in users or any(o is n.outputs[1] for o in graph.outputs)):
                if drawn is not None:
                    replace[id(n.outputs[1])] = Graph.constant(drawn[0], "mask")
                else:  # every element kept: a broadcast true, not a constant as large as the tensor
                    rw.node("Expand", [_const(np.ones(1, np.bool_)), _const(np.array(n.outputs[1].shape, np.int64))],
                            {}, f"{n.name}_mask", out=n.outputs[1])
            rw.changed = True
            continue
        if n.op in ("Flatten", "Squeeze", "Unsqueeze") or (n.op == "Reshape" and x is not None
                                                            and x.producer is not None
                                                            and x.producer.op == "Reshape"):
            src = x
            if src is not None and src.producer is not None and src.producer.op == "Reshape":
                src = src.producer.inputs[0]
            out = n.outputs[0]
            shape = _const(np.array(out.shape, np.int64), name="shape")
            rw.node("Reshape", [src, shape], {}, n.name, out=out)
            rw.changed = True
            continue
        if n.op == "Reshape" and x is not None and x.shape == n.outputs[0].shape:
            replace[id(n.outputs[0])] = x
            rw.changed = True
            continue
        if n.op == "Gemm":
            _gemm(rw, n)
            continue
        if n.op == "BatchNormalization" and not bn_training(n):  # batch statistics: a kernel
            _batchnorm(rw, n)
            continue
        if n.op in ("Mul", "Add") and _fold_into_conv(rw, n, users):
            continue
        if n.op == "Mul" and _fold_scale_into_matmul(rw, n, users):
            continue
        if n.op == "Add" and _merge_constant_adds(rw, n, users):
            continue
        rw.nodes.append(n)

    graph.nodes = rw.nodes
    graph.outputs = [get(v) for v in graph.outputs]  # type: ignore[misc]
    return rw.changed


def _gemm(rw: _Rewriter, n: Node) -> None:
    a, b = n.inputs[0], n.inputs[1]
    c = n.inputs[2] if len(n.inputs) > 2 else None
    assert a is not None and b is not None
    if n.attr("transA", 0):
        a = rw.node("Transpose", [a], {"perm": [1, 0]}, n.name)
    if n.attr("transB", 0):
        b = rw.node("Transpose", [b], {"perm": [1, 0]}, n.name)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    out = n.outputs[0]
    y = rw.node("MatMul", [a, b], {}, n.name, out=None if (alpha != 1.0 or c is not None) else out)
    if alpha != 1.0:
        y = rw.node("Mul", [y, _const(alpha, a)], {}, n.name, out=None if c is not None else out)
    if c is not None:
        if beta != 1.0:
            c = rw.node("Mul", [c, _const(beta, c)], {}, n.name)
        rw.node("Add", [y, c], {}, n.name, out=out)
    rw.changed = True


def _batchnorm(rw: _Rewriter, n: Node) -> None:
    x, scale, bias, mean, var = n.inputs[:5]
    assert x is not None and x.shape is not None
    eps = float(n.attr("epsilon", 1e-5))
    # Per-channel constants shaped to broadcast over [N, C, ...].
    chan_shape = [-1] + [1] * (len(x.shape) - 2)
    shape = _const(np.array(chan_shape, np.int64), name="shape")
    s = rw.node("Div", [scale, rw.node("Sqrt", [rw.node("Add", [var, _const(eps, var)], {}, n.name)],
                                       {}, n.name)], {}, n.name)
    t = rw.node("Sub", [bias, rw.node("Mul", [mean, s], {}, n.name)], {}, n.name)
    s = rw.node("Reshape", [s, shape], {}, n.name)
    t = rw.node("Reshape", [t, shape], {}, n.name)
    rw.node("Add", [rw.node("Mul", [x, s], {}, n.name), t], {}, n.name, out=n.outputs[0])
    rw.changed = True


def _fold_scale_into_matmul(rw: _Rewriter, n: Node, users: dict[int, list[Node]]) -> bool:
    """Mul(MatMul(A, W), s) with constant W and s varying only along columns -> MatMul(A, W * s)."""
    m, s = n.inputs
    if m is None or s is None or not s.is_const:
        m, s = s, m
    if m is None or s is None or not s.is_const or m.producer is None:
        return False
    if m.producer.op == "Add" and len(users.get(id(m), [])) == 1 and not any(o is m for o in rw.graph.outputs):
        return _distribute_scale(rw, n, m.producer, s, users)
    if m.producer.op != "MatMul":
        return False
    w = m.producer.inputs[1]
    if w is None or not w.is_const or len(w.shape) != 2 or len(users.get(id(m), [])) != 1 \
            or any(o is m for o in rw.graph.outputs):  # a fetched product must keep its value
        return False
    if m.shape != n.outputs[0].shape or any(d != 1 for d in s.shape[:-1]) or m.dtype != s.dtype:
        return False
    col = s.const.reshape(-1)
    if col.size not in (1, w.shape[1]):
        return False
    scaled = _const(w.const * col[None, :] if col.size > 1 else w.const * col[0], w, w.name)
    prod = m.producer
    rw.nodes = [x for x in rw.nodes if x is not prod]
    rw.node("MatMul", [prod.inputs[0], scaled], {}, prod.name, out=n.outputs[0])
    rw.changed = True
    return True


def _merge_constant_adds(rw: _Rewriter, n: Node, users: dict[int, list[Node]]) -> bool:
    """Add(Add(x, c1), c2) -> Add(x, c1 + c2): a bias followed by a folded BatchNorm shift."""
    inner, c2 = n.inputs
    if inner is None or c2 is None or not c2.is_const:
        inner, c2 = c2, inner
    if inner is None or c2 is None or not c2.is_const or inner.producer is None \
            or inner.producer.op != "Add" or len(users.get(id(inner), [])) != 1 \
            or any(o is inner for o in rw.graph.outputs):
        return False
    x, c1 = inner.producer.inputs
    if c1 is None or not c1.is_const:
        x, c1 = c1, x
    if x is None or c1 is None or not c1.is_const or c1.dtype != c2.dtype or x.shape != n.outputs[0].shape:
        return False
    add = inner.producer
    rw.nodes = [y for y in rw.nodes if y is not add]
    rw.node("Add", [x, _const(c1.const + c2.const, c1, c1.name)], {}, n.name, out=n.outputs[0])
    rw.changed = True
    return True


def _distribute_scale(rw: _Rewriter, n: Node, add: Node, s: Value, users: dict[int, list[Node]]) -> bool:
    """Mul(Add(MatMul, c), s) -> Add(Mul(MatMul, s), c * s), so the scale can reach the weights."""
    m, c = add.inputs
    if c is None or not c.is_const:
        m, c = c, m
    if (m is None or c is None or not c.is_const or m.producer is None or m.producer.op != "MatMul"
            or len(users.get(id(m), [])) != 1 or m.shape != n.outputs[0].shape
            or any(o is m for o in rw.graph.outputs)):
        return False
    cs = _const(c.const * s.const, c, c.name)
    if cs.shape != c.shape and len(cs.shape) > len(n.outputs[0].shape):
        return False
    rw.nodes = [x for x in rw.nodes if x is not add]
    scaled = rw.node("Mul", [m, s], {}, n.name)
    rw.node("Add", [scaled, cs], {}, add.name, out=n.outputs[0])
    rw.changed = True
    return True


def _per_channel(c: Value, rank: int) -> np.ndarray | None:
    """A constant broadcast over [N, C, ...] that varies at most along C, as its C (or 1) values."""
    shape = (1,) * (rank - len(c.shape)) + tuple(c.shape)
    if len(shape) != rank or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return c.const.reshape(-1)


def _fold_into_conv(rw: _Rewriter, n: Node, users: dict[int, list[Node]]) -> bool:
    """Mul(Conv(x, W, b), s) -> Conv(x, W * s, b * s); Add(Conv(x, W, b), t) -> Conv(x, W, b + t)
    for per-channel constants s, t and constant W, b (BatchNormalization after a Conv)."""
    y, c = n.inputs
    if c is None or not c.is_const:
        y, c = c, y
    if y is None or c is None or not c.is_const or y.producer is None or y.producer.op != "Conv":
        return False
    conv = y.producer
    w = conv.inputs[1]
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    if w is None or not w.is_const or (b is not None and not b.is_const) or len(users.get(id(y), [])) != 1 \
            or any(o is y for o in rw.graph.outputs) \
            or y.shape != n.outputs[0].shape or c.dtype != y.dtype or len(c.shape) > len(y.shape):
        return False
    vec = _per_channel(c, len(y.shape))
    m = w.shape[0]
    if vec is None or vec.size not in (1, m):
        return False
    vec = np.broadcast_to(vec, (m,))
    bias = b.const if b is not None else np.zeros(m, w.dtype)
    if n.op == "Mul":
        w = _const(w.const * vec.reshape((m,) + (1,) * (len(w.shape) - 1)), w, w.name)
        bias = bias * vec
    else:
        bias = bias + vec
    rw.nodes = [x for x in rw.nodes if x is not conv]
    attrs = {k: v for k, v in conv.attrs.items() if k != "_opset"}
    rw.node("Conv", [conv.inputs[0], w, _const(bias, c, "conv_bias")], attrs, conv.name, out=n.outputs[0])
    rw.changed = True
    return True
