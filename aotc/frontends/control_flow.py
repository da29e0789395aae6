"""Control flow rewritten into plain dataflow before import, since aotc compiles one static graph.

- ``If``: with a condition known at compile time (a constant, or computed from constants and static
  shapes) the taken branch's nodes replace the node; otherwise both branches are computed and each
  output is ``Where(cond, then, else)``, so their outputs must agree in shape.
- ``Loop``: unrolled. The trip count and the condition must be known at compile time; a condition
  the body computes is evaluated after each iteration and ends the unrolling once it is false. Scan
  outputs are the iterations' values stacked along a new axis 0.
- ``Scan`` (opset 8's batched form and 9+): unrolled over the static length of its scan inputs, each
  iteration reading one slice (``Gather`` at a constant index) and the outputs stacked with
  ``Unsqueeze`` + ``Concat`` along their axes, in either direction.
- ``ai.onnx.preview.FlexAttention`` with a ``score_mod`` or ``prob_mod`` graph: expanded into MatMul,
  the modifier graphs, Softmax and MatMul, as the op's function body does (without modifier graphs
  the native kernel runs it).

Values "known at compile time" are evaluated here with ``onnx.reference`` on the small subgraph
that computes them, when it only reads initializers, Constant nodes and the shapes of tensors whose
shapes are static (from ``onnx.shape_inference`` on the graph built so far, input shapes pinned).
A body's names get a prefix unique to its copy; names it reads from enclosing graphs are left alone,
also inside nested subgraphs, so nested control flow is inlined the same way when its turn comes.
The value types a loop carries do not matter here (sequences are resolved by a later pass).
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotc.errors import AotcError

FLEX_ATTENTION = "ai.onnx.preview.FlexAttention"
INLINED_OPS = frozenset({"If", "Loop", "Scan", FLEX_ATTENTION})
# Ops the rewriting of each inlined op emits, besides its subgraphs' own ops.
EMITTED_OPS: dict[str, frozenset[str]] = {
    "If": frozenset({"Identity", "Reshape", "Where"}),
    "Loop": frozenset({"Identity", "Unsqueeze", "Concat"}),
    "Scan": frozenset({"Identity", "Gather", "Unsqueeze", "Concat"}),
    FLEX_ATTENTION: frozenset({"Cast", "Gather", "Mul", "Transpose", "MatMul", "Softmax"}),
}
# Inputs of inlined ops that must be known at compile time (the runner of the backend suite pins the
# graph inputs they depend on, as a user pins shapes).
STATIC_INPUTS: dict[str, tuple[int, ...]] = {"Loop": (0, 1)}
# Nodes that unrolling may add to one model; beyond it a model (a trip count of 10**9, say) is refused
# rather than left to exhaust time and memory.
MAX_UNROLLED_NODES = 20_000

_RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                         "Bernoulli", "Multinomial"})
_LARGE_CONSTANT = 4096  # elements; larger initializers reach shape inference as typed inputs only


def _op_key(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _graphs(node: onnx.NodeProto) -> dict[str, onnx.GraphProto]:
    return {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}


def is_inlined(node: onnx.NodeProto) -> bool:
    """Whether the frontend rewrites ``node`` (FlexAttention only when it carries modifier graphs)."""
    key = _op_key(node)
    return key in INLINED_OPS and (key != FLEX_ATTENTION or bool(_graphs(node)))


def inline_control_flow(model: onnx.ModelProto,
                        input_shapes: dict[str, tuple[int, ...]] | None = None) -> onnx.ModelProto:
    """``model`` with every If, Loop and Scan (at any depth of nesting) and every FlexAttention with
    modifier graphs replaced by plain nodes. ``input_shapes`` pins dynamic input dimensions, for the
    loops whose lengths depend on them."""
    if not any(is_inlined(n) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inliner = _Inliner(out, dict(input_shapes or {}))
    inliner.run(list(out.graph.node))
    del out.graph.node[:]
    out.graph.node.extend(inliner.nodes)
    out.graph.initializer.extend(inliner.new_inits)
    return out


def _defined(g: onnx.GraphProto) -> set[str]:
    return ({i.name for i in g.input} | {i.name for i in g.initializer}
            | {o for n in g.node for o in n.output if o})


def _renamed(node: onnx.NodeProto, names: dict[str, str], prefix: str = "") -> onnx.NodeProto:
    """A copy of ``node`` reading and writing renamed values, also where its subgraphs read them."""
    m = onnx.NodeProto()
    m.CopyFrom(node)
    if m.name:
        m.name = prefix + m.name
    m.input[:] = [names.get(i, i) for i in node.input]
    m.output[:] = [names.get(o, o) for o in node.output]
    for a in m.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            a.g.CopyFrom(_renamed_graph(a.g, names))
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                g.CopyFrom(_renamed_graph(g, names))
    return m


def _renamed_graph(g: onnx.GraphProto, names: dict[str, str]) -> onnx.GraphProto:
    """``g`` reading renamed outer values; the names it defines itself shadow the renaming."""
    defined = _defined(g)
    inner = {k: v for k, v in names.items() if k not in defined}
    if not inner:
        return g
    h = onnx.GraphProto()
    h.CopyFrom(g)
    del h.node[:]
    h.node.extend(_renamed(n, inner) for n in g.node)
    for o in h.output:
        o.name = inner.get(o.name, o.name)
    return h


def _size(g: onnx.GraphProto) -> int:
    """Nodes in ``g``, its subgraphs' included."""
    return sum(1 + sum(_size(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH) for n in g.node)


def _all_names(g: onnx.GraphProto, acc: list[str]) -> list[str]:
    acc += [i.name for i in g.input] + [i.name for i in g.initializer]
    for n in g.node:
        acc += list(n.output)
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _all_names(sub, acc)
    return acc


def _scalar(v: np.ndarray, what: str) -> np.ndarray:
    if v.size != 1:
        raise AotcError(f"{what} must hold one element, not {v.size}")
    return v.reshape(-1)[0]


class _Inliner:
    """Appends the rewritten nodes to ``nodes`` in order, evaluating what must be static on the way."""

    def __init__(self, model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]]) -> None:
        self.model = model
        self.opset = next((int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx")), 1)
        # Graphs built for shape inference and evaluation: from IR 4 on, initializers need not be inputs.
        self.ir_version = max(int(model.ir_version), 4)
        self.nodes: list[onnx.NodeProto] = []
        self.new_inits: list[onnx.TensorProto] = []
        self.position: dict[str, int] = {}      # value -> index in nodes of its producer
        self.inits = {i.name: i for i in model.graph.initializer}
        self.values: dict[str, np.ndarray] = {}  # values known at compile time
        self.types: dict[str, tuple[tuple[int, ...] | None, int]] = {}  # value -> (static shape, elem)
        self.inputs: list[onnx.ValueInfoProto] = []
        for vi in model.graph.input:
            if vi.name in self.inits:
                continue
            w = onnx.ValueInfoProto()
            w.CopyFrom(vi)
            if vi.type.HasField("tensor_type"):
                t = vi.type.tensor_type
                dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
                shape = input_shapes.get(vi.name)
                if shape is None and t.HasField("shape") and all(d is not None for d in dims):
                    shape = tuple(dims)  # type: ignore[arg-type]
                if shape is not None:
                    w = helper.make_tensor_value_info(vi.name, t.elem_type, list(shape))
                    self.types[vi.name] = (tuple(int(d) for d in shape), t.elem_type)
            self.inputs.append(w)
        self.inferred = -1  # len(nodes) at the last shape inference
        self.budget = MAX_UNROLLED_NODES
        self.counter = 0
        # Every prefix starts with a stem no name of the model starts with, so none can collide.
        taken = sorted(_all_names(model.graph, []))
        self.stem = "cf"
        while (k := bisect.bisect_left(taken, self.stem)) < len(taken) and taken[k].startswith(self.stem):
            self.stem += "_"

    # -- building ---------------------------------------------------------------------------------
    def fresh(self, kind: str) -> str:
        self.counter += 1
        return f"{self.stem}{kind}{self.counter}_"

    def emit(self, op: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def append(self, node: onnx.NodeProto) -> None:
        for o in node.output:
            if o:
                self.position[o] = len(self.nodes)
        self.nodes.append(node)

    def constant(self, name: str, value: np.ndarray) -> str:
        t = numpy_helper.from_array(value, name)
        self.new_inits.append(t)
        self.inits[name] = t
        self.values[name] = value
        return name

    def run(self, nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            if not is_inlined(node):
                self.append(node)
                continue
            key = _op_key(node)
            label = f"{key} node {node.name or list(node.output)!r}"
            {"If": self.inline_if, "Loop": self.unroll_loop, "Scan": self.unroll_scan,
             FLEX_ATTENTION: self.expand_flex_attention}[key](node, label)

    def copy_graph(self, g: onnx.GraphProto, inputs: list[str], prefix: str, label: str) -> list[str]:
        """Append a copy of ``g`` reading ``inputs`` for its inputs; return its outputs' names."""
        if len(inputs) != len(g.input):
            raise AotcError(f"{label}: its graph {g.name!r} declares {len(g.input)} inputs, expected "
                            f"{len(inputs)}")
        names = {i.name: x for i, x in zip(g.input, inputs, strict=True)}
        names |= {n: prefix + n for n in [i.name for i in g.initializer] + [o for n in g.node for o in n.output if o]}
        for init in g.initializer:
            t = onnx.TensorProto()
            t.CopyFrom(init)
            t.name = names[init.name]
            self.new_inits.append(t)
            self.inits[t.name] = t
        self.run([_renamed(n, names, prefix) for n in g.node])
        return [names.get(o.name, o.name) for o in g.output]

    def spend(self, iterations: int, per_iteration: int, label: str) -> None:
        """Count nodes an unrolling adds against MAX_UNROLLED_NODES; refuse the model beyond it."""
        self.budget -= iterations * per_iteration
        if self.budget < 0:
            raise AotcError(f"{label}: unrolling it exceeds {MAX_UNROLLED_NODES} nodes in all (its body "
                            f"has {per_iteration}); aotc unrolls loops into a static graph and refuses larger ones")

    def stack(self, xs: list[str], axis: int, out: str) -> None:
        """``out`` = the ``xs`` (of equal shapes) stacked along a new axis ``axis``."""
        p = self.fresh("stack")
        if self.opset >= 13:
            axes = self.constant(f"{p}axes", np.array([axis], np.int64))
            parts = [self.emit("Unsqueeze", [x, axes], f"{p}{i}") for i, x in enumerate(xs)]
        else:
            parts = [self.emit("Unsqueeze", [x], f"{p}{i}", axes=[axis]) for i, x in enumerate(xs)]
        self.emit("Concat", parts, out, axis=axis)

    def take(self, x: str, index: int, axis: int, prefix: str) -> str:
        """The slice ``index`` of ``x`` along ``axis``, that axis removed."""
        i = self.constant(f"{prefix}{index}_index", np.array(index, np.int64))
        return self.emit("Gather", [x, i], f"{prefix}{index}_slice", axis=axis)

    # -- If ---------------------------------------------------------------------------------------
    def inline_if(self, node: onnx.NodeProto, label: str) -> None:
        branches = _graphs(node)
        if set(branches) != {"then_branch", "else_branch"}:
            raise AotcError(f"{label}: needs then_branch and else_branch graphs")
        prefix = self.fresh("if")
        cond = self.static_value(node.input[0])
        if cond is not None:
            taken = "then_branch" if bool(_scalar(cond, f"{label}: the condition")) else "else_branch"
            outs = self.copy_graph(branches[taken], [], f"{prefix}{taken[:4]}_", label)
            for o, n in zip(outs, node.output, strict=False):
                if n:
                    self.emit("Identity", [o], n)
            return
        then = self.copy_graph(branches["then_branch"], [], f"{prefix}then_", label)
        other = self.copy_graph(branches["else_branch"], [], f"{prefix}else_", label)
        if len(then) != len(node.output) or len(other) != len(node.output):
            raise AotcError(f"{label}: the branches must produce {len(node.output)} outputs")
        # The condition is a one-element tensor of any rank; as a scalar it broadcasts without
        # changing the outputs' rank.
        scalar = self.emit("Reshape", [node.input[0], self.constant(f"{prefix}shape", np.zeros(0, np.int64))],
                           f"{prefix}cond")
        for t, e, o in zip(then, other, node.output, strict=True):
            self.emit("Where", [scalar, t, e], o)

    # -- Loop -------------------------------------------------------------------------------------
    def unroll_loop(self, node: onnx.NodeProto, label: str) -> None:
        body = _graphs(node).get("body")
        if body is None:
            raise AotcError(f"{label}: has no body graph")
        ins = list(node.input) + [""] * (2 - len(node.input))
        carried = ins[2:]
        n_carried, n_scan = len(carried), len(body.output) - 1 - len(carried)
        if len(body.input) != 2 + n_carried or n_scan < 0:
            raise AotcError(f"{label}: its body must take {2 + n_carried} inputs and produce at least "
                            f"{1 + n_carried} outputs")
        trip = None
        if ins[0]:
            trip = max(0, int(_scalar(self.must_be_static(ins[0], label, "trip count"), f"{label}: the trip count")))
        go = True
        if ins[1]:
            go = bool(_scalar(self.must_be_static(ins[1], label, "condition"), f"{label}: the condition"))
        # A body that passes its condition through never ends the loop early: no need to evaluate it.
        cond_in, cond_out = body.input[1].name, body.output[0].name
        producer = {o: n for n in body.node for o in n.output}
        p = producer.get(cond_out)
        passthrough = cond_out == cond_in or (p is not None and p.op_type == "Identity" and p.input[0] == cond_in)
        if trip is None and passthrough and go:
            raise AotcError(f"{label}: has neither a trip count nor a condition its body computes, so it "
                            "never ends")
        size = _size(body) + 1  # and the iteration number's constant
        if go and trip is not None and passthrough:
            self.spend(trip, size, label)  # up front, for all iterations
        prefix = self.fresh("loop")
        cond = self.constant(f"{prefix}cond", np.array(go))
        scans: list[list[str]] = [[] for _ in range(n_scan)]
        i = 0
        while go and (trip is None or i < trip):
            it = f"{prefix}{i}_"
            if not passthrough:
                self.spend(1, size, label)
            outs = self.copy_graph(body, [self.constant(f"{it}iter", np.array(i, np.int64)), cond, *carried],
                                   it, label)
            carried = outs[1:1 + n_carried]
            for k in range(n_scan):
                scans[k].append(outs[1 + n_carried + k])
            i += 1
            if not passthrough:
                cond = outs[0]
                go = bool(_scalar(self.must_be_static(cond, label, "condition after an iteration"),
                                  f"{label}: the condition"))
        for x, o in zip(carried, node.output, strict=False):
            if o:
                self.emit("Identity", [x], o)
        for k, o in enumerate(node.output[n_carried:]):
            if o and not scans[k]:
                raise AotcError(f"{label}: runs no iteration, so its scan output {o!r} is empty with a "
                                "shape aotc cannot tell")
            if o:
                self.stack(scans[k], 0, o)

    # -- Scan -------------------------------------------------------------------------------------
    def unroll_scan(self, node: onnx.NodeProto, label: str) -> None:
        body = _graphs(node).get("body")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if body is None or "num_scan_inputs" not in attrs:
            raise AotcError(f"{label}: needs a body graph and num_scan_inputs")
        n_in = int(attrs["num_scan_inputs"])
        ins = list(node.input)
        batched = self.opset < 9  # Scan-8: a leading batch axis, and an optional sequence_lens input
        seq_lens = ins.pop(0) if batched and ins else ""
        n_state = len(ins) - n_in
        n_out = len(body.output) - n_state
        if n_state < 0 or n_out < 0 or len(body.input) != len(ins):
            raise AotcError(f"{label}: its body must take {len(ins)} inputs and produce at least {n_state} outputs")
        states, xs = ins[:n_state], ins[n_state:]
        dirs_in = list(attrs.get("directions" if batched else "scan_input_directions", [])) or [0] * n_in
        axes_in = [0] * n_in if batched else list(attrs.get("scan_input_axes", [])) or [0] * n_in
        dirs_out = [0] * n_out if batched else list(attrs.get("scan_output_directions", [])) or [0] * n_out
        axes_out = [0] * n_out if batched else list(attrs.get("scan_output_axes", [])) or [0] * n_out
        if len(dirs_in) != n_in or len(axes_in) != n_in or len(dirs_out) != n_out or len(axes_out) != n_out:
            raise AotcError(f"{label}: its direction and axis lists must have one entry per scan input/output")
        prefix = self.fresh("scan")
        if not batched:
            finals, ys = self.scan_steps(body, states, xs, axes_in, dirs_in, prefix, label)
            for x, o in zip(finals, node.output, strict=False):
                if o:
                    self.emit("Identity", [x], o)
            for k, o in enumerate(node.output[n_state:]):
                if o:
                    self.stack_scan_output(ys[k], axes_out[k], dirs_out[k], o, label)
            return
        shape = self.shape_of(xs[0]) if xs else None
        if shape is None:
            raise AotcError(f"{label}: the shape of its scan input {xs[0]!r} is not known at compile time")
        if seq_lens:  # only a sequence_lens that covers every sequence entirely is a static scan
            lens = self.must_be_static(seq_lens, label, "sequence_lens")
            if lens.size and np.any(lens != shape[1]):
                raise AotcError(f"{label}: sequence_lens shorter than the scan inputs are not supported")
        finals_b: list[list[str]] = [[] for _ in range(n_state)]
        ys_b: list[list[str]] = [[] for _ in range(n_out)]
        for b in range(shape[0]):
            pb = f"{prefix}b{b}_"
            sb = [self.take(s, b, 0, f"{pb}s{j}_") for j, s in enumerate(states)]
            xb = [self.take(x, b, 0, f"{pb}x{j}_") for j, x in enumerate(xs)]
            finals, ys = self.scan_steps(body, sb, xb, axes_in, dirs_in, pb, label)
            for j, f in enumerate(finals):
                finals_b[j].append(f)
            for k in range(n_out):
                self.stack_scan_output(ys[k], 0, dirs_out[k], f"{pb}y{k}", label)
                ys_b[k].append(f"{pb}y{k}")
        for j, o in enumerate(node.output[:n_state]):
            if o:
                self.stack(finals_b[j], 0, o)
        for k, o in enumerate(node.output[n_state:]):
            if o:
                self.stack(ys_b[k], 0, o)

    def scan_steps(self, body: onnx.GraphProto, states: list[str], xs: list[str], axes: list[int],
                   dirs: list[int], prefix: str, label: str) -> tuple[list[str], list[list[str]]]:
        """Unroll ``body`` over the scan inputs ``xs``; return the final states and, per scan output,
        its values in iteration order."""
        lengths, norm_axes = set(), []
        for x, a in zip(xs, axes, strict=True):
            shape = self.shape_of(x)
            if shape is None:
                raise AotcError(f"{label}: the shape of its scan input {x!r} is not known at compile time")
            if not -len(shape) <= a < len(shape):
                raise AotcError(f"{label}: scan axis {a} is out of range for an input of rank {len(shape)}")
            norm_axes.append(a % len(shape))
            lengths.add(shape[a % len(shape)])
        if len(lengths) != 1:
            raise AotcError(f"{label}: its scan inputs have different lengths {sorted(lengths)}")
        steps = lengths.pop()
        self.spend(steps, _size(body) + len(xs), label)  # the body and the slices
        ys: list[list[str]] = [[] for _ in range(len(body.output) - len(states))]
        for t in range(steps):
            it = f"{prefix}{t}_"
            elems = [self.take(x, steps - 1 - t if d else t, a, f"{it}x{j}_")
                     for j, (x, a, d) in enumerate(zip(xs, norm_axes, dirs, strict=True))]
            outs = self.copy_graph(body, [*states, *elems], it, label)
            states = outs[:len(states)]
            for k, y in enumerate(outs[len(states):]):
                ys[k].append(y)
        return states, ys

    def stack_scan_output(self, ys: list[str], axis: int, direction: int, out: str, label: str) -> None:
        if not ys:
            raise AotcError(f"{label}: scans zero elements, so its scan output {out!r} is empty with a shape "
                            "aotc cannot tell")
        if axis < 0:  # counted in the output's rank; older Unsqueezes take non-negative axes only
            shape = self.shape_of(ys[0])
            if shape is None:
                raise AotcError(f"{label}: the rank of its scan output {out!r} is not known at compile time")
            axis += len(shape) + 1
        self.stack(ys[::-1] if direction else ys, axis, out)

    # -- FlexAttention ----------------------------------------------------------------------------
    def expand_flex_attention(self, node: onnx.NodeProto, label: str) -> None:
        """The op's function body: scores = (Q*sqrt(s)) @ (K*sqrt(s))^T in Q's type, cast to the softmax
        type, score_mod, Softmax, prob_mod, @ V; K/V heads repeated for grouped queries."""
        graphs = _graphs(node)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in graphs}
        if len(node.input) < 3 or set(graphs) - {"score_mod", "prob_mod"}:
            raise AotcError(f"{label}: needs Q, K and V, and takes only score_mod and prob_mod graphs")
        q, k, v = node.input[:3]
        qs, ks = self.shape_of(q), self.shape_of(k)
        elem = self.elem_type(q)
        if qs is None or ks is None or len(qs) != 4 or len(ks) != 4 or not elem:
            raise AotcError(f"{label}: Q and K must be rank-4 tensors of shapes known at compile time")
        p = self.fresh("flex")
        if qs[1] != ks[1]:  # grouped queries: query head h reads K/V head h // (Hq / Hkv)
            if ks[1] <= 0 or qs[1] % ks[1]:
                raise AotcError(f"{label}: {qs[1]} query heads are not a multiple of {ks[1]} K/V heads")
            heads = self.constant(f"{p}heads", np.arange(qs[1], dtype=np.int64) // (qs[1] // ks[1]))
            k = self.emit("Gather", [k, heads], f"{p}k", axis=1)
            v = self.emit("Gather", [v, heads], f"{p}v", axis=1)
        scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(qs[3])
        root = self.emit("Cast", [self.constant(f"{p}root_f", np.array(np.sqrt(np.float32(scale))))],
                         f"{p}root", to=elem)
        kt = self.emit("Transpose", [self.emit("Mul", [k, root], f"{p}k_scaled")], f"{p}kt", perm=[0, 1, 3, 2])
        scores = self.emit("MatMul", [self.emit("Mul", [q, root], f"{p}q_scaled"), kt], f"{p}scores")
        soft = int(attrs.get("softmax_precision", onnx.TensorProto.DOUBLE if elem == onnx.TensorProto.DOUBLE
                             else onnx.TensorProto.FLOAT))
        x = self.emit("Cast", [scores], f"{p}scores_cast", to=soft)
        for attr, stage in (("score_mod", "score"), ("prob_mod", "prob")):
            if attr == "prob_mod":
                x = self.emit("Softmax", [x], f"{p}probs", axis=3)
            g = graphs.get(attr)
            if g is None:
                continue
            if len(g.input) != 1 or len(g.output) != 1:
                raise AotcError(f"{label}: {attr} must take one input and produce one output")
            x = self.copy_graph(g, [x], f"{p}{stage}_", label)[0]
        if soft == elem:
            self.emit("MatMul", [x, v], node.output[0])
        else:
            y = self.emit("MatMul", [x, self.emit("Cast", [v], f"{p}v_cast", to=soft)], f"{p}y")
            self.emit("Cast", [y], node.output[0], to=elem)

    # -- what is known at compile time ------------------------------------------------------------
    def must_be_static(self, name: str, label: str, what: str) -> np.ndarray:
        value = self.static_value(name)
        if value is None:
            raise AotcError(f"{label}: its {what} ({name!r}) is only known at run time; aotc unrolls loops "
                            "into a static graph, so it must follow from constants and input shapes "
                            "(pin the inputs it depends on)")
        return value

    def static_value(self, name: str) -> np.ndarray | None:
        """``name``'s value when it follows from initializers, Constant nodes and static shapes."""
        if not name:
            return None
        if name in self.values:
            return self.values[name]
        if name in self.inits:
            self.values[name] = numpy_helper.to_array(self.inits[name])
            return self.values[name]
        todo, seen, needed = [name], set(), {}
        while todo:
            x = todo.pop()
            if x in seen or x in self.values or x in self.inits:
                continue
            seen.add(x)
            pos = self.position.get(x)
            if pos is None:  # a graph input, or a name from an enclosing scope
                return None
            n = self.nodes[pos]
            if n.op_type in _RANDOM_OPS:
                return None
            if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx"):
                shape = self.shape_of(n.input[0])
                if shape is None:
                    return None
                if n.op_type == "Size":
                    self.values[x] = np.array(math.prod(shape), np.int64)
                else:
                    a = {at.name: at.i for at in n.attribute}
                    self.values[x] = np.array(shape[a.get("start", 0):a.get("end", len(shape))], np.int64)
                continue
            needed[pos] = n
            todo += [i for i in n.input if i]
        nodes = [needed[pos] for pos in sorted(needed)]
        made = {o for n in nodes for o in n.output if o}
        sources = sorted({i for n in nodes for i in n.input if i and i not in made})
        try:
            inits = [numpy_helper.from_array(np.asarray(self.static_value(s)), s) for s in sources]
            graph = helper.make_graph(nodes, "static", [], [onnx.ValueInfoProto(name=o) for o in sorted(made)],
                                      inits)
            m = helper.make_model(graph, opset_imports=list(self.model.opset_import),
                                  ir_version=self.ir_version)
            from onnx.reference import ReferenceEvaluator

            results = ReferenceEvaluator(m).run(None, {})
        except Exception:  # noqa: BLE001 - anything the evaluator cannot do is simply not static
            return None
        for o, r in zip(sorted(made), results, strict=True):
            if isinstance(r, np.ndarray | np.generic):
                self.values[o] = np.asarray(r)
        return self.values.get(name)

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        if name in self.values:
            return tuple(self.values[name].shape)
        if name in self.inits:
            return tuple(self.inits[name].dims)
        if name not in self.types or self.types[name][0] is None:
            self.infer()
        return self.types.get(name, (None, 0))[0]

    def elem_type(self, name: str) -> int:
        if name in self.inits:
            return self.inits[name].data_type
        if name not in self.types:
            self.infer()
        return self.types.get(name, (None, 0))[1]

    def infer(self) -> None:
        """Shapes and types of the graph built so far, from ONNX's shape inference (with the input
        shapes pinned and small constants' values propagated)."""
        if self.inferred == len(self.nodes):
            return
        self.inferred = len(self.nodes)
        inputs, inits = list(self.inputs), []
        for name, t in self.inits.items():
            if math.prod(t.dims) <= _LARGE_CONSTANT:
                inits.append(t)
            else:  # its type is all inference needs; copying megabytes of weights is not
                inputs.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
        graph = helper.make_graph(self.nodes, "prefix", inputs, [], inits)
        m = helper.make_model(graph, opset_imports=list(self.model.opset_import), ir_version=self.ir_version)
        m.functions.extend(self.model.functions)
        try:
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - a model inference rejects leaves its shapes unknown here
            return
        for vi in inferred.graph.value_info:
            if not vi.type.HasField("tensor_type"):
                continue
            t = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            static = t.HasField("shape") and all(d is not None for d in dims)
            self.types[vi.name] = (tuple(dims) if static else None, t.elem_type)  # type: ignore[arg-type]
