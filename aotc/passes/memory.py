"""Liveness-based memory planning: every intermediate buffer gets an offset in one workspace.

Buffers whose lifetimes (first write .. last read, in kernel order) overlap never share bytes; the
rest are packed greedily, largest first, at the lowest offset that fits (the arena strategy of
TFLite and others). The plan reports the workspace size next to the sum of all intermediate sizes
it replaces.

Kernel scratch (e.g. GEMM packing buffers) is needed only while its kernel runs, once per task. It
lives after the tensors: one slot per thread, each as large as the largest per-task scratch, so the
workspace for ``n`` threads is ``scratch_offset + n * scratch_per_task`` bytes. The partial results
of a reduction split into chunks are shared by its tasks: they are placed like a tensor that lives
while its kernel runs. Both sizes come from the kernels' plans (aotc/passes/schedule.py).

Sizes are checked here, where they are still exact Python integers: the generated C computes every
size, offset and index in ``size_t``, so a plan that does not fit ``MAX_BYTES`` is refused rather
than emitted as constants that would wrap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Graph, Value
from aotc.passes.fuse import storage_root

ALIGN = 64

# The largest tensor (and dimension) and the largest workspace aotc compiles: 2**48 bytes (256 TiB).
# No 64-bit machine maps more (x86-64 and AArch64 give user space 2**47 to 2**48 bytes), and it keeps
# every product the generated C computes -- a byte count, an element offset times a stride, a loop
# bound times a task count (at most MAX_TASKS) -- far below PTRDIFF_MAX (2**63 - 1), so none wraps.
MAX_BYTES = 1 << 48
# The most tasks a kernel is split into (aotc/passes/schedule.py), hence the most per-thread scratch
# slots a run uses: the workspace is checked for this many threads.
MAX_TASKS = 1024


def _limit_text() -> str:
    return f"{MAX_BYTES} bytes (2**48)"


def check_tensor_size(v: Value, where: str) -> None:
    """Refuse a tensor whose dimensions, element count or byte size exceed ``MAX_BYTES`` (``where``
    names the node or input it comes from)."""
    assert v.shape is not None and v.dtype is not None
    dims = [int(d) for d in v.shape]
    if any(d < 0 for d in dims):
        raise AotcError(f"{where}: tensor {v.name!r} has a negative dimension in its shape {dims}")
    nbytes = math.prod(dims) * np.dtype(v.dtype).itemsize
    if nbytes > MAX_BYTES or max(dims, default=0) > MAX_BYTES:
        raise AotcError(f"{where}: tensor {v.name!r} of shape {dims} ({np.dtype(v.dtype)}) would take "
                        f"{nbytes} bytes; aotc compiles tensors and dimensions of at most {_limit_text()}")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Buffer:
    name: str
    size: int
    first: int   # kernel index of the first write
    last: int    # kernel index of the last read
    offset: int = -1


@dataclass
class MemoryPlan:
    buffers: dict[int, Buffer] = field(default_factory=dict)   # id(root value) -> buffer
    scratch: dict[int, Buffer] = field(default_factory=dict)   # kernel index -> its per-task scratch
    partials: dict[int, Buffer] = field(default_factory=dict)  # kernel index -> its chunks' partials
    scratch_offset: int = 0      # where the per-thread scratch slots start
    scratch_per_task: int = 0    # bytes per slot

    @property
    def workspace_bytes(self) -> int:
        """The workspace for one thread."""
        return self.workspace_bytes_for(1)

    def workspace_bytes_for(self, threads: int) -> int:
        return self.scratch_offset + max(1, threads) * self.scratch_per_task

    @property
    def intermediate_bytes(self) -> int:
        return sum(b.size for b in (*self.buffers.values(), *self.scratch.values(), *self.partials.values()))

    def summary(self) -> str:
        return (f"workspace {self.workspace_bytes} bytes for {len(self.buffers)} intermediates "
                f"(+{len(self.scratch)} scratch) totalling {self.intermediate_bytes} bytes")


def plan_memory(graph: Graph) -> bool:
    """Place ``graph``'s buffers (``graph.memory``), with the scratch and partials its kernels' plans ask."""
    plan = MemoryPlan()
    outputs = {id(storage_root(v)) for v in graph.outputs}
    roots: dict[int, Value] = {}
    for k in graph.kernels:
        for v in k.outputs:
            root = storage_root(v)
            if id(root) not in outputs:
                roots[id(root)] = root
                plan.buffers[id(root)] = Buffer(root.name, _align(root.nbytes), k.index, k.index)
    for k in graph.kernels:
        for v in k.inputs:
            b = plan.buffers.get(id(storage_root(v)))
            if b is not None:
                b.last = max(b.last, k.index)
        assert k.plan is not None, "the schedule step plans every kernel before memory planning"
        if k.plan.scratch_bytes:
            plan.scratch[k.index] = Buffer(f"scratch_{k.name}", _align(k.plan.scratch_bytes), k.index, k.index)
        if k.plan.partials_bytes:
            plan.partials[k.index] = Buffer(f"partials_{k.name}", _align(k.plan.partials_bytes), k.index, k.index)

    placed: list[Buffer] = []
    for b in sorted([*plan.buffers.values(), *plan.partials.values()], key=lambda b: (-b.size, b.first, b.name)):
        busy = sorted((p.offset, p.offset + p.size) for p in placed
                      if p.first <= b.last and b.first <= p.last)
        offset = 0
        for lo, hi in busy:
            if offset + b.size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
    plan.scratch_offset = max((b.offset + b.size for b in placed), default=0)
    plan.scratch_per_task = max((b.size for b in plan.scratch.values()), default=0)
    for b in plan.scratch.values():
        b.offset = plan.scratch_offset
    most = plan.workspace_bytes_for(MAX_TASKS)
    if most > MAX_BYTES:
        raise AotcError(f"the workspace would take {plan.workspace_bytes} bytes for one thread, {most} for "
                        f"{MAX_TASKS} threads (tensors that are live at once share no bytes); aotc compiles "
                        f"workspaces of at most {_limit_text()}")
    graph.memory = plan
    return True
