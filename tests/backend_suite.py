"""The ONNX backend test suite (node cases and the small model groups) run through aotc.

onnx >= 1.20 builds the node cases in memory from ``onnx/backend/test/case/node``; the model groups
(``simple``, ``pytorch-converted``, ``pytorch-operator``) are files in onnx's package. The ``real``
group (nine classic CNNs) points at the ``light`` copies shipped with onnx: the real architectures with
their weights replaced by ``ConstantOfShape`` fills, an expected output per model, and inputs that the
onnx runner derives from the input's shape (see ``_light_input``).

To keep C compile time down, many cases are merged into one model of independent subgraphs and
compiled once; when a merged model fails to compile or run, it is bisected until the faulty cases are
alone, so that one bad case costs a few extra compiles rather than the whole group.

``python tests/backend_suite.py [-k SUBSTRING] [-v]`` prints pass rates per op and overall.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from aotc.frontends.sequences import SEQUENCE_OPS

MODEL_GROUPS = ("simple", "pytorch-converted", "pytorch-operator", "real")
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7
GROUP_SIZE = 128  # cases per merged model
# Ops the frontend handles itself rather than through aotc.ops.OPS.
FRONTEND_OPS = {"Constant", "If", "Loop", "Scan"} | SEQUENCE_OPS
# Sequences are lists of tensors; an absent optional is None.
Value = np.ndarray | list[np.ndarray] | None
# The ops frontends/sequences.py emits, besides its inputs' own (for SequenceMap: its body's) ops.
SEQUENCE_EMITTED_OPS = frozenset({"Identity", "Concat", "Unsqueeze", "Split", "Squeeze", "Where"})


@dataclass
class BackendCase:
    name: str
    group: str                  # "node" or a model group
    op: str                     # the op under test ("model" for the model groups)
    model: onnx.ModelProto
    inputs: list[Value]         # in the order of the graph's (non-initializer) inputs
    outputs: list[Value]        # expected, in the order of the graph's outputs
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    ops: frozenset[str] = field(default_factory=frozenset)

    @property
    def id(self) -> str:
        return self.name if self.group == "node" else f"{self.group}/{self.name}"

    @property
    def opset(self) -> int:
        return next((int(i.version) for i in self.model.opset_import if i.domain in ("", "ai.onnx")), 1)


def op_key(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _node_ops(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Op keys of ``nodes``. The frontend inlines If, Loop, Scan and FlexAttention's modifier graphs
    (their subgraphs' ops and the ops the rewriting emits count too); any other subgraph-carrying
    node counts as unsupported whatever its type."""
    from aotc.frontends.control_flow import EMITTED_OPS, is_inlined

    ops = set()
    for n in nodes:
        if is_inlined(n) or op_key(n) == "SequenceMap":  # SequenceMap: unrolled by frontends/sequences.py
            ops.add(op_key(n))
            ops |= EMITTED_OPS.get(op_key(n), SEQUENCE_EMITTED_OPS)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    ops |= _node_ops(a.g.node)
        else:
            ops.add(op_key(n) + ("[subgraph]" if _has_subgraph(n) else ""))
    return ops


def _case_ops(model: onnx.ModelProto) -> frozenset[str]:
    return frozenset(_node_ops(model.graph.node))


def _to_array(x: object) -> np.ndarray | None:
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (np.generic, int, float, bool)):
        return np.asarray(x)
    return None


def _to_value(x: object) -> Value:
    """A tensor, a sequence of tensors (a list) or an absent optional (None); TypeError for the rest
    (maps, sequences of sequences), which aotc does not handle."""
    if x is None:
        return None
    if isinstance(x, list):
        res = [_to_array(e) for e in x]
        if any(r is None for r in res):
            raise TypeError("a sequence of non-tensors")
        return res  # type: ignore[return-value]
    a = _to_array(x)
    if a is None:
        raise TypeError(type(x).__name__)
    return a


def _tensors(xs: Iterable[object]) -> list[Value] | None:
    try:
        return [_to_value(x) for x in xs]
    except TypeError:
        return None


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def load_node_cases() -> list[BackendCase]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the case generators overflow casts on purpose
        tests = load_model_tests(kind="node")
    by_name = {t.name: t for t in tests}

    def main_op(model: onnx.ModelProto) -> str:
        ops = [op_key(n) for n in model.graph.node]
        return next((o for o in ops if o != "Constant"), ops[0] if ops else "?")

    cases = []
    for t in tests:
        base = by_name.get(_EXPANDED.sub("", t.name), t)
        assert t.model is not None and t.data_sets
        ins, outs = t.data_sets[0]
        ins_a, outs_a = _tensors(ins), _tensors(outs)
        ops = _case_ops(t.model)
        if ins_a is None or outs_a is None:  # maps: aotc handles tensors, sequences and optionals
            ins_a, outs_a, ops = [], [], ops | {"[non-tensor]"}
        cases.append(BackendCase(t.name, "node", main_op(base.model), t.model, ins_a, outs_a,
                                 t.rtol, t.atol, ops))
    return cases


def load_model_group(kind: str) -> list[BackendCase]:
    from onnx.backend.test.loader import DATA_DIR

    cases = []
    for case_dir in sorted(glob.glob(os.path.join(DATA_DIR, kind, "test_*"))):
        path = os.path.join(case_dir, "model.onnx")
        if not os.path.exists(path):
            continue
        model = onnx.load(path)
        data = sorted(glob.glob(os.path.join(case_dir, "test_data_set_*")))
        if not data:
            continue

        def read(pattern: str, first: str = data[0]) -> list[np.ndarray]:
            files = sorted(glob.glob(os.path.join(first, pattern)),
                           key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))
            res = []
            for f in files:
                t = onnx.TensorProto()
                t.ParseFromString(Path(f).read_bytes())
                res.append(numpy_helper.to_array(t))
            return res
        cases.append(BackendCase(os.path.basename(case_dir), kind, "model", model, read("input_*.pb"),
                                 read("output_*.pb"), ops=_case_ops(model)))
    return cases


def _light_input(vi: onnx.ValueInfoProto) -> np.ndarray:
    """The input onnx's runner feeds a ``light`` model (its expected outputs were made with it): a
    float32 ramp 0, 1/n, ..., (n-1)/n over the input's shape, unknown dimensions taken as 1."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def load_real_group() -> list[BackendCase]:
    from onnx.backend.test.case.model import collect_testcases

    root = Path(onnx.__file__).parent.parent
    cases = []
    for t in collect_testcases():
        if t.kind != "real" or not t.url:
            continue
        path = root / t.url
        model = onnx.load(path)
        outputs = []
        for i in range(len(model.graph.output)):
            out = path.with_name(f"{path.stem}_output_{i}.pb")
            tensor = onnx.TensorProto()
            tensor.ParseFromString(out.read_bytes())
            outputs.append(numpy_helper.to_array(tensor))
        inputs = [_light_input(vi) for vi in _graph_inputs(model)]
        cases.append(BackendCase(t.name, "real", "model", model, inputs, outputs, t.rtol, t.atol,
                                 _case_ops(model)))
    return cases


def load_cases(groups: Iterable[str] = ("node", *MODEL_GROUPS)) -> list[BackendCase]:
    cases: list[BackendCase] = []
    for g in groups:
        cases += {"node": load_node_cases, "real": load_real_group}.get(g, lambda g=g: load_model_group(g))()
    return cases


def supported_ops() -> set[str]:
    from aotc.ops import OPS

    return set(OPS) | FRONTEND_OPS


def is_collected(case: BackendCase, supported: set[str] | None = None) -> bool:
    """A case aotc claims to handle: every node's op is supported (expanded variants included)."""
    supported = supported if supported is not None else supported_ops()
    return bool(case.ops) and case.ops <= supported


# -- merging cases into one model -----------------------------------------------------------------------
def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def frozen_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that determine an op's compile-time-constant operand (a Reshape's shape, a
    reduction's axes, a Range's bounds, a Loop's trip count, directly or through other nodes). The
    suite feeds those as inputs; aotc compiles for static shapes, so the runner pins them to the
    case's values as initializers, as a user pins shapes with ``--input-shape``. Shape/Size only read
    shapes, so the walk stops there. It goes through subgraphs: a value an If or Loop produces depends
    on everything its subgraphs read."""
    from aotc.frontends.control_flow import STATIC_INPUTS
    from aotc.ops import OPS

    nodes = list(_all_nodes(model.graph.node))
    producer = {o: n for n in nodes for o in n.output}
    todo = []
    for n in nodes:
        op = OPS.get(op_key(n))
        static = op.const_inputs if op else STATIC_INPUTS.get(op_key(n), SEQUENCE_CONST_INPUTS.get(op_key(n), ()))
        todo += [n.input[i] for i in static if i < len(n.input) and n.input[i]]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        p = producer.get(name)
        if p is not None and p.op_type not in ("Shape", "Size", "SequenceLength"):
            todo += [x for x in p.input if x] + [x for sub in _all_nodes(_subgraph_nodes(p)) for x in sub.input]
            todo += [o.name for a in p.attribute if a.type == onnx.AttributeProto.GRAPH for o in a.g.output]
    return seen & {vi.name for vi in model.graph.input}


def _subgraph_nodes(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    return [m for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for m in a.g.node]


def _all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterable[onnx.NodeProto]:
    """``nodes`` and the nodes of their subgraphs, at any depth."""
    for n in nodes:
        yield n
        yield from _all_nodes(_subgraph_nodes(n))


# Positions and split sizes of the sequence ops, which frontends/sequences.py needs as constants.
SEQUENCE_CONST_INPUTS = {"SequenceInsert": (2,), "SequenceErase": (1,), "SequenceAt": (1,), "SplitToSequence": (1,)}


def merge(cases: list[BackendCase]) -> tuple[onnx.ModelProto, dict[str, np.ndarray | None], list[list[str]]]:
    """One model holding ``cases`` as independent subgraphs (they must share the opset); returns it,
    the feeds, and per case its output names in the merged model. A sequence input ``x`` is fed as
    ``x.0``, ``x.1``, ... (how aotc's C API takes it); an absent optional input's feed is None."""
    nodes, inputs, inits, outputs, feeds, out_names = [], [], [], [], {}, []
    single = len(cases) == 1
    for i, c in enumerate(cases):
        p = "" if single else f"c{i}_"

        def ren(n: str, p: str = p) -> str:
            return n and p + n
        g = c.model.graph
        for n in g.node:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.name = ren(n.name or f"n{len(nodes)}")
            m.ClearField("input")
            m.ClearField("output")
            m.input.extend(ren(x) for x in n.input)
            m.output.extend(ren(x) for x in n.output)
            nodes.append(m)
        for t in g.initializer:
            u = onnx.TensorProto()
            u.CopyFrom(t)
            u.name = ren(t.name)
            inits.append(u)
        frozen = frozen_inputs(c.model)
        for vi, x in zip(_graph_inputs(c.model), c.inputs, strict=False):
            if vi.name in frozen:
                inits.append(numpy_helper.from_array(x, ren(vi.name)))
                continue
            if isinstance(x, list) and not x:  # an empty sequence holds no data: no input in C
                nodes.insert(0, onnx.helper.make_node("SequenceEmpty", [], [ren(vi.name)],
                                                   dtype=_sequence_elem_type(vi.type)))
                continue
            w = onnx.ValueInfoProto()
            w.CopyFrom(vi)
            w.name = ren(vi.name)
            inputs.append(w)
            if isinstance(x, list):
                feeds.update({f"{w.name}.{j}": e for j, e in enumerate(x)})
            else:
                feeds[w.name] = x
        names = []
        for vi in g.output:
            w = onnx.ValueInfoProto()
            w.CopyFrom(vi)
            w.name = ren(vi.name)
            outputs.append(w)
            names.append(w.name)
        out_names.append(names)
    graph = onnx.helper.make_graph(nodes, "merged", inputs, outputs, inits)
    model = onnx.helper.make_model(graph, opset_imports=list(cases[0].model.opset_import),
                                   ir_version=cases[0].model.ir_version)
    return model, feeds, out_names


def _is_sequence(t: onnx.TypeProto) -> bool:
    return t.HasField("sequence_type") or t.optional_type.elem_type.HasField("sequence_type")


def _sequence_elem_type(t: onnx.TypeProto) -> int:
    if t.HasField("optional_type"):
        t = t.optional_type.elem_type
    return t.sequence_type.elem_type.tensor_type.elem_type or onnx.TensorProto.FLOAT


# -- running and comparing -----------------------------------------------------------------------------
def compare(case: BackendCase, got: list[Value]) -> str | None:
    """None when ``got`` matches the expected outputs as onnx's backend runner checks them (a
    sequence element by element)."""
    if len(got) != len(case.outputs):
        return f"{len(got)} outputs, expected {len(case.outputs)}"
    flat_got, flat_want = [], []
    for i, (g, w) in enumerate(zip(got, case.outputs, strict=True)):
        if _kind(g) != _kind(w):
            return f"output {i}: {_kind(g)}, expected {_kind(w)}"
        flat_got += g if isinstance(g, list) else [] if g is None else [g]
        flat_want += w if isinstance(w, list) else [] if w is None else [w]
    for i, (g, w) in enumerate(zip(flat_got, flat_want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, expected {w.shape}"
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        try:
            np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol)
        except AssertionError as e:
            msg = " ".join(str(e).split())
            return f"output {i}: values differ: {msg[:600]}"
    return None


def _kind(v: Value) -> str:
    return "absent" if v is None else f"a sequence of {len(v)}" if isinstance(v, list) else "a tensor"


Result = tuple[str, str]  # ("pass" | "fail" | "error", detail)


class Runner:
    """Compiles cases in merged batches (bisecting failures) and caches each case's result."""

    def __init__(self, work_dir: str | Path, log: Callable[[str], None] | None = None,
                 cflags: list[str] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.cflags = cflags
        self.results: dict[str, Result] = {}
        self.count = 0
        self.compiles = 0
        self.log = log or (lambda _m: None)

    def _compile_run(self, cases: list[BackendCase]) -> list[list[Value]]:
        import aotc

        model, feeds, out_names = merge(cases)
        shapes = {k: None if v is None else tuple(v.shape) for k, v in feeds.items()}
        self.count += 1
        self.compiles += 1
        out_dir = self.work_dir / f"m{self.count}"
        m = aotc.compile(model, out_dir=str(out_dir), name="b", input_shapes=shapes, extra_cflags=self.cflags)
        results = m.run({k: v for k, v in feeds.items() if v is not None})
        got = dict(zip([t.name for t in m.outputs], results, strict=True))
        seqs = {vi.name for vi in model.graph.output if _is_sequence(vi.type)}

        def output(name: str) -> Value:  # a sequence output y comes back as y.0, y.1, ...
            if name not in seqs:
                return got[name]
            n = 0
            while f"{name}.{n}" in got:
                n += 1
            return [got[f"{name}.{j}"] for j in range(n)]
        return [[output(n) for n in names] for names in out_names]

    def run(self, cases: list[BackendCase]) -> None:
        todo = [c for c in cases if c.id not in self.results]
        if not todo:
            return
        try:
            outs = self._compile_run(todo)
        except Exception as e:  # noqa: BLE001 - isolate the faulty case(s) by bisection
            if len(todo) == 1:
                self.results[todo[0].id] = ("error", f"{type(e).__name__}: {' '.join(str(e).split())[:600]}")
                return
            mid = len(todo) // 2
            self.run(todo[:mid])
            self.run(todo[mid:])
            return
        for c, got in zip(todo, outs, strict=True):
            err = compare(c, got)
            self.results[c.id] = ("pass", "") if err is None else ("fail", err)

    def run_all(self, cases: list[BackendCase], batches: list[list[BackendCase]] | None = None) -> None:
        for b in batches if batches is not None else make_batches(cases):
            t0 = time.perf_counter()
            self.run(b)
            self.log(f"batch of {len(b)} ({b[0].name}...): {time.perf_counter() - t0:.1f}s")


def make_batches(cases: list[BackendCase], size: int = GROUP_SIZE,
                 alone: Callable[[BackendCase], bool] = lambda c: False) -> list[list[BackendCase]]:
    """Batches of same-opset cases; node cases, model cases and ``alone`` cases (expected failures)
    are batched apart, so that failures cannot slow down the batches that pass. The ``real`` models
    are large enough to be compiled one at a time."""
    by: dict[tuple, list[BackendCase]] = {}
    for c in cases:
        # Merged cases share one opset import list: every domain's version must agree.
        opsets = tuple(sorted((i.domain or "ai.onnx", i.version) for i in c.model.opset_import))
        by.setdefault((c.group == "node", opsets, alone(c)), []).append(c)
    batches = []
    for group in by.values():
        n = 1 if group[0].group == "real" else size
        batches += [group[j:j + n] for j in range(0, len(group), n)]
    return batches


# -- report ------------------------------------------------------------------------------------------------
def summarize(cases: list[BackendCase], results: dict[str, Result]) -> dict[str, tuple[int, int]]:
    """Op -> (passing, total) over all cases of the op; uncollected cases count as not passing."""
    table: dict[str, list[int]] = {}
    for c in cases:
        key = c.op if c.group == "node" else f"[{c.group}]"
        row = table.setdefault(key, [0, 0])
        row[1] += 1
        row[0] += results.get(c.id, ("", ""))[0] == "pass"
    return {k: (v[0], v[1]) for k, v in sorted(table.items())}


def run_suite(groups: Iterable[str] = ("node", *MODEL_GROUPS), only: str | None = None,
              log: Callable[[str], None] | None = None) -> tuple[list[BackendCase], dict[str, Result]]:
    cases = load_cases(groups)
    if only:
        cases = [c for c in cases if only in c.id]
    sup = supported_ops()
    collected = [c for c in cases if is_collected(c, sup)]
    with tempfile.TemporaryDirectory(prefix="aotc_backend_") as tmp:
        runner = Runner(tmp, log)
        runner.run_all(collected)
    return cases, runner.results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", help="only cases whose name contains this")
    ap.add_argument("-v", action="store_true", help="print every non-passing collected case")
    ap.add_argument("--groups", default=",".join(("node", *MODEL_GROUPS)))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cases, results = run_suite(args.groups.split(","), args.k,
                               log=(lambda m: print(m, file=sys.stderr)) if args.v else None)
    table = summarize(cases, results)
    sup = supported_ops()
    print(f"{'op':<36} {'pass':>5} {'total':>6}  supported")
    for op, (p, n) in table.items():
        print(f"{op:<36} {p:>5} {n:>6}  {'yes' if op in sup or op.startswith('[') else 'no'}")
    total_p = sum(p for p, _ in table.values())
    total_n = sum(n for _, n in table.values())
    collected = len(results)
    ok = sum(r[0] == "pass" for r in results.values())
    print(f"\noverall: {total_p}/{total_n} cases pass ({100 * total_p / max(total_n, 1):.1f}%); "
          f"collected {collected}, of which {ok} pass ({100 * ok / max(collected, 1):.1f}%); "
          f"{time.perf_counter() - t0:.0f}s")
    if args.v:
        for name, (status, detail) in sorted(results.items()):
            if status != "pass":
                print(f"{status:5} {name}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
