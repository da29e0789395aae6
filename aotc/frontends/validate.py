"""Checks an ONNX model once, before import, the way ``onnx.checker`` and onnxruntime do.

Three kinds of rule:

- the schema rules of ``onnx.defs`` for the model's opsets: input and output counts, required
  inputs not empty, attribute names, types and presence, one definition per tensor name (SSA);
- element types against the schemas' type constraints, as onnxruntime checks them when it loads a
  model: an input's type is one its parameter allows, the inputs of one type variable agree, a graph
  output has the type its node makes. Types are propagated here, from the schemas, rather than by
  onnx's shape inference, whose C++ crashes on some malformed nodes (a TreeEnsemble with an empty
  input) and which, in strict mode, refuses valid models (test_mvn of the backend suite);
- the value rules aotc's emitters rely on, which onnx leaves to shape inference and onnxruntime
  enforces when it loads a model: a sliding window (Conv, pools, ...) has pads >= 0, strides,
  dilations and kernel_shape >= 1 of one length, a known auto_pad and group >= 1; a pool's pads are
  smaller than its kernel; element types in attributes are known ones. Rules that need shapes
  (rank, channels, bias length) are the ops' own (aotc/ops/conv.py, nn.py) and run during shape
  inference.

Why not ``onnx.checker.check_model``: its message names the node in a second, multi-line context;
it checks neither attribute values nor element types, and accepts opsets no onnx defines. Over the
backend suite's node models with one random node mutation each (5,652 models), every model the
checker refused is refused here too but for deliberate differences: an op its domain does not define
is reported as unsupported (and may sit on a pruned branch), and "ai.onnx" is the default domain
without an import of its own, as onnxruntime has it. Neither do graph outputs need a shape or a type
(the checker wants both; onnxruntime and aotc do not use them), nor a graph a name. Cost: 0.24 s for 10,000 nodes (the
checker: 0.03 to 0.09 s). Nodes of a domain ``onnx.defs`` does not know (custom ops) get no schema
check: they are reported as unsupported unless aotc's op table has them.
"""

from __future__ import annotations

from collections import ChainMap

import onnx
import onnx.defs
from google.protobuf.descriptor import FieldDescriptor

from aotc.errors import AotcError

# The highest opset the installed onnx defines for each domain it knows: aotc's op semantics are
# onnx's (schemas, onnx.reference), so an opset past these has no defined meaning here.
_KNOWN_OPSETS: dict[str, tuple[int, int]] = dict(onnx.defs.C.schema_version_map())
DEFAULT_DOMAINS = ("", "ai.onnx")
# Domains onnxruntime defines beyond onnx's, with the highest opset it registers (onnxruntime
# 1.31's schema registry; it refuses a model importing a later one, used or not).
_ONNXRUNTIME_OPSETS: dict[str, tuple[int, int]] = {
    "com.microsoft": (1, 1), "com.microsoft.nchwc": (1, 1), "com.microsoft.experimental": (1, 1),
    "org.pytorch.aten": (1, 1)}

# Ops with a sliding window (kernel_shape/strides/dilations/pads attributes) and pools among them.
WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool",
                        "LpPool", "MaxUnpool", "Col2Im", "DeformConv"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
# Ops that take explicit pads or an auto_pad, not both (onnxruntime's ConvAttributes).
EXPLICIT_OR_AUTO_PADS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
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
    opset or IR version the installed onnx (or onnxruntime, for its own domains) does not define is
    refused, as onnxruntime refuses it; so are IR 3 initializers that are not graph inputs."""
    if not 1 <= model.ir_version <= onnx.IR_VERSION:
        raise AotcError(f"IR version {model.ir_version} is not defined (onnx {onnx.__version__} defines 1 to "
                        f"{onnx.IR_VERSION})")
    if model.opset_import and model.ir_version < 3:
        raise AotcError(f"IR version {model.ir_version} predates opset_import, which the model has")
    if not model.opset_import and model.ir_version >= 3:
        raise AotcError("the model imports no opset (opset_import is empty); onnx requires one for "
                        "the default domain")
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        domain = "" if imp.domain in DEFAULT_DOMAINS else imp.domain
        if opsets.get(domain, imp.version) != imp.version:  # "" and "ai.onnx" may both be listed, alike
            raise AotcError(f"opset_import gives domain {imp.domain or 'ai.onnx'!r} two versions")
        if imp.version > 2**31 - 1:  # onnx.checker's range, for any domain
            raise AotcError(f"opset {imp.version} of domain {imp.domain!r} is out of range")
        known = _KNOWN_OPSETS.get(domain)
        if known is not None and not known[0] <= imp.version <= known[1]:
            raise AotcError(f"opset {imp.version} of domain {imp.domain or 'ai.onnx'!r} is not defined "
                            f"(onnx {onnx.__version__} defines {known[0]} to {known[1]})")
        known = _ONNXRUNTIME_OPSETS.get(domain)
        if known is not None and not known[0] <= imp.version <= known[1]:
            raise AotcError(f"opset {imp.version} of domain {imp.domain!r} is not defined (onnxruntime "
                            f"defines {known[0]} to {known[1]})")
        opsets[domain] = int(imp.version)
    if not model.opset_import:  # IR version < 3: opset 1 was implied
        opsets[""] = 1
    return opsets


def validate_graph(graph: onnx.GraphProto, opsets: dict[str, int]) -> None:
    """Check every node of ``graph`` (and of its subgraphs) against its schema and aotc's value
    rules, that every tensor name is defined once and that the graph's outputs have the types their
    nodes make. Raises AotcError on the first problem."""
    types = _Checker(opsets).graph(graph, set(), ChainMap(), "")
    names = [vi.name for vi in graph.output]
    for name in names:  # each output is one result of the run: as a config may fetch a tensor once
        if names.count(name) > 1:
            raise AotcError(f"graph output {name!r} is listed {names.count(name)} times")
    for vi in graph.output:
        declared = _elem_type(vi)
        if declared and types.get(vi.name) and declared != types[vi.name]:
            raise AotcError(f"graph output {vi.name!r} is declared {_type_name(declared)} but its node makes "
                            f"{_type_name(types[vi.name])}")


def _elem_type(vi: onnx.ValueInfoProto) -> int:
    """A declared tensor element type; 0 when absent or invalid (the importer reports an invalid one,
    naming the tensor)."""
    elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    return elem if elem in _DATA_TYPES else 0


class _Checker:
    def __init__(self, opsets: dict[str, int]) -> None:
        self.opsets = opsets
        self.schemas: dict[tuple[str, str, int], onnx.defs.OpSchema | None] = {}

    def graph(self, g: onnx.GraphProto, outer: set[str], outer_types: ChainMap[str, int],
              where: str) -> ChainMap[str, int]:
        """Check ``g``; return the element types of its tensors as far as known (0: unknown).
        ``outer``: names visible from enclosing graphs. A subgraph's inputs and initializers may
        shadow them, its nodes' outputs may not (onnx.checker's and onnxruntime's rule)."""
        defined: set[str] = set()
        types = outer_types.new_child({vi.name: _elem_type(vi) for vi in g.input})
        types.update({t.name: t.data_type if t.data_type in _DATA_TYPES else 0 for t in g.initializer})

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
        for kind, infos in (("graph output", g.output), ("value_info", g.value_info)):
            for vi in infos:  # onnxruntime refuses an invalid element type wherever it is declared
                if vi.type.HasField("tensor_type") and not _elem_type(vi):
                    raise AotcError(f"{kind} {vi.name!r}{where} has unknown elem_type "
                                    f"{vi.type.tensor_type.elem_type}")
        for i, node in enumerate(g.node):
            label = f"{node.op_type} node {node.name or f'{node.op_type}_{i}'!r}{where}"
            self.node(node, label, types)
            for a in node.attribute:
                for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    self.graph(sub, outer | defined, types, f" (in attribute {a.name!r} of {label})")
            for name in node.output:
                if name:
                    define(name, f"{label}: output", "")
        return types

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
            made = _check_types(node, schema, attrs, types, label, op)
        else:
            made = [0] * len(node.output)
        types.update(zip(node.output, made, strict=True))
        if node.op_type in WINDOW_OPS and node.domain in DEFAULT_DOMAINS:
            _check_window(node.op_type, attrs, label)
        if node.domain in DEFAULT_DOMAINS:
            _check_flags(node.op_type, attrs, label)
        _check_type_attributes(attrs, label)


# Integer attributes that are flags: onnxruntime refuses other values (Gemm's shape inference, the pools'
# PoolAttributes); aotc would read any nonzero value as 1.
_FLAGS = {"Gemm": ("transA", "transB"), "MaxPool": ("storage_order", "ceil_mode"),
          "AveragePool": ("ceil_mode", "count_include_pad"), "LpPool": ("ceil_mode",)}


def _check_flags(op: str, attrs: dict[str, onnx.AttributeProto], label: str) -> None:
    for name in _FLAGS.get(op, ()):
        if name in attrs and attrs[name].i not in (0, 1):
            raise AotcError(f"{label}: attribute {name} {attrs[name].i} must be 0 or 1")


def _type_name(elem: int) -> str:
    return onnx.TensorProto.DataType.Name(elem).lower() if elem in _DATA_TYPES else str(elem)


_TYPE_OF = {f"tensor({_type_name(t)})": t for t in _DATA_TYPES if t}
# Constant's value attributes and the type each makes (its "value" tensor says its own).
_CONSTANT_TYPES = {"value_float": onnx.TensorProto.FLOAT, "value_floats": onnx.TensorProto.FLOAT,
                   "value_int": onnx.TensorProto.INT64, "value_ints": onnx.TensorProto.INT64,
                   "value_string": onnx.TensorProto.STRING, "value_strings": onnx.TensorProto.STRING}


def _check_types(node: onnx.NodeProto, schema: onnx.defs.OpSchema, attrs: dict[str, onnx.AttributeProto],
                 types: ChainMap[str, int], label: str, op: str) -> list[int]:
    """What onnxruntime checks when it loads a model: each input of known type has a type its
    parameter allows, and the inputs bound to one type variable (T of Add's A and B) have one type.
    Returns the outputs' types as far as the schema and the attributes tell (0: unknown): a type
    variable bound by the inputs, a parameter with one allowed type, an element-type attribute
    (Cast's to) or a Constant's value. aotc infers types again later; these only serve the checks."""
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[int, str]] = {}
    for i, name in enumerate(node.input):
        elem = types.get(name, 0) if name else 0
        if not elem:
            continue
        param = schema.inputs[min(i, len(schema.inputs) - 1)]
        what = f"input {i} ({param.name}) {name!r}"
        options = allowed.get(param.type_str, [param.type_str])
        if f"tensor({_type_name(elem)})" not in options and not any(t.startswith(("seq(", "optional("))
                                                                     for t in options):
            raise AotcError(f"{label}: {what} is {_type_name(elem)}, which {op} does not take there")
        if param.type_str in allowed and param.is_homogeneous:
            first = bound.setdefault(param.type_str, (elem, what))
            if first[0] != elem:
                raise AotcError(f"{label}: {what} is {_type_name(elem)} but {first[1]} is "
                                f"{_type_name(first[0])} (both {param.type_str} of {op})")
    made = []
    for i in range(len(node.output)):
        param = schema.outputs[min(i, len(schema.outputs) - 1)]
        options = allowed.get(param.type_str, [param.type_str])
        elem = bound[param.type_str][0] if param.type_str in bound else \
            _TYPE_OF.get(options[0], 0) if len(options) == 1 else 0
        if not elem and node.op_type == "Constant" and len(attrs) == 1:
            (name, a), = attrs.items()
            elem = a.t.data_type if name == "value" else _CONSTANT_TYPES.get(name, 0)
        for name in DTYPE_ATTRS:
            if not elem and name in attrs and attrs[name].type == onnx.AttributeProto.INT:
                elem = attrs[name].i
        made.append(elem if elem in _DATA_TYPES and f"tensor({_type_name(elem)})" in options else 0)
    return made


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
    auto = attrs["auto_pad"].s.decode("utf-8", "replace") if "auto_pad" in attrs else "NOTSET"
    if auto not in AUTO_PADS:
        raise AotcError(f"{label}: attribute auto_pad {auto!r} is not one of {', '.join(AUTO_PADS)}")
    if op in EXPLICIT_OR_AUTO_PADS and pads is not None and auto != "NOTSET":
        raise AotcError(f"{label}: attributes pads {pads} and auto_pad {auto!r} exclude each other "
                        "(onnxruntime's rule)")
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
