"""Algebraic simplification: remove no-ops, canonicalise, and fold scale/shift into weights.

- Identity and inference Dropout disappear; the reshape family becomes one canonical Reshape, and
  chains of reshapes collapse into one.
- Gemm becomes MatMul (+ scale and bias as elementwise ops the GEMM epilogue absorbs).
- BatchNormalization becomes ``x * s + t`` with per-channel constants; a per-column scale right
  after a MatMul by constant weights is folded into the weights (BN after Gemm/Linear).
"""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Graph, Node, Value


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
            replace[id(n.outputs[0])] = x  # type: ignore[assignment]
            if len(n.outputs) > 1 and (id(n.outputs[1]) in users or any(o is n.outputs[1] for o in graph.outputs)):
                mask = Graph.constant(np.ones(n.outputs[1].shape, np.bool_), "mask")
                replace[id(n.outputs[1])] = mask
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
        if n.op == "BatchNormalization":
            _batchnorm(rw, n)
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
    if m.producer.op == "Add" and len(users.get(id(m), [])) == 1:
        return _distribute_scale(rw, n, m.producer, s, users)
    if m.producer.op != "MatMul":
        return False
    w = m.producer.inputs[1]
    if w is None or not w.is_const or len(w.shape) != 2 or len(users.get(id(m), [])) != 1:
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
            or inner.producer.op != "Add" or len(users.get(id(inner), [])) != 1:
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
            or len(users.get(id(m), [])) != 1 or m.shape != n.outputs[0].shape):
        return False
    cs = _const(c.const * s.const, c, c.name)
    if cs.shape != c.shape and len(cs.shape) > len(n.outputs[0].shape):
        return False
    rw.nodes = [x for x in rw.nodes if x is not add]
    scaled = rw.node("Mul", [m, s], {}, n.name)
    rw.node("Add", [scaled, cs], {}, add.name, out=n.outputs[0])
    rw.changed = True
    return True
