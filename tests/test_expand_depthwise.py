"""An expanding 1x1 conv fused into the depthwise conv that reads it (aotc/ops/conv/expand_depthwise.py):
which pairs fuse, and fused pairs against onnxruntime -- strides, padding, partial channel blocks,
batches, epilogues on both convs, thread counts, a 4-lane target and the sanitizers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx_helpers import Case, Inp, assert_close, build_model_and_feeds, run_generated_test_under_sanitizers, run_ort

import aotc
from aotc.compiler import compile_model

pytest.importorskip("onnxruntime")

_rng = np.random.default_rng(5)


def _w(*shape: int) -> np.ndarray:
    return (_rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _block(cid: str, x: tuple[int, ...], m: int, stride: int = 1, pad: int = 1, k: int = 3,
           clip: bool = True, dw_bias: bool = True, ex_bias: bool = True, tail: str = "clip") -> Case:
    """Conv 1x1 C -> M (+ Clip 0..6), then depthwise Conv kxk (+ ``tail``: Clip, Relu or none)."""
    c = x[1]
    consts = {"we": _w(m, c, 1, 1), "wd": _w(m, 1, k, k), "lo": np.float32(0), "hi": np.float32(6)}
    if ex_bias:
        consts["be"] = _rng.standard_normal(m).astype(np.float32)
    if dw_bias:
        consts["bd"] = _rng.standard_normal(m).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "we"] + (["be"] if ex_bias else []), ["e"])]
    e = "e"
    if clip:
        nodes.append(helper.make_node("Clip", ["e", "lo", "hi"], ["ec"]))
        e = "ec"
    nodes.append(helper.make_node("Conv", [e, "wd"] + (["bd"] if dw_bias else []), ["d"], group=m,
                                  strides=[stride, stride], pads=[pad] * 4))
    last = "d"
    if tail == "clip":
        nodes.append(helper.make_node("Clip", ["d", "lo", "hi"], ["y"]))
        last = "y"
    elif tail == "relu":
        nodes.append(helper.make_node("Relu", ["d"], ["y"]))
        last = "y"
    return Case(cid, nodes, {"x": Inp(x)}, [last], consts, rtol=1e-5, atol=1e-5)


CASES = [
    _block("s1_56_like", (1, 24, 20, 20), 144),
    _block("s2_partial_block", (1, 16, 17, 15), 100, stride=2),
    _block("batch2_no_biases_relu", (2, 8, 12, 12), 40, dw_bias=False, ex_bias=False, tail="relu"),
    _block("no_clip_no_tail", (1, 32, 9, 9), 64, clip=False, tail="none"),
    _block("k5_pad2", (1, 12, 14, 14), 72, k=5, pad=2),
]


@pytest.mark.parametrize("target", ["native", "generic"])
def test_fused_blocks_match_onnxruntime(tmp_path, target: str) -> None:
    """Every case runs as one kernel and matches onnxruntime, on 1 and 3 threads with the same bits;
    "generic" builds the 4-lane vector code."""
    model, feeds = build_model_and_feeds(CASES)
    result = compile_model(model, tmp_path, "t", target_cpu=target)
    lib = aotc.load(result.prefix)
    assert lib.num_kernels == len(CASES), "a pair was not fused"
    want = run_ort(model, feeds)
    one = lib.run(feeds)
    three = aotc.load(result.prefix, threads=3).run(feeds)
    for c, g1, g3, wv in zip(CASES, one, three, want, strict=True):
        assert_close(g1, wv, c.rtol, c.atol, c.id)
        np.testing.assert_array_equal(g1, g3)


def test_pairs_that_do_not_fuse(tmp_path) -> None:
    """Not fused: a 1x1 conv that narrows the channels, one whose input is too large to stay in L2,
    an expanded tensor that is also a graph output, and a 1x1 conv with a second consumer."""
    narrow = _block("narrow", (1, 48, 10, 10), 32)
    big = _block("big", (1, 16, 112, 112), 96, stride=2)
    fetched = _block("fetched", (1, 8, 10, 10), 32)
    fetched.outputs = ["ec", "y"]
    shared = _block("shared", (1, 8, 10, 10), 32)
    shared.nodes.append(helper.make_node("Relu", ["ec"], ["r"]))
    shared.outputs = ["y", "r"]
    cases = [narrow, big, fetched, shared]
    model, feeds = build_model_and_feeds(cases)
    result = compile_model(model, tmp_path, "t")
    lib = aotc.load(result.prefix)
    assert lib.num_kernels == 9  # two conv kernels per case, plus the Relu
    want = run_ort(model, feeds)
    for got, wv in zip(lib.run(feeds), want, strict=True):
        assert_close(got, wv, 1e-5, 1e-5)


def test_fused_sanitizers_run_clean(tmp_path) -> None:
    """The per-task expanded planes and phase buffers, partial channel blocks, the overlapping last
    tile, under ASan and UBSan (1 and 2 threads)."""
    model, _ = build_model_and_feeds([CASES[1], CASES[2]])
    run_generated_test_under_sanitizers(model, tmp_path)
