"""From a fused kernel to one C function with the uniform kernel signature

    void NAME_kI(void *const *args, size_t task, size_t ntasks);

``args`` holds the buffers the kernel reads and writes (in the order of ``KernelSource.args``); a
kernel computes only its share ``task`` of ``ntasks`` of the work, so a caller may run the shares
on several threads. The uniform signature keeps the run function and any thread pool trivial.

A kernel that can fail on its data (an out-of-range index) names ``aotc_status`` in its code: it then
gets one more argument, the run's status word (an ``int *``, after the scratch if any), which it sets
with an atomic store (its tasks may fail at once) before returning; the run function checks the
word after that kernel only, so kernels that cannot fail cost nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from aotc.codegen.gemm import render_gemm
from aotc.codegen.loops import Access, Emitter, emit_loop_kernel, identity_map
from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Value
from aotc.ir.kernel import Kernel
from aotc.ops import OPS
from aotc.ops import conv as conv_ops
from aotc.ops import norm as norm_ops
from aotc.ops.conv import expand_depthwise
from aotc.ops.gemm_plan import pack_b
from aotc.target import Target


@dataclass
class KernelSource:
    fn: str
    code: str                       # the C definition(s)
    args: list[tuple[Value, str]]   # (value, "in" | "out"); scratch, if any, comes last
    scratch: bool = False
    notes: list[str] = field(default_factory=list)
    finish: str | None = None       # a second function (same args), run once after all tasks of fn
    status: bool = False            # takes the run's status word (last argument) and may set it


def _uses(code: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", code) is not None


def _declare(args: list[tuple[Value, str]], names: list[str], scratch: bool, locals_: list[str],
             inplace: Value | None = None) -> str:
    """The pointers ``locals_`` names, read from ``args`` (the arguments, then the scratch slot when
    ``scratch``, then the status word)."""
    lines = []
    for i, ((v, role), name) in enumerate(zip(args, names, strict=True)):
        t = dtypes.c_type(v.dtype)
        const = "const " if role == "in" else ""
        # An in-place update reads and writes one buffer through two pointers: neither is restrict.
        shared = inplace is not None and (role == "out" or v is inplace)
        lines.append(f"  {const}{t} *{'' if shared else 'restrict '}{name} = ({const}{t} *)args[{i}];")
    if "scratch" in locals_:  # an emitter may name scratch where its op needs none: a null pointer then
        lines.append(f"  float *restrict scratch = (float *)args[{len(args)}];" if scratch else
                     "  float *scratch = 0;")
    if "aotc_status" in locals_:
        lines.append(f"  int *const aotc_status = (int *)args[{len(args) + scratch}];")
    return "".join(f"{line}\n" for line in lines)


def _function(fn: str, k: Kernel, args: list[tuple[Value, str]], names: list[str], body: str,
              scratch: bool = False, helpers: str = "", finish: str | None = None) -> KernelSource:
    """The C function(s) ``fn`` (and ``fn_finish``) around ``body`` (and ``finish``): each declares the
    pointers some body reads, and casts to void only what it leaves unused (-Wextra is clean)."""
    bodies = {fn: body} if finish is None else {fn: body, f"{fn}_finish": finish}
    used = [(a, n) for a, n in zip(args, names, strict=True) if any(_uses(b, n) for b in bodies.values())]
    args = [a for a, _ in used]
    names = [n for _, n in used]
    status = any(_uses(b, "aotc_status") for b in bodies.values())
    locals_ = names + [v for v in ("scratch", "aotc_status") if any(_uses(b, v) for b in bodies.values())]
    reads_args = bool(names) or status or (scratch and "scratch" in locals_)
    decl = _declare(args, names, scratch, locals_, k.inplace)
    code = f"{helpers}/* {k.name}: {' + '.join(k.ops)} */\n"
    for name, b in bodies.items():
        unused = [v for v in ([] if reads_args else ["args"]) + ["task", "ntasks"] + locals_ if not _uses(b, v)]
        voids = "  " + " ".join(f"(void){v};" for v in unused) + "\n" if unused else ""
        code += (f"void {name}(void *const *args, size_t task, size_t ntasks) {{\n{decl}{voids}"
                 + "  " + b.replace("\n", "\n  ") + "\n}\n")
    return KernelSource(fn, code, args, scratch, finish=None if finish is None else f"{fn}_finish", status=status)


def _external(k: Kernel) -> tuple[list[tuple[Value, str]], list[str], dict[int, str]]:
    args: list[tuple[Value, str]] = []
    names: list[str] = []
    ptrs: dict[int, str] = {}
    for i, v in enumerate(k.inputs):
        args.append((v, "in"))
        names.append(f"in{i}")
        ptrs[id(v)] = f"in{i}"
    for i, v in enumerate(k.outputs):
        args.append((v, "out"))
        names.append(f"out{i}")
        ptrs[id(v)] = f"out{i}"
    return args, names, ptrs


def emit_kernel(k: Kernel, fn: str, target: Target) -> KernelSource:
    """Kernel ``k`` as the C function ``fn``, written as its plan (``k.plan``, from the schedule step) says."""
    assert k.plan is not None, "the schedule step plans every kernel before codegen"
    if all(v.size == 0 for v in k.outputs) and not k.inplace:  # nothing to write (e.g. a Conv of 0 channels)
        return _function(fn, k, [], [], "/* every output is empty */")
    if k.kind == "loop":
        args, names, ptrs = _external(k)
        body, finish = emit_loop_kernel(k, ptrs)
        return _function(fn, k, args, names, body, scratch=finish is not None, finish=finish)
    if k.kind == "gemm":
        return _emit_gemm(k, fn)
    if k.kind == "conv":
        return _emit_conv(k, fn, target)
    if k.root.op == "LayerNormalization" and len(k.nodes) > 1:  # its input chain fused (passes/fuse.py)
        return _emit_fused_layernorm(k, fn)
    node = k.root
    op = OPS[node.op]
    if op.emit is None:
        raise AotcError(f"{node.op} node {node.name!r}: no kernel for this op")
    ins = [v for v in node.inputs if v is not None]
    args = [(v, "in") for v in ins] + [(v, "out") for v in node.outputs]
    names = [f"in{i}" for i in range(len(ins))] + [f"out{i}" for i in range(len(node.outputs))]
    body = op.emit(node, names[:len(ins)], names[len(ins):], dtypes.c_type(node.outputs[0].dtype))
    helpers, body = body if isinstance(body, tuple) else ("", body)  # (file-scope C, function body)
    return _function(fn, k, args, names, body, scratch=k.plan.scratch_bytes > 0, helpers=helpers)


def _emit_gemm(k: Kernel, fn: str) -> KernelSource:
    mm = k.gemm
    assert mm is not None and k.plan is not None
    a, b = mm.inputs[0], mm.inputs[1]
    out = k.outputs[0]
    plan = k.plan.gemm
    args, names, ptrs = _external(k)
    if plan is None:
        return _naive_matmul(k, fn, args, names, ptrs)
    spec, gemm_fn = plan.spec, f"{fn}_gemm"
    epi_lines, epi_params = _epilogue(k, ptrs)
    if spec.b_const:
        packed = Graph.constant(pack_b(b.const, spec), f"{b.name}_packed")
        args.append((packed, "in"))
        names.append("in_packed")
        b_name = "in_packed"
    else:
        b_name = ptrs[id(b)]
    gemm_args = [ptrs[id(a)], b_name, ptrs[id(out)], "scratch", "task", "ntasks"]
    if epi_lines is None:
        helpers = render_gemm(plan, gemm_fn)
        body = f"{gemm_fn}({', '.join(gemm_args)});"
    else:
        helpers = render_gemm(plan, gemm_fn, epilogue=" ".join(epi_lines),
                              extra_params="".join(f", {p}" for p, _ in epi_params))
        body = f"{gemm_fn}({', '.join(gemm_args + [n for _, n in epi_params])});"
    return _function(fn, k, args, names, body, scratch=k.plan.scratch_bytes > 0, helpers=helpers + "\n")


def _epilogue(k: Kernel, ptrs: dict[int, str]) -> tuple[list[str] | None, list[tuple[str, str]]]:
    """The elementwise chain after the MatMul as a statement on ``v`` at (b, i, j), or None if none."""
    mm = k.gemm
    out = k.outputs[0]
    if len(k.nodes) == 1:
        return None, []
    rank = len(out.shape)
    em = Emitter(k, ptrs, rank)
    em.memo[(id(mm.outputs[0]), identity_map(rank), "epilogue")] = "v"
    root = em.value(out, identity_map(rank), "epilogue")
    extents = list(out.shape)
    loop_var = {rank - 1: "j", rank - 2: "i"}
    params: list[tuple[str, str]] = []
    seen: set[str] = set()

    def addr(acc: Access) -> str:
        terms = [str(acc.base)] if acc.base else []
        # The batch index b runs over the output's batch dims flattened; dims of extent 1 never move.
        live = [d for d in range(rank - 2) if extents[d] != 1]
        stride = {d: int(np.prod(extents[d + 1:rank - 2])) for d in live}
        if live:
            scale = acc.coeffs[live[-1]]
            if all(acc.coeffs[d] == scale * stride[d] for d in live):  # walks b contiguously
                if scale:
                    terms.append(f"{scale} * b")
            else:  # a broadcast inside the batch dims: recover each index
                terms += [f"{acc.coeffs[d]} * ((b / {stride[d]}) % {extents[d]})" for d in live if acc.coeffs[d]]
        for d, name in loop_var.items():
            if acc.coeffs[d]:
                terms.append(name if acc.coeffs[d] == 1 else f"{acc.coeffs[d]} * {name}")
        if acc.ptr not in seen:
            seen.add(acc.ptr)
            v = next(x for x in k.inputs if ptrs[id(x)] == acc.ptr)
            params.append((f"const {dtypes.c_type(v.dtype)} *restrict {acc.ptr}", acc.ptr))
        return f"{acc.ptr}[{' + '.join(terms) or '0'}]"

    lines = em.render("epilogue", addr)
    lines.append(f"v = {root};")
    if rank == 2:
        lines.insert(0, "(void)b;")
    return ["{", *lines, "}"], params


def _emit_fused_layernorm(k: Kernel, fn: str) -> KernelSource:
    """A LayerNormalization whose input row is computed by its fused elementwise chain."""
    node = k.root
    x = node.inputs[0]
    assert x is not None
    args, names, ptrs = _external(k)
    rank, axis = len(x.shape), norm_ops.ln_axis(node)
    em = Emitter(k, ptrs, rank)
    val = em.value(x, identity_map(rank), "body")
    # Flat strides of the row index r (over the axes before ``axis``) and of the in-row index k.
    flat = [int(np.prod(x.shape[d + 1:axis if d < axis else rank])) for d in range(rank)]

    def addr(acc: Access) -> str:
        terms = [str(acc.base)] if acc.base else []
        for var, dims in (("r", range(axis)), ("k", range(axis, rank))):
            live = [d for d in dims if x.shape[d] != 1]
            if not any(acc.coeffs[d] for d in live):
                continue
            scale = acc.coeffs[live[-1]]
            if all(acc.coeffs[d] == scale * flat[d] for d in live):  # walks var contiguously
                terms.append(var if scale == 1 else f"{scale} * {var}")
            else:  # a broadcast or transpose across these axes: recover each index
                terms += [f"{acc.coeffs[d]} * (({var} / {flat[d]}) % {x.shape[d]})" for d in live if acc.coeffs[d]]
        return f"{acc.ptr}[{' + '.join(terms) or '0'}]"

    ins = [""] + [ptrs[id(v)] for v in node.inputs[1:] if v is not None]
    outs = [ptrs[id(v)] for v in node.outputs]
    body = norm_ops.layernorm_kernel(node, ins, outs, dtypes.c_type(x.dtype), (em.render("body", addr), val))
    return _function(fn, k, args, names, body)


def _conv_epilogue(k: Kernel, ptrs: dict[int, str], conv: Value, out: Value) -> list[str] | None:
    """The elementwise chain of ``k`` from the Conv output ``conv`` to ``out`` as statements updating
    ``v`` (reading n, c, od/oh/ow or the flat position s); None when ``out`` is the Conv output."""
    if out is conv:
        return None
    rank = len(out.shape)
    em = Emitter(k, ptrs, rank)
    em.memo[(id(conv), identity_map(rank), "epilogue")] = "v"
    root = em.value(out, identity_map(rank), "epilogue")
    # Loop index names of the output dims: batch, channel, then the trailing spatial dims; a read
    # that walks the spatial dims contiguously uses the flat position s instead.
    var = ["n", "c", *["od", "oh", "ow"][3 - (rank - 2):]]
    sp = list(range(2, rank))

    def addr(acc: Access) -> str:
        terms = [str(acc.base)] if acc.base else []
        cs = acc.coeffs
        flat = all(cs[d] == cs[d + 1] * out.shape[d + 1] for d in sp[:-1])
        dims = [0, 1] if flat else range(rank)
        terms += [f"{cs[d]} * {var[d]}" for d in dims if cs[d]]
        if flat and cs[-1]:
            terms.append(f"{cs[-1]} * s")
        return f"{acc.ptr}[{' + '.join(terms) or '0'}]"

    return ["{", *em.render("epilogue", addr), f"v = {root};", "}"]


def _emit_conv(k: Kernel, fn: str, target: Target) -> KernelSource:
    """A Conv with its elementwise consumer chain applied to each output value ``v`` before the store."""
    node = k.conv
    assert node is not None
    args, names, ptrs = _external(k)
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    out = k.outputs[0]
    epi = _conv_epilogue(k, ptrs, node.outputs[0], out)
    if k.expand is not None:
        return _emit_expand_depthwise(k, fn, target, args, names, ptrs, epi)
    op, path = OPS[node.op], k.plan.conv_path
    assert op.emit is not None and op.pack is not None and path is not None
    packed = None
    arr = op.pack(node, path, target)  # weights packed at compile time into the path's layout
    if arr is not None:
        args.append((Graph.constant(arr, f"{w.name}_packed"), "in"))
        names.append("in_packed")
        packed = "in_packed"
    bname = ptrs[id(b)] if b is not None else None
    helpers, body = op.emit(node, path, ptrs[id(x)], ptrs[id(w)], bname, ptrs[id(out)], target, fn, epi, packed)
    return _function(fn, k, args, names, body, scratch=k.plan.scratch_bytes > 0, helpers=helpers)


def _emit_expand_depthwise(k: Kernel, fn: str, target: Target, args: list[tuple[Value, str]], names: list[str],
                           ptrs: dict[int, str], epi: list[str] | None) -> KernelSource:
    """A depthwise Conv with the expanding 1x1 Conv that computes its input (passes/fuse.py)."""
    ex, dw = k.expand, k.conv
    assert ex is not None and dw is not None
    ge, gd = conv_ops.geometry(ex), conv_ops.geometry(dw)
    arr = expand_depthwise.pack_weights(ex, target)
    args.append((Graph.constant(arr, f"{ex.inputs[1].name}_packed"), "in"))
    names.append("in_packed")
    epi_e = _conv_epilogue(k, ptrs, ex.outputs[0], dw.inputs[0])
    bd = dw.inputs[2] if len(dw.inputs) > 2 else None
    helpers, body = expand_depthwise.kernel(ge, gd, ptrs[id(ex.inputs[0])], "in_packed", ptrs[id(dw.inputs[1])],
                                            None if bd is None else ptrs[id(bd)], ptrs[id(k.outputs[0])], target,
                                            epi_e, epi, fn)
    return _function(fn, k, args, names, body, scratch=True, helpers=helpers)


def _naive_matmul(k: Kernel, fn: str, args, names, ptrs) -> KernelSource:
    """MatMul for non-float32 dtypes and unusual broadcasts: a plain triple loop."""
    mm = k.gemm
    assert mm is not None and len(k.nodes) == 1, "only the GEMM template takes an epilogue (can_take_epilogue)"
    a, b = mm.inputs[0], mm.inputs[1]
    out = mm.outputs[0]
    a2 = (1, *a.shape) if len(a.shape) == 1 else a.shape
    b2 = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    m, kk, n = a2[-2], a2[-1], b2[-1]
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    nb = int(np.prod(batch))
    t = dtypes.c_type(out.dtype)

    def offset(shape: tuple[int, ...], per: int) -> str:
        """The offset of batch entry ``bi`` in an operand with batch dims ``shape`` (broadcast to
        ``batch``), computed per entry: a table of them would grow with the batch."""
        s = (1,) * (len(batch) - len(shape)) + tuple(shape)
        if s == batch:
            return f"bi * {per}"
        terms = []
        for d in range(len(batch)):
            if s[d] != 1 and batch[d] != 1:
                inner = int(np.prod(batch[d + 1:]))
                index = f"bi / {inner} % {batch[d]}" if inner > 1 else f"bi % {batch[d]}"
                terms.append(f"({index}) * {int(np.prod(s[d + 1:])) * per}")
        return " + ".join(terms) or "0"

    pa, pb, po = ptrs[id(a)], ptrs[id(b)], ptrs[id(out)]
    # float16 accumulates in float and rounds once, as numpy's float16 matmul does.
    acc, cast = ("float", "(float)") if t == "_Float16" else (t, "")
    body = (f"for (size_t bi = task; bi < {nb}; bi += ntasks) {{\n"
            f"  const size_t ao = {offset(a2[:-2], m * kk)}, bo = {offset(b2[:-2], kk * n)};\n"
            f"  for (size_t i = 0; i < {m}; i++)\n"
            f"    for (size_t j = 0; j < {n}; j++) {{\n"
            f"      {acc} s = 0;\n"
            f"      for (size_t p = 0; p < {kk}; p++) s += {cast}{pa}[ao + i * {kk} + p] * "
            f"{cast}{pb}[bo + p * {n} + j];\n"
            f"      {po}[bi * {m * n} + i * {n} + j] = ({t})s;\n"
            f"    }}\n"
            f"}}")
    return _function(fn, k, args, names, body)
