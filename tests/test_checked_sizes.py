"""Hardening (issue 19): sizes are checked before they reach C, no compile-time structure grows with a
tensor's element count, model names cannot collide with C macros, fusion asks the emitter, and the
numerics of LogSoftmax and of Winograd convolutions on non-finite inputs are pinned."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from models import make, vi
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import run_generated_test_under_sanitizers, run_ort

import aotc
from aotc.codegen.names import Mangler, check_model_name, reserved
from aotc.compiler import compile_model
from aotc.frontends.onnx import import_onnx
from aotc.passes.memory import MAX_BYTES
from aotc.passes.propagate import propagate
from aotc.resources import runtime_dir, templates_dir

pytest.importorskip("onnxruntime")

F, D, I8, I32 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.INT32
node = helper.make_node


def _const(name: str, arr) -> object:
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17):
    m = make(nodes, inputs, outputs, inits, opset=opset)
    m.ir_version = 10  # onnxruntime reads up to 13
    return m


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True)


def _one_line_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aotc: error:") and fragment in lines[0], proc.stderr


def _expand_softmax_sum(n: int):
    """The issue's repro: a 1-element input expanded to n elements, Softmax, ReduceSum."""
    return _model([node("Expand", ["x", "shape"], ["e"]), node("Softmax", ["e"], ["s"]),
                   node("ReduceSum", ["s"], ["y"], keepdims=0)],
                  [vi("x", [1])], [vi("y", [])], [_const("shape", np.array([n], np.int64))])


# -- 1. checked size arithmetic ----------------------------------------------------------------------

def test_a_tensor_past_the_size_limit_is_one_clear_error(tmp_path) -> None:
    """[2^62 + 512] float32 elements compiled with exit 0 into a NAME_WORKSPACE_BYTES above 2^64."""
    path = tmp_path / "big.onnx"
    path.write_bytes(_expand_softmax_sum(2**62 + 512).SerializeToString())
    _one_line_error(_cli("compile", str(path), "-o", str(tmp_path / "out"), "-n", "m"),
                    "Expand node 'Expand_0': tensor 'e' of shape [4611686018427388416] (float32) would take "
                    "18446744073709553664 bytes")
    assert not list((tmp_path / "out").glob("**/libm.so"))


def test_input_shapes_are_checked_exactly(tmp_path) -> None:
    """numpy's int64 product of [2^40, 2^40] wraps to 0; the check multiplies Python ints."""
    m = _model([node("Relu", ["x"], ["y"])], [vi("x", ["a", "b"])], [vi("y", ["a", "b"])])
    with pytest.raises(aotc.AotcError, match=r"input 'x': tensor 'x' of shape \[1099511627776, 1099511627776\]"):
        compile_model(m, tmp_path, "m", input_shapes={"x": (2**40, 2**40)})
    with pytest.raises(aotc.AotcError, match=r"input 'x': .*dimension.* of at most 281474976710656 bytes"):
        compile_model(m, tmp_path, "m", input_shapes={"x": (0, 2**49)})  # empty, but its loops would not be


def test_a_workspace_past_the_limit_is_refused(tmp_path) -> None:
    """Softmax results of 2^47 + 256 bytes each, two of them live at once: each tensor fits, not both."""
    n = 2**45 + 64
    m = _model([node("Expand", ["x", "shape"], ["e"]), node("Softmax", ["e"], ["s1"]),
                node("Softmax", ["s1"], ["s2"]), node("Add", ["s1", "s2"], ["t"]),
                node("ReduceSum", ["t"], ["y"], keepdims=0)],
               [vi("x", [1])], [vi("y", [])], [_const("shape", np.array([n], np.int64))])
    with pytest.raises(aotc.AotcError, match=r"^the workspace would take 281474976711680 bytes for one thread"):
        compile_model(m, tmp_path, "m")


def test_per_thread_scratch_is_checked_for_every_thread(tmp_path) -> None:
    """Det factors each matrix in its task's scratch slot: 2^39 bytes fit one thread, not 1024."""
    m = _model([node("Det", ["x"], ["y"])], [vi("x", [2**18, 2**18])], [vi("y", [])])
    with pytest.raises(aotc.AotcError, match=r"for one thread, 562949953421312 for 1024 threads"):
        compile_model(m, tmp_path, "m")


def test_sizes_at_the_limit_are_exact_in_the_generated_c(tmp_path) -> None:
    """Just under the limit the workspace constant and workspace_size() are the exact byte count
    (the library is built, never run: it would need 256 TiB)."""
    res = compile_model(_expand_softmax_sum(2**45 - 1024), tmp_path, "m", extra_cflags=["-Werror=overflow"])
    ws = res.library.workspace_bytes
    assert 2**48 - 2**13 <= ws <= MAX_BYTES
    assert f"#define M_WORKSPACE_BYTES ((size_t){ws})" in res.library.files["m.h"].decode()
    so = ctypes.CDLL(str(next(res.out_dir.glob("**/libm.so"))))
    so.m_workspace_size.restype = ctypes.c_size_t
    assert so.m_workspace_size() == ws


# -- 2. no compile-time structure proportional to a tensor --------------------------------------------

def _propagate_peak_bytes(model) -> tuple[int, object]:
    graph = import_onnx(model, {}, "m")
    tracemalloc.start()
    try:
        propagate(graph)
        return tracemalloc.get_traced_memory()[1], graph
    finally:
        tracemalloc.stop()


def test_folding_a_huge_constant_result_is_not_attempted() -> None:
    """Expand of a constant to 2^30 elements used to be evaluated (4 GiB) before being thrown away."""
    m = _model([node("Expand", ["c", "shape"], ["e"]), node("ReduceSum", ["e"], ["y"], keepdims=0)],
               [], [vi("y", [])], [_const("c", np.ones(1, np.float32)), _const("shape", np.array([2**30], np.int64))])
    peak, graph = _propagate_peak_bytes(m)
    assert peak < 16 << 20
    assert [n.op for n in graph.nodes] == ["Expand", "ReduceSum"]


def _decomposed_layernorm_dropout(n: int, rows: int = 2):
    """A LayerNorm without scale written out (as older exports do) and an inference Dropout whose
    mask is fetched: the rewrites made a constant of ones of the row's and of the tensor's size."""
    return _model([node("ReduceMean", ["x"], ["mu"], axes=[-1]), node("Sub", ["x", "mu"], ["d"]),
                   node("Mul", ["d", "d"], ["d2"]), node("ReduceMean", ["d2"], ["var"], axes=[-1]),
                   node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]), node("Div", ["d", "sd"], ["y"]),
                   node("Dropout", ["x"], ["z", "mask"])],
                  [vi("x", [rows, n])],
                  [vi("y", [rows, n]), vi("z", [rows, n]), vi("mask", [rows, n], TensorProto.BOOL)],
                  [_const("eps", np.array(1e-5, np.float32))])


def test_rewrites_make_no_constant_as_large_as_a_tensor(tmp_path) -> None:
    from aotc.passes.pipeline import run_passes

    graph = import_onnx(_decomposed_layernorm_dropout(2**36), {}, "m")
    tracemalloc.start()
    try:
        run_passes(graph)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert sorted(op for k in graph.kernels for op in k.ops) == ["Copy", "Expand", "LayerNormalization"]
    m = _decomposed_layernorm_dropout(8, 3)
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)}
    for got, want in zip(aotc.compile(m, tmp_path, "m").run(feeds), run_ort(m, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_op_without_a_kernel_too_large_for_a_constant_is_refused() -> None:
    """MelWeightMatrix is always computed at compile time: a 32 GiB one is refused before numpy is asked."""
    consts = {"bins": np.int64(2**14), "dft": np.int64(2**20), "rate": np.int64(16000),
              "lo": np.float32(0), "hi": np.float32(8000)}
    m = _model([node("MelWeightMatrix", list(consts), ["y"])], [], [vi("y", [2**19 + 1, 2**14])],
               [_const(k, v) for k, v in consts.items()])
    with pytest.raises(aotc.AotcError, match=r"MelWeightMatrix node 'MelWeightMatrix_0': its output \(34359803904 "
                                             r"bytes\) is computed at compile time and would be a constant above"):
        propagate(import_onnx(m, {}, "m"))


def test_blocked_quantization_scales(tmp_path) -> None:
    """A blocked scale is repeated along the axis only as far as the input reaches: block_size 2^40
    (one block) used to repeat a constant scale 2^40 times at compile time."""
    m = _model([node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2**40),
                node("DequantizeLinear", ["x", "s2"], ["y2"], axis=1, block_size=3),
                node("DequantizeLinear", ["x", "s3"], ["y3"], axis=1, block_size=3),
                node("DequantizeLinear", ["x", "s4"], ["y4"], axis=1, block_size=2**40)],
               [vi("x", [2, 8], I8), vi("s3", [2, 3]), vi("s4", [2, 1])], [vi(f"y{i}", [2, 8]) for i in ("", 2, 3, 4)],
               [_const("s", np.array([[0.5], [2.0]], np.float32)),
                _const("s2", np.array([[0.5, 1, 2], [2.0, 3, 4]], np.float32))], opset=21)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.integers(-100, 100, (2, 8)).astype(np.int8), "s3": rng.random((2, 3)).astype(np.float32),
             "s4": rng.random((2, 1)).astype(np.float32)}
    for got, want in zip(aotc.compile(m, tmp_path, "m").run(feeds), run_ort(m, feeds), strict=True):
        np.testing.assert_array_equal(got, want)
    bad = _model([node("DequantizeLinear", ["x", "s2"], ["y"], axis=1, block_size=2)], [vi("x", [2, 8], I8)],
                 [vi("y", [2, 8])], [_const("s2", np.ones((2, 3), np.float32))], opset=21)
    with pytest.raises(aotc.AotcError, match=r"block_size 2 does not fit 3 blocks of scale along axis 1 of extent 8"):
        compile_model(bad, tmp_path / "bad", "m")


# -- 3. names that C already uses -----------------------------------------------------------------------

_MACRO_NAMES = ["NULL", "INFINITY", "NAN", "AOTC_HIDDEN", "AOTC_M_H", "M_OK", "M_WORKSPACE_BYTES", "m_run_v",
                "int64_t", "class", "EOF", "errno", "SPINS", "linux", "stdin", "I", "x"]


def test_tensor_names_that_are_macros_or_keywords_compile(tmp_path) -> None:
    """Inputs and outputs named like macros of the headers (system, runtime, template, the model's own
    guard and constants), keywords and types; the header also compiles as C++ and after the usual
    system headers in GNU C."""
    nodes = [node("Neg", [n], [f"{n}_" if i % 2 else n.lower() + "y"]) for i, n in enumerate(_MACRO_NAMES[:-1])]
    nodes.append(node("Add", ["x", "NULL"], ["EOF_"]))
    m = _model(nodes, [vi(n, [2]) for n in _MACRO_NAMES], [vi(n.output[0], [2]) for n in nodes])
    res = compile_model(m, tmp_path, "m")
    feeds = {n: np.array([i, -i], np.float32) for i, n in enumerate(_MACRO_NAMES)}
    got = aotc.load(res.prefix).run(feeds)
    for i, out in enumerate(got[:-1]):
        np.testing.assert_array_equal(out, [-i, i])
    np.testing.assert_array_equal(got[-1], feeds["x"] + feeds["NULL"])
    cc = shutil.which("g++")
    header = next(res.out_dir.glob("**/m.h"))
    includes = "".join(f"#include <{h}>\n" for h in ("stdio.h", "stdlib.h", "math.h", "errno.h", "assert.h",
                                                     "complex.h", "stdint.h", "limits.h", "float.h", "time.h"))
    (tmp_path / "use.c").write_text(includes + f'#include "{header}"\nint main(void) {{ return 0; }}\n')
    proc = subprocess.run(["cc", "-std=gnu11", "-fsyntax-only", "-Wall", "-Werror", str(tmp_path / "use.c")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if cc:
        proc = subprocess.run([cc, "-x", "c++", "-fsyntax-only", "-Werror", "-"], capture_output=True, text=True,
                              input=f'#include <cmath>\n#include <cstdio>\n#include "{header}"\n')
        assert proc.returncode == 0, proc.stderr


_C_HEADERS = ("assert.h", "complex.h", "ctype.h", "errno.h", "fenv.h", "float.h", "inttypes.h", "iso646.h",
              "limits.h", "locale.h", "math.h", "setjmp.h", "signal.h", "stdalign.h", "stdarg.h", "stdatomic.h",
              "stdbool.h", "stddef.h", "stdint.h", "stdio.h", "stdlib.h", "stdnoreturn.h", "string.h", "tgmath.h",
              "time.h", "uchar.h", "wchar.h", "wctype.h")


def _system_macros() -> set[str]:
    """The object-like macros, asked of the C compiler, that a parameter list in the header can meet:
    in the generated sources (C11, the system headers the templates include, at the highest POSIX
    level they ask for) and in a C program that includes any standard C header, or the templates'
    POSIX ones, before it (GNU C, which adds ``linux``, ``unix`` and glibc's default extensions)."""
    from aotc.isa import ISAS

    headers = set()
    texts = [p.read_text() for p in [*runtime_dir().glob("*.h"), *templates_dir().glob("*.j2")]
             if not p.name.endswith(".hpp.j2")]  # C++ headers (NAME.hpp) never reach the C sources
    for text in [*texts, *(isa.include for isa in ISAS.values())]:
        headers.update(re.findall(r"#\s*include\s*<([\w/.]+)>", text))
    headers.discard("arm_neon.h")  # not on this host
    found = set()
    def includes(names: set[str]) -> str:
        return "".join(f"#include <{h}>\n" for h in sorted(names))

    for std, src in (("c11", "#define _POSIX_C_SOURCE 200809L\n" + includes(headers)),
                     ("gnu11", includes(headers | set(_C_HEADERS)))):
        proc = subprocess.run(["cc", f"-std={std}", "-dM", "-E", "-"], input=src, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        found |= set(re.findall(r"^#define ([A-Za-z]\w*)(?:\s|$)", proc.stdout, re.M))
    return found


def test_mangler_avoids_every_macro_the_headers_define() -> None:
    """Derived, not listed: every object-like macro the system headers define (asked of the C
    compiler), every macro of aotc's templates and runtime headers, and the model's own names."""
    mangle = Mangler("m")
    missed = sorted(n for n in _system_macros() if mangle(n) == n)
    assert not missed, f"not reserved: {missed}"
    for path in [*runtime_dir().glob("*.h"), *runtime_dir().glob("*.cuh"), *templates_dir().rglob("*.j2")]:
        if path.name == "gemm.c.j2":
            continue
        for name in re.findall(r"#\s*define\s+([A-Za-z]\w*)(?![\w{])", path.read_text()):
            assert reserved(name), f"{path.name}: {name}"
    assert all(reserved(n, "m") for n in ("M_OK", "M_ERR_WORKSPACE", "M_INPUT12_SIZE", "m_run_v", "AOTC_M_H",
                                          "M_ERR_CUDA", "m_load_constants"))  # the CUDA library's too
    assert not any(reserved(n, "m") for n in ("x", "X", "Y", "m_x", "input", "Embedding", "logits",
                                              "arg_m_x_data", "m_a_b"))  # holding the name is not enough


@pytest.mark.parametrize("name", ["aotc_math", "aotc_types", "AOTC_rows", "aotc_x", "math", "rows", "types"])
def test_model_names_that_overwrite_the_runtime_are_refused(name: str) -> None:
    with pytest.raises(aotc.AotcError, match=rf"model name '{name}' must not start with 'aotc_'|header guard"):
        check_model_name(name)


def test_cli_refuses_a_runtime_header_name(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(_model([node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])]).SerializeToString())
    _one_line_error(_cli("compile", str(path), "-o", str(tmp_path / "out"), "-n", "aotc_math"),
                    "model name 'aotc_math' must not start with 'aotc_'")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("**/aotc_math.h*"))


# -- 4. fusion asks the emitter ------------------------------------------------------------------------

def test_matmuls_the_gemm_template_cannot_take_stay_unfused(tmp_path) -> None:
    """A batch-broadcast MatMul + Relu (fusion fused it, the emitter asserted), a MatMul + Add on a
    zero-sized dimension ("epilogue fusion requires the GEMM template"), and the naive loop's
    broadcast batch offsets, now computed instead of tabled, for float and int32."""
    rng = np.random.default_rng(0)
    m = _model([node("MatMul", ["a", "b"], ["ab"]), node("Relu", ["ab"], ["y"]),
                node("MatMul", ["z", "w"], ["zw"]), node("Add", ["zw", "c"], ["y2"]),
                node("MatMul", ["ia", "ib"], ["y3"]), node("MatMul", ["b2", "a2"], ["y4"])],
               [vi("a", [2, 1, 4, 8]), vi("b", [1, 3, 8, 5]), vi("z", [0, 4]), vi("ia", [3, 1, 2, 4], I32),
                vi("ib", [2, 4, 3], I32), vi("b2", [2, 3, 1, 5, 8]), vi("a2", [3, 4, 8, 2])],
               [vi("y", [2, 3, 4, 5]), vi("y2", [0, 3]), vi("y3", [3, 2, 2, 3], I32), vi("y4", [2, 3, 4, 5, 2])],
               [_const("w", rng.standard_normal((4, 3)).astype(np.float32)),
                _const("c", rng.standard_normal(3).astype(np.float32))])
    feeds = {"a": rng.standard_normal((2, 1, 4, 8)), "b": rng.standard_normal((1, 3, 8, 5)), "z": np.zeros((0, 4)),
             "ia": rng.integers(-9, 9, (3, 1, 2, 4)), "ib": rng.integers(-9, 9, (2, 4, 3)),
             "b2": rng.standard_normal((2, 3, 1, 5, 8)), "a2": rng.standard_normal((3, 4, 8, 2))}
    feeds = {k: v.astype(np.int32 if k.startswith("i") else np.float32) for k, v in feeds.items()}
    res = compile_model(m, tmp_path, "m")
    kinds = {k.outputs[0].name: (k.kind, k.ops) for k in res.graph.kernels}
    assert kinds["y"] == ("loop", ["Relu"]) and kinds["y2"] == ("loop", ["Add"])
    got = aotc.load(res.prefix).run(feeds)
    for g, w in zip(got, run_ort(m, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert "_aoff" not in "".join(v.decode() for k, v in res.library.files.items() if "_kernels_" in k)


# -- 5. numerics ------------------------------------------------------------------------------------

def test_log_softmax_of_large_rows(tmp_path) -> None:
    """x - (max + log(sum)) rounded log(sum) away: a row of 1e8 gave -8 instead of -4.1589 (-log 64),
    a row near 3e38 gave 0."""
    m = _model([node("LogSoftmax", ["x"], ["y"]), node("LogSoftmax", ["xd"], ["yd"])],
               [vi("x", [4, 64]), vi("xd", [3, 64], D)], [vi("y", [4, 64]), vi("yd", [3, 64], D)])
    feeds = {"x": np.stack([np.full(64, 1e8), np.full(64, 3e38), np.linspace(3.0e38, 3.3e38, 64),
                            np.arange(64.0)]).astype(np.float32),
             "xd": np.stack([np.full(64, 1e17), np.full(64, 1e300), np.arange(64.0)])}
    got = aotc.compile(m, tmp_path, "m").run(feeds)
    want = run_ort(m, feeds)
    np.testing.assert_allclose(got[0][:2], np.full((2, 64), -np.log(64.0)), rtol=1e-6)
    np.testing.assert_allclose(got[1][:2], np.full((2, 64), -np.log(64.0)), rtol=1e-12)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def _tile_extent(pixel: int, m: int, pad: int, size: int) -> set[int]:
    """The outputs along one axis of the m-wide Winograd tiles whose (m + 2)-wide input tile holds
    input position ``pixel``."""
    tiles = [t for t in range(-(-size // m)) if t * m - pad <= pixel <= t * m - pad + m + 1]
    return {o for t in tiles for o in range(t * m, min(size, t * m + m))}


def test_winograd_conv_non_finite_extent(tmp_path) -> None:
    """The documented behaviour (aotc/ops/winograd.py): a NaN or an infinity makes non-finite every
    output the direct sum (onnxruntime) makes non-finite, and NaN at most the outputs of the tiles
    around it; every other output is finite and as onnxruntime's."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    cases = [(20, (9, 6), 4), (20, (8, 3), 4), (12, (4, 7), 2), (12, (5, 0), 2)]  # F(4x4) and F(2x2)
    nodes = [node("Conv", [f"x{i}", "w"], [f"y{i}"], pads=[1, 1, 1, 1]) for i in range(len(cases))]
    m = _model(nodes, [vi(f"x{i}", [1, 16, s, s]) for i, (s, _, _) in enumerate(cases)],
               [vi(f"y{i}", [1, 16, s, s]) for i, (s, _, _) in enumerate(cases)], [_const("w", w)])
    res = compile_model(m, tmp_path, "m")
    source = "".join(v.decode() for k, v in res.library.files.items() if "_kernels_" in k)
    assert len(set(re.findall(r"void (\w+)_wg_mk\d+\(", source))) == len(cases)
    lib = aotc.load(res.prefix)
    for value in (np.nan, np.inf, -np.inf):
        feeds = {}
        for i, (s, (r, c), _) in enumerate(cases):
            feeds[f"x{i}"] = rng.standard_normal((1, 16, s, s)).astype(np.float32)
            feeds[f"x{i}"][0, 3, r, c] = value
        for (s, (r, c), mt), g, want in zip(cases, lib.run(feeds), run_ort(m, feeds), strict=True):
            tiles = np.zeros((s, s), bool)
            tiles[np.ix_(sorted(_tile_extent(r, mt, 1, s)), sorted(_tile_extent(c, mt, 1, s)))] = True
            bad, direct_bad = ~np.isfinite(g), ~np.isfinite(want)
            assert (direct_bad <= bad).all() and not bad[..., ~tiles].any()
            assert bad.sum() <= (2 * mt) ** 2 * 16
            np.testing.assert_allclose(g[~bad], want[~bad], rtol=1e-4, atol=1e-4)


def test_det_of_a_large_matrix_does_not_use_the_stack(tmp_path) -> None:
    """Det factored each matrix in a stack array of m * m doubles: 9.7 MB for m = 1100, more than
    a thread's 8 MB stack. It now uses the task's scratch slot."""
    n = 1100
    rng = np.random.default_rng(2)
    x = (np.eye(n) + rng.standard_normal((n, n)) * 1e-3).astype(np.float32)
    m = _model([node("Det", ["x"], ["y"])], [vi("x", [n, n])], [vi("y", [])])
    got = aotc.compile(m, tmp_path, "m").run({"x": x})[0]
    np.testing.assert_allclose(got, run_ort(m, {"x": x})[0], rtol=1e-3)


def test_changed_kernels_under_sanitizers(tmp_path) -> None:
    """The kernels changed here (the naive MatMul's computed batch offsets, Det in scratch on two
    threads, LogSoftmax in float and double) are clean under ASan/UBSan."""
    m = _model([node("MatMul", ["a", "b"], ["ab"]), node("Relu", ["ab"], ["y"]),
                node("MatMul", ["ia", "ib"], ["y2"]), node("Det", ["d"], ["y3"]),
                node("LogSoftmax", ["a"], ["y4"]), node("LogSoftmax", ["xd"], ["y5"], axis=0)],
               [vi("a", [2, 1, 4, 8]), vi("b", [1, 3, 8, 5]), vi("ia", [3, 1, 2, 4], I32), vi("ib", [2, 4, 3], I32),
                vi("d", [3, 5, 5]), vi("xd", [6, 3], D)],
               [vi("y", [2, 3, 4, 5]), vi("y2", [3, 2, 2, 3], I32), vi("y3", [3]), vi("y4", [2, 1, 4, 8]),
                vi("y5", [6, 3], D)])
    run_generated_test_under_sanitizers(m, tmp_path)
