"""Gradients of RNN, GRU and LSTM, through their recurrence unrolled over time in ops that have rules
(``reverse.through``): per direction, the input projection of every step is one MatMul, then each step
is a MatMul with the recurrence weights, the gates' slices and activations, and the state update. The
backward recomputes the unrolled forward from the node's inputs (the kernel keeps no gate values).

Supported: the default activations, no clip, no input_forget, every sequence at full length (no
sequence_lens, or a constant one equal to it), either layout, any direction, optional B,
initial_h/initial_c and peepholes; LSTM gates i, o, f, c; GRU gates z, r, h, either linear_before_reset.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.grads.reverse import through

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_ACTS = {"RNN": ["tanh"], "GRU": ["sigmoid", "tanh"], "LSTM": ["sigmoid", "tanh", "tanh"]}


def _check(node: Node) -> None:
    x = node.inputs[0]
    assert x is not None
    seq = x.shape[1] if node.attr("layout", 0) else x.shape[0]
    acts = [a.lower() for a in node.attr("activations", [])]
    dirs = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    why = []
    if acts and acts != _ACTS[node.op] * dirs:
        why.append(f"activations {node.attr('activations')}")
    if node.attr("clip") is not None:
        why.append("clip")
    if node.attr("input_forget", 0):
        why.append("input_forget")
    lens = node.inputs[4] if len(node.inputs) > 4 else None
    if lens is not None and not (lens.is_const and bool(np.all(lens.const == seq))):
        why.append("sequence_lens shorter than the sequence")
    if why:
        raise AotcError(f"{node.op} node {node.name!r}: no gradient with {', '.join(why)}")


def _pick(b: GradBuilder, v: Value, index: int) -> Value:
    """``v``'s entry ``index`` along its first axis, that axis dropped."""
    return b.op("Gather", v, b.const(np.array(index, np.int64)), axis=0)


def _cols(b: GradBuilder, v: Value, k: int, width: int) -> Value:
    """Columns [k width, (k + 1) width) of the matrix ``v``."""
    return b.op("Slice", v, b.ints([k * width]), b.ints([(k + 1) * width]), b.ints([1]))


def _unroll(node: Node):
    op = node.op
    gates = _GATES[op]

    def build(b: GradBuilder, ins: list[Value | None]) -> list[Value]:
        x, w, r = ins[0], ins[1], ins[2]
        assert x is not None and w is not None and r is not None
        bias, h0 = (ins[i] if len(ins) > i else None for i in (3, 5))
        c0 = ins[6] if op == "LSTM" and len(ins) > 6 else None
        peep = ins[7] if op == "LSTM" and len(ins) > 7 else None
        layout = node.attr("layout", 0)
        if layout:  # [batch, seq, ...] and states [batch, dirs, hidden]: the steps run over axis 0
            x = b.transpose(x, [1, 0, 2])
            h0, c0 = (None if v is None else b.transpose(v, [1, 0, 2]) for v in (h0, c0))
        seq, batch = x.shape[0], x.shape[1]
        hid = r.shape[-1]
        direction = node.attr("direction", "forward")
        ys, last_h, last_c = [], [], []
        for d in range(w.shape[0]):
            proj = b.op("MatMul", x, b.transpose(_pick(b, w, d), [1, 0]))  # every step's X W^T: [seq, batch, gH]
            rt = b.transpose(_pick(b, r, d), [1, 0])
            wb = rb = None
            if bias is not None:
                both = _pick(b, bias, d)
                wb, rb = (b.op("Slice", both, b.ints([k * gates * hid]), b.ints([(k + 1) * gates * hid]),
                               b.ints([0])) for k in (0, 1))
                proj = b.add(proj, wb if op == "GRU" else b.add(wb, rb))
            h = _pick(b, h0, d) if h0 is not None else b.zeros((batch, hid), x.dtype)
            c = _pick(b, c0, d) if c0 is not None else b.zeros((batch, hid), x.dtype)
            p = _pick(b, peep, d) if peep is not None else None
            reverse = direction == "reverse" or d == 1
            out: dict[int, Value] = {}
            for t in (reversed(range(seq)) if reverse else range(seq)):
                xt = _pick(b, proj, t)
                if op == "GRU":
                    h = _gru_step(b, node, xt, h, rt, rb, hid)
                else:
                    pre = b.add(xt, b.op("MatMul", h, rt))
                    if op == "RNN":
                        h = b.op("Tanh", pre)
                    else:
                        h, c = _lstm_step(b, pre, c, p, hid)
                out[t] = h
            ys.append(b.op("Concat", *(b.reshape(out[t], (1, batch, hid)) for t in range(seq)), axis=0))
            last_h.append(b.reshape(h, (1, batch, hid)))
            last_c.append(b.reshape(c, (1, batch, hid)))
        y = b.op("Concat", *(b.reshape(v, (seq, 1, batch, hid)) for v in ys), axis=1)
        yh = last_h[0] if len(last_h) == 1 else b.op("Concat", *last_h, axis=0)
        yc = last_c[0] if len(last_c) == 1 else b.op("Concat", *last_c, axis=0)
        if layout:
            y, yh, yc = b.transpose(y, [2, 0, 1, 3]), b.transpose(yh, [1, 0, 2]), b.transpose(yc, [1, 0, 2])
        return [y, yh, yc][:len(node.outputs)]

    return build


def _lstm_step(b: GradBuilder, pre: Value, c: Value, p: Value | None, hid: int) -> tuple[Value, Value]:
    """Gates i, o, f, c (peepholes i, o, f): C = f C + i g(c), H = o h(C)."""
    gi, go, gf, gc = (_cols(b, pre, k, hid) for k in range(4))
    if p is not None:
        pi, po, pf = (b.op("Slice", p, b.ints([k * hid]), b.ints([(k + 1) * hid]), b.ints([0])) for k in range(3))
        gi, gf = b.add(gi, b.mul(pi, c)), b.add(gf, b.mul(pf, c))
    c = b.add(b.mul(b.op("Sigmoid", gf), c), b.mul(b.op("Sigmoid", gi), b.op("Tanh", gc)))
    if p is not None:
        go = b.add(go, b.mul(po, c))
    return b.mul(b.op("Sigmoid", go), b.op("Tanh", c)), c


def _gru_step(b: GradBuilder, node: Node, xt: Value, h: Value, rt: Value, rb: Value | None, hid: int) -> Value:
    """Gates z, r, h: H = (1 - z) h~ + z H, with the reset applied before or after the recurrence product."""
    rec = b.op("MatMul", h, rt)
    if rb is not None:
        rec = b.add(rec, rb)
    xz, xr, xh = (_cols(b, xt, k, hid) for k in range(3))
    z = b.op("Sigmoid", b.add(xz, _cols(b, rec, 0, hid)))
    reset = b.op("Sigmoid", b.add(xr, _cols(b, rec, 1, hid)))
    if node.attr("linear_before_reset", 0):
        cand = b.op("Tanh", b.add(xh, b.mul(reset, _cols(b, rec, 2, hid))))
    else:  # (r H) Rh^T + Rbh
        rh = b.op("MatMul", b.mul(reset, h), _cols(b, rt, 2, hid))
        if rb is not None:
            rh = b.add(rh, b.op("Slice", rb, b.ints([2 * hid]), b.ints([3 * hid]), b.ints([0])))
        cand = b.op("Tanh", b.add(xh, rh))
    return b.add(b.mul(b.sub(b.scalar(1, z), z), cand), b.mul(z, h))


@rule("RNN", "GRU", "LSTM")
def _rnn(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    _check(node)
    return through(b, node, dys, needs, _unroll(node))
