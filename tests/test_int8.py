"""int8 convolutions (aotc/passes/quantized.py, aotc/ops/int8_conv.py) against onnxruntime.

Models are float convolutions quantized by onnxruntime's own ``quantize_static`` (tests/int8_models.py),
in QDQ and QOperator form, per channel and per tensor, uint8 and int8 activations; hand-built QDQ
graphs cover a Relu between the Conv and its QuantizeLinear. aotc's output must equal onnxruntime's
bit for bit: both accumulate exactly in int32 and requantize with the same float operations
(int32 -> float, times x_scale * w_scale / y_scale, clamp, round to nearest even).
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from int8_models import quantized
from models import init, make, ort_run, vi
from onnx import TensorProto, helper
from onnx_helpers import run_generated_test_under_sanitizers

import aotc
from aotc.compiler import compile_model
from aotc.target import host_cpu_features


def _conv_model(c: int, m: int, hw: int | tuple[int, int], k: int, stride: int = 1, pad: int = 0,
                group: int = 1, dilation: int = 1, relu: bool = True, seed: int = 0, batch: int = 1,
                auto_pad: str = "") -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    h, w = (hw, hw) if isinstance(hw, int) else hw
    wt = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(np.float32)
    geometry = {"auto_pad": auto_pad} if auto_pad else {"pads": [pad] * 4}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[stride] * 2,
                              group=group, dilations=[dilation] * 2, **geometry)]
    nodes.append(helper.make_node("Relu", ["c"], ["y"]) if relu else helper.make_node("Identity", ["c"], ["y"]))
    return make(nodes, [vi("x", [batch, c, h, w])], [vi("y", None)],
                [init("w", wt), init("b", (0.3 * rng.standard_normal(m)).astype(np.float32))])


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _compile(model: onnx.ModelProto, out: Path, **kw):
    """The library, and the ops of its graph with the dtypes of their first inputs."""
    res = compile_model(model, out, "q", **kw)
    ops = {n.op for n in res.graph.nodes} | {f"{n.op}:{n.inputs[0].dtype}" for n in res.graph.nodes if n.inputs}
    return aotc.load(res.prefix), ops


def _check(model: onnx.ModelProto, tmp_path: Path, packed: bool = True, **kw) -> None:
    feeds = _feeds(model)
    want = ort_run(model, feeds)[0]
    m, ops = _compile(model, tmp_path, **kw)
    assert ("aotc.QLinearConv" in ops) == packed, ops
    assert "MaxPool:float32" not in ops, ops  # pooled as bytes
    got = m.run(feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# (c, m, hw, k, stride, pad, group, dilation): stems, 3x3 with pads, strides, narrow images whose rows
# tiles span, channel counts that are not multiples of 4 or 16, dilation, 1x1, grouped and depthwise
# (those stay QLinearConv, the direct loop).
CONVS = {
    "stem7x7s2": (3, 16, 30, 7, 2, 3, 1, 1),
    "3x3": (24, 40, 9, 3, 1, 1, 1, 1),
    "3x3s2_nopad": (16, 32, (11, 13), 3, 2, 0, 1, 1),
    "dilated": (8, 20, 12, 3, 1, 2, 1, 2),
    "1x1": (64, 48, 7, 1, 1, 0, 1, 1),
    "wide_m": (8, 136, 5, 3, 1, 1, 1, 1),
    "grouped": (8, 12, 8, 3, 1, 1, 2, 1),
    "depthwise": (16, 16, 8, 3, 1, 1, 16, 1),
}


@pytest.mark.parametrize("case", list(CONVS))
def test_qdq_conv_per_channel_uint8(case: str, tmp_path) -> None:
    c, m, hw, k, s, p, g, d = CONVS[case]
    f = _conv_model(c, m, hw, k, s, p, g, d)
    _check(quantized(f, _feeds(f)), tmp_path, packed=g == 1)


def test_qdq_conv_batch_and_auto_pad(tmp_path) -> None:
    f = _conv_model(8, 24, (9, 7), 3, 2, batch=3, auto_pad="SAME_UPPER")
    _check(quantized(f, _feeds(f)), tmp_path)


@pytest.mark.parametrize("int8_activations", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_conv_formats(per_channel: bool, int8_activations: bool, tmp_path) -> None:
    f = _conv_model(12, 24, 10, 3, 1, 1, relu=False)
    _check(quantized(f, _feeds(f), per_channel=per_channel, int8_activations=int8_activations), tmp_path)


@pytest.mark.parametrize("int8_activations", [False, True])
def test_qoperator_qlinearconv(int8_activations: bool, tmp_path) -> None:
    f = _conv_model(6, 20, 9, 3, 2, 1)
    q = quantized(f, _feeds(f), qdq=False, int8_activations=int8_activations)
    assert any(n.op_type == "QLinearConv" for n in q.graph.node)
    _check(q, tmp_path)


def _matmul_model(shape: tuple[int, ...], n: int, gemm: bool, relu: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    k = shape[-1]
    w = (rng.standard_normal((n, k) if gemm else (k, n)) / np.sqrt(k)).astype(np.float32)
    b = (0.3 * rng.standard_normal(n)).astype(np.float32)
    mm = (helper.make_node("Gemm", ["x", "w", "b"], ["c"], transB=1) if gemm
          else helper.make_node("MatMul", ["x", "w"], ["c"]))
    act = helper.make_node("Relu" if relu else "Identity", ["c"], ["y"])
    return make([mm, act], [vi("x", list(shape))], [vi("y", None)], [init("w", w)] + ([init("b", b)] if gemm else []))


@pytest.mark.parametrize("case", ["matmul_rows", "matmul_3d_relu", "gemm_fc", "gemm_rows_int8", "qoperator"])
def test_quantized_matmul_and_gemm(case: str, tmp_path) -> None:
    """QDQ MatMul and Gemm (int32 bias) and QLinearMatMul run on the int8 conv kernel, as a 1x1 conv
    whose pixels are the rows."""
    shape, n, gemm, relu = {"matmul_rows": ((5, 48), 24, False, False), "matmul_3d_relu": ((2, 3, 40), 20, False, True),
                            "gemm_fc": ((1, 64), 10, True, False), "gemm_rows_int8": ((6, 32), 17, True, True),
                            "qoperator": ((4, 36), 12, False, False)}[case]
    f = _matmul_model(shape, n, gemm, relu)
    q = quantized(f, _feeds(f), qdq=case != "qoperator", int8_activations=case.endswith("int8"))
    if case == "qoperator":
        assert any(nd.op_type == "QLinearMatMul" for nd in q.graph.node)
    _check(q, tmp_path)


def test_threads_have_their_own_slices(tmp_path) -> None:
    """Two threads each build their input slice in their own part of the scratch (same bytes as one)."""
    f = _conv_model(32, 48, 40, 3, 1, 1)
    q = quantized(f, _feeds(f))
    feeds = _feeds(f)
    res = compile_model(q, tmp_path, "q")
    assert max(k.plan.tasks for k in res.graph.kernels if k.root.op == "aotc.QLinearConv") >= 2
    want = ort_run(q, feeds)[0]
    m = aotc.load(res.prefix, threads=2)
    for _ in range(20):
        np.testing.assert_array_equal(m.run(feeds)[0], want)


def test_qlinearconv_too_long_for_int32_stays_a_loop(tmp_path) -> None:
    """More than 65536 products per output could overflow the packed kernel's int32 sums in any order:
    such a conv keeps the direct loop (which wraps as onnxruntime's accumulators do)."""
    rng = np.random.default_rng(2)
    c = 7300  # x 9 taps = 65700 products
    inits = [init("sx", np.float32(0.01)), init("zx", np.uint8(3)),
             init("w", rng.integers(-127, 128, (2, c, 3, 3)).astype(np.int8)), init("sw", np.float32(0.001)),
             init("zw", np.int8(0)), init("sy", np.float32(2.0)), init("zy", np.uint8(128))]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], kernel_shape=[3, 3])
    model = make([node], [vi("x", [1, c, 3, 3], TensorProto.UINT8)], [vi("y", None, TensorProto.UINT8)], inits)
    feeds = {"x": rng.integers(0, 256, (1, c, 3, 3)).astype(np.uint8)}
    m, ops = _compile(model, tmp_path)
    assert "aotc.QLinearConv" not in ops and "QLinearConv" in ops
    np.testing.assert_array_equal(m.run(feeds)[0], ort_run(model, feeds)[0])


def _hand_qdq(relu: bool, y_zero: int) -> onnx.ModelProto:
    """QuantizeLinear -> DequantizeLinear -> Conv(DQ(w), DQ(b)) -> [Relu] -> QuantizeLinear ->
    DequantizeLinear, written out (onnxruntime's quantizer folds a Relu into the output range)."""
    rng = np.random.default_rng(3)
    m, c = 20, 8
    sw = (0.01 + 0.02 * rng.random(m)).astype(np.float32)
    sx = np.float32(0.02)
    wq = rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8)
    inits = [init("sx", sx), init("zx", np.uint8(120)), init("wq", wq), init("sw", sw),
             init("zw", np.zeros(m, np.int8)),
             init("bq", rng.integers(-2000, 2000, m).astype(np.int32)),
             init("sb", (sx * sw).astype(np.float32)), init("zb", np.zeros(m, np.int32)),
             init("sy", np.float32(0.05)), init("zy", np.uint8(y_zero))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c" if relu else "r"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             *([helper.make_node("Relu", ["c"], ["r"])] if relu else []),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    return make(nodes, [vi("x", [1, c, 10, 10])], [vi("y", [1, m, 10, 10])], inits, opset=13)


@pytest.mark.parametrize("relu", [False, True])
def test_qdq_conv_relu_before_quantize(relu: bool, tmp_path) -> None:
    _check(_hand_qdq(relu, y_zero=100), tmp_path, packed=True)


def _small_cnn() -> onnx.ModelProto:
    """Conv-Relu, a max pool, a strided conv, a residual add and a pool: the blocks of a quantized ResNet."""
    rng = np.random.default_rng(5)

    def w(m, c, k):
        return init(f"w{m}_{c}_{k}", (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w16_3_3"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["a1"]),
             helper.make_node("MaxPool", ["a1"], ["ar"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Conv", ["ar", "w16_16_3"], ["b"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Add", ["ar", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("Conv", ["sr", "w24_16_3"], ["c"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["cr"]),
             helper.make_node("GlobalAveragePool", ["cr"], ["y"])]
    return make(nodes, [vi("x", [1, 3, 20, 20])], [vi("y", None)],
                [w(16, 3, 3), w(16, 16, 3), w(24, 16, 3)])


def _runs(cpu: str, features: str | None) -> bool:
    need = {"x86-64-v3": {"avx2", "fma"}, "x86-64-v4": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}.get(cpu, set())
    need |= {"+avx512vnni": {"avx512_vnni"}, "+avxvnni": {"avx_vnni"}}.get(features or "", set())
    return need <= host_cpu_features()


# Every int8 dot product: AVX-512 VNNI, its emulation on AVX-512BW, AVX-VNNI, its emulation on AVX2, and
# portable C (--target generic); uint8 and int8 outputs on AVX2 (packed to bytes with either saturation).
ISAS = [("x86-64-v4", "+avx512vnni", False), ("x86-64-v4", None, True), ("x86-64-v3", "+avxvnni", True),
        ("x86-64-v3", None, False), ("generic", None, True)]


@pytest.mark.parametrize("cpu,features,int8_activations", ISAS)
def test_small_quantized_cnn_every_isa(cpu: str, features: str | None, int8_activations: bool, tmp_path) -> None:
    if cpu != "generic" and (host_cpu_features() and not _runs(cpu, features)):
        pytest.skip(f"this CPU cannot run {cpu} {features or ''}")
    f = _small_cnn()
    kw = {"target": "generic"} if cpu == "generic" else {"target_cpu": cpu, "target_features": features}
    _check(quantized(f, _feeds(f), int8_activations=int8_activations), tmp_path, **kw)


def test_small_quantized_cnn_on_aarch64(tmp_path) -> None:
    """Cross-compiled, the portable kernel (no x86 header reaches the file) passes its generated test
    (outputs stored from onnxruntime) under qemu-user."""
    from test_cross_targets import FAST, _need_cross, _run

    runner = _need_cross("aarch64-linux-gnu")
    f = _small_cnn()
    compile_model(quantized(f, _feeds(f), int8_activations=True), tmp_path, "q", target="aarch64-linux-gnu",
                  gen_test=True, extra_cflags=FAST)
    _run(runner, tmp_path / "q_test")


@pytest.mark.parametrize("cpu,features", [("native", None), ("x86-64-v3", "+avxvnni"), ("x86-64-v3", None),
                                          ("generic", None)])
def test_small_quantized_cnn_sanitizers(cpu: str, features: str | None, tmp_path) -> None:
    if cpu not in ("native", "generic") and not _runs(cpu, features):
        pytest.skip(f"this CPU cannot run {cpu} {features or ''}")
    kw = {"target": "generic"} if cpu == "generic" else {"target_cpu": cpu, "target_features": features}
    f = _small_cnn()
    run_generated_test_under_sanitizers(quantized(f, _feeds(f), int8_activations=True), tmp_path, **kw)


@pytest.mark.slow
def test_quantized_resnet18(tmp_path) -> None:
    from int8_models import resnet18_int8

    qpath, _, feeds = resnet18_int8(image=64)
    q = onnx.load(str(qpath))
    want = ort_run(q, feeds)[0]
    m, ops = _compile(q, tmp_path)
    assert "aotc.QLinearConv" in ops and "Conv" not in ops and "MaxPool:uint8" in ops
    np.testing.assert_array_equal(m.run(feeds)[0], want)
    np.testing.assert_array_equal(aotc.load(tmp_path / "q", threads=2).run(feeds)[0], want)



def test_int8_kernels_warning_free(tmp_path) -> None:
    """Every variant of the kernel (they are all in the source, behind the ISA macros) under
    -Wall -Wextra -Werror, with each compiler here, for this machine and for the portable target."""
    from test_generated_c_warnings import COMPILERS, WARNINGS, _generate

    from aotc.build import BASE_CFLAGS
    from aotc.target import resolve

    if not COMPILERS:
        pytest.skip("no C compiler")
    f = _small_cnn()
    sources = [s for s in _generate(quantized(f, _feeds(f), int8_activations=True), {}, tmp_path)
               if "aotc.QLinearConv" in s.read_text()]
    assert sources
    variants = [resolve(None, None, None, None, None).flags, ()]
    if platform.machine() == "x86_64":  # every branch, whether this machine runs it or not
        variants = [("-march=x86-64-v4", "-mavx512vnni"), ("-march=x86-64-v4",), ("-march=x86-64-v3", "-mavxvnni"),
                    ("-march=x86-64-v3",), ()]
    failures = []
    for cc in COMPILERS:
        for flags in variants:
            for src in sources:
                proc = subprocess.run([cc, *BASE_CFLAGS, *flags, *WARNINGS, "-c", str(src), "-o", "/dev/null"],
                                      capture_output=True, text=True, cwd=tmp_path)
                if proc.returncode:
                    failures.append(f"{cc} {' '.join(flags)} {src.name}:\n{proc.stderr[:3000]}")
    assert not failures, "\n".join(failures)
