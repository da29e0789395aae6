"""The graph's text form (aotc/ir/text.py): ``Graph.from_text(g.to_text())`` rebuilds ``g`` exactly
(names, types, attributes of every kind, constants bit for bit), malformed text fails with its line
and column, and graphs imported from the ONNX backend node cases survive the round trip, through
the passes and a compile."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import aotc
from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Value
from aotc.ir.text import IRSyntaxError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "debugging.md"


# -- comparing graphs ---------------------------------------------------------------------------------
def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (NaNs match NaNs whatever their payload: the text keeps none)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == dtypes.STRING:
        return a.tolist() == b.tolist()
    if a.dtype.kind == "f" or dtypes.emulated(a.dtype) and dtypes.emulated(a.dtype).compute == "float":
        with np.errstate(invalid="ignore"):
            wa, wb = a.astype(np.float64), b.astype(np.float64)
        nan = np.isnan(wa)
        return bool((nan == np.isnan(wb)).all()) and a[~nan].tobytes() == b[~nan].tobytes()
    return a.tobytes() == b.tobytes()


def same_attr(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and same_array(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_attr, a, b))
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    if isinstance(a, (bool, np.bool_)):
        return isinstance(b, bool) and a == b
    if isinstance(a, (int, np.integer)):
        return type(b) is int and a == b
    if isinstance(a, (float, np.floating)):  # the same double, the sign of zero included
        return type(b) is float and np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and a == b


def assert_same_graph(g: Graph, h: Graph) -> None:
    """``h`` is ``g`` value for value: same structure, names, types, attributes and constants."""
    pairs: dict[int, Value] = {}

    def same(v: Value | None, w: Value | None) -> None:
        if v is None or w is None:
            assert v is w
            return
        if id(v) in pairs:
            assert pairs[id(v)] is w, f"{v.name!r} is two values after the round trip"
            return
        pairs[id(v)] = w
        assert (v.name, v.shape, v.dtype) == (w.name, w.shape, w.dtype)
        assert v.is_const == w.is_const
        if v.is_const:
            assert same_array(v.const, w.const), v.name

    assert (g.name, g.opset, len(g.inputs), len(g.nodes)) == (h.name, h.opset, len(h.inputs), len(h.nodes))
    for v, w in zip(g.inputs, h.inputs, strict=True):
        same(v, w)
        if v.shape is None:
            assert g.dynamic_inputs.get(v.name, "?") == h.dynamic_inputs.get(w.name, "?")
    for n, m in zip(g.nodes, h.nodes, strict=True):
        assert (n.op, n.name, sorted(n.attrs)) == (m.op, m.name, sorted(m.attrs))
        for k in n.attrs:
            assert same_attr(n.attrs[k], m.attrs[k]), f"{n.op} attribute {k}: {n.attrs[k]!r} -> {m.attrs[k]!r}"
        assert len(n.inputs) == len(m.inputs) and len(n.outputs) == len(m.outputs)
        for v, w in zip([*n.inputs, *n.outputs], [*m.inputs, *m.outputs], strict=True):
            same(v, w)
        assert all(w.producer is m for w in m.outputs)
    assert len(g.outputs) == len(h.outputs)
    for v, w in zip(g.outputs, h.outputs, strict=True):
        same(v, w)
    h.verify()


def round_trip(g: Graph) -> Graph:
    text = g.to_text(elide=None)
    h = Graph.from_text(text)
    assert_same_graph(g, h)
    assert h.to_text(elide=None) == text
    return h


def typed(v: Value, shape: tuple[int, ...] | None, dtype: Any) -> Value:
    v.shape, v.dtype = shape, None if dtype is None else np.dtype(dtype)
    return v


# -- the format -----------------------------------------------------------------------------------------
def test_listing_reads_as_documented() -> None:
    g = Graph("mlp")
    x = typed(Value("image"), (1, 4), np.float32)
    g.inputs.append(x)
    w = Graph.constant(np.arange(8, dtype=np.float32).reshape(4, 2), "fc.weight")
    mm = g.add_node("MatMul", [x, w], attrs={"_opset": 17}, name="/fc/MatMul", out_names=["hidden"])
    h = typed(mm.outputs[0], (1, 2), np.float32)
    shape = Graph.constant(np.array([2, -1], np.int64), "shape")
    r = g.add_node("Reshape", [h, shape], attrs={"_opset": 17, "allowzero": 0}, name="y", out_names=["y"])
    g.outputs.append(typed(r.outputs[0], (2, 1), np.float32))
    assert g.to_text() == """\
graph mlp opset=17 {
  input %image: float32[1,4]
  %fc.weight: float32[4,2] = constant [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
  %hidden: float32[1,2] = MatMul(%image, %fc.weight) _opset=17 @/fc/MatMul
  %shape: int64[2] = constant [2, -1]
  %y: float32[2,1] = Reshape(%hidden, %shape) _opset=17 allowzero=0
  return %y
}
"""
    round_trip(g)


def _one_node(attrs: dict[str, Any], inputs: int = 1) -> Graph:
    g = Graph("attrs")
    xs = [typed(Value(f"x{i}"), (2,), np.float32) for i in range(inputs)]
    g.inputs += xs
    n = g.add_node("Custom", xs, attrs=attrs, name="n", out_names=["y"])
    g.outputs.append(typed(n.outputs[0], (2,), np.float32))
    return g


ATTRS: dict[str, Any] = {
    "int": 3, "negative": -7, "big": 2**63 - 1, "np_int": np.int64(5),
    "float": 0.25, "onnx_float": float(np.float32(1e-5)), "double": 0.1, "neg_zero": -0.0,
    "inf": float("inf"), "ninf": float("-inf"), "nan": float("nan"), "huge": 1e300, "tiny": 5e-324,
    "flag_true": True, "flag_false": False,
    "str": "tanh", "empty_str": "", "hostile_str": 'a "b" \\ c\nd\te\u2028\ud800 ☃ \x00',
    "bytes": b'\x00\xff"\\ok', "ints": [1, -2, 3], "floats": [0.5, float(np.float32(0.1))], "strs": ["a", "b c"],
    "empty": [], "nested": [[1, 2], [], [3.5, "x", [True]]], "tuple": (1, 2),
    "tensor": np.arange(6, dtype=np.int64).reshape(2, 3), "scalar_tensor": np.array(2.5, np.float32),
    "string_tensor": np.array([["k", 'q"'], ["", "ü"]], dtype=object), "bool_tensor": np.array([True, False]),
    "f16_tensor": np.array([0.1, -0.0, np.inf], np.float16), "bf16_tensor": np.array([0.1, 3.0], ml_dtypes.bfloat16),
    "empty_tensor": np.zeros((0, 3), np.float32), "u64_tensor": np.array([2**64 - 1], np.uint64),
    "_opset": 17, "weird key": 1, "1st": 2,
}


def test_every_attribute_type_round_trips() -> None:
    g = _one_node(ATTRS)
    h = round_trip(g)
    # Tuples come back as lists, numpy scalars as Python numbers (same_attr checks the values).
    assert h.nodes[0].attrs["tuple"] == [1, 2] and type(h.nodes[0].attrs["np_int"]) is int
    line = g.to_text().splitlines()[2]
    # ONNX float attributes hold float32 values as doubles: printed short, with an f.
    assert "onnx_float=1e-05f" in line and "double=0.1 " in line and "floats=[0.5, 0.1f]" in line
    assert "neg_zero=-0.0" in line and "nan=nan" in line and "ninf=-inf" in line
    assert 'tensor=int64[2,3] [0, 1, 2, 3, 4, 5]' in line and '"weird key"=1' in line and '"1st"=2' in line
    assert 'bytes=b"\\x00\\xff\\"\\\\ok"' in line
    assert "\\u2028" in line and "\\ud800" in line  # a listing stays one line per statement, and UTF-8
    line.encode("utf-8")


def test_large_tensor_attributes_are_elided_in_dumps() -> None:
    g = _one_node({"table": np.arange(17, dtype=np.int64), "small": np.arange(16, dtype=np.int64)})
    text = g.to_text()
    assert "table=int64[17] <elided>" in text and "small=int64[16] [0, 1," in text
    with pytest.raises(IRSyntaxError, match=r"line 3, column \d+: attribute 'table' is elided"):
        Graph.from_text(text)
    round_trip(g)


_EVERY_DTYPE = [dt for dt in dtypes._TABLE if dt != dtypes.STRING]


@pytest.mark.parametrize("dt", _EVERY_DTYPE, ids=[dtypes.dtype_name(d) for d in _EVERY_DTYPE])
def test_constants_round_trip_bit_for_bit(dt: np.dtype) -> None:
    """Every value of the small types (all 256 codes of a float8), random bits of the others, and the
    edges (±0, ±inf, extremes)."""
    em = dtypes.emulated(dt)
    if dt == np.bool_:
        arr = np.array([True, False, True])
    elif em is not None and em.compute == "int32_t":  # int4 and the like: their whole range
        info = ml_dtypes.iinfo(dt)
        arr = np.arange(int(info.min), int(info.max) + 1).astype(dt)
    elif dt.itemsize == 1:  # every code (float4 has 16)
        arr = np.arange(2 ** (ml_dtypes.finfo(dt).bits if em else 8), dtype=np.uint8).view(dt)
    else:
        arr = np.random.default_rng(0).integers(0, 256, size=64 * dt.itemsize, dtype=np.uint8).view(dt)
        floats = em or dt.kind == "f"
        edges = [0.0, -0.0, np.inf, -np.inf, np.nan] if floats else [np.iinfo(dt).min, np.iinfo(dt).max, 0]
        arr = np.concatenate([arr, np.array(edges, dtype=dt)])
    g = Graph("consts")
    c = Graph.constant(arr.reshape(-1, 1) if arr.size % 2 else arr.reshape(2, -1), "c")
    scalar = Graph.constant(arr[:1].reshape(()), "c")  # a second value named c: %c~1
    g.outputs += [c, scalar]
    h = round_trip(g)
    assert "%c~1" in g.to_text(elide=None) and h.outputs[1].name == "c"


def test_string_constants_round_trip() -> None:
    g = Graph("s")
    g.outputs.append(Graph.constant(np.array(["", "a\"b", "\n", "ü☃"], dtype=object), "strings"))
    round_trip(g)


HOSTILE = ["", " ", "a b", 'q"uote', "back\\slash", "new\nline", "tab\t", "%pct", "~1", "x~1", "#hash",
           "ends:", ":starts", "a::b", "onnx::MatMul_7", "ünïcode", "\u2028", "\ud800", "\x00", "😀", "return",
           "input", "_", "<elided>", "@x", "}", "graph", "true", "nan", "x/y.z$#-0", "-"]


def test_hostile_names_round_trip() -> None:
    g = Graph('graph "name"\n')
    xs = [typed(Value(name), (1,), np.float32) for name in HOSTILE]
    g.inputs += xs
    outs = []
    for i, x in enumerate(xs):
        # Node and op names are hostile too, and every output is called "dup" or a hostile name.
        n = g.add_node(f"Op {i}" if i % 3 == 0 else "Relu", [x], 2, {HOSTILE[i] or "k": HOSTILE[i]},
                       name=HOSTILE[-1 - i], out_names=["dup", HOSTILE[i]])
        outs += [typed(v, (1,), np.float32) for v in n.outputs]
    g.outputs += outs
    text = g.to_text()
    text.encode("utf-8")  # (lone surrogates are escaped)
    assert len(text.splitlines()) == 2 * len(HOSTILE) + 3
    assert "%dup~1" in text and '%"x~1"' in text and '%"a b"' in text and "%onnx::MatMul_7:" in text
    h = round_trip(g)
    assert [v.name for v in h.inputs] == HOSTILE


def test_random_names_and_strings_round_trip() -> None:
    """Strings of random code points (controls, quotes, the format's own punctuation, surrogates,
    astral planes) as value names, node names and string attributes."""
    rng = np.random.default_rng(1)
    alphabet = [*range(0x00, 0x80), 0x85, 0xA0, 0x2028, 0xD800, 0xDFFF, 0xFEFF, 0x1F600, 0xE0001, 0x10FFFF]
    names = ["".join(chr(c) for c in rng.choice(alphabet, size=rng.integers(0, 8))) for _ in range(300)]
    g = Graph("random")
    x = typed(Value(names[0]), (1,), np.float32)
    g.inputs.append(x)
    for i, name in enumerate(names[1:]):
        n = g.add_node("Relu", [x], attrs={"s": name, "l": [name, i]}, name=names[-i], out_names=[name])
        x = typed(n.outputs[0], (1,), np.float32)
    g.outputs.append(x)
    assert len(g.to_text().splitlines()) == len(names) + 3
    round_trip(g)


def test_dynamic_input_dims_round_trip() -> None:
    g = Graph("dyn")
    for name, dims in [("a", "N,3"), ("b", "batch size,?,7"), ("c", "?"), ("d", "x]y,"), ("f", "3,4"), ("g", "٣")]:
        g.inputs.append(typed(Value(name), None, np.float32))
        if dims != "?":
            g.dynamic_inputs[name] = dims
    g.inputs.append(typed(Value("e"), None, None))  # not yet typed at all
    g.outputs += g.inputs
    text = g.to_text()
    assert "input %a: float32[N,3]" in text and 'input %b: float32["batch size",?,7]' in text
    assert "input %c: float32[?]" in text and 'input %d: float32["x]y",""]' in text and "input %e: ?[?]" in text
    assert 'input %f: float32["3","4"]' in text and 'input %g: float32["٣"]' in text
    round_trip(g)


def test_dump_elides_large_constants() -> None:
    g = Graph("big")
    g.outputs += [Graph.constant(np.ones((4, 4), np.float32), "w16"), Graph.constant(np.ones(17, np.float32), "w17")]
    text = g.to_text()
    assert "%w16: float32[4,4] = constant [1.0," in text and "%w17: float32[17] = constant <elided>" in text
    with pytest.raises(IRSyntaxError) as e:
        Graph.from_text(text)
    assert (e.value.line, str(e.value)) == (3, "IR text, line 3, column 32: constant %w17 is elided: dump it "
                                                "with every element (to_text(elide=None)), or parse with "
                                                "fill_elided=True for placeholder data")
    filled = Graph.from_text(text, fill_elided=True)
    w = filled.outputs[1].const
    assert w.dtype == np.float32 and w.shape == (17,) and (np.abs(w) <= 1).all() and len(set(w.tolist())) > 1
    assert same_array(w, Graph.from_text(text, fill_elided=True).outputs[1].const)  # deterministic
    assert filled.to_text() == text


def test_every_dump_file_parses_back(tmp_path: Path) -> None:
    """The files --dump-to writes, one per pass: each graph reads back (weights filled in) and prints
    as it was dumped."""
    from models import mlp

    from aotc.frontends.onnx import import_onnx
    from aotc.passes.pipeline import run_passes

    run_passes(import_onnx(mlp(sizes=(8, 6, 4)), name="mlp"), dump_dir=tmp_path)
    files = sorted(tmp_path.glob("[0-9][0-9]_*.txt"))
    assert [f.name for f in files][:2] == ["00_imported.txt", "01_prune.txt"] and len(files) >= 8
    for f in files:
        text = f.read_text()
        graph_part = text.split("\nkernels:\n")[0].removesuffix("\n")
        if f.name != "00_imported.txt":
            assert graph_part.startswith("# after ")
            graph_part = graph_part.split("\n", 1)[1]
        assert Graph.from_text(graph_part, fill_elided=True).to_text() == graph_part + "\n", f.name


def test_docs_listing_parses() -> None:
    """The listing in docs/debugging.md is real: it parses (its weights are elided), and prints back
    as it is written there."""
    block = re.search(r"```\n(# after plan_memory\ngraph .*?\n}\n)", DOCS.read_text(), re.S)
    assert block, "docs/debugging.md lost its listing"
    listing = block.group(1)
    g = Graph.from_text(listing, fill_elided=True)
    assert "# after plan_memory\n" + g.to_text() == listing


# -- errors -------------------------------------------------------------------------------------------
GOOD = "graph g {\n  input %x: float32[2]\n  %y: float32[2] = Relu(%x)\n  return %y\n}\n"

MALFORMED = [
    ("", 1, 1, "expected 'graph', found the end of the text"),
    ("grph g {", 1, 1, "expected 'graph', found 'grph'"),
    ("graph g\n  input", 2, 3, "expected '{' after the graph's name, found 'input'"),
    ("graph g {\n  input %x: float33[2]\n", 2, 13, "unknown dtype 'float33'"),
    ("graph g {\n  input %x: float[2]\n", 2, 13, "unknown dtype 'float'"),
    ("graph g {\n  input %x: f4[2]\n", 2, 13, "unknown dtype 'f4'"),
    ("graph g {\n  input %x: float32[2\n", 3, 1, "expected ',' or ']' in the dims, found the end of the text"),
    ("graph g {\n  input %x: float32[2,-1]\n", 2, 23, "expected a dimension (an integer, ? or a name), found '-1'"),
    ("graph g {\n  %y: float32[N] = Relu(%x)\n", 2, 15, "expected a dimension (an integer or ?), found 'N'"),
    ("graph g {\n  %y: float32[?,3] = Relu(%x)\n", 2, 15, "a shape is either all known or a single ?"),
    ("graph g {\n  %y: float32[2] = Relu(%x)\n", 2, 25, "value %x is used before it is defined"),
    (GOOD.replace("return %y", "return %z"), 4, 10, "value %z is used before it is defined"),
    (GOOD.replace("%y: float32[2] =", "%x: float32[2] ="), 3, 3, "value %x is defined twice (first on line 2)"),
    (GOOD.replace("Relu(%x)", "Relu(%x"), 4, 3, "expected ',' or ')' in the inputs, found 'return'"),
    (GOOD.replace("Relu(%x)", "Relu(%x) alpha"), 3, 29, "unexpected 'alpha' after the Relu node; attributes are "
     "written key=value"),
    (GOOD.replace("Relu(%x)", "Relu(%x) alpha=)"), 3, 35, "expected a value for attribute 'alpha', found ')'"),
    (GOOD.replace("Relu(%x)", "Relu(%x) a=1 a=2"), 3, 33, "attribute 'a' is given twice"),
    (GOOD.replace("Relu(%x)", 'Relu(%x) s="\\q"'), 3, 32, "unknown escape \\q in a string"),
    (GOOD.replace("Relu(%x)", 'Relu(%x) s="open'), 3, 31, "unterminated string (strings end on the same line)"),
    (GOOD.replace("Relu(%x)", "Relu(%x) t=int64[3] [1, 2]"), 3, 45,
     "attribute 't' has 2 elements, its type int64[3] needs 3"),
    (GOOD.replace("Relu(%x)", "Relu(%x) t=int8[1] [300]"), 3, 40, "attribute 't': 300 is out of range for int8"),
    (GOOD.replace("Relu(%x)", "Relu(%x) t=float32[1] [true]"), 3, 43, "attribute 't': expected a number, found 'true'"),
    (GOOD.replace("Relu(%x)", "Relu(%x) t=<opaque TypeProto>"), 3, 31,
     "attribute 't' is <opaque TypeProto>: a value the text format cannot hold"),
    (GOOD.replace("  return", "  %c: int64[2] = constant [1, 2, 3]\n  return"), 4, 35,
     "constant %c has 3 elements, its type int64[2] needs 2"),
    (GOOD.replace("  return", "  %c: ?[2] = constant [1, 2]\n  return"), 4, 7,
     "constant %c needs a known dtype and shape"),
    (GOOD.replace("  return", "  %c, %d: int64[1] = constant [1]\n  return"), 4, 5,
     "expected ':' and the type of %c, found ','"),
    (GOOD.replace("Relu(%x)", "Relu(%x) ^"), 3, 29, "unexpected character '^'"),
    (GOOD + "trailing", 6, 1, "unexpected text after the graph's closing '}': 'trailing'"),
    (GOOD + "\nkernels:\n  k0_relu [loop] ops=Relu -> y: float32[2]\n", 7, 1,
     "unexpected text after the graph's closing '}': 'kernels'; a dump's kernels list is not part of the graph"),
    (GOOD.replace("%y: float32[2] = Relu", "%y~: float32[2] = Relu"), 3, 5, "unexpected character '~'"),
]


@pytest.mark.parametrize(("text", "line", "column", "message"), MALFORMED, ids=[m[3][:40] for m in MALFORMED])
def test_malformed_text_is_reported_with_its_position(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(IRSyntaxError) as e:
        Graph.from_text(text)
    assert isinstance(e.value, AotcError)
    assert (e.value.line, e.value.column) == (line, column), str(e.value)
    assert str(e.value).startswith(f"IR text, line {line}, column {column}: {message}")
    assert "\n" not in str(e.value)


def test_a_graph_without_outputs_round_trips() -> None:
    g = Graph("empty")
    assert g.to_text() == "graph empty opset=17 {\n  return\n}\n"
    round_trip(g)


def test_parse_accepts_comments_and_free_layout() -> None:
    g = Graph.from_text("# after prune  # unchanged\ngraph g { input %x: float32[2] # the input\n"
                        "%y: float32[2] = Relu(%x) _opset=17 return %y }")
    assert [n.op for n in g.nodes] == ["Relu"] and g.nodes[0].name == "y" and g.opset == 17


# -- the ONNX backend node cases ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def node_cases() -> list:
    """The collected node cases (shared with test_backend_suite.py when it ran in this session)."""
    from test_backend_suite import CASES

    return [c for c in CASES if c.group == "node"]


def _import(cases: list) -> tuple[Graph, dict[str, np.ndarray]]:
    from backend_suite import merge

    from aotc.frontends.onnx import import_onnx

    model, feeds, _ = merge(cases)
    return import_onnx(model, {k: None if v is None else tuple(v.shape) for k, v in feeds.items()}, "b"), feeds


def test_backend_node_cases_round_trip(node_cases: list) -> None:
    """Every collected node case, imported: the listing is a fixed point and rebuilds the graph."""
    failures = []
    for c in node_cases:
        try:
            g, _ = _import([c])
        except AotcError:
            continue  # (a case the frontend refuses; test_backend_suite.py covers it)
        try:
            round_trip(g)
        except (AssertionError, AotcError) as e:
            failures.append(f"{c.name}: {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures[:20])


def _compile_sample(node_cases: list) -> list:
    """About 30 single-tensor cases of the most common opset, spread over the ops, not expected to
    fail: small enough for one quick compile."""
    from backend_expected_failures import EXPECTED_FAILURES

    plain = [c for c in node_cases if c.id not in EXPECTED_FAILURES and c.inputs and c.outputs
             and all(isinstance(x, np.ndarray) for x in [*c.inputs, *c.outputs])]
    opsets = [c.opset for c in plain]
    opset = max(set(opsets), key=opsets.count)
    by_op: dict[str, Any] = {}
    for c in plain:
        if c.opset == opset and "expanded" not in c.name:
            by_op.setdefault(c.op, c)
    return list(by_op.values())[::max(1, len(by_op) // 30)]


def test_parsed_graph_compiles_to_the_same_outputs(node_cases: list, tmp_path: Path) -> None:
    """A sample of node cases merged into one graph, printed and parsed back: the passes do the
    same to both copies, and the library built from the parsed one gives the suite's outputs."""
    from backend_suite import compare, merge

    from aotc.passes.pipeline import run_passes

    sample = _compile_sample(node_cases)
    assert len(sample) >= 20
    g, feeds = _import(sample)
    text = g.to_text(elide=None)
    parsed, again = Graph.from_text(text), Graph.from_text(text)
    assert run_passes(again).to_text(elide=None) == run_passes(_import(sample)[0]).to_text(elide=None)

    m = aotc.compile(parsed, out_dir=tmp_path, name="parsed", extra_cflags=["-O1"])
    got = dict(zip([t.name for t in m.outputs], m.run({k: v for k, v in feeds.items() if v is not None}), strict=True))
    _, _, out_names = merge(sample)
    bad = [f"{c.name}: {err}" for c, names in zip(sample, out_names, strict=True)
           if (err := compare(c, [got[n] for n in names])) is not None]
    assert not bad, "\n".join(bad)
