"""What every conv and pool path shares: the geometry (spatial dims padded to three), the
fused epilogue's statements, task splitting, zero padding, the broadcast register tile."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node
from aotc.ops.affine import Ix, offset, task_share

if TYPE_CHECKING:
    from aotc.isa import Isa
    from aotc.target import Target


@dataclass(frozen=True)
class Geometry:
    """Sizes of one conv/pool with the spatial dims padded to three (leading 1s)."""

    n: int                      # batch
    c: int                      # input channels
    m: int                      # output channels
    group: int
    inp: tuple[int, int, int]   # input spatial dims
    out: tuple[int, int, int]   # output spatial dims
    k: tuple[int, int, int]     # kernel
    s: tuple[int, int, int]     # strides
    d: tuple[int, int, int]     # dilations
    pb: tuple[int, int, int]    # pads at the beginning
    pe: tuple[int, int, int]    # pads at the end

    @property
    def in_size(self) -> int:
        return math.prod(self.inp)

    @property
    def out_size(self) -> int:
        return math.prod(self.out)

    @property
    def taps(self) -> int:
        return math.prod(self.k)


def _pad3(v: list[int] | tuple[int, ...], fill: int) -> tuple[int, int, int]:
    return tuple([fill] * (3 - len(v)) + [int(x) for x in v])  # type: ignore[return-value]


def _spatial(node: Node, in_sp: tuple[int, ...], k_sp: tuple[int, ...], ceil_mode: bool = False):
    """(out, pads_begin, pads_end) per ONNX's rules for auto_pad, pads, strides, dilations, ceil_mode."""
    nd = len(in_sp)
    if nd < 1 or nd > 3:
        raise AotcError(f"{node.op} node {node.name!r}: {nd} spatial dims (1 to 3 supported)")
    s, d = _per_axis(node, "strides", nd, 1), _per_axis(node, "dilations", nd, 1)
    pads = _per_axis(node, "pads", 2 * nd, 0)
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    ek = [(k - 1) * dd + 1 for k, dd in zip(k_sp, d, strict=True)]  # extent of a dilated kernel
    out, pb, pe = [], [], []
    for i in range(nd):
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-in_sp[i] // s[i])
            total = max(0, (o - 1) * s[i] + ek[i] - in_sp[i])
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            out.append(o), pb.append(lo), pe.append(total - lo)
            continue
        b, e = (0, 0) if auto == "VALID" else (pads[i], pads[i + nd])
        span = in_sp[i] + b + e - ek[i]
        o = (-(-span // s[i]) if ceil_mode else span // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= in_sp[i] + b:  # the last window must start inside
            o -= 1
        out.append(o), pb.append(b), pe.append(e)
    if min(out) < 1:
        raise AotcError(f"{node.op} node {node.name!r}: empty output for input {in_sp}")
    return out, pb, pe, s, d


def _per_axis(node: Node, name: str, n: int, default: int) -> list[int]:
    """Attribute ``name`` as ``n`` ints (``default`` when absent); the frontend checked its values'
    signs (aotc/frontends/validate.py), its length needs the input's rank."""
    values = [int(x) for x in node.attr(name, [default] * n)]
    if len(values) != n:
        raise AotcError(f"{node.op} node {node.name!r}: attribute {name} {values} has {len(values)} values, "
                        f"the input's {n // 2 if name == 'pads' else n} spatial axes need {n}")
    return values


def geometry(node: Node) -> Geometry:
    """The geometry of a Conv, ConvTranspose or pooling node (inputs must have shapes)."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 3:
        raise AotcError(f"{node.op} node {node.name!r}: input rank {len(x.shape)} < 3")
    n, c, in_sp = x.shape[0], x.shape[1], tuple(x.shape[2:])
    nd = len(in_sp)
    group = int(node.attr("group", 1))
    if node.op in ("Conv", "ConvTranspose"):
        w = node.inputs[1]
        assert w is not None and w.shape is not None
        k_sp = tuple(w.shape[2:])
        if len(w.shape) != len(x.shape):
            raise AotcError(f"{node.op} node {node.name!r}: weight shape {list(w.shape)} does not have the "
                            f"rank of input shape {list(x.shape)}")
        if c % group:
            raise AotcError(f"{node.op} node {node.name!r}: attribute group {group} does not divide the "
                            f"input's {c} channels")
        if "kernel_shape" in node.attrs and tuple(node.attrs["kernel_shape"]) != k_sp:
            raise AotcError(f"{node.op} node {node.name!r}: attribute kernel_shape {list(node.attrs['kernel_shape'])} "
                            f"does not match weight shape {list(w.shape)}")
    elif node.op.startswith("Global"):
        k_sp = in_sp
    else:
        k_sp = tuple(_per_axis(node, "kernel_shape", nd, 0))
    if node.op == "Conv":
        m = w.shape[0]
        if w.shape[1] * group != c:
            raise AotcError(f"Conv node {node.name!r}: weight shape {list(w.shape)} has {w.shape[1]} input "
                            f"channels per group, input shape {list(x.shape)} with group {group} has {c // group}")
        if m % group:
            raise AotcError(f"Conv node {node.name!r}: attribute group {group} does not divide the weight's "
                            f"{m} output channels")
        out, pb, pe, s, d = _spatial(node, in_sp, k_sp)
    elif node.op == "ConvTranspose":
        if w.shape[0] != c:
            raise AotcError(f"ConvTranspose node {node.name!r}: weight shape {list(w.shape)} has {w.shape[0]} "
                            f"input channels, input shape {list(x.shape)} has {c}")
        m = w.shape[1] * group
        out, pb, pe, s, d = _transpose_spatial(node, in_sp, k_sp)
    elif node.op.startswith("Global"):
        m, out, pb, pe, s, d = c, [1] * nd, [0] * nd, [0] * nd, [1] * nd, [1] * nd
    else:
        m = c
        out, pb, pe, s, d = _spatial(node, in_sp, k_sp, bool(node.attr("ceil_mode", 0)))
    return Geometry(n, c, m, group, _pad3(in_sp, 1), _pad3(out, 1), _pad3(k_sp, 1), _pad3(s, 1),
                    _pad3(d, 1), _pad3(pb, 0), _pad3(pe, 0))


def _transpose_spatial(node: Node, in_sp: tuple[int, ...], k_sp: tuple[int, ...]):
    nd = len(in_sp)
    s, d = _per_axis(node, "strides", nd, 1), _per_axis(node, "dilations", nd, 1)
    op = _per_axis(node, "output_padding", nd, 0)
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    full = [s[i] * (in_sp[i] - 1) + op[i] + (k_sp[i] - 1) * d[i] + 1 for i in range(nd)]
    shape = node.attr("output_shape")
    if shape is not None and len(shape) not in (nd, nd + 2):
        raise AotcError(f"ConvTranspose node {node.name!r}: attribute output_shape {list(shape)} has "
                        f"{len(shape)} values, the input's {nd} spatial axes need {nd}")
    if "pads" in node.attrs and auto not in ("SAME_UPPER", "SAME_LOWER"):
        pads = _per_axis(node, "pads", 2 * nd, 0)
        pb, pe = pads[:nd], pads[nd:]
        out = [full[i] - pb[i] - pe[i] for i in range(nd)]
    elif shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [int(x) for x in shape][-nd:] if shape is not None else [in_sp[i] * s[i] for i in range(nd)]
        total = [full[i] - out[i] for i in range(nd)]
        if any(total[i] <= -s[i] for i in range(nd)):  # onnxruntime's limit: no input would reach the rest
            raise AotcError(f"ConvTranspose node {node.name!r}: attribute output_shape {list(shape)} exceeds the "
                            f"full output {full} of input shape {list(in_sp)} by a stride {s} or more")
        # onnxruntime: SAME_UPPER puts the odd pad at the end, anything else at the beginning. An
        # output_shape past the full output (by less than a stride) gets its extra rows at the end
        # (onnxruntime and onnx.reference agree); SAME with a kernel shorter than the stride splits its
        # negative total as onnx.reference does (onnxruntime gives another shape).
        split = [max(t, 0) for t in total] if shape is not None else total
        pb = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in split]
        pe = [t - b for t, b in zip(total, pb, strict=True)]
    else:
        pb, pe, out = [0] * nd, [0] * nd, full
    if min(out) < 1:
        raise AotcError(f"ConvTranspose node {node.name!r}: empty output")
    return out, pb, pe, s, d


def infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    g = geometry(node)
    b = node.inputs[2] if node.op in ("Conv", "ConvTranspose") and len(node.inputs) > 2 else None
    if b is not None and b.shape != (g.m,):
        raise AotcError(f"{node.op} node {node.name!r}: bias shape {list(b.shape or ())} does not match "
                        f"the {g.m} output channels")
    nd = len(x.shape) - 2
    shape = (g.n, g.m, *g.out[3 - nd:])
    res = [(shape, x.dtype)]
    if node.op == "MaxPool" and len(node.outputs) > 1:
        res.append((shape, np.dtype(np.int64)))
    return res


# Epilogue: C statements that update ``v`` (the finished output value) and may read n, c, od, oh, ow.
Epilogue = list[str]


def epi_block(epi: Epilogue | None, g: Geometry, s: str, indent: str = "") -> list[str]:
    """Statements defining od/oh/ow from the flat output position ``s`` if the epilogue uses them
    (most epilogues read per-channel values or same-shaped tensors, addressed by c and s only)."""
    if not epi:
        return []
    oh_, ow_ = g.out[1], g.out[2]
    lines = list(epi)
    if any(re.search(r"\b(od|oh|ow)\b", ln) for ln in epi):
        lines.insert(0, f"const size_t od = ({s}) / {oh_ * ow_}, oh = ({s}) / {ow_} % {oh_}, ow = ({s}) % {ow_};"
                        " (void)od; (void)oh; (void)ow;")
    return [indent + x for x in lines]


# Each output is one chain of dependent FMAs (one per tap): unrolling lets the vectorized loop
# overlap several chains. GCC unrolls the plain loop by itself but not once an epilogue (Clip) is in
# it, which made a depthwise conv + Clip 1.6x slower.
UNROLL = "#pragma GCC unroll 4"


# A register tile's write-out has a constant trip count: GCC unrolls such a loop whole before its
# vectorizer runs, then leaves the unrolled scalar code (a clamp to IEEE max/min is cheap in scalar
# cost) unvectorized. Kept a loop, it is vectorized.
WRITE_OUT = "#pragma GCC unroll 1"


def task_loop(total: int, inner: str) -> str:
    """Tasks take contiguous ranges of work units (every unit is computed the same way)."""
    lo, hi = task_share(total)
    return f"for (size_t t = {lo}; t < {hi}; t++) {{\n{inner}\n}}"


def task_bounds(total: int, lo: str = "t0", hi: str | None = "t1") -> str:
    """A declaration of this task's first unit ``lo`` (and end ``hi``) of ``total`` units."""
    a, b = task_share(total)
    return f"const size_t {lo} = {a}" + (f", {hi} = {b}; (void){lo}; (void){hi};" if hi else f"; (void){lo};")


def split_unit(t: str, parts: list[tuple[str, int]], keep: bool = False) -> tuple[str, dict[str, Ix]]:
    """The coordinates of work unit ``t`` over ``parts`` (name, count), fastest first: a declaration
    of those that vary and each coordinate as an index expression (a part of count 1 is the constant
    0 and is not declared). With ``keep`` the last one (the batch index ``n``, which an epilogue may
    read) is declared in any case."""
    ix, decls, stride = {}, [], 1
    for i, (name, count) in enumerate(parts):
        last = i == len(parts) - 1
        if count == 1:
            ix[name] = Ix()
            if keep and last:
                decls.append(f"{name} = 0")
            continue
        v = Ix.of(t) // stride
        rest = any(c > 1 for _, c in parts[i + 1:])  # t is below this stride times count otherwise
        decls.append(f"{name} = {v % count if rest else v}")
        ix[name] = Ix.of(name)
        stride *= count
    unused = f" (void){parts[-1][0]};" if keep and parts[-1][1] == 1 else ""
    return (f"const size_t {', '.join(decls)};{unused}" if decls else ""), ix


def plane_unit(g: Geometry) -> str:
    """The batch index ``n`` and channel ``c`` of work unit ``t``, one output plane (both declared:
    an epilogue may read them)."""
    if g.n == 1:
        return "const size_t n = 0, c = t; (void)n;"
    return f"const size_t n = t / {g.m}, c = t % {g.m}; (void)n;"


def signed_start(o: Ix | str, stride: int, pad: int) -> str:
    """C for the signed input index where output index ``o``'s window starts."""
    ix = Ix.of(o) * stride
    atom = len(ix.terms) == 1 and ix.terms[0][1] == 1 and not ix.const and " " not in ix.terms[0][0]
    start = str(ix) if ix.is_const() else f"(ptrdiff_t){ix}" if atom else f"(ptrdiff_t)({ix})"
    return f"{start} - {pad}" if pad else start


def depth_loop(g: Geometry) -> str:
    """The head of the loop over output depths ``od`` (a constant where there is one); the loop
    over output rows that follows is its body."""
    return f"for (size_t od = 0; od < {g.out[0]}; od++)" if g.out[0] > 1 else "const size_t od = 0;"


def window_rows(g: Geometry) -> str:
    """The signed input depth ``d0`` and row ``h0`` where the windows of output row (od, oh) start."""
    return (f"const ptrdiff_t d0 = {signed_start('od', g.s[0], g.pb[0])}, "
            f"h0 = {signed_start('oh', g.s[1], g.pb[1])};")


def padded_dims(g: Geometry) -> tuple[int, int, int]:
    return tuple(g.inp[i] + g.pb[i] + g.pe[i] for i in range(3))  # type: ignore[return-value]


# The conv paths other than the generic loop hold compile-time structures that grow with the row
# width (the depthwise zero row, edge columns unrolled or listed, phase tables); past this padded
# width (2^20 floats; a 2^32+3 wide input made a 16 GiB constant) a conv takes the generic loop.
MAX_FAST_ROW = 1 << 20


def fast_rows(g: Geometry) -> bool:
    """Whether ``g``'s padded rows are narrow enough for the specialized conv paths."""
    return padded_dims(g)[2] <= MAX_FAST_ROW


def pad_copy(g: Geometry, src: str, dst: str, planes: int) -> list[str]:
    """Copy ``planes`` input planes into a zero-padded buffer (so the hot loops need no bounds checks)."""
    PD, PH, PW = padded_dims(g)
    ID, IH, IW = g.inp
    p, r = Ix.of("p"), Ix.of("r")
    row = Ix.of("pl") * (PD * PH * PW) + ((r // IH + g.pb[0]) * PH + r % IH + g.pb[1]) * PW + g.pb[2]
    # The padding is zeroed on a task's first unit only: later copies overwrite the same interior.
    return [f"if (t == t0) for (size_t i = 0; i < {planes * PD * PH * PW}; i++) {dst}[i] = 0;",
            f"for (size_t p = 0; p < {planes * ID * IH}; p++) {{",
            f"  const size_t pl = {p // (ID * IH)}, r = {p % (ID * IH)};",
            f"  float *restrict drow = {offset(dst, row)};",
            f"  const float *restrict srow = {offset(src, p * IW)};",
            f"  for (size_t i = 0; i < {IW}; i++) drow[i] = srow[i];",
            "}"]


def pad_rows(g: Geometry, src: str, dst: str, planes: int, slo: str, shi: str) -> list[str]:
    """2-D/1-D padded copy of only the padded rows that output positions [slo, shi) read (zeroed, then
    the input rows among them copied in): what one task of the tiled path needs."""
    _, PH, PW = padded_dims(g)
    _, IH, IW = g.inp
    OW = g.out[2]
    last = (g.k[1] - 1) * g.d[1]
    pb = g.pb[1]
    r0, r1 = Ix.of(slo) // OW * g.s[1], Ix.of(f"({shi} - 1)") // OW * g.s[1] + (last + 1)
    pl, ih = Ix.of("pl") if planes > 1 else Ix(), Ix.of("ih")
    return [f"const size_t r0 = {r0}, r1 = {r1};",
            f"const size_t i0 = {f'r0 > {pb} ? r0 - {pb} : 0' if pb else 'r0'}, "
            f"i1 = r1 > {pb + IH} ? {IH} : {f'r1 > {pb} ? r1 - {pb} : 0' if pb else 'r1'};",
            "{" if planes == 1 else f"for (size_t pl = 0; pl < {planes}; pl++) {{",
            f"  for (size_t i = r0 * {PW}; i < r1 * {PW}; i++) {dst}[{pl * (PH * PW) + 'i'}] = 0;",
            "  for (size_t ih = i0; ih < i1; ih++)",
            f"    for (size_t i = 0; i < {IW}; i++)",
            f"      {dst}[{pl * (PH * PW) + (ih + pb) * PW + g.pb[2] + 'i'}] = {src}[{(pl * IH + ih) * IW + 'i'}];",
            "}"]


def block_count(mg: int, cb: int) -> str:
    """C expression: the channels of block ``blk`` that exist; a literal when every block is full (or
    there is one block), so the compiler unrolls the loops that write a tile out."""
    if mg % cb == 0 or mg < cb:
        return str(min(mg, cb))
    return f"{mg} - blk * {cb} < {cb} ? {mg} - blk * {cb} : {cb}"


def cmin(a: Ix | int | str, b: Ix | int | str) -> str:
    """C for min(a, b) of two indices, folded when both are constants."""
    a_, b_ = Ix.of(a), Ix.of(b)
    if a_.is_const() and b_.is_const():
        return str(min(a_.const, b_.const))
    return f"{a_} < {b_} ? {a_} : {b_}"


def first_of(per: int, t: str = "t", t0: str = "t0") -> str:
    """C opening the block run on a task's first unit ``t0`` and on every ``per``-th unit after a
    multiple of ``per`` (always, where ``per`` is 1)."""
    return "{" if per == 1 else f"if ({t} == {t0} || {t} % {per} == 0) {{"


def needs_pad(g: Geometry) -> bool:
    return any(g.pb) or any(g.pe)


@dataclass(frozen=True)
class TilePlan:
    cb: int      # output channels per block (nv vectors)
    nv: int
    r: int       # output positions per register tile
    lanes: int


def bcast_fma(vec: Isa, row: int, nv: int, scalar: str, name: str, vectors: str, indent: str) -> list[str]:
    """One row of a register tile: broadcast the float at ``scalar`` into ``name`` and accumulate its
    products with the vectors ``{vectors}0 .. {vectors}{nv-1}`` into ``a{row}_0 ..``."""
    return [f"{indent}{{ const {vec.vtype} {name} = {vec.vbcast(scalar)};",
            *(f"{indent}  a{row}_{j} = {vec.vfma(f'a{row}_{j}', name, f'{vectors}{j}')};" for j in range(nv)),
            f"{indent}}}"]


def bcast_tile_kernel(target: Target, fn: str, mb: int, nv: int, xstride: int, ystride: int, k: str,
                      inline: bool = True) -> str:
    """C function ``fn(x, w, init, y, nk)``: a register tile of MB rows (weights broadcast) x NV
    vectors, y[i][v] = init[i] + sum over k < ``k`` (a C expression, may use nk) of w[k][i] * x[k][v],
    with x rows ``xstride`` and y rows ``ystride`` floats apart and w packed [k][MB]."""
    vec = target.isa
    vt, L = vec.vtype, vec.lanes

    # Not inlined (the Winograd GEMMs): registers are then allocated apart from the caller's loops.
    mk = [f"{vec.attribute}static {'inline' if inline else '__attribute__((noinline))'} void {fn}("
          "const float *restrict x, const float *restrict w, const float *restrict init, float *restrict y, "
          "size_t nk) {", "  (void)nk;"]
    mk += [f"  {vt} a{i}_{j} = {vec.vbcast(offset('init', i))};" for i in range(mb) for j in range(nv)]
    mk += [f"  for (size_t ci = 0; ci < {k}; ci++) {{",
           f"    const float *restrict xr = x + ci * {xstride};",
           f"    const float *restrict wr = w + ci * {mb};"]
    mk += [f"    const {vt} x{j} = {vec.vload(offset('xr', j * L))};" for j in range(nv)]
    for i in range(mb):
        mk += bcast_fma(vec, i, nv, offset("wr", i), "wb", "x", "    ")
    mk.append("  }")
    mk += [f"  {vec.vstore(offset('y', i * ystride + j * L), f'a{i}_{j}')};" for i in range(mb) for j in range(nv)]
    mk.append("}")
    return "\n".join(mk)


def lanes_of_8x8(target: Target) -> bool:
    """Whether the ISA is AVX2 (8 lanes and its 8x8 transposes): the 1x1 kernel's tile shapes for 16
    ymm registers are measured for it (AVX-512 has its own)."""
    return target.isa.shuffles256 and target.isa.lanes == 8


def transpose8(fn: str) -> str:
    """``{fn}_tr8(src, ss, dst, ds)``: dst[j * ds + i] = src[i * ss + j] for an 8x8 block (pairs of rows
    interleaved, then pairs of pairs, then the 128-bit halves exchanged)."""
    ld = "\n".join(f"  const __m256 r{i} = _mm256_loadu_ps({offset('src', Ix.of('ss') * i)});" for i in range(8))
    t = "\n".join(f"  const __m256 t{2 * i} = _mm256_unpacklo_ps(r{2 * i}, r{2 * i + 1}), "
                  f"t{2 * i + 1} = _mm256_unpackhi_ps(r{2 * i}, r{2 * i + 1});" for i in range(4))
    u = "\n".join(f"  const __m256 u{4 * h + 2 * k} = _mm256_shuffle_ps(t{4 * h + k}, t{4 * h + k + 2}, 0x44), "
                  f"u{4 * h + 2 * k + 1} = _mm256_shuffle_ps(t{4 * h + k}, t{4 * h + k + 2}, 0xEE);"
                  for h in range(2) for k in range(2))
    st = "\n".join(f"  _mm256_storeu_ps({offset('dst', Ix.of('ds') * (j + 4 * hi))}, "
                   f"_mm256_permute2f128_ps(u{j}, u{j + 4}, {'0x31' if hi else '0x20'}));"
                   for hi in range(2) for j in range(4))
    return (f'__attribute__((target("avx2"))) static inline void {fn}_tr8(const float *restrict src, size_t ss, '
            f"float *restrict dst, size_t ds) {{\n{ld}\n{t}\n{u}\n{st}\n}}\n")
