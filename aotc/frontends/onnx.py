"""ONNX -> IR.

Reads any model the installed ``onnx`` can load (external data included), checks it
(aotc/frontends/validate.py), inlines local functions, turns initializers and Constant nodes into IR
constants and pins dynamic input dimensions from the feed config. Ops are only translated here; an
op aotc does not support becomes a placeholder node, and once the config has cut the graph to its
fetches, the placeholders still needed are reported in one error, so the user sees every
unsupported op at once and a branch the config does not fetch may use any op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import onnx.inliner
from onnx import numpy_helper

from aotc.config import Config
from aotc.errors import AotcError, UnsupportedOpsError
from aotc.frontends.control_flow import inline_control_flow
from aotc.frontends.sequences import SEQUENCE_OPS, resolve_sequences
from aotc.frontends.validate import DEFAULT_DOMAINS, check_strings, model_opsets, validate_graph
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value
from aotc.ops import OPS
from aotc.passes.prune import apply_config, prune


def load_model(path: str | Path) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise AotcError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises several unrelated types for garbage input
        raise AotcError(f"{path}: not a valid ONNX model ({type(e).__name__}: {e})") from None
    if not model.graph.node and not model.graph.output:
        raise AotcError(f"{path}: not a valid ONNX model (no graph)")
    check_strings(model)
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as e:
        raise AotcError(f"{path}: cannot read external data ({e})") from None
    return model


def _attr(a: onnx.AttributeProto, label: str):
    value = onnx.helper.get_attribute_value(a)
    if a.type == onnx.AttributeProto.TENSOR:
        if value.data_type == onnx.TensorProto.STRING:  # e.g. LabelEncoder's keys_tensor
            # numpy_helper decodes strictly; invalid UTF-8 is replaced, as in string attributes.
            strings = np.array([s.decode("utf-8", "replace") for s in value.string_data], dtype=object)
            dims = tuple(value.dims)
            return strings.reshape(dims) if int(np.prod(dims)) == strings.size else strings
        return _tensor(value, f"{label}: attribute {a.name}", any_dtype=True)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


def _constant_value(node: onnx.NodeProto, label: str) -> np.ndarray:
    if len(node.attribute) != 1:  # the schema allows any one of its attributes, checked here
        raise AotcError(f"Constant node {label!r}: needs exactly one value attribute, has "
                        f"{len(node.attribute)}")
    a = node.attribute[0]
    if a.name in ("value_string", "value_strings") or (a.name == "value" and a.t.data_type == onnx.TensorProto.STRING):
        raise _string_constant(f"Constant node {label!r}")
    if a.name == "value":
        return _tensor(a.t, f"Constant node {label!r}: attribute value")
    v = onnx.helper.get_attribute_value(a)
    if a.name in ("value_float", "value_int"):
        return np.array(v, dtype=np.float32 if a.name == "value_float" else np.int64)
    if a.name in ("value_floats", "value_ints"):
        return np.array(v, dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise AotcError(f"Constant node {label!r}: unsupported attribute {a.name}")


def _tensor(t: onnx.TensorProto, what: str, any_dtype: bool = False) -> np.ndarray:
    """A TensorProto's data, checked: its type known (and one aotc supports, unless ``any_dtype``: an
    op's attribute may hold what the op alone understands) and its data as long as its dims say."""
    if t.data_type not in onnx.TensorProto.DataType.values() or t.data_type == onnx.TensorProto.UNDEFINED:
        raise AotcError(f"{what} has unknown data_type {t.data_type}")
    if min(t.dims, default=0) < 0:
        raise AotcError(f"{what} has a negative dimension in its dims {list(t.dims)}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # numpy's reshape, protobuf, ml_dtypes: the data does not fit the dims
        raise AotcError(f"{what} cannot be read (dims {list(t.dims)}): {e}") from None
    if not any_dtype and not dtypes.is_supported(arr.dtype):
        raise AotcError(f"{what} has unsupported dtype {arr.dtype}")
    return arr


def _string_constant(what: str) -> AotcError:
    """String constants are refused: the weights blob holds fixed-size elements, not pointers."""
    return AotcError(f"{what} is a string tensor: string constants are not supported "
                    "(strings may only be graph inputs)")


def _value_type(vi: onnx.ValueInfoProto) -> tuple[list[int | str | None] | None, np.dtype]:
    """(dims, dtype) of a tensor input; dims None when the model leaves the rank open (no shape:
    not a scalar, which has a shape of no dims)."""
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise AotcError(f"input {vi.name!r}: only tensor inputs are supported")
    dims: list[int | str | None] | None = [] if t.HasField("shape") else None
    for d in t.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    if t.elem_type not in onnx.TensorProto.DataType.values():
        raise AotcError(f"input {vi.name!r}: unknown elem_type {t.elem_type}")
    try:
        return dims, dtypes.from_onnx(t.elem_type)
    except AotcError as e:
        raise AotcError(f"input {vi.name!r}: {e}") from None


def import_onnx(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...] | None] | None = None,
                name: str = "model", config: Config | None = None) -> Graph:
    """Translate ``model`` into a Graph. ``shapes`` pins input shapes (required for dynamic dims;
    sequence inputs' elements as ``name.0``, ``name.1``, ...; None leaves an optional input absent).
    ``config`` chooses the graph's inputs and outputs (aotc.passes.prune.apply_config); the nodes
    they do not need may use ops aotc does not support."""
    shapes = dict(shapes or {})
    check_strings(model)
    opsets = model_opsets(model)
    opset = opsets.get("", 1)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:
            raise AotcError(f"cannot inline the model's local functions: {e}") from None
    validate_graph(model.graph, opsets)

    # Sequence inputs and lengths first (a Loop over a sequence needs its trip count), then the rest
    # of the sequences and optionals once control flow is plain dataflow.
    model, pinned = resolve_sequences(model, shapes, final=False)
    model, pinned = resolve_sequences(inline_control_flow(model, pinned), pinned)
    shapes = dict(pinned)

    g = Graph(name)
    g.opset = opset
    env: dict[str, Value] = {}
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.STRING:
            raise _string_constant(f"initializer {init.name!r}")
        env[init.name] = Graph.constant(_tensor(init, f"initializer {init.name!r}"), init.name)

    for vi in model.graph.input:
        if vi.name in env:  # an initializer listed as input: a constant with a default
            _check_declared(vi, env[vi.name])
            continue
        dims, dt = _value_type(vi)
        if vi.name in shapes:
            shape = tuple(shapes.pop(vi.name))
            if dims is not None and (len(shape) != len(dims) or any(isinstance(d, int) and d and d != s
                                                                    for d, s in zip(dims, shape, strict=False))):
                raise AotcError(f"input {vi.name!r}: shape {list(shape)} does not match the model's "
                                f"{[d if isinstance(d, int) and d else '?' for d in dims]}")
        elif dims is not None and all(isinstance(d, int) for d in dims):
            shape = tuple(int(d) for d in dims)  # type: ignore[arg-type]
        else:  # dynamic: an error later only if the input is still needed after pruning
            shape = None
            g.dynamic_inputs[vi.name] = "rank unknown" if dims is None else \
                ",".join(str(d) if isinstance(d, int) else (d or "?") for d in dims)
        v = Value(vi.name, shape, dt)
        env[vi.name] = v
        g.inputs.append(v)
    if shapes:
        raise AotcError(f"shape given for unknown input(s): {', '.join(sorted(shapes))}")

    unsupported: list[Node] = []
    for i, node in enumerate(model.graph.node):
        label = node.name or f"{node.op_type}_{i}"
        op_key = node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        subgraphs = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        # aotc's internal ops (Copy) are not ONNX ops: a model naming one gets a placeholder too.
        internal = node.domain in DEFAULT_DOMAINS and not onnx.defs.has(node.op_type)
        supported = (op_key in OPS or op_key == "Constant") and not subgraphs and not internal
        if node.op_type == "Constant" and supported:
            env[node.output[0]] = Graph.constant(_constant_value(node, label), node.output[0])
            continue
        ins: list[Value | None] = []
        for name_in in node.input:
            if not name_in:
                ins.append(None)
            elif name_in in env:
                ins.append(env[name_in])
            else:
                raise AotcError(f"node {label!r} reads {name_in!r}, which nothing defines")
        attrs = {}
        if supported:
            attrs = {a.name: _attr(a, f"{node.op_type} node {label!r}") for a in node.attribute}
            attrs["_opset"] = opset
            if op_key != node.op_type:  # another domain's op: its key keeps the domain, plus its version
                attrs["_domain_opset"] = opsets.get(node.domain, 1)
        n = g.add_node(op_key, ins, len(node.output), attrs, label, out_names=list(node.output))
        if not supported:  # a placeholder: an error only if the fetches still need it
            unsupported.append(n)
        for out_name, v in zip(node.output, n.outputs, strict=True):
            if out_name:
                env[out_name] = v

    for vi in model.graph.output:
        if vi.name not in env:
            raise AotcError(f"graph output {vi.name!r} is not produced by any node")
        g.outputs.append(env[vi.name])
    _known_dtypes(model, env)
    g.toposort()
    if not g.outputs and config is None:
        raise AotcError("the model's graph has no outputs: nothing to compute (a config can fetch tensors)")
    if config is not None:
        apply_config(g, config)
    elif unsupported:
        prune(g)
    _require_supported(g, unsupported)
    return g


def _check_declared(vi: onnx.ValueInfoProto, init: Value) -> None:
    """An initializer listed as a graph input has the type and the static dims it declares
    (onnxruntime refuses a model where they differ)."""
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return
    assert init.dtype is not None and init.shape is not None
    declared = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    if t.elem_type and t.elem_type != dtypes.onnx_type(init.dtype):
        raise AotcError(f"input {vi.name!r} is declared {onnx.TensorProto.DataType.Name(t.elem_type).lower()} "
                        f"but its initializer is {dtypes.dtype_name(init.dtype)}")
    if t.HasField("shape") and (len(declared) != len(init.shape) or any(
            d is not None and d != s for d, s in zip(declared, init.shape, strict=False))):
        raise AotcError(f"input {vi.name!r} is declared with shape {['?' if d is None else d for d in declared]} "
                        f"but its initializer has shape {list(init.shape)}")


def _require_supported(g: Graph, placeholders: list[Node]) -> None:
    """Raise UnsupportedOpsError listing every placeholder the (pruned) graph still holds."""
    kept = {id(n) for n in g.nodes}
    missing: dict[str, list[str]] = {}
    for n in placeholders:
        if id(n) in kept:
            missing.setdefault(n.op, []).append(n.name)
    if missing:
        raise UnsupportedOpsError(missing)


def _known_dtypes(model: onnx.ModelProto, env: dict[str, Value]) -> None:
    """Element types of intermediate tensors, from ONNX's own inference, so that feeding an
    intermediate tensor (which cuts the graph before aotc's inference runs) knows its dtype."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        v = env.get(vi.name)
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if v is not None and v.dtype is None and elem and dtypes.is_supported(_np_or_none(elem)):
            v.dtype = dtypes.from_onnx(elem)


def _np_or_none(elem: int) -> np.dtype:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem)
    except Exception:
        return np.dtype("V1")


# Ops the frontend rewrites away rather than translating through aotc.ops.OPS.
FRONTEND_OPS = frozenset({"Constant"}) | SEQUENCE_OPS


def list_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> number of nodes, for ``aotc inspect`` (If counts as the ops of its branches,
    SequenceMap as itself and the ops of its body)."""
    counts: dict[str, int] = {}

    def count(nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            counts[key] = counts.get(key, 0) + 1
            if key == "SequenceMap":
                for a in node.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        count(a.g.node)
    with contextlib.suppress(AotcError):  # lengths unknown without input shapes: count them as they are
        model = resolve_sequences(model, final=False)[0]
    try:
        nodes = inline_control_flow(model).graph.node
    except AotcError:  # e.g. a Loop whose trip count is only known at run time: list it as it is
        nodes = model.graph.node
    count(nodes)
    return counts
