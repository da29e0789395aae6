"""SavedModel directories -> IR: one signature of one MetaGraph, with its variables from the checkpoint.

A SavedModel is ``saved_model.pb`` (or ``.pbtxt``: a SavedModel message holding MetaGraphDefs, each
tagged, e.g. "serve", with named signatures) and ``variables/`` (a tensor-bundle checkpoint, see
bundle.py). A signature names the graph's input and output tensors by key; in TF2 they are a
placeholder and a ``StatefulPartitionedCall`` of the traced function, which receives the variables'
handles (VarHandleOp nodes) as inputs. The library's inputs and outputs are the signature's, named by
their keys and sorted by them (as saved_model_cli does).

Which checkpoint entry holds which variable is what the graph's own restore operation says
(``saver_def.restore_op_name``): it assigns ``RestoreV2`` outputs, read by checkpoint key, to the
variables. Following it works alike for TF2's restore function and TF1's ``save/restore_all``.
Variables become constants, except those named in ``variables_to_feed``, which become inputs after
the signature's (named by their ``shared_name``): in-place arguments where the function assigns them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aotc.config import Config, Feed, TensorId
from aotc.errors import AotcError
from aotc.frontends.tensorflow.bundle import Bundle
from aotc.frontends.tensorflow.importer import UPDATE_OPS, VARIABLE_OPS, TensorKey, tensor_key, translate
from aotc.frontends.tensorflow.inline import inline_functions
from aotc.frontends.tensorflow.proto import own_messages
from aotc.ir.graph import Graph
from aotc.passes.prune import apply_config

DEFAULT_TAG_SET = "serve"
DEFAULT_SIGNATURE = "serving_default"
_RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "Snapshot"})


def is_saved_model(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in ("saved_model.pb", "saved_model.pbtxt"))


def model_files(path: Path) -> list[Path]:
    """The files a SavedModel's compilation reads (for a depfile)."""
    return sorted(f for f in [*path.glob("saved_model.pb*"), *(path / "variables").glob("variables.*")] if f.is_file())


def load_saved_model(path: str | Path) -> Any:
    """The SavedModel message of directory ``path``."""
    p = Path(path)
    if not is_saved_model(p):
        raise AotcError(f"{p}: not a SavedModel directory (no saved_model.pb or saved_model.pbtxt)")
    sm = own_messages()["SavedModel"]()
    f = p / "saved_model.pb"
    try:
        if f.is_file():
            sm.ParseFromString(f.read_bytes())
        else:
            from google.protobuf import text_format

            f = p / "saved_model.pbtxt"
            text_format.Parse(f.read_text(encoding="utf-8"), sm)
    except Exception as e:  # protobuf's DecodeError/ParseError, UnicodeDecodeError
        raise AotcError(f"{f}: not a valid SavedModel ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not sm.meta_graphs:
        raise AotcError(f"{f}: not a valid SavedModel (no MetaGraphs)")
    return sm


def meta_graph(sm: Any, path: Path, tag_set: str) -> Any:
    tags = {t for t in tag_set.split(",") if t}
    found = [mg for mg in sm.meta_graphs if set(mg.meta_info_def.tags) == tags]
    if not found:
        have = "; ".join(",".join(mg.meta_info_def.tags) or "(none)" for mg in sm.meta_graphs)
        raise AotcError(f"{path}: no MetaGraph with tag set {tag_set!r} (it has: {have}); choose one with --tag-set")
    return found[0]


def signature_names(mg: Any) -> list[str]:
    return sorted(k for k in mg.signature_def if not k.startswith("__"))


@dataclass
class Signature:
    """A signature resolved against the inlined graph: keys -> tensors, and the variables it reads."""
    graph: Any  # the GraphDef with every call inlined
    inputs: list[tuple[str, TensorKey]]
    outputs: list[tuple[str, TensorKey]]
    variables: dict[str, str]  # variable node -> its checkpoint key


def resolve_signature(path: str | Path, tag_set: str = DEFAULT_TAG_SET,
                      signature: str = DEFAULT_SIGNATURE) -> Signature:
    p = Path(path)
    mg = meta_graph(load_saved_model(p), p, tag_set)
    if signature not in mg.signature_def or signature.startswith("__"):
        raise AotcError(f"{p}: no signature {signature!r} in MetaGraph {tag_set!r} (it has: "
                        f"{', '.join(signature_names(mg)) or 'none'}); choose one with --signature")
    sig = mg.signature_def[signature]

    def tensors(infos: Any, what: str) -> list[tuple[str, TensorKey]]:
        out = []
        for key in sorted(infos):
            info = infos[key]
            if info.WhichOneof("encoding") != "name":
                raise AotcError(f"signature {signature!r} {what} {key!r} is a sparse or composite tensor: "
                                "not supported")
            out.append((key, tensor_key(info.name)))
        return out
    gd = inline_functions(mg.graph_def)
    restore = mg.saver_def.restore_op_name
    return Signature(gd, tensors(sig.inputs, "input"), tensors(sig.outputs, "output"),
                     _checkpoint_keys(gd, restore.partition(":")[0]) if restore else {})


def _checkpoint_keys(gd: Any, restore_op: str) -> dict[str, str]:
    """Variable node -> checkpoint key, from the assignments the restore operation runs."""
    nodes = {n.name: n for n in gd.node}
    if restore_op not in nodes:
        raise AotcError(f"the SavedModel's restore operation {restore_op!r} is not in its graph")

    def source(ref: str) -> tuple[Any, int]:
        """The node and output a tensor reference comes from, through identities."""
        name, k = tensor_key(ref)
        while name in nodes and nodes[name].op in _PASS_THROUGH:
            data = [i for i in nodes[name].input if not i.startswith("^")]
            name, k = tensor_key(data[k if nodes[name].op == "IdentityN" else 0])
        if name not in nodes:
            raise AotcError(f"the restore operation reads {name!r}, which no node defines")
        return nodes[name], k

    keys: dict[str, str] = {}
    seen, stack = set(), [restore_op]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        n = nodes[name]
        stack.extend(tensor_key(i.lstrip("^"))[0] for i in n.input)
        if n.op not in ("AssignVariableOp", "Assign") or len(n.input) < 2:
            continue
        var, _ = source(n.input[0])
        restore, k = source(n.input[1])
        if var.op not in VARIABLE_OPS or restore.op not in _RESTORE_OPS:
            continue
        names = _strings(source(restore.input[1])[0], "tensor_names")
        slices = _strings(source(restore.input[2])[0], "shape_and_slices")
        if k >= len(names):
            raise AotcError(f"{restore.op} node {restore.name!r} has no tensor name for its output {k}")
        if k < len(slices) and slices[k]:
            raise AotcError(f"variable {var.name!r} is restored from slice {slices[k]!r} of {names[k]!r}: "
                            "partitioned variables are not supported")
        keys[var.name] = names[k]
    return keys


def _strings(node: Any, what: str) -> list[str]:
    if node.op != "Const":
        raise AotcError(f"the restore operation's {what} come from {node.op} node {node.name!r}, not a constant")
    return [s.decode("utf-8", "replace") for s in node.attr["value"].tensor.string_val]


class _Variables(Mapping):
    """Variable values by node name, read from the checkpoint when first asked for."""

    def __init__(self, bundle: Bundle | None, keys: dict[str, str]) -> None:
        self.bundle, self.keys = bundle, keys

    def __getitem__(self, node: str) -> np.ndarray:
        if self.bundle is None:
            raise AotcError(f"variable {node!r} has a value in the checkpoint, but the SavedModel has no "
                            "variables/ directory")
        return self.bundle.read(self.keys[node])

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def import_saved_model(path: str | Path, shapes: dict[str, tuple[int, ...]] | None = None, name: str = "model",
                       config: Config | None = None, tag_set: str = DEFAULT_TAG_SET,
                       signature: str = DEFAULT_SIGNATURE, variables_to_feed: list[str] | None = None) -> Graph:
    """Translate signature ``signature`` of the MetaGraph tagged ``tag_set`` (comma-separated tags) of
    the SavedModel directory ``path`` into a Graph.

    ``shapes`` pins input shapes by signature key (or placeholder name). ``variables_to_feed`` names
    variables (by shared_name or node name; ``["all"]`` for every one) that become inputs instead of
    constants. A ``config`` then applies to the result as to any imported graph: its tensor names are
    the signature's keys and TensorFlow's names of the inlined graph's tensors."""
    p = Path(path)
    sig = resolve_signature(p, tag_set, signature)
    nodes = {n.name: n for n in sig.graph.node}
    by_key = {key: t for key, t in sig.inputs}
    pinned = {}
    for key, shape in (shapes or {}).items():
        node = by_key[key][0] if key in by_key else key
        if node not in nodes or nodes[node].op != "Placeholder":
            raise AotcError(f"shape given for unknown input {key!r} (the signature's inputs: "
                            f"{', '.join(by_key) or 'none'})")
        pinned[node] = shape
    feeds: dict[TensorKey, Any] = {t: Feed(TensorId(*t), name=key) for key, t in sig.inputs}
    read = {n: _variable_name(nodes[n]) for n in _variables_read(nodes, [t for _, t in sig.outputs], feeds)}
    chosen = _chosen(read, variables_to_feed or [])
    for var in chosen:
        feeds[(var, 0)] = Feed(TensorId(var, 0), name=read[var])
    fetches = [(t, key) for key, t in sig.outputs]
    bundle = Bundle(p / "variables" / "variables") if (p / "variables").is_dir() and sig.variables else None
    graph = translate(sig.graph, pinned, name, feeds, fetches, unused_feeds=True,
                      variables=_Variables(bundle, sig.variables), writable=chosen)
    if config is not None:
        apply_config(graph, config)
    return graph


def _variable_name(node: Any) -> str:
    shared = node.attr["shared_name"].s.decode("utf-8", "replace") if "shared_name" in node.attr else ""
    return shared or node.name


def _variables_read(nodes: dict[str, Any], fetches: list[TensorKey], feeds: dict[TensorKey, Any]) -> list[str]:
    """The variable nodes the fetches read or assign (the assignments they depend on through control
    edges, as a function's outputs on its stateful ops), in the graph's order."""
    found, seen, stack = set(), set(), [k[0] for k in fetches if k not in feeds]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        if nodes[name].op in VARIABLE_OPS:
            found.add(name)
        for i in nodes[name].input:
            if not i.startswith("^") and tensor_key(i) not in feeds:
                stack.append(tensor_key(i)[0])
            elif i.startswith("^") and nodes.get(i[1:]) is not None and nodes[i[1:]].op in UPDATE_OPS | _PASS_THROUGH:
                stack.append(i[1:])
    return [n for n in nodes if n in found]


def _chosen(read: dict[str, str], names: list[str]) -> list[str]:
    """The variable nodes ``names`` asks to feed, in the order given ("all": by name); ``read``: node ->
    variable name."""
    if names == ["all"]:
        return sorted(read, key=lambda n: (read[n], n))
    chosen: list[str] = []
    for want in names:
        match = [n for n, v in read.items() if want in (n, v)]
        if not match:
            raise AotcError(f"--variables-to-feed: the signature reads no variable {want!r} (it reads: "
                            f"{', '.join(sorted(set(read.values()))) or 'none'})")
        chosen.extend(m for m in match if m not in chosen)
    return chosen
