"""Fused loop kernels on the GPU: elementwise chains and one reduction, the same ``Kernel`` the CPU writes
as a loop nest (``aotc.codegen.loops``), written here as one thread per output element, or one group of
threads per output of a reduction.

Elementwise: a grid-stride loop over the flat output index ``o``, split into the loop indices that the
accesses need (adjacent loops every access walks contiguously are merged first, so same-shaped operands
read ``x[o]``). The intermediates of the chain live in registers: ``reduce_sum(x + y*z)`` reads x, y and
z once and writes one float.

Reduction: work item ``w = o * C + c`` is chunk ``c`` of output ``o`` (``C`` chunks, fixed by the sizes
alone). A group of G threads (a warp, or the whole block for long rows) strides over the chunk, then
combines its G partial results by warp shuffles (and shared memory across warps) in a fixed butterfly
order. With one chunk the group writes the output. With several, each block stores its partial result,
and the block that arrives last for its output (an integer counter in the workspace, zeroed by the run
before the first kernel) combines the C partials in chunk order. No float atomics: the bits depend only
on the sizes, never on scheduling.
"""

from __future__ import annotations

import numpy as np

from aotc.codegen.cuda.common import (
    MAX_BLOCKS,
    THREADS,
    CudaKernel,
    affine,
    ceil_div,
    decompose,
    external,
    index_type,
    params,
)
from aotc.codegen.loops import Emitter, collapse, loop_space
from aotc.ir import dtypes
from aotc.ir.kernel import Kernel
from aotc.ops import OPS
from aotc.ops.common import c_literal, highest, lowest
from aotc.ops.elementwise import math_fn

# A reduction row longer than this gets a whole block per output (else a warp); outputs fewer than
# FEW_OUTPUTS are split into chunks of at least CHUNK elements, at most MAX_CHUNKS chunks in all.
WARP_ROW = 2048
FEW_OUTPUTS = 256
CHUNK = 8192
MAX_CHUNKS = 2048
# A reduction over a non-contiguous axis with at least this many outputs is one thread per output.
COLUMN_OUTPUTS = 4096


def reduction_plan(n_out: int, n_red: int, column: bool = False) -> tuple[int, int, int]:
    """(G threads per work item, C chunks per output, L elements per chunk) of a reduction. ``column``: the
    reduced elements are not contiguous but neighbouring outputs are, so one thread per output (G = 1)
    summing its elements in order reads memory coalesced across the warp, when there are outputs enough."""
    if column and n_out >= COLUMN_OUTPUTS:
        return 1, 1, max(n_red, 1)
    chunks = 1
    if n_out < FEW_OUTPUTS and n_red >= 2 * CHUNK:
        chunks = max(1, min(n_red // CHUNK, MAX_CHUNKS // max(n_out, 1)))
    length = ceil_div(max(n_red, 1), chunks)
    chunks = ceil_div(max(n_red, 1), length)
    group = THREADS if chunks > 1 or n_red > WARP_ROW else 32
    return group, chunks, length


def emit_loop(k: Kernel, fn: str) -> CudaKernel:
    args, names, ptrs = external(k)
    out = k.outputs[0]
    red = k.reduce
    extents, n_kept, out_map, body_map = loop_space(k)
    em = Emitter(k, ptrs, len(extents))
    xv = None
    if red is not None:
        xv = em.value(red.inputs[0], body_map, "body")
        em.reduced_value = "red"
    root = em.value(out, out_map, "epilogue")
    store = em.access(out, ptrs[id(out)], out_map)
    groups = collapse(extents, n_kept, em.accesses)
    kept_groups = [g for g in groups if g[0] < n_kept]
    red_groups = [g for g in groups if g[0] >= n_kept]
    n_out = int(np.prod([extents[d] for d in range(n_kept)]))
    n_red = int(np.prod(extents[n_kept:]))
    idx = index_type(k)

    def ext(g: list[int]) -> int:
        return int(np.prod([extents[d] for d in g]))

    var = {g[-1]: f"i{j}" for j, g in enumerate(kept_groups)} | {g[-1]: f"r{j}" for j, g in enumerate(red_groups)}
    kept_decl = decompose("o", [ext(g) for g in kept_groups], [var[g[-1]] for g in kept_groups], idx)
    body = em.render("body", lambda a: affine(a, var))
    epilogue = em.render("epilogue", lambda a: affine(a, var))
    out_store = f"{affine(em.accesses[store], var)} = {dtypes.store(out.dtype, root)};"
    head = f"__global__ void __launch_bounds__({THREADS}) {fn}({', '.join(params(args, names))})"

    if red is None:
        lines = [f"{head} {{",
                 f"  for ({idx} o = ({idx})blockIdx.x * {THREADS} + threadIdx.x; o < {n_out}; "
                 f"o += ({idx})gridDim.x * {THREADS}) {{",
                 *("    " + s for s in kept_decl + epilogue), "    " + out_store, "  }", "}"]
        blocks = min(ceil_div(n_out, THREADS), MAX_BLOCKS)
        return CudaKernel(fn, "\n".join(lines) + "\n", args, str(blocks))

    assert xv is not None
    rule = OPS[red.op].reduction
    assert rule is not None
    rtype = dtypes.compute_type(red.outputs[0].dtype)
    fmt = {"lowest": lowest(rtype), "highest": highest(rtype), "sqrt": math_fn("sqrt", rtype),
           "log": math_fn("log", rtype), "exp": math_fn("exp", rtype)}
    init = rule.init.format(**fmt)
    post = rule.post.format(acc="acc", n=c_literal(max(n_red, 1), rtype), **fmt)
    # A column reduction: every access walks the innermost kept loop contiguously (or not at all) and the
    # innermost reduced loop not contiguously (e.g. ReduceMean over the channels of an NCHW tensor).
    inner_kept = kept_groups[-1][-1] if kept_groups else None
    inner_red = red_groups[-1][-1] if red_groups else None
    column = inner_kept is not None and inner_red is not None \
        and all(a.coeffs[inner_kept] in (0, 1) for a in em.accesses) \
        and any(a.coeffs[inner_kept] == 1 for a in em.accesses) and all(a.coeffs[inner_red] != 1 for a in em.accesses)
    group, chunks, length = reduction_plan(n_out, n_red, column)
    items = n_out * chunks
    per_block = THREADS // group
    red_decl = decompose("r", [ext(g) for g in red_groups], [var[g[-1]] for g in red_groups], idx)

    def combine(a: str, b: str) -> str:
        return rule.combine.format(a=a, b=b)

    def group_reduce(indent: str) -> list[str]:
        """acc of every thread of the group -> the group's result in acc (in every lane of warp 0)."""
        if group == 1:
            return []
        res = [f"for (int m = 16; m >= 1; m /= 2) {{ const {rtype} other = aotc_shfl_xor(acc, m); "
               f"acc = {combine('acc', 'other')}; }}"]
        if group > 32:
            res += ["if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;",
                    "__syncthreads();",
                    f"acc = threadIdx.x < {group // 32} ? warps[threadIdx.x] : {init};",
                    f"for (int m = {group // 64}; m >= 1; m /= 2) {{ const {rtype} other = aotc_shfl_xor(acc, m); "
                    f"acc = {combine('acc', 'other')}; }}"]
        return [indent + s for s in res]

    def finish(indent: str) -> list[str]:
        return [indent + s for s in [f"const {rtype} red = {dtypes.round_to(red.outputs[0].dtype, post)};",
                                     *epilogue, out_store]]

    lines = [f"{head} {{" if chunks == 1 else
             f"{head[:-1]}, {rtype} *__restrict__ part, unsigned *__restrict__ arrived) {{",
             f"  const {idx} w = ({idx})blockIdx.x * {per_block} + threadIdx.x / {group};",
             f"  const unsigned lane = threadIdx.x % {group};",
             f"  if (w >= {items}) return; /* whole groups leave: no group waits for another */",
             *([f"  __shared__ {rtype} warps[{group // 32}];"] if group > 32 else []),
             f"  const {idx} o = w / {chunks}, c = w % {chunks}; (void)o; (void)c;",
             *("  " + s for s in kept_decl),
             f"  const {idx} rlo = c * {length}, rhi = " + (f"rlo + {length} < {n_red} ? rlo + {length} : {n_red};"
                                                          if n_red else "0; (void)rlo;"),
             f"  {rtype} acc = {init};",
             *([f"  for ({idx} r = rlo + lane; r < rhi; r += {group}) {{",
                *("    " + s for s in red_decl + body),
                f"    acc = {combine('acc', rule.pre.format(x=xv, **fmt))};",
                "  }"] if n_red else ["  (void)lane; (void)rhi; /* an empty reduction is its initial value */"]),
             *group_reduce("  ")]
    if chunks == 1:
        lines += ["  if (lane == 0) {", *finish("    "), "  }", "}"]
    else:
        lines += ["  __shared__ bool last;",
                  "  if (threadIdx.x == 0) {",
                  "    part[w] = acc;",
                  "    __threadfence(); /* the partial is visible to every block before the count says so */",
                  f"    last = atomicAdd(&arrived[o], 1u) == {chunks - 1};",
                  "  }",
                  "  __syncthreads();",
                  "  if (!last) return;",
                  "  __threadfence();",
                  f"  acc = {init};",
                  f"  for (unsigned j = threadIdx.x; j < {chunks}; j += {THREADS}) {{ const {rtype} p = "
                  f"__ldcg(&part[o * {chunks} + j]); acc = {combine('acc', 'p')}; }}",
                  "  __syncthreads(); /* warps[] is reused */",
                  *group_reduce("  "),
                  "  if (threadIdx.x == 0) {",
                  "    arrived[o] = 0; /* ready for the next run */",
                  *finish("    "), "  }", "}"]
    code = "\n".join(lines) + "\n"
    kernel = CudaKernel(fn, code, args, str(ceil_div(items, per_block)))
    if chunks > 1:
        kernel.counters = n_out
        kernel.partials = items * 8  # no compute type is wider
    return kernel
