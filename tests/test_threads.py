"""Running on several threads: the same bits as one thread, pools shared between models, and many
callers at once on one pool."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from models import make, mlp, mnist_softmax, ort_run, random_feeds, reduce_sum_xyz, vi
from onnx import TensorProto, helper

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
