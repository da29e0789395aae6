"""ConvTranspose in scatter form."""

from __future__ import annotations

from aotc.ir.graph import Node
from aotc.ops.affine import Ix, offset
from aotc.ops.conv.common import geometry, plane_unit, task_loop


def conv_transpose_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Scatter form: every input element adds ``x * w`` to the outputs its taps reach."""
    g = geometry(node)
    cg, mg = g.c // g.group, g.m // g.group
    x, w, y = ins[0], ins[1], outs[0]
    b = ins[2] if len(ins) > 2 else None
    OD, OH, OW = g.out
    c = Ix.of("c")
    lines = [plane_unit(g),
             f"{ctype} *yo = {offset(y, Ix.of('t') * g.out_size)};",
             f"for (size_t s = 0; s < {g.out_size}; s++) yo[s] = {f'{b}[c]' if b else '0'};",
             f"for (size_t ci = 0; ci < {cg}; ci++) {{",
             f"  const size_t cin = {c // mg * cg + 'ci'};",
             f"  const {ctype} *xc = {offset(x, (Ix.of('n') * g.c + 'cin') * g.in_size)};",
             f"  const {ctype} *wc = {offset(w, (Ix.of('cin') * mg + c % mg) * g.taps)};",
             f"  for (ptrdiff_t kd = 0; kd < {g.k[0]}; kd++)",
             f"  for (ptrdiff_t kh = 0; kh < {g.k[1]}; kh++)",
             f"  for (ptrdiff_t kw = 0; kw < {g.k[2]}; kw++) {{",
             f"    const {ctype} wv = wc[(kd * {g.k[1]} + kh) * {g.k[2]} + kw];",
             f"    for (ptrdiff_t id = 0; id < {g.inp[0]}; id++) {{",
             f"      const ptrdiff_t od = id * {g.s[0]} - {g.pb[0]} + kd * {g.d[0]};",
             f"      if (od < 0 || od >= {OD}) continue;",
             f"      for (ptrdiff_t ih = 0; ih < {g.inp[1]}; ih++) {{",
             f"        const ptrdiff_t oh = ih * {g.s[1]} - {g.pb[1]} + kh * {g.d[1]};",
             f"        if (oh < 0 || oh >= {OH}) continue;",
             f"        for (ptrdiff_t iw = 0; iw < {g.inp[2]}; iw++) {{",
             f"          const ptrdiff_t ow = iw * {g.s[2]} - {g.pb[2]} + kw * {g.d[2]};",
             f"          if (ow >= 0 && ow < {OW}) yo[(od * {OH} + oh) * {OW} + ow] += wv * "
             f"xc[(id * {g.inp[1]} + ih) * {g.inp[2]} + iw];",
             "        }", "      }", "    }", "  }", "}"]
    return task_loop(g.n * g.m, "\n".join("  " + ln for ln in lines))
