"""Writes one fp32 GEMM, planned by ``aotc.ops.gemm_plan``, as C: a static function with every size,
stride and block size a literal, rendered from ``templates/gemm.c.j2`` for the plan's ISA.

The rows left over after the full MR panels use a shorter kernel that covers several column panels per
call (so M=1 still has 12 independent accumulators); a partial last column panel is computed into a
small local tile and merged.  An optional epilogue runs over each group of finished columns while it is
still in cache.

Determinism: every output element is computed the same way whatever tile, kernel shape or task computes
it -- for each K block (fixed per spec) an accumulator starts at zero, takes the block's products in k
order with one FMA each (a multiply and an add for ``generic``), and is then stored (first block) or
added to C.  Tasks split rows or columns, never K, so results are bit-identical for every ``ntasks``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from aotc.isa import ISAS
from aotc.ops.affine import Ix, for_each, offset
from aotc.ops.gemm_plan import GemmPlan, ceil_div, packed_b_shape


def _template_dirs() -> list[str]:
    """Where gemm.c.j2 lives: the repo's templates/ in a checkout, aotc/templates when installed."""
    here = Path(__file__).resolve().parent
    return [str(p) for p in (here.parent / "templates", here.parents[1] / "templates") if p.is_dir()]


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_template_dirs()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_gemm(plan: GemmPlan, fn: str, epilogue: str = "", extra_params: str = "") -> str:
    """C source for ``plan``: the static function ``fn`` plus its static inline helpers.

    The helpers (micro-kernels) are prefixed with ``fn`` so several GEMMs can share one
    translation unit.  ``epilogue`` is a C statement run once per output element after its final value
    is known (reads ``b``, ``i``, ``j``; updates ``float v``); ``extra_params`` is appended verbatim to
    the parameter list so the epilogue can name extra inputs.
    """
    if not fn.isidentifier() or not fn.isascii():
        raise ValueError(f"render_gemm: fn must be a C identifier, got {fn!r}")
    spec = plan.spec
    isa = plan.isa
    mr, nr = isa.mr, isa.nr
    # Rows left after the full MR panels of the last M block: handled by a shorter kernel, which can
    # cover several NR panels at once because it needs fewer accumulators per panel.
    me = spec.m % mr
    # Short panels: a few rows left over (M=64 on avx2 leaves 4, a 4x16 tile of 8 accumulators, barely
    # enough to hide the FMA latency) are instead absorbed by re-cutting the last rows into MR - 1 row
    # panels (64 = 9 x 6 + 2 x 5), whose tiles stay nearly full.  Only where every task sees all M rows
    # as one block (tasks split columns) so the cut is fixed at compile time, and not for A^T packed in
    # MR-row panels, where a panel cannot start mid-panel.
    nshort = mr - me if me and me < mr - 1 else 0
    if nshort and (spec.m > plan.mc or plan.split_m or (plan.pack_a and spec.trans_a)
                   or spec.m < nshort * (mr - 1) + mr):
        nshort = 0
    nfull = (spec.m - nshort * (mr - 1)) // mr
    if nshort:
        me = 0
    np_e = max(1, min(6, isa.acc_budget // (me * isa.nv))) if me else 1
    ne = spec.n % nr
    # A addressing: element (r, p) of a row panel is a[r * ars + p * aks].
    if plan.pack_a:
        ars, aks = (1, mr) if spec.trans_a else (plan.kc, 1)
    else:
        ars, aks = (1, spec.m) if spec.trans_a else (spec.k, 1)
    # B addressing: element (p, lane) of panel q is b[q * bps + p * bks + lane].
    if spec.b_const:
        bps, bks = spec.k * nr, nr
    elif plan.direct_b:
        bps, bks = nr, spec.n
    else:
        bps, bks = plan.kc * nr, nr
    # Micro-kernels to emit, named k{rows}x{panels}[p][h{vectors}] ("p": reads the zero-padded copy of
    # the partial panel in direct-B mode; "h": computes only the first vectors of a panel, enough for a
    # partial last panel of ne columns -- N=10 costs one vector of FMAs per row, not two).
    kernels: dict[str, dict[str, int | str]] = {}

    def kernel(rows: int, np_: int, packed: bool = False, kv: int = isa.nv) -> str:
        name = f"k{rows}x{np_}{'p' if packed else ''}{f'h{kv}' if kv != isa.nv else ''}"
        kbps, kbks = (plan.kc * nr, nr) if packed else (bps, bks)
        kernels[name] = dict(name=name, rows=rows, np=np_, bps=kbps, bks=kbks, kv=kv)
        return name

    kv_part = ceil_div(ne, isa.lanes) if ne else isa.nv
    names = dict(k_main="", k_main_part="", k_edge="", k_edge_group="", k_edge_part="", k_short="",
                 k_short_part="")
    if spec.m >= mr:
        names["k_main"] = kernel(mr, 1)
        if ne:
            names["k_main_part"] = kernel(mr, 1, plan.direct_b, kv_part)
    if nshort:
        names["k_short"] = kernel(mr - 1, 1)
        if ne:
            names["k_short_part"] = kernel(mr - 1, 1, plan.direct_b, kv_part)
    if me:
        names["k_edge"] = kernel(me, 1)
        if np_e > 1:
            names["k_edge_group"] = kernel(me, np_e)
        if ne:
            names["k_edge_part"] = kernel(me, 1, plan.direct_b, kv_part)
    nb_packed = packed_b_shape(spec)
    # Work unit u_ is (batch entry, slab): with one batch entry, u_ is the slab and the batch offsets vanish.
    nslab = ceil_div(spec.m, mr) if plan.split_m else ceil_div(spec.n, nr)
    one = spec.batch == 1
    unit = Ix.of("u_")
    bi = Ix() if one else unit // nslab
    strides = (spec.a_batch_stride, ((nb_packed[1] * nb_packed[2] * nb_packed[3]) if spec.b_batch_stride else 0)
               if spec.b_const else spec.b_batch_stride, spec.c_batch_stride)
    at = [offset(p, Ix() if one else Ix.of("bi_") * st) for p, st in zip("ABC", strides, strict=True)]
    ctx = dict(
        fn=fn, spec=spec, plan=plan, isa=isa, vec=ISAS[spec.isa], mr=mr, nr=nr, lanes=isa.lanes,
        M=spec.m, N=spec.n, K=spec.k, KC=plan.kc, MC=plan.mc, NC=plan.nc,
        me=me, np_e=np_e, ne=ne, ars=ars, aks=aks, bps=bps, nshort=nshort, nfull=nfull,
        kernels=list(kernels.values()), **names,
        mslabs=ceil_div(spec.m, mr), nslabs=ceil_div(spec.n, nr),
        epilogue=epilogue.strip(), extra_params=extra_params,
        bi=bi, s0=unit if one else unit % nslab, a_at=at[0], b_at=at[1], c_at=at[2],
        for_each=for_each,
    )
    return _env().get_template("gemm.c.j2").render(**ctx)
