"""TensorFlow GraphDef -> IR.

The graph is cut to what its fetches need, stopping at fed tensors (tfcompile's pruning rule), before
anything is translated, so a branch nobody fetches may use any op, and every unsupported op the
fetches need is reported in one error. The needed nodes are then translated in dependency order, each
by its function in the op table (aotc.frontends.tensorflow.context.TF_OPS). Function calls are
inlined first (inline.py). Control inputs (``^name``) only order side effects: they are ignored,
except that a fetch depending on a variable update through them is refused.

Tensor names keep TensorFlow's spelling: output 0 of node ``n`` is ``n``, output k is ``n:k``.
Without fetches, the outputs are the tensors no node reads (a frozen Keras model's ``Identity``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotc.config import Config
from aotc.errors import AotcError, UnsupportedOpsError
from aotc.frontends.tensorflow import array, elementwise, nn  # noqa: F401 - they fill the op table
from aotc.frontends.tensorflow.context import OPSET, TF_OPS, Ctx
from aotc.frontends.tensorflow.inline import inline_functions
from aotc.frontends.tensorflow.proto import load_graphdef
from aotc.frontends.tensorflow.tensors import attr_value, to_numpy
from aotc.ir.graph import Graph, Value
from aotc.passes.prune import prune

TensorKey = tuple[str, int]
# Attributes that give a node's output 0 type, most specific first (Shape's T is its input's type).
_TYPE_ATTRS = ("dtype", "out_type", "output_type", "DstT", "T")
_BOOL_OPS = frozenset({"Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual", "IsNan", "IsInf",
                       "IsFinite", "LogicalAnd", "LogicalOr", "LogicalNot"})
# Variables: a node whose output is the variable (a resource handle, or TF1's reference), read from
# the checkpoint. Their readers (ReadVariableOp, ResourceGather) are in the op table.
VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
# Ops that update a variable: a fetch that depends on one (through control edges too) needs the
# variable to be an in-place argument; one that nothing fetched depends on is dropped.
UPDATE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign", "AssignAdd",
                        "AssignSub", "ResourceScatterUpdate", "ResourceScatterAdd", "ScatterUpdate"})
# Ops handled here rather than by the table: they translate to nothing or to a graph input.
FRONTEND_OPS = frozenset({"Placeholder", "NoOp", *VARIABLE_OPS})


def tensor_key(name: str) -> TensorKey:
    node, _, index = name.partition(":")
    try:
        return node, int(index) if index else 0
    except ValueError:
        raise AotcError(f"tensor name {name!r} is not 'node' or 'node:index'") from None


def tensor_name(key: TensorKey) -> str:
    return key[0] if key[1] == 0 else f"{key[0]}:{key[1]}"


def _data_inputs(node: Any) -> list[TensorKey]:
    return [tensor_key(i) for i in node.input if not i.startswith("^")]


def import_graphdef(source: str | Path | Any, shapes: dict[str, tuple[int, ...]] | None = None,
                    name: str = "model", config: Config | None = None,
                    outputs: list[str] | None = None) -> Graph:
    """Translate a frozen GraphDef (a ``.pb``/``.pbtxt`` path or the message) into a Graph.

    ``shapes`` pins placeholder shapes by node name (required for unknown dimensions). ``config``'s
    feeds and fetches choose the inputs and outputs as tfcompile's do; ``outputs`` (tensor names) is a
    shorter way to give only fetches."""
    gd = load_graphdef(source)
    if gd.library.function:
        gd = inline_functions(gd)
    feeds = {(f.id.node_name, f.id.output_index): f for f in (config.feeds if config else [])}
    if config is not None and config.fetches:
        fetches = [((f.id.node_name, f.id.output_index), f.name) for f in config.fetches]
    elif outputs:
        fetches = [(tensor_key(o), "") for o in outputs]
    else:
        fetches = [(k, "") for k in default_outputs(gd)]
    return translate(gd, shapes, name, feeds, fetches, constant_fetches=not (config is not None and config.fetches))


def translate(gd: Any, shapes: dict[str, tuple[int, ...]] | None, name: str, feeds: dict[TensorKey, Any],
              fetches: list[tuple[TensorKey, str]], constant_fetches: bool = True, unused_feeds: bool = False,
              variables: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The Graph computing ``fetches`` (tensor, output name) from ``feeds`` (tensor -> Feed).

    tfcompile's config rules make a constant fetch an error (unless ``constant_fetches``) and a feed no
    fetch needs (unless ``unused_feeds``: a SavedModel's signature keeps such an input). ``variables``
    holds the values of the variable nodes (VarHandleOp, VariableV2) by node name, read when a fetch
    needs them."""
    nodes: dict[str, Any] = {}
    for n in gd.node:
        if n.name in nodes:
            raise AotcError(f"two nodes are named {n.name!r}")
        nodes[n.name] = n
    shapes = dict(shapes or {})
    for key, _ in fetches:
        if key[0] not in nodes:
            raise AotcError(f"fetch {tensor_name(key)!r}: no node of that name in the graph")
    for key in feeds:
        if key[0] not in nodes:
            raise AotcError(f"feed {tensor_name(key)!r}: no node of that name in the graph")
    for key in shapes:
        if key not in nodes:
            raise AotcError(f"shape given for unknown input {key!r}")

    _refuse_updates(nodes, [k for k, _ in fetches], feeds)
    order, used_feeds = _needed(nodes, [k for k, _ in fetches], feeds)
    for key in feeds:
        if key not in used_feeds and not unused_feeds:
            raise AotcError(f"feed {tensor_name(key)!r}: no fetch needs it")
    missing: dict[str, list[str]] = {}
    for n in order:
        if n.op not in TF_OPS and n.op not in FRONTEND_OPS:
            missing.setdefault(n.op, []).append(n.name)
    if missing:
        raise UnsupportedOpsError(missing)

    g = Graph(name)
    g.opset = OPSET
    env: dict[TensorKey, Value] = {}
    for key in feeds:  # config order: the feeds are the inputs, in that order
        env[key] = _input(g, nodes[key[0]], key, feeds[key], shapes)
    for n in order:
        if n.op == "NoOp":
            continue
        if n.op == "Placeholder":
            env[(n.name, 0)] = _input(g, n, (n.name, 0), None, shapes)
            continue
        if n.op in VARIABLE_OPS:
            if variables is None or n.name not in variables:
                raise AotcError(f"{n.op} node {n.name!r} is a variable, and the graph holds no value for it: "
                                "compile the SavedModel, freeze the graph, or feed the variable")
            env[(n.name, 0)] = Graph.constant(variables[n.name], n.name)
            continue
        ins = []
        for k in _data_inputs(n):
            if k not in env:
                raise AotcError(f"{n.op} node {n.name!r} reads output {k[1]} of {nodes[k[0]].op} node "
                                f"{k[0]!r}, which aotc does not compute")
            ins.append(env[k])
        ctx = Ctx(g, n, ins)
        result = TF_OPS[n.op](ctx)
        results = result if isinstance(result, list) else [result]
        created = {id(v) for v in ctx.created}
        for i, v in enumerate(results):
            if (n.name, i) in env:  # fed: the input stands for it
                continue
            if id(v) in created:  # named after the TF tensor; a passed-through value keeps its name
                v.name = tensor_name((n.name, i))
            env[(n.name, i)] = v

    if not feeds:  # the placeholders in the graph's order, not the order they were reached in
        position = {name: i for i, name in enumerate(nodes)}
        g.inputs.sort(key=lambda v: position[v.name])
    for key, fetch_name in fetches:
        if key not in env:
            raise AotcError(f"fetch {tensor_name(key)!r}: {nodes[key[0]].op} node {key[0]!r} has no output "
                            f"{key[1]} that aotc computes")
        v = env[key]
        if v.is_const and not constant_fetches:
            raise AotcError(f"fetch {tensor_name(key)!r} is a constant: nothing to compute")
        out_name = fetch_name or tensor_name(key)
        if v.is_const or any(v is x for x in g.inputs) or any(v is x for x in g.outputs):
            v = g.add_node("Identity", [v], 1, {}, out_name, out_names=[out_name]).outputs[0]
            v.shape, v.dtype = v.producer.inputs[0].shape, v.producer.inputs[0].dtype
        v.name = out_name
        g.outputs.append(v)
    prune(g)
    return g


def default_outputs(gd: Any) -> list[TensorKey]:
    """Output 0 of every node no other node reads (Const, Placeholder and NoOp aside)."""
    read = {tensor_key(i)[0] for n in gd.node for i in n.input if not i.startswith("^")}
    return [(n.name, 0) for n in gd.node if n.name not in read and n.op not in ("Const", "Placeholder", "NoOp")]


def _needed(nodes: dict[str, Any], fetches: list[TensorKey],
            feeds: dict[TensorKey, Any]) -> tuple[list[Any], set[TensorKey]]:
    """The nodes the fetches need, inputs first, not looking upstream of a fed tensor; and the feeds
    reached."""
    order: list[Any] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    used: set[TensorKey] = set()
    for key in fetches:
        if key in feeds:
            used.add(key)
            continue
        stack = [(key[0], False)]
        while stack:
            name, expanded = stack.pop()
            if expanded:
                state[name] = 2
                order.append(nodes[name])
                continue
            if state.get(name) == 2:
                continue
            state[name] = 1
            stack.append((name, True))
            for k in _data_inputs(nodes[name]):
                if k in feeds:
                    used.add(k)
                    continue
                if k[0] not in nodes:
                    raise AotcError(f"{nodes[name].op} node {name!r} reads {tensor_name(k)!r}, which no node "
                                    "defines")
                if state.get(k[0]) == 1:
                    raise AotcError(f"graph has a cycle through node {k[0]!r}")
                if state.get(k[0]) != 2:
                    stack.append((k[0], False))
    return order, used


def _refuse_updates(nodes: dict[str, Any], fetches: list[TensorKey], feeds: dict[TensorKey, Any]) -> None:
    """Refuse a variable update that a fetch depends on, through data or control edges (a function's
    stateful ops are its call's control inputs, see inline.py): compiled as a constant, the variable
    would silently keep its old value."""
    seen: set[str] = set()
    stack = [k[0] for k in fetches if k not in feeds]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        n = nodes[name]
        if n.op in UPDATE_OPS:
            target = n.input[0] if n.input else "?"
            raise AotcError(f"{n.op} node {name!r} updates variable {target!r}, which the fetches depend on: "
                            "variables updated in place are not supported yet")
        for i in n.input:
            if i.startswith("^"):
                stack.append(i[1:])
            elif tensor_key(i) not in feeds:
                stack.append(tensor_key(i)[0])


def _input(g: Graph, node: Any, key: TensorKey, feed: Any, shapes: dict[str, tuple[int, ...]]) -> Value:
    """A graph input for a placeholder or fed tensor: its type from the config or the node, its shape
    from ``shapes``, the config or the node, each checked against the others."""
    label = tensor_name(key)
    attr = {k: attr_value(v, f"{node.op} node {node.name!r}: attribute {k}") for k, v in node.attr.items()
            if k in (*_TYPE_ATTRS, "shape")}
    dt = feed.dtype if feed is not None and feed.dtype is not None else None
    if node.op in _BOOL_OPS:
        node_dt = np.dtype(np.bool_)
    else:  # the output's type, where the node's attributes say it without knowing the op's signature
        declared = next((attr[k] for k in _TYPE_ATTRS if k in attr), None)
        node_dt = None if declared is None else to_numpy(declared, f"input {label!r}")
    if dt is not None and node_dt is not None and dt != node_dt:
        raise AotcError(f"feed {label!r}: config type {dt} but the graph has {node_dt}")
    dt = dt if dt is not None else node_dt
    if dt is None:
        raise AotcError(f"feed {label!r}: cannot tell its element type; give 'type' in the config")
    dims = attr.get("shape") if node.op == "Placeholder" or node.op in VARIABLE_OPS else None
    given = [tuple(s) for s in (shapes.get(node.name), feed.shape if feed is not None else None) if s is not None]
    for s in given:
        if dims is not None and (len(s) != len(dims) or any(d is not None and d != x for d, x in
                                                            zip(dims, s, strict=True))):
            raise AotcError(f"input {label!r}: shape {list(s)} does not match the graph's "
                            f"{[d if d is not None else '?' for d in dims]}")
    if len(set(given)) > 1:
        raise AotcError(f"input {label!r}: --input-shape {list(given[0])} and the config's {list(given[1])} differ")
    if given:
        shape = given[0]
    elif dims is not None and all(d is not None for d in dims):
        shape = tuple(int(d) for d in dims)
    else:
        shown = "?" if dims is None else ",".join("?" if d is None else str(d) for d in dims)
        raise AotcError(f"input {label!r} has dynamic shape [{shown}]; pin it with --input-shape "
                        f"{node.name}=... or a shape in the feed config")
    v = Value(feed.name if feed is not None and feed.name else label, tuple(int(d) for d in shape), np.dtype(dt))
    g.inputs.append(v)
    return v
