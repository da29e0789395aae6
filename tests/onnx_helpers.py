"""Helpers for differential tests of aotc against onnxruntime.

- ``Inp`` describes a graph input (shape, dtype and how to draw its random values);
- ``Case`` is a small graph (usually one node) with its inputs, constants, outputs and tolerances;
- ``single`` builds the common one-node Case;
- ``build_model`` turns one or several Cases into one ONNX model (several independent subgraphs in
  one model amortize aotc's C compile time);
- ``make_feeds``/``run_ort``/``run_aotc``/``assert_close`` do the comparison.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

IR_VERSION = 9  # onnxruntime 1.31 cannot load newer IR versions

# Values that exercise NaN/Inf propagation, overflow and underflow of float32 math.
SPECIAL_F32 = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-30, -1e-30, 20.5,
                        -20.5, 88.0, -88.0, 100.0, -100.0, 1e30, -1e30, 3.4e38, -3.4e38, 2.0, -3.0, 7.25],
                       dtype=np.float32)


@dataclass(frozen=True)
class Inp:
    """A graph input. ``gen`` picks the random distribution:

    normal, pos (0.1..3), unit (-1..1), wide (-6..6), half (multiples of 0.5: Round ties),
    small (integers -3..3 as float: equal values for comparisons), special (SPECIAL_F32 cycled),
    int (-10..10), nz (nonzero ints), bool.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    gen: str = "normal"


@dataclass
class Case:
    id: str
    nodes: list[onnx.NodeProto]
    inputs: dict[str, Inp]
    outputs: list[str]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 17
    rtol: float = 1e-5
    atol: float = 1e-6
    # Cases sharing a group compile as one model; None: the test decides.
    group: str | None = None
    marks: tuple = ()
    # Expected outputs from numpy (fed the case's own input names) instead of onnxruntime, where
    # onnxruntime is not a usable reference (e.g. its ReduceMax ignores NaN depending on position).
    reference: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def f32(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


def add_cases(registry: list[Case], section: str, *cases: Case) -> None:
    """Append ``cases`` to ``registry`` with ids prefixed by ``section``, grouped by section unless
    a case names its own group."""
    for c in cases:
        c.id = f"{section}-{c.id}"
        c.group = c.group or section
        registry.append(c)


def single(case_id: str, op: str, args: Sequence[Inp | np.ndarray | None], attrs: dict | None = None,
           n_out: int = 1, **kw) -> Case:
    """One ``op`` node. ``args``: an Inp is a graph input, an array a constant initializer, None an
    absent optional input."""
    inputs: dict[str, Inp] = {}
    consts: dict[str, np.ndarray] = {}
    names = []
    for i, a in enumerate(args):
        if a is None:
            names.append("")
        elif isinstance(a, Inp):
            inputs[f"x{i}"] = a
            names.append(f"x{i}")
        else:
            consts[f"c{i}"] = np.asarray(a)
            names.append(f"c{i}")
    outs = [f"y{j}" for j in range(n_out)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    return Case(case_id, [node], inputs, outs, consts, **kw)


def _prefixed(case: Case, prefix: str) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    names: dict[str, str] = {}

    def ren(n: str) -> str:
        if not n:
            return n
        return names.setdefault(n, f"{prefix}{n}")

    nodes = []
    for k, n in enumerate(case.nodes):
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = f"{prefix}n{k}"
        m.ClearField("input")
        m.ClearField("output")
        m.input.extend(ren(x) for x in n.input)
        m.output.extend(ren(x) for x in n.output)
        nodes.append(m)
    for n in [*case.inputs, *case.consts, *case.outputs]:
        ren(n)
    return nodes, names


def build_model(cases: Sequence[Case], opset: int | None = None) -> tuple[onnx.ModelProto, list[dict[str, str]]]:
    """One model holding every case as an independent subgraph; returns it and, per case, the map from
    the case's own tensor names to the model's."""
    opset = opset or max(c.opset for c in cases)
    nodes, inputs, inits, outputs, maps = [], [], [], [], []
    for i, c in enumerate(cases):
        prefix = f"c{i}_" if len(cases) > 1 else ""
        ns, names = _prefixed(c, prefix)
        nodes += ns
        for name, inp in c.inputs.items():
            inputs.append(helper.make_tensor_value_info(
                names[name], helper.np_dtype_to_tensor_dtype(np.dtype(inp.dtype)), list(inp.shape)))
        for name, arr in c.consts.items():
            inits.append(numpy_helper.from_array(np.asarray(arr), names[name]))
        outputs += [helper.make_value_info(names[o], onnx.TypeProto()) for o in c.outputs]
        maps.append(names)
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits)
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model, maps


def rng_for(key: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(key.encode()))


def random_input(inp: Inp, rng: np.random.Generator) -> np.ndarray:
    return np.asarray(_draw(inp, rng))  # rank 0: an array, not a numpy scalar


def _draw(inp: Inp, rng: np.random.Generator) -> np.ndarray:
    shape, dt, gen = inp.shape, np.dtype(inp.dtype), inp.gen
    if dt == np.bool_ or gen == "bool":
        return (rng.random(shape) < 0.5).astype(dt)
    if gen == "special":
        n = int(np.prod(shape))
        vals = np.resize(rng.permutation(SPECIAL_F32), n)
        return vals.reshape(shape).astype(dt)
    if np.issubdtype(dt, np.integer):
        lo, hi = (-10, 11) if gen in ("int", "normal") else (-3, 4) if gen == "small" else (1, 11)
        x = rng.integers(lo, hi, size=shape)
        if gen == "nz":
            x = x * rng.choice([-1, 1], size=shape)
        return x.astype(dt)
    if gen == "normal":
        x = rng.standard_normal(shape)
    elif gen == "pos":
        x = rng.uniform(0.1, 3.0, shape)
    elif gen == "unit":
        x = rng.uniform(-1.0, 1.0, shape)
    elif gen == "wide":
        x = rng.uniform(-6.0, 6.0, shape)
    elif gen == "half":
        x = rng.integers(-8, 9, size=shape) * 0.5
    elif gen == "small":
        x = rng.integers(-3, 4, size=shape).astype(np.float64)
    else:
        raise ValueError(f"unknown generator {gen!r}")
    return np.asarray(x, dtype=dt)


def make_feeds(case: Case, names: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    rng = rng_for(case.id)
    names = names or {}
    return {names.get(k, k): random_input(v, rng) for k, v in case.inputs.items()}


def build_model_and_feeds(cases: Sequence[Case]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``build_model`` of the cases, and every case's random feeds under the model's names."""
    model, maps = build_model(cases)
    feeds = {names[k]: v for c, names in zip(cases, maps, strict=True) for k, v in make_feeds(c).items()}
    return model, feeds


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_aotc(model: onnx.ModelProto, feeds: dict[str, np.ndarray], out_dir: str | Path,
             name: str = "t") -> list[np.ndarray]:
    import aotc

    return aotc.compile(model, out_dir=str(out_dir), name=name).run(feeds)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, what: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, onnxruntime {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, onnxruntime {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def compare(case: Case, out_dir: str | Path, name: str = "t") -> None:
    """Compile one case on its own and compare every output with onnxruntime."""
    model, _ = build_model([case])
    feeds = make_feeds(case)
    want = case.reference(feeds) if case.reference else run_ort(model, feeds)
    got = run_aotc(model, feeds, out_dir, name)
    for o, g, w in zip(case.outputs, got, want, strict=True):
        assert_close(g, w, case.rtol, case.atol, f"{case.id}:{o}")


def chunk_groups(cases: Sequence[Case], size: int, by_opset: bool = False) -> dict[str, list[Case]]:
    """Split each ``case.group`` into chunks of at most ``size`` cases; renames the groups to the chunks.
    ``by_opset``: cases of different opsets never share a model (a merged model takes the highest)."""
    by: dict[str, list[Case]] = {}
    for c in cases:
        by.setdefault(f"{c.group or c.id}@{c.opset}" if by_opset else c.group or c.id, []).append(c)
    chunks: dict[str, list[Case]] = {}
    for key, members in by.items():
        for j in range(0, len(members), size):
            for c in members[j:j + size]:
                c.group = f"{key}#{j // size}"
            chunks[f"{key}#{j // size}"] = members[j:j + size]
    return chunks


@dataclass
class Outcome:
    got: list[np.ndarray] | Exception
    want: list[np.ndarray] | None
    kernels: list[list[str]] = field(default_factory=list)   # each kernel's ops


class GroupRunner:
    """Compiles each group of cases as one model, once, and keeps every case's outcome. Expected values
    come from ``case.reference`` or else onnxruntime. When a group fails to compile, its cases are
    compiled one by one, so that only the faulty case fails."""

    def __init__(self, tmp_factory, groups: dict[str, list[Case]]) -> None:
        self.tmp_factory = tmp_factory
        self.groups = groups
        self.results: dict[str, Outcome] = {}
        self.counter = 0

    def _compile_run(self, cases: list[Case]) -> None:
        import aotc
        from aotc.compiler import compile_model

        model, maps = build_model(cases)
        local = [make_feeds(c) for c in cases]
        want: dict[str, list[np.ndarray]] = {}
        by_ort = [i for i, c in enumerate(cases) if c.reference is None]
        if by_ort:
            ort_model, ort_maps = build_model([cases[i] for i in by_ort])
            outs = iter(run_ort(ort_model, {names[k]: v for i, names in zip(by_ort, ort_maps, strict=True)
                                            for k, v in local[i].items()}))
            for i in by_ort:
                want[cases[i].id] = [next(outs) for _ in cases[i].outputs]
        for c, lf in zip(cases, local, strict=True):
            if c.reference is not None:
                want[c.id] = [np.asarray(r) for r in c.reference(lf)]
        self.counter += 1
        result = compile_model(model, self.tmp_factory.mktemp(f"g{self.counter}"), "t")
        feeds = {names[k]: v for names, lf in zip(maps, local, strict=True) for k, v in lf.items()}
        got = iter(aotc.load(result.prefix).run(feeds))
        kernels = [k.ops for k in result.graph.kernels]
        for c in cases:
            self.results[c.id] = Outcome([next(got) for _ in c.outputs], want[c.id], kernels)

    def get(self, case: Case) -> Outcome:
        if case.id not in self.results:
            cases = self.groups[case.group]
            try:
                self._compile_run(cases)
            except Exception:
                if len(cases) == 1:
                    raise
                for c in cases:
                    try:
                        self._compile_run([c])
                    except Exception as e:  # noqa: BLE001 - re-raised by that case's test
                        self.results[c.id] = Outcome(e, None)
        return self.results[case.id]

    def check(self, case: Case) -> Outcome:
        """Run ``case`` (with its group) and assert every output is close to the expected one."""
        out = self.get(case)
        if isinstance(out.got, Exception):
            raise out.got
        assert out.want is not None
        for name, g, w in zip(case.outputs, out.got, out.want, strict=True):
            assert_close(g, w, case.rtol, case.atol, f"{case.id}:{name}")
        return out


SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1"]


def require_sanitizers(tmp_path: Path) -> str:
    """The C compiler, or a skip when it cannot build ASan/UBSan programs here."""
    import shutil
    import subprocess

    import pytest

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    probe = subprocess.run([cc, "-fsanitize=address,undefined", "-x", "c", "-", "-o", str(tmp_path / "probe")],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("sanitizer runtime not available")
    return cc


def run_generated_test_under_sanitizers(model: onnx.ModelProto, tmp_path: Path, flags: Sequence[str] = SANITIZE,
                                        **compile_kw) -> None:
    """Builds ``model`` with ``flags`` and its generated test program (the stored reference outputs,
    then a 2-thread rerun), runs it and asserts that it passes with no sanitizer report."""
    import subprocess

    from aotc.compiler import compile_model

    require_sanitizers(tmp_path)
    compile_model(model, tmp_path, "m", extra_cflags=list(flags), gen_test=True, **compile_kw)
    proc = subprocess.run([str(tmp_path / "m_test")], capture_output=True, text=True)
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 and "m_test: PASSED" in proc.stdout, proc.stdout


def run_c_program_under_sanitizers(tmp_path: Path, source: str, library: str, flags: Sequence[str]):
    """Builds the C program ``source`` against the static library ``library`` (a file in ``tmp_path``,
    where the model's header is too) with ``flags``, runs it and asserts it exits 0 with no sanitizer
    report. Returns the finished process (its stdout is the program's output)."""
    import subprocess

    cc = require_sanitizers(tmp_path)
    (tmp_path / "app.c").write_text(source)
    exe = tmp_path / "app"
    subprocess.run([cc, "-std=c11", *flags, f"-I{tmp_path}", str(tmp_path / "app.c"), str(tmp_path / library),
                    "-lm", "-pthread", "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return proc
