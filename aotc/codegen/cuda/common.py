"""What every CUDA kernel writer shares: the kernel record, index types, and affine addresses.

A GPU kernel is one ``__global__`` function with typed pointer parameters (``in0``.., ``out0``.., and for
a split reduction its partial results and arrival counters in the workspace), launched once per run on
the caller's stream. Its index arithmetic is written out from the same affine accesses the CPU loops
use (``aotc.codegen.loops.Access``: ``base + sum(coeff_d * index_d)``), so a reader checks it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aotc.codegen.loops import Access
from aotc.ir import dtypes
from aotc.ir.graph import Value
from aotc.ir.kernel import Kernel

THREADS = 256        # threads per block of every kernel
MAX_BLOCKS = 8192    # grid-stride kernels launch at most this many blocks (each thread then loops)
# Indices fit a 32-bit unsigned when every tensor a kernel touches has fewer elements than this (with
# room for a grid-stride step of MAX_BLOCKS * THREADS past the end): 32-bit division is several times
# cheaper on the GPU than 64-bit.
IDX32_LIMIT = (1 << 32) - 2 * MAX_BLOCKS * THREADS


class Unsupported(Exception):
    """A kernel the CUDA emitter does not write; collected and reported in one line."""


@dataclass
class CudaKernel:
    fn: str
    code: str                               # the device code (helpers and the __global__ function)
    args: list[tuple[Value, str]]           # (value, "in" | "out") in parameter order
    grid: str                               # launch configuration: C expressions of dim3 or integers
    block: int = THREADS
    counters: int = 0                       # unsigned ints of workspace it takes (zeroed each run)
    partials: int = 0                       # bytes of workspace for partial results
    status: bool = False                    # takes the run's status word (int *status, last parameter)
    notes: list[str] = field(default_factory=list)


def index_type(k: Kernel, *extra: int) -> str:
    sizes = [v.size for v in (*k.inputs, *k.outputs)] + list(extra)
    return "unsigned" if max(sizes, default=0) < IDX32_LIMIT else "size_t"


def params(args: list[tuple[Value, str]], names: list[str]) -> list[str]:
    res = []
    for (v, role), name in zip(args, names, strict=True):
        t = dtypes.c_type(v.dtype)
        res.append(f"const {t} *__restrict__ {name}" if role == "in" else f"{t} *__restrict__ {name}")
    return res


def external(k: Kernel) -> tuple[list[tuple[Value, str]], list[str], dict[int, str]]:
    """The kernel's inputs and outputs as parameters in0.., out0.. (and id(value) -> name)."""
    args: list[tuple[Value, str]] = []
    names: list[str] = []
    ptrs: dict[int, str] = {}
    for role, values in (("in", k.inputs), ("out", k.outputs)):
        for i, v in enumerate(values):
            args.append((v, role))
            names.append(f"{role}{i}")
            ptrs[id(v)] = f"{role}{i}"
    return args, names, ptrs


def decompose(flat: str, extents: list[int], names: list[str], idx: str) -> list[str]:
    """Declarations of ``names`` (row-major indices over ``extents``) from the flat index ``flat``, which must be
    below ``prod(extents)``."""
    lines = []
    inner = 1
    for d in reversed(range(len(extents))):
        e, n = extents[d], names[d]
        q = flat if inner == 1 else f"({flat} / {inner})"
        if e == 1:
            q = "0"
        elif d > 0:  # the outermost index needs no remainder: flat < prod(extents)
            q = f"{q} % {e}"
        lines.append(f"const {idx} {n} = {q}; (void){n};")
        inner *= e
    return lines[::-1]


def affine(acc: Access, index: dict[int, str]) -> str:
    """``acc.ptr[base + sum(coeff_d * index[d])]`` over the loops in ``index`` (others do not move). A negative
    coefficient (a reversed slice) is a subtraction: the indices are unsigned, and their wrap-around sums
    come back to the element's offset, which is in range."""
    text = str(acc.base) if acc.base else ""
    for d, c in enumerate(acc.coeffs):
        if c and d in index:
            term = index[d] if abs(c) == 1 else f"{abs(c)} * {index[d]}"
            text = (f"{text} - {term}" if text else f"0 - {term}") if c < 0 else (f"{text} + {term}" if text else term)
    return f"{acc.ptr}[{text or '0'}]"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def strides(shape: list[int] | tuple[int, ...]) -> list[int]:
    return [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
