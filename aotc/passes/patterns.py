"""Recognise decomposed LayerNorm and GELU, as older PyTorch/transformers exports spell them.

- ``ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div`` (Add optional) (optionally followed by
  ``Mul(gamma)`` and ``Add(beta)``) becomes one LayerNormalization over the reduced trailing axes:
  one row kernel that reads x three times instead of a reduction, a broadcast subtract and a second
  reduction each writing a tensor.
- ``0.5 * x * (1 + erf(x / sqrt(2)))`` becomes ``Gelu(x)``, and the tanh form
  ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (GPT-2's ``gelu_new``) becomes
  ``Gelu(x, approximate="tanh")``: the same loop, but one erf/tanh call instead of ~8 ops, and no
  ``powf`` for the cube.

Runs after shape inference and constant folding (constants must be folded to be recognised).
Only chains whose intermediate values have no other use are rewritten; the matched nodes are left
for removal as dead code here.
"""

from __future__ import annotations

import math

import numpy as np

from aotc.ir.graph import Graph, Node, Value
from aotc.passes.prune import replace_nodes
from aotc.passes.quantized import lower_qlinear


def _scalar(v: Value | None, want: float, rel: float = 1e-4) -> bool:
    """``v`` is a constant with one value close to ``want``."""
    if v is None or not v.is_const or v.const.size != 1 or v.const.dtype.kind != "f":
        return False
    return math.isclose(float(v.const.reshape(-1)[0]), want, rel_tol=rel)


class _Matcher:
    def __init__(self, graph: Graph) -> None:
        self.users = graph.consumers()
        self.fetched = {id(v) for v in graph.outputs}

    def only_user(self, v: Value, op: str) -> Node | None:
        """The single consumer of ``v`` if it is an ``op`` node and ``v`` is not a graph output."""
        us = self.users.get(id(v), [])
        if len(us) != 1 or id(v) in self.fetched or us[0].op != op:
            return None
        return us[0]

    def other(self, node: Node, v: Value) -> Value | None:
        """The other operand of a binary node that has ``v`` as one operand."""
        a, b = (node.inputs + [None, None])[:2]
        return b if a is v else a if b is v else None

    # -- GELU ---------------------------------------------------------------------------------
    def gelu(self, f: Node) -> tuple[Node, Node] | None:
        """From the Erf/Tanh node ``f``: (node to replace, its replacement)."""
        x = self._erf_arg(f) if f.op == "Erf" else self._tanh_arg(f)
        if x is None or x.dtype not in (np.float32, np.float64):
            return None
        add = self.only_user(f.outputs[0], "Add")
        if add is None or not _scalar(self.other(add, f.outputs[0]), 1.0):
            return None
        m1 = self.only_user(add.outputs[0], "Mul")
        if m1 is None:
            return None
        o1 = self.other(m1, add.outputs[0])
        root = None
        if o1 is x or _scalar(o1, 0.5):  # (x * (1 + f)) * 0.5 or (0.5 * (1 + f)) * x
            m2 = self.only_user(m1.outputs[0], "Mul")
            want = 0.5 if o1 is x else None
            o2 = self.other(m2, m1.outputs[0]) if m2 is not None else None
            if m2 is not None and ((want and _scalar(o2, want)) or (not want and o2 is x)):
                root = m2
        elif o1 is not None and o1.producer is not None and o1.producer.op == "Mul" \
                and self.only_user(o1, "Mul") is m1:  # (0.5 * x) * (1 + f)
            h = o1.producer
            if self.other(h, x) is not None and _scalar(self.other(h, x), 0.5):
                root = m1
        if root is None or root.outputs[0].shape != x.shape:
            return None
        attrs = {"_opset": root.attr("_opset", 20)} | ({"approximate": "tanh"} if f.op == "Tanh" else {})
        return root, Node("Gelu", [x], [root.outputs[0]], attrs, f"{root.name}/gelu")

    def _erf_arg(self, erf: Node) -> Value | None:
        u = erf.inputs[0]
        p = u.producer if u is not None else None
        if p is None or self.only_user(u, "Erf") is None:
            return None
        if p.op == "Div" and _scalar(p.inputs[1], math.sqrt(2)):
            return p.inputs[0]
        if p.op == "Mul":
            for a, b in (p.inputs, p.inputs[::-1]):
                if _scalar(b, 1 / math.sqrt(2)) and not (a is not None and a.is_const):
                    return a
        return None

    def _tanh_arg(self, tanh: Node) -> Value | None:
        """x from sqrt(2/pi) * (x + 0.044715 * x^3), with x^3 as Pow(x, 3) or x*x*x."""
        u = tanh.inputs[0]
        p = u.producer if u is not None else None
        if p is None or p.op != "Mul" or self.only_user(u, "Tanh") is None:
            return None
        inner = next((a for a, b in (p.inputs, p.inputs[::-1]) if _scalar(b, math.sqrt(2 / math.pi))), None)
        if inner is None or inner.producer is None or inner.producer.op != "Add" \
                or self.only_user(inner, "Mul") is None:
            return None
        for x, t in (inner.producer.inputs, inner.producer.inputs[::-1]):
            if t is None or t.producer is None or t.producer.op != "Mul" or self.only_user(t, "Add") is None:
                continue
            cube = next((a for a, b in (t.producer.inputs, t.producer.inputs[::-1]) if _scalar(b, 0.044715)),
                        None)
            if cube is not None and self._is_cube(cube, x):
                return x
        return None

    def _is_cube(self, c: Value, x: Value | None) -> bool:
        p = c.producer
        if p is None or x is None:
            return False
        if p.op == "Pow":
            return p.inputs[0] is x and _scalar(p.inputs[1], 3.0)
        if p.op == "Mul":  # x * (x * x) or (x * x) * x
            for a, b in (p.inputs, p.inputs[::-1]):
                if a is x and b is not None and b.producer is not None and b.producer.op == "Mul" \
                        and b.producer.inputs[0] is x and b.producer.inputs[1] is x:
                    return True
        return False

    # -- LayerNorm ----------------------------------------------------------------------------
    def layernorm(self, mean: Node) -> tuple[Node, Node] | None:
        """From the first ReduceMean: (node to replace, its LayerNormalization)."""
        x = mean.inputs[0]
        k = self._trailing_axes(mean)
        if x is None or k is None or x.dtype not in (np.float32, np.float64):
            return None
        subs = self.users.get(id(mean.outputs[0]), [])
        if not subs or any(s.op != "Sub" or s.inputs[0] is not x or s.inputs[1] is not mean.outputs[0]
                           for s in subs):
            return None
        diffs = {id(s.outputs[0]) for s in subs}
        div = sq = None
        for s in subs:
            for u in self.users.get(id(s.outputs[0]), []):
                if u.op == "Div" and u.inputs[0] is s.outputs[0]:
                    div = u
                elif (u.op == "Pow" and _scalar(u.inputs[1], 2.0)) or \
                        (u.op == "Mul" and u.inputs[0] is u.inputs[1] is s.outputs[0]):
                    sq = u
                else:
                    return None
        if div is None or sq is None:
            return None
        var = self.only_user(sq.outputs[0], "ReduceMean")
        if var is None or self._trailing_axes(var) != k:
            return None
        # The dynamo exporter drops a tiny epsilon (1e-12) altogether: Sqrt right after the mean.
        add = self.only_user(var.outputs[0], "Add")
        eps = self.other(add, var.outputs[0]) if add is not None else None
        if add is not None and (eps is None or not eps.is_const or eps.const.size != 1):
            return None
        sqrt = self.only_user((add or var).outputs[0], "Sqrt")
        if sqrt is None or div.inputs[1] is not sqrt.outputs[0] or self.only_user(sqrt.outputs[0], "Div") is None \
                or id(div.inputs[0]) not in diffs:
            return None
        rank = len(x.shape)
        norm_shape = tuple(x.shape[rank - k:])
        root, scale, bias = div, None, None
        mul = self.only_user(div.outputs[0], "Mul")
        g = self.other(mul, div.outputs[0]) if mul is not None else None
        if g is not None and self._row_param(g, norm_shape):
            root, scale = mul, g
            badd = self.only_user(mul.outputs[0], "Add")
            b = self.other(badd, mul.outputs[0]) if badd is not None else None
            if b is not None and self._row_param(b, norm_shape):
                root, bias = badd, b
        if root.outputs[0].shape != x.shape:
            return None
        if scale is None:
            # One 1 broadcast along the row: a constant of the row's size would grow with the tensor.
            scale = Graph.constant(np.ones(1, x.dtype), f"{root.name}/ones")
        epsilon = float(eps.const.reshape(-1)[0]) if eps is not None else 0.0
        attrs = {"_opset": root.attr("_opset", 17), "axis": rank - k, "epsilon": epsilon}
        inputs = [x, scale] + ([bias] if bias is not None else [])
        return root, Node("LayerNormalization", inputs, [root.outputs[0]], attrs, f"{root.name}/layernorm")

    @staticmethod
    def _trailing_axes(r: Node) -> int | None:
        """k when ``r`` is a keepdims ReduceMean over the last k axes of its input."""
        x = r.inputs[0]
        if x is None or x.shape is None or not r.attr("keepdims", 1):
            return None
        axes = r.attr("axes")
        if axes is None and len(r.inputs) > 1 and r.inputs[1] is not None and r.inputs[1].is_const:
            axes = r.inputs[1].const.reshape(-1).tolist()
        if not axes:
            return None
        rank = len(x.shape)
        norm = sorted(int(a) % rank for a in axes)
        return len(norm) if norm == list(range(rank - len(norm), rank)) else None

    @staticmethod
    def _row_param(v: Value, norm_shape: tuple[int, ...]) -> bool:
        """A constant gamma/beta that varies only along the normalized axes (a suffix of them)."""
        if not v.is_const:
            return False
        shape = list(v.shape)
        while shape and shape[0] == 1:
            shape.pop(0)
        return len(shape) <= len(norm_shape) and (not shape or tuple(shape) == norm_shape[-len(shape):])


def rewrite_patterns(graph: Graph) -> bool:
    packed = lower_qlinear(graph)  # QLinearConv -> aotc.QLinearConv with packed weights
    m = _Matcher(graph)
    replaced: dict[int, Node] = {}
    for n in graph.nodes:
        if n.op in ("Erf", "Tanh"):
            hit = m.gelu(n)
        elif n.op == "ReduceMean":
            hit = m.layernorm(n)
        else:
            continue
        if hit is not None and id(hit[0]) not in replaced:
            replaced[id(hit[0])] = hit[1]
    if not replaced:
        return packed
    replace_nodes(graph, replaced)
    return True
