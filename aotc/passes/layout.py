"""Layout: move Transposes through ops that do not care about the layout, so that inverse pairs meet and
cancel.

TensorFlow graphs are NHWC and aotc's Conv and pools are NCHW (ONNX's), so the TensorFlow frontend wraps
each of them in a pair of Transposes, as tf2onnx does in the ONNX models it exports. Between two
convolutions sit the bias, BatchNorm's Mul/Add, the activation, a residual Add or a Pad: while they
stand between the transposes, every layer pays a transposing loop and BatchNorm cannot fold into the
conv's weights. This pass sinks each Transpose towards the outputs, as onnxruntime's transpose
optimizer does: an op runs on the untransposed tensor and the Transpose moves to its output, when that
costs no new transpose, i.e. its other operands are

- constants (permuted once, here),
- the same Transpose of another tensor (a residual Add, swish's Mul),
- broadcasts in which only unit dimensions move (a Reshape, which costs nothing).

Elementwise ops move it as they are; reductions, ArgMax/ArgMin, Concat, Pad and Slice get their axes
permuted. A Transpose that reaches another composes with it, and the identity disappears: what is left
stands at the graph's edges or in front of an op that needs its layout (a Conv, a MatMul, a Reshape).
Finally a Transpose that only moves unit dimensions becomes a Reshape (an alias, no kernel), and a zero
Pad of the spatial dimensions that now stands right before a Conv (Keras' ZeroPadding2D in front of a
strided convolution) becomes the Conv's own padding: no padded copy of the tensor, and an expanding 1x1
conv before it can fuse with the depthwise conv it feeds.

Every rewrite computes the same function on any graph (ONNX ones exported from TensorFlow carry the
same pattern); only a moved reduction may add its elements in another order.
"""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Graph, Node, Value
from aotc.ops import OPS
from aotc.ops.index import _pads as pad_amounts
from aotc.ops.reduce import reduce_axes
from aotc.ops.shape import slice_params

# Elementwise ops whose attributes or operands name an axis of their own.
_AXIS_ELEMENTWISE = frozenset({"QuantizeLinear", "DequantizeLinear", "SwiGLU", "CastLike", "Copy"})
_REDUCTIONS = frozenset({name for name, op in OPS.items() if op.kind == "reduce"} | {"ReduceLogSumExp"})

Perm = list[int]


def _inverse(perm: Perm) -> Perm:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _permuted(shape: tuple[int, ...], perm: Perm) -> tuple[int, ...]:
    """The shape of ``x.transpose(perm)`` for ``x`` of ``shape``."""
    return tuple(shape[p] for p in perm)


def _moves_only_units(shape: tuple[int, ...], perm: Perm) -> bool:
    """Transposing ``shape`` by ``perm`` keeps the non-unit dimensions in order: the bytes stay put."""
    kept = [p for p in perm if shape[p] != 1]
    return kept == sorted(kept)


def transpose_perm(node: Node) -> Perm:
    """A Transpose node's permutation, normalized (no perm attribute: the dimensions reversed)."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    rank = len(x.shape)
    perm = node.attr("perm")
    return list(range(rank))[::-1] if perm is None else [int(p) % rank for p in perm]


class _Layout:
    """One sweep in topological order: each node either stays or is replaced by itself on untransposed
    operands followed by a Transpose that defines its original output (so later users need no change)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.replace: dict[int, Value] = {}
        self.users = graph.consumers()  # the original readers: moved Transposes define original values
        self.hoisted: dict[tuple[int, tuple[int, ...]], Value] = {}
        self.changed = False

    def get(self, v: Value | None) -> Value | None:
        while v is not None and id(v) in self.replace:
            v = self.replace[id(v)]
        return v

    # -- building blocks ------------------------------------------------------------------------------
    def emit(self, op: str, inputs: list[Value | None], outputs: list[Value], attrs: dict, like: Node) -> Node:
        """A node named as ``like`` and of its opset."""
        opset = {"_opset": like.attrs["_opset"]} if "_opset" in like.attrs else {}
        n = Node(op, inputs, outputs, {**opset, **attrs}, like.name)
        for v in outputs:
            v.producer = n
        self.nodes.append(n)
        return n

    def transpose(self, x: Value, perm: Perm, out: Value, like: Node) -> None:
        """Define ``out`` as ``x.transpose(perm)``, composed with a Transpose that makes ``x``; the
        identity only forwards ``x``."""
        t = self.transposed(x)
        if t is not None:  # x.transpose(p).transpose(q) == x.transpose(p[q])
            x, perm = t[0], [t[1][q] for q in perm]
        assert x.shape is not None
        if perm == sorted(perm) or (_permuted(x.shape, perm) == x.shape and _moves_only_units(x.shape, perm)):
            self.replace[id(out)] = x
        else:
            self.emit("Transpose", [x], [out], {"perm": perm}, like)

    def reshape(self, v: Value, shape: tuple[int, ...], like: Node) -> Value:
        if v.shape == shape:
            return v
        out = Value(f"{v.name}/layout", shape, v.dtype)
        self.emit("Reshape", [v, Graph.constant(np.array(shape, np.int64), f"{like.name}/shape")], [out], {}, like)
        return out

    @staticmethod
    def transposed(v: Value | None) -> tuple[Value, Perm] | None:
        """(x, perm) when ``v`` is ``Transpose(x, perm)``."""
        p = v.producer if v is not None else None
        if p is None or p.op != "Transpose" or p.inputs[0] is None:
            return None
        return p.inputs[0], transpose_perm(p)

    def operand(self, v: Value | None, perm: Perm, rank: int, like: Node) -> Value | None | bool:
        """``v`` such that broadcasting it transposed by ``perm`` at ``rank`` gives back the operand ``v``
        (a constant permuted now, a Transpose's input, a Reshape); False when that needs a Transpose."""
        if v is None:
            return None
        assert v.shape is not None
        if len(v.shape) > rank:
            return False
        if v.size == 1:  # broadcasts alike at any rank and position
            return v
        ext = (1,) * (rank - len(v.shape)) + tuple(v.shape)
        inv = _inverse(perm)
        if v.is_const:
            return Graph.constant(v.const.reshape(ext).transpose(inv), f"{v.name}/layout")
        t = self.transposed(v)
        if t is not None and t[1] == perm:
            return t[0]
        if _moves_only_units(ext, inv):
            return self.reshape(v, _permuted(ext, inv), like)
        return False

    # -- the rewrites ---------------------------------------------------------------------------------
    @staticmethod
    def rule(n: Node) -> str | None:
        """How ``n`` takes a Transpose on its (first) operand, if it can."""
        if n.op == "Transpose":
            return "compose"
        if len(n.outputs) != 1 or not n.inputs or n.inputs[0] is None:
            return None
        if n.op == "Identity" or (OPS[n.op].kind == "elementwise" and n.op not in _AXIS_ELEMENTWISE
                                  and "axis" not in n.attrs):
            return "elementwise"
        if n.op in _REDUCTIONS or n.op in ("ArgMax", "ArgMin"):
            return "reduction"
        return n.op.lower() if n.op in ("Concat", "Pad", "Slice") else None

    def movable(self, v: Value) -> bool:
        """Every reader of the Transposed ``v`` is of a kind that takes a Transpose, so moving it past one
        of them is not likely to leave a copy behind for another (a graph output keeps one either way)."""
        return all(self.rule(u) is not None for u in self.users.get(id(v), []))

    def sink(self, n: Node) -> bool:
        """Move a Transpose on ``n``'s operands to its output, or compose two Transposes."""
        rule = self.rule(n)
        if rule == "compose":
            return self._compose(n)
        if rule == "elementwise":
            return self._elementwise(n)
        x = n.inputs[0]
        t = self.transposed(x)
        if rule is None or x is None or t is None or not self.movable(x):
            return False
        if rule == "reduction":
            return self._reduction(n, *t)
        if rule == "concat":
            return self._concat(n, t[1])
        return self._pad(n, *t) if rule == "pad" else self._slice(n, *t)

    def _compose(self, n: Node) -> bool:
        x = n.inputs[0]
        assert x is not None
        perm = transpose_perm(n)
        if self.transposed(x) is None and perm != sorted(perm):
            return self._hoist_over_pad(n, perm)
        self.transpose(x, perm, n.outputs[0], n)
        self.changed = True
        return True

    def _hoist_over_pad(self, n: Node, perm: Perm) -> bool:
        """Transpose(Pad(x)) -> Pad(Transpose(x)) when the Transpose alone reads the Pad: the Pad then
        stands before the Conv the Transpose feeds (a padded NHWC input before the first conv)."""
        y = n.inputs[0]
        p = y.producer if y is not None else None
        if y is None or p is None or p.op != "Pad" or [id(u) for u in self.users.get(id(y), [])] != [id(n)] \
                or any(v is y for v in self.graph.outputs) or not any(m is p for m in self.nodes):
            return False
        amounts = pad_amounts(p)
        x = p.inputs[0]
        assert x is not None and x.shape is not None
        self.nodes = [m for m in self.nodes if m is not p]
        key = (id(x), tuple(perm))
        if key not in self.hoisted:  # several Pads of one input (branches) share its Transpose
            moved = Value(f"{x.name}/layout", _permuted(x.shape, perm), x.dtype)
            self.transpose(x, perm, moved, n)
            self.hoisted[key] = self.get(moved)  # type: ignore[assignment]
        inputs, attrs = self._pad_operands(p, self.hoisted[key], [amounts[q] for q in perm])
        self.emit("Pad", inputs, [n.outputs[0]], attrs, p)
        self.changed = True
        return True

    def _elementwise(self, n: Node) -> bool:
        out = n.outputs[0]
        assert out.shape is not None
        rank = len(out.shape)
        tried: list[Perm] = []
        for v in n.inputs:
            t = self.transposed(v)
            # Only a Transpose as large as the output moves: behind a broadcast it would copy more.
            if t is None or v is None or v.shape != out.shape or t[1] in tried or not self.movable(v):
                continue
            perm = t[1]
            tried.append(perm)
            mark = len(self.nodes)
            ins = [self.operand(u, perm, rank, n) for u in n.inputs]
            if any(u is False for u in ins):
                del self.nodes[mark:]  # Reshapes made for operands of an attempt that failed
                continue
            self._replace(n, ins, dict(n.attrs), perm)  # type: ignore[arg-type]
            return True
        return False

    def _replace(self, n: Node, inputs: list[Value | None], attrs: dict, out_perm: Perm) -> None:
        """``n`` on the untransposed ``inputs`` with ``attrs``; its output transposed by ``out_perm``
        defines the original output."""
        out = n.outputs[0]
        assert out.shape is not None
        new = Value(f"{out.name}/layout", None, out.dtype)
        node = self.emit(n.op, inputs, [new], attrs, n)
        ((shape, dtype),) = OPS[n.op].infer(node)[:1]
        new.shape = tuple(int(d) for d in shape)
        assert np.dtype(dtype) == out.dtype and _permuted(new.shape, out_perm) == out.shape, (n.op, n.name)
        self.transpose(new, out_perm, out, n)
        self.changed = True

    def _reduction(self, n: Node, x: Value, perm: Perm) -> bool:
        rank = len(perm)
        attrs = dict(n.attrs)
        inputs = [x, *n.inputs[1:]]
        if n.op in ("ArgMax", "ArgMin"):
            axes = [int(n.attr("axis", 0)) % rank]
            attrs["axis"] = perm[axes[0]]
        else:
            axes = reduce_axes(n)
            new_axes = sorted(perm[a] for a in axes)
            if "axes" in attrs:
                attrs["axes"] = new_axes
            elif len(inputs) > 1 and inputs[1] is not None and inputs[1].size:
                inputs[1] = Graph.constant(np.array(new_axes, np.int64), f"{n.name}/axes")
        if n.attr("keepdims", 1):
            out_perm = perm
        else:  # the kept dimensions, in x's order after the reduction
            kept = [perm[d] for d in range(rank) if d not in axes]
            order = sorted(kept)
            out_perm = [order.index(k) for k in kept]
        self._replace(n, inputs, attrs, out_perm)
        return True

    def _concat(self, n: Node, perm: Perm) -> bool:
        rank = len(perm)
        mark = len(self.nodes)
        ins = [self.operand(v, perm, rank, n) for v in n.inputs]
        if any(u is False for u in ins):
            del self.nodes[mark:]
            return False
        axis = int(n.attr("axis", 0)) % rank
        self._replace(n, ins, {**n.attrs, "axis": perm[axis]}, perm)  # type: ignore[arg-type]
        return True

    def _pad(self, n: Node, x: Value, perm: Perm) -> bool:
        amounts = pad_amounts(n)  # (before, after) per dimension of the transposed input
        new = [(0, 0)] * len(perm)
        for d, p in enumerate(perm):
            new[p] = amounts[d]
        self._replace(n, *self._pad_operands(n, x, new), perm)
        return True

    @staticmethod
    def _pad_operands(n: Node, x: Value, amounts: list[tuple[int, int]]) -> tuple[list[Value | None], dict]:
        """The inputs and attributes of Pad ``n`` padding ``x`` by ``amounts`` (before, after) per dimension."""
        flat = [b for b, _ in amounts] + [e for _, e in amounts]
        attrs = dict(n.attrs)
        if "pads" in attrs:  # opset < 11
            attrs["pads"] = flat
            return [x], attrs
        # Every axis listed: the axes input (opset 18) is dropped.
        value = [v for v in n.inputs[2:3] if v is not None]
        return [x, Graph.constant(np.array(flat, np.int64), f"{n.name}/pads"), *value], attrs

    def _slice(self, n: Node, x: Value, perm: Perm) -> bool:
        rank = len(perm)
        attrs = dict(n.attrs)
        inputs = [x, *n.inputs[1:]]
        slice_params(n)  # checks the node's operands before any is rewritten
        if "starts" in attrs:  # opset < 10
            axes = attrs.get("axes", list(range(len(attrs["starts"]))))
            attrs["axes"] = [perm[int(a) % rank] for a in axes]
        else:
            starts = inputs[1]
            assert starts is not None and starts.shape is not None
            given = inputs[3] if len(inputs) > 3 else None
            axes = given.const.reshape(-1) if given is not None else np.arange(starts.size)
            new_axes = Graph.constant(np.array([perm[int(a) % rank] for a in axes], np.int64), f"{n.name}/axes")
            inputs = [*inputs[:3], new_axes, *inputs[4:5]]
        self._replace(n, inputs, attrs, perm)
        return True


def _remove_dead_moves(graph: Graph) -> None:
    """Drop Transposes, Reshapes and Pads nothing reads any more (those this pass moved or folded)."""
    live = {id(v) for v in graph.outputs}
    kept = []
    for n in reversed(graph.nodes):
        if n.op in ("Transpose", "Reshape", "Pad") and not any(id(v) in live for v in n.outputs):
            continue
        kept.append(n)
        live.update(id(v) for v in n.inputs if v is not None)
    graph.nodes = kept[::-1]


def _unit_transposes_to_reshapes(graph: Graph) -> bool:
    changed = False
    for n in graph.nodes:
        x = n.inputs[0] if n.op == "Transpose" else None
        if x is None or x.shape is None or not _moves_only_units(x.shape, transpose_perm(n)):
            continue
        shape = n.outputs[0].shape
        assert shape is not None
        n.op = "Reshape"
        n.inputs = [x, Graph.constant(np.array(shape, np.int64), f"{n.name}/shape")]
        n.attrs = {k: v for k, v in n.attrs.items() if k == "_opset"}
        changed = True
    return changed


def _fold_pads_into_convs(graph: Graph) -> bool:
    """Conv(Pad(x)) -> Conv(x) with the Pad's amounts added to the Conv's pads, for a constant Pad of
    zeros on the spatial dimensions only: a Conv pads with zeros itself."""
    changed = False
    for n in graph.nodes:
        x = n.inputs[0] if n.op == "Conv" else None
        p = x.producer if x is not None else None
        if p is None or p.op != "Pad" or p.attr("mode", "constant") != "constant" \
                or n.attr("auto_pad", "NOTSET") != "NOTSET" or any(v is x for v in n.inputs[1:]):
            continue
        value = p.inputs[2] if len(p.inputs) > 2 else None
        if (value is not None and not (value.is_const and not value.const.any())) or p.attr("value", 0.0) != 0:
            continue
        amounts = pad_amounts(p)
        spatial = amounts[2:]
        if any(a != (0, 0) for a in amounts[:2]) or any(b < 0 or e < 0 for b, e in spatial):
            continue
        pads = [int(v) for v in n.attr("pads", [0] * 2 * len(spatial))]
        k = len(spatial)
        n.attrs["pads"] = [pads[i] + spatial[i][0] for i in range(k)] + [pads[k + i] + spatial[i][1] for i in range(k)]
        n.inputs[0] = p.inputs[0]
        changed = True
    return changed


def optimize_layout(graph: Graph) -> bool:
    """Sink Transposes through layout-agnostic ops until inverse pairs cancel (see the module's doc)."""
    lay = _Layout(graph)
    for n in graph.nodes:
        n.inputs = [lay.get(v) for v in n.inputs]
        if not lay.sink(n):
            lay.nodes.append(n)
    graph.nodes = lay.nodes
    graph.outputs = [lay.get(v) for v in graph.outputs]  # type: ignore[misc]
    folded = _fold_pads_into_convs(graph)
    _remove_dead_moves(graph)
    return _unit_transposes_to_reshapes(graph) or folded or lay.changed
