"""TensorFlow GraphDef -> IR.

The graph is cut to what its fetches need, stopping at fed tensors (tfcompile's pruning rule), before
anything is translated, so a branch nobody fetches may use any op, and every unsupported op the
fetches need is reported in one error. The needed nodes are then translated in dependency order, each
by its function in the op table (aotc.frontends.tensorflow.context.TF_OPS). Function calls are
inlined first (inline.py).

Variables are constants (a SavedModel's checkpoint values), or arguments: tfcompile's config
``variable`` entries, a SavedModel's ``--variables-to-feed``. The assignments the fetches depend on,
through data or control edges (a tf.function's outputs depend on its stateful ops through control
edges), are translated in an order that respects both kinds of edge, so a read sees exactly the
assignments that precede it, as TensorFlow's automatic control dependencies order them. A variable's
final value becomes an in-place update of its argument (Graph.add_update); assigning a read-only or
constant variable is refused. Other control inputs (``^name``) only order side effects and are ignored.

Tensor names keep TensorFlow's spelling: output 0 of node ``n`` is ``n``, output k is ``n:k``.
Without fetches, the outputs are the tensors no node reads (a frozen Keras model's ``Identity``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aotc.config import Config, Feed, TensorId, Variable
from aotc.errors import AotcError, UnsupportedOpsError
from aotc.frontends.tensorflow import array, elementwise, nn  # noqa: F401 - they fill the op table
from aotc.frontends.tensorflow.context import OPSET, TF_OPS, Ctx
from aotc.frontends.tensorflow.dilated import fold_space_to_batch
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
# variable to be an in-place argument; one that nothing fetched depends on is dropped. The value each
# assigns: input 1 (Assign*), or the old value plus or minus it.
ASSIGN_OPS = {"AssignVariableOp": None, "Assign": None, "AssignAddVariableOp": "Add", "AssignAdd": "Add",
              "AssignSubVariableOp": "Sub", "AssignSub": "Sub"}
UPDATE_OPS = frozenset({*ASSIGN_OPS, "ResourceScatterUpdate", "ResourceScatterAdd", "ScatterUpdate"})
# Ops that read a variable through their input 0, a handle: they read its current value.
_READERS = frozenset({"ReadVariableOp", "ResourceGather"})
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "Snapshot"})
# Ops handled here rather than by the table: they translate to nothing or to a graph input.
FRONTEND_OPS = frozenset({"Placeholder", "NoOp", *VARIABLE_OPS, *ASSIGN_OPS})


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
    variables = config.variables if config else []
    nodes = {n.name: n for n in gd.node}
    for var in variables:
        _check_variable(var, nodes.get(var.node_name))
        feeds[(var.node_name, 0)] = Feed(TensorId(var.node_name, 0), var.shape, var.label, var.dtype)
    if config is not None and config.fetches:
        fetches = [((f.id.node_name, f.id.output_index), f.name) for f in config.fetches]
    elif outputs:
        fetches = [(tensor_key(o), "") for o in outputs]
    else:
        fetches = [(k, "") for k in default_outputs(gd)]
    return translate(gd, shapes, name, feeds, fetches, constant_fetches=not (config is not None and config.fetches),
                     writable=[v.node_name for v in variables if not v.readonly])


def _check_variable(var: Variable, node: Any) -> None:
    """A config ``variable`` names a variable node whose type and shape it agrees with (tfcompile asks
    for both; aotc takes them from the node where the config leaves them out)."""
    where = f"config variable {var.node_name!r} (line {var.line})"
    if node is None:
        raise AotcError(f"{where}: no node of that name in the graph")
    if node.op not in VARIABLE_OPS:
        raise AotcError(f"{where}: {node.op} node {node.name!r} is not a variable "
                        f"({', '.join(sorted(VARIABLE_OPS))})")
    attr = {k: attr_value(v, f"{node.op} node {node.name!r}: attribute {k}") for k, v in node.attr.items()
            if k in ("dtype", "shape")}
    dt = to_numpy(attr["dtype"], where) if "dtype" in attr else None
    if var.dtype is not None and dt is not None and var.dtype != dt:
        raise AotcError(f"{where}: type {var.dtype} but {node.op} node {node.name!r} holds {dt}")
    dims = attr.get("shape")
    if var.shape is not None and dims is not None and (
            len(dims) != len(var.shape) or any(d is not None and d != x for d, x in zip(dims, var.shape, strict=True))):
        raise AotcError(f"{where}: shape {list(var.shape)} but {node.op} node {node.name!r} has "
                        f"{[d if d is not None else '?' for d in dims]}")


def translate(gd: Any, shapes: dict[str, tuple[int, ...]] | None, name: str, feeds: dict[TensorKey, Any],
              fetches: list[tuple[TensorKey, str]], constant_fetches: bool = True, unused_feeds: bool = False,
              variables: Mapping[str, np.ndarray] | None = None, writable: Collection[str] = ()) -> Graph:
    """The Graph computing ``fetches`` (tensor, output name) from ``feeds`` (tensor -> Feed).

    tfcompile's config rules make a constant fetch an error (unless ``constant_fetches``) and a feed no
    fetch needs (unless ``unused_feeds``: a SavedModel's signature keeps such an input). ``variables``
    holds the values of the variable nodes (VarHandleOp, VariableV2) by node name, read when a fetch
    needs them. A fed variable node is an argument, placed after the other inputs; those in
    ``writable`` may be assigned, and become in-place arguments."""
    nodes: dict[str, Any] = {}
    for n in gd.node:
        if n.name in nodes:
            raise AotcError(f"two nodes are named {n.name!r}")
        nodes[n.name] = n
    nodes = fold_space_to_batch(nodes)
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

    assigns = assignments(nodes, [k for k, _ in fetches], feeds)
    order, used_feeds = _needed(nodes, [k for k, _ in fetches] + [(a, 0) for a in assigns], feeds)
    order = _with_control_order(order, nodes)
    var_feeds = [k for k in feeds if nodes[k[0]].op in VARIABLE_OPS and k[1] == 0]
    for key in feeds:
        if key not in used_feeds and not unused_feeds and key not in var_feeds:
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
    env_inputs = dict(env)  # a fed variable's entry in env is its current value, this its argument
    for n in order:
        if n.op == "NoOp":
            continue
        if n.op in ASSIGN_OPS:
            _assign(g, n, nodes, env, {k[0] for k in var_feeds}, writable)
            continue
        if n.op == "Placeholder":
            env[(n.name, 0)] = _input(g, n, (n.name, 0), None, shapes)
            continue
        if n.op in VARIABLE_OPS:
            if variables is None or n.name not in variables:
                raise AotcError(f"{n.op} node {n.name!r} is a variable, and the graph holds no value for it: "
                                "compile the SavedModel, freeze the graph, or make it an argument (a config "
                                "`variable` entry)")
            env[(n.name, 0)] = Graph.constant(variables[n.name], n.name)
            continue
        ins = []
        for i, k in enumerate(_data_inputs(n)):
            if i == 0 and n.op in _READERS:  # the variable's value now, whichever handle names it
                k = (_variable_of(nodes, k), 0)
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

    var_inputs = [env_inputs[k] for k in var_feeds]
    g.inputs = [v for v in g.inputs if not any(v is x for x in var_inputs)]
    if len(feeds) == len(var_feeds):  # the placeholders in the graph's order, not the order reached
        position = {name: i for i, name in enumerate(nodes)}
        g.inputs.sort(key=lambda v: position[v.name])
    g.inputs += var_inputs  # variables last, as tfcompile orders its arguments
    g.variables = {v.name: k[0] not in writable for k, v in zip(var_feeds, var_inputs, strict=True)}
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
    for key in var_feeds:
        if env[key] is not env_inputs[key]:
            g.add_update(env_inputs[key], env[key])
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
    used = {key for key in fetches if key in feeds}

    def inputs(name: str) -> list[str]:
        found = []
        for k in _data_inputs(nodes[name]):
            if k in feeds:
                used.add(k)
            elif k[0] not in nodes:
                raise AotcError(f"{nodes[name].op} node {name!r} reads {tensor_name(k)!r}, which no node defines")
            else:
                found.append(k[0])
        return found

    order = _inputs_first([key[0] for key in fetches if key not in feeds], inputs, "graph has a cycle through node {}")
    return [nodes[name] for name in order], used


def assignments(nodes: dict[str, Any], fetches: list[TensorKey], feeds: dict[TensorKey, Any]) -> list[str]:
    """The variable updates a fetch depends on, through data or control edges (a function's stateful
    ops are its call's control inputs, see inline.py), in the graph's order."""
    seen: set[str] = set()
    stack = [k[0] for k in fetches if k not in feeds]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        for i in nodes[name].input:
            if i.startswith("^"):
                stack.append(i[1:])
            elif tensor_key(i) not in feeds:
                stack.append(tensor_key(i)[0])
    return [n for n in nodes if n in seen and nodes[n].op in UPDATE_OPS]


def _with_control_order(order: list[Any], nodes: dict[str, Any]) -> list[Any]:
    """``order`` (inputs first) also respecting the control edges between its nodes: a variable read
    that TensorFlow orders after an assignment sees the assigned value, one ordered before it does not."""
    if not any(i.startswith("^") for n in order for i in n.input):
        return order
    member = {n.name for n in order}

    def inputs(name: str) -> list[str]:
        deps = (tensor_key(i.lstrip("^"))[0] for i in reversed(nodes[name].input))
        return [d for d in deps if d in member]

    return [nodes[name] for name in _inputs_first([n.name for n in order], inputs,
                                                  "graph has a cycle through node {} (data and control edges)")]


def _inputs_first(starts: list[str], inputs: Callable[[str], list[str]], cycle: str) -> list[str]:
    """The nodes reached from ``starts`` through ``inputs``, each after its inputs (a depth-first walk
    with a stack: graphs can be deeper than Python's recursion limit); a cycle is an AotcError, ``cycle``
    with the node's name."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    out: list[str] = []
    for start in starts:
        stack = [(start, False)]
        while stack:
            name, expanded = stack.pop()
            if expanded:
                state[name] = 2
                out.append(name)
                continue
            if state.get(name) == 2:
                continue
            state[name] = 1
            stack.append((name, True))
            for d in inputs(name):
                if state.get(d) == 1:
                    raise AotcError(cycle.format(repr(d)))
                if state.get(d) != 2:
                    stack.append((d, False))
    return out


def _variable_of(nodes: dict[str, Any], ref: str | TensorKey) -> str:
    """The variable node a handle comes from, through identities (the node itself if it is none)."""
    name, k = tensor_key(ref) if isinstance(ref, str) else ref
    while name in nodes and nodes[name].op in _PASS_THROUGH:
        data = _data_inputs(nodes[name])
        name, k = data[k if nodes[name].op == "IdentityN" else 0]
    return name


def _assign(g: Graph, n: Any, nodes: dict[str, Any], env: dict[TensorKey, Value], fed: set[str],
            writable: Collection[str]) -> None:
    """Translate an assignment: the variable's current value (``env``) becomes the assigned one."""
    data = _data_inputs(n)
    var = _variable_of(nodes, data[0]) if len(data) == 2 else None
    if var is None or var not in nodes or nodes[var].op not in VARIABLE_OPS:
        raise AotcError(f"{n.op} node {n.name!r} does not assign a variable node aotc can follow")
    if var not in writable:
        how = ("is a read-only argument (readonly: true in the config)" if var in fed else
               "is frozen into a constant: make it an in-place argument (a config `variable` entry, or "
               "--variables-to-feed for a SavedModel)")
        raise AotcError(f"{n.op} node {n.name!r} assigns variable {var!r}, which {how}")
    ctx = Ctx(g, n, [env[(var, 0)], env[data[1]]])
    old, value = ctx.x(0), ctx.x(1)
    if value.dtype != old.dtype or value.shape != old.shape:
        raise ctx.error(f"assigns a {value.type_str()} value to variable {var!r} of type {old.type_str()}")
    op = ASSIGN_OPS[n.op]
    new = value if op is None else ctx.emit(op, [old, value])
    if op is not None:
        new.name = n.name
    env[(var, 0)] = new
    if n.op in ("Assign", "AssignAdd", "AssignSub"):  # TF1's ref variables: the op outputs the new value
        env[(n.name, 0)] = new


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
