"""Data-movement kernels on the GPU: Concat, Split, Pad, Tile and Gather, one thread per output element,
each writing ``out[o] = in[source(o)]`` where ``source`` is the op's index map, spelled per dimension.

Gather reads its indices at run time: an index outside -n..n-1 writes 0 and sets the run's status word in
the workspace to NAME_ERR_INDEX_OUT_OF_RANGE (an atomicExch of an int: the same value from any thread),
which the caller reads once the stream is done (docs/cuda.md).
"""

from __future__ import annotations

import numpy as np

from aotc.codegen.cuda.common import (
    MAX_BLOCKS,
    THREADS,
    CudaKernel,
    Unsupported,
    ceil_div,
    decompose,
    external,
    index_type,
    params,
    strides,
)
from aotc.errors import IndexOutOfRangeError
from aotc.ir import dtypes
from aotc.ir.kernel import Kernel
from aotc.ops.common import const_input, norm_axis
from aotc.ops.index import pad_fill


def _grid_loop(fn: str, args, names, total: int, idx: str, body: list[str], extra: str = "") -> CudaKernel:
    head = ", ".join(params(args, names)) + extra
    lines = [f"__global__ void __launch_bounds__({THREADS}) {fn}({head}) {{",
             f"  for ({idx} o = ({idx})blockIdx.x * {THREADS} + threadIdx.x; o < {total}; "
             f"o += ({idx})gridDim.x * {THREADS}) {{",
             *("    " + s for s in body), "  }", "}"]
    return CudaKernel(fn, "\n".join(lines) + "\n", args, str(min(ceil_div(max(total, 1), THREADS), MAX_BLOCKS)))


def _source(shape: tuple[int, ...], index: list[str]) -> str:
    """The flat offset of the element at per-dimension ``index`` in a contiguous tensor of ``shape``."""
    terms = [f"{s} * {i}" if s != 1 else i for s, i, n in zip(strides(shape), index, shape, strict=True) if n != 1]
    return " + ".join(terms) or "0"


def emit_concat(k: Kernel, fn: str) -> CudaKernel:
    node = k.root
    args, names, ptrs = external(k)
    out = node.outputs[0]
    shape = tuple(out.shape)
    axis = norm_axis(node.attr("axis", 0), len(shape), node)
    idx = index_type(k)
    dims = [f"i{d}" for d in range(len(shape))]
    body = decompose("o", list(shape), dims, idx)
    start, branches = 0, []
    for v in (v for v in node.inputs if v is not None):
        n = v.shape[axis]
        if n == 0:
            continue
        at = list(dims)
        at[axis] = f"(i{axis} - {start})"
        cond = f"i{axis} < {start + n}"
        branches.append((cond, f"{ptrs[id(out)]}[o] = {ptrs[id(v)]}[{_source(tuple(v.shape), at)}];"))
        start += n
    for j, (cond, stmt) in enumerate(branches):  # the last input needs no test
        last = j == len(branches) - 1
        body.append(stmt if len(branches) == 1 else f"else {stmt}" if last else
                    f"{'if' if j == 0 else 'else if'} ({cond}) {stmt}")
    return _grid_loop(fn, args, names, out.size, idx, body)


def emit_split(k: Kernel, fn: str) -> CudaKernel:
    """Every output in one kernel: the flat index runs over the outputs one after another."""
    from aotc.ops.index import _split_sizes

    node = k.root
    args, names, ptrs = external(k)
    x = node.inputs[0]
    axis, sizes = _split_sizes(node)
    idx = index_type(k)
    body, lo, start, first = [], 0, 0, True
    for y, s in zip(node.outputs, sizes, strict=True):
        if y.size == 0 or not y.name:
            start += s
            continue
        dims = [f"i{d}" for d in range(len(y.shape))]
        at = list(dims)
        at[axis] = f"(i{axis} + {start})"
        body += [f"{'if' if first else 'else if'} (o < {lo + y.size}) {{",
                 *("  " + ln for ln in decompose(f"(o - {lo})", list(y.shape), dims, idx)),
                 f"  {ptrs[id(y)]}[o - {lo}] = {ptrs[id(x)]}[{_source(tuple(x.shape), at)}];", "}"]
        lo, start, first = lo + y.size, start + s, False
    return _grid_loop(fn, args, names, lo, idx, body)


def emit_pad(k: Kernel, fn: str) -> CudaKernel:
    from aotc.ops.index import _pads

    node = k.root
    args, names, ptrs = external(k)
    x, out = node.inputs[0], node.outputs[0]
    mode = node.attr("mode", "constant")
    ctype = dtypes.c_type(out.dtype)
    idx = index_type(k)
    dims = [f"i{d}" for d in range(len(out.shape))]
    body = decompose("o", list(out.shape), dims, idx)
    inside = []
    for d, ((b, _), n) in enumerate(zip(_pads(node), x.shape, strict=True)):
        j = f"(long long)i{d} - {b}"
        if mode == "constant" or n == 0:
            inside.append(f"j{d} >= 0 && j{d} < {n}")
            body.append(f"const long long j{d} = {j};")
        elif mode == "edge":
            body.append(f"const long long e{d} = {j}, j{d} = e{d} < 0 ? 0 : e{d} >= {n} ? {n - 1} : e{d};")
        elif mode == "wrap":
            body.append(f"const long long j{d} = (({j}) % {n} + {n}) % {n};")
        elif mode == "reflect":
            if n == 1:
                body.append(f"const long long j{d} = 0;")
            else:
                p = 2 * (n - 1)
                body.append(f"const long long e{d} = {j}, k{d} = (e{d} < 0 ? -e{d} : e{d}) % {p}, "
                            f"j{d} = k{d} >= {n} ? {p} - k{d} : k{d};")
        else:
            raise Unsupported(f"Pad mode {mode!r}")
    v = node.inputs[2] if len(node.inputs) > 2 else None
    fill = pad_fill(node, ctype, ptrs[id(v)] if v is not None and not v.is_const else "")
    src = f"{ptrs[id(x)]}[{_source(tuple(x.shape), [f'j{d}' for d in range(len(x.shape))])}]"
    body.append(f"{ptrs[id(out)]}[o] = " + (f"({' && '.join(inside)}) ? {src} : {fill};" if inside else f"{src};"))
    return _grid_loop(fn, args, names, out.size, idx, body)


def emit_tile(k: Kernel, fn: str) -> CudaKernel:
    node = k.root
    args, names, ptrs = external(k)
    x, out = node.inputs[0], node.outputs[0]
    idx = index_type(k)
    dims = [f"i{d}" for d in range(len(out.shape))]
    at = [f"(i{d} % {n})" if n != m else f"i{d}" for d, (n, m) in enumerate(zip(x.shape, out.shape, strict=True))]
    body = [*decompose("o", list(out.shape), dims, idx),
            f"{ptrs[id(out)]}[o] = {ptrs[id(x)]}[{_source(tuple(x.shape), at)}];"]
    return _grid_loop(fn, args, names, out.size, idx, body)


def emit_gather(k: Kernel, fn: str) -> CudaKernel:
    node = k.root
    args, names, ptrs = external(k)
    x, ind, out = node.inputs[0], node.inputs[1], node.outputs[0]
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    const = const_input(node, 1, "indices") if ind.is_const else None
    n = x.shape[axis]
    if const is not None and ((const < -n) | (const >= n)).any():
        raise Unsupported("a constant index out of range")
    idx = index_type(k)
    outer, m, inner = int(np.prod(x.shape[:axis])), ind.size, int(np.prod(x.shape[axis + 1:]))
    code = IndexOutOfRangeError.code
    body = [*decompose("o", [outer, m, inner], ["a", "p", "c"], idx),
            f"long long j = (long long){ptrs[id(ind)]}[p];",
            f"if (j < 0) j += {n};",
            f"if (j < 0 || j >= {n}) {{ atomicExch(status, {code}); {ptrs[id(out)]}[o] = 0; continue; }}",
            f"{ptrs[id(out)]}[o] = {ptrs[id(x)]}[(a * {n} + (size_t)j) * {inner} + c];"]
    kernel = _grid_loop(fn, args, names, out.size, idx, body, extra=", int *__restrict__ status")
    kernel.status = True
    return kernel


def emit_gather_elements(k: Kernel, fn: str) -> CudaKernel:
    """out[i] = x[i with its ``axis`` coordinate replaced by indices[i]] (checked as Gather's)."""
    node = k.root
    args, names, ptrs = external(k)
    x, ind, out = node.inputs[0], node.inputs[1], node.outputs[0]
    axis = norm_axis(node.attr("axis", 0), len(x.shape), node)
    n = x.shape[axis]
    if ind.is_const and ((ind.const < -n) | (ind.const >= n)).any():
        raise Unsupported("a constant index out of range")
    idx = index_type(k)
    dims = [f"i{d}" for d in range(len(ind.shape))]
    at = list(dims)
    at[axis] = "(size_t)j"
    body = [*decompose("o", list(ind.shape), dims, idx),
            f"long long j = (long long){ptrs[id(ind)]}[o];",
            f"if (j < 0) j += {n};",
            f"if (j < 0 || j >= {n}) {{ atomicExch(status, {IndexOutOfRangeError.code}); {ptrs[id(out)]}[o] = 0; "
            "continue; }",
            f"{ptrs[id(out)]}[o] = {ptrs[id(x)]}[{_source(tuple(x.shape), at)}];"]
    kernel = _grid_loop(fn, args, names, out.size, idx, body, extra=", int *__restrict__ status")
    kernel.status = True
    return kernel
