"""LayerNormalization / InstanceNormalization / GroupNormalization against onnxruntime (or numpy)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_helpers import (
    IR_VERSION,
    Case,
    Inp,
    assert_close,
    build_model,
    make_feeds,
    run_aotc,
    run_generated_test_under_sanitizers,
    run_ort,
    single,
)

R = np.random.default_rng(0)


def _w(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def _ln_ref(axis: int, eps: float = 1e-5):
    """float64 LayerNorm: the reference where float32 onnxruntime itself loses digits."""
    def ref(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x0"].astype(np.float64)
        ax = tuple(range(axis % x.ndim, x.ndim))
        d = x - x.mean(axis=ax, keepdims=True)
        return [(d / np.sqrt((d * d).mean(axis=ax, keepdims=True) + eps)).astype(np.float32)]
    return ref


def _ln3(case_id: str, shape: tuple[int, ...], axis: int, outs: list[str], bias: bool = True) -> Case:
    """LayerNorm with chosen (possibly empty-named) optional outputs."""
    norm = shape[axis:] if axis >= 0 else shape[axis:]
    consts = {"s": _w(*norm)} | ({"b": _w(*norm)} if bias else {})
    # (No "" placeholder for an absent B: onnxruntime 1.31 crashes on LayerNormalization(x, s, "").)
    node = helper.make_node("LayerNormalization", ["x0", "s", "b"][:3 if bias else 2], outs, axis=axis)
    return Case(case_id, [node], {"x0": Inp(shape)}, [o for o in outs if o], consts,
                rtol=1e-4, atol=1e-5)


CASES_17 = [
    _ln3("ln_last_all_outputs", (2, 5, 64), -1, ["y", "mean", "inv"]),
    _ln3("ln_axis1_inv_only", (3, 4, 7), 1, ["y", "", "inv"]),
    _ln3("ln_no_bias", (4, 33), -1, ["y"], bias=False),
    _ln3("ln_axis0", (3, 20), 0, ["y", "mean"]),
    single("ln_suffix_scale", "LayerNormalization", [Inp((2, 3, 4, 8)), _w(8), _w(4, 8)],
           {"axis": 1}, rtol=1e-4, atol=1e-5),
    single("ln_scalar_scale_input", "LayerNormalization", [Inp((5, 17)), Inp((17,)), Inp((17,))],
           {"epsilon": 1e-3}, rtol=1e-4, atol=1e-5),
    single("ln_double", "LayerNormalization", [Inp((3, 160), "float64"), np.ones(160), np.zeros(160)],
           rtol=1e-10, atol=1e-12),
    # |mean| >> std: E[x^2]-E[x]^2 would lose every digit; compare with float64.
    single("ln_offset", "LayerNormalization",
           [Inp((4, 256), gen="normal"), np.ones(256, np.float32)], rtol=1e-3, atol=1e-3),
    single("instancenorm", "InstanceNormalization", [Inp((2, 3, 5, 6)), _w(3), _w(3)],
           {"epsilon": 1e-4}, rtol=1e-4, atol=1e-5),
    single("instancenorm_1d", "InstanceNormalization", [Inp((1, 4, 40)), _w(4), _w(4)],
           rtol=1e-4, atol=1e-5),
]
GN_18 = [(18, (2, 6, 4, 4), 3, 3, 1e-5)]
GN_21 = [(21, (2, 6, 4, 5), 2, 6, 1e-5), (21, (1, 8, 9), 4, 8, 1e-3)]


def _offset_feeds(case: Case, feeds: dict[str, np.ndarray], names: dict[str, str]) -> None:
    if case.id == "ln_offset":
        feeds[names["x0"]] = feeds[names["x0"]] + 3000.0


def test_norm(tmp_path) -> None:
    cases = CASES_17
    model, maps = build_model(cases)
    feeds: dict[str, np.ndarray] = {}
    for c, names in zip(cases, maps, strict=True):
        f = make_feeds(c, names)
        _offset_feeds(c, f, names)
        feeds |= f
    got = run_aotc(model, feeds, tmp_path)
    want = run_ort(model, feeds)
    # Rows are split over tasks whole, so the thread count must not change a single bit.
    import aotc

    for g, g2 in zip(got, aotc.load(tmp_path / "t", threads=2).run(feeds), strict=True):
        np.testing.assert_array_equal(g, g2)
    k = 0
    for c, names in zip(cases, maps, strict=True):
        if c.id == "ln_offset":
            want[k] = _ln_ref(-1)({"x0": feeds[names["x0"]]})[0]
        for o in c.outputs:
            assert_close(got[k], want[k], c.rtol, c.atol, f"{c.id}:{o}")
            k += 1


@pytest.mark.parametrize("spec", GN_18 + GN_21, ids=lambda s: f"opset{s[0]}_{'x'.join(map(str, s[1]))}")
def test_group_norm(spec: tuple, tmp_path) -> None:
    # Built by hand: onnx's strict shape inference does not type GroupNormalization's output.
    opset, shape, groups, n_scale, eps = spec
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=eps)
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph([node], "gn", [helper.make_tensor_value_info("x", f32, shape)],
                              [helper.make_tensor_value_info("y", f32, shape)],
                              [numpy_helper.from_array(_w(n_scale), "s"), numpy_helper.from_array(_w(n_scale), "b")])
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {"x": R.standard_normal(shape).astype(np.float32)}
    assert_close(run_aotc(model, feeds, tmp_path)[0], run_ort(model, feeds)[0], 1e-4, 1e-5, str(spec))


# -- the pattern pass: decomposed LayerNorm and GELU ------------------------------------------------

def _decomposed_model(opset: int) -> onnx.ModelProto:
    """Old-export LayerNorm (axes as attribute before 18, as input from 18), erf GELU, tanh GELU."""
    f32 = onnx.TensorProto.FLOAT
    axes18 = opset >= 18
    mk = helper.make_node

    def rmean(i: str, o: str):
        return mk("ReduceMean", [i, "axes"], [o]) if axes18 else mk("ReduceMean", [i], [o], axes=[-1])

    nodes = [rmean("x", "mu"), mk("Sub", ["x", "mu"], ["d"]), mk("Pow", ["d", "two"], ["d2"]), rmean("d2", "var"),
             mk("Add", ["var", "eps"], ["ve"]), mk("Sqrt", ["ve"], ["sd"]), mk("Div", ["d", "sd"], ["n"]),
             mk("Mul", ["n", "gamma"], ["ng"]), mk("Add", ["ng", "beta"], ["ln"]),
             # erf GELU: (x * (1 + erf(x / sqrt2))) * 0.5
             mk("Div", ["ln", "sqrt2"], ["g0"]), mk("Erf", ["g0"], ["g1"]), mk("Add", ["g1", "one"], ["g2"]),
             mk("Mul", ["ln", "g2"], ["g3"]), mk("Mul", ["g3", "half"], ["ge"]),
             # tanh GELU: (0.5 * x) * (1 + tanh(c * (x + 0.044715 * x^3)))
             mk("Mul", ["ge", "half"], ["t0"]), mk("Pow", ["ge", "three"], ["t1"]), mk("Mul", ["t1", "k"], ["t2"]),
             mk("Add", ["ge", "t2"], ["t3"]), mk("Mul", ["t3", "c"], ["t4"]), mk("Tanh", ["t4"], ["t5"]),
             mk("Add", ["t5", "one"], ["t6"]), mk("Mul", ["t0", "t6"], ["y"])]
    consts = {"two": 2.0, "eps": 1e-5, "sqrt2": np.sqrt(2.0), "one": 1.0, "half": 0.5, "three": 3.0,
              "k": 0.044715, "c": np.sqrt(2 / np.pi)}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    inits += [numpy_helper.from_array(_w(48), "gamma"), numpy_helper.from_array(_w(48), "beta")]
    if axes18:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    graph = helper.make_graph(nodes, "dec", [helper.make_tensor_value_info("x", f32, [2, 8, 48])],
                              [helper.make_tensor_value_info("y", f32, [2, 8, 48])], inits)
    return helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [13, 18])
def test_patterns(opset: int, tmp_path, monkeypatch) -> None:
    from real_models import with_patterns

    import aotc
    from aotc.compiler import compile_model
    from aotc.passes import pipeline

    monkeypatch.setattr(pipeline, "DEFAULT_PASSES", with_patterns())  # until the pipeline has it
    model = _decomposed_model(opset)
    res = compile_model(model, tmp_path, "p")
    ops = [n.op for n in res.graph.nodes]
    assert ops.count("LayerNormalization") == 1 and ops.count("Gelu") == 2, ops
    assert not {"ReduceMean", "Erf", "Tanh", "Pow"} & set(ops), ops
    feeds = {"x": (R.standard_normal((2, 8, 48)) * 3 + 1).astype(np.float32)}
    got = aotc.load(res.prefix).run(feeds)[0]
    assert_close(got, run_ort(model, feeds)[0], 1e-4, 1e-5, f"patterns opset {opset}")


# -- LayerNorm with its elementwise producer chain in the row kernel ------------------------------

def _fused_ln_model() -> onnx.ModelProto:
    """Three LayerNorms fed by elementwise chains: an erf GELU (the benchmark's shape, smaller), a
    transpose + broadcast bias + Relu normalized over two axes (index remaps in the row), and a
    per-row broadcast Add + Sigmoid whose sum is also fetched (so that chain must stay a kernel)."""
    f32 = onnx.TensorProto.FLOAT
    mk = helper.make_node
    nodes = [mk("Div", ["a", "sqrt2"], ["a0"]), mk("Erf", ["a0"], ["a1"]), mk("Add", ["a1", "one"], ["a2"]),
             mk("Mul", ["a", "a2"], ["a3"]), mk("Mul", ["a3", "half"], ["a4"]),
             mk("LayerNormalization", ["a4", "ga", "ba"], ["ya"], axis=-1),
             mk("Transpose", ["b"], ["b0"], perm=[0, 2, 1]), mk("Add", ["b0", "bb"], ["b1"]),
             mk("Relu", ["b1"], ["b2"]), mk("LayerNormalization", ["b2", "gb"], ["yb", "mb", "ib"], axis=1),
             mk("Add", ["c", "cr"], ["c0"]), mk("Sigmoid", ["c0"], ["c1"]),
             mk("LayerNormalization", ["c1", "gc", "bc"], ["yc"], axis=-1), mk("Add", ["c1", "c1"], ["c2"])]
    consts = {"sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5),
              "ga": _w(256), "ba": _w(256), "bb": _w(6), "gb": _w(8, 6), "cr": _w(3, 1, 1), "gc": _w(16),
              "bc": _w(16)}
    ins = {"a": [64, 256], "b": [4, 6, 8], "c": [3, 5, 16]}
    outs = {"ya": [64, 256], "yb": [4, 8, 6], "mb": [4, 1, 1], "ib": [4, 1, 1], "yc": [3, 5, 16],
            "c2": [3, 5, 16]}
    graph = helper.make_graph(nodes, "fused_ln", [helper.make_tensor_value_info(k, f32, s) for k, s in ins.items()],
                              [helper.make_tensor_value_info(k, f32, s) for k, s in outs.items()],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", 17)])


def test_layernorm_fuses_producer_chain(tmp_path) -> None:
    import aotc
    from aotc.compiler import compile_model

    model = _fused_ln_model()
    res = compile_model(model, tmp_path, "f")
    fused = {k.root.outputs[0].name: k.ops for k in res.graph.kernels if k.root.op == "LayerNormalization"}
    assert fused["ya"] == ["Gelu", "LayerNormalization"], fused
    # The layout pass moves the Transpose after the bias and Relu; the row kernel reads through it.
    assert fused["yb"] == ["Add", "Relu", "Transpose", "LayerNormalization"], fused
    assert fused["yc"] == ["LayerNormalization"], fused  # c1 is also read by c2
    # A fused row kernel leaves its inputs' sequential sweep to the hardware prefetchers; a plain
    # one prefetches the row ahead of the one it normalizes.
    src = "".join(p.read_text() for p in res.build_dir.glob("f_kernels_*.c"))
    gelu_ln = src[src.index("void f_k0_gelu_layernormalization("):src.index("void f_k1_")]
    assert "__builtin_prefetch(" not in gelu_ln
    assert "__builtin_prefetch(" not in src[src.index("void f_k1_"):src.index("void f_k2_")]
    assert "__builtin_prefetch(" in src[src.index("void f_k3_layernormalization("):src.index("void f_k4_")]
    # One call of the runtime's GELU (a rational, no erf branches), not the erf expression.
    assert "aotc_geluf(" in gelu_ln and "aotc_erff(" not in gelu_ln
    feeds = {k: (R.standard_normal(s) * 2).astype(np.float32) for k, s in (("a", (64, 256)), ("b", (4, 6, 8)),
                                                                           ("c", (3, 5, 16)))}
    got = aotc.load(res.prefix).run(feeds)
    for g, w, name in zip(got, run_ort(model, feeds), ["ya", "yb", "mb", "ib", "yc", "c2"], strict=True):
        assert_close(g, w, 1e-4, 1e-5, name)
    for g, g2 in zip(got, aotc.load(res.prefix, threads=2).run(feeds), strict=True):
        np.testing.assert_array_equal(g, g2)


def test_fused_layernorm_sanitizers(tmp_path) -> None:
    """The fused row kernels (index remaps, broadcasts, in-place row passes) under ASan and UBSan."""
    run_generated_test_under_sanitizers(_fused_ln_model(), tmp_path)


@pytest.mark.parametrize("op", ["LayerNormalization", "InstanceNormalization", "GroupNormalization"])
def test_float16_normalization_runs_in_float32(op: str, tmp_path) -> None:
    """The row kernels have no float16 path: float16 operands are widened to float32 around them and
    the result rounded once, as onnxruntime does."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 4, 3, 5)) * 3 + 1).astype(np.float16)
    scale, bias = rng.standard_normal(4).astype(np.float16), rng.standard_normal(4).astype(np.float16)
    attrs = {"num_groups": 2} if op == "GroupNormalization" else {}
    if op == "LayerNormalization":
        scale, bias, attrs = rng.standard_normal(5).astype(np.float16), rng.standard_normal(5).astype(np.float16), {}
    node = helper.make_node(op, ["x", "s", "b"], ["y"], epsilon=1e-5, **attrs)
    f16 = onnx.TensorProto.FLOAT16
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f16, x.shape)],
                          [helper.make_tensor_value_info("y", f16, x.shape)],
                          [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = IR_VERSION
    xf = x.astype(np.float32)
    if op == "LayerNormalization":
        axes, shape = (3,), (5,)
    elif op == "InstanceNormalization":
        axes, shape = (2, 3), (1, 4, 1, 1)
    else:
        xf = xf.reshape(2, 2, 2, 3, 5)
        axes, shape = (2, 3, 4), (1, 4, 1, 1)
    mean, var = xf.mean(axis=axes, keepdims=True), xf.var(axis=axes, keepdims=True)
    norm = ((xf - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
    want = (norm * scale.astype(np.float32).reshape(shape) + bias.astype(np.float32).reshape(shape)).astype(np.float16)
    got = run_aotc(model, {"x": x}, tmp_path)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
