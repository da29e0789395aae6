"""MaxPool, AveragePool, LpPool and the global pools. MaxPool and AveragePool are separable (rows
reduced into a padded row buffer, then along it); LpPool, the Indices output and the global pools
use a bounds-checked loop."""

from __future__ import annotations

from aotc.ir.graph import Node
from aotc.ops.affine import Ix, offset
from aotc.ops.common import lowest
from aotc.ops.conv.common import Geometry, depth_loop, geometry, signed_start, task_loop, window_rows

# The separable path keeps its row buffer and the window's row pointers on the stack, unrolls the
# column taps and counts each column's taps at compile time: a pool past these bounds takes the
# bounds-checked loop, whose code and compile time do not grow with its shape (a 2^32+3 wide input
# hung the compile; a 2^62 kernel ran out of memory or made an array larger than any object).
_SEPARABLE_MAX_ROW = 1 << 14
_SEPARABLE_MAX_ROWS = 1 << 12
_SEPARABLE_MAX_COLS = 1 << 8


def _row_buffer(g: Geometry) -> int:
    """Length of the separable path's padded row buffer."""
    return max(g.pb[2] + g.inp[2], (g.out[2] - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1)


def _separable_fits(g: Geometry) -> bool:
    return (_row_buffer(g) <= _SEPARABLE_MAX_ROW and g.k[0] * g.k[1] <= _SEPARABLE_MAX_ROWS
            and g.k[2] <= _SEPARABLE_MAX_COLS)


def _pool_separable(node: Node, g: Geometry, x: str, y: str, ctype: str) -> str:
    """MaxPool/AveragePool as two vectorizable passes per output row: the window's valid input rows
    are reduced into a row buffer whose padding holds the identity (-inf or 0), then each output
    reduces its taps along that buffer -- no bounds checks in either loop. Average divisors are the
    products of per-row and per-column tap counts (inside the input, or the padded input with
    count_include_pad, as onnxruntime counts them)."""
    is_max = node.op == "MaxPool"
    include_pad = bool(node.attr("count_include_pad", 0))
    ID, IH, IW = g.inp
    OD, OH, OW = g.out
    pb = g.pb[2]
    blen = _row_buffer(g)
    ident = lowest(ctype) if is_max else "0"
    count_pad = include_pad and not is_max  # the divisor counts the window's rows in the padding

    def red(a: str, b: str) -> str:  # the max form compilers turn into vmaxps (NaN order aside)
        return f"{a} = {b} > {a} ? {b} : {a};" if is_max else f"{a} += {b};"

    kd = Ix.of("kd") if g.k[0] > 1 else Ix()
    lines = [f"const {ctype} *xc = {x} + t * {g.in_size};",
             f"{ctype} vb[{blen}];",
             *([f"for (size_t i = 0; i < {pb}; i++) vb[i] = {ident};"] if pb > 1 else []),
             *([f"vb[0] = {ident};"] if pb == 1 else []),
             *([f"for (size_t i = {pb + IW}; i < {blen}; i++) vb[i] = {ident};"] if blen > pb + IW else []),
             depth_loop(g),
             f"for (size_t oh = 0; oh < {OH}; oh++) {{",
             "  " + window_rows(g),
             f"  const {ctype} *rows[{g.k[0] * g.k[1]}];",
             f"  size_t nr = 0{', nrp = 0' if count_pad else ''};",
             *([f"  for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++)"] if g.k[0] > 1 else []),
             f"    for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++) {{",
             f"      const ptrdiff_t id = {Ix.of('d0') + kd * g.d[0]}, ih = {Ix.of('h0') + Ix.of('kh') * g.d[1]};",
             *([f"      nrp += id < {ID + g.pe[0]} && ih < {IH + g.pe[1]};"] if count_pad else []),
             f"      if (id >= 0 && id < {ID} && ih >= 0 && ih < {IH}) rows[nr++] = xc + (id * {IH} + ih) * {IW};",
             "    }",
             f"  {ctype} *restrict yr = {offset(y, Ix.of('t') * g.out_size + (Ix.of('od') * OH + 'oh') * OW)};",
             f"  if (nr == 0) {{ for (size_t ow = 0; ow < {OW}; ow++) yr[ow] = "
             f"{ident if is_max else '(' + ctype + ')NAN'}; continue; }}",
             "  { const " + ctype + " *restrict r0 = rows[0];",
             f"    for (size_t i = 0; i < {IW}; i++) vb[{pb} + i] = r0[i]; }}",
             "  for (size_t r = 1; r < nr; r++) {",
             f"    const {ctype} *restrict rr = rows[r];",
             f"    for (size_t i = 0; i < {IW}; i++) {{ const {ctype} xv = rr[i]; {red(f'vb[{pb} + i]', 'xv')} }}",
             "  }"]
    if not is_max:  # per-column tap counts, as a table of compile-time constants
        cols = []
        for ow in range(OW):
            start = ow * g.s[2] - pb
            lim = IW + g.pe[2] if include_pad else IW
            cols.append(sum(1 for kw in range(g.k[2]) if 0 <= start + kw * g.d[2] < lim)
                        if not include_pad else sum(1 for kw in range(g.k[2]) if start + kw * g.d[2] < lim))
        lines += [f"  static const {ctype} hc[{OW}] = {{{', '.join(str(c) for c in cols)}}};",
                  f"  const {ctype} vc = ({ctype}){'nrp' if count_pad else 'nr'};"]
    lines += [f"  for (size_t ow = 0; ow < {OW}; ow++) {{",
              f"    const {ctype} *restrict w = {offset('vb', Ix.of('ow') * g.s[2])};",
              f"    {ctype} v = w[0];"]
    lines += [f"    {{ const {ctype} xv = w[{kw * g.d[2]}]; {red('v', 'xv')} }}" for kw in range(1, g.k[2])]
    if not is_max:
        lines.append("    v = v / (vc * hc[ow]);")
    lines += ["    yr[ow] = v;", "  }", "}"]
    return task_loop(g.n * g.c, "\n".join("  " + ln for ln in lines))


def _max_step(ctype: str) -> str:
    """The statement that takes ``xv`` into the maximum ``acc`` at flat index ``i``: NaN propagates
    and the first maximum's index wins."""
    if ctype in ("float", "double"):
        return "if (xv > acc || (xv != xv && acc == acc)) { acc = xv; arg = i; }"
    return "if (xv > acc) { acc = xv; arg = i; }"


def _pool_global(node: Node, g: Geometry, x: str, y: str, ctype: str) -> str:
    """GlobalAveragePool and GlobalMaxPool: one reduction over each (n, c) plane."""
    is_max = node.op == "GlobalMaxPool"
    step = _max_step(ctype).replace(" arg = i;", "") if is_max else "acc += xv;"
    lines = [f"const {ctype} *restrict xc = {offset(x, Ix.of('t') * g.in_size)};",
             f"{ctype} acc = {lowest(ctype) if is_max else '0'};",
             f"for (size_t i = 0; i < {g.in_size}; i++) {{ const {ctype} xv = xc[i]; {step} }}",
             f"{y}[t] = {'acc' if is_max else f'acc / ({ctype}){g.in_size}'};"]
    return task_loop(g.n * g.c, "\n".join("  " + ln for ln in lines))


def _upto(v: str, lim: int, k: int, d: int) -> str:
    """C expression: how many of the taps ``v + q * d``, q in [0, k), lie below ``lim`` (> ``v``)."""
    n = f"{lim} - {v}" if d == 1 else f"({lim} - {v} + {d - 1}) / {d}"
    return f"({k} < {n} ? {k} : {n})"


def pool_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Max/average/Lp pooling over each window, bounds-checked; one (n, c) plane per work unit."""
    g = geometry(node)
    op = node.op
    x, y = ins[0], outs[0]
    ID, IH, IW = g.inp
    OD, OH, OW = g.out
    is_max = op in ("MaxPool", "GlobalMaxPool")
    p = int(node.attr("p", 2))
    include_pad = bool(node.attr("count_include_pad", 0))
    if op in ("MaxPool", "AveragePool") and len(outs) == 1 and _separable_fits(g):
        return _pool_separable(node, g, x, y, ctype)
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        return _pool_global(node, g, x, y, ctype)
    lines = [f"const {ctype} *xc = {x} + t * {g.in_size};",
             depth_loop(g),
             f"for (size_t oh = 0; oh < {OH}; oh++) {{",
             "  " + window_rows(g),
             f"  {ctype} *restrict yr = {y} + t * {g.out_size} + (od * {OH} + oh) * {OW};",
             f"  for (size_t ow = 0; ow < {OW}; ow++) {{",
             f"  const ptrdiff_t w0 = {signed_start('ow', g.s[2], g.pb[2])};",
             f"  {ctype} acc = {lowest(ctype) if is_max else '0'};",
             "  size_t cnt = 0, arg = 0; (void)arg; (void)cnt;"]
    if op == "AveragePool" and include_pad:
        # The window counts taps inside the padded input (onnxruntime's divisor).
        lim = [g.inp[i] + g.pe[i] for i in range(3)]
        lines.append("  size_t cntp = 1;")
        for i, (v, k) in enumerate((("d0", g.k[0]), ("h0", g.k[1]), ("w0", g.k[2]))):
            lines.append(f"  cntp *= {v} < {lim[i]} ? {_upto(v, lim[i], k, g.d[i])} : 0;")
    # Each window loop runs over the taps inside the input only: a kernel far larger than the input
    # (kernel_shape 2^62 with auto_pad) must not loop over its padding.
    for v, q, i in (("d0", "kd", 0), ("h0", "kh", 1), ("w0", "kw", 2)):
        first = f"-{v}" if g.d[i] == 1 else f"(-{v} + {g.d[i] - 1}) / {g.d[i]}"
        lines.append(f"  const ptrdiff_t {q}0 = {v} < 0 ? {first} : 0, "
                     f"{q}1 = {v} < {g.inp[i]} ? {_upto(v, g.inp[i], g.k[i], g.d[i])} : 0;")
    lines += ["  for (ptrdiff_t kd = kd0; kd < kd1; kd++) {",
              f"    const ptrdiff_t id = {Ix.of('d0') + Ix.of('kd') * g.d[0]}; if (id < 0 || id >= {ID}) continue;",
              "    for (ptrdiff_t kh = kh0; kh < kh1; kh++) {",
              f"      const ptrdiff_t ih = {Ix.of('h0') + Ix.of('kh') * g.d[1]}; if (ih < 0 || ih >= {IH}) continue;",
              "      for (ptrdiff_t kw = kw0; kw < kw1; kw++) {",
              f"        const ptrdiff_t iw = {Ix.of('w0') + Ix.of('kw') * g.d[2]}; if (iw < 0 || iw >= {IW}) continue;",
              f"        const size_t i = (id * {IH} + ih) * {IW} + iw;",
              f"        const {ctype} xv = xc[i];"]
    if is_max:  # NaN propagates; the first maximum's index wins
        lines.append("        " + _max_step(ctype))
    elif op == "LpPool":
        lines.append("        acc += fabs(xv) * fabs(xv);" if p == 2 else
                     f"        acc += pow(fabs(xv), {p});")
    else:
        lines.append("        acc += xv; cnt++;")
    lines += ["      }", "    }", "  }"]
    if op in ("AveragePool", "GlobalAveragePool"):
        div = "cntp" if op == "AveragePool" and include_pad else ("cnt" if op == "AveragePool" else
                                                                   str(g.in_size))
        lines.append(f"  acc = acc / ({ctype}){div};")
    elif op == "LpPool":
        lines.append("  acc = sqrt(acc);" if p == 2 else f"  acc = pow(acc, 1.0 / {p});")
    lines.append("  yr[ow] = acc;")
    if len(outs) > 1:  # Indices: flat over (n, c, spatial); storage_order 1 numbers columns first
        if node.attr("storage_order", 0):
            lines.append(f"  const size_t ad = arg / {IH * IW}, ah = arg / {IW} % {IH}, aw = arg % {IW};")
            lines.append(f"  arg = (aw * {IH} + ah) * {ID} + ad;")
        lines.append(f"  {outs[1]}[t * {g.out_size} + (od * {OH} + oh) * {OW} + ow] = "
                     f"(int64_t)(t * {g.in_size} + arg);")
    lines.append("  }")
    lines.append("}")
    return task_loop(g.n * g.c, "\n".join("  " + ln for ln in lines))
