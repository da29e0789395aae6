"""What ``aotc inspect`` shows of a GraphDef or a SavedModel: inputs, outputs, ops and their support."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotc.frontends.tensorflow.context import TF_OPS
from aotc.frontends.tensorflow.importer import FRONTEND_OPS, assignments, default_outputs, tensor_key, tensor_name
from aotc.frontends.tensorflow.inline import inline_functions
from aotc.frontends.tensorflow.proto import load_graphdef
from aotc.frontends.tensorflow.savedmodel import (
    DEFAULT_SIGNATURE,
    DEFAULT_TAG_SET,
    is_saved_model,
    load_saved_model,
    meta_graph,
    resolve_signature,
    signature_names,
)
from aotc.frontends.tensorflow.tensors import attr_value, to_numpy
from aotc.ir import dtypes


@dataclass
class GraphSummary:
    inputs: list[tuple[str, str]]  # name, "float32 [?,12,12,3]"
    outputs: list[str]
    ops: dict[str, tuple[int, bool]]  # op -> (nodes, supported)
    kind: str = "TensorFlow GraphDef"


def _type_text(n: Any) -> str:
    what = f"{n.op} node {n.name!r}"
    dt = dtypes.dtype_name(to_numpy(n.attr["dtype"].type, what))
    dims = attr_value(n.attr["shape"], what) if "shape" in n.attr else None
    return f"{dt} " + ("(rank unknown)" if dims is None else "[" + ",".join("?" if d is None else str(d)
                                                                          for d in dims) + "]")


def _ops(nodes: Any) -> dict[str, tuple[int, bool]]:
    ops: dict[str, tuple[int, bool]] = {}
    for n in nodes:
        count, _ = ops.get(n.op, (0, False))
        ops[n.op] = (count + 1, n.op in TF_OPS or n.op in FRONTEND_OPS)
    return ops


def summarize(source: str | Path | Any) -> GraphSummary:
    if isinstance(source, (str, Path)) and is_saved_model(source):
        return _summarize_saved_model(Path(source))
    gd = load_graphdef(source)
    if gd.library.function:
        gd = inline_functions(gd)
    inputs = [(n.name, _type_text(n)) for n in gd.node if n.op == "Placeholder"]
    return GraphSummary(inputs, [tensor_name(k) for k in default_outputs(gd)], _ops(gd.node))


def _summarize_saved_model(path: Path) -> GraphSummary:
    """The default signature's inputs (by key), outputs, and the ops of what they need."""
    mg = meta_graph(load_saved_model(path), path, DEFAULT_TAG_SET)
    names = signature_names(mg)
    chosen = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in names else names[0] if names else None
    kind = (f"TensorFlow SavedModel; MetaGraph {DEFAULT_TAG_SET!r}, signatures: {', '.join(names) or 'none'}"
            + (f"; showing {chosen!r}" if chosen else ""))
    if chosen is None:
        return GraphSummary([], [], {}, kind)
    sig = resolve_signature(path, DEFAULT_TAG_SET, chosen)
    nodes = {n.name: n for n in sig.graph.node}
    inputs = [(key, _type_text(nodes[t[0]]) if nodes.get(t[0]) is not None and "dtype" in nodes[t[0]].attr
               else "?") for key, t in sig.inputs]
    fed = {t for _, t in sig.inputs}
    fetched = [t for _, t in sig.outputs if t not in fed]  # and the variable updates they depend on
    needed, stack = set(), [t[0] for t in fetched] + assignments(nodes, fetched, dict.fromkeys(fed))
    while stack:
        name = stack.pop()
        if name in needed or name not in nodes:
            continue
        needed.add(name)
        stack.extend(tensor_key(i)[0] for i in nodes[name].input if not i.startswith("^") and tensor_key(i) not in fed)
    return GraphSummary(inputs, [key for key, _ in sig.outputs], _ops(n for n in sig.graph.node if n.name in needed),
                        kind)
