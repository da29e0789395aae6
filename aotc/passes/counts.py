"""Count outputs for data-dependent outputs (NonZero, Unique, NonMaxSuppression; see aotc/ops/dynamic.py)."""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Graph, Value
from aotc.ops.dynamic import COUNT_ATTR, bounded_outputs
from aotc.passes.prune import prune


def expose_counts(graph: Graph) -> dict[int, tuple[int, int]]:
    """Give every fetched data-dependent output its count output, placed right after it in
    ``graph.outputs``; returns output position -> (data-dependent axis, negative when counted from
    the end, count output position).

    Runs before the passes, on the graph as imported and cut to the fetches. A bounded tensor read
    by another node is refused here: its consumer would need the true shape at compile time."""
    if not any(bounded_outputs(n) for n in graph.nodes):
        return {}
    prune(graph)  # a dead node's reader does not count
    readers = graph.consumers()
    fetched = {id(v) for v in graph.outputs}
    taken = {v.name for v in graph.values()} | {v.name for v in graph.inputs}
    axis_of: dict[int, int] = {}
    count_of: dict[int, Value] = {}
    for node in graph.nodes:
        axes = bounded_outputs(node)
        if not axes or node.attr(COUNT_ATTR):
            continue
        for i in axes:
            users = readers.get(id(node.outputs[i]), [])
            if users:
                raise AotcError(f"{node.op} node {node.name!r}: its output {node.outputs[i].name!r} has a "
                                f"data-dependent size, so it can only be a graph output, but node "
                                f"{users[0].name!r} ({users[0].op}) reads it")
        outs = [node.outputs[i] for i in axes if id(node.outputs[i]) in fetched]
        if not outs:
            continue
        first = min(outs, key=lambda v: next(j for j, o in enumerate(graph.outputs) if o is v))
        name, j = f"{first.name}_count", 1
        while name in taken:  # a model may already use the name
            j += 1
            name = f"{first.name}_count_{j}"
        taken.add(name)
        count = Value(name, (), np.dtype(np.int64), node)
        node.outputs.append(count)
        node.attrs[COUNT_ATTR] = 1
        for i, a in axes.items():
            axis_of[id(node.outputs[i])] = a
            count_of[id(node.outputs[i])] = count
    if not count_of:
        return {}
    outputs: list[Value] = []
    placed: set[int] = set()
    for v in graph.outputs:
        outputs.append(v)
        c = count_of.get(id(v))
        if c is not None and id(c) not in placed:
            outputs.append(c)
            placed.add(id(c))
    graph.outputs = outputs
    position = {id(v): j for j, v in enumerate(outputs)}
    return {j: (axis_of[id(v)], position[id(count_of[id(v)])])
            for j, v in enumerate(outputs) if id(v) in count_of}
