"""Gradients of MatMul and Gemm, as matrix products of the cotangent with the other operand."""

from __future__ import annotations

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.index import einsum_terms


def _rows(b: GradBuilder, v: Value) -> Value:
    """``v``'s batch of matrices stacked into one: [..., M, K] -> [prod(...) * M, K]."""
    return b.reshape(v, (v.size // v.shape[-1], v.shape[-1]))


@rule("MatMul")
def _matmul(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g, (x, w) = dys[0], node.inputs
    assert g is not None and x is not None and w is not None
    # 1-D operands are matrices of one row (A) or one column (B), as numpy.matmul promotes them.
    a = b.reshape(x, (1, *x.shape)) if len(x.shape) == 1 else x
    m = b.reshape(w, (*w.shape, 1)) if len(w.shape) == 1 else w
    batch = max(len(a.shape), len(m.shape)) - 2
    full = (*g.shape[:batch], a.shape[-2], m.shape[-1])
    g2 = b.reshape(g, full)
    ga = gw = None
    if needs[0]:
        if len(a.shape) == 2 and m.shape[:-2] == full[:-2] and batch:  # A shared by the batch: one product
            ga = b.op("MatMul", _rows_t(b, g2), _rows(b, b.swap_last(m)))
        else:
            ga = b.sum_to(_times_t(b, g2, m), a.shape)
        ga = b.reshape(ga, x.shape)
    if needs[1]:
        if len(m.shape) == 2 and a.shape[:-2] == full[:-2] and batch:  # B shared (a Linear on a sequence)
            gw = b.op("MatMul", b.swap_last(_rows(b, a)), _rows(b, g2))
        else:
            gw = b.sum_to(_t_times(b, a, g2), m.shape)
        gw = b.reshape(gw, w.shape)
    return [ga, gw]


def _times_t(b: GradBuilder, p: Value, q: Value) -> Value:
    """p @ q^T (over the last two axes), as (q @ p^T)^T when transposing q would copy more."""
    if b.transpose_cost(q) <= b.transpose_cost(p) + p.size // max(p.shape[-1], 1) * q.shape[-2]:
        return b.op("MatMul", p, b.swap_last(q))
    return b.swap_last(b.op("MatMul", q, b.swap_last(p)))


def _t_times(b: GradBuilder, p: Value, q: Value) -> Value:
    """p^T @ q, as (q^T @ p)^T when transposing p would copy more (an im2col's columns, say)."""
    if b.transpose_cost(p) <= b.transpose_cost(q) + p.size // max(p.shape[-2], 1) * q.shape[-1]:
        return b.op("MatMul", b.swap_last(p), q)
    return b.swap_last(b.op("MatMul", b.swap_last(q), p))


def _rows_t(b: GradBuilder, v: Value) -> Value:
    """The batch of [M, N] matrices of ``v`` laid side by side: [..., M, N] -> [M, prod(...) * N]."""
    r = len(v.shape)
    t = b.transpose(v, [r - 2, *range(r - 2), r - 1])
    return b.reshape(t, (v.shape[-2], v.size // v.shape[-2]))


@rule("Gemm")
def _gemm(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Y = alpha A' B' + beta C with A' = A or its transpose (transA), B' likewise."""
    g, x, w = dys[0], node.inputs[0], node.inputs[1]
    assert g is not None and x is not None and w is not None
    ta, tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    ga = gw = gc = None
    if needs[0]:  # dA' = g B'^T; dA = dA'^T = B' g^T under transA
        ga = b.op("MatMul", b.transpose(w, [1, 0]) if tb else w, b.transpose(g, [1, 0])) if ta else \
            b.op("MatMul", g, w if tb else b.transpose(w, [1, 0]))
        ga = b.scale(ga, alpha)
    if needs[1]:  # dB' = A'^T g; dB = g^T A' under transB
        gw = b.op("MatMul", b.transpose(g, [1, 0]), b.transpose(x, [1, 0]) if ta else x) if tb else \
            b.op("MatMul", x if ta else b.transpose(x, [1, 0]), g)
        gw = b.scale(gw, alpha)
    if len(needs) > 2 and needs[2]:
        c = node.inputs[2]
        assert c is not None
        gc = b.sum_to(b.scale(g, beta), c.shape)
    return [ga, gw, gc]


@rule("Einsum")
def _einsum(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """d operand i = an Einsum of the cotangent with the other operands onto i's indices; indices only i
    has were summed in the forward and come back by broadcasting, i's broadcast (size-1) axes are summed."""
    g = dys[0]
    assert g is not None
    terms, rhs, _ = einsum_terms(node)
    grads: Grads = []
    for i, (t, v, need) in enumerate(zip(terms, node.inputs, needs, strict=True)):
        assert v is not None
        if not need:
            grads.append(None)
            continue
        if len(set(t)) != len(t):
            raise AotcError(f"Einsum node {node.name!r}: no gradient for term {t!r}, which repeats an index")
        others = [(u, w) for j, (u, w) in enumerate(zip(terms, node.inputs, strict=True)) if j != i]
        keep = [c for c in t if c in rhs or any(c in u for u, _ in others)]
        r = b.op("Einsum", g, *(w for _, w in others),
                 equation=",".join([rhs, *(u for u, _ in others)]) + "->" + "".join(keep))
        # In t's order (1 where i alone had the index), summed where i was broadcast, then broadcast
        # back where the product was (an index only a broadcast operand has comes out of length 1).
        at = dict(zip(keep, r.shape, strict=True))
        r = b.reshape(r, [at.get(c, 1) for c in t])
        r = b.reduce_sum(r, [k for k, c in enumerate(t) if at.get(c, 1) != 1 and v.shape[k] == 1])
        grads.append(b.expand(r, v.shape))
    return grads
