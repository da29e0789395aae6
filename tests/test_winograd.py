"""The Winograd conv path (aotc/ops/conv/winograd.py): its transforms, and convs that take it against
onnxruntime -- both tile sizes, partial tiles, tile rows narrower than a vector, several tile rows
per work unit, batches, fused epilogues, thread counts, a 4-lane target and the sanitizers."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper
from onnx_helpers import Case, Inp, assert_close, build_model_and_feeds, run_generated_test_under_sanitizers, run_ort

import aotc
from aotc.compiler import compile_model
from aotc.ir.graph import Node, Value
from aotc.ops import conv as conv_ops
from aotc.ops.conv import winograd
from aotc.target import for_isa

pytest.importorskip("onnxruntime")

_rng = np.random.default_rng(11)


def _w(*shape: int) -> np.ndarray:
    return (_rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


@pytest.mark.parametrize("m", [2, 4])
def test_transforms_compute_a_3x3_correlation(m: int) -> None:
    bt, g, at = winograd.matrices(m)
    a = m + 2
    rng = np.random.default_rng(m)
    d, k = rng.standard_normal((a, a)), rng.standard_normal((3, 3))
    got = at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _geometry(x: tuple[int, ...], wshape: tuple[int, ...], pads: list[int]) -> conv_ops.Geometry:
    f32 = np.dtype(np.float32)
    node = Node("Conv", [Value("x", x, f32), Value("w", wshape, f32)], [Value("y")], {"pads": pads})
    return conv_ops.geometry(node)


def test_plan_choice() -> None:
    """F(4x4) for up to 128 channels on large planes, F(2x2) up to 256, the direct path beyond, and
    for what the transforms do not cover (strides, groups, few channels, small planes)."""
    def plan(x, wshape, pads=(1, 1, 1, 1)):
        return winograd.winograd_plan(_geometry(x, wshape, list(pads)), for_isa("avx2"))

    assert plan((1, 64, 56, 56), (64, 64, 3, 3)).m == 4
    assert plan((1, 128, 28, 28), (128, 128, 3, 3)).m == 4
    assert plan((1, 256, 14, 14), (256, 256, 3, 3)).m == 2
    assert plan((1, 512, 7, 7), (512, 512, 3, 3)) is None
    assert plan((1, 8, 20, 20), (16, 8, 3, 3)) is None
    assert plan((1, 32, 6, 6), (32, 32, 3, 3)) is None
    assert plan((1, 32, 20, 20), (32, 32, 5, 5), (2, 2, 2, 2)) is None
    # Tile rows narrower than a vector share one: two rows of 7 tiles (8 slots apart) per 16 floats.
    wide = winograd.winograd_plan(_geometry((1, 256, 14, 14), (256, 256, 3, 3), [1, 1, 1, 1]), for_isa("avx512"))
    assert (wide.m, wide.tw, wide.seg, wide.rt, wide.tp) == (2, 7, 8, 2, 16)
    assert plan((1, 256, 14, 14), (256, 256, 3, 3)).tp == 8


def _conv(cid: str, x: tuple[int, ...], cout: int, pads: list[int], bias: bool = True, relu: bool = False,
          residual: bool = False) -> Case:
    """Conv 3x3 (+ bias) (+ residual Add) (+ Relu); the tolerance covers F(4x4)'s larger rounding."""
    consts = {"w": _w(cout, x[1], 3, 3)}
    if bias:
        consts["b"] = _rng.standard_normal(cout).astype(np.float32)
    inputs = {"x": Inp(x)}
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=pads)]
    last = "c"
    if residual:
        oh, ow = x[2] + pads[0] + pads[2] - 2, x[3] + pads[1] + pads[3] - 2
        inputs["r"] = Inp((x[0], cout, oh, ow))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["y"]))
        last = "y"
    return Case(cid, nodes, inputs, [last], consts, rtol=1e-4, atol=2e-5 * np.sqrt(9 * x[1]))


CASES = [
    _conv("f4_pad1_relu", (1, 32, 20, 20), 48, [1, 1, 1, 1], relu=True),
    _conv("f4_partial_tiles_asym", (1, 16, 17, 19), 24, [1, 0, 0, 1]),
    _conv("f4_narrow_rows_batch2", (2, 40, 28, 28), 36, [1, 1, 1, 1], bias=False),
    _conv("f4_one_unit_many_rows", (1, 16, 64, 40), 16, [1, 1, 1, 1]),
    _conv("f4_residual_relu", (1, 64, 24, 24), 64, [1, 1, 1, 1], relu=True, residual=True),
    _conv("f2_wide", (1, 160, 12, 11), 200, [1, 1, 1, 1], relu=True),
    _conv("f2_nopad", (1, 136, 10, 13), 130, [0, 0, 0, 0]),
    # Rows packed several to a vector on AVX-512 (2 rows of 7 tiles; 3 rows of 4), the last unit's
    # rows past the plane computed and dropped.
    _conv("f2_packed_rows", (1, 24, 14, 14), 32, [1, 1, 1, 1], relu=True),
    _conv("f4_packed_rows", (2, 16, 16, 16), 20, [1, 1, 1, 1]),
]


@pytest.mark.parametrize("target", ["native", "generic"])
def test_winograd_convs_match_onnxruntime(tmp_path, target: str) -> None:
    """Every case takes the Winograd path (checked) and matches onnxruntime, on 1 and 3 threads with
    the same bits; "generic" builds the 4-lane vector code."""
    model, feeds = build_model_and_feeds(CASES)
    result = compile_model(model, tmp_path, "t", target_cpu=target)
    source = "".join(p.read_text() for p in result.build_dir.glob("t_kernels_*.c"))
    kernels = set(re.findall(r"void (\w+)_wg_mk\d+\(", source))
    assert len(kernels) == len(CASES), f"only {sorted(kernels)} took the Winograd path"
    want = run_ort(model, feeds)
    one = aotc.load(result.prefix).run(feeds)
    three = aotc.load(result.prefix, threads=3).run(feeds)
    for c, g1, g3, wv in zip(CASES, one, three, want, strict=True):
        assert_close(g1, wv, c.rtol, c.atol, c.id)
        np.testing.assert_array_equal(g1, g3)


def test_winograd_sanitizers_run_clean(tmp_path) -> None:
    """The padded row copies, the junk slots between and after packed tile rows, and the scratch
    slices, under ASan and UBSan (1 and 2 threads)."""
    model, _ = build_model_and_feeds([CASES[1], CASES[2], CASES[6], CASES[7], CASES[8]])
    run_generated_test_under_sanitizers(model, tmp_path)
