"""Running on several threads: the same bits as one thread, pools shared between models, and many
callers at once on one pool."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from models import init, make, mlp, mnist_softmax, ort_run, random_feeds, reduce_sum_xyz, vi
from onnx import TensorProto, helper
from onnx_helpers import run_generated_test_under_sanitizers

import aotc


def _mixed_model() -> object:
    """Softmax, transpose view, concat, gather and a reduction over a non-trailing axis."""
    idx = helper.make_tensor("idx", TensorProto.INT64, [3], [5, 0, 63])
    nodes = [helper.make_node("Constant", [], ["idx"], value=idx),
             helper.make_node("Softmax", ["x"], ["s"], axis=1),
             helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Concat", ["t", "t"], ["c"], axis=2),
             helper.make_node("Gather", ["c", "idx"], ["g"], axis=0),
             helper.make_node("ReduceMean", ["g"], ["m"], axes=[1], keepdims=0)]
    return make(nodes, [vi("x", [48, 64, 96])], [vi("m", [3, 192]), vi("c", [64, 48, 192])])


CASES = {
    "mlp64": lambda: mlp(64),
    "mnist": lambda: mnist_softmax(16),
    "reduce": lambda: reduce_sum_xyz(1 << 20),
    "mixed": _mixed_model,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_threads_give_identical_bits(tmp_path, case):
    model = CASES[case]()
    one = aotc.compile(model, out_dir=tmp_path, name="m")
    feeds = random_feeds(one)
    want = one.run(feeds)
    for threads in (2, 3):
        got = aotc.load(tmp_path / "m", threads=threads).run(feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{case} on {threads} threads")


def test_pool_is_shared_and_callers_run_concurrently(tmp_path):
    a = aotc.compile(mlp(8), out_dir=tmp_path / "a", name="a", threads=2)
    b = aotc.compile(mnist_softmax(8), out_dir=tmp_path / "b", name="b")
    b_shared = aotc.load(tmp_path / "b" / "b", threads=a.pool)
    assert b_shared.pool is a.pool and b_shared.threads == 2
    assert a.workspace_bytes_used >= a.workspace_bytes
    fa, fb = random_feeds(a), random_feeds(b)
    want_a, want_b = a.run(fa)[0], b.run(fb)[0]
    failures: list[str] = []

    def worker(i: int) -> None:
        m, feeds, want = (a, fa, want_a) if i % 2 else (b_shared, fb, want_b)
        try:
            for _ in range(30):
                if not np.array_equal(m.run(feeds)[0], want):
                    failures.append(f"caller {i}: wrong result")
                    return
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            failures.append(f"caller {i}: {e}")

    callers = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert not failures


def test_pool_worker_spinning_yielding_or_asleep(tmp_path):
    # Between runs an idle worker spins (about 0.5 ms), then yields its CPU (until 5 ms), then sleeps on a
    # condition variable: a run must find it, and get the same bits, in each of those states.
    model = mlp(64)
    m = aotc.compile(model, out_dir=tmp_path, name="m", threads=2)
    feeds = random_feeds(m)
    want = m.run(feeds)[0]
    np.testing.assert_allclose(want, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-5)
    for pause_s in (0.0, 0.0002, 0.002, 0.02, 0.0, 0.02):
        time.sleep(pause_s)
        np.testing.assert_array_equal(m.run(feeds)[0], want, err_msg=f"after {pause_s * 1e3} ms idle")


def test_bad_thread_counts(tmp_path):
    aotc.compile(mnist_softmax(), out_dir=tmp_path, name="m")
    with pytest.raises(ValueError, match="threads"):
        aotc.load(tmp_path / "m", threads=0)


def test_without_thread_pool(tmp_path):
    from aotc.compiler import compile_model

    res = compile_model(mnist_softmax(), tmp_path, "m", thread_pool=False)
    assert "m_pool.c" not in res.library.files
    assert "m_pool_create(size_t" not in (tmp_path / "m.h").read_text()
    with pytest.raises(aotc.AotcError, match="without the thread pool"):
        aotc.load(tmp_path / "m", threads=2)
    m = aotc.load(tmp_path / "m")
    feeds = random_feeds(m)
    assert m.run(feeds)[0].shape == (1, 10)


def _reduce_twice(op: str, dtype: int, shape: list[int], axes: list[int] | None) -> object:
    """``op`` of x + x over ``axes`` (all when None), the Add fused into the reduction."""
    out_shape = [] if axes is None else [d for i, d in enumerate(shape) if i not in axes]
    inputs = ["s"] if axes is None else ["s", "axes"]
    inits = [] if axes is None else [init("axes", np.array(axes, np.int64))]
    return make([helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node(op, inputs, ["r"], keepdims=0)],
                [vi("x", shape, dtype)], [vi("r", out_shape, dtype)], inits, opset=18)


# Reductions with fewer outputs than threads are split into chunks whose number depends on the sizes
# only (aotc/codegen/loops.py), so the bits do not depend on the thread count.
SPLIT = {
    "sum_xyz_float32": lambda: reduce_sum_xyz(3_000_001),
    "max_nan_float32": lambda: _reduce_twice("ReduceMax", TensorProto.FLOAT, [2_000_003], None),
    "mean_rows_float64": lambda: _reduce_twice("ReduceMean", TensorProto.DOUBLE, [3, 1_000_003], [1]),
    "sum_cols_int32": lambda: _reduce_twice("ReduceSum", TensorProto.INT32, [1_000_003, 2], [0]),
}


@pytest.mark.parametrize("case", sorted(SPLIT))
def test_split_reductions_identical_bits_on_any_thread_count(tmp_path, case):
    model = SPLIT[case]()
    one = aotc.compile(model, out_dir=tmp_path, name="m")
    assert "_finish(" in (tmp_path / ".aotc" / "m" / "m_kernels_0.c").read_text(), "the reduction was not split"
    rng = np.random.default_rng(1)
    feeds = {}
    for t in one.inputs:
        x = rng.standard_normal(t.shape) if t.dtype != np.int32 else rng.integers(-1000, 1000, t.shape)
        feeds[t.name] = np.asarray(x, t.dtype)
    if case.startswith("max_nan"):
        feeds["x"][1_500_000] = np.nan  # in a late chunk: NaN must survive the combine
    want = one.run(feeds)[0]
    for threads in (2, 3):
        got = aotc.load(tmp_path / "m", threads=threads).run(feeds)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"{case} on {threads} threads")
    if case.startswith("sum_xyz"):
        x, y, z = (feeds[k].astype(np.float64) for k in "xyz")
        ref = np.sum(x + y * z)
        assert abs(want - ref) <= 1e-6 * np.sum(np.abs(x + y * z))
        np.testing.assert_allclose(want, ort_run(model, feeds)[0], rtol=1e-4)
    elif case.startswith("max_nan"):
        assert np.isnan(want)
    elif case.startswith("mean_rows"):
        np.testing.assert_allclose(want, np.mean(2 * feeds["x"], axis=1), rtol=1e-12)
    else:
        np.testing.assert_array_equal(want, np.sum(2 * feeds["x"], axis=0, dtype=np.int32))


def test_split_reductions_run_clean_under_sanitizers(tmp_path):
    # The generated test program runs once on one thread, then on two: the partials in scratch.
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("ReduceSum", ["s"], ["r"], keepdims=0),
             helper.make_node("ReduceMax", ["y", "ax"], ["m"], keepdims=1)]
    model = make(nodes, [vi("x", [300_001], TensorProto.INT32), vi("y", [2, 200_003])],
                 [vi("r", [], TensorProto.INT32), vi("m", [2, 1])], [init("ax", np.array([1], np.int64))], opset=18)
    run_generated_test_under_sanitizers(model, tmp_path)
