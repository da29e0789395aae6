"""End-to-end compiler tests: the graphs of the XLA documents with their kernel counts, the
feed/fetch config, simplification, determinism and incremental builds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from models import dense_relu, init, make, mlp, mnist_softmax, ort_run, random_feeds, reduce_sum_xyz, vi
from onnx import helper

import aotc
from aotc.compiler import compile_model
from aotc.config import parse_config


def test_reduce_sum_of_x_plus_y_times_z_is_one_kernel(tmp_path):
    res = compile_model(reduce_sum_xyz(100_003), tmp_path, "rs")
    assert res.num_kernels == 1
    k = res.graph.kernels[0]
    assert k.ops == ["Mul", "Add", "ReduceSum"]
    assert res.graph.memory.workspace_bytes == 0  # no intermediate written
    assert sorted(v.name for v in k.inputs) == ["x", "y", "z"]  # each read once, nothing else
    m = aotc.load(tmp_path / "rs")
    feeds = random_feeds(m)
    (r,) = m.run(feeds)
    expect = np.sum(feeds["x"].astype(np.float64) + feeds["y"].astype(np.float64) * feeds["z"])
    assert r.shape == () and abs(float(r) - expect) < 1e-3 * np.sqrt(100_003)


def test_dense_relu_is_one_gemm_kernel_with_epilogue(tmp_path):
    model = dense_relu(m=7, k=65, n=33)
    res = compile_model(model, tmp_path, "dense")
    assert res.num_kernels == 1
    assert res.graph.kernels[0].kind == "gemm"
    assert res.graph.kernels[0].ops == ["MatMul", "Add", "Relu"]
    m = aotc.load(tmp_path / "dense")
    feeds = random_feeds(m)
    np.testing.assert_allclose(m.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 5])
def test_mnist_softmax(tmp_path, batch):
    model = mnist_softmax(batch)
    m = aotc.compile(model, out_dir=tmp_path, name="softmax")
    assert m.num_kernels == 2  # GEMM + bias, then the softmax
    feeds = random_feeds(m)
    (y,) = m.run(feeds)
    np.testing.assert_allclose(y, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 64])
def test_mlp_784_512_512_10(tmp_path, batch):
    model = mlp(batch)
    m = aotc.compile(model, out_dir=tmp_path, name="mlp")
    assert m.num_kernels == 3  # one GEMM kernel per layer, bias and relu fused
    assert m.metadata["workspace_bytes"] <= m.metadata["intermediate_bytes"]
    if batch == 64:
        # Layer 2 reads one 512-wide activation while it writes the other, so both are live; the GEMMs
        # read their A in place (no scratch), so that is all the workspace holds.
        assert m.metadata["workspace_bytes"] <= 2 * 64 * 512 * 4
    feeds = random_feeds(m)
    np.testing.assert_allclose(m.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_fetch_intermediate_prunes_and_feed_intermediate_cuts(tmp_path):
    model = mlp(2, sizes=(16, 8, 8, 4))
    cfg = parse_config('fetch { id { node_name: "h0" } name: "hidden" }')
    res = compile_model(model, tmp_path, "first", config=cfg)
    assert res.num_kernels == 1
    m = aotc.load(tmp_path / "first")
    assert [t.name for t in m.outputs] == ["hidden"]
    feeds = random_feeds(m)
    w0 = onnx.numpy_helper.to_array(model.graph.initializer[0])
    b0 = onnx.numpy_helper.to_array(model.graph.initializer[1])
    np.testing.assert_allclose(m.run(feeds)[0], np.maximum(feeds["x"] @ w0 + b0, 0), rtol=1e-5, atol=1e-5)

    cfg = parse_config('feed { id { node_name: "h1" } shape { dim { size: 2 } dim { size: 8 } } name: "h" }\n'
                       'fetch { id { node_name: "logits" } }')
    res = compile_model(model, tmp_path, "last", config=cfg)
    assert res.num_kernels == 1 and [v.name for v in res.graph.inputs] == ["h"]
    m = aotc.load(tmp_path / "last")
    h = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    w2 = onnx.numpy_helper.to_array(model.graph.initializer[4])
    b2 = onnx.numpy_helper.to_array(model.graph.initializer[5])
    np.testing.assert_allclose(m.run({"h": h})[0], h @ w2 + b2, rtol=1e-5, atol=1e-5)


def test_multiple_feeds_and_fetches_follow_config_order(tmp_path):
    model = make([helper.make_node("Sub", ["a", "b"], ["d"]), helper.make_node("Mul", ["a", "b"], ["p"])],
                 [vi("a", [3]), vi("b", [3])], [vi("d", [3]), vi("p", [3])])
    cfg = parse_config('feed { id { node_name: "b" } } feed { id { node_name: "a" } }\n'
                       'fetch { id { node_name: "p" } } fetch { id { node_name: "d" } name: "diff" }')
    compile_model(model, tmp_path, "ord", config=cfg)
    m = aotc.load(tmp_path / "ord")
    assert [t.name for t in m.inputs] == ["b", "a"] and [t.name for t in m.outputs] == ["p", "diff"]
    a, b = np.array([1, 2, 3], np.float32), np.array([4, 5, 6], np.float32)
    p, d = m.run([b, a])
    np.testing.assert_array_equal(p, a * b)
    np.testing.assert_array_equal(d, a - b)


def test_batchnorm_after_gemm_folds_into_weights(tmp_path):
    rng = np.random.default_rng(3)
    c = 6
    model = make([helper.make_node("Gemm", ["x", "W", "b"], ["g"], transB=1, alpha=0.5),
                  helper.make_node("BatchNormalization", ["g", "s", "t", "mu", "var"], ["bn"], epsilon=1e-3),
                  helper.make_node("Relu", ["bn"], ["y"])],
                 [vi("x", [4, 10])], [vi("y", [4, c])],
                 [init("W", rng.standard_normal((c, 10)).astype(np.float32)),
                  init("b", rng.standard_normal(c).astype(np.float32)),
                  init("s", rng.uniform(0.5, 2, c).astype(np.float32)),
                  init("t", rng.standard_normal(c).astype(np.float32)),
                  init("mu", rng.standard_normal(c).astype(np.float32)),
                  init("var", rng.uniform(0.5, 2, c).astype(np.float32))])
    res = compile_model(model, tmp_path, "bn")
    assert res.num_kernels == 1
    assert [n.op for n in res.graph.nodes] == ["MatMul", "Add", "Relu"]  # no BatchNormalization left
    m = aotc.load(tmp_path / "bn")
    feeds = random_feeds(m)
    np.testing.assert_allclose(m.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_identity_dropout_and_reshape_chains_disappear(tmp_path):
    model = make([helper.make_node("Identity", ["x"], ["i"]),
                  helper.make_node("Dropout", ["i"], ["d"]),
                  helper.make_node("Reshape", ["d", "s1"], ["r1"]),
                  helper.make_node("Flatten", ["r1"], ["r2"], axis=1),
                  helper.make_node("Reshape", ["r2", "s2"], ["r3"]),
                  helper.make_node("Exp", ["r3"], ["y"])],
                 [vi("x", [2, 3, 4])], [vi("y", [4, 6])],
                 [init("s1", np.array([6, 4], np.int64)), init("s2", np.array([4, -1], np.int64))])
    res = compile_model(model, tmp_path, "simp")
    assert [n.op for n in res.graph.nodes] == ["Reshape", "Exp"]
    assert res.num_kernels == 1
    m = aotc.load(tmp_path / "simp")
    feeds = random_feeds(m)
    np.testing.assert_allclose(m.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-6)


def test_shape_subgraph_folds_and_dynamic_dims_are_pinned(tmp_path):
    model = make([helper.make_node("Shape", ["x"], ["sh"]),
                  helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
                  helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
                  helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
                  helper.make_node("Reshape", ["x", "target"], ["flat"]),
                  helper.make_node("Tanh", ["flat"], ["y"])],
                 [vi("x", ["batch", 3, 5])], [vi("y", ["batch", 15])],
                 [init("zero", np.array(0, np.int64)), init("ax", np.array([0], np.int64)),
                  init("minus1", np.array([-1], np.int64))])
    with pytest.raises(aotc.AotcError, match="dynamic shape.*--input-shape"):
        compile_model(model, tmp_path, "dyn")
    res = compile_model(model, tmp_path, "dyn", input_shapes={"x": (4, 3, 5)})
    assert res.num_kernels == 1
    m = aotc.load(tmp_path / "dyn")
    assert m.outputs[0].shape == (4, 15)
    feeds = random_feeds(m)
    np.testing.assert_allclose(m.run(feeds)[0], np.tanh(feeds["x"].reshape(4, 15)), rtol=1e-5, atol=1e-6)


def test_external_data_and_local_functions(tmp_path):
    from onnx import external_data_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    fn = helper.make_function("local", "AddRelu", ["a", "b"], ["c"],
                              [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["c"])],
                              [helper.make_opsetid("", 17)])
    model = make([helper.make_node("MatMul", ["x", "W"], ["xw"]),
                  helper.make_node("AddRelu", ["xw", "x"], ["y"], domain="local")],
                 [vi("x", [2, 64])], [vi("y", [2, 64])], [init("W", w)], functions=[fn])
    model.opset_import.append(helper.make_opsetid("local", 1))
    external_data_helper.convert_model_to_external_data(model, location="weights.bin", size_threshold=0)
    onnx.save(model, tmp_path / "ext.onnx")
    assert (tmp_path / "weights.bin").exists()
    m = aotc.compile(tmp_path / "ext.onnx", out_dir=tmp_path / "out", name="ext")
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})[0], np.maximum(x @ w + x, 0), rtol=1e-5, atol=1e-5)


def test_generated_files_are_deterministic(tmp_path):
    for d in ("a", "b"):
        compile_model(mlp(2, sizes=(32, 16, 8)), tmp_path / d, "det")
    for d in (".", ".aotc/det"):
        names = sorted(p.name for p in (tmp_path / "a" / d).iterdir() if p.is_file())
        generated = [n for n in names if n.endswith((".c", ".h", ".S", ".bin", ".ninja", ".json", ".cdef"))]
        assert len(generated) >= 3
        for n in generated:
            assert (tmp_path / "a" / d / n).read_bytes() == (tmp_path / "b" / d / n).read_bytes(), n


def test_recompiling_an_unchanged_model_does_not_rebuild(tmp_path):
    compile_model(dense_relu(), tmp_path, "inc")
    lib = tmp_path / "libinc.a"
    objs = sorted((tmp_path / ".aotc" / "inc" / "obj").glob("*.o"))
    before = {p: p.stat().st_mtime_ns for p in [lib, *objs]}
    compile_model(dense_relu(), tmp_path, "inc")
    assert {p: p.stat().st_mtime_ns for p in [lib, *objs]} == before


def test_reloading_a_rebuilt_library_in_one_process(tmp_path):
    a = aotc.compile(mlp(1, sizes=(8, 4)), out_dir=tmp_path, name="same")
    b = aotc.compile(mlp(3, sizes=(8, 4)), out_dir=tmp_path, name="same")
    assert a.inputs[0].shape == (1, 8) and b.inputs[0].shape == (3, 8)
    x = np.ones((3, 8), np.float32)
    np.testing.assert_allclose(b.run({"x": x})[0][2], a.run({"x": x[:1]})[0][0], rtol=1e-6)
