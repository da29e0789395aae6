"""Fusion: decide which nodes run together in one kernel. (How a kernel is written is codegen's job.)

Kernels are grown backwards from their last node, XLA-style producer->consumer fusion:

- elementwise and view nodes fuse into their only consumer's loop nest (nothing is written between);
- a reduction fuses with its producers (the loop body) and with elementwise consumers at the reduced
  shape (the epilogue), e.g. ``reduce_sum(x + y*z)`` is one loop that reads x, y and z once;
- a MatMul whose only consumer chain is elementwise at the same shape becomes a GEMM kernel with
  that chain as its epilogue, e.g. ``relu(x @ W + b)``; a Conv likewise becomes a conv kernel with its
  elementwise chain (folded BatchNorm, Relu/Clip/HardSwish, a residual Add) as epilogue;
- a 1x1 conv that widens the channels (+ its epilogue) fuses into the depthwise conv that is its only
  consumer (``aotc/ops/expand_depthwise.py``): the expanded tensor stays in per-task scratch;
- a LayerNormalization takes the elementwise chain computing its input into its row kernel;
- other ops (softmax, concat, ...) are template kernels of their own; aliases (reshapes) are free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aotc.ir.graph import Graph, Node, Value
from aotc.ops import OPS
from aotc.ops.expand_depthwise import fusable
from aotc.target import Target


@dataclass(eq=False)
class Kernel:
    kind: str                      # "loop" | "gemm" | "conv" | "op"
    root: Node                     # the node whose output the kernel writes
    nodes: list[Node] = field(default_factory=list)  # in graph order
    reduce: Node | None = None     # loop kernels: the one reduction, if any
    gemm: Node | None = None       # gemm kernels: the MatMul
    conv: Node | None = None       # conv kernels: the Conv
    expand: Node | None = None     # conv kernels: a 1x1 Conv computed inside, feeding ``conv``
    index: int = 0

    @property
    def outputs(self) -> list[Value]:
        return list(self.root.outputs)

    @property
    def inputs(self) -> list[Value]:
        """Values read from memory (produced outside the kernel), in first-use order."""
        inside = {id(n) for n in self.nodes}
        seen: set[int] = set()
        res = []
        for n in self.nodes:
            for v in n.inputs:
                if v is None or id(v) in seen:
                    continue
                if v.is_const or v.producer is None or id(v.producer) not in inside:
                    seen.add(id(v))
                    res.append(v)
        return res

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    @property
    def name(self) -> str:
        # Op keys are registry names (never model text); a domain prefix ("ai.onnx.ml.") is dropped.
        label = "_".join(dict.fromkeys(op.rpartition(".")[2].lower() for op in self.ops))[:48]
        return f"k{self.index}_{label}"


def storage_root(v: Value) -> Value:
    """The value whose buffer ``v`` lives in (reshape-like aliases share their input's bytes)."""
    while v.producer is not None and OPS[v.producer.op].kind == "alias" and v.producer.inputs[0] is not None:
        v = v.producer.inputs[0]
    return v


def _insert_output_copies(graph: Graph) -> None:
    """Give every graph output a buffer of its own that a kernel writes."""
    seen: set[int] = set()
    for i, v in enumerate(graph.outputs):
        root = storage_root(v)
        if root.is_const or root.producer is None or id(root) in seen:
            copy = graph.add_node("Copy", [v], 1, {}, f"copy_output_{i}", out_names=[v.name])
            copy.outputs[0].shape, copy.outputs[0].dtype = v.shape, v.dtype
            graph.outputs[i] = copy.outputs[0]
            root = copy.outputs[0]
        seen.add(id(root))


def fuse(graph: Graph, target: Target) -> bool:
    """Group ``graph``'s nodes into kernels (``graph.kernels``); ``target`` decides what its kernels can
    hold (an expanding 1x1 conv's input must fit its L2)."""
    _insert_output_copies(graph)
    users = graph.consumers()
    fetched = {id(v) for v in graph.outputs}
    owner: dict[int, Kernel] = {}
    kernels: list[Kernel] = []
    for node in reversed(graph.nodes):
        kind = OPS[node.op].kind
        if id(node) in owner or kind == "alias":
            continue
        if kind in ("elementwise", "view", "reduce"):
            k = Kernel("loop", node, [node], reduce=node if kind == "reduce" else None)
        elif kind == "gemm":
            k = Kernel("gemm", node, [node], gemm=node)
        elif node.op == "Conv":
            k = Kernel("conv", node, [node], conv=node)
        else:
            k = Kernel("op", node, [node])
        owner[id(node)] = k
        if k.kind == "loop":
            _grow(k, users, fetched, owner)
        elif node.op == "LayerNormalization":
            _grow_norm_input(k, users, fetched, owner)
        kernels.append(k)
    kernels.reverse()
    kernels = _fuse_expand_depthwise(kernels, users, fetched, target)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for i, k in enumerate(kernels):
        k.index = i
        k.nodes.sort(key=lambda n: order[id(n)])
    graph.kernels = kernels
    return True


def _fuse_expand_depthwise(kernels: list[Kernel], users: dict[int, list[Node]],
                           fetched: set[int], target: Target) -> list[Kernel]:
    """Merge each expanding 1x1 conv kernel into the depthwise conv kernel that alone reads its
    output. The 1x1 kernel's epilogue must read nothing but constants: the fused kernel has no
    buffer for another tensor at the expanded shape."""
    by_output = {id(k.root.outputs[0]): k for k in kernels if k.kind == "conv" and len(k.root.outputs) == 1}
    merged: set[int] = set()
    for k in kernels:
        x = k.conv.inputs[0] if k.kind == "conv" and k.conv is not None and k.expand is None else None
        a = by_output.get(id(x)) if x is not None else None
        if a is None or a.conv is None or a.expand is not None or id(x) in fetched \
                or [id(u) for u in users[id(x)]] != [id(k.conv)] or any(v is x for v in k.conv.inputs[1:]):
            continue
        inside = {id(v) for n in a.nodes for v in n.outputs}
        if any(v is not None and not v.is_const and id(v) not in inside
               for n in a.nodes if n is not a.conv for v in n.inputs):
            continue
        if not fusable(a.conv, k.conv, target):
            continue
        k.nodes = a.nodes + k.nodes
        k.expand = a.conv
        merged.add(id(a))
    return [k for k in kernels if id(k) not in merged]


def _grow_norm_input(k: Kernel, users: dict[int, list[Node]], fetched: set[int],
                     owner: dict[int, Kernel]) -> None:
    """Pull the elementwise chain computing a LayerNorm's input (e.g. a GELU) into its row kernel.

    The row kernel computes each input row into its output row and normalizes it there while it
    is in L1, so the input tensor is never written to memory and read back."""
    x = k.root.inputs[0]
    p = x.producer if x is not None else None
    if x is None or p is None or x.is_const or id(p) in owner or id(x) in fetched \
            or x.dtype not in (np.float32, np.float64) or len(p.outputs) != 1 \
            or any(u is not k.root for u in users[id(x)]) or any(v is x for v in k.root.inputs[1:]) \
            or OPS[p.op].kind != "elementwise":
        return
    owner[id(p)] = k
    k.nodes.append(p)
    _grow(k, users, fetched, owner, start=[p])


def _grow(k: Kernel, users: dict[int, list[Node]], fetched: set[int], owner: dict[int, Kernel],
          start: list[Node] | None = None) -> None:
    """Add to ``k`` the producers of ``start`` (default: all of k's nodes) that may fuse into it."""
    from aotc.codegen.kernels import takes_epilogue  # the GEMM emitter's own rule (it imports Kernel)

    out_shape = k.root.outputs[0].shape
    work = list(k.nodes if start is None else start)
    while work:
        n = work.pop()
        for v in n.inputs:
            p = v.producer if v is not None else None
            if v is None or p is None or v.is_const or id(p) in owner or id(v) in fetched:
                continue
            if len(p.outputs) != 1 or any(id(u) not in {id(x) for x in k.nodes} for u in users[id(v)]):
                continue
            kind = OPS[p.op].kind
            ok = kind in ("elementwise", "view")
            if kind == "reduce" and k.kind == "loop" and k.reduce is None and v.shape == out_shape \
                    and all(OPS[x.op].kind == "elementwise" for x in k.nodes):
                k.reduce = p
                ok = True
            if kind == "gemm" and p.op == "MatMul" and k.kind == "loop" and k.reduce is None \
                    and takes_epilogue(p, k.root.outputs[0]) \
                    and all(OPS[x.op].kind == "elementwise" for x in k.nodes):
                k.kind, k.gemm = "gemm", p
                owner[id(p)] = k
                k.nodes.append(p)
                continue  # the MatMul's operands are read from memory, not fused
            if p.op == "Conv" and k.kind == "loop" and k.reduce is None and v.shape == out_shape \
                    and k.root.outputs[0].dtype == v.dtype \
                    and all(OPS[x.op].kind == "elementwise" for x in k.nodes):
                k.kind, k.conv = "conv", p
                owner[id(p)] = k
                k.nodes.append(p)
                continue  # the Conv's operands are read from memory
            if not ok:
                continue
            owner[id(p)] = k
            k.nodes.append(p)
            work.append(p)


def kernels_text(graph: Graph) -> str:
    lines = ["kernels:"]
    for k in graph.kernels:
        outs = ", ".join(f"{v.name}: {v.type_str()}" for v in k.outputs)
        lines.append(f"  {k.name} [{k.kind}] ops={'+'.join(k.ops)} -> {outs}")
    return "\n".join(lines) + "\n"
