"""Sampling and scatter ops of vision models, each one kernel: GridSample, RoiAlign, MaxUnpool,
Col2Im, DeformConv.

Coordinates computed from run-time data (grids, rois, offsets) are clamped into a small range
around the image, in floating point, before they become integers: a NaN, infinite or huge coordinate
then reads nothing outside the input and converts without undefined behaviour, and gives what the
reference gives (zero, or the border value) because every tap of such a coordinate is out of the
image anyway. Run-time indices (RoiAlign's batch indices, MaxUnpool's) are not coordinates: one out
of range makes the run return NAME_ERR_INDEX_OUT_OF_RANGE, as onnxruntime raises.
"""

from __future__ import annotations

import math

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.common import aligned_inputs, c_literal, const_input, contiguous_strides
from aotc.ops.elementwise import math_fn
from aotc.ops.index import checked_index, task_arrays
from aotc.ops.registry import OpDef, register


def _in(node: Node, i: int) -> Value:
    v = node.inputs[i]
    assert v is not None and v.shape is not None
    return v


def _const_values(node: Node, i: int) -> np.ndarray | None:
    """Input ``i``'s values when it is a constant (its indices are then checked at compile time)."""
    v = _in(node, i)
    return np.asarray(v.const).astype(np.int64) if v.is_const else None


def _float(node: Node, v: Value) -> None:
    if v.dtype not in (np.float32, np.float64):
        raise AotcError(f"{node.op} node {node.name!r}: dtype {v.dtype} not supported")


def _clamped(x: str, lo: float, hi: float, ctype: str) -> str:
    """``x`` clamped to [lo, hi]; NaN becomes lo."""
    a, b = c_literal(lo, ctype), c_literal(hi, ctype)
    return f"({x} >= {a} ? ({x} <= {b} ? {x} : {b}) : {a})"


# -- GridSample --------------------------------------------------------------------------------------
_GS_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic",
             "cubic": "cubic"}
_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}  # per spatial dim


def _gs_infer(node: Node):
    x, grid = _in(node, 0), _in(node, 1)
    _float(node, x)
    d = len(x.shape) - 2
    if d < 1 or len(grid.shape) != d + 2 or grid.shape[-1] != d or grid.shape[0] != x.shape[0]:
        raise AotcError(f"GridSample node {node.name!r}: grid {list(grid.shape)} does not match input "
                        f"{list(x.shape)}")
    return [((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype)]


def _reflect(v: str, lo: float, hi: float, ctype: str) -> str:
    """A C statement reflecting ``v`` into [lo, hi] by its near border, as often as needed."""
    rng = hi - lo
    if rng <= 0:
        return f"{v} = {c_literal(lo, ctype)};"
    a, b, r, r2 = (c_literal(t, ctype) for t in (lo, hi, rng, 2 * rng))
    fmod = math_fn("fmod", ctype)
    return (f"if ({v} < {a}) {{ const {ctype} m = {fmod}({a} - {v}, {r2}); "
            f"{v} = m < {r} ? {a} + m : {b} - (m - {r}); }}"
            f" else if ({v} > {b}) {{ const {ctype} m = {fmod}({v} - {b}, {r2}); "
            f"{v} = m < {r} ? {b} - m : {a} + (m - {r}); }}")


def _gs_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node, 0)
    n, c, sp = x.shape[0], x.shape[1], list(x.shape[2:])
    out_sp = node.outputs[0].shape[2:]
    d, p, q = len(sp), math.prod(out_sp), math.prod(sp)
    mode = _GS_MODES.get(node.attr("mode", "bilinear"))
    pad = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    if mode is None or pad not in ("zeros", "border", "reflection"):
        raise AotcError(f"GridSample node {node.name!r}: mode {node.attr('mode')!r} / padding_mode "
                        f"{pad!r} not supported")
    if n * c * p == 0:
        return "/* empty */"
    if 0 in sp:
        raise AotcError(f"GridSample node {node.name!r}: empty input image")
    taps = _TAPS[mode]
    first = {"nearest": 0, "linear": 0, "cubic": -1}[mode]  # the first tap's offset from floor(x)
    stride = contiguous_strides(sp)
    lines = [_gs_arrays(node)[1],
             f"for (size_t r = task; r < {n * p}; r += ntasks) {{",
             f"  const {ctype} *gp = {ins[1]} + r * {d};"]
    for k in range(d):  # spatial dim k is the grid's component d - 1 - k
        size = sp[k]
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        denorm = (f"(gp[{d - 1 - k}] + 1) / 2 * {c_literal(size - 1, ctype)}" if align else
                  f"((gp[{d - 1 - k}] + 1) * {c_literal(size, ctype)} - 1) / 2")
        body = [f"{ctype} v = {denorm};"]
        if mode == "nearest":
            body.append(f"v = {math_fn('nearbyint', ctype)}(v);")
        # Bicubic with border padding clamps each tap only, like onnxruntime and PyTorch (onnx's
        # reference clamps an outside coordinate first, which changes the weights near the border).
        if pad == "border" and mode != "cubic":
            body.append(f"if (v < {c_literal(lo, ctype)} || v > {c_literal(hi, ctype)}) "
                        f"v = {_clamped('v', 0, size - 1, ctype)};")
        elif pad == "reflection":
            body.append(_reflect("v", lo, hi, ctype))
        body.append(f"v = {_clamped('v', -4, size + 4, ctype)};")
        if mode == "nearest":
            body += ["const int64_t i0 = (int64_t)v;", f"wt[{k * taps}] = 1;"]
        else:
            body += [f"const int64_t i0 = (int64_t){math_fn('floor', ctype)}(v);",
                     f"const {ctype} t = v - ({ctype})i0;"]
            if mode == "linear":
                body += [f"wt[{k * taps}] = 1 - t; wt[{k * taps + 1}] = t;"]
            else:  # Keys' cubic convolution, A = -0.75
                body += [f"const {ctype} A = {c_literal(-0.75, ctype)}, t1 = t + 1, u = 1 - t, u1 = 2 - t;",
                         f"wt[{k * taps}] = ((A * t1 - 5 * A) * t1 + 8 * A) * t1 - 4 * A;",
                         f"wt[{k * taps + 1}] = ((A + 2) * t - (A + 3)) * t * t + 1;",
                         f"wt[{k * taps + 2}] = ((A + 2) * u - (A + 3)) * u * u + 1;",
                         f"wt[{k * taps + 3}] = ((A * u1 - 5 * A) * u1 + 8 * A) * u1 - 4 * A;"]
        body += [f"for (int64_t a = 0; a < {taps}; a++) {{",
                 f"  int64_t i = i0 + a + ({first});",
                 f"  ok[{k * taps} + a] = {'i >= 0 && i < ' + str(size) if pad == 'zeros' else '1'};"]
        if pad == "border":
            body.append(f"  i = i < 0 ? 0 : (i > {size - 1} ? {size - 1} : i);")
        elif pad == "reflection":
            body += [f"  {ctype} fi = ({ctype})i;", "  " + _reflect("fi", lo, hi, ctype),
                     "  i = (int64_t)fi;", f"  i = i < 0 ? 0 : (i > {size - 1} ? {size - 1} : i);"]
        body += [f"  off[{k * taps} + a] = ok[{k * taps} + a] ? (size_t)i * {stride[k]} : 0;", "}"]
        lines += ["  {", *["    " + b for b in body], "  }"]
    # The sum over the tap product, one loop per spatial dim.
    acc = [f"for (size_t ch = 0; ch < {c}; ch++) {{",
           f"  const {ctype} *xc = {ins[0]} + ((r / {p}) * {c} + ch) * {q};",
           f"  {ctype} acc = 0;"]
    ind = "  "
    for k in range(d):
        acc.append(f"{ind}for (size_t a{k} = 0; a{k} < {taps}; a{k}++) {{")
        ind += "  "
    cond = " && ".join(f"ok[{k * taps} + a{k}]" for k in range(d))
    wexpr = " * ".join(f"wt[{k * taps} + a{k}]" for k in range(d))
    oexpr = " + ".join(f"off[{k * taps} + a{k}]" for k in range(d))
    acc.append(f"{ind}if ({cond}) acc += {wexpr} * xc[{oexpr}];")
    for _ in range(d):
        ind = ind[:-2]
        acc.append(f"{ind}}}")
    acc += [f"  {outs[0]}[((r / {p}) * {c} + ch) * {p} + r % {p}] = acc;", "}"]
    lines += ["  " + a for a in acc] + ["}"]
    return "\n".join(lines)


def _gs_arrays(node: Node) -> tuple[int, str]:
    """Per spatial dim k, the offsets, weights and in-image flags of the sample's taps, at k * taps + a."""
    x = _in(node, 0)
    n = (len(x.shape) - 2) * _TAPS.get(_GS_MODES.get(node.attr("mode", "bilinear"), ""), 1)  # emit refuses a bad mode
    return task_arrays([("off", np.dtype(np.uintp), n), ("wt", x.dtype, n), ("ok", np.dtype(np.bool_), n)])


register(OpDef("GridSample", "kernel", _gs_infer, emit=_gs_emit, scratch=lambda node: _gs_arrays(node)[0]))


# -- RoiAlign -------------------------------------------------------------------------------------------
def _roi_infer(node: Node):
    x, rois = _in(node, 0), _in(node, 1)
    _float(node, x)
    if len(x.shape) != 4 or len(rois.shape) != 2 or rois.shape[1] != 4:
        raise AotcError(f"RoiAlign node {node.name!r}: needs a 4-D input and rois of shape [R, 4]")
    oh, ow = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    return [((rois.shape[0], x.shape[1], oh, ow), x.dtype)]


def _roi_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    n, c, h, w = _in(node, 0).shape
    nr, _, oh, ow = node.outputs[0].shape
    if nr * c * oh * ow == 0:
        return "/* empty */"
    if n * h * w == 0:
        raise AotcError(f"RoiAlign node {node.name!r}: empty input image")
    half = node.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    is_max = node.attr("mode", "avg") == "max"
    ratio = int(node.attr("sampling_ratio", 0))
    scale = c_literal(float(node.attr("spatial_scale", 1.0)), ctype)
    lit = {v: c_literal(v, ctype) for v in (0.5, 1.0, -1.0)}
    off = lit[0.5] if half else "0"
    # Samples per bin: sampling_ratio, else adaptive; capped so that a malformed roi far larger than
    # the image cannot loop for ever (its samples past the image contribute zero anyway).
    cap = 4 * max(h, w) + 4
    ceil = math_fn("ceil", ctype)

    def grid(extent: str, bins: int) -> str:
        if ratio > 0:
            return str(ratio)
        return f"(size_t){_clamped(f'{ceil}({extent} / {bins})', 0, cap, ctype)}"

    sample = [f"{ctype} y = yy, x = xx;",
              f"{ctype} v = 0;" if not is_max else f"{ctype} v;",
              f"if (y < {lit[-1.0]} || y > {c_literal(h, ctype)} || x < {lit[-1.0]} || x > {c_literal(w, ctype)}) "
              + ("v = 0;" if is_max else "continue;"),
              "else {",
              "  y = y > 0 ? y : 0; x = x > 0 ? x : 0;",
              "  size_t y0 = (size_t)y, x0 = (size_t)x, y1, x1;",
              f"  if (y0 >= {h - 1}) {{ y0 = y1 = {h - 1}; y = ({ctype})y0; }} else y1 = y0 + 1;",
              f"  if (x0 >= {w - 1}) {{ x0 = x1 = {w - 1}; x = ({ctype})x0; }} else x1 = x0 + 1;",
              f"  const {ctype} ly = y - ({ctype})y0, lx = x - ({ctype})x0, hy = 1 - ly, hx = 1 - lx;",
              f"  const {ctype} v1 = hy * hx * xc[y0 * {w} + x0], v2 = hy * lx * xc[y0 * {w} + x1],",
              f"      v3 = ly * hx * xc[y1 * {w} + x0], v4 = ly * lx * xc[y1 * {w} + x1];"]
    if is_max:
        sample += ["  v = v1 > v2 ? v1 : v2; v = v > v3 ? v : v3; v = v > v4 ? v : v4;", "}",
                   "acc = first || v > acc ? v : acc; first = 0;"]
    else:
        sample += ["  v = v1 + v2 + v3 + v4;", "}", "acc += v;"]
    lines = [f"for (size_t t = task; t < {nr * c}; t += ntasks) {{",
             f"  const size_t ri = t / {c}, ch = t % {c};",
             *["  " + ln for ln in checked_index(node, "bi", f"{ins[2]}[ri]", n, _const_values(node, 2),
                                                 "batch index", negative=False).split("\n")],
             f"  const {ctype} *xc = {ins[0]} + ((size_t)bi * {c} + ch) * {h * w};",
             f"  const {ctype} *roi = {ins[1]} + ri * 4;",
             f"  const {ctype} sw = roi[0] * {scale} - {off}, sh = roi[1] * {scale} - {off};",
             f"  {ctype} rw = roi[2] * {scale} - {off} - sw, rh = roi[3] * {scale} - {off} - sh;"]
    if not half:  # malformed rois are forced to 1x1
        lines.append("  rw = rw > 1 ? rw : 1; rh = rh > 1 ? rh : 1;")
    lines += [f"  const {ctype} bh = rh / {oh}, bw = rw / {ow};",
              f"  const size_t gh = {grid('rh', oh)}, gw = {grid('rw', ow)};",
              *([] if is_max else [f"  const {ctype} count = gh * gw > 1 ? ({ctype})(gh * gw) : 1;"]),
              f"  for (size_t ph = 0; ph < {oh}; ph++)",
              f"    for (size_t pw = 0; pw < {ow}; pw++) {{",
              f"      {ctype} acc = 0;" + (" _Bool first = 1;" if is_max else ""),
              "      for (size_t iy = 0; iy < gh; iy++) {",
              f"        const {ctype} yy = sh + ph * bh + (iy + {lit[0.5]}) * bh / gh;",
              "        for (size_t ix = 0; ix < gw; ix++) {",
              f"          const {ctype} xx = sw + pw * bw + (ix + {lit[0.5]}) * bw / gw;",
              *["          " + s for s in sample],
              "        }",
              "      }",
              f"      {outs[0]}[(t * {oh} + ph) * {ow} + pw] = {'acc' if is_max else 'acc / count'};",
              "    }", "}"]
    return "\n".join(lines)


register(OpDef("RoiAlign", "kernel", _roi_infer, emit=_roi_emit))


# -- MaxUnpool ----------------------------------------------------------------------------------------
def _unpool_shapes(node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the shape MaxPool's indices refer to, the output shape)."""
    x = _in(node, 0)
    ks = [int(k) for k in node.attr("kernel_shape")]
    d = len(ks)
    strides = node.attr("strides") or [1] * d
    pads = node.attr("pads") or [0] * (2 * d)
    inferred = (x.shape[0], x.shape[1],
                *[(x.shape[2 + k] - 1) * strides[k] - pads[k] - pads[d + k] + ks[k] for k in range(d)])
    shape = const_input(node, 2, "output_shape")
    out = inferred if shape is None else tuple(int(s) for s in shape.reshape(-1))
    if len(out) != len(inferred) or any(o < i for o, i in zip(out, inferred, strict=True)):
        raise AotcError(f"MaxUnpool node {node.name!r}: output_shape {list(out)} is smaller than the "
                        f"unpooled shape {list(inferred)}")
    return inferred, out


def _unpool_infer(node: Node):
    return [(_unpool_shapes(node)[1], _in(node, 0).dtype)]


def _unpool_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    inferred, out = _unpool_shapes(node)
    total_in, total_inf, total_out = _in(node, 0).size, math.prod(inferred), math.prod(out)
    if inferred == out:
        target = "(size_t)k"
    else:  # indices count in the unpooled shape, which sits at the output's origin
        st_i, st_o = contiguous_strides(inferred), contiguous_strides(out)
        target = " + ".join(f"((size_t)k / {st_i[a]} % {inferred[a]}) * {st_o[a]}" for a in range(len(out)))
    # Indices may repeat: one task scatters, in order, so the last write wins. One outside the
    # unpooled shape is an error, as in onnxruntime.
    check = checked_index(node, "k", f"{ins[1]}[e]", total_inf, _const_values(node, 1), negative=False)
    return ("if (task != 0) return;\n"
            f"for (size_t i = 0; i < {total_out}; i++) {outs[0]}[i] = 0;\n"
            f"for (size_t e = 0; e < {total_in}; e++) {{\n"
            + "".join(f"  {ln}\n" for ln in check.split("\n"))
            + f"  {outs[0]}[{target}] = {ins[0]}[e];\n}}")


register(OpDef("MaxUnpool", "kernel", _unpool_infer, emit=_unpool_emit, const_inputs=(2,)))


# -- Col2Im ----------------------------------------------------------------------------------------------
def _col2im_geometry(node: Node):
    x = _in(node, 0)
    img = [int(v) for v in const_input(node, 1, "image_shape").reshape(-1)]
    blk = [int(v) for v in const_input(node, 2, "block_shape").reshape(-1)]
    d = len(img)
    dil = node.attr("dilations") or [1] * d
    pads = node.attr("pads") or [0] * (2 * d)
    strides = node.attr("strides") or [1] * d
    nblocks = [(img[k] + pads[k] + pads[d + k] - (dil[k] * (blk[k] - 1) + 1)) // strides[k] + 1
               for k in range(d)]
    kk = math.prod(blk)
    if len(x.shape) != 3 or len(blk) != d or x.shape[1] % max(kk, 1) or x.shape[2] != math.prod(nblocks):
        raise AotcError(f"Col2Im node {node.name!r}: input {list(x.shape)} does not match image_shape "
                        f"{img} and block_shape {blk}")
    return img, blk, dil, pads, strides, nblocks


def _col2im_infer(node: Node):
    x = _in(node, 0)
    img, blk, *_ = _col2im_geometry(node)
    return [((x.shape[0], x.shape[1] // max(math.prod(blk), 1), *img), x.dtype)]


def _col2im_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    img, blk, dil, pads, strides, nblocks = _col2im_geometry(node)
    n, c = node.outputs[0].shape[:2]
    d, kk, nl, isz = len(img), math.prod(blk), math.prod(nblocks), math.prod(img)
    if n * c * isz == 0:
        return "/* empty */"
    sk, sl, si = contiguous_strides(blk), contiguous_strides(nblocks), contiguous_strides(img)
    pos = [f"const int64_t p{a} = (int64_t)((l / {sl[a]}) % {nblocks[a]}) * {strides[a]} - {pads[a]} + "
           f"(int64_t)((k / {sk[a]}) % {blk[a]}) * {dil[a]};" for a in range(d)]
    inside = " && ".join(f"p{a} >= 0 && p{a} < {img[a]}" for a in range(d))
    at = " + ".join(f"(size_t)p{a} * {si[a]}" for a in range(d))
    return "\n".join([
        f"for (size_t r = task; r < {n * c}; r += ntasks) {{",
        f"  {ctype} *y = {outs[0]} + r * {isz};",
        f"  const {ctype} *x = {ins[0]} + r * {kk * nl};",
        f"  for (size_t i = 0; i < {isz}; i++) y[i] = 0;",
        f"  for (size_t k = 0; k < {kk}; k++)",
        f"    for (size_t l = 0; l < {nl}; l++) {{",
        *["      " + p for p in pos],
        f"      if ({inside}) y[{at}] += x[k * {nl} + l];",
        "    }", "}"])


register(OpDef("Col2Im", "kernel", _col2im_infer, emit=_col2im_emit, const_inputs=(1, 2)))


# -- DeformConv (2-D) ----------------------------------------------------------------------------------
def _deform_geometry(node: Node) -> dict[str, int]:
    x, w, offset = _in(node, 0), _in(node, 1), _in(node, 2)
    if len(x.shape) != 4:
        raise AotcError(f"DeformConv node {node.name!r}: only 2-D convolution is supported")
    ks = node.attr("kernel_shape") or list(w.shape[2:])
    dil = node.attr("dilations") or [1, 1]
    pads = node.attr("pads") or [0, 0, 0, 0]
    st = node.attr("strides") or [1, 1]
    g, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    n, c, h, wd = x.shape
    oc = w.shape[0]
    oh = (h + pads[0] + pads[2] - (dil[0] * (ks[0] - 1) + 1)) // st[0] + 1
    ow = (wd + pads[1] + pads[3] - (dil[1] * (ks[1] - 1) + 1)) // st[1] + 1
    if (c % g or oc % g or c % og or w.shape[1] != c // g
            or tuple(offset.shape) != (n, og * ks[0] * ks[1] * 2, oh, ow)):
        raise AotcError(f"DeformConv node {node.name!r}: input {list(x.shape)}, weights {list(w.shape)} and "
                        f"offset {list(offset.shape)} do not match group {g} / offset_group {og}")
    return dict(n=n, c=c, h=h, w=wd, oc=oc, oh=oh, ow=ow, kh=ks[0], kw=ks[1], dh=dil[0], dw=dil[1],
                pt=pads[0], pl=pads[1], sh=st[0], sw=st[1], g=g, og=og)


def _deform_infer(node: Node):
    x = _in(node, 0)
    _float(node, x)
    gm = _deform_geometry(node)
    return [((gm["n"], gm["oc"], gm["oh"], gm["ow"]), x.dtype)]


def _deform_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    gm = _deform_geometry(node)
    x, w, off, bias, mask = (aligned_inputs(node, ins) + [None, None])[:5]
    n, c, h, wd, oc, oh, ow = (gm[k] for k in ("n", "c", "h", "w", "oc", "oh", "ow"))
    kh, kw, g, og = gm["kh"], gm["kw"], gm["g"], gm["og"]
    kk, p, cg, ocg = kh * kw, oh * ow, c // g, oc // g
    if n * oc * p == 0:
        return "/* empty */"
    fl = math_fn("floor", ctype)
    # Bilinear sampling with zeros outside the image (GridSample, align_corners=1, zeros padding).
    return "\n".join([
        _deform_arrays(node)[1],
        f"for (size_t r = task; r < {n * p}; r += ntasks) {{",
        f"  const size_t n = r / {p}, pix = r % {p}, oy = pix / {ow}, ox = pix % {ow};",
        f"  for (size_t g = 0; g < {g}; g++) {{",
        f"    for (size_t cl = 0; cl < {cg}; cl++) {{",
        f"      const size_t ch = g * {cg} + cl, og = ch / {c // og};",
        f"      const {ctype} *xc = {x} + (n * {c} + ch) * {h * wd};",
        f"      for (size_t k = 0; k < {kk}; k++) {{",
        f"        const size_t oi = (n * {og} + og) * {kk} + k;",
        f"        {ctype} y = ({ctype})((int64_t)(oy * {gm['sh']} + (k / {kw}) * {gm['dh']}) - {gm['pt']}) "
        f"+ {off}[(oi * 2) * {p} + pix];",
        f"        {ctype} xx = ({ctype})((int64_t)(ox * {gm['sw']} + (k % {kw}) * {gm['dw']}) - {gm['pl']}) "
        f"+ {off}[(oi * 2 + 1) * {p} + pix];",
        f"        y = {_clamped('y', -2, h + 1, ctype)}; xx = {_clamped('xx', -2, wd + 1, ctype)};",
        f"        const {ctype} fy = {fl}(y), fx = {fl}(xx), ly = y - fy, lx = xx - fx;",
        "        const int64_t y0 = (int64_t)fy, x0 = (int64_t)fx;",
        f"        {ctype} v = 0;",
        "        for (int64_t a = 0; a < 2; a++)",
        "          for (int64_t b = 0; b < 2; b++) {",
        "            const int64_t yi = y0 + a, xi = x0 + b;",
        f"            if (yi >= 0 && yi < {h} && xi >= 0 && xi < {wd})",
        f"              v += (a ? ly : 1 - ly) * (b ? lx : 1 - lx) * xc[(size_t)yi * {wd} + (size_t)xi];",
        "          }",
        f"        col[cl * {kk} + k] = {f'{mask}[oi * {p} + pix] * v' if mask else 'v'};",
        "      }",
        "    }",
        f"    for (size_t o = g * {ocg}; o < (g + 1) * {ocg}; o++) {{",
        f"      const {ctype} *wo = {w} + o * {cg * kk};",
        f"      {ctype} acc = {f'{bias}[o]' if bias else '0'};",
        f"      for (size_t i = 0; i < {cg * kk}; i++) acc += wo[i] * col[i];",
        f"      {outs[0]}[(n * {oc} + o) * {p} + pix] = acc;",
        "    }",
        "  }",
        "}"])


def _deform_arrays(node: Node) -> tuple[int, str]:
    """The sampled input column of one output pixel and group (channels per group x kernel taps)."""
    gm = _deform_geometry(node)
    return task_arrays([("col", _in(node, 0).dtype, gm["c"] // gm["g"] * gm["kh"] * gm["kw"])])


register(OpDef("DeformConv", "kernel", _deform_infer, emit=_deform_emit,
               scratch=lambda node: _deform_arrays(node)[0]))
