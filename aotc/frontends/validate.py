"""Checks an ONNX model once, before import, the way ``onnx.checker`` and onnxruntime do.

Two kinds of rule:

- the schema rules of ``onnx.defs`` for the model's opsets: input and output counts, required
  inputs not empty, attribute names, types and presence, one definition per tensor name (SSA);
- the value rules aotc's emitters rely on, which onnx leaves to shape inference and onnxruntime
  enforces when it loads a model: a sliding window (Conv, pools, ...) has pads >= 0, strides,
  dilations and kernel_shape >= 1 of one length, a known auto_pad and group >= 1; a pool's pads are
  smaller than its kernel. Rules that need shapes (rank, channels, bias length) are the ops' own
  (aotc/ops/conv.py) and run during shape inference.

Why not ``onnx.checker.check_model``: it stops at the first problem with a message that names the
node in a second, multi-line context, does not check attribute values at all, and accepts opsets no
onnx knows; aotc's errors are one line naming the node, the attribute and the value. Nodes of a
domain ``onnx.defs`` does not know (custom ops) get no schema check: they are reported as
unsupported unless aotc's op table has them.
"""

from __future__ import annotations

from collections import ChainMap

import onnx
import onnx.defs
import onnx.shape_inference
from google.protobuf.descriptor import FieldDescriptor

from aotc.errors import AotcError

# The highest opset the installed onnx defines for each domain it knows: aotc's op semantics are
# onnx's (schemas, onnx.reference), so an opset past these has no defined meaning here.
_KNOWN_OPSETS: dict[str, tuple[int, int]] = dict(onnx.defs.C.schema_version_map())
DEFAULT_DOMAINS = ("", "ai.onnx")

# Ops with a sliding window (kernel_shape/strides/dilations/pads attributes) and pools among them.
WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool",
                        "LpPool", "MaxUnpool", "Col2Im", "DeformConv"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
# INT attributes that hold an element type (a TensorProto.DataType); 0 lets the op choose, where allowed.
DTYPE_ATTRS = {"to": False, "dtype": False, "output_datatype": False, "output_dtype": True}
_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values())

_AttrType = onnx.AttributeProto.AttributeType
# AttributeProto type -> the field holding its value.
_ATTR_FIELDS = {
    onnx.AttributeProto.FLOAT: "f", onnx.AttributeProto.INT: "i", onnx.AttributeProto.STRING: "s",
    onnx.AttributeProto.TENSOR: "t", onnx.AttributeProto.GRAPH: "g",
    onnx.AttributeProto.SPARSE_TENSOR: "sparse_tensor", onnx.AttributeProto.TYPE_PROTO: "tp",
    onnx.AttributeProto.FLOATS: "floats", onnx.AttributeProto.INTS: "ints",
    onnx.AttributeProto.STRINGS: "strings", onnx.AttributeProto.TENSORS: "tensors",
    onnx.AttributeProto.GRAPHS: "graphs", onnx.AttributeProto.SPARSE_TENSORS: "sparse_tensors",
    onnx.AttributeProto.TYPE_PROTOS: "type_protos",
}
_Option = onnx.defs.OpSchema.FormalParameterOption


# Free text aotc never reads: left as it is (attribute strings are bytes fields, decoded leniently).
_FREE_TEXT = frozenset({"doc_string", "producer_name", "producer_version", "metadata_props", "denotation"})


def check_strings(model: onnx.ModelProto) -> None:
    """Refuse invalid UTF-8 in names, domains and the other string fields aotc reads. Python's
    protobuf hands such a field over as ``bytes`` instead of ``str``, which nothing downstream expects."""
    _check_strings(model, "model")


def _check_strings(msg, path: str) -> None:
    for field, value in msg.ListFields():
        if field.name in _FREE_TEXT:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if _repeated(field):
                for i, m in enumerate(value):
                    _check_strings(m, f"{path}.{field.name}[{i}]")
            else:
                _check_strings(value, f"{path}.{field.name}")
        elif field.type == FieldDescriptor.TYPE_STRING:
            items = value if _repeated(field) else [value]
            for i, s in enumerate(items):
                if isinstance(s, bytes):
                    where = f"{path}.{field.name}" + (f"[{i}]" if len(items) > 1 else "")
                    raise AotcError(f"{where} is not valid UTF-8: {s!r}")


def _repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 5 has is_repeated and drops label in 7; onnx allows protobuf 4.
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def model_opsets(model: onnx.ModelProto) -> dict[str, int]:
    """Domain -> opset version ("" for the default domain, also spelled "ai.onnx"), checked: an
    opset or IR version the installed onnx does not define is refused, as onnxruntime refuses it."""
    if model.ir_version > onnx.IR_VERSION:
        raise AotcError(f"IR version {model.ir_version} is not defined (onnx {onnx.__version__} defines up to "
                        f"{onnx.IR_VERSION})")
    if not model.opset_import and model.ir_version >= 3:
        raise AotcError("the model imports no opset (opset_import is empty); onnx requires one for "
                        "the default domain")
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        domain = "" if imp.domain in DEFAULT_DOMAINS else imp.domain
        if domain in opsets:
            raise AotcError(f"opset_import lists domain {imp.domain!r} twice")
        known = _KNOWN_OPSETS.get(domain)
        if known is not None and not known[0] <= imp.version <= known[1]:
            raise AotcError(f"opset {imp.version} of domain {imp.domain or 'ai.onnx'!r} is not defined "
                            f"(onnx {onnx.__version__} defines {known[0]} to {known[1]})")
        opsets[domain] = int(imp.version)
    if not model.opset_import:  # IR version < 3: opset 1 was implied
        opsets[""] = 1
    return opsets


def validate_graph(model: onnx.ModelProto, opsets: dict[str, int]) -> None:
    """Check every node of ``model``'s graph (and of its subgraphs) against its schema and aotc's
    value rules, that every tensor name is defined once and that the graph's outputs have the types
    their nodes make. Raises AotcError on the first problem."""
    typed = _typed(model)
    _Checker(opsets).graph(model.graph, typed, set(), ChainMap(), "")
    if typed is None:
        return
    made = _types(model.graph, typed)
    for vi in model.graph.output:
        declared = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if declared in _DATA_TYPES and made.get(vi.name) and declared not in (0, made[vi.name]):
            raise AotcError(f"graph output {vi.name!r} is declared {_type_name(declared)} but its node makes "
                            f"{_type_name(made[vi.name])}")


def _typed(model: onnx.ModelProto) -> onnx.GraphProto | None:
    """``model``'s graph with the element types onnx infers (non-strict: a node it cannot type is
    left untyped), or None. The initializers go in as typed inputs: types need no weights; the
    outputs go in untyped, so that what their nodes make can be compared with what they declare."""
    light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    g = light.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(onnx.ValueInfoProto(name=vi.name) for vi in model.graph.output)
    g.value_info.extend(model.graph.value_info)
    listed = {vi.name for vi in model.graph.input}
    for t in model.graph.initializer:
        if t.name not in listed:
            vi = g.input.add(name=t.name)
            vi.type.tensor_type.elem_type = t.data_type
            vi.type.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_value=d) for d in t.dims)
    try:
        return onnx.shape_inference.infer_shapes(light, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - no types then: the checks that need them are skipped
        return None


def _types(g: onnx.GraphProto, typed: onnx.GraphProto | None) -> dict[str, int]:
    """Element types of the tensors ``g`` defines, as far as known (0: unknown; an invalid type is
    the importer's to report, naming the tensor)."""
    types: dict[str, int] = {}
    if typed is not None:
        for vi in [*typed.input, *typed.value_info, *typed.output]:
            types[vi.name] = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    for t in g.initializer:
        types[t.name] = t.data_type
    return {name: elem if elem in _DATA_TYPES else 0 for name, elem in types.items()}


class _Checker:
    def __init__(self, opsets: dict[str, int]) -> None:
        self.opsets = opsets
        self.schemas: dict[tuple[str, str, int], onnx.defs.OpSchema | None] = {}

    def graph(self, g: onnx.GraphProto, typed: onnx.GraphProto | None, outer: set[str],
              outer_types: ChainMap[str, int], where: str) -> None:
        """``typed``: ``g`` as onnx's inference typed it (or None); ``outer``: names visible from
        enclosing graphs. A subgraph's inputs and initializers may shadow them, its nodes' outputs
        may not (onnx.checker's and onnxruntime's rule)."""
        defined: set[str] = set()
        types = outer_types.new_child(_types(g, typed))
        typed_nodes = list(typed.node) if typed is not None and len(typed.node) == len(g.node) else None

        def define(name: str, what: str, suffix: str = where, shadows: bool = False) -> None:
            if name in defined or (name in outer and not shadows):
                raise AotcError(f"{what} {name!r}{suffix} redefines a tensor name (an ONNX graph defines "
                                "each name once)")
            defined.add(name)
        inits: dict[str, None] = {}  # ordered, for a deterministic first error
        for name in [t.name for t in g.initializer] + [t.values.name for t in g.sparse_initializer]:
            if name in inits:
                raise AotcError(f"initializer {name!r}{where} is given twice")
            inits[name] = None
        for vi in g.input:
            if vi.name in defined:
                raise AotcError(f"graph input {vi.name!r}{where} is declared twice")
            define(vi.name, "graph input", shadows=True)
        for name in inits:  # an initializer may also be listed as an input (a default)
            if name not in defined:
                define(name, "initializer", shadows=True)
        for i, node in enumerate(g.node):
            label = f"{node.op_type} node {node.name or f'{node.op_type}_{i}'!r}{where}"
            self.node(node, label, types)
            typed_attrs = {a.name: a for a in typed_nodes[i].attribute} if typed_nodes else {}
            for a in node.attribute:
                subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
                ta = typed_attrs.get(a.name)
                typed_subs = ([ta.g] if a.type == onnx.AttributeProto.GRAPH else list(ta.graphs)) if ta else []
                for j, sub in enumerate(subs):
                    self.graph(sub, typed_subs[j] if j < len(typed_subs) else None, outer | defined, types,
                               f" (in attribute {a.name!r} of {label})")
            for name in node.output:
                if name:
                    define(name, f"{label}: output", "")

    def schema(self, node: onnx.NodeProto, label: str) -> onnx.defs.OpSchema | None:
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        if domain not in _KNOWN_OPSETS:
            return None  # a custom domain: aotc's op table decides whether it is supported
        if domain not in self.opsets:
            raise AotcError(f"{label}: the model imports no opset for its domain {node.domain!r}")
        key = (node.op_type, domain, self.opsets[domain])
        if key not in self.schemas:
            try:
                self.schemas[key] = onnx.defs.get_schema(node.op_type, self.opsets[domain], domain)
            except onnx.defs.SchemaError:
                self.schemas[key] = None
        schema = self.schemas[key]
        if schema is None and onnx.defs.has(node.op_type, domain):
            first = onnx.defs.get_all_schemas_with_history()
            since = min((s.since_version for s in first if s.name == node.op_type and s.domain == domain),
                        default=0)
            raise AotcError(f"{label}: {node.op_type} is not defined in opset {self.opsets[domain]} of "
                            f"domain {node.domain or 'ai.onnx'!r} (it was added in opset {since})")
        return schema  # deprecated ones too (GroupNormalization-18): onnxruntime still runs them

    def node(self, node: onnx.NodeProto, label: str, types: ChainMap[str, int]) -> None:
        attrs: dict[str, onnx.AttributeProto] = {}
        for a in node.attribute:
            if a.name in attrs:
                raise AotcError(f"{label}: attribute {a.name!r} is given twice")
            attrs[a.name] = a
        schema = self.schema(node, label)
        if schema is not None:
            op = f"{node.op_type}-{schema.since_version}"  # onnx's name for this version of the op
            _check_arity(node, schema, label, op)
            _check_attributes(attrs, schema, label, op)
            _check_types(node, schema, types, label, op)
        if node.op_type in WINDOW_OPS and node.domain in DEFAULT_DOMAINS:
            _check_window(node.op_type, attrs, label)
        _check_type_attributes(attrs, label)


def _type_name(elem: int) -> str:
    return onnx.TensorProto.DataType.Name(elem).lower() if elem in _DATA_TYPES else str(elem)


def _check_types(node: onnx.NodeProto, schema: onnx.defs.OpSchema, types: ChainMap[str, int], label: str,
                 op: str) -> None:
    """Each typed input and output has a type its parameter allows, and the tensors bound to one
    type variable (T of Add's A, B and C) have one type: what onnxruntime checks when it loads."""
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    bound: dict[str, tuple[int, str]] = {}
    for kind, names, params in (("input", node.input, schema.inputs), ("output", node.output, schema.outputs)):
        for i, name in enumerate(names):
            elem = types.get(name, 0) if name else 0
            if not elem or not params:
                continue
            param = params[min(i, len(params) - 1)]
            what = f"{kind} {i} ({param.name}) {name!r}"
            if f"tensor({_type_name(elem)})" not in allowed.get(param.type_str, [param.type_str]) and \
                    not any(t.startswith(("seq(", "optional(")) for t in allowed.get(param.type_str, [])):
                raise AotcError(f"{label}: {what} is {_type_name(elem)}, which {op} does not take there")
            if param.type_str in allowed and param.is_homogeneous:
                first = bound.setdefault(param.type_str, (elem, what))
                if first[0] != elem:
                    raise AotcError(f"{label}: {what} is {_type_name(elem)} but {first[1]} is "
                                    f"{_type_name(first[0])} (both {param.type_str} of {op})")


def _check_type_attributes(attrs: dict[str, onnx.AttributeProto], label: str) -> None:
    """Element types in attributes are known ones (numpy and C type tables are keyed by them)."""
    for name, a in attrs.items():
        if a.type == onnx.AttributeProto.INT and name in DTYPE_ATTRS:
            if a.i not in _DATA_TYPES or (a.i == onnx.TensorProto.UNDEFINED and not DTYPE_ATTRS[name]):
                raise AotcError(f"{label}: attribute {name} {a.i} is not an element type")
        tensors = [a.t] if a.type == onnx.AttributeProto.TENSOR else list(a.tensors)
        for t in tensors:
            if t.data_type not in _DATA_TYPES or t.data_type == onnx.TensorProto.UNDEFINED:
                raise AotcError(f"{label}: attribute {name} holds a tensor of unknown data_type {t.data_type}")


def _count(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"at least {lo}" if hi >= 2**31 - 1 else f"{lo} to {hi}"


def _check_arity(node: onnx.NodeProto, schema: onnx.defs.OpSchema, label: str, op: str) -> None:
    for kind, names, params, lo, hi in (("input", node.input, schema.inputs, schema.min_input, schema.max_input),
                                        ("output", node.output, schema.outputs, schema.min_output,
                                         schema.max_output)):
        if not lo <= len(names) <= hi:
            raise AotcError(f"{label}: {len(names)} {kind}s, {op} takes {_count(lo, hi)}")
        for i, name in enumerate(names):
            param = params[min(i, len(params) - 1)]
            if not name and param.option == _Option.Single:
                raise AotcError(f"{label}: {kind} {i} ({param.name}) is required but empty")


def _check_attributes(attrs: dict[str, onnx.AttributeProto], schema: onnx.defs.OpSchema, label: str,
                      op: str) -> None:
    known = schema.attributes
    for name, a in attrs.items():
        if name not in known:
            raise AotcError(f"{label}: unknown attribute {name!r} ({op} has "
                            f"{', '.join(sorted(known)) or 'no attributes'})")
        if a.ref_attr_name:  # a function body's reference to the function's attribute
            continue
        want = int(known[name].type)
        set_fields = [t for t, f in _ATTR_FIELDS.items() if _has(a, f)]
        if a.type != want or any(t != want for t in set_fields):
            got = _AttrType.Name(a.type) if a.type in _AttrType.values() else str(a.type)
            held = "/".join(_AttrType.Name(t) for t in set_fields if t != a.type)
            raise AotcError(f"{label}: attribute {name!r} is {got}{f' holding {held}' if held else ''}, "
                            f"{op} expects {_AttrType.Name(want)}")
    for name, spec in known.items():
        if spec.required and name not in attrs:
            raise AotcError(f"{label}: required attribute {name!r} is missing")


def _has(a: onnx.AttributeProto, field: str) -> bool:
    if _repeated(a.DESCRIPTOR.fields_by_name[field]):
        return len(getattr(a, field)) > 0
    return a.HasField(field)


def _ints(attrs: dict[str, onnx.AttributeProto], name: str) -> list[int] | None:
    a = attrs.get(name)
    return None if a is None else list(a.ints)


def _check_window(op: str, attrs: dict[str, onnx.AttributeProto], label: str) -> None:
    """The sliding-window rules of onnxruntime's conv and pool attributes (its shape inference and
    PoolAttributes), which the emitters rely on: a negative pad or a zero stride indexes out of
    bounds."""
    kernel, strides, dilations = _ints(attrs, "kernel_shape"), _ints(attrs, "strides"), _ints(attrs, "dilations")
    for name, values in (("kernel_shape", kernel), ("strides", strides), ("dilations", dilations)):
        if values is not None and min(values, default=1) < 1:
            raise AotcError(f"{label}: attribute {name} {values} must hold values >= 1")
    pads = _ints(attrs, "pads")
    if pads is not None and min(pads, default=0) < 0:
        raise AotcError(f"{label}: attribute pads {pads} must hold values >= 0")
    lengths = {name: len(v) for name, v in (("kernel_shape", kernel), ("strides", strides),
                                            ("dilations", dilations)) if v is not None}
    if pads is not None:
        lengths["pads"] = len(pads) // 2
        if len(pads) % 2:
            raise AotcError(f"{label}: attribute pads {pads} must hold a begin and an end per spatial axis")
    if len(set(lengths.values())) > 1:
        raise AotcError(f"{label}: attributes {', '.join(f'{k} ({v} axes)' for k, v in lengths.items())} "
                        "disagree on the number of spatial axes")
    if "auto_pad" in attrs:
        auto = attrs["auto_pad"].s.decode("utf-8", "replace")
        if auto not in AUTO_PADS:
            raise AotcError(f"{label}: attribute auto_pad {auto!r} is not one of {', '.join(AUTO_PADS)}")
    if "group" in attrs and attrs["group"].i < 1:
        raise AotcError(f"{label}: attribute group {attrs['group'].i} must be >= 1")
    for name in ("output_padding", "output_shape"):
        values = _ints(attrs, name)
        if values is not None and min(values, default=0) < (name == "output_shape"):
            raise AotcError(f"{label}: attribute {name} {values} must hold values >= "
                            f"{int(name == 'output_shape')}")
    output_padding = _ints(attrs, "output_padding")
    if output_padding is not None:  # onnxruntime's rule: a larger one would add rows no input reaches
        n = len(output_padding)
        limits = [max(s, d) for s, d in zip(strides or [1] * n, dilations or [1] * n, strict=False)]
        if len(limits) == n and any(p >= m for p, m in zip(output_padding, limits, strict=True)):
            raise AotcError(f"{label}: attribute output_padding {output_padding} must be smaller than the "
                            f"larger of strides and dilations ({limits})")
    if op in POOL_OPS and kernel is not None and pads is not None and lengths.get("pads") == len(kernel):
        n = len(kernel)
        if any(pads[i] >= kernel[i] or pads[i + n] >= kernel[i] for i in range(n)):
            raise AotcError(f"{label}: attribute pads {pads} must be smaller than kernel_shape {kernel} "
                            "(a window of padding only)")
