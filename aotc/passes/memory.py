"""Liveness-based memory planning: every intermediate buffer gets an offset in one workspace.

Buffers whose lifetimes (first write .. last read, in kernel order) overlap never share bytes; the
rest are packed greedily, largest first, at the lowest offset that fits (the arena strategy of
TFLite and others). The plan reports the workspace size next to the sum of all intermediate sizes
it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aotc.ir.graph import Graph, Value
from aotc.passes.fuse import storage_root

ALIGN = 64


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
    scratch: dict[int, Buffer] = field(default_factory=dict)   # kernel index -> scratch buffer
    workspace_bytes: int = 0

    @property
    def intermediate_bytes(self) -> int:
        return sum(b.size for b in self.buffers.values()) + sum(b.size for b in self.scratch.values())

    def summary(self) -> str:
        return (f"workspace {self.workspace_bytes} bytes for {len(self.buffers)} intermediates "
                f"(+{len(self.scratch)} scratch) totalling {self.intermediate_bytes} bytes")


def plan_memory(graph: Graph) -> bool:
    from aotc.codegen.kernels import scratch_bytes

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
        size = scratch_bytes(k, graph.isa, graph.max_tasks)
        if size:
            plan.scratch[k.index] = Buffer(f"scratch_{k.name}", _align(size), k.index, k.index)

    placed: list[Buffer] = []
    everything = sorted([*plan.buffers.values(), *plan.scratch.values()],
                        key=lambda b: (-b.size, b.first, b.name))
    for b in everything:
        busy = sorted((p.offset, p.offset + p.size) for p in placed
                      if p.first <= b.last and b.first <= p.last)
        offset = 0
        for lo, hi in busy:
            if offset + b.size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
    plan.workspace_bytes = max((b.offset + b.size for b in placed), default=0)
    graph.memory = plan
    return True
