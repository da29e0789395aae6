"""Gradient kernels of a depthwise conv (groups of one input channel):
output channel m reads input channel m / Mg alone, so im2col would copy each input k times for
products of one row. Both kernels run the output row ``ow`` innermost over the range of positions
whose tap lands inside the input, contiguous at stride 1, where the compiler vectorizes it.

- ``aotc.DepthwiseGradInput(gy, w) -> dx``: each (n, c) plane adds gy[n, m] * w[m, tap] at the tap's
  input position, for the Mg output channels m of c; one task per plane.
- ``aotc.DepthwiseGradWeight(x, gy) -> dw``: dw[m, tap] = sum gy[n, m, o] x[n, c, o s + tap d - p],
  summed per image in a row of lanes per tap, then in double; one task per output channel.
"""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Node
from aotc.ops.conv.common import Geometry
from aotc.ops.grads.pool import forward_attrs, forward_geometry
from aotc.ops.registry import OpDef, register


def _geometry(node: Node) -> Geometry:
    return forward_geometry("Conv", forward_attrs(node), node.attrs["x_shape"], node.attrs["w_shape"])


def _taps(g: Geometry, body: list[str]) -> list[str]:
    """Loops over outputs (od, oh) and taps (kd, kh, kw) with ``id``/``ih`` inside the input, then the
    ``ow`` range [lo, hi) whose ``iw = ow s + kw d - p`` is inside too; ``body`` runs per (row, kw)."""
    lines = []
    for ax, (o, k, i) in enumerate((("od", "kd", "id"), ("oh", "kh", "ih"))):
        lines += [f"for (ptrdiff_t {o} = 0; {o} < {g.out[ax]}; {o}++)",
                  f"for (ptrdiff_t {k} = 0; {k} < {g.k[ax]}; {k}++) {{",
                  f"const ptrdiff_t {i} = {o} * {g.s[ax]} + {k} * {g.d[ax]} - {g.pb[ax]};",
                  f"if ({i} < 0 || {i} >= {g.inp[ax]}) continue;"]
    s, d, p, iw = g.s[2], g.d[2], g.pb[2], g.inp[2]
    lines += [f"for (ptrdiff_t kw = 0; kw < {g.k[2]}; kw++) {{",
              f"const ptrdiff_t off = kw * {d} - {p};",
              # first ow with ow s + off >= 0, last with ow s + off <= iw - 1
              f"const ptrdiff_t lo = off >= 0 ? 0 : (-off + {s - 1}) / {s};",
              f"ptrdiff_t hi = off > {iw - 1} ? 0 : ({iw - 1} - off) / {s} + 1;",
              f"if (hi > {g.out[2]}) hi = {g.out[2]};",
              *body, "}", "}", "}"]
    return lines


def _infer_input(node: Node):
    return [(tuple(node.attrs["x_shape"]), node.inputs[0].dtype)]


def _emit_input(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    g = _geometry(node)
    mg, taps = g.m // g.group, g.taps
    rows = f"((size_t)id * {g.inp[1]} + (size_t)ih) * {g.inp[2]}"
    orow = f"((size_t)od * {g.out[1]} + (size_t)oh) * {g.out[2]}"
    return "\n".join([
        f"for (size_t t = task; t < {g.n * g.c}; t += ntasks) {{",
        f"{ctype} *dx = {outs[0]} + t * {g.in_size};",
        f"for (size_t i = 0; i < {g.in_size}; i++) dx[i] = 0;",
        f"const size_t n = t / {g.c}, c = t % {g.c};",
        f"for (size_t j = 0; j < {mg}; j++) {{",
        f"const size_t m = c * {mg} + j;",
        f"const {ctype} *gp = {ins[0]} + (n * {g.m} + m) * {g.out_size};",
        f"const {ctype} *wp = {ins[1]} + m * {taps};",
        *_taps(g, [f"const {ctype} wv = wp[((size_t)kd * {g.k[1]} + (size_t)kh) * {g.k[2]} + (size_t)kw];",
                   f"{ctype} *restrict xr = dx + {rows} + off;",
                   f"const {ctype} *restrict gr = gp + {orow};",
                   f"for (ptrdiff_t ow = lo; ow < hi; ow++) xr[ow * {g.s[2]}] += gr[ow] * wv;"]),
        "}", "}"])


def _infer_weight(node: Node):
    return [(tuple(node.attrs["w_shape"]), node.inputs[0].dtype)]


def _emit_weight(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Per tap, the products gy * x add up lane by lane in a row accumulator over one image (an FMA
    stream the compiler vectorizes, where a dot product's sum would stay serial), then into double."""
    g = _geometry(node)
    mg, taps, ow = g.m // g.group, g.taps, g.out[2]
    rows = f"((size_t)id * {g.inp[1]} + (size_t)ih) * {g.inp[2]}"
    orow = f"((size_t)od * {g.out[1]} + (size_t)oh) * {g.out[2]}"
    return "\n".join([
        f"{ctype} *rowacc = ({ctype} *)scratch + task * (size_t){taps * ow};",
        f"for (size_t m = task; m < {g.m}; m += ntasks) {{",
        f"double acc[{taps}] = {{0}};",
        f"const size_t c = m / {mg};",
        f"for (size_t n = 0; n < {g.n}; n++) {{",
        f"for (size_t i = 0; i < {taps * ow}; i++) rowacc[i] = 0;",
        f"const {ctype} *xp = {ins[0]} + (n * {g.c} + c) * {g.in_size};",
        f"const {ctype} *gp = {ins[1]} + (n * {g.m} + m) * {g.out_size};",
        *_taps(g, [f"const {ctype} *restrict xr = xp + {rows} + off;",
                   f"const {ctype} *restrict gr = gp + {orow};",
                   f"{ctype} *restrict ar = rowacc + (((size_t)kd * {g.k[1]} + (size_t)kh) * {g.k[2]} + (size_t)kw) "
                   f"* {ow};",
                   f"for (ptrdiff_t ow = lo; ow < hi; ow++) ar[ow] += gr[ow] * xr[ow * {g.s[2]}];"]),
        f"for (size_t k = 0; k < {taps}; k++) for (size_t i = 0; i < {ow}; i++) acc[k] += rowacc[k * {ow} + i];",
        "}",
        f"for (size_t k = 0; k < {taps}; k++) {outs[0]}[m * {taps} + k] = ({ctype})acc[k];",
        "}"])


def _weight_scratch(node: Node) -> int:
    g = _geometry(node)
    return g.taps * g.out[2] * np.dtype(node.inputs[0].dtype).itemsize


register(OpDef("aotc.DepthwiseGradInput", "kernel", _infer_input, emit=_emit_input))
register(OpDef("aotc.DepthwiseGradWeight", "kernel", _infer_weight, emit=_emit_weight, scratch=_weight_scratch))


def depthwise(node: Node) -> bool:
    """Whether Conv ``node`` is depthwise: groups of one input channel each, more than one group (a
    one-channel input with one group is a single GEMM over its im2col, which measured twice as fast)."""
    w = node.inputs[1]
    return w is not None and w.shape is not None and len(w.shape) > 1 and w.shape[1] == 1 \
        and int(node.attr("group", 1)) > 1 \
        and np.dtype(node.inputs[0].dtype) in (np.dtype(np.float32), np.dtype(np.float64))
