"""Feeds and fetches: choosing the graph's inputs and outputs, and removing what they do not need."""

from __future__ import annotations

from aotc.config import Config, TensorId
from aotc.errors import AotcError
from aotc.ir.graph import Graph, Node, Value


def _lookup(graph: Graph, tid: TensorId, what: str) -> Value:
    by_tensor: dict[str, Value] = {}
    by_node: dict[str, list[Value]] = {}
    for v in graph.values():
        by_tensor.setdefault(v.name, v)
    for n in graph.nodes:
        by_node.setdefault(n.name, n.outputs)
    if tid.node_name in by_tensor and tid.output_index == 0:
        return by_tensor[tid.node_name]
    if tid.node_name in by_node:
        outs = by_node[tid.node_name]
        if tid.output_index >= len(outs):
            raise AotcError(f"{what} {tid.node_name!r}: node has no output {tid.output_index}")
        return outs[tid.output_index]
    raise AotcError(f"{what} {tid.node_name!r}: no tensor or node of that name in the model")


def apply_config(graph: Graph, config: Config) -> None:
    """Make the config's feeds the inputs and its fetches the outputs, cutting at fed tensors."""
    if config.variables:
        raise AotcError(f"config variable {config.variables[0].node_name!r}: only a TensorFlow GraphDef has "
                        "variables (for a SavedModel, use --variables-to-feed)")
    fetches = [_lookup(graph, f.id, "fetch") for f in config.fetches]
    for i, v in enumerate(fetches):  # e.g. a tensor's name and its node's name: one buffer, two outputs
        first = next(j for j, w in enumerate(fetches) if w is v)
        if first != i:
            raise AotcError(f"fetch {config.fetches[i].id.node_name!r} is the same tensor as fetch "
                            f"{config.fetches[first].id.node_name!r}; fetch it once")
    inputs: list[Value] = []
    for feed in config.feeds:
        v = _lookup(graph, feed.id, "feed")
        if feed.dtype is not None and v.dtype is not None and feed.dtype != v.dtype:
            raise AotcError(f"feed {feed.id.node_name!r}: config type {feed.dtype} but the model has "
                            f"{v.dtype}")
        if v in graph.inputs:
            new = v
            if feed.shape is not None:
                if v.shape is not None and v.shape != feed.shape:
                    raise AotcError(f"feed {feed.id.node_name!r}: config shape {list(feed.shape)} but "
                                    f"the model has {list(v.shape)}")
                v.shape = feed.shape
        else:  # feeding an intermediate (or constant) tensor: it becomes an input, upstream is cut
            dt = feed.dtype if feed.dtype is not None else v.dtype
            if dt is None:
                raise AotcError(f"feed {feed.id.node_name!r}: cannot tell its element type; give "
                                "'type' in the config")
            new = Value(v.name, feed.shape, dt)
            graph.replace_uses(v, new)
            fetches = [new if f is v else f for f in fetches]
            if new.shape is None:
                raise AotcError(f"feed {feed.id.node_name!r} is an intermediate tensor: give its shape "
                                "in the config")
        if feed.name:
            new.name = feed.name
        if any(new is x for x in inputs):
            raise AotcError(f"feed {feed.id.node_name!r} given twice")
        inputs.append(new)
    if config.feeds:  # an input updated in place stays an argument, after the feeds
        graph.inputs = inputs + [u for u in graph.updates if not any(u is x for x in inputs)]
    graph.outputs = fetches + graph.outputs[graph.num_fetches:]  # the updates' values stay last
    for f, v in zip(config.fetches, fetches, strict=True):
        if f.name:
            v.name = f.name
    prune(graph)
    if not config.feeds:  # only fetches given: the model's inputs that they still need
        used = {id(v) for n in graph.nodes for v in n.inputs if v is not None} | {id(v) for v in graph.outputs}
        used |= {id(v) for v in graph.updates}
        graph.inputs = [v for v in graph.inputs if id(v) in used]


def without_dead(nodes: list[Node], outputs: list[Value]) -> list[Node]:
    """``nodes`` (in order) less those that no value of ``outputs`` needs."""
    live = {id(v) for v in outputs}
    keep = []
    for n in reversed(nodes):
        if any(id(v) in live for v in n.outputs):
            keep.append(n)
            live.update(id(v) for v in n.inputs if v is not None)
    return keep[::-1]


def replace_nodes(graph: Graph, replaced: dict[int, Node]) -> None:
    """Put ``replaced[id(n)]`` in place of each node ``n`` it names, then drop the nodes no output needs
    any more (those the replacements made dead)."""
    nodes = [replaced.get(id(n), n) for n in graph.nodes]
    for n in nodes:
        for v in n.outputs:
            v.producer = n
    graph.nodes = without_dead(nodes, graph.outputs)


def prune(graph: Graph) -> bool:
    """Remove nodes whose outputs no fetch needs (the graph inputs stay: they are the API)."""
    keep = without_dead(graph.nodes, graph.outputs)
    changed = len(keep) != len(graph.nodes)
    graph.nodes = keep
    input_ids = {id(v) for v in graph.inputs}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and not v.is_const and v.producer is None and id(v) not in input_ids:
                raise AotcError(f"tensor {v.name!r} is needed by the fetches but is not fed")
    return changed
