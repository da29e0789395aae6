"""The fast int8 convolution: ``aotc.QLinearConv``, a 2-D QLinearConv with constant weights, packed at
compile time (``aotc/passes/quantized.py`` makes it from QLinearConv and from onnxruntime's QDQ form).

Per work unit (a block of output rows of one image, a chunk of output channels) the input rows it reads
are copied into the task's scratch in groups of 4 channels, each pixel's 4 bytes together
(``slice[c / 4][row][col][c % 4]``), the padding and the channels up to a multiple of 4 holding the
input zero point. Then a register tile of 16-channel blocks by output pixels (taken flat over the
unit's rows) accumulates, for each tap and each 4 input channels, the 4 bytes of every pixel
(broadcast) against the packed weights of 16 channels x 4 inputs (one vector) with a u8 x s8
dot-product instruction (``vpdpbusd``; the ISA table's ``Int8Dot`` entries, the compiler's macros
choosing among them, portable C without one); the tile is requantized, packed to bytes and transposed
in registers, so each channel's pixels are stored as one run of the NCHW output. int8 activations are
stored +128 (XOR 0x80), so they are unsigned too; the packed compensation (``comp``) subtracts the
zero point (+128) times each channel's weight sum, and adds the bias, so that the accumulator is
onnxruntime's ``sum((x - zx) * w) + bias`` exactly (weights have zero point 0). Requantization is
onnxruntime's: ``float(acc) * (x_scale * w_scale / y_scale)`` in float, clamped to the output type
less the zero point, rounded to nearest even, plus the zero point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Node
from aotc.isa import ISAS, Int8Dot
from aotc.ops.registry import OpDef, register

BLOCK = 16        # output channels per packed weight vector (64 bytes)
UNITS = 8         # work units to aim for: row blocks x channel chunks
CHUNK_BLOCKS = 8  # 128 output channels per chunk at most
TILE = 6          # the pixels of the VNNI register tiles, which the split of the rows is fitted to
# Products per output at most: 255 * 128 each, their sum stays within int32 in any order (the portable
# code sums in int32).
MAX_PRODUCTS = 65536


@dataclass(frozen=True)
class QGeometry:
    n: int
    c: int
    h: int
    w: int
    m: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    ho: int
    wo: int

    @property
    def cp(self) -> int:
        return -(-self.c // 4) * 4

    @property
    def blocks(self) -> int:
        return -(-self.m // BLOCK)

    @property
    def k4(self) -> int:
        """4-byte groups of one output channel's weights: taps x cp / 4."""
        return self.kh * self.kw * self.cp // 4

    @property
    def wp(self) -> int:
        """Columns of the padded slice: every column any tap reads."""
        return max(self.w + self.pl, (self.wo - 1) * self.sw + (self.kw - 1) * self.dw + 1)

    def split(self) -> tuple[int, int, int]:
        """(rows per unit, channel blocks per chunk, chunks): at least ``UNITS`` units where the image
        allows, and of those row counts the one whose units need the fewest pixel tiles (a unit's
        last tile is as slow as a full one)."""
        cb = min(self.blocks, CHUNK_BLOCKS)
        chunks = -(-self.blocks // cb)
        row_blocks = min(self.ho, max(1, -(-UNITS // (chunks * self.n))))

        def tiles(r: int) -> tuple[int, int]:
            full, last = divmod(self.ho, r)
            return full * -(-r * self.wo // TILE) + -(-last * self.wo // TILE), -r
        return min(range(1, -(-self.ho // row_blocks) + 1), key=tiles), cb, chunks

    def slice_rows(self) -> int:
        r, _, _ = self.split()
        return (r - 1) * self.sh + (self.kh - 1) * self.dh + 1


def geometry(node: Node) -> QGeometry:
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    n, c, h, w = x.shape
    kh, kw = node.attr("kernel_shape")
    sh, sw = node.attr("strides")
    dh, dw = node.attr("dilations")
    pt, pl, pb, pr = node.attr("pads")
    ho = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    wo = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    return QGeometry(n, c, h, w, int(node.attr("m")), kh, kw, sh, sw, dh, dw, pt, pl, ho, wo)


def pack_weights(w: np.ndarray, cp: int) -> np.ndarray:
    """int8 weights [M, C, KH, KW] as bytes [block][kh][kw][cp/4][16 channels][4 inputs]; channels and
    inputs padded with zeros."""
    m, c, kh, kw = w.shape
    blocks = -(-m // BLOCK)
    p = np.zeros((blocks * BLOCK, cp, kh, kw), np.int8)
    p[:m, :c] = w
    p = p.reshape(blocks, BLOCK, cp // 4, 4, kh, kw).transpose(0, 4, 5, 2, 1, 3)
    return np.ascontiguousarray(p).reshape(-1).view(np.uint8)


def _infer(node: Node):
    g = geometry(node)
    return [((g.n, g.m, g.ho, g.wo), dtypes.from_onnx(int(node.attr("out_type"))))]


def _scratch(node: Node) -> int:
    """Bytes of one task's slice, rounded to 64 so that each task's (at ``task`` times this) is aligned."""
    g = geometry(node)
    return -(-g.slice_rows() * g.wp * g.cp // 64) * 64


# -- C --------------------------------------------------------------------------------------------
def _slice(g: QGeometry, x: str, pad: int, flip: bool) -> list[str]:
    """Copy the unit's input rows into ``xs``, 4 channels interleaved: ``xs[c / 4][row][col][c % 4]``
    (each group's plane ``slice_rows * wp * 4`` bytes), padded with ``pad``. The loops over the
    columns read 4 channel rows and write one contiguous row: they vectorize."""
    row, plane, hw = g.wp * 4, g.slice_rows() * g.wp * 4, g.h * g.w
    right = (g.wp - g.pl - g.w) * 4

    def val(q: int) -> str:
        return f"(uint8_t)(s{q}[iw] ^ 0x80)" if flip else f"s{q}[iw]"
    full, rest = g.c // 4, g.c % 4
    lines = [
        f"const size_t rows = (oh1 - 1) * {g.sh} + {(g.kh - 1) * g.dh + 1} - oh0 * {g.sh};",
        "for (size_t r = 0; r < rows; r++) {",
        f"  const ptrdiff_t ih = (ptrdiff_t)(oh0 * {g.sh} + r) - {g.pt};",
        f"  if (ih < 0 || ih >= {g.h}) {{",
        f"    for (size_t c4 = 0; c4 < {g.cp // 4}; c4++) memset(xs + c4 * {plane} + r * {row}, {pad}, {row});",
        "    continue;",
        "  }",
        f"  const uint8_t *src = (const uint8_t *)({x}) + n * {g.c * hw} + (size_t)ih * {g.w};"]
    if full:
        lines += [f"  for (size_t c4 = 0; c4 < {full}; c4++) {{",
                  f"    uint8_t *d = xs + c4 * {plane} + r * {row};",
                  *([f"    memset(d, {pad}, {g.pl * 4});"] if g.pl else []),
                  *([f"    memset(d + {(g.pl + g.w) * 4}, {pad}, {right});"] if right else []),
                  f"    const uint8_t *s0 = src + c4 * {4 * hw}, *s1 = s0 + {hw}, *s2 = s1 + {hw}, *s3 = s2 + {hw};",
                  f"    d += {g.pl * 4};",
                  f"    for (size_t iw = 0; iw < {g.w}; iw++) {{",
                  *[f"      d[iw * 4 + {q}] = {val(q)};" for q in range(4)],
                  "    }",
                  "  }"]
    if rest:
        lines += ["  {",
                  f"    uint8_t *d = xs + {full * plane} + r * {row};",
                  f"    memset(d, {pad}, {row});",
                  f"    for (size_t q = 0; q < {rest}; q++) {{",
                  f"      const uint8_t *s = src + ({full * 4} + q) * {hw};",
                  f"      for (size_t iw = 0; iw < {g.w}; iw++) d[({g.pl} + iw) * 4 + q] = "
                  f"{'(uint8_t)(s[iw] ^ 0x80)' if flip else 's[iw]'};",
                  "    }",
                  "  }"]
    return lines + ["}"]


def _tile_vector(g: QGeometry, d: Int8Dot, mb: int, np_: int, packed: str, sat: str) -> list[str]:
    """Output pixels p .. p + np_ of ``mb`` blocks from blk, as bytes in ``tb`` (``[channel][8]``)."""
    vb = BLOCK // d.lanes  # vectors per block
    o = d.ops
    bstride, plane = g.k4 * 64, g.slice_rows() * g.wp * 4
    accs = [[[f"a{i}_{v}_{j}" for j in range(np_)] for v in range(vb)] for i in range(mb)]
    lines = [f"{d.vtype} {', '.join(a + ' = ' + o['zero'] for blk in accs for vec in blk for a in vec)};",
             f"const uint8_t *wb = {packed} + blk * {bstride};"]
    lines += [f"const uint8_t *x{j} = {_pixel(g, f'p + {j}')};" for j in range(np_)]
    lines += [f"for (size_t kh = 0; kh < {g.kh}; kh++)",
              f"  for (size_t kw = 0; kw < {g.kw}; kw++) {{",
              f"    const size_t xo = (kh * {g.dh * g.wp} + kw * {g.dw}) * 4;",
              f"    const uint8_t *wt = wb + (kh * {g.kw} + kw) * {g.cp // 4 * 64};",
              f"    for (size_t c4 = 0; c4 < {g.cp // 4}; c4++) {{"]
    for i in range(mb):
        for v in range(vb):
            at = f"wt + c4 * 64 + {i * bstride + v * d.lanes * 4}"
            lines.append(f"      const {d.vtype} w{i}_{v} = {o['load'].format(p=at)};")
    for j in range(np_):
        lines.append(f"      {{ const {d.vtype} b = {o['bcast4'].format(p=f'x{j} + xo + c4 * {plane}')};")
        for i in range(mb):
            for v in range(vb):
                a = accs[i][v][j]
                lines.append(f"        {o['dot'].format(a=a, u='b', s=f'w{i}_{v}')}")
        lines.append("      }")
    lines += ["    }", "  }"]
    def req(i: int, v: int, j: int) -> str:
        ch = i * BLOCK + v * d.lanes
        return o["requant"].format(a=accs[i][v][j], c=f"comp + blk * {BLOCK} + {ch}", m=f"mul + blk * {BLOCK} + {ch}",
                                   lo="vlo", hi="vhi", z="vz")
    for i in range(mb):
        # The block's 16 channels x np_ pixels as bytes, transposed: ``tb[channel][8 pixels]``.
        qs = [o["bytes16"].format(a=req(i, 0, j), b=req(i, vb - 1, j), sat=sat) for j in range(np_)]
        qs += ["_mm_setzero_si128()"] * (8 - np_)
        lines += [f"{{ const __m128i q[8] = {{{', '.join(qs)}}};",
                  f"  aotc_i8_transpose8x16(q, tb + {i * BLOCK * 8}); }}"]
    return lines


def _tile_portable(g: QGeometry, mb: int, np_: int, packed: str) -> list[str]:
    """The same tile in plain C, requantized like the vector code (nearest even by the 1.5 * 2^23 trick,
    exact for the clamped values)."""
    return [
        f"for (size_t j = 0; j < {np_}; j++)",
        f"  for (size_t i = 0; i < {mb * BLOCK}; i++) {{",
        f"    const uint8_t *xq = {_pixel(g, 'p + j')};",
        f"    const int8_t *wq = (const int8_t *)({packed} + (blk + i / {BLOCK}) * {g.k4 * 64}) + i % {BLOCK} * 4;",
        "    int32_t s = 0;",
        f"    for (size_t kh = 0; kh < {g.kh}; kh++)",
        f"      for (size_t kw = 0; kw < {g.kw}; kw++) {{",
        f"        const uint8_t *xk = xq + (kh * {g.dh * g.wp} + kw * {g.dw}) * 4;",
        f"        const int8_t *wk = wq + (kh * {g.kw} + kw) * {g.cp // 4 * 64};",
        f"        for (size_t c4 = 0; c4 < {g.cp // 4}; c4++)",
        f"          for (size_t q = 0; q < 4; q++) s += (int32_t)xk[c4 * {g.slice_rows() * g.wp * 4} + q] * "
        "(int32_t)wk[c4 * 64 + q];",
        "      }",
        f"    const size_t ch = blk * {BLOCK} + i;",
        "    float f = (float)(int32_t)((uint32_t)s + (uint32_t)comp[ch]) * mul[ch];",
        "    f = f < flo ? flo : f;",
        "    f = f > fhi ? fhi : f;",
        f"    acc[j * {mb * BLOCK} + i] = (int32_t)((f + 12582912.0f) - 12582912.0f) + yzp;",
        "  }"]


def _tile(g: QGeometry, d: Int8Dot | None, mb: int, np_: int, packed: str, y: str, ct: str) -> list[str]:
    sat = "us" if ct == "uint8_t" else "s"
    body = _tile_portable(g, mb, np_, packed) if d is None else _tile_vector(g, d, mb, np_, packed, sat)
    head = [f"  {ct} *yr = {y} + (n * {g.m} + ch) * {g.ho * g.wo} + p;"]
    if d is not None:
        store = [f"for (size_t i = 0; i < {mb * BLOCK}; i++) {{",
                 f"  const size_t ch = blk * {BLOCK} + i;",
                 f"  if (ch >= {g.m}) break;", *head,
                 f"  memcpy(yr, tb + i * 8, {np_});",
                 "}"]
    else:
        store = [f"for (size_t i = 0; i < {mb * BLOCK}; i++) {{",
                 f"  const size_t ch = blk * {BLOCK} + i;",
                 f"  if (ch >= {g.m}) break;", *head,
                 f"  for (size_t j = 0; j < {np_}; j++) yr[j] = ({ct})acc[j * {mb * BLOCK} + i];",
                 "}"]
    return ["{", *["  " + ln for ln in body + store], "}"]


def _pixel(g: QGeometry, p: str) -> str:
    """The slice's bytes under the first tap of output pixel ``p`` (flat over the image's rows)."""
    return f"xs + (({p}) / {g.wo} - oh0) * {g.sh * g.wp * 4} + ({p}) % {g.wo} * {g.sw * 4}"


def _rows(g: QGeometry, d: Int8Dot | None, packed: str, y: str, ct: str) -> list[str]:
    """The unit's output: for each group of channel blocks, tiles of pixels taken flat over the unit's
    rows (narrow images fill whole tiles), and the one shorter tile at the end."""
    mb, np_ = (d.tile_blocks, d.tile_pixels) if d is not None else (1, 4)
    r, cb, _ = g.split()
    mb = min(mb, cb)
    last = g.ho - (-(-g.ho // r) - 1) * r
    tails = sorted({r * g.wo % np_, last * g.wo % np_} - {0})
    assert np_ <= 8, "a tile's pixels are transposed 8 at a time"
    lines = [f"uint8_t tb[{mb * BLOCK * 8}];" if d is not None else f"int32_t acc[{np_ * mb * BLOCK}];"]
    if d is not None:
        o = d.ops
        lines += [f"const {d.ftype} vlo = {o['set1f'].format(x='flo')}, vhi = {o['set1f'].format(x='fhi')};",
                  f"const {d.vtype} vz = {o['set1i'].format(x='yzp')};"]

    def group(nb: int) -> list[str]:
        out = [f"size_t p = oh0 * {g.wo};", f"for (; p + {np_} <= oh1 * {g.wo}; p += {np_})"]
        out += ["  " + ln for ln in _tile(g, d, nb, np_, packed, y, ct)]
        for i, t in enumerate(tails):
            out += [f"{'else ' if i else ''}if (oh1 * {g.wo} - p == {t})"]
            out += ["  " + ln for ln in _tile(g, d, nb, t, packed, y, ct)]
        return out

    lines += [f"for (size_t blk = b0; blk < b1; blk += {mb}) {{"]
    tail_b = g.blocks % mb
    if tail_b:
        lines += [f"  if (b1 - blk < {mb}) {{"] + ["    " + ln for ln in group(tail_b)] + ["    continue;", "  }"]
    lines += ["  " + ln for ln in group(mb)] + ["}"]
    return lines


def _emit(node: Node, ins: list[str], outs: list[str], ct: str) -> tuple[str, str]:
    g = geometry(node)
    x, packed, comp, mul = ins
    r, cb, chunks = g.split()
    row_blocks = -(-g.ho // r)
    units = g.n * row_blocks * chunks
    pad = int(node.attr("x_pad"))
    flip = bool(node.attr("flip"))
    lo, hi, yzp = (int(node.attr(a)) for a in ("lo", "hi", "y_zero_point"))
    head = [
        f"uint8_t *xs = (uint8_t *)scratch + task * (size_t){_scratch(node)};  /* this task's slice */",
        f"const float flo = {float(lo - yzp)!r}f, fhi = {float(hi - yzp)!r}f;",
        f"const int32_t yzp = {yzp};",
        f"for (size_t t = task; t < {units}; t += ntasks) {{",
        f"  const size_t n = t / {row_blocks * chunks}, rb = t / {chunks} % {row_blocks}, mc = t % {chunks};",
        f"  const size_t oh0 = rb * {r}, oh1 = oh0 + {r} < {g.ho} ? oh0 + {r} : {g.ho};",
        f"  const size_t b0 = mc * {cb}, b1 = b0 + {cb} < {g.blocks} ? b0 + {cb} : {g.blocks};",
        *["  " + ln for ln in _slice(g, x, pad, flip)]]
    # Native dot products first, then the emulated ones (their helpers), then portable C.
    dots = sorted((d for isa in ISAS.values() for d in isa.int8_dot), key=lambda d: d.emulated)
    variants = [(d, " && ".join(f"defined({m})" for m in d.macros)) for d in dots]
    body, helpers = [], ["#ifndef AOTC_I8_HELPERS", "#define AOTC_I8_HELPERS"]
    for i, (d, cond) in enumerate(variants):
        directive = f"#{'if' if i == 0 else 'elif'} {cond}"
        body += [directive, *["  " + ln for ln in _rows(g, d, f"(const uint8_t *){packed}", outs[0], ct)]]
        isa = next(e for e in ISAS.values() if d in e.int8_dot)
        # Indented: a system include at the start of a line is hoisted to the top of the file (codegen),
        # out of its #if.
        helpers += [directive, "  " + isa.include, *([d.helpers] if d.helpers else [])]
    body += ["#else", *["  " + ln for ln in _rows(g, None, f"(const uint8_t *){packed}", outs[0], ct)], "#endif"]
    helpers += ["#endif", "#endif", ""]
    code = "\n".join([f"const int32_t *comp = (const int32_t *){comp};", f"const float *mul = (const float *){mul};",
                      *head, *body, "}"])
    return "\n".join(helpers), code


def fits(node: Node) -> bool:
    """Whether the sums of ``node`` stay within int32 in any order."""
    return geometry(node).k4 * 4 <= MAX_PRODUCTS


register(OpDef("aotc.QLinearConv", "kernel", _infer, emit=_emit, scratch=_scratch))
