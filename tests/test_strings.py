"""String tensors as inputs: Equal (strcmp, broadcast), ops that only move elements, LabelEncoder with
string keys; the bindings' conversion of str/bytes arrays; every way to need a *new* string refused at
compile time; hostile LabelEncoder keys kept out of the C source's syntax."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import require_sanitizers, run_c_program_under_sanitizers

import aotc
from aotc.cli import main as cli_main
from aotc.compiler import compile_model
from aotc.errors import AotcError

S, I64, F32, BOOL = TensorProto.STRING, TensorProto.INT64, TensorProto.FLOAT, TensorProto.BOOL
ML = "ai.onnx.ml"
CFLAGS = ["-Wall", "-Wextra", "-Werror"]


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, tuple[int, ...]]],
           outputs: dict[str, int], inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "strings",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()], inits or [])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 19),
                                                                 helper.make_opsetid(ML, 4)])


def _const(name: str, values: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, I64, [len(values)], values)


def _strings(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Strings that share prefixes, are empty, or hold multi-byte UTF-8, so that equal and unequal
    pairs both occur often."""
    pool = ["", "a", "ab", "abc", "b", "é", "e\u0301", "日本", "日本語", "\U0001f600", "A", "ab "]
    rng = np.random.default_rng(seed)
    return np.array([pool[i] for i in rng.integers(0, len(pool), int(np.prod(shape)))], object).reshape(shape)


# -- Equal and the ops that move strings --------------------------------------------------------------------
MOVE_INPUTS = {"x": (S, (2, 3)), "y": (S, (3,)), "a": (S, (2, 1)), "b": (S, (1, 4)), "c": (BOOL, (2, 3))}
MOVE_NODES = [
    helper.make_node("Equal", ["x", "y"], ["eq"]),                           # broadcast over rows
    helper.make_node("Equal", ["a", "b"], ["eq2"]),                          # both operands broadcast
    helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
    helper.make_node("Reshape", ["xt", "shape6"], ["xr"]),
    helper.make_node("Slice", ["xr", "starts", "ends"], ["xs"]),             # elements 1..4
    helper.make_node("Flatten", ["x"], ["xf"], axis=0),
    helper.make_node("Squeeze", ["xf", "zero"], ["xq"]),
    helper.make_node("Unsqueeze", ["xq", "zero"], ["xu"]),
    helper.make_node("Expand", ["y", "shape23"], ["ye"]),
    helper.make_node("Equal", ["xu", "xu"], ["self_eq"]),                   # every string equals itself
    helper.make_node("Gather", ["x", "rows"], ["xg"], axis=1),
    helper.make_node("Concat", ["x", "ye"], ["xc"], axis=0),
    helper.make_node("Where", ["c", "x", "ye"], ["xw"]),
    helper.make_node("Slice", ["y", "one", "ends"], ["ys0"]),
    helper.make_node("Concat", ["ys0", "ys0", "ys0"], ["ys1"], axis=0),
    helper.make_node("Slice", ["ys1", "zero", "three"], ["ys"]),
    helper.make_node("Equal", ["xs", "ys"], ["eq_slice"]),
    helper.make_node("LabelEncoder", ["xg"], ["lg"], domain=ML,
                     keys_strings=["a", "ab", "é", ""], values_int64s=[1, 2, 3, 4]),
    helper.make_node("LabelEncoder", ["xc"], ["lc"], domain=ML, keys_strings=["b", "日本", "abc"],
                     values_floats=[0.5, -2.0, 7.0], default_float=9.5),
    helper.make_node("LabelEncoder", ["xw"], ["lw"], domain=ML, keys_strings=["ab ", "A", "\U0001f600"],
                     values_int64s=[10, 20, 30], default_int64=-3),
]
MOVE_INITS = [_const("shape6", [6]), _const("starts", [1]), _const("ends", [4]), _const("zero", [0]),
              _const("shape23", [2, 3]), _const("rows", [2, 0, 2]), _const("one", [1]), _const("three", [3])]
MOVE_OUTPUTS = {"eq": BOOL, "eq2": BOOL, "self_eq": BOOL, "eq_slice": BOOL, "lg": I64, "lc": F32, "lw": I64}


@pytest.fixture(scope="module")
def moves(tmp_path_factory) -> aotc.CompiledModel:
    model = _model(MOVE_NODES, MOVE_INPUTS, MOVE_OUTPUTS, MOVE_INITS)
    return aotc.compile(model, out_dir=tmp_path_factory.mktemp("moves"), name="moves", extra_cflags=CFLAGS)


def _move_feeds(seed: int) -> dict[str, np.ndarray]:
    feeds = {n: _strings(s, seed + i) for i, (n, (t, s)) in enumerate(MOVE_INPUTS.items()) if t == S}
    feeds["c"] = np.random.default_rng(seed).random((2, 3)) < 0.5
    return feeds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_string_ops_match_the_reference(moves, seed) -> None:
    feeds = _move_feeds(seed)
    model = _model(MOVE_NODES, MOVE_INPUTS, MOVE_OUTPUTS, MOVE_INITS)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = moves.run(feeds)
    for name, g, w in zip(MOVE_OUTPUTS, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)
    np.testing.assert_array_equal(got[0], feeds["x"] == feeds["y"])
    np.testing.assert_array_equal(got[1], feeds["a"] == feeds["b"])
    assert got[2].all()


def test_string_inputs_accept_str_bytes_and_lists(moves) -> None:
    feeds = _move_feeds(5)
    want = moves.run(feeds)
    as_str = {k: v.astype(str) if v.dtype == object else v for k, v in feeds.items()}
    as_bytes = {k: np.vectorize(lambda s: s.encode())(v).astype(object) if v.dtype == object else v
                for k, v in feeds.items()}
    as_lists = {k: v.tolist() for k, v in feeds.items()}
    for variant in (as_str, as_bytes, as_lists):
        for g, w in zip(moves.run(variant), want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_string_input_errors(moves) -> None:
    feeds = _move_feeds(0)
    bad = feeds["y"].copy()
    bad[1] = "a\0b"
    with pytest.raises(ValueError, match="NUL"):
        moves.run({**feeds, "y": bad})
    with pytest.raises(ValueError, match="NUL"):
        moves.run({**feeds, "y": np.array([b"a", b"b\0", b"c"], object)})
    with pytest.raises(TypeError, match="strings"):
        moves.run({**feeds, "y": np.array([1, 2, 3], object)})
    with pytest.raises(TypeError, match="strings"):
        moves.run({**feeds, "y": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="shape"):
        moves.run({**feeds, "y": np.array(["a", "b"], object)})
    with pytest.raises(ValueError, match="Unicode"):
        moves.run({**feeds, "y": np.array(["a", "\ud800", "c"], object)})


def test_metadata_and_header_name_the_string_type(moves, tmp_path) -> None:
    meta = json.loads((moves.library_path.parent / "moves.json").read_text())
    assert [t["dtype"] for t in meta["inputs"]] == ["string"] * 4 + ["bool"]
    assert moves.inputs[0].dtype == np.dtype(object)
    header = (moves.library_path.parent / "moves.h").read_text()
    assert "typedef const char *aotc_string;" in header
    assert "int moves_run(const aotc_string *x, const aotc_string *y, const aotc_string *a, " in header
    assert "#define AOTC_DTYPE_STRING 8" in header


def test_numeric_models_have_no_string_typedef(tmp_path) -> None:
    model = _model([helper.make_node("Equal", ["p", "q"], ["r"])], {"p": (F32, (2,)), "q": (F32, (2,))},
                   {"r": BOOL})
    res = compile_model(model, tmp_path, "num")
    assert "aotc_string" not in (tmp_path / "num.h").read_text()
    m = aotc.load(res.prefix)
    p = np.array([1, np.nan], np.float32)
    np.testing.assert_array_equal(m.run({"p": p, "q": p})[0], [True, False])


# -- LabelEncoder -----------------------------------------------------------------------------------------
def test_label_encoder_string_keys_match_the_reference(tmp_path) -> None:
    keys = ["a", "b", "c", "日本", "", "b"]  # "b" twice: the last value wins
    nodes = [
        helper.make_node("LabelEncoder", ["x"], ["to_int"], domain=ML, keys_strings=keys,
                         values_int64s=[1, 2, 3, 4, 5, 6], default_int64=-9),
        helper.make_node("LabelEncoder", ["x"], ["to_float"], domain=ML, keys_strings=keys,
                         values_floats=[0.5, 1.5, -2.5, 1e30, -0.0, 3.0], default_float=42.25),
        helper.make_node("LabelEncoder", ["x"], ["to_int32"], domain=ML,
                         keys_tensor=helper.make_tensor("k", S, [3], [b"a", "日本".encode(), b"zz"]),
                         values_tensor=helper.make_tensor("v", TensorProto.INT32, [3], [7, 8, 9]),
                         default_tensor=helper.make_tensor("d", TensorProto.INT32, [1], [-1])),
        helper.make_node("LabelEncoder", ["x"], ["no_default"], domain=ML, keys_strings=["c"],
                         values_int64s=[1]),
        # Only keys no input can equal (a C string ends at its first NUL): every element is the default.
        helper.make_node("LabelEncoder", ["x"], ["nul_keys"], domain=ML, keys_strings=["a\0", "\0"],
                         values_int64s=[1, 2], default_int64=5),
    ]
    model = _model(nodes, {"x": (S, (3, 5))}, {"to_int": I64, "to_float": F32, "to_int32": TensorProto.INT32,
                                                "no_default": I64, "nul_keys": I64})
    m = aotc.compile(model, out_dir=tmp_path, name="le", extra_cflags=CFLAGS)
    x = np.array(["a", "b", "c", "d", "", "日本", "日", "zz", "A", "aa", "c", "b", "日本語", " a", "a "],
                 object).reshape(3, 5)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g, w in zip(m.run({"x": x}), want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    assert m.run({"x": x})[0][0, 1] == 6


# Keys that would break out of a C string literal or comment if pasted into the source as text.
HOSTILE = ['"', '\\', '\\"', '";}; int evil(void){return 1;} //', "line\nbreak", "*/", "/*", "??=", "??/",
           "%s%n", "tab\tcr\r", "\x7f", "'", "{", "a\0b", "\0", "é\u2028\u0085", "\U0001f600"]


def test_hostile_label_encoder_keys(tmp_path) -> None:
    """Every key byte is an octal escape in the source; a key with a NUL can match no input (inputs are
    C strings) and is left out; a non-UTF-8 key is read as the frontend reads all string attributes,
    with U+FFFD for each bad byte."""
    keys = [k.encode() for k in HOSTILE] + [b"\xff\xfe", b"\xc3"]
    values = list(range(1, len(keys) + 1))
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, keys_strings=keys, values_int64s=values,
                            default_int64=0)
    model = _model([node], {"x": (S, (len(keys) + 2,))}, {"y": I64})
    m = aotc.compile(model, out_dir=tmp_path, name="hostile", extra_cflags=CFLAGS)
    x = np.array([*HOSTILE, "\ufffd\ufffd", "\ufffd", "a", ""], object)
    x = np.array([s if "\0" not in s else "a" for s in x], object)  # NUL-holding strings cannot be fed
    got = m.run({"x": x})[0]
    table = {k.decode("utf-8", "replace"): v for k, v in zip(keys, values, strict=True) if b"\0" not in k}
    np.testing.assert_array_equal(got, [table.get(s, 0) for s in x])
    source = "".join(p.read_text() for p in (tmp_path / ".aotc" / "hostile").glob("hostile_kernels_*.c"))
    table_line = next(line for line in source.splitlines() if "le_key[" in line and "static" in line)
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', table_line)
    assert len(literals) == len(table) and all(re.fullmatch(r"(\\[0-7]{3})*", lit) for lit in literals)
    assert "evil" not in source and "??" not in source


# -- what stays refused ----------------------------------------------------------------------------------------
def _refused(tmp_path, nodes, inputs, outputs, inits=None, **options) -> str:
    with pytest.raises(AotcError) as e:
        compile_model(_model(nodes, inputs, outputs, inits), tmp_path, "refused", **options)
    return str(e.value)


def test_string_outputs_are_refused(tmp_path) -> None:
    msg = _refused(tmp_path, [helper.make_node("Identity", ["x"], ["y"], name="copy_it")], {"x": (S, (2,))},
                   {"y": S})
    assert "'y'" in msg and "Identity node 'copy_it'" in msg and "need allocation" in msg
    msg = _refused(tmp_path, [helper.make_node("Transpose", ["x"], ["y"], name="t")], {"x": (S, (2, 3))},
                   {"y": S})
    assert "Transpose node 't'" in msg and "string outputs need allocation, which the library never does" in msg
    msg = _refused(tmp_path, [], {"x": (S, (2,))}, {"x": S})
    assert "a graph input" in msg


def test_ops_that_make_or_compute_on_strings_are_refused(tmp_path) -> None:
    msg = _refused(tmp_path, [helper.make_node("Cast", ["f"], ["s"], to=S, name="to_str"),
                              helper.make_node("Equal", ["s", "s"], ["y"])], {"f": (F32, (2,))}, {"y": BOOL})
    assert "Cast node 'to_str' makes new string values" in msg and "allocation" in msg
    msg = _refused(tmp_path, [helper.make_node("Cast", ["x"], ["y"], to=F32, name="from_str")],
                   {"x": (S, (2,))}, {"y": F32})
    assert "Cast node 'from_str'" in msg and "not supported by Cast" in msg
    msg = _refused(tmp_path, [helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, name="le",
                                               keys_strings=["a"], values_strings=["b"])],
                   {"x": (S, (2,))}, {"y": S})
    assert "LabelEncoder node 'le'" in msg and "allocation" in msg
    msg = _refused(tmp_path, [helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, name="le2",
                                               keys_strings=["a"], values_int64s=[1])],
                   {"x": (I64, (2,))}, {"y": I64})
    assert "LabelEncoder node 'le2'" in msg and "cannot match" in msg
    msg = _refused(tmp_path, [helper.make_node("Equal", ["x", "k"], ["y"])], {"x": (S, (2,))}, {"y": BOOL},
                   [helper.make_tensor("k", S, [1], [b"a"])])
    assert "initializer 'k' is a string tensor" in msg
    msg = _refused(tmp_path, [helper.make_node("Constant", [], ["k"], name="ck", value_strings=["a"]),
                              helper.make_node("Equal", ["x", "k"], ["y"])], {"x": (S, (1,))}, {"y": BOOL})
    assert "Constant node 'ck' is a string tensor" in msg


def test_generated_programs_refuse_string_inputs(tmp_path) -> None:
    nodes = [helper.make_node("Equal", ["x", "y"], ["z"])]
    msg = _refused(tmp_path, nodes, {"x": (S, (2,)), "y": (S, (2,))}, {"z": BOOL}, gen_test=True)
    assert "--gen-test" in msg and "string inputs" in msg


def test_inspect_names_the_string_type(tmp_path, capsys) -> None:
    path = tmp_path / "eq.onnx"
    onnx.save(_model([helper.make_node("Equal", ["x", "y"], ["z"])], {"x": (S, (2,)), "y": (S, (1,))},
                     {"z": BOOL}), path)
    assert cli_main(["inspect", str(path)]) in (0, None)
    out = capsys.readouterr().out
    assert "'x': string [2]" in out and "unsupported: none" in out


# -- the library from C, under the sanitizers ------------------------------------------------------------------
APP = r"""
#include <stdio.h>
#include <stdlib.h>
#include "san.h"

int main(void) {
  static const char big[] = "a much longer string than any key, to read past short keys";
  const aotc_string x[6] = { "\"", "line\nbreak", "*/", "", big, "\xc3\xa9" };
  const aotc_string y[1] = { "*/" };
  _Bool eq[6];
  int64_t code[6];
  void *ws = aligned_alloc(64, SAN_WORKSPACE_BYTES_FOR_THREADS(2) + 64);
  if (!ws || san_input_dtype(0) != AOTC_DTYPE_STRING) return 2;
  if (san_run(x, y, eq, code, ws) != SAN_OK) return 1;
  for (int i = 0; i < 6; i++) printf("%d %lld\n", (int)eq[i], (long long)code[i]);
  aotc_parallel *pool = san_pool_create(2);
  const void *in[] = { x, y };
  void *out[] = { eq, code };
  if (!pool || san_run_parallel(in, out, ws, SAN_WORKSPACE_BYTES_FOR_THREADS(2), pool) != SAN_OK) return 1;
  san_pool_destroy(pool);
  free(ws);
  return 0;
}
"""


def test_sanitizers_run_clean(tmp_path) -> None:
    require_sanitizers(tmp_path)
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1",
             *CFLAGS]
    nodes = [helper.make_node("Equal", ["x", "y"], ["eq"]),
             helper.make_node("LabelEncoder", ["x"], ["code"], domain=ML, keys_strings=HOSTILE + ["é"],
                              values_int64s=list(range(1, len(HOSTILE) + 2)), default_int64=-1)]
    compile_model(_model(nodes, {"x": (S, (6,)), "y": (S, (1,))}, {"eq": BOOL, "code": I64}), tmp_path, "san",
                  extra_cflags=flags)
    proc = run_c_program_under_sanitizers(tmp_path, APP, "libsan.a", flags)
    index = {k: i + 1 for i, k in enumerate(HOSTILE + ["é"]) if "\0" not in k}
    want = [(int(s == "*/"), index.get(s, -1)) for s in ['"', "line\nbreak", "*/", "", "x", "é"]]
    assert [tuple(map(int, line.split())) for line in proc.stdout.splitlines()] == want
