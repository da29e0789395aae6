"""The files of a CUDA library: NAME.h (C, device pointers and a stream), NAME.cu (the run function that
launches the kernels), NAME_kernels_N.cu, the weights blob, and aotc_cuda.cuh. Deterministic, as the C
library's files are.

The workspace is the memory plan's tensors (passes/memory.py; the plan's per-thread CPU scratch is not
used), then the split reductions' arrival counters, then their partial results.
"""

from __future__ import annotations

from aotc import __version__
from aotc.codegen.cuda.common import CudaKernel, Unsupported, params
from aotc.codegen.cuda.kernels import emit_cuda_kernel
from aotc.codegen.library import API, KERNELS_PER_FILE, Library, TensorInfo, _Blob, env
from aotc.codegen.names import Mangler, comment
from aotc.errors import RUN_ERRORS, AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Value
from aotc.passes.fuse import storage_root
from aotc.resources import runtime_dir
from aotc.target import Target

ALIGN = 256          # of the workspace, the constants and every buffer in them (cudaMalloc gives 256)
CUDA_STATUS = 16     # NAME_ERR_CUDA: above the C library's statuses


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def generate_cuda(graph: Graph, name: str, input_names: list[str], output_names: list[str], source: str, *,
                  target: Target, profile: bool = False) -> Library:
    """The CUDA library's files for ``graph`` (fused and planned by the shared passes). Every kernel the GPU
    emitter cannot write is listed in one error."""
    lib = Library(name)
    mangle = Mangler(name)
    mangle.used.update({"workspace", "inputs", "outputs", "in", "out", "ws", "i", "constants", "stream", "consts",
                        "events"})
    for names, values, dest in ((input_names, graph.inputs, lib.inputs), (output_names, graph.outputs, lib.outputs)):
        for n, v in zip(names, values, strict=True):
            dest.append(TensorInfo(n, mangle(n), dtypes.dtype_name(v.dtype), dtypes.c_type(v.dtype), list(v.shape)))
    kernels: list[tuple[object, CudaKernel]] = []
    missing: dict[str, list[str]] = {}
    for k in graph.kernels:
        try:
            kernels.append((k, emit_cuda_kernel(k, f"{name}_{k.name}", target.tf32)))
        except Unsupported as e:
            missing.setdefault(f"{'+'.join(dict.fromkeys(k.ops))}: {e}", []).append(k.root.name or k.name)
    if missing:
        parts = [f"{what} (nodes: {', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''})"
                 for what, nodes in sorted(missing.items())]
        raise AotcError(f"--target cuda has no GPU kernel for: {'; '.join(parts)}")

    plan = graph.memory
    blob = _Blob()
    in_index = {id(v): i for i, v in enumerate(graph.inputs)}
    out_index = {id(storage_root(v)): i for i, v in enumerate(graph.outputs)}
    # Zeroed by each run before its first kernel: the status word (if a kernel can fail), then the split
    # reductions' arrival counters.
    zero_offset = _align(plan.scratch_offset)
    has_status = any(kern.status for _, kern in kernels)
    counters_offset = zero_offset + 4 * has_status
    zero_bytes = 4 * has_status + sum(kern.counters for _, kern in kernels) * 4
    partials_offset = _align(zero_offset + zero_bytes)

    def pointer(v: Value, role: str) -> str:
        root = storage_root(v)
        t = dtypes.c_type(v.dtype)
        const = "const " if role == "in" else ""
        if root.is_const:
            return f"({const}{t} *)(consts + {blob.offset(root)})"
        if id(root) in in_index:
            return f"({const}{t} *)inputs[{in_index[id(root)]}]"
        if id(root) in out_index:
            return f"({t} *)outputs[{out_index[id(root)]}]"
        return f"({const}{t} *)(ws + {plan.buffers[id(root)].offset}) /* {comment(v.name, 40)} */"

    calls = []
    counter, partial = counters_offset, partials_offset
    for k, kern in kernels:
        args = [pointer(v, role) for v, role in kern.args]
        if kern.counters:
            rtype = dtypes.compute_type(k.reduce.outputs[0].dtype)
            args += [f"({rtype} *)(ws + {partial}) /* partials */", f"(unsigned *)(ws + {counter}) /* counters */"]
            counter += kern.counters * 4
            partial = _align(partial + kern.partials)
        if kern.status:
            args.append(f"(int *)(ws + {zero_offset}) /* status */")
        calls.append({"fn": kern.fn, "grid": kern.grid, "block": kern.block, "args": args, "name": k.name,
                      "launch": any(v.size for v in k.outputs),
                      "comment": comment(f"{k.name}: {' + '.join(k.ops)}", 100)})
        lib.kernels.append(kern)  # type: ignore[arg-type]
    if blob.offsets and not blob.size:
        blob.parts.append(b"\0" * 64)
        blob.size = 64
    lib.workspace_bytes = partial if zero_bytes else plan.scratch_offset
    lib.consts_bytes = blob.size
    common = {"name": name, "version": __version__, "api": API, "profile": profile, "num_kernels": len(calls),
              "workspace_bytes": lib.workspace_bytes, "consts_bytes": blob.size, "statuses": RUN_ERRORS,
              "cuda_status": CUDA_STATUS, "status_offset": zero_offset if has_status else None,
              "checked": [comment(f"{k.name}: {' + '.join(k.ops)}", 100) for k, kern in kernels if kern.status]}
    files: dict[str, str | bytes] = {}
    files[f"{name}.h"] = env().get_template("cuda/header.h.j2").render(
        **common, source=comment(source, 60), target=comment(target.summary(), 1000),
        inputs=lib.inputs, outputs=lib.outputs)
    files[f"{name}.cu"] = env().get_template("cuda/model.cu.j2").render(
        **common, inputs=lib.inputs, outputs=lib.outputs, calls=calls, zero_offset=zero_offset,
        zero_bytes=zero_bytes)
    codes = [kern.code for _, kern in kernels]
    for start in range(0, len(codes), KERNELS_PER_FILE):
        fname = f"{name}_kernels_{start // KERNELS_PER_FILE}.cu"
        files[fname] = env().get_template("cuda/kernels.cu.j2").render(
            **common, file=fname, kernels=codes[start:start + KERNELS_PER_FILE])
    decls = []
    for k, kern in kernels:
        ps = params(kern.args, [f"a{i}" for i in range(len(kern.args))])
        if kern.counters:
            ps += [f"{dtypes.compute_type(k.reduce.outputs[0].dtype)} *__restrict__ part",
                   "unsigned *__restrict__ arrived"]
        if kern.status:
            ps.append("int *__restrict__ status")
        decls.append({"fn": kern.fn, "params": ", ".join(ps)})
    files[f"{name}_internal.cuh"] = env().get_template("cuda/internal.cuh.j2").render(
        **common, has_consts=blob.size > 0, kernels=decls)
    if blob.size:
        files[f"{name}_consts.bin"] = blob.data()
        files[f"{name}_consts.S"] = env().get_template("consts.S.j2").render(**common, symbol=f"{name}_consts")
    for header in ("aotc_cuda.cuh", "aotc_types.h"):
        files[header] = (runtime_dir() / header).read_text()
    lib.files = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    return lib


def cuda_cdef(name: str, profile: bool) -> str:
    """Declarations for cffi: the untyped entry points the CUDA bindings use (a stream is a pointer)."""
    text = (f"int {name}_run_v(const void *const *inputs, void *const *outputs, const void *constants,\n"
            "    void *workspace, void *stream);\n"
            f"int {name}_load_constants(void *constants, void *stream);\n"
            f"size_t {name}_workspace_size(void);\n"
            f"size_t {name}_constants_size(void);\n"
            f"size_t {name}_status_offset(void);\n")
    if profile:
        text += (f"int {name}_run_profiled(const void *const *inputs, void *const *outputs, const void *constants,\n"
                 "    void *workspace, void *stream, uint64_t *times);\n")
    return text
