"""Which CUDA writer takes a fused kernel, and the check that its code names only device functions that
exist (aotc_cuda.cuh): what the GPU emitter cannot write is collected, never half-emitted."""

from __future__ import annotations

import re

import numpy as np

from aotc.codegen.cuda.attention import emit_attention
from aotc.codegen.cuda.common import THREADS, CudaKernel, Unsupported, external, params
from aotc.codegen.cuda.copies import (
    emit_concat,
    emit_gather,
    emit_gather_elements,
    emit_pad,
    emit_split,
    emit_tile,
)
from aotc.codegen.cuda.gemm import emit_conv, emit_matmul
from aotc.codegen.cuda.loops import emit_loop
from aotc.codegen.cuda.rows import (
    emit_arg,
    emit_channel_norm,
    emit_global_pool,
    emit_layernorm,
    emit_pool,
    emit_softmax,
)
from aotc.ir.kernel import Kernel
from aotc.resources import runtime_dir

OP_KERNELS = {"Softmax": emit_softmax, "LogSoftmax": emit_softmax, "LayerNormalization": emit_layernorm,
           "MaxPool": emit_pool, "AveragePool": emit_pool, "GlobalAveragePool": emit_global_pool,
           "GlobalMaxPool": emit_global_pool, "ArgMax": emit_arg, "ArgMin": emit_arg, "Concat": emit_concat,
           "Split": emit_split, "Pad": emit_pad, "Tile": emit_tile, "Gather": emit_gather, "Attention": emit_attention,
           "GatherElements": emit_gather_elements, "InstanceNormalization": emit_channel_norm,
           "GroupNormalization": emit_channel_norm}


def device_functions() -> set[str]:
    """The aotc_* functions and macros aotc_cuda.cuh defines."""
    text = (runtime_dir() / "aotc_cuda.cuh").read_text()
    return set(re.findall(r"\b(aotc_\w+)\s*\(", text)) | set(re.findall(r"#define (AOTC_\w+)", text))


def emit_cuda_kernel(k: Kernel, fn: str, tf32: bool) -> CudaKernel:
    """The kernel's CUDA code; raises ``Unsupported`` (with the reason) for what the GPU emitter lacks."""
    if any(v.dtype == np.float16 for n in k.nodes for v in (*n.inputs, *n.outputs) if v is not None):
        raise Unsupported("float16 tensors (nvcc has no _Float16)")
    if all(v.size == 0 for v in k.outputs):  # nothing to compute: never launched
        args, names, _ = external(k)
        return CudaKernel(fn, f"__global__ void __launch_bounds__({THREADS}) {fn}({', '.join(params(args, names))}) "
                              "{ /* no elements */ }\n", args, "1")
    if k.kind == "loop":
        kernel = emit_loop(k, fn)
    elif k.kind == "gemm":
        kernel = emit_matmul(k, fn, tf32)
    elif k.kind == "conv":
        kernel = emit_conv(k, fn, tf32)
    elif k.root.op in OP_KERNELS:
        kernel = OP_KERNELS[k.root.op](k, fn)
    else:
        raise Unsupported("no CUDA kernel")
    missing = sorted(set(re.findall(r"\b(aotc_\w+)\s*\(", kernel.code)) - device_functions()
                     - {f"{fn}_a", f"{fn}_b", f"{fn}_c", f"{fn}_x"})
    missing = [m for m in missing if not m.startswith(fn)]
    if missing:  # the elementwise expression of an emulated type or an op with no device version
        raise Unsupported(f"no device version of {', '.join(missing)}")
    return kernel
