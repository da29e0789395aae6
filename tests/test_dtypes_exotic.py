"""Emulated element types (bfloat16, float8, float4, int4/uint4/int2/uint2): the conversions of
runtime/aotc_types.h checked bit for bit against ml_dtypes and onnx's reference rules, through Cast
models compiled by aotc, and models computing on these types through the Python bindings."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aotc
from aotc.ir import dtypes

F8 = {  # ONNX type -> numpy type, for the 8-bit floats with both saturating and plain casts
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
}
SMALL_INT = {TensorProto.INT4: ml_dtypes.int4, TensorProto.UINT4: ml_dtypes.uint4,
             TensorProto.INT2: ml_dtypes.int2, TensorProto.UINT2: ml_dtypes.uint2}
E8M0_MODES = ("up", "down", "nearest")


def _probe_floats() -> np.ndarray:
    """float32 values that exercise every rounding decision of the small formats: each
    representable value of every format, the midpoints between neighbours (ties), values just
    beside those, float32 subnormals, huge values, infinities, NaNs and random bit patterns."""
    grid = set()
    for t in [*F8.values(), ml_dtypes.float4_e2m1fn, ml_dtypes.bfloat16]:
        bits = np.arange(1 << (16 if t is ml_dtypes.bfloat16 else 8), dtype=np.uint32)
        v = bits.astype(np.uint16 if t is ml_dtypes.bfloat16 else np.uint8).view(t).astype(np.float32)
        v = np.unique(v[np.isfinite(v)].astype(np.float64))
        if t is ml_dtypes.bfloat16:
            v = v[:: 97]  # a sample keeps the probe small; bf16 rounding is also probed by random bits
        mids = (v[1:] + v[:-1]) / 2
        grid.update(v.tolist())
        grid.update(mids.tolist())
    base = np.array(sorted(grid), np.float32)
    near = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-39, 3.4e38, -3.4e38,
                        1e6, -1e6, 1e-7, -1e-7], np.float32)
    nan_payloads = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF], np.uint32).view(np.float32)
    return np.concatenate([near, -near, rand, special, nan_payloads]).astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bit-identical, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype, what
    g, w = got.astype(np.float32), want.astype(np.float32)
    same = (_bits(got) == _bits(want)) | (np.isnan(g) & np.isnan(w))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{what}: {bad.size} differ, e.g. index {bad[:5]}: got {_bits(got)[bad[:5]]}, " \
                          f"want {_bits(want)[bad[:5]]}"


@pytest.fixture(scope="module")
def casts(tmp_path_factory):
    """One compiled model of many Casts: narrowing each probe float to every type (plain and
    saturating), widening every bit pattern of every type, and the small integers both ways."""
    probe = _probe_floats()
    nodes, inputs, outputs, feeds = [], [], [], {}

    def inp(name: str, elem: int, a: np.ndarray) -> None:
        inputs.append(helper.make_tensor_value_info(name, elem, a.shape))
        feeds[name] = a

    def cast(src: str, dst: str, to: int, n: int, **attrs) -> None:
        nodes.append(helper.make_node("Cast", [src], [dst], to=to, **attrs))
        outputs.append(helper.make_tensor_value_info(dst, to, [n]))

    inp("f", TensorProto.FLOAT, probe)
    with np.errstate(over="ignore"):
        inp("h", TensorProto.FLOAT16, probe.astype(np.float16))
    for elem, t in [*F8.items(), (TensorProto.FLOAT4E2M1, ml_dtypes.float4_e2m1fn),
                    (TensorProto.FLOAT8E8M0, ml_dtypes.float8_e8m0fnu), (TensorProto.BFLOAT16, ml_dtypes.bfloat16)]:
        n = 1 << (16 if t is ml_dtypes.bfloat16 else 4 if t is ml_dtypes.float4_e2m1fn else 8)
        patterns = np.arange(n, dtype=np.uint16 if n > 256 else np.uint8).view(t)
        inp(f"all_{elem}", elem, patterns)
        cast(f"all_{elem}", f"wide_{elem}", TensorProto.FLOAT, n)
        if elem == TensorProto.FLOAT8E8M0:
            for mode in E8M0_MODES:
                for sat in (0, 1):
                    cast("f", f"e8m0_{mode}_{sat}", elem, probe.size, saturate=sat, round_mode=mode)
            continue
        cast("f", f"plain_{elem}", elem, probe.size, saturate=0)
        cast("h", f"half_{elem}", elem, probe.size, saturate=0)
        if elem in F8:
            cast("f", f"sat_{elem}", elem, probe.size)
    ints = np.concatenate([np.arange(-40, 40, 0.25), [np.nan, np.inf, -np.inf, 3e9, -3e9, 2.0 ** 31, -2.0 ** 31]])
    inp("i", TensorProto.FLOAT, ints.astype(np.float32))
    inp("i64", TensorProto.INT64, np.arange(-300, 300, dtype=np.int64))
    for elem, t in SMALL_INT.items():
        n = 16 if t in (ml_dtypes.int4, ml_dtypes.uint4) else 4
        inp(f"all_{elem}", elem, np.arange(n, dtype=np.uint8).view(t))
        cast(f"all_{elem}", f"int8_{elem}", TensorProto.INT8, n)
        cast(f"all_{elem}", f"wide_{elem}", TensorProto.FLOAT, n)
        cast("i", f"from_f_{elem}", elem, ints.size)
        cast("i64", f"from_i_{elem}", elem, 600)
    graph = helper.make_graph(nodes, "casts", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    m = aotc.compile(model, out_dir=str(tmp_path_factory.mktemp("casts")), name="casts")
    got = dict(zip([o.name for o in outputs], m.run(feeds), strict=True))
    return feeds, got


@pytest.mark.parametrize("elem", [*F8, TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E8M0, TensorProto.BFLOAT16],
                         ids=TensorProto.DataType.Name)
def test_widen_every_bit_pattern(casts, elem: int) -> None:
    feeds, got = casts
    want = feeds[f"all_{elem}"].astype(np.float32)
    _assert_same(got[f"wide_{elem}"], want, "to float32")


@pytest.mark.parametrize("elem", [*F8, TensorProto.FLOAT4E2M1, TensorProto.BFLOAT16], ids=TensorProto.DataType.Name)
def test_narrow_rounds_like_ml_dtypes(casts, elem: int) -> None:
    """saturate=0 is ml_dtypes' conversion: ties to even, overflow to inf or NaN (float4 and
    bfloat16 have no choice: float4 saturates, bfloat16 overflows to inf)."""
    feeds, got = casts
    t = onnx.helper.tensor_dtype_to_np_dtype(elem)
    with np.errstate(all="ignore"):
        _assert_same(got[f"plain_{elem}"], feeds["f"].astype(t), "from float32")
        _assert_same(got[f"half_{elem}"], feeds["h"].astype(t), "from float16")


@pytest.mark.parametrize("elem", list(F8), ids=TensorProto.DataType.Name)
def test_narrow_saturates(casts, elem: int) -> None:
    feeds, got = casts
    with np.errstate(invalid="ignore"):  # NaN inputs
        want = numpy_helper.saturate_cast(feeds["f"], F8[elem])
    _assert_same(got[f"sat_{elem}"], want, "saturating cast")
    g = got[f"sat_{elem}"].astype(np.float32)
    finite_in = ~np.isnan(feeds["f"])
    assert np.isfinite(g[finite_in]).all()  # infinities and overflow become the largest value


def test_nan_and_negative_zero_rules(casts) -> None:
    """Cast's table: NaN stays NaN, -0 has no encoding in the FNUZ types (it becomes +0)."""
    feeds, got = casts
    f = feeds["f"]
    for elem in F8:
        out = _bits(got[f"plain_{elem}"])
        assert np.isnan(got[f"plain_{elem}"].astype(np.float32)[np.isnan(f)]).all()
        if elem in (TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ):
            assert (out[f == 0] == 0).all()
            assert (out[(f < 0) & (f > -1e-12)] == 0).all()  # negative underflow too
        else:
            assert (out[(f == 0) & np.signbit(f)] == 0x80).all()


@pytest.mark.parametrize("mode", E8M0_MODES)
@pytest.mark.parametrize("sat", [0, 1])
def test_e8m0_rounding_modes(casts, mode: str, sat: int) -> None:
    feeds, got = casts
    want = numpy_helper.to_float8e8m0(feeds["f"], bool(sat), mode)
    assert (_bits(got[f"e8m0_{mode}_{sat}"]) == _bits(want)).all()


@pytest.mark.parametrize("elem", list(SMALL_INT), ids=TensorProto.DataType.Name)
def test_small_integers(casts, elem: int) -> None:
    feeds, got = casts
    t = SMALL_INT[elem]
    allv = feeds[f"all_{elem}"]
    assert (got[f"int8_{elem}"] == allv.astype(np.int8)).all()
    assert (got[f"wide_{elem}"] == allv.astype(np.float32)).all()
    with np.errstate(all="ignore"):
        want_f = feeds["i"].astype(t)  # truncation toward zero, then the low bits; NaN/out of range: 0
    assert (_bits(got[f"from_f_{elem}"]) == _bits(want_f)).all()
    assert (_bits(got[f"from_i_{elem}"]) == _bits(feeds["i64"].astype(t))).all()
    assert (_bits(got[f"from_i_{elem}"]) < (16 if t in (ml_dtypes.int4, ml_dtypes.uint4) else 4)).all()


def test_dtype_codes_are_onnx_numbers() -> None:
    for name, code in dtypes.DTYPE_CODES.items():
        assert dtypes.onnx_type(dtypes.from_name(name)) == code


def test_arithmetic_through_bindings(tmp_path) -> None:
    """bfloat16 and float8 inputs and outputs: every op's result rounded to bfloat16 as the
    reference does; an int4 weight and a bfloat16 weight embedded as constants; a MatMul (a GEMM
    kernel, not a fused loop) on bfloat16."""
    bf, f8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
    rng = np.random.default_rng(1)
    w4 = rng.integers(-8, 8, (4, 6)).astype(ml_dtypes.int4)
    wb = rng.normal(size=(6, 3)).astype(bf)
    nodes = [
        helper.make_node("Cast", ["b"], ["b16"], to=TensorProto.BFLOAT16),
        helper.make_node("Mul", ["a", "b16"], ["p"]),
        helper.make_node("Add", ["p", "a"], ["s"]),
        helper.make_node("Sqrt", ["s"], ["y"]),
        helper.make_node("Cast", ["y"], ["y8"], to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["w4"], ["w4b"], to=TensorProto.BFLOAT16),
        helper.make_node("MatMul", ["w4b", "wb"], ["mm"]),
        helper.make_node("MatMul", ["y", "wb"], ["mm2"]),
    ]
    graph = helper.make_graph(
        nodes, "exotic",
        [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [4, 6]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT8E4M3FN, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4, 6]),
         helper.make_tensor_value_info("y8", TensorProto.FLOAT8E4M3FN, [4, 6]),
         helper.make_tensor_value_info("mm", TensorProto.BFLOAT16, [4, 3]),
         helper.make_tensor_value_info("mm2", TensorProto.BFLOAT16, [4, 3])],
        [numpy_helper.from_array(w4, "w4"), numpy_helper.from_array(wb, "wb")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    m = aotc.compile(model, out_dir=str(tmp_path), name="exotic")
    assert [t.dtype for t in m.inputs] == [np.dtype(bf), np.dtype(f8)]
    assert [t.dtype for t in m.outputs] == [np.dtype(bf), np.dtype(f8), np.dtype(bf), np.dtype(bf)]
    a = rng.uniform(0.5, 4, (4, 6)).astype(bf)
    b = rng.uniform(-0.4, 4, (4, 6)).astype(f8)
    y, y8, mm, mm2 = m.run({"a": a, "b": b})

    p = (a.astype(np.float32) * b.astype(bf).astype(np.float32)).astype(bf)
    s = (p.astype(np.float32) + a.astype(np.float32)).astype(bf)
    want = np.sqrt(s.astype(np.float32)).astype(bf)
    _assert_same(y, want, "bf16 chain")
    _assert_same(y8, numpy_helper.saturate_cast(want.astype(np.float32), f8), "to float8")
    # float32 accumulation, one rounding at the end: ml_dtypes' matmul on bfloat16
    _assert_same(mm, (w4.astype(np.float32) @ wb.astype(np.float32)).astype(bf), "int4 x bf16 weights")
    ref2 = (want.astype(np.float32) @ wb.astype(np.float32)).astype(bf)
    assert np.abs(mm2.astype(np.float32) - ref2.astype(np.float32)).max() <= \
        np.abs(ref2.astype(np.float32)).max() * 2 ** -7  # GEMM summation order: at most an ulp
    with pytest.raises(TypeError):
        m.run({"a": a.astype(np.float32), "b": b})


@pytest.mark.parametrize("elem", [TensorProto.BFLOAT16, TensorProto.FLOAT16], ids=TensorProto.DataType.Name)
def test_softmax_rounds_each_step_like_the_reference(tmp_path, elem: int) -> None:
    """Softmax on bfloat16 and float16 rounds x - max, exp, the sum and the quotient as onnx.reference
    (numpy / ml_dtypes) does, bit for bit: along the last axis (float16 sums in float32 there) and
    along a middle axis (float16 then rounds each addition); rows long and short, with -inf and NaN."""
    shape = (3, 37, 5)
    nodes = [helper.make_node("Softmax", ["x"], ["last"]), helper.make_node("Softmax", ["x"], ["mid"], axis=1),
             helper.make_node("Softmax", ["x"], ["first"], axis=0)]
    vi = [helper.make_tensor_value_info(n, elem, list(shape)) for n in ("x", "last", "mid", "first")]
    model = helper.make_model(helper.make_graph(nodes, "sm", vi[:1], vi[1:]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    dt = helper.tensor_dtype_to_np_dtype(elem)
    x = (np.random.default_rng(elem).normal(size=shape) * 4).astype(dt)
    x[0, 3, :] = -np.inf
    x[1, :, 2] = -np.inf
    x[2, 5, 1] = np.nan
    from onnx.reference import ReferenceEvaluator
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = aotc.compile(model, out_dir=str(tmp_path), name="sm").run({"x": x})
    for g, w, what in zip(got, want, ("last axis", "middle axis", "first axis"), strict=True):
        _assert_same(g.reshape(-1), w.reshape(-1), what)


def test_float16_matmul_and_conv_round_once(tmp_path) -> None:
    """float16 MatMul and Conv accumulate in float and round once (a Conv's bias added after that
    rounding), as numpy's float16 matmul in onnx.reference does: bit for bit."""
    f16 = TensorProto.FLOAT16
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),
             helper.make_node("Conv", ["x", "w", "cb"], ["cy"], pads=[1, 1, 1, 1])]
    shapes = {"a": [2, 5, 24], "b": [24, 7], "x": [1, 3, 6, 6], "w": [4, 3, 3, 3], "cb": [4],
              "mm": [2, 5, 7], "cy": [1, 4, 6, 6]}
    vi = {n: helper.make_tensor_value_info(n, f16, s) for n, s in shapes.items()}
    model = helper.make_model(helper.make_graph(nodes, "h", [vi[n] for n in ("a", "b", "x", "w", "cb")],
                                                [vi["mm"], vi["cy"]]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    rng = np.random.default_rng(4)
    feeds = {n: rng.uniform(-2, 2, shapes[n]).astype(np.float16) for n in ("a", "b", "x", "w", "cb")}
    from onnx.reference import ReferenceEvaluator
    want = ReferenceEvaluator(model).run(None, feeds)
    got = aotc.compile(model, out_dir=str(tmp_path), name="h16").run(feeds)
    for g, w, what in zip(got, want, ("MatMul", "Conv"), strict=True):
        _assert_same(g.reshape(-1), w.reshape(-1), what)
