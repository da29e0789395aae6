"""Gradients of the pooling ops. MaxPool and AveragePool scatter the cotangent back over the windows
with internal kernels (``aotc.MaxPoolGrad``, which finds each window's maximum again as the forward
kernel does, and ``aotc.AveragePoolGrad``); the global pools are built from ordinary nodes."""

from __future__ import annotations

from typing import Any

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.conv.common import Geometry, geometry
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.registry import OpDef, register


def forward_geometry(op: str, attrs: dict[str, Any], x_shape: list[int], w_shape: list[int] | None = None) -> Geometry:
    """The geometry of forward node ``op`` with ``attrs`` on an input of ``x_shape`` (and weights)."""
    ins = [Value("x", tuple(x_shape), np.dtype(np.float32))]
    if w_shape is not None:
        ins.append(Value("w", tuple(w_shape), np.dtype(np.float32)))
    return geometry(Node(op, ins, [Value("y")], attrs, "grad"))


def forward_attrs(node: Node) -> dict[str, Any]:
    return {k: v for k, v in node.attrs.items() if not k.startswith("_")}


def _infer(node: Node):
    return [(tuple(node.attrs["x_shape"]), node.inputs[-1].dtype)]


def _overhangs(g: Geometry) -> bool:
    """Whether some window reaches outside the input (into padding, or past the end under ceil_mode)."""
    return any(g.pb[ax] or (g.out[ax] - 1) * g.s[ax] + (g.k[ax] - 1) * g.d[ax] >= g.inp[ax] for ax in range(3))


def _window(g: Geometry, offset: bool = True) -> list[str]:
    """Loops over the taps (kd, kh, kw) of output (od, oh, ow) that fall inside the input, with ``i``
    the tap's offset in the input plane. Without padding and with every window inside the input (the
    usual 2x2 stride 2), there is nothing to check."""
    checked = _overhangs(g)
    lines = []
    for ax, (o, k, p) in enumerate((("od", "kd", "id"), ("oh", "kh", "ih"), ("ow", "kw", "iw"))):
        ind = "  " * ax
        lines += [f"{ind}for (ptrdiff_t {k} = 0; {k} < {g.k[ax]}; {k}++) {{",
                  f"{ind}  const ptrdiff_t {p} = (ptrdiff_t){o} * {g.s[ax]} - {g.pb[ax]} + {k} * {g.d[ax]};",
                  *([f"{ind}  if ({p} < 0 || {p} >= {g.inp[ax]}) continue;"] if checked else [])]
    if offset:
        lines.append(f"      const size_t i = ((size_t)id * {g.inp[1]} + (size_t)ih) * {g.inp[2]} + (size_t)iw;")
    return lines


def _outputs(g: Geometry) -> list[str]:
    return [f"for (size_t od = 0; od < {g.out[0]}; od++)", f"for (size_t oh = 0; oh < {g.out[1]}; oh++)",
            f"for (size_t ow = 0; ow < {g.out[2]}; ow++) {{",
            f"  const {{ctype}} gv = gp[(od * {g.out[1]} + oh) * {g.out[2]} + ow];"]


def _emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """One (n, c) plane per work unit: zeros, then each output's cotangent added to its window."""
    is_max = node.op == "aotc.MaxPoolGrad"
    g = forward_geometry("MaxPool" if is_max else "AveragePool", forward_attrs(node), node.attrs["x_shape"])
    lines = [f"for (size_t t = task; t < {g.n * g.c}; t += ntasks) {{",
             f"{ctype} *dx = {outs[0]} + t * {g.in_size};",
             f"const {ctype} *gp = {ins[-1]} + t * {g.out_size};",
             f"for (size_t i = 0; i < {g.in_size}; i++) dx[i] = 0;",
             *(line.replace("{ctype}", ctype) for line in _outputs(g))]
    close = "      }\n    }\n  }"
    if is_max:  # the first maximum takes it, NaN winning, as in the forward kernel
        lines += [f"  const {ctype} *xc = {ins[0]} + t * {g.in_size};",
                  f"  {ctype} acc = -INFINITY; size_t arg = (size_t)-1;",
                  *_window(g),
                  "      const " + ctype + " xv = xc[i];",
                  "      if (arg == (size_t)-1 || xv > acc || (xv != xv && acc == acc)) { acc = xv; arg = i; }",
                  close,
                  "  if (arg != (size_t)-1) dx[arg] += gv;"]
    else:
        if node.attr("count_include_pad", 0):  # taps inside the padded input count
            lines.append("  size_t cnt = 1;")
            for ax, o in enumerate(("od", "oh", "ow")):
                lines.append(f"  {{ size_t c = 0; for (ptrdiff_t k = 0; k < {g.k[ax]}; k++) c += "
                             f"(ptrdiff_t){o} * {g.s[ax]} - {g.pb[ax]} + k * {g.d[ax]} < {g.inp[ax] + g.pe[ax]}; "
                             "cnt *= c; }")
        elif _overhangs(g):
            lines += ["  size_t cnt = 0;", *_window(g, offset=False), "      cnt++;", close]
        else:
            lines.append(f"  const size_t cnt = {g.taps};")
        lines += [f"  const {ctype} share = cnt ? gv / ({ctype})cnt : 0;", *_window(g), "      dx[i] += share;", close]
    return "\n".join([*lines, "}", "}"])


register(OpDef("aotc.MaxPoolGrad", "kernel", _infer, emit=_emit))
register(OpDef("aotc.AveragePoolGrad", "kernel", _infer, emit=_emit))


@rule("MaxPool")
def _max_pool(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    return [b.op("aotc.MaxPoolGrad", x, g, x_shape=list(x.shape), **forward_attrs(node))]


@rule("AveragePool")
def _average_pool(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    return [b.op("aotc.AveragePoolGrad", g, x_shape=list(x.shape), **forward_attrs(node))]


@rule("GlobalAveragePool")
def _global_average_pool(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    return [b.expand(b.scale(g, 1 / int(np.prod(x.shape[2:]))), x.shape)]


@rule("GlobalMaxPool")
def _global_max_pool(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Shared equally by the elements that reach the maximum."""
    x, g, y = node.inputs[0], dys[0], node.outputs[0]
    assert x is not None and g is not None
    hit = b.op("Cast", b.op("Equal", x, y), to=dtypes.onnx_type(x.dtype))
    count = b.reduce_sum(hit, list(range(2, len(x.shape))))
    return [b.mul(hit, b.div(g, count))]
