"""The "depthwise" path (one input channel per group): strided or small planes are copied into a
zero-padded buffer split into stride phases, so one flat loop over "virtual" positions has contiguous
loads for every tap; large stride-1 planes run a width loop per row with the taps unrolled."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aotc.ops.affine import Ix, offset
from aotc.ops.conv.common import (
    UNROLL,
    Epilogue,
    Geometry,
    depth_loop,
    fast_rows,
    padded_dims,
    plane_unit,
    task_bounds,
    task_loop,
    window_rows,
)

if TYPE_CHECKING:
    from aotc.target import Target


def _phase_dims(g: Geometry) -> tuple[int, int, int, int, int]:
    """(sH, sW, PH2, PW2, nq) of the phase path: stride phases, phase plane dims, virtual positions."""
    PH, PW = g.inp[1] + g.pb[1] + g.pe[1], g.inp[2] + g.pb[2] + g.pe[2]
    sh, sw = g.s[1], g.s[2]
    ph2, pw2 = -(-PH // sh), -(-PW // sw)
    return sh, sw, ph2, pw2, (g.out[1] - 1) * pw2 + g.out[2]


def use_phase(g: Geometry) -> bool:
    """1-D/2-D depthwise convs that are strided or have small planes (mostly border) take the phase
    path; large stride-1 planes are faster read in place, row by row (measured at 112x112). A stride
    past the padded plane (one output along it) stays row by row: the phase path's tables and
    scratch grow with the stride."""
    _, ph, pw = padded_dims(g)
    return fast_rows(g) and g.inp[0] == 1 and g.k[0] == 1 and g.s[1] <= ph and g.s[2] <= pw and \
        (max(g.s[1:]) > 1 or math.prod(padded_dims(g)) <= 4096)


def phase_areas(g: Geometry) -> tuple[int, int]:
    """(phase floats, virtual positions computed) of the phase path. The flat loop runs to a multiple
    of 16 positions so it has no scalar remainder (on a 14x14 plane that remainder took a third of
    the time); the phase area grows by the positions added, which read zeros and are dropped."""
    sh, sw, ph2, pw2, nq = _phase_dims(g)
    nqv = (nq + 15) // 16 * 16
    return (sh * sw * ph2 * pw2 + nqv - nq + 15) // 16 * 16, nqv


def _phase_cols(g: Geometry) -> tuple[list[tuple[int, int]], int, int]:
    """Phase column pj holds padded columns j = pj + sW * m (input column j - pbw): the range of m
    inside the input per phase, and the range [lo, hi) that every phase has."""
    sw, pw2, pbw, IW = g.s[2], _phase_dims(g)[3], g.pb[2], g.inp[2]
    rng = [(max(0, -(-(pbw - pj) // sw)), min(pw2, (IW - 1 + pbw - pj) // sw + 1)) for pj in range(sw)]
    return rng, max(r[0] for r in rng), min(r[1] for r in rng)


def phase_rowbuf(g: Geometry) -> int:
    """Floats of the phase path's zero-padded copy of the input rows: stride 2 along rows too
    narrow to split in place (AVX2 steps of 8 columns), at least 8 phase columns wide."""
    _, lo, hi = _phase_cols(g)
    pw2 = _phase_dims(g)[3]
    return (pw2 * 2 * g.inp[1] + 15) // 16 * 16 if g.s[2] == 2 and hi - lo < 8 <= pw2 else 0


def _phase_buffers(g: Geometry) -> int:
    """Sets of phase planes per task. Small planes take two: each unit copies the next input
    channel's planes before computing its own, so the taps' loads do not wait on stores just made
    (the copy's stores and the flat loop's unaligned loads cannot forward). Measured 1.06-1.22x on
    14x14 and 7x7 planes; 0.92x on 28x28 (30x30 padded), which keep one."""
    return 2 if phase_areas(g)[0] <= 512 else 1


def phase_scratch(g: Geometry) -> int:
    """The phase planes, the row copy and the flat loop's output."""
    area, nqv = phase_areas(g)
    return _phase_buffers(g) * area + phase_rowbuf(g) + nqv


def _phase_head(g: Geometry, area: int) -> str:
    """Per-task pointers of the phase path: the phase planes and the row copy, the unit range."""
    units, nbuf = g.n * g.m, _phase_buffers(g)
    ph = "phb" if nbuf == 2 else "ph"
    return (f"float *restrict {ph} = scratch + task * (size_t){phase_scratch(g)};\n"
            f"float *restrict rb = {ph} + {nbuf * area}; (void)rb;\n{task_bounds(units)}\n")


def _deinterleave2(fn: str, off: int) -> str:
    """``{fn}_deint2(s, d0, d1, lo, hi)``: d0[m] = s[2m - off], d1[m] = s[2m + 1 - off] for lo <= m < hi, eight
    columns per step through AVX2 shuffles (the even/odd lanes of two loads, then their 128-bit
    halves put in order); needs hi - lo >= 8."""
    return (f'#include <immintrin.h>\n__attribute__((target("avx2"))) static void {fn}_deint2('
            "const float *restrict s, float *restrict d0, float *restrict d1, size_t lo, size_t hi) {\n"
            "  for (size_t i = lo; i < hi; i += 8) {\n"
            "    const size_t m = i + 8 <= hi ? i : hi - 8; /* the last step overlaps the one before */\n"
            f"    const float *p = s + (2 * m - {off});\n"
            "    const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);\n"
            "    const __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88));\n"
            "    const __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD));\n"
            "    _mm256_storeu_ps(d0 + m, _mm256_castpd_ps(_mm256_permute4x64_pd(e, 0xD8)));\n"
            "    _mm256_storeu_ps(d1 + m, _mm256_castpd_ps(_mm256_permute4x64_pd(o, 0xD8)));\n"
            "  }\n}\n")


def _depthwise_phase(g: Geometry, x: str, w: str, b: str | None, y: str, target: Target,
                     epi: Epilogue | None, fn: str) -> tuple[str, str]:
    """Depthwise conv (1-D/2-D) via a zero-padded copy split into stride phases: padded element
    (i, j) goes to phase (i % sH, j % sW) at (i / sH, j / sW). Output (oh, ow) then reads tap (kh, kw)
    from one phase at (oh + kh*dh / sH, ow + kw*dw / sW): with "virtual" positions q = oh * PW2 + ow,
    one flat loop over q has contiguous loads for every tap, whatever the stride, and is long enough to
    vectorize even for 7x7 maps; columns ow >= OW are computed and dropped."""
    helper, lines, flat = phase_unit(g, x, w, b, y, target, epi, fn, _phase_buffers(g) == 2)
    head = _phase_head(g, phase_areas(g)[0])
    if flat:
        head += f"float *restrict vo = {offset('rb', phase_rowbuf(g))};\n"
    return helper, head + task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))


def phase_unit(g: Geometry, x: str, w: str, b: str | None, y: str, target: Target, epi: Epilogue | None,
               fn: str, double: bool, src: str | None = None, first: str = "t == t0") -> tuple[str, list[str], bool]:
    """(helpers, statements, flat) of the phase path for work unit ``t`` (plane n * M + c): they
    read ``ph`` (phase planes, ``double``: two sets ``phb``), ``rb`` (the row copy) and, when
    ``flat``, ``vo`` (the flat loop's output). The input plane is ``src`` (a C expression; default
    the plane of ``x``), whose padding is zeroed when ``first`` holds (a task's first unit)."""
    mg = g.m // g.group
    _, IH, IW = g.inp
    _, OH, OW = g.out
    sh, sw, ph2, pw2, nq = _phase_dims(g)
    pp = ph2 * pw2
    pbh, pbw = g.pb[1], g.pb[2]
    fma = target.isa.fma
    # The padding is zeroed on a task's first unit only: later copies overwrite the same interior.
    area, nqv = phase_areas(g)
    copy = [f"for (size_t ih = 0; ih < {IH}; ih++) {{",
            f"  const size_t i = ih + {pbh};",
            f"  const float *restrict sr = xs + ih * {IW};",
            f"  float *restrict dr = {offset('ph', Ix.of('i') % sh * (sw * pp) + Ix.of('i') // sh * pw2)};"]
    # One loop over the m that every phase has deinterleaves the row in a single pass; the few others
    # go one by one.
    rng_, lo, hi = _phase_cols(g)
    helper = ""
    rowbuf = target.isa.shuffles256 and phase_rowbuf(g) > 0
    if hi - lo >= 8 and sw == 2 and target.isa.shuffles256:
        # Scalar stride-2 reads cost more than the whole conv: split 16 columns at a time in registers.
        helper = _deinterleave2(fn, pbw)
        copy.append(f"  {fn}_deint2(sr, dr, dr + {pp}, {lo}, {hi});")
    elif rowbuf:
        # Rows too narrow for the in-place split (14 columns): copy the row into a zero-padded row
        # buffer (its padding zeroed once per task) and split all 2 * PW2 columns of it, which fill
        # the phases' padding columns too. Per-element copies took 70% of a 14x14 stride-2 conv.
        helper = _deinterleave2(fn, 0)
        copy[0:0] = [f"for (size_t ih = 0; ih < {IH}; ih++)",
                     f"  for (size_t i = 0; i < {IW}; i++) rb[ih * {2 * pw2} + {pbw} + i] = xs[ih * {IW} + i];"]
        copy.append(f"  {fn}_deint2(rb + ih * {2 * pw2}, dr, dr + {pp}, 0, {pw2});")
        lo = hi = 0
        rng_ = []
    elif hi > lo:
        mm = Ix.of("m")
        copy.append(f"  for (size_t m = {lo}; m < {hi}; m++) {{ "
                    + " ".join(f"dr[{mm + pj * pp}] = sr[{mm * sw + (pj - pbw)}];" for pj in range(sw)) + " }")
    for pj, (a, b_) in enumerate(rng_):
        extra = [m for m in range(a, b_) if not lo <= m < hi]
        copy += [f"  dr[{pj * pp + m}] = sr[{m * sw + pj - pbw}];" for m in extra]
    copy.append("}")
    rbn = phase_rowbuf(g)
    lines = [plane_unit(g)]
    if double:  # the copy as a helper called twice, see _phase_buffers
        assert src is None
        helper += (f"static void {fn}_phcopy(const float *restrict xs, float *restrict ph, float *restrict rb) {{\n"
                   "  (void)rb;\n" + "\n".join("  " + ln for ln in copy) + "\n}\n")
        tc, nc = Ix.of("t") // mg, Ix.of("(t + 1)") // mg  # this unit's input plane and the next one's
        lines += [f"if (t == t0) {{ for (size_t i = 0; i < {2 * area + rbn}; i++) phb[i] = 0; "
                  f"{fn}_phcopy({offset(x, tc * g.in_size)}, {offset('phb', tc % 2 * area)}, rb); }}",
                  f"if (t + 1 < t1{f' && (t + 1) % {mg} == 0' if mg > 1 else ''}) "
                  f"{fn}_phcopy({offset(x, nc * g.in_size)}, {offset('phb', nc % 2 * area)}, rb);",
                  f"const float *ph = {offset('phb', tc % 2 * area)};"]
    else:  # inline, into the task's one set of planes (a helper measured 7% slower on 28x28)
        lines += [f"const float *xs = {src or offset(x, Ix.of('t') // mg * g.in_size)};",
                  # With one channel per group every unit copies its own plane.
                  "{" if mg == 1 else f"if (({first}) || t % {mg} == 0) {{",
                  f"  if ({first}) for (size_t i = 0; i < {area + rbn}; i++) ph[i] = 0;",
                  *("  " + ln for ln in copy), "}"]
    lines += [f"const float *wc = {w} + c * {g.taps};",
             *[f"const float w{i} = wc[{i}];" for i in range(g.taps)],
             f"const float bias_c = {f'{b}[c]' if b else '0.0f'};",
             f"float *restrict yo = {offset(y, Ix.of('t') * g.out_size)};"]
    taps = []
    for kh in range(g.k[1]):
        for kw in range(g.k[2]):
            hh, ww = kh * g.d[1], kw * g.d[2]
            off = ((hh % sh) * sw + ww % sw) * pp + (hh // sh) * pw2 + ww // sw
            wv = f"w{len(taps)}"
            xv = f"ph[{Ix.of('q') + off}]"
            taps.append(f"v = fmaf({wv}, {xv}, v);" if fma else f"v += {wv} * {xv};")
    lanes = target.isa.lanes
    if OW >= 6 * lanes:
        # Wide rows: each output row is computed straight into the output (blocks of one vector, the
        # last moved back to overlap), with no flat buffer to copy out of: those row copies were
        # memcpy calls, 10% of a 112x112 stride-2 conv; 1.12x faster there. Narrower rows (28
        # columns: 4 vectors for 28 outputs) are no faster than the flat loop.
        lines += [f"for (size_t oh = 0; oh < {OH}; oh++) {{",
                  f"  float *restrict yr = yo + oh * {OW};",
                  "  " + UNROLL,
                  f"  for (size_t ob = 0; ob < {OW}; ob += {lanes}) {{",
                  f"    const size_t o0 = ob + {lanes} <= {OW} ? ob : {OW - lanes};",
                  "    AOTC_IVDEP",
                  f"    for (size_t k = 0; k < {lanes}; k++) {{",
                  f"      const size_t ow = o0 + k, q = {Ix.of('oh') * pw2 + 'ow'};",
                  *([f"      const size_t od = 0, s = {Ix.of('oh') * OW + 'ow'}; (void)od; (void)s;"] if epi else []),
                  "      float v = bias_c;",
                  *("      " + tp for tp in taps),
                  *("      " + e for e in (epi or [])),
                  "      yr[ow] = v;",
                  "    }", "  }", "}"]
        return helper, lines, False
    lines += [UNROLL, f"for (size_t q = 0; q < {nqv}; q++) {{", "  float v = bias_c;", *("  " + tp for tp in taps)]
    # An epilogue that reads no memory (Relu, Clip) runs in the vectorized loop; the valid columns
    # are then plain row copies. One that reads tensors runs per real output position.
    pure = not any("[" in e for e in epi or [])
    lines += [*("  " + e for e in (epi or []) if pure), "  vo[q] = v;", "}"]
    if pure:
        lines.append(f"for (size_t oh = 0; oh < {OH}; oh++) "
                     f"memcpy(yo + oh * {OW}, vo + oh * {pw2}, {OW} * sizeof(float));")
    else:
        lines += [f"for (size_t oh = 0; oh < {OH}; oh++)",
                  f"for (size_t ow = 0; ow < {OW}; ow++) {{",
                  f"  const size_t od = 0, s = oh * {OW} + ow; float v = vo[oh * {pw2} + ow]; (void)od;",
                  *("  " + e for e in (epi or [])),
                  "  yo[s] = v;", "}"]
    return helper, lines, True


# Edge columns are unrolled up to this many taps per row (more: a loop with column checks).
_EDGE_UNROLL = 256


def depthwise_conv(g: Geometry, x: str, w: str, b: str | None, y: str, target: Target,
                    epi: Epilogue | None, fn: str) -> tuple[str, str]:
    """One input channel per group, (n, c) planes as work units. Each output row reads its input
    rows through one pointer per (kd, kh), a shared zero row standing in for rows outside the input,
    so no row needs bounds checks: the interior columns run a width loop with the taps unrolled
    (vectorized over the width, accumulator in a register) and the few edge columns have their
    in-range taps unrolled at compile time (a bounds-checked call per border position cost as much
    as the whole interior of a 112x112 plane)."""
    mg = g.m // g.group
    if use_phase(g):
        return _depthwise_phase(g, x, w, b, y, target, epi, fn)
    ID, IH, IW = g.inp
    OD, OH, OW = g.out
    fma = target.isa.fma  # fmaf is a slow libm call without hardware FMA
    kr = g.k[0] * g.k[1]

    def acc(wv: str, xv: str) -> str:
        return f"v = fmaf({wv}, {xv}, v);" if fma else f"v += {wv} * {xv};"

    def cols(ow: int) -> list[tuple[int, int]]:  # (kw, input column) of the taps inside the row
        return [(kw, ow * g.s[2] + kw * g.d[2] - g.pb[2]) for kw in range(g.k[2])
                if 0 <= ow * g.s[2] + kw * g.d[2] - g.pb[2] < IW]

    def store(ind: str) -> list[str]:
        return [*([f"{ind}const size_t s = rs + ow; (void)s;"] if epi else []),
                *(ind + e for e in (epi or [])), f"{ind}yr[ow] = v;"]

    # Interior columns: every tap inside the row.
    owa = min(OW, -(-g.pb[2] // g.s[2]))
    owb = max(owa, min(OW, (IW - 1 - (g.k[2] - 1) * g.d[2] + g.pb[2]) // g.s[2] + 1))
    edges = [*range(owa), *range(owb, OW)]
    lines = [plane_unit(g),
             f"const float *xc = {offset(x, (Ix.of('n') * g.c + Ix.of('c') // mg) * g.in_size)};",
             f"const float *wc = {w} + c * {g.taps};",
             *[f"const float w{i} = wc[{i}];" for i in range(g.taps)],
             # Read once into a local: inside the row loop GCC cannot tell the bias from the output row.
             f"const float bias_c = {f'{b}[c]' if b else '0.0f'};",
             f"float *yo = {offset(y, Ix.of('t') * g.out_size)};",
             depth_loop(g),
             f"for (size_t oh = 0; oh < {OH}; oh++) {{",
             "  " + window_rows(g),
             f"  const size_t rs = {(Ix.of('od') * OH + 'oh') * OW}; (void)rs;",
             "  float *restrict yr = yo + rs;"]
    for kd in range(g.k[0]):
        for kh in range(g.k[1]):
            dd, hh = f"d0 + {kd * g.d[0]}", f"h0 + {kh * g.d[1]}"
            lines.append(f"  const float *restrict r{kd * g.k[1] + kh} = {dd} >= 0 && {dd} < {ID} && {hh} >= 0 "
                         f"&& {hh} < {IH} ? xc + ((size_t)({dd}) * {IH} + (size_t)({hh})) * {IW} : {fn}_zrow;")
    if len(edges) * g.taps <= _EDGE_UNROLL:
        for ow in edges:
            lines += [f"  {{ const size_t ow = {ow}; float v = bias_c;",
                      *(f"    {acc(f'w{j * g.k[2] + kw}', f'r{j}[{col}]')}" for j in range(kr) for kw, col in cols(ow)),
                      *store("    "), "  }"]
    else:
        lines += ["  const float *restrict rp[] = {" + ", ".join(f"r{j}" for j in range(kr)) + "};",
                  f"  for (size_t ow = 0; ow < {OW}; ow++) {{",
                  f"    if (ow == {owa}) ow = {owb};",
                  f"    if (ow >= {OW}) break;",
                  "    float v = bias_c;",
                  f"    for (size_t j = 0; j < {kr}; j++)",
                  f"      for (size_t kw = 0; kw < {g.k[2]}; kw++) {{",
                  f"        const ptrdiff_t iw = (ptrdiff_t)(ow * {g.s[2]} + kw * {g.d[2]}) - {g.pb[2]};",
                  f"        if (iw >= 0 && iw < {IW}) {acc(f'wc[j * {g.k[2]} + kw]', 'rp[j][iw]')}",
                  "      }",
                  *store("    "), "  }"]
    taps = [f"    {acc(f'w{j * g.k[2] + kw}', f'r{j}[ow * {g.s[2]} + ({kw * g.d[2] - g.pb[2]})]')}"
            for j in range(kr) for kw in range(g.k[2])]
    lanes = target.isa.lanes
    if owb - owa >= lanes:
        # Blocks of one vector of columns, the last one moved back to overlap the one before: a plain
        # loop over 110 or 54 columns left the vectorizer a scalar remainder of 6 columns per row.
        # Columns computed twice get the same value (the inputs never alias the output).
        lines += ["  " + UNROLL,
                  f"  for (size_t ob = {owa}; ob < {owb}; ob += {lanes}) {{",
                  f"    const size_t o0 = ob + {lanes} <= {owb} ? ob : {owb - lanes};",
                  "    AOTC_IVDEP",
                  f"    for (size_t k = 0; k < {lanes}; k++) {{",
                  "    const size_t ow = o0 + k;",
                  "    float v = bias_c;", *taps, *store("    "), "  }", "  }", "}"]
    else:
        lines += ["  " + UNROLL, f"  for (size_t ow = {owa}; ow < {owb}; ow++) {{",
                  "    float v = bias_c;", *taps, *store("    "), "  }", "}"]
    zrow = f"static const float {fn}_zrow[{IW}] = {{0}};\n"
    return zrow, task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))
