"""Control flow rewritten into plain dataflow before import, since aotc compiles one static graph.

``If``: with a constant condition the taken branch's nodes replace the node; otherwise both branches
are computed and each output is ``Where(cond, then, else)``, so their outputs must agree in shape
(checked when the graph's shapes are inferred). Names defined inside a branch get a prefix unique to
the node; names a branch reads from the enclosing graph are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotc.errors import AotcError

INLINED_OPS = frozenset({"If"})


def inline_control_flow(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every ``If`` node (at any depth of nesting) replaced by plain nodes."""
    if not any(n.op_type in INLINED_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = {i.name: i for i in out.graph.initializer}
    consts |= {n.output[0]: n.attribute[0].t for n in out.graph.node
               if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    nodes, inits = _inline(list(out.graph.node), consts, [0], {})
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(inits)
    return out


def _inline(nodes: list[onnx.NodeProto], consts: dict[str, onnx.TensorProto], counter: list[int],
            outer: dict[str, str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """``outer`` renames the names of enclosing branches that nested branches may read."""
    res: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    for node in nodes:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            res.append(node)
            continue
        counter[0] += 1
        prefix = f"if{counter[0]}"
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        if set(branches) != {"then_branch", "else_branch"}:
            raise AotcError(f"If node {node.name!r}: needs then_branch and else_branch graphs")
        cond = consts.get(node.input[0])  # the input is already renamed
        if cond is not None:
            value = numpy_helper.to_array(cond)
            if value.size != 1:
                raise AotcError(f"If node {node.name!r}: the condition must hold one element")
            taken = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
            outs = _branch(branches[taken], f"{prefix}_{taken[:4]}_", consts, counter, outer, res, inits)
            res += [helper.make_node("Identity", [o], [n]) for o, n in zip(outs, node.output, strict=False)]
            continue
        then = _branch(branches["then_branch"], f"{prefix}_then_", consts, counter, outer, res, inits)
        other = _branch(branches["else_branch"], f"{prefix}_else_", consts, counter, outer, res, inits)
        if len(then) != len(node.output) or len(other) != len(node.output):
            raise AotcError(f"If node {node.name!r}: the branches must produce {len(node.output)} outputs")
        # The condition is a one-element tensor of any rank; as a scalar it broadcasts without
        # changing the outputs' rank.
        shape, scalar = f"{prefix}_scalar_shape", f"{prefix}_cond"
        inits.append(numpy_helper.from_array(np.zeros(0, np.int64), shape))
        res.append(helper.make_node("Reshape", [node.input[0], shape], [scalar]))
        res += [helper.make_node("Where", [scalar, t, e], [o])
                for t, e, o in zip(then, other, node.output, strict=True)]
    return res, inits


def _branch(g: onnx.GraphProto, prefix: str, consts: dict[str, onnx.TensorProto], counter: list[int],
            outer: dict[str, str], res: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> list[str]:
    """Append a branch's nodes (renamed, nested Ifs inlined) to ``res``; return its output names."""
    if g.input:
        raise AotcError("an If branch must not declare inputs")
    names = dict(outer)
    names |= {n: prefix + n for n in [i.name for i in g.initializer] + [o for n in g.node for o in n.output if o]}

    def ren(name: str) -> str:
        return names.get(name, name)

    for init in g.initializer:
        t = onnx.TensorProto()
        t.CopyFrom(init)
        t.name = ren(init.name)
        inits.append(t)
        consts[t.name] = t
    renamed = []
    for n in g.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.input[:] = [ren(i) if i else i for i in n.input]
        m.output[:] = [ren(o) if o else o for o in n.output]
        if m.op_type == "Constant" and m.attribute and m.attribute[0].name == "value":
            consts[m.output[0]] = m.attribute[0].t
        renamed.append(m)
    nodes, more = _inline(renamed, consts, counter, names)
    res += nodes
    inits += more
    return [ren(o.name) for o in g.output]
