"""The transformer ops as fused kernels: Attention, LinearAttention, FlexAttention (without modifier
subgraphs), SwiGLU, CausalConvWithState and TensorScatter.

Attention runs one query row per step: the row's scores go to a per-task scratch row (never the
whole score matrix), are masked, softcapped and softmaxed there, then weight the value rows. Tasks
take contiguous ranges of (batch, head, query) rows and a row is always computed whole by one task,
so results do not depend on the number of tasks. float16 and bfloat16 follow the reference's roundings:
every step the reference performs on float16 (bfloat16) arrays is rounded to that type; dot products
accumulate in float, and so does the softmax sum for float16, where ml_dtypes rounds each addition
of a bfloat16 sum. Attention reads bfloat16 itself; FlexAttention gets it widened (passes/widen.py).
"""

from __future__ import annotations

import numpy as np
import onnx

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.affine import Ix, task_share
from aotc.ops.common import aligned_inputs, c_literal, optional_input
from aotc.ops.elementwise import math_fn
from aotc.ops.registry import OpDef, register

Shape = tuple[int, ...]
_FLOATS = (np.float16, np.float32, np.float64)
# nonpad_kv_seqlen is clamped to +-2^62 so that offsets and window differences never overflow.
_LEN_CLAMP = "INT64_C(4611686018427387904)"
_LANES = 8


def _err(node: Node, msg: str) -> AotcError:
    return AotcError(f"{node.op} node {node.name!r}: {msg}")


def _out(node: Node, outs: list[str], i: int) -> str | None:
    return outs[i] if i < len(node.outputs) and node.outputs[i].name else None


def _acc(ctype: str) -> str:
    """The accumulator type: float16 sums run in float, as numpy's float16 matmul and sum do."""
    return "double" if ctype == "double" else "float"


def _rnd(ctype: str, expr: str, work: str) -> str:
    """``expr`` (of type ``work``) rounded to ``ctype``, as the reference rounds each step."""
    return f"({expr})" if ctype == work else f"({work})({ctype})({expr})"


def _check_float(node: Node, *vals: Value) -> None:
    # The emulated float types: Attention computes on them in float, FlexAttention gets them widened
    # to float32 (aotc/passes/widen.py).
    for v in vals:
        em = dtypes.emulated(v.dtype)
        if v.dtype not in _FLOATS and (em is None or em.compute != "float"):
            raise _err(node, f"dtype {v.dtype} not supported (float16/32/64 only)")


def _slot(n: int) -> int:
    """Elements rounded up so that each scratch region stays 64-byte aligned."""
    return -(-max(n, 1) // 16) * 16


# -- Attention ------------------------------------------------------------------------------------
class _Geom:
    """Sizes of one Attention node: Q (B, Hq, Sq, D), K (B, Hkv, Skv, D), V (B, Hkv, Skv, Dv), past P."""

    def __init__(self, node: Node) -> None:
        q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
        assert q is not None and k is not None and v is not None
        if not len(q.shape) == len(k.shape) == len(v.shape) or len(q.shape) not in (3, 4):
            raise _err(node, "Q, K and V must all be 3-D or all 4-D")
        _check_float(node, q, k, v)
        if not q.dtype == k.dtype == v.dtype:
            raise _err(node, "Q, K and V must have the same dtype")
        self.rank3 = len(q.shape) == 3
        if self.rank3:
            hq, hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
            if hq <= 0 or hkv <= 0 or q.shape[2] % hq or k.shape[2] % hkv or v.shape[2] % hkv:
                raise _err(node, "3-D inputs need q_num_heads and kv_num_heads dividing the hidden sizes")
            self.b, self.sq, self.d = q.shape[0], q.shape[1], q.shape[2] // hq
            self.skv, self.dv = k.shape[1], v.shape[2] // hkv
            self.hq, self.hkv = hq, hkv
            if k.shape[2] // hkv != self.d:
                raise _err(node, "Q and K head sizes differ")
        else:
            self.b, self.hq, self.sq, self.d = q.shape
            _, self.hkv, self.skv, dk = k.shape
            self.dv = v.shape[3]
            if dk != self.d or v.shape[:3] != k.shape[:3]:
                raise _err(node, f"K {list(k.shape)} and V {list(v.shape)} do not match Q {list(q.shape)}")
        if k.shape[0] != self.b or v.shape[0] != self.b or v.shape[1] != k.shape[1]:
            raise _err(node, "Q, K and V disagree on batch or kv sequence length")
        if self.hkv <= 0 or self.hq % self.hkv:
            raise _err(node, f"{self.hq} query heads are not a multiple of {self.hkv} kv heads")
        pk, pv = optional_input(node, 4), optional_input(node, 5)
        if (pk is None) != (pv is None):
            raise _err(node, "past_key and past_value must be given together")
        self.past = 0
        if pk is not None and pv is not None:
            self.past = pk.shape[2] if len(pk.shape) == 4 else -1
            if (tuple(pk.shape) != (self.b, self.hkv, self.past, self.d)
                    or tuple(pv.shape) != (self.b, self.hkv, self.past, self.dv)):
                raise _err(node, "past_key/past_value shapes do not match K and V")
        self.t = self.past + self.skv
        mask = optional_input(node, 3)
        if mask is not None:
            ms = tuple(mask.shape)
            full = (self.b, self.hq, self.sq, self.t)
            if not 1 <= len(ms) <= 4 or ms[-1] > self.t or any(
                    m not in (1, f) for m, f in zip(ms[-2::-1], full[-2::-1], strict=False)):
                raise _err(node, f"attn_mask of shape {list(ms)} does not broadcast to {list(full)}")
        nonpad = optional_input(node, 6)
        if nonpad is not None and tuple(nonpad.shape) != (self.b,):
            raise _err(node, f"nonpad_kv_seqlen must have shape [{self.b}]")


def _attention_infer(node: Node) -> list[tuple[Shape, np.dtype]]:
    g = _Geom(node)
    q, v = node.inputs[0], node.inputs[2]
    assert q is not None and v is not None
    y = (g.b, g.sq, g.hq * g.dv) if g.rank3 else (g.b, g.hq, g.sq, g.dv)
    shapes = [y, (g.b, g.hkv, g.t, g.d), (g.b, g.hkv, g.t, g.dv), (g.b, g.hq, g.sq, g.t)]
    return [(s, q.dtype) for s in shapes[:len(node.outputs)]]


def _softmax_dtype(node: Node, dt: np.dtype) -> np.dtype:
    sp = node.attr("softmax_precision")
    if sp is None:  # FlexAttention's softmax runs in float32 for float16 inputs
        return np.dtype(np.float32) if dt == np.float16 and node.op != "Attention" else dt
    try:
        sdt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(sp)))
    except (KeyError, ValueError, TypeError):
        sdt = None
    if sdt not in _FLOATS:
        raise _err(node, f"softmax_precision {sp} not supported")
    return sdt


def _work_ctype(dt: np.dtype, sdt: np.dtype) -> str:
    return "double" if np.float64 in (dt, sdt) else "float"


def _lane_dot(a: str, n: int, term: str) -> list[str]:
    """C lines setting ``s`` to the sum of ``term`` (an expression in ``c``) over c < n, in 8 lanes
    (a fixed order, so that the compiler vectorizes it without -ffast-math)."""
    main = n - n % _LANES if n >= 2 * _LANES else 0
    lines = [f"      {a} s = 0;"]
    if main:
        lines += [f"      {{ {a} l[{_LANES}] = {{0}};",
                  f"        for (size_t c0 = 0; c0 < {main}; c0 += {_LANES})",
                  f"          for (size_t c = c0; c < c0 + {_LANES}; c++) l[c - c0] += {term};",
                  f"        for (size_t w = {_LANES // 2}; w > 0; w /= 2)",
                  "          for (size_t c = 0; c < w; c++) l[c] += l[c + w];",
                  "        s = l[0]; }"]
    if main < n:
        lines.append(f"      for (size_t c = {main}; c < {n}; c++) s += {term};")
    return lines


def _attention_scratch(node: Node) -> int:
    g = _Geom(node)
    q = node.inputs[0]
    assert q is not None
    w = _work_ctype(q.dtype, _softmax_dtype(node, q.dtype))
    return (_slot(g.t) + _slot(g.d) + _slot(g.dv)) * (8 if w == "double" else 4)


def _attention_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Attention, and FlexAttention (``flex``) which differs in roundings and has no masks."""
    flex = node.op != "Attention"
    g = _Geom(node)
    q, k, v, mask, pk, pv, nonpad = aligned_inputs(node, ins) + [None] * (7 - len(node.inputs))
    y, pres_k, pres_v, qk_out = (_out(node, outs, i) for i in range(4))
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if qk_out and mode not in (0, 1, 2, 3):
        raise _err(node, f"qk_matmul_output_mode {mode} not supported")
    dt = node.inputs[0].dtype
    sdt = _softmax_dtype(node, dt)
    em = dtypes.emulated(dt)  # bfloat16 (Attention only; widen.py widens FlexAttention)
    softcap = float(node.attr("softcap", 0.0))
    # The reference divides the bfloat16 scores by the softcap, a Python float, which ml_dtypes
    # promotes to float32: from there on (tanh, bias, softmax) it computes in float32.
    promoted = em is not None and softcap > 0
    if promoted and sdt == dt:
        sdt = np.dtype(np.float32)
    w = _work_ctype(dt, sdt)
    a = _acc(ctype)

    def rt(e: str) -> str:  # rounded to the tensors' type
        return dtypes.round_to(dt, e) if em else _rnd(ctype, e, w)

    def rs(e: str) -> str:  # rounded to the softmax precision
        return dtypes.round_to(sdt, e) if dtypes.emulated(sdt) else _rnd(dtypes.c_type(sdt), e, w)

    def ld(e: str, vdt: np.dtype = dt) -> str:  # an element read as the work type
        return dtypes.load(vdt, e) if dtypes.emulated(vdt) else f"({w}){e}"

    def st(e: str) -> str:  # a work-type value written as an element (already rounded)
        return dtypes.store(dt, e) if em else f"({ctype}){e}"

    def fn(name: str, t: str) -> str:
        # Results rounded to a 16-bit float use libm's float functions, as numpy and ml_dtypes do:
        # the runtime's faster approximations would flip some roundings.
        return f"{name}f" if t == "float" and (em or ctype == "_Float16") else math_fn(name, t)

    scale = node.attr("scale")
    scale = 1 / np.sqrt(g.d) if scale is None else float(scale)
    # Q and K are each scaled by sqrt(scale), rounded to their type, as the reference does.
    ss = c_literal(float(dt.type(np.sqrt(np.float32(scale) if flex else scale))), w)
    causal = bool(node.attr("is_causal", 0))
    left, right = int(node.attr("left_window_size", -1)), int(node.attr("right_window_size", -1))
    b_, hq, sq, d, hkv, skv, dv, p, t = g.b, g.hq, g.sq, g.d, g.hkv, g.skv, g.dv, g.past, g.t
    grp = hq // hkv
    lines: list[str] = []

    def row(h: str, s: str, heads: int, seq: int, width: int) -> str:  # (b, head, position) -> offset
        if g.rank3:
            return f"(b * {seq} + {s}) * {heads * width} + {h} * {width}"
        return f"((b * {heads} + {h}) * {seq} + {s}) * {width}"

    # present_key / present_value: past rows then the new rows, split over tasks by (b, kv head, row).
    r = Ix.of("r")
    for pres, src, past, width in ((pres_k, k, pk, d), (pres_v, v, pv, dv)):
        if pres is None:
            continue
        lines += [f"for (size_t r = task; r < {b_ * hkv * t}; r += ntasks) {{",
                  f"  const size_t b = {r // max(hkv * t, 1)}, g = {r // max(t, 1) % hkv}, j = {r % max(t, 1)};",
                  f"  const {ctype} *src = " + (f"j < {p} ? {past} + ({r // max(t, 1) * p} + j) * {width} : "
                                                 if p else "")
                  + f"{src} + {row('g', f'(j - {p})' if p else 'j', hkv, skv, width)};",
                  f"  for (size_t c = 0; c < {width}; c++) {pres}[r * {width} + c] = src[c];", "}"]
    n = b_ * hq * sq
    if n == 0:
        return "\n".join(lines) or "/* empty */"
    sc, qs, acc = "sc", "qs", "acc"
    lo, hi = task_share(n)
    lines += [f"{w} *restrict {sc} = ({w} *)scratch + task * (size_t){_slot(t) + _slot(d) + _slot(dv)};",
              f"{w} *restrict {qs} = {sc} + {_slot(t)}, *restrict {acc} = {qs} + {_slot(d)};",
              f"for (size_t r = {lo}; r < {hi}; r++) {{",
              f"  const size_t b = {r // (hq * sq)}, h = {r // sq % hq}, i = {r % sq};",
              f"  const size_t g = h / {grp};",
              f"  const {ctype} *qr = {q} + {row('h', 'i', hq, sq, d)};",
              f"  for (size_t c = 0; c < {d}; c++) {qs}[c] = {rt(ld('qr[c]') + f' * {ss}')};",
              f"  const {ctype} *kb = {k} + {row('g', '0', hkv, skv, d)};",
              f"  const {ctype} *vb = {v} + {row('g', '0', hkv, skv, dv)};"]
    kstride, vstride = (hkv * d, hkv * dv) if g.rank3 else (d, dv)
    # Absolute position of query i: keys j <= pos are causal; the window is relative to it too.
    if nonpad:
        lines += [f"  int64_t len = {nonpad}[b];",
                  f"  len = len < -{_LEN_CLAMP} ? -{_LEN_CLAMP} : (len > {_LEN_CLAMP} ? {_LEN_CLAMP} : len);"]
    off = str(p) if p else (f"len - {sq}" if nonpad else "0")
    structural = causal or left >= 0 or right >= 0 or nonpad
    if structural:
        lines.append(f"  const int64_t pos = (int64_t)i + {off}; (void)pos;")
    qk_raw = qk_out is not None and mode in (0, 1, 2)
    lines += ["  int live = 0;", f"  {w} mx = -INFINITY;",
              f"  for (size_t j = 0; j < {t}; j++) {{"]
    # The additive bias of key j, in the tensors' type.
    if mask is not None:
        mv = node.inputs[3]
        ms = (1,) * (4 - len(mv.shape)) + tuple(mv.shape)
        tm = ms[3]
        strides = [ms[1] * ms[2] * tm if ms[0] > 1 else 0, ms[2] * tm if ms[1] > 1 else 0,
                   tm if ms[2] > 1 else 0]
        at = " + ".join([f"{s} * {ix}" for s, ix in zip(strides, ("b", "h", "i"), strict=True) if s] + ["j"])
        val = (f"({mask}[{at}] ? 0 : -INFINITY)" if mv.dtype == np.bool_
               else rt(ld(f"{mask}[{at}]", mv.dtype)))
        lines.append(f"    {w} bias = " + (f"j < {tm} ? {val} : -INFINITY;" if tm < t else f"{val};"))
    else:
        lines.append(f"    {w} bias = 0;")
    conds = []
    if causal:
        conds.append("(int64_t)j > pos")
    if left >= 0:
        conds.append(f"pos - (int64_t)j > INT64_C({left})")
    if right >= 0:
        conds.append(f"(int64_t)j - pos > INT64_C({right})")
    if nonpad:
        conds.append("(int64_t)j >= len")
    if conds:
        lines.append(f"    if ({' || '.join(conds)}) bias = -INFINITY;")
    lines.append("    live |= bias != -INFINITY;")
    krow = f"(j < {p} ? {pk} + ((b * {hkv} + g) * {p} + j) * {d} : kb + (j - {p}) * {kstride})" if p \
        else f"kb + j * {kstride}"
    term = f"({a}){qs}[c] * ({a}){rt(ld('kr[c]') + f' * {ss}')}"
    dot = [f"      const {ctype} *kr = {krow};", *_lane_dot(a, d, term), f"      x = {rt('s')};"]
    if qk_out is not None and mode == 0:
        dot.append(f"      {qk_out}[r * {t} + j] = {st('x')};")
    rc = (lambda e: f"({e})") if promoted else rt  # the rounding of the softcap and bias steps
    if softcap > 0:
        cap = c_literal(float((np.float32 if promoted else dt.type)(softcap)), w)
        dot.append(f"      x = {rc(rc(fn('tanh', w) + '(' + rc(f'x / {cap}') + ')') + f' * {cap}')};")
    if qk_out is not None and mode == 1:
        dot.append(f"      {qk_out}[r * {t} + j] = {st('x')};")
    dot.append(f"      x = {rc('x + bias')};")
    lines += [f"    {w} x = -INFINITY;",
              "    if (" + ("1" if qk_raw else "bias != -INFINITY") + ") {", *dot, "    }"]
    if qk_out is not None and mode == 2:
        lines.append(f"    {qk_out}[r * {t} + j] = {st('x')};")
    lines += [f"    const {w} xs = {rs('x')};",
              f"    {sc}[j] = xs;",
              "    mx = (xs > mx || xs != xs) ? xs : mx;", "  }"]
    # Softmax over the row; a row with no attendable key (its bias all -inf) yields zeros.
    sa = _acc(dtypes.c_type(sdt))
    ex = fn("exp", sa)
    # ml_dtypes sums one addition at a time, each rounded; numpy sums float16 in float, rounding once.
    add = f"sum = {rs(f'sum + {sc}[j]')}" if dtypes.emulated(sdt) else f"sum += {sc}[j]"
    lines += [f"  for (size_t c = 0; c < {dv}; c++) {acc}[c] = 0;",
              "  if (live) {",
              *([] if flex else ["    if (mx == -INFINITY) mx = 0;"]),
              f"    {sa} sum = 0;",
              f"    for (size_t j = 0; j < {t}; j++) {{ {sc}[j] = {rs(ex + '(' + rs(sc + '[j] - mx') + ')')}; "
              f"{add}; }}",
              f"    {sa} den = {rs('sum')};",
              "    if (den == 0) den = 1;",
              f"    for (size_t j = 0; j < {t}; j++) {{",
              f"      const {w} pj = {rs(f'{sc}[j] / den') if flex else rt(rs(f'{sc}[j] / den'))};"]
    if qk_out is not None and mode == 3:
        lines.append(f"      {qk_out}[r * {t} + j] = {st('pj')};")
    vrow = f"(j < {p} ? {pv} + ((b * {hkv} + g) * {p} + j) * {dv} : vb + (j - {p}) * {vstride})" if p \
        else f"vb + j * {vstride}"
    lines += ["      if (pj == 0) continue;  /* masked keys add nothing, even when their values are inf */",
              f"      const {ctype} *vr = {vrow};",
              f"      for (size_t c = 0; c < {dv}; c++) {acc}[c] += pj * {ld('vr[c]') if em else 'vr[c]'};",
              "    }"]
    if qk_out is not None and mode == 3:
        lines.append(f"  }} else for (size_t j = 0; j < {t}; j++) {qk_out}[r * {t} + j] = 0;")
    else:
        lines.append("  }")
    lines += [f"  {ctype} *yr = {y} + {row('h', 'i', hq, sq, dv)};",
              f"  for (size_t c = 0; c < {dv}; c++) yr[c] = {st(f'{acc}[c]')};", "}"]
    return "\n".join(lines)


def _np(ctype: str) -> np.dtype:
    return np.dtype({"_Float16": np.float16, "float": np.float32, "double": np.float64}[ctype])


register(OpDef("Attention", "kernel", _attention_infer, emit=_attention_emit, scratch=_attention_scratch))


def _flex_infer(node: Node) -> list[tuple[Shape, np.dtype]]:
    if any(x is None or len(x.shape) != 4 for x in node.inputs[:3]) or len(node.inputs) != 3:
        raise _err(node, "FlexAttention takes 4-D Q, K and V")
    return _attention_infer(node)


# The modifier subgraphs (score_mod, prob_mod) are not supported: the frontend rejects subgraphs.
register(OpDef("ai.onnx.preview.FlexAttention", "kernel", _flex_infer, emit=_attention_emit,
               scratch=_attention_scratch))


# -- SwiGLU: Swish_alpha(A) * B, each step rounded to the type as the reference does ----------------
def _swiglu_infer(node: Node) -> list[tuple[Shape, np.dtype]]:
    a, b = node.inputs[0], node.inputs[1]
    assert a is not None and b is not None
    if a.shape != b.shape or a.dtype != b.dtype:
        raise _err(node, f"A {a.type_str()} and B {b.type_str()} must have the same shape and dtype")
    _check_float(node, a)
    return [(a.shape, a.dtype)]


def _swiglu_expr(node: Node, x: list[str], t: str) -> str:
    def r(e: str) -> str:  # a no-op for float/double; float16 arithmetic would otherwise keep excess precision
        return f"(({t})({e}))"

    alpha = c_literal(float(_np(t).type(-float(node.attr("alpha", 1.0)))), t)
    one = c_literal(1, t)
    e = r(f"{math_fn('exp', t)}({r(f'{alpha} * {x[0]}')})")
    gate = r(f"{one} / {r(f'{one} + {e}')}")
    return r(f"{r(f'{x[0]} * {gate}')} * {x[1]}")


register(OpDef("SwiGLU", "elementwise", _swiglu_infer, expr=_swiglu_expr))


# -- TensorScatter: the cache with the update written at each batch's write index -------------------
def _ts_layout(node: Node) -> tuple[int, int, int, int, int]:
    """(outer, per_batch, max_len, update_len, inner) around the sequence axis."""
    past, upd = node.inputs[0], node.inputs[1]
    assert past is not None and upd is not None
    rank = len(past.shape)
    axis = int(node.attr("axis", -2))
    if not -rank <= axis < rank or axis % rank == 0:
        raise _err(node, f"axis {axis} must name a dimension after the batch dimension")
    axis %= rank
    if len(upd.shape) != rank or upd.dtype != past.dtype or upd.shape[axis] > past.shape[axis] or any(
            u != p for i, (u, p) in enumerate(zip(upd.shape, past.shape, strict=True)) if i != axis):
        raise _err(node, f"update {upd.type_str()} does not fit the cache {past.type_str()}")
    sh = past.shape
    return (int(np.prod(sh[:axis])), int(np.prod(sh[1:axis])), sh[axis], upd.shape[axis],
            int(np.prod(sh[axis + 1:])))


def _ts_infer(node: Node) -> list[tuple[Shape, np.dtype]]:
    _ts_layout(node)
    past = node.inputs[0]
    assert past is not None
    if node.attr("mode", "linear") not in ("linear", "circular"):
        raise _err(node, f"mode {node.attr('mode')!r} not supported")
    return [(past.shape, past.dtype)]


def _ts_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    outer, per_batch, m, n, inner = _ts_layout(node)
    past, upd, widx = aligned_inputs(node, ins) + [None] * (3 - len(node.inputs))
    y = outs[0]
    if outer * m * inner == 0:
        return "/* empty */"
    lines = [f"for (size_t o = task; o < {outer}; o += ntasks) {{",
             f"  for (size_t e = 0; e < {m * inner}; e++) {y}[o * {m * inner} + e] = {past}[o * {m * inner} + e];",
             f"  const int64_t w = {f'{widx}[o / {per_batch}]' if widx else '0'};"]
    if node.attr("mode", "linear") == "circular":  # Python's modulo: never negative
        lines.append(f"  const int64_t w0 = (w % {m} + {m}) % {m};")
    lines.append(f"  for (int64_t s = 0; s < {n}; s++) {{")
    if node.attr("mode", "linear") == "circular":
        lines.append(f"    const int64_t c = (w0 + s) % {m};")
    else:  # a write outside the cache is dropped (the reference raises or wraps around)
        lines += [f"    if (w < 0 || w >= {m} - s) continue;", "    const int64_t c = w + s;"]
    lines += [f"    for (size_t e = 0; e < {inner}; e++)",
              f"      {y}[(o * {m} + (size_t)c) * {inner} + e] = {upd}[(o * {n} + (size_t)s) * {inner} + e];",
              "  }", "}"]
    return "\n".join(lines)


register(OpDef("TensorScatter", "kernel", _ts_infer, emit=_ts_emit))


# -- CausalConvWithState: depthwise causal conv over [past_state | input], optional SiLU -------------
def _ccs_dims(node: Node) -> tuple[int, int, int, int]:
    x, wt = node.inputs[0], node.inputs[1]
    assert x is not None and wt is not None
    if len(x.shape) != 3 or len(wt.shape) != 3 or wt.shape[0] != x.shape[1] or wt.shape[1] != 1:
        raise _err(node, f"input {x.type_str()} and weight {wt.type_str()} must be (B, C, L) and (C, 1, k)")
    _check_float(node, x)
    b, c, length = x.shape
    k = wt.shape[2]
    if k < 1:
        raise _err(node, "the kernel size must be at least 1")
    ps = optional_input(node, 3)
    if ps is not None and tuple(ps.shape) != (b, c, k - 1):
        raise _err(node, f"past_state must have shape {[b, c, k - 1]}")
    return b, c, length, k


def _ccs_infer(node: Node) -> list[tuple[Shape, np.dtype]]:
    b, c, length, k = _ccs_dims(node)
    if node.attr("activation", "none") not in ("none", "silu", "swish"):
        raise _err(node, f"activation {node.attr('activation')!r} not supported")
    x = node.inputs[0]
    assert x is not None
    return [((b, c, length), x.dtype), ((b, c, k - 1), x.dtype)][:len(node.outputs)]


def _ccs_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    b, c, length, k = _ccs_dims(node)
    x, wt, bias, past = aligned_inputs(node, ins) + [None] * (4 - len(node.inputs))
    y, pres = _out(node, outs, 0), _out(node, outs, 1)
    a = _acc(ctype)
    # Element u of the padded row [past (k - 1) | input (length)].
    pad = f"(u < {k - 1} ? {f'({a})ps[u]' if past else '0'} : ({a})xr[u - {k - 1}])"
    lines = [f"for (size_t r = task; r < {b * c}; r += ntasks) {{",
             f"  const {ctype} *xr = {x} + r * {length};"]
    if past:
        lines.append(f"  const {ctype} *ps = {past} + r * {k - 1};")
    if y:
        act = ""
        if node.attr("activation", "none") in ("silu", "swish"):
            act = f"    v = ({ctype})((float)v / (1 + {math_fn('exp', 'float')}(-(float)v)));\n"
        lines += [f"  const {ctype} *wr = {wt} + (r % {c}) * {k};",
                  f"  for (size_t t = 0; t < {length}; t++) {{",
                  f"    {a} s = 0;",
                  f"    for (size_t i = 0; i < {k}; i++) {{ const size_t u = t + i; s += ({a})wr[i] * {pad}; }}",
                  f"    {ctype} v = ({ctype})(s{f' + ({a}){bias}[r % {c}]' if bias else ''});",
                  act + f"    {y}[r * {length} + t] = v;", "  }"]
    if pres and k > 1:
        lines += [f"  for (size_t u = {length}; u < {length + k - 1}; u++)",
                  f"    {pres}[r * {k - 1} + u - {length}] = ({ctype}){pad};"]
    lines.append("}")
    return "\n".join(lines)


register(OpDef("CausalConvWithState", "kernel", _ccs_infer, emit=_ccs_emit))


# -- LinearAttention: the recurrent state (d_k x d_v per kv head) updated token by token -------------
class _LinGeom:
    def __init__(self, node: Node) -> None:
        q, k, v = node.inputs[0], node.inputs[1], node.inputs[2]
        assert q is not None and k is not None and v is not None
        self.hq, self.hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
        if self.hq <= 0 or self.hkv <= 0 or self.hq % self.hkv:
            raise _err(node, "q_num_heads must be a positive multiple of kv_num_heads")
        if any(len(x.shape) != 3 for x in (q, k, v)) or not q.shape[:2] == k.shape[:2] == v.shape[:2]:
            raise _err(node, "query, key and value must be (B, T, H * D) with the same B and T")
        _check_float(node, q)
        if not q.dtype == k.dtype == v.dtype:
            raise _err(node, "query, key and value must have the same dtype")
        self.b, self.t = q.shape[0], q.shape[1]
        self.dk, self.dv = q.shape[2] // self.hq, v.shape[2] // self.hkv
        if q.shape[2] % self.hq or v.shape[2] % self.hkv or k.shape[2] != self.hkv * self.dk:
            raise _err(node, "the hidden sizes do not split into the given heads")
        self.rule = node.attr("update_rule", "gated_delta")
        if self.rule not in ("linear", "gated", "delta", "gated_delta"):
            raise _err(node, f"update_rule {self.rule!r} not supported")
        past, decay, beta = optional_input(node, 3), optional_input(node, 4), optional_input(node, 5)
        if (decay is not None) != ("gated" in self.rule) or (beta is not None) != ("delta" in self.rule):
            raise _err(node, f"update_rule {self.rule!r} does not match the decay/beta inputs given")
        if past is not None and tuple(past.shape) != (self.b, self.hkv, self.dk, self.dv):
            raise _err(node, f"past_state must have shape {[self.b, self.hkv, self.dk, self.dv]}")
        if past is not None:
            _check_float(node, past)
        self.decay_w = 0
        if decay is not None:
            self.decay_w = decay.shape[-1]
            if tuple(decay.shape[:2]) != (self.b, self.t) or self.decay_w not in (self.hkv, self.hkv * self.dk):
                raise _err(node, f"decay must be (B, T, {self.hkv}) or (B, T, {self.hkv * self.dk})")
        self.beta_w = 0
        if beta is not None:
            self.beta_w = beta.shape[-1]
            if tuple(beta.shape[:2]) != (self.b, self.t) or self.beta_w not in (self.hkv, 1):
                raise _err(node, f"beta must be (B, T, {self.hkv}) or (B, T, 1)")
        self.state_dtype = (past if past is not None else q).dtype


def _lin_infer(node: Node) -> list[tuple[Shape, np.dtype]]:
    g = _LinGeom(node)
    q = node.inputs[0]
    assert q is not None
    return [((g.b, g.t, g.hq * g.dv), q.dtype),
            ((g.b, g.hkv, g.dk, g.dv), g.state_dtype)][:len(node.outputs)]


def _lin_scratch(node: Node) -> int:
    g = _LinGeom(node)
    return (_slot(g.dk * g.dv) + 2 * _slot(g.dv)) * 4


def _lin_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    g = _LinGeom(node)
    q, k, v, past, decay, beta = aligned_inputs(node, ins) + [None] * (6 - len(node.inputs))
    y, pres = _out(node, outs, 0), _out(node, outs, 1)
    dk, dv, hq, hkv, t = g.dk, g.dv, g.hq, g.hkv, g.t
    scale = float(node.attr("scale", 0.0) or 0.0) or 1 / np.sqrt(dk)
    sc = c_literal(float(np.float32(scale)), "float")
    ex = math_fn("exp", "float")
    lines = [f"float *restrict st = scratch + task * (size_t){_slot(dk * dv) + 2 * _slot(dv)};",
             f"float *restrict u = st + {_slot(dk * dv)}, *restrict o = u + {_slot(dv)};",
             f"for (size_t r = task; r < {g.b * hkv}; r += ntasks) {{",
             f"  const size_t b = r / {hkv}, g = r % {hkv};",
             f"  for (size_t e = 0; e < {dk * dv}; e++) st[e] = " + (f"(float){past}[r * {dk * dv} + e];"
                                                                    if past else "0;"),
             f"  for (size_t s = 0; s < {t}; s++) {{",
             f"    const size_t bt = b * {t} + s;",
             f"    const {ctype} *kr = {k} + bt * {hkv * dk} + g * {dk};",
             f"    const {ctype} *vr = {v} + bt * {hkv * dv} + g * {dv};"]
    if decay:  # S *= exp(g_t): one factor per head, or one per key dimension (row of S)
        at = f"bt * {hkv} + g" if g.decay_w == hkv else f"bt * {hkv * dk} + g * {dk} + d"
        lines += [f"    for (size_t d = 0; d < {dk}; d++) {{",
                  f"      const float f = {ex}((float){decay}[{at}]);",
                  f"      for (size_t m = 0; m < {dv}; m++) st[d * {dv} + m] *= f;", "    }"]
    if beta:  # delta rule: u = beta_t * (v_t - S^T k_t)
        bat = f"bt * {hkv} + g" if g.beta_w == hkv else "bt"
        lines += [f"    for (size_t m = 0; m < {dv}; m++) u[m] = 0;",
                  f"    for (size_t d = 0; d < {dk}; d++)",
                  f"      for (size_t m = 0; m < {dv}; m++) u[m] += st[d * {dv} + m] * (float)kr[d];",
                  f"    const float bet = (float){beta}[{bat}];",
                  f"    for (size_t m = 0; m < {dv}; m++) u[m] = bet * ((float)vr[m] - u[m]);"]
    else:
        lines.append(f"    for (size_t m = 0; m < {dv}; m++) u[m] = (float)vr[m];")
    lines += [f"    for (size_t d = 0; d < {dk}; d++)",
              f"      for (size_t m = 0; m < {dv}; m++) st[d * {dv} + m] += (float)kr[d] * u[m];"]
    if y:  # every query head of this kv head reads the updated state
        lines += [f"    for (size_t h = g * {hq // hkv}; h < (g + 1) * {hq // hkv}; h++) {{",
                  f"      const {ctype} *qr = {q} + bt * {hq * dk} + h * {dk};",
                  f"      for (size_t m = 0; m < {dv}; m++) o[m] = 0;",
                  f"      for (size_t d = 0; d < {dk}; d++)",
                  f"        for (size_t m = 0; m < {dv}; m++) o[m] += (float)qr[d] * st[d * {dv} + m];",
                  f"      {ctype} *yr = {y} + bt * {hq * dv} + h * {dv};",
                  f"      for (size_t m = 0; m < {dv}; m++) yr[m] = ({ctype})({sc} * o[m]);",
                  "    }"]
    lines.append("  }")
    if pres:
        pt = dtypes.c_type(g.state_dtype)
        lines.append(f"  for (size_t e = 0; e < {dk * dv}; e++) {pres}[r * {dk * dv} + e] = ({pt})st[e];")
    lines.append("}")
    return "\n".join(lines)


register(OpDef("LinearAttention", "kernel", _lin_infer, emit=_lin_emit, scratch=_lin_scratch))
