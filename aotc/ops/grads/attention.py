"""Gradient of Attention (opset 23) through its decomposition (``reverse.through``): softmax(Q K^T scale
+ bias) V, per head, with the kv heads repeated for grouped queries, the mask added (boolean: 0 or -inf)
and the causal triangle masked as the kernel does (key j > query i).

Supported: 3-D or 4-D inputs, grouped kv heads, a mask as long as the keys, is_causal, scale; present
key and value outputs (K and V). Refused by name: past key/value, nonpad_kv_seqlen, softcap, local
windows, the qk_matmul output.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.grads.reverse import through


def _check(node: Node) -> None:
    present = [i for i in (4, 5, 6) if len(node.inputs) > i and node.inputs[i] is not None]
    why = [["past_key", "past_value", "nonpad_kv_seqlen"][i - 4] for i in present]
    if float(node.attr("softcap", 0.0)):
        why.append("softcap")
    if int(node.attr("left_window_size", -1)) >= 0 or int(node.attr("right_window_size", -1)) >= 0:
        why.append("a local window")
    if len(node.outputs) > 3 and node.outputs[3].name:
        why.append("the qk_matmul output")
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    k = node.inputs[1]
    assert k is not None
    if mask is not None and mask.shape[-1] != k.shape[-2 if len(k.shape) == 4 else 1]:
        why.append("a mask shorter than the keys")
    if why:
        raise AotcError(f"Attention node {node.name!r}: no gradient with {', '.join(why)}")


def _heads(b: GradBuilder, v: Value, heads: int, rank3: bool) -> Value:
    """[B, S, H * D] as [B, H, S, D] (4-D inputs as they are)."""
    if not rank3:
        return v
    bsz, s, hd = v.shape
    return b.transpose(b.reshape(v, (bsz, s, heads, hd // heads)), [0, 2, 1, 3])


def _decomposition(node: Node):
    def build(b: GradBuilder, ins: list[Value | None]) -> list[Value]:
        q, k, v = ins[0], ins[1], ins[2]
        mask = ins[3] if len(ins) > 3 else None
        assert q is not None and k is not None and v is not None
        rank3 = len(q.shape) == 3
        hq = int(node.attr("q_num_heads", 0)) if rank3 else q.shape[1]
        hkv = int(node.attr("kv_num_heads", 0)) if rank3 else k.shape[1]
        q4, k4, v4 = _heads(b, q, hq, rank3), _heads(b, k, hkv, rank3), _heads(b, v, hkv, rank3)
        kr, vr = k4, v4
        if hq != hkv:  # each kv head serves hq / hkv query heads in a row
            def repeat(x: Value) -> Value:
                bsz, _, s, d = x.shape
                return b.reshape(b.expand(b.reshape(x, (bsz, hkv, 1, s, d)), (bsz, hkv, hq // hkv, s, d)),
                                 (bsz, hq, s, d))
            kr, vr = repeat(k4), repeat(v4)
        scale = node.attr("scale")
        scale = 1 / np.sqrt(q4.shape[-1]) if scale is None else float(scale)
        scores = b.scale(b.op("MatMul", q4, b.swap_last(kr)), scale)
        if mask is not None:
            scores = b.op("Where", mask, scores, b.scalar(-np.inf, scores)) if mask.dtype == np.bool_ \
                else b.add(scores, mask)
        if node.attr("is_causal", 0):
            sq, t = scores.shape[-2:]
            keep = np.tril(np.ones((sq, t), np.bool_))
            scores = b.op("Where", b.const(keep), scores, b.scalar(-np.inf, scores))
        y = b.op("MatMul", b.op("Softmax", scores, axis=-1), vr)
        if rank3:
            bsz, _, sq, dv = y.shape
            y = b.reshape(b.transpose(y, [0, 2, 1, 3]), (bsz, sq, hq * dv))
        return [y, k4, v4][:len(node.outputs)]
    return build


@rule("Attention")
def _attention(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    _check(node)
    return through(b, node, dys, needs, _decomposition(node))
