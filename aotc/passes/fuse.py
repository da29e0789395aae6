"""Fusion: decide which nodes run together in one kernel. (How a kernel is written is codegen's job.)

Kernels are grown backwards from their last node, XLA-style producer->consumer fusion:

- elementwise and view nodes fuse into their only consumer's loop nest (nothing is written between);
- a reduction fuses with its producers (the loop body) and with elementwise consumers at the reduced
  shape (the epilogue), e.g. ``reduce_sum(x + y*z)`` is one loop that reads x, y and z once;
- a MatMul whose only consumer chain is elementwise at the same shape becomes a GEMM kernel with
  that chain as its epilogue, e.g. ``relu(x @ W + b)``; a Conv likewise becomes a conv kernel with its
  elementwise chain (folded BatchNorm, Relu/Clip/HardSwish, a residual Add) as epilogue;
- a kernel may compute its input itself (its prologue): a 1x1 conv that widens the channels (+ its
  epilogue) fuses into the depthwise conv that is its only consumer (``aotc/ops/conv/expand_depthwise.py``:
  the expanded tensor stays in per-task scratch); a LayerNormalization takes the elementwise chain
  computing its input into its row kernel;
- other ops (softmax, concat, ...) are template kernels of their own; aliases (reshapes) are free.

Which heavy op takes an epilogue or a prologue is the emitter's decision, asked through its ``OpDef``
hooks ``can_take_epilogue`` / ``can_take_prologue`` (aotc/ops/registry.py); this pass names no op.
"""

from __future__ import annotations

from aotc.ir.graph import Graph, Node, Value
from aotc.ir.kernel import Kernel
from aotc.ops import OPS
from aotc.target import Target


def storage_root(v: Value) -> Value:
    """The value whose buffer ``v`` lives in (reshape-like aliases share their input's bytes)."""
    while v.producer is not None and OPS[v.producer.op].kind == "alias" and v.producer.inputs[0] is not None:
        v = v.producer.inputs[0]
    return v


def _insert_output_copies(graph: Graph) -> None:
    """Give every graph output a buffer of its own that a kernel writes."""
    seen: set[int] = set()
    for i, v in enumerate(graph.outputs[:graph.num_fetches]):
        root = storage_root(v)
        if root.is_const or root.producer is None or id(root) in seen:
            copy = graph.add_node("Copy", [v], 1, {}, f"copy_output_{i}", out_names=[v.name])
            copy.outputs[0].shape, copy.outputs[0].dtype = v.shape, v.dtype
            graph.outputs[i] = copy.outputs[0]
            root = copy.outputs[0]
        seen.add(id(root))


def _insert_update_writes(graph: Graph) -> dict[int, Value]:
    """Each in-place update (Graph.add_update) becomes a Copy node at the end of the graph whose output
    is the updated input's buffer: its kernel comes after every kernel that reads an old value. A new
    value held by another updated input is copied out first, before any of them is overwritten.
    Returns id(Copy node) -> the input it overwrites."""
    updated = {id(v) for v in graph.updates}
    writes: dict[int, Value] = {}
    pairs = []
    for target, pos in graph.update_pairs():
        v = graph.outputs[pos]
        root = storage_root(v)
        if root is target:  # unchanged: nothing to write
            continue
        if id(root) in updated:
            v = graph.add_node("Copy", [v], 1, {}, f"save_{pos}", out_names=[v.name]).outputs[0]
            v.shape, v.dtype = target.shape, target.dtype
        pairs.append((target, pos, v))
    for target, pos, v in pairs:
        copy = graph.add_node("Copy", [v], 1, {}, f"update_{pos}", out_names=[v.name])
        copy.outputs[0].shape, copy.outputs[0].dtype = target.shape, target.dtype
        graph.outputs[pos] = copy.outputs[0]
        writes[id(copy)] = target
    return writes


def _fits_update(p: Node, target: Value, updated: set[int]) -> bool:
    """Whether ``p`` may join the kernel that overwrites ``target``: an elementwise op that reads no
    updated input but ``target`` itself, whole, so each element is read just before it is written."""
    return OPS[p.op].kind == "elementwise" and all(
        x is None or x is target or id(storage_root(x)) not in updated for x in p.inputs)


def fuse(graph: Graph, target: Target) -> bool:
    """Group ``graph``'s nodes into kernels (``graph.kernels``); ``target`` decides what its kernels can
    hold (an expanding 1x1 conv's input must fit its L2)."""
    _insert_output_copies(graph)
    writes = _insert_update_writes(graph)
    updated = {id(v) for v in graph.updates}
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
        elif kind == "conv":
            k = Kernel("conv", node, [node], conv=node)
        else:
            k = Kernel("op", node, [node])
        owner[id(node)] = k
        k.inplace = writes.get(id(node))
        if k.kind == "loop":
            _grow(k, users, fetched, owner, target, updated=updated)
        elif OPS[node.op].can_take_prologue is not None:
            _grow_prologue(k, users, fetched, owner, target)
        kernels.append(k)
    kernels.reverse()
    kernels = _fuse_prologue_kernels(kernels, users, fetched, target)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for i, k in enumerate(kernels):
        k.index = i
        k.nodes.sort(key=lambda n: order[id(n)])
    graph.kernels = kernels
    return True


def _head(k: Kernel) -> Node:
    """The node a kernel is written around: its MatMul or Conv, else its root."""
    return k.gemm or k.conv or k.root


def _fuse_prologue_kernels(kernels: list[Kernel], users: dict[int, list[Node]],
                           fetched: set[int], target: Target) -> list[Kernel]:
    """Merge a kernel into the one whose head alone reads its output, where that head's emitter takes
    the producer's head as its prologue (an expanding 1x1 conv into its depthwise conv). The producer's
    epilogue must read nothing but constants: the merged kernel has no buffer for another tensor at
    the intermediate shape."""
    by_output = {id(k.root.outputs[0]): k for k in kernels if len(k.root.outputs) == 1}
    merged: set[int] = set()
    for k in kernels:
        h = _head(k)
        hook = OPS[h.op].can_take_prologue
        x = h.inputs[0] if hook is not None and k.expand is None and h.inputs else None
        a = by_output.get(id(x)) if x is not None else None
        if a is None or a is k or a.expand is not None or id(x) in fetched \
                or [id(u) for u in users[id(x)]] != [id(h)] or any(v is x for v in h.inputs[1:]):
            continue
        ah = _head(a)
        inside = {id(v) for n in a.nodes for v in n.outputs}
        if any(v is not None and not v.is_const and id(v) not in inside
               for n in a.nodes if n is not ah for v in n.inputs):
            continue
        if not hook(h, ah, target):
            continue
        k.nodes = a.nodes + k.nodes
        k.expand = ah
        merged.add(id(a))
    return [k for k in kernels if id(k) not in merged]


def _grow_prologue(k: Kernel, users: dict[int, list[Node]], fetched: set[int],
                   owner: dict[int, Kernel], target: Target) -> None:
    """Pull the elementwise chain computing the input of ``k``'s op (e.g. a GELU before a LayerNorm)
    into its kernel when the op's emitter takes it (``can_take_prologue``): the input tensor is then
    never written to memory and read back."""
    hook = OPS[k.root.op].can_take_prologue
    x = k.root.inputs[0] if k.root.inputs else None
    p = x.producer if x is not None else None
    if hook is None or x is None or p is None or x.is_const or id(p) in owner or id(x) in fetched \
            or len(p.outputs) != 1 or OPS[p.op].kind not in ("elementwise", "view") \
            or any(u is not k.root for u in users[id(x)]) or any(v is x for v in k.root.inputs[1:]) \
            or not hook(k.root, p, target):
        return
    owner[id(p)] = k
    k.nodes.append(p)
    _grow(k, users, fetched, owner, target, start=[p])


def _grow(k: Kernel, users: dict[int, list[Node]], fetched: set[int], owner: dict[int, Kernel],
          target: Target, start: list[Node] | None = None, updated: set[int] | None = None) -> None:
    """Add to ``k`` the producers of ``start`` (default: all of k's nodes) that may fuse into it
    (into an in-place update, only what ``_fits_update``; ``updated``: ids of the updated inputs)."""
    out = k.root.outputs[0]
    work = list(k.nodes if start is None else start)
    while work:
        n = work.pop()
        for v in n.inputs:
            p = v.producer if v is not None else None
            if v is None or p is None or v.is_const or id(p) in owner or id(v) in fetched:
                continue
            if len(p.outputs) != 1 or any(id(u) not in {id(x) for x in k.nodes} for u in users[id(v)]):
                continue
            if k.inplace is not None and not _fits_update(p, k.inplace, updated or set()):
                continue
            op = OPS[p.op]
            ok = op.kind in ("elementwise", "view")
            if op.kind == "reduce" and k.kind == "loop" and k.reduce is None and v.shape == out.shape \
                    and all(OPS[x.op].kind == "elementwise" for x in k.nodes):
                k.reduce = p
                ok = True
            if op.can_take_epilogue is not None and k.kind == "loop" and k.reduce is None \
                    and all(OPS[x.op].kind == "elementwise" for x in k.nodes) \
                    and op.can_take_epilogue(p, out, target):
                # The kernel becomes the op's template kernel, the loop's nodes its epilogue.
                if op.kind == "gemm":
                    k.kind, k.gemm = "gemm", p
                else:
                    assert op.kind == "conv", f"{p.op}: can_take_epilogue on a {op.kind} op"
                    k.kind, k.conv = "conv", p
                owner[id(p)] = k
                k.nodes.append(p)
                continue  # the op's operands are read from memory, not fused
            if not ok:
                continue
            owner[id(p)] = k
            k.nodes.append(p)
            work.append(p)


def kernels_text(graph: Graph) -> str:
    """The kernels in execution order, one line each, with its plan below once scheduled."""
    lines = ["kernels:"]
    for k in graph.kernels:
        outs = ", ".join(f"{v.name}: {v.type_str()}" for v in k.outputs)
        lines.append(f"  {k.name} [{k.kind}] ops={'+'.join(k.ops)} -> {outs}")
        if k.plan is not None:
            lines.append(f"    plan: {k.plan.describe()}")
    return "\n".join(lines) + "\n"
