"""Sequences and optionals rewritten into plain tensors before import.

aotc compiles one static graph of tensors, so a sequence whose length is known at compile time is
just a list of tensor names and an optional is a tensor name (or a sequence) or absent. This pass
tracks those values through the graph and replaces the sequence ops with tensor ops (``Identity``,
``Concat``, ``Split``, ``Unsqueeze``, ``Squeeze``) or with nothing; ``SequenceMap`` is unrolled,
one renamed copy of its body per element. Positions, split sizes and the like must be compile-time
constants: initializers, Constant nodes, or values computed from those and from static shapes.

At the graph's edges (see README.md, "Sequences and optionals"): a sequence input ``x`` of n
elements becomes the tensor inputs ``x.0`` .. ``x.{n-1}``, n being the number of element shapes
the caller pins; a sequence output ``y`` becomes the outputs ``y.0`` ..; an optional input is its
element, or absent when its shape is given as None; a present optional output is its element.

The pass runs twice. Before control flow is inlined (``final=False``) it only expands the graph's
sequence inputs and replaces ``SequenceLength`` by constants where the length is known, so that a
``Loop`` over a sequence has a constant trip count; everything else is left for the second run
(``final=True``), after control flow, which removes every sequence and optional or reports why not.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotc.errors import AotcError

SEQUENCE_OPS = frozenset({
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceAt",
    "SequenceLength", "ConcatFromSequence", "SplitToSequence", "SequenceMap",
    "Optional", "OptionalHasElement", "OptionalGetElement",
})

Shapes = dict[str, tuple[int, ...] | None]
# What a name holds: a tensor (its own name or the tensor it aliases), a sequence (element tensor
# names), an absent optional (None), or, before control flow is inlined, something not known yet.
_UNKNOWN = object()


class _Unresolved(Exception):
    """A value the first run cannot know yet (the second run reports it as an AotcError)."""


def resolve_sequences(model: onnx.ModelProto, shapes: Shapes | None = None,
                      final: bool = True) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]]]:
    """``model`` without sequences and optionals (``final``), and ``shapes`` without the entries the
    pass consumed (absent optional inputs). ``shapes`` gives sequence inputs' element shapes as
    ``name.0``, ``name.1``, ... and marks an absent optional input with None."""
    shapes = dict(shapes or {})
    if not _uses_sequences(model):
        absent = sorted(k for k, v in shapes.items() if v is None)
        if absent:
            raise AotcError(f"input {absent[0]!r} is not optional, so it cannot be left absent")
        return model, shapes  # type: ignore[return-value]
    return _Resolver(model, shapes, final).run()


def _uses_sequences(model: onnx.ModelProto) -> bool:
    def non_tensor(vi: onnx.ValueInfoProto) -> bool:
        return vi.type.WhichOneof("value") not in ("tensor_type", None)
    return (any(n.op_type in SEQUENCE_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node)
            or any(non_tensor(vi) for vi in [*model.graph.input, *model.graph.output]))


def _all_names(g: onnx.GraphProto, acc: set[str]) -> set[str]:
    acc |= {vi.name for vi in [*g.input, *g.output, *g.value_info]} | {t.name for t in g.initializer}
    for n in g.node:
        acc |= set(n.input) | set(n.output)
        for a in n.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                _all_names(sub, acc)
    return acc


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} node {node.name or node.output[0]!r}"


class _Resolver:
    def __init__(self, model: onnx.ModelProto, shapes: Shapes, final: bool) -> None:
        self.model, self.shapes, self.final = model, shapes, final
        self.opset = next((int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")), 1)
        self.vals: dict[str, object] = {}        # names that hold something other than themselves
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.used = _all_names(model.graph, set())
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []  # the graph's inputs, sequences expanded
        self.emitted: list[onnx.NodeProto] = []      # every node output so far, in order
        self._inferred: dict[str, tuple[int, ...]] = {}
        self._inferred_count = -1
        self._recorded: set[int] = set()

    # -- driver ---------------------------------------------------------------------------------
    def run(self) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]]]:
        out = onnx.ModelProto()
        out.CopyFrom(self.model)
        g = out.graph
        inputs, nodes = self._expand_inputs()
        nodes += self._process(list(g.node))
        outputs = self._outputs(nodes) if self.final else list(g.output)
        del g.input[:], g.node[:], g.output[:]
        g.input.extend(inputs)
        g.node.extend(nodes)
        g.output.extend(outputs)
        if self.final:  # (the first run keeps the original nodes, which need no new initializers)
            g.initializer.extend(self.inits)
            # Stale sequence types would only confuse ONNX's shape inference later.
            keep = [vi for vi in g.value_info if vi.type.HasField("tensor_type")]
            del g.value_info[:]
            g.value_info.extend(keep)
        return out, {k: v for k, v in self.shapes.items() if v is not None}

    def _process(self, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        res: list[onnx.NodeProto] = []
        for node in nodes:
            handler = getattr(self, f"_op_{node.op_type}", None) if node.domain in ("", "ai.onnx") else None
            if handler is not None and not (node.op_type in ("Identity", "Where") and not self._touches(node)):
                try:
                    emitted = handler(node)
                except _Unresolved:
                    if self.final:
                        raise
                    for o in node.output:
                        self.vals[o] = _UNKNOWN
                    emitted = None
                if self.final:
                    self._emit(emitted or [], res)
                elif node.op_type == "SequenceLength" and emitted:
                    self._emit(emitted, res)
                else:
                    self._emit([node], res)
                continue
            if self.final:
                node = self._tensor_inputs(node)
            elif _subgraphs(node):  # a Loop or Scan may produce sequences: nothing known about them
                for o in node.output:
                    self.vals[o] = _UNKNOWN
            self._emit([node], res)
        return res

    def _emit(self, nodes: list[onnx.NodeProto], res: list[onnx.NodeProto]) -> None:
        """Append ``nodes`` to ``res``, and record them (once: an unrolled SequenceMap body is
        recorded as it is built, then handed up) for constants and shapes."""
        for n in nodes:
            res.append(n)
            if id(n) not in self._recorded:
                self._recorded.add(id(n))
                self.emitted.append(n)
                for o in n.output:
                    self.producer[o] = n

    def _touches(self, node: onnx.NodeProto) -> bool:
        return any(i in self.vals for i in node.input)

    def _tensor_inputs(self, node: onnx.NodeProto) -> onnx.NodeProto:
        """``node`` reading the tensors its optional inputs alias; sequences are refused."""
        if not self._touches(node):
            return node
        m = onnx.NodeProto()
        m.CopyFrom(node)
        m.input[:] = [self._tensor(i, node) if i else i for i in node.input]
        return m

    # -- values ---------------------------------------------------------------------------------
    def _get(self, name: str) -> object:
        v = self.vals.get(name, name)
        if v is _UNKNOWN:
            raise _Unresolved(name)
        return v

    def _tensor(self, name: str, node: onnx.NodeProto) -> str:
        v = self._get(name)
        if isinstance(v, str):
            return v
        what = "an empty optional" if v is None else "a sequence"
        raise AotcError(f"{_label(node)}: input {name!r} is {what}, where a tensor is needed")

    def _seq(self, name: str, node: onnx.NodeProto) -> list[str]:
        v = self._get(name)
        if isinstance(v, list):
            return list(v)
        raise AotcError(f"{_label(node)}: input {name!r} is not a sequence")

    def _fresh(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.used:
            i += 1
            name = f"{hint}_{i}"
        self.used.add(name)
        return name

    def _int(self, node: onnx.NodeProto, index: int, what: str) -> int | None:
        """The constant integer at input ``index`` (None when absent)."""
        if index >= len(node.input) or not node.input[index]:
            return None
        v = self._const(node.input[index])
        if v is None:
            if not self.final:
                raise _Unresolved(node.input[index])
            raise AotcError(f"{_label(node)}: the {what} ({node.input[index]!r}) must be a compile-time "
                            "constant (an initializer, a Constant node, or computed from static shapes)")
        if v.size != 1:
            raise AotcError(f"{_label(node)}: the {what} must hold one integer, not {v.size}")
        return int(v.reshape(-1)[0])

    def _const(self, name: str, depth: int = 0) -> np.ndarray | None:
        """The value of ``name`` if it can be computed at compile time (small subgraphs only)."""
        if name in self.consts:
            return self.consts[name]
        node = self.producer.get(name)
        if node is None or depth > 64 or _subgraphs(node) or node.domain not in ("", "ai.onnx") \
                or "Random" in node.op_type:
            return None
        if node.op_type in ("Shape", "Size"):
            shape = self._shape(node.input[0])
            if shape is None:
                return None
            if node.op_type == "Size":
                value = np.array(int(np.prod(shape)), np.int64)
            else:
                attrs = {a.name: a.i for a in node.attribute}
                value = np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)
        else:
            ins = [self._const(i, depth + 1) if i else None for i in node.input]
            if any(x is None for x, i in zip(ins, node.input, strict=True) if i):
                return None
            value = self._evaluate(node, ins)
            if value is None:
                return None
        self.consts[name] = value
        return value

    def _evaluate(self, node: onnx.NodeProto, ins: list[np.ndarray | None]) -> np.ndarray | None:
        from onnx.reference import ReferenceEvaluator

        names = [f"i{k}" if x is not None else "" for k, x in enumerate(ins)]
        m = onnx.NodeProto()
        m.CopyFrom(node)
        m.input[:] = names
        m.output[:] = ["out"] + [f"o{k}" for k in range(1, len(node.output))]
        inits = [numpy_helper.from_array(x, n) for x, n in zip(ins, names, strict=True) if x is not None]
        g = helper.make_graph([m], "fold", [], [helper.make_empty_tensor_value_info("out")], inits)
        try:
            model = helper.make_model(g, opset_imports=list(self.model.opset_import), ir_version=9)
            return np.asarray(ReferenceEvaluator(model).run(None, {})[0])
        except Exception:  # noqa: BLE001 - not foldable here; the caller reports the need for a constant
            return None

    def _shape(self, name: str) -> tuple[int, ...] | None:
        """The static shape of tensor ``name``, from ONNX's shape inference over the nodes emitted so
        far (plain tensor ops, with the pinned input shapes); inferred again when they changed."""
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name not in self._inferred and self._inferred_count != len(self.emitted):
            self._inferred_count = len(self.emitted)
            self._inferred = self._infer()
        return self._inferred.get(name)

    def _infer(self) -> dict[str, tuple[int, ...]]:
        inits = [*self.model.graph.initializer, *self.inits]
        g = helper.make_graph(self.emitted, "partial", self._pinned_inputs(), [], inits)
        try:
            m = helper.make_model(g, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
            m = onnx.shape_inference.infer_shapes(m, strict_mode=False)
        except Exception:  # noqa: BLE001 - shapes stay unknown
            return {}
        res = {}
        for vi in [*m.graph.input, *m.graph.value_info]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                dims = vi.type.tensor_type.shape.dim
                if all(d.HasField("dim_value") for d in dims):
                    res[vi.name] = tuple(int(d.dim_value) for d in dims)
        return res

    def _pinned_inputs(self) -> list[onnx.ValueInfoProto]:
        res = []
        for vi in self.inputs:
            shape = self.shapes.get(vi.name)
            if shape is not None and vi.type.HasField("tensor_type"):
                vi = helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, list(shape))
            res.append(vi)
        return res

    # -- the graph's inputs and outputs ---------------------------------------------------------
    def _expand_inputs(self) -> tuple[list[onnx.ValueInfoProto], list[onnx.NodeProto]]:
        inits = {t.name for t in self.model.graph.initializer}
        inputs: list[onnx.ValueInfoProto] = []
        nodes: list[onnx.NodeProto] = []
        for vi in self.model.graph.input:
            t = vi.type
            kind = t.WhichOneof("value")
            if vi.name in inits or kind in ("tensor_type", None):
                if vi.name in self.shapes and self.shapes[vi.name] is None:
                    raise AotcError(f"input {vi.name!r} is not optional, so it cannot be left absent")
                inputs.append(vi)
                continue
            if kind == "optional_type":
                if vi.name in self.shapes and self.shapes[vi.name] is None:  # absent
                    nodes.append(helper.make_node("Optional", [], [vi.name], type=t.optional_type.elem_type))
                    continue
                t = t.optional_type.elem_type
                if t.HasField("tensor_type"):  # present: the tensor itself, which optional ops accept
                    w = onnx.ValueInfoProto()
                    w.name = vi.name
                    w.type.CopyFrom(t)
                    inputs.append(w)
                    continue
            if not t.HasField("sequence_type") or not t.sequence_type.elem_type.HasField("tensor_type"):
                raise AotcError(f"input {vi.name!r}: only tensors, sequences of tensors and optionals "
                                "of those are supported")
            elem = t.sequence_type.elem_type.tensor_type
            names = []
            while f"{vi.name}.{len(names)}" in self.shapes:
                names.append(f"{vi.name}.{len(names)}")
            if not names:
                raise AotcError(f"sequence input {vi.name!r}: its length is fixed at compile time; give each "
                                f"element's shape as {vi.name}.0, {vi.name}.1, ... (--input-shape "
                                f"{vi.name}.0=D1,D2); an empty sequence is no input, use SequenceEmpty")
            for n in names:
                if n in self.used:
                    raise AotcError(f"sequence input {vi.name!r}: element name {n!r} is taken by another tensor")
                self.used.add(n)
                shape = [d.dim_value or d.dim_param or None for d in elem.shape.dim] if elem.HasField("shape") \
                    else list(self.shapes[n] or ())
                inputs.append(helper.make_tensor_value_info(n, elem.elem_type, shape))
            nodes.append(helper.make_node("SequenceConstruct", names, [vi.name]))
        self.inputs = inputs
        return inputs, self._process(nodes)

    def _outputs(self, nodes: list[onnx.NodeProto]) -> list[onnx.ValueInfoProto]:
        res = []
        for vi in self.model.graph.output:
            v = self._get(vi.name)
            if vi.name not in self.vals:  # a tensor, perhaps declared as an optional
                if not vi.type.HasField("tensor_type"):
                    t = vi.type.optional_type.elem_type
                    vi = helper.make_tensor_value_info(vi.name, t.tensor_type.elem_type, None)
                res.append(vi)
                continue
            t = vi.type.optional_type.elem_type if vi.type.HasField("optional_type") else vi.type
            if t.HasField("sequence_type"):
                t = t.sequence_type.elem_type
            elem_type = t.tensor_type.elem_type if t.HasField("tensor_type") else 0
            if v is None:
                raise AotcError(f"graph output {vi.name!r} is an empty optional; a compiled library always "
                                "returns its outputs, so it cannot return nothing")
            names = [(vi.name, v)] if isinstance(v, str) else \
                [(f"{vi.name}.{j}", e) for j, e in enumerate(v)]  # type: ignore[arg-type]
            for name, elem in names:
                if name != vi.name and name in self.used:
                    raise AotcError(f"sequence output {vi.name!r}: element name {name!r} is taken by another tensor")
                self.used.add(name)
                nodes.append(helper.make_node("Identity", [elem], [name]))
                res.append(helper.make_tensor_value_info(name, elem_type, None))
        return res

    # -- the ops --------------------------------------------------------------------------------
    def _set_tensor(self, out: str, src: str) -> list[onnx.NodeProto]:
        self.vals.pop(out, None)
        return [helper.make_node("Identity", [src], [out])]

    def _op_SequenceConstruct(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        self.vals[node.output[0]] = [self._tensor(i, node) for i in node.input]
        return []

    def _op_SequenceEmpty(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        self.vals[node.output[0]] = []
        return []

    def _position(self, node: onnx.NodeProto, index: int, n: int, default: int, insert: bool) -> int:
        pos = self._int(node, index, "position")
        pos = default if pos is None else pos
        hi = n if insert else n - 1
        if not -n <= pos <= hi:
            raise AotcError(f"{_label(node)}: position {pos} is out of range for a sequence of {n}")
        return pos + n if pos < 0 else pos

    def _op_SequenceInsert(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        seq = self._seq(node.input[0], node)
        seq.insert(self._position(node, 2, len(seq), len(seq), True), self._tensor(node.input[1], node))
        self.vals[node.output[0]] = seq
        return []

    def _op_SequenceErase(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        seq = self._seq(node.input[0], node)
        del seq[self._position(node, 1, len(seq), len(seq) - 1, False)]
        self.vals[node.output[0]] = seq
        return []

    def _op_SequenceAt(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        seq = self._seq(node.input[0], node)
        return self._set_tensor(node.output[0], seq[self._position(node, 1, len(seq), 0, False)])

    def _op_SequenceLength(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        value = np.array(len(self._seq(node.input[0], node)), np.int64)
        self.consts[node.output[0]] = value
        return [helper.make_node("Constant", [], [node.output[0]], value=numpy_helper.from_array(value))]

    def _op_ConcatFromSequence(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        seq = self._seq(node.input[0], node)
        attrs = {a.name: a.i for a in node.attribute}
        if not seq:
            raise AotcError(f"{_label(node)}: cannot concatenate an empty sequence")
        axis, res = attrs["axis"], []
        if attrs.get("new_axis", 0):
            parts = [self._fresh(f"{node.output[0]}_part{j}") for j in range(len(seq))]
            for src, dst in zip(seq, parts, strict=True):
                res += self._axes_op("Unsqueeze", src, dst, axis)
            seq = parts
        return res + [helper.make_node("Concat", seq, [node.output[0]], axis=axis)]

    def _axes_op(self, op: str, src: str, dst: str, axis: int) -> list[onnx.NodeProto]:
        """Unsqueeze/Squeeze of one axis: axes are an input from opset 13, an attribute before."""
        if self.opset < 13:
            return [helper.make_node(op, [src], [dst], axes=[axis])]
        axes = self._fresh(f"{dst}_axes")
        self.inits.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
        return [helper.make_node(op, [src, axes], [dst])]

    def _op_SplitToSequence(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        attrs = {a.name: a.i for a in node.attribute}
        axis, keepdims = attrs.get("axis", 0), attrs.get("keepdims", 1)
        x = self._tensor(node.input[0], node)
        split = self._const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if len(node.input) > 1 and node.input[1] and split is None:
            if not self.final:
                raise _Unresolved(node.input[1])
            raise AotcError(f"{_label(node)}: the split sizes ({node.input[1]!r}) must be a compile-time constant")
        if split is None or split.ndim == 0:
            shape = self._shape(x)
            if shape is None:
                if not self.final:
                    raise _Unresolved(x)
                raise AotcError(f"{_label(node)}: the input's shape must be static to know the element count")
            dim = shape[axis]
            step = 1 if split is None else int(split)
            sizes = [min(step, dim - s) for s in range(0, dim, step)]
        else:
            sizes = [int(s) for s in split.reshape(-1)]
            keepdims = 1  # ignored when split sizes are given
        if not sizes:
            self.vals[node.output[0]] = []
            return []
        parts = [self._fresh(f"{node.output[0]}_{j}") for j in range(len(sizes))]
        res = []
        if self.opset < 13:
            res.append(helper.make_node("Split", [x], parts, axis=axis, split=sizes))
        else:
            sizes_name = self._fresh(f"{node.output[0]}_sizes")
            self.inits.append(numpy_helper.from_array(np.array(sizes, np.int64), sizes_name))
            res.append(helper.make_node("Split", [x, sizes_name], parts, axis=axis))
        if not keepdims:
            squeezed = [self._fresh(f"{p}_squeezed") for p in parts]
            for p, q in zip(parts, squeezed, strict=True):
                res += self._axes_op("Squeeze", p, q, axis)
            parts = squeezed
        self.vals[node.output[0]] = parts
        return res

    def _op_SequenceMap(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        body = next(a.g for a in node.attribute if a.name == "body")
        ins = [self._get(i) for i in node.input]
        lengths = {len(v) for v in ins if isinstance(v, list)}
        if len(lengths) != 1 or not isinstance(ins[0], list):
            raise AotcError(f"{_label(node)}: its sequence inputs must have one length, not {sorted(lengths)}")
        if len(body.input) != len(ins) or len(body.output) != len(node.output):
            raise AotcError(f"{_label(node)}: the body must have {len(ins)} inputs and {len(node.output)} outputs")
        outs: list[list[str]] = [[] for _ in node.output]
        res: list[onnx.NodeProto] = []
        for j in range(lengths.pop()):
            prefix = self._fresh(f"{node.output[0]}_map{j}") + "_"
            defined = [vi.name for vi in body.input] + [t.name for t in body.initializer] + \
                [o for n in body.node for o in n.output if o]
            names = {n: self._fresh(prefix + n) for n in defined}
            for vi, v, name in zip(body.input, ins, node.input, strict=True):
                src = v[j] if isinstance(v, list) else self._tensor(name, node)
                self._emit([helper.make_node("Identity", [src], [names[vi.name]])], res)
            for t in body.initializer:
                u = onnx.TensorProto()
                u.CopyFrom(t)
                u.name = names[t.name]
                self.inits.append(u)
                self.consts[u.name] = numpy_helper.to_array(u)
            for k, vi in enumerate(body.output):
                outs[k].append(names.get(vi.name, vi.name))
            res += self._process([_renamed(n, names) for n in body.node])
        for o, elems in zip(node.output, outs, strict=True):
            self.vals[o] = [self._tensor(e, node) for e in elems]
        return res

    def _op_Optional(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        present = bool(node.input) and bool(node.input[0])
        self.vals[node.output[0]] = self._get(node.input[0]) if present else None
        return []

    def _op_OptionalHasElement(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        present = bool(node.input) and bool(node.input[0]) and self._get(node.input[0]) is not None
        value = np.array(present)
        self.consts[node.output[0]] = value
        return [helper.make_node("Constant", [], [node.output[0]], value=numpy_helper.from_array(value))]

    def _op_OptionalGetElement(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        v = self._get(node.input[0])
        if v is None:
            raise AotcError(f"{_label(node)}: the optional {node.input[0]!r} is empty")
        if isinstance(v, str):
            return self._set_tensor(node.output[0], v)
        self.vals[node.output[0]] = list(v)  # type: ignore[call-overload]
        return []

    def _op_Identity(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        v = self._get(node.input[0])
        if isinstance(v, str):
            return self._set_tensor(node.output[0], v)
        self.vals[node.output[0]] = list(v) if isinstance(v, list) else v
        return []

    def _op_Where(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """An If over sequences or optionals with a run-time condition (control_flow.py inlines it as
        Where): element by element when both sides have the same structure."""
        a, b = self._get(node.input[1]), self._get(node.input[2])
        cond = self._const(node.input[0])
        if cond is not None and cond.size == 1:
            v = a if bool(cond.reshape(-1)[0]) else b
            if isinstance(v, str):
                return self._set_tensor(node.output[0], v)
            self.vals[node.output[0]] = list(v) if isinstance(v, list) else v
            return []
        c = self._tensor(node.input[0], node)
        if isinstance(a, str) and isinstance(b, str):  # present optionals of tensors
            self.vals.pop(node.output[0], None)
            return [helper.make_node("Where", [c, a, b], [node.output[0]])]
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            parts = [self._fresh(f"{node.output[0]}_{j}") for j in range(len(a))]
            self.vals[node.output[0]] = parts
            return [helper.make_node("Where", [c, x, y], [p]) for x, y, p in zip(a, b, parts, strict=True)]
        raise AotcError(f"If node (inlined as {node.output[0]!r}): its condition is only known at run time and "
                        f"its branches give {_describe(a)} and {_describe(b)}; aotc needs sequence lengths and "
                        "optional presence fixed at compile time")


def _describe(v: object) -> str:
    return "an empty optional" if v is None else f"a sequence of {len(v)}" if isinstance(v, list) else "a tensor"


def _renamed(node: onnx.NodeProto, names: dict[str, str]) -> onnx.NodeProto:
    """A copy of ``node`` with ``names`` applied to its inputs, outputs and its subgraphs' reads."""
    m = onnx.NodeProto()
    m.CopyFrom(node)
    m.input[:] = [names.get(i, i) for i in node.input]
    m.output[:] = [names.get(o, o) for o in node.output]
    for g in _subgraphs(m):
        _rename_reads(g, names)
    return m


def _rename_reads(g: onnx.GraphProto, names: dict[str, str]) -> None:
    local = {vi.name for vi in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    outer = {k: v for k, v in names.items() if k not in local}
    for n in g.node:
        n.input[:] = [outer.get(i, i) for i in n.input]
        for sub in _subgraphs(n):
            _rename_reads(sub, outer)
    for vi in g.output:
        vi.name = outer.get(vi.name, vi.name)
