"""Writing fused loop kernels (elementwise, views, one reduction) as C loop nests.

Every value in a kernel is computed from an *index map*: for each of its dimensions, which loop it
follows, with what scale and offset (see ``aotc.ops.shape.IndexMap``). Broadcasts, transposes and
slices only change index maps, so fusing them costs nothing; a value read from memory becomes an
affine address ``base + sum(coeff_l * i_l)``. Once all addresses are known, adjacent loops that every
address walks contiguously are merged, so an elementwise kernel over same-shaped tensors becomes one
flat, vectorizable loop.

Reductions accumulate into LANES independent partial results (combined pairwise at the end): the
compiler vectorizes that without -ffast-math, and the result does not depend on the target ISA.

A reduction with too few outputs to feed the threads (a full reduction has one) is split into
chunks of its outermost reduced loop, their number fixed by the sizes alone (the kernel's plan,
aotc/passes/schedule.py): tasks take chunks and
write each one's partial result to a workspace buffer (``scratch`` in the kernel), then a second
function, run once after all tasks, combines each output's partials in chunk order. The bits never
depend on the thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Value
from aotc.ir.kernel import Kernel
from aotc.ops import OPS
from aotc.ops.affine import Ix, task_share
from aotc.ops.common import c_literal, contiguous_strides, highest, lowest
from aotc.ops.elementwise import math_fn
from aotc.ops.reduce import reduce_axes
from aotc.ops.shape import IndexMap, broadcast_view

LANES = 16


@dataclass
class Access:
    ptr: str
    base: int
    coeffs: list[int]


class Emitter:
    """Emits a kernel's values as SSA temps; memory reads are @N@ placeholders into ``accesses``."""

    def __init__(self, kernel: Kernel, ptrs: dict[int, str], nloops: int) -> None:
        self.inside = {id(n) for n in kernel.nodes}
        self.kernel = kernel
        self.ptrs = ptrs
        self.nloops = nloops
        self.accesses: list[Access] = []
        self.sections: dict[str, list[str]] = {"body": [], "epilogue": []}
        self.memo: dict[tuple, str] = {}
        self.reduced_value: str | None = None
        self.ntemps = 0

    def access(self, v: Value, ptr: str, imap: IndexMap) -> int:
        coeffs = [0] * self.nloops
        base = 0
        for stride, (loop, scale, off) in zip(contiguous_strides(v.shape), imap, strict=True):
            base += stride * off
            if loop >= 0:
                coeffs[loop] += stride * scale
        self.accesses.append(Access(ptr, base, coeffs))
        return len(self.accesses) - 1

    def render(self, section: str, addr: Callable[[Access], str]) -> list[str]:
        """The section's statements with every @N@ placeholder replaced by ``addr(accesses[N])``."""
        res = []
        for line in self.sections[section]:
            parts = line.split("@")
            res.append("".join(addr(self.accesses[int(p)]) if i % 2 else p for i, p in enumerate(parts)))
        return res

    def value(self, v: Value, imap: IndexMap, section: str) -> str:
        key = (id(v), imap, section)
        if key in self.memo:
            return self.memo[key]
        ctype = dtypes.compute_type(v.dtype)  # emulated types compute in float / int32_t
        p = v.producer
        if v.is_const and v.size == 1:
            res = c_literal(v.const.reshape(-1)[0].item(), ctype)
            self.memo[key] = res
            return res
        if p is not None and not v.is_const and id(p) in self.inside:
            op = OPS[p.op]
            if p is self.kernel.reduce:
                assert self.reduced_value is not None
                return self.reduced_value
            if op.kind == "view":
                res = self.value(p.inputs[0], op.view(p, imap), section)
                self.memo[key] = res
                return res
            assert op.kind == "elementwise" and op.expr is not None, p.op
            args = [self.value(x, broadcast_view(x.shape, v.shape, imap), section) if x is not None else "0"
                    for x in p.inputs]
            expr = dtypes.round_to(v.dtype, op.expr(p, args, ctype))
        else:
            expr = dtypes.load(v.dtype, f"@{self.access(v, self.ptrs[id(v)], imap)}@")
        name = f"t{self.ntemps}"
        self.ntemps += 1
        self.sections[section].append(f"const {ctype} {name} = {expr};")
        self.memo[key] = name
        return name


def identity_map(rank: int) -> IndexMap:
    return tuple((d, 1, 0) for d in range(rank))


def loop_space(k: Kernel) -> tuple[list[int], int, IndexMap, IndexMap]:
    """The loops of a loop kernel: their extents (a reduction's kept axes, then its reduced ones), how
    many of them are kept, the output's index map and the reduced input's (identity without reduction)."""
    red = k.reduce
    if red is None:
        rank = len(k.outputs[0].shape)
        return list(k.outputs[0].shape), rank, identity_map(rank), identity_map(rank)
    x = red.inputs[0]
    axes = reduce_axes(red)
    kept = [d for d in range(len(x.shape)) if d not in axes]
    order = kept + axes
    body_map = tuple((order.index(d), 1, 0) for d in range(len(x.shape)))
    if red.attr("keepdims", 1):
        out_map = tuple((-1, 0, 0) if d in axes else (order.index(d), 1, 0) for d in range(len(x.shape)))
    else:
        out_map = tuple((j, 1, 0) for j in range(len(kept)))
    return [x.shape[d] for d in order], len(kept), out_map, body_map


def emit_loop_kernel(k: Kernel, ptrs: dict[int, str]) -> tuple[str, str | None]:
    """C statements for the kernel body (``ptrs`` names the pointer of every value in memory) and,
    for a reduction split into chunks, those of the second phase that combines the chunks."""
    out = k.outputs[0]
    if out.size == 0:  # loops of no trips would only draw compiler warnings
        return "/* no elements: nothing to read or write */", None
    red = k.reduce
    extents, n_kept, out_map, body_map = loop_space(k)
    em = Emitter(k, ptrs, len(extents))
    rule = red and OPS[red.op].reduction
    if red is not None:
        assert rule is not None
        rtype = dtypes.compute_type(red.outputs[0].dtype)
        xv = em.value(red.inputs[0], body_map, "body")
        em.reduced_value = "red"
    root_val = em.value(out, out_map, "epilogue")
    store = em.access(out, ptrs[id(out)], out_map)

    # Merge loops that every access walks contiguously; drop loops of extent 1.
    groups = collapse(extents, n_kept, em.accesses)
    kept_groups = [g for g in groups if g[0] < n_kept]
    red_groups = [g for g in groups if g[0] >= n_kept]
    var: dict[int, str] = {}
    for j, g in enumerate(kept_groups):
        var[g[-1]] = f"i{j}"
    for j, g in enumerate(red_groups):
        var[g[-1]] = f"r{j}"

    def ext(g: list[int]) -> int:
        return int(np.prod([extents[x] for x in g]))

    def addr(a: Access) -> str:
        terms = [str(a.base)] if a.base else []
        for g in groups:
            c = a.coeffs[g[-1]]
            if c:
                terms.append(var[g[-1]] if c == 1 else f"{c} * {var[g[-1]]}")
        return f"{a.ptr}[{' + '.join(terms) or '0'}]"

    body, epilogue = em.render("body", addr), em.render("epilogue", addr)
    code: list[str] = []
    indent = ""

    def open_loop(name: str, lo: str, hi: str, pragma: bool = False) -> None:
        nonlocal indent
        if pragma:
            code.append(indent + "AOTC_IVDEP")
        code.append(f"{indent}for (size_t {name} = {lo}; {name} < {hi}; {name}++) {{")
        indent += "  "

    def close_loops(to: str = "") -> None:
        nonlocal indent
        while len(indent) > len(to):
            indent = indent[:-2]
            code.append(indent + "}")

    def store_output() -> None:
        code.extend(indent + s for s in epilogue)
        code.append(f"{indent}{addr(em.accesses[store])} = {dtypes.store(out.dtype, root_val)};")
        close_loops()

    def kept_from(flat: Ix | str) -> None:
        """Declares the kept loop variables of output number ``flat`` (C with no operator looser than /)."""
        inner = 1
        for g in reversed(kept_groups):
            v = var[g[-1]]
            code.append(f"{indent}const size_t {v} = {Ix.of(flat) // inner % ext(g)}; (void){v};")
            inner *= ext(g)

    def open_kept() -> None:
        """Loops over this task's share of the kept (output) loops; all on task 0 if there are none."""
        nonlocal indent
        if kept_groups:
            e0 = ext(kept_groups[0])
            lo, hi = task_share(e0)
            code.append(f"const size_t lo = {lo}, hi = {hi};")
            for j, g in enumerate(kept_groups):
                pragma = j == len(kept_groups) - 1 and red is None
                open_loop(var[g[-1]], "lo" if j == 0 else "0", "hi" if j == 0 else str(ext(g)), pragma=pragma)
        else:
            code.append("if (task != 0) return;")
            code.append("{")
            indent = "  "

    if red is None:
        open_kept()
        store_output()
        return "\n".join(code), None

    assert rule is not None
    fmt = {"lowest": lowest(rtype), "highest": highest(rtype), "sqrt": math_fn("sqrt", rtype),
           "log": math_fn("log", rtype), "exp": math_fn("exp", rtype)}
    init = rule.init.format(**fmt)
    n_red = int(np.prod([extents[d] for d in range(n_kept, len(extents))]))
    pre_r = rule.pre.format(x=xv, **fmt)
    lanes = LANES if red_groups and ext(red_groups[-1]) >= LANES else 1

    def combine(a: str, b: str) -> str:
        return rule.combine.format(a=a, b=b)

    def result(acc: str) -> str:
        # The mean of an empty set (ONNX: undefined) is 0, as onnxruntime gives, not 0 / 0.
        post = rule.post.format(acc=acc, n=c_literal(max(n_red, 1), rtype), **fmt)
        return f"const {rtype} red = {dtypes.round_to(red.outputs[0].dtype, post)};"

    def accumulate(lo: str, hi: str) -> None:
        """Reduces into acc[0], the outermost reduced loop running from ``lo`` to ``hi``."""
        nonlocal indent
        code.append(f"{indent}{rtype} acc[{lanes}];")
        code.append(f"{indent}acc[0] = {init};" if lanes == 1 else
                    f"{indent}for (size_t l = 0; l < {lanes}; l++) acc[l] = {init};")
        if n_red == 0:  # an empty reduction is its initial value (one lane: no loop has LANES trips)
            return
        outer_indent = indent
        for j, g in enumerate(red_groups[:-1]):
            open_loop(var[g[-1]], lo if j == 0 else "0", hi if j == 0 else str(ext(g)))
        inner = [indent + "  " + s for s in body]
        if red_groups:
            rv = var[red_groups[-1][-1]]
            start, e = (lo, hi) if len(red_groups) == 1 else ("0", str(ext(red_groups[-1])))
            if lanes > 1:
                code.append(f"{indent}size_t {rv}b = {start};")
                code.append(f"{indent}for (; {rv}b + {lanes} <= {e}; {rv}b += {lanes}) {{")
                code.append(f"{indent}  for (size_t l = 0; l < {lanes}; l++) {{")
                code.append(f"{indent}    const size_t {rv} = {rv}b + l;")
                code.extend("  " + s for s in inner)
                code.append(f"{indent}    acc[l] = {combine('acc[l]', pre_r)};")
                code.append(f"{indent}  }}")
                code.append(f"{indent}}}")
                code.append(f"{indent}for (; {rv}b < {e}; {rv}b++) {{")
            else:
                code.append(f"{indent}for (size_t {rv}b = {start}; {rv}b < {e}; {rv}b++) {{")
            code.append(f"{indent}  const size_t {rv} = {rv}b;")
            code.extend(inner)
            code.append(f"{indent}  acc[0] = {combine('acc[0]', pre_r)};")
            code.append(f"{indent}}}")
        else:
            code.extend(indent + s for s in body)
            code.append(f"{indent}acc[0] = {combine('acc[0]', pre_r)};")
        close_loops(outer_indent)
        w = lanes // 2
        while w >= 1:
            code.append(f"{indent}for (size_t l = 0; l < {w}; l++) acc[l] = {combine('acc[l]', f'acc[l + {w}]')};")
            w //= 2

    assert k.plan is not None
    chunks = k.plan.chunks
    if chunks == 1:
        open_kept()
        accumulate("0", str(ext(red_groups[0])) if red_groups else "1")
        code.append(indent + result("acc[0]"))
        store_output()
        return "\n".join(code), None

    # Chunk c of output o is work item w = o * chunks + c; its partial result goes to part[w].
    n_out = red.outputs[0].size
    e0 = ext(red_groups[0])
    step = -(-e0 // chunks)
    if len(red_groups) == 1:  # chunks start on whole lane groups
        step = -(-step // lanes) * lanes
    chunks = -(-e0 // step)
    assert chunks <= k.plan.chunks, "the schedule sized the partials for plan.chunks"
    total = n_out * chunks
    lo, hi = task_share(total)
    code.append(f"const size_t lo = {lo}, hi = {hi};")
    code.append(f"{rtype} *restrict part = ({rtype} *)scratch;")
    open_loop("w", "lo", "hi")
    kept_from(Ix.of("w") // chunks)
    code.append(f"{indent}const size_t rlo = {step} * (w % {chunks}), "
                f"rhi = (rlo + {step} < {e0}) ? rlo + {step} : {e0};")
    accumulate("rlo", "rhi")
    code.append(f"{indent}part[w] = acc[0];")
    close_loops()
    partials = "\n".join(code)

    code = [f"const {rtype} *restrict part = (const {rtype} *)scratch;"]
    open_loop("o", "0", str(n_out))
    kept_from("o")
    code.append(f"{indent}{rtype} acc = part[o * {chunks}];")
    code.append(f"{indent}for (size_t c = 1; c < {chunks}; c++) acc = {combine('acc', f'part[o * {chunks} + c]')};")
    code.append(indent + result("acc"))
    store_output()
    return partials, "\n".join(code)


def collapse(extents: list[int], n_kept: int, accesses: list[Access]) -> list[list[int]]:
    """Runs of adjacent loops (kept and reduced never mixed) that every access walks as one loop; loops of
    extent 1 are left out. The run's last loop carries the index (its coefficient is the run's stride)."""
    groups: list[list[int]] = []
    for d in (d for d, e in enumerate(extents) if e != 1):
        if groups:
            prev = groups[-1][-1]
            if (prev < n_kept) == (d < n_kept) and all(a.coeffs[prev] == a.coeffs[d] * extents[d] for a in accesses):
                groups[-1].append(d)
                continue
        groups.append([d])
    return groups
