"""TensorFlow frontend: frozen GraphDefs and SavedModels built by TensorFlow (tests/tf_fixtures.py,
cached) compile and match TensorFlow's outputs; errors name the node. TensorFlow is only needed to
make the fixtures (the ``test`` extra installs it); without it these tests fail with the install
command, they do not skip."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tf_fixtures import fixtures_dir
from tf_graphs import dt_float, graphdef, shape

import aotc
from aotc.bindings import CompiledModel
from aotc.compiler import compile_model
from aotc.config import parse_config
from aotc.errors import AotcError, UnsupportedOpsError
from aotc.frontends.tensorflow import import_graphdef, import_saved_model, is_tensorflow_model, summarize
from aotc.ir.graph import Graph


@pytest.fixture(scope="module")
def fx() -> Path:
    return fixtures_dir()


def compile_graph(graph: Graph, out_dir: Path) -> CompiledModel:
    return aotc.load(compile_model(graph, out_dir, graph.name).prefix)


Arrays = dict[str, np.ndarray]


def fixture(fx: Path, name: str, saved_model: bool = False) -> tuple[dict, Arrays, Arrays]:
    """The fixture's metadata, inputs and TensorFlow's outputs by name: the frozen graph's placeholder
    and fetch names, or the SavedModel signature's keys."""
    meta = json.loads((fx / f"{name}.json").read_text())
    data = np.load(fx / f"{name}.npz")
    ins = [data[f"in_{i}"] for i in range(len(meta["inputs"]))]
    if saved_model:
        return meta, dict(zip(meta["signature_inputs"], ins, strict=True)), \
            {k: data[f"sig_{k}"] for k in meta["signature_outputs"]}
    # A GraphDef does not keep the function's argument order: the inputs come in the graph's order.
    return meta, dict(zip([n.removesuffix(":0") for n in meta["inputs"]], ins, strict=True)), \
        {n.removesuffix(":0"): data[f"out_{i}"] for i, n in enumerate(meta["outputs"])}


def check_against_tf(fx: Path, name: str, tmp_path: Path, source: str = ".pb", shapes: dict | None = None,
                     tol: float = 1e-4, **options) -> tuple[Graph, CompiledModel, float]:
    """Compile fixture ``name`` from its frozen graph (``source`` .pb or .pbtxt) or its SavedModel
    (``source`` "saved_model") and compare with TensorFlow's outputs; the largest absolute error."""
    saved = source == "saved_model"
    meta, feeds, expected = fixture(fx, name, saved)
    if saved:
        graph = import_saved_model(fx / f"{name}_saved_model", shapes, name, **options)
    else:
        graph = import_graphdef(fx / f"{name}{source}", shapes, name, outputs=meta["outputs"])
    assert sorted(v.name for v in graph.inputs) == sorted(feeds)
    assert [v.name for v in graph.outputs] == list(expected)
    model = compile_graph(graph, tmp_path)
    got = model.run(feeds)
    worst = 0.0
    for (out_name, e), g in zip(expected.items(), got, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype, (out_name, g.shape, g.dtype, e.shape, e.dtype)
        err = float(np.max(np.abs(g.astype(np.float64) - e))) if e.size else 0.0
        worst = max(worst, err)
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=out_name)
    print(f"{name} from {source}: max abs error {worst:.3g}", file=sys.stderr)
    return graph, model, worst


@pytest.mark.parametrize("source", [".pb", "saved_model"])
def test_keras_mlp(fx, tmp_path, source):
    graph, _, _ = check_against_tf(fx, "mlp", tmp_path, source)
    assert [v.name for v in graph.outputs] == (["Identity"] if source == ".pb" else ["output_0"])


@pytest.mark.parametrize("source", [".pbtxt", "saved_model"])
def test_keras_cnn_with_the_batch_pinned(fx, tmp_path, source):
    # Conv2D (SAME, strided, dilated through SpaceToBatchND), BatchNormalization, Relu6, depthwise,
    # swish (its IdentityN), max/average pooling, global average pooling, Dense.
    check_against_tf(fx, "cnn", tmp_path, source, {"image": (2, 12, 12, 3)})


@pytest.mark.parametrize("source", [".pb", "saved_model"])
def test_reduce_sum_of_x_plus_y_times_z_is_one_kernel(fx, tmp_path, source):
    graph, model, _ = check_against_tf(fx, "reduce_sum", tmp_path, source)
    assert len(graph.kernels) == 1
    assert graph.kernels[0].ops == ["Mul", "Add", "ReduceSum"]
    assert model.num_kernels == 1


@pytest.mark.parametrize("source", [".pb", "saved_model"])
@pytest.mark.parametrize("name", ["nn_ops", "math_ops", "shape_ops"])
def test_ops_match_tensorflow(fx, tmp_path, name, source):
    check_against_tf(fx, name, tmp_path, source)


def test_binary_and_text_graphs_import_alike(fx):
    meta, _, _ = fixture(fx, "cnn")
    a, b = (import_graphdef(fx / f"cnn{s}", {"image": (1, 12, 12, 3)}, outputs=meta["outputs"])
            for s in (".pb", ".pbtxt"))
    assert a.to_text() == b.to_text()
    assert is_tensorflow_model(fx / "cnn.pb") and is_tensorflow_model(fx / "cnn.pbtxt")
    assert not is_tensorflow_model("model.onnx")
    summary = summarize(fx / "cnn.pbtxt")
    assert summary.inputs == [("image", "float32 [?,12,12,3]")] and summary.outputs == ["Identity"]
    assert summary.ops["Conv2D"] == (3, True) and summary.ops["SpaceToBatchND"] == (1, True)


def test_open_batch_needs_a_shape(fx):
    with pytest.raises(AotcError, match=r"input 'image' has dynamic shape \[\?,12,12,3\]; pin it with "
                                        r"--input-shape image=\.\.\."):
        import_graphdef(fx / "cnn.pb")
    with pytest.raises(AotcError, match=r"input 'image': shape \[2, 12, 12\] does not match the graph's "
                                        r"\['\?', 12, 12, 3\]"):
        import_graphdef(fx / "cnn.pb", {"image": (2, 12, 12)})


def test_config_feeds_and_fetches(fx, tmp_path):
    cfg = parse_config('feed { id { node_name: "x" } name: "a" }\n'
                       'feed { id { node_name: "y" } name: "b" }\n'
                       'feed { id { node_name: "z" } name: "c" }\n'
                       'fetch { id { node_name: "Identity" } name: "total" }\n')
    graph = import_graphdef(fx / "reduce_sum.pb", config=cfg, name="rs")
    assert [v.name for v in graph.inputs] == ["a", "b", "c"] and [v.name for v in graph.outputs] == ["total"]
    _, feeds, expected = fixture(fx, "reduce_sum")
    (got,) = compile_graph(graph, tmp_path).run(list(feeds.values()))
    (expected,) = expected.values()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)

    # Feeding an intermediate tensor cuts what is upstream of it: y and z are no longer inputs.
    cut = parse_config('feed { id { node_name: "x" } }\nfeed { id { node_name: "mul" } shape { dim { size: 1000 } } }\n'
                       'fetch { id { node_name: "Identity" } }\n')
    graph = import_graphdef(fx / "reduce_sum.pb", config=cut, name="cut")
    assert [(v.name, v.shape, v.dtype) for v in graph.inputs] == [("x", (1000,), np.float32),
                                                                  ("mul", (1000,), np.float32)]
    assert [n.op for n in graph.nodes] == ["Add", "ReduceSum"]

    unused = parse_config('feed { id { node_name: "x" } }\nfetch { id { node_name: "mul" } }\n')
    with pytest.raises(AotcError, match=r"feed 'x': no fetch needs it"):
        import_graphdef(fx / "reduce_sum.pb", config=unused)


# -- hand-made GraphDefs: errors and tensor encodings (no TensorFlow needed) --------------------------




def test_every_unsupported_op_is_listed_at_once():
    gd = graphdef(("x", "Placeholder", [], {"dtype": dt_float, "shape": shape(2)}),
                ("a", "Bogus", ["x"], {}), ("b", "Weird", ["a", "^x"], {}), ("c", "Bogus", ["b"], {}),
                ("unused", "AlsoBogus", ["x"], {}), ("y", "Relu", ["c"], {}))
    with pytest.raises(UnsupportedOpsError) as e:
        import_graphdef(gd, outputs=["y"])
    assert str(e.value) == "unsupported ops: Bogus (nodes: a, c); Weird (nodes: b)"
    assert summarize(gd).ops["Weird"] == (1, False)


def test_constants_splat_and_half_values():
    def tensor(dtype, dims, **values):
        def fill(a):
            a.tensor.dtype = dtype
            for d in dims:
                a.tensor.tensor_shape.dim.add(size=d)
            for k, v in values.items():
                getattr(a.tensor, k).extend(v)
        return fill

    half_bits = np.array([1.5, -2.0], np.float16).view(np.uint16).tolist()
    gd = graphdef(("s", "Const", [], {"value": tensor(1, [2, 3], float_val=[7.0]), "dtype": dt_float}),
                ("h", "Const", [], {"value": tensor(19, [2], half_val=half_bits)}),
                ("z", "Const", [], {"value": tensor(3, [4])}))
    g = import_graphdef(gd, outputs=["s", "h", "z"])
    s, h, z = (v.producer.inputs[0].const for v in g.outputs)
    np.testing.assert_array_equal(s, np.full((2, 3), 7.0, np.float32))
    np.testing.assert_array_equal(h, np.array([1.5, -2.0], np.float16))
    np.testing.assert_array_equal(z, np.zeros(4, np.int32))


def test_bad_files_are_one_line_errors(tmp_path):
    (tmp_path / "bad.pb").write_bytes(b"\xff\xff\xff garbage")
    (tmp_path / "bad.pbtxt").write_text("node { name: 'x' op: \n")
    for f in ("bad.pb", "bad.pbtxt"):
        with pytest.raises(AotcError, match=r"bad\.pb(txt)?: not a valid TensorFlow GraphDef") as e:
            import_graphdef(tmp_path / f)
        assert "\n" not in str(e.value)
    with pytest.raises(AotcError, match="model file not found"):
        import_graphdef(tmp_path / "missing.pb")


def test_missing_tensorboard_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto", None)
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto.graph_pb2", None)
    with pytest.raises(AotcError, match=r"needs the tensorboard package.*pip install 'aotc\[tf\]'"):
        import_graphdef("model.pb")


def test_attribute_errors_name_the_node():
    gd = graphdef(("x", "Placeholder", [], {"dtype": dt_float, "shape": shape(1, 4, 4, 2)}),
                ("p", "MaxPool", ["x"], {"ksize": lambda a: a.list.i.extend([1, 2, 2, 1]),
                                         "strides": lambda a: a.list.i.extend([1, 1, 1, 1]),
                                         "padding": lambda a: setattr(a, "s", b"FULL")}))
    with pytest.raises(AotcError, match=r"^MaxPool node 'p': padding 'FULL' is not supported"):
        import_graphdef(gd)


def test_command_line_compiles_and_inspects_a_graphdef(fx, tmp_path):
    import subprocess

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True)

    proc = cli("inspect", str(fx / "cnn.pb"))
    assert proc.returncode == 0 and "TensorFlow GraphDef" in proc.stdout and "Conv2D" in proc.stdout, proc.stderr
    proc = cli("compile", str(fx / "cnn.pb"), "-o", str(tmp_path), "-n", "cnn")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--input-shape" in proc.stderr, proc.stderr
    proc = cli("compile", str(fx / "cnn.pb"), "-o", str(tmp_path), "-n", "cnn", "--input-shape", "image=1,12,12,3",
               "--gen-test")
    assert proc.returncode == 0, proc.stderr
    test = subprocess.run([str(tmp_path / "cnn_test")], capture_output=True, text=True)
    assert test.returncode == 0 and "PASSED" in test.stdout, test.stdout + test.stderr


@pytest.mark.parametrize("source", [".pb", "saved_model"])
def test_more_ops_match_tensorflow(fx, tmp_path, source):
    # Conv2DBackpropInput (SAME, VALID, stride 1), Unpack, MirrorPad (REFLECT, SYMMETRIC), Einsum
    # (batched, transposed, contracted, with an ellipsis), TopKV2, OneHot (negative and too large
    # indices), Cumsum (exclusive, reverse), ResizeBilinear/ResizeNearestNeighbor (align_corners,
    # half_pixel_centers, legacy; up and down), gelu exact (Erfc) and approximate.
    check_against_tf(fx, "more_ops", tmp_path, source)


def structure(graph: Graph) -> list:
    """The graph without its names: each node's op, attributes, output types, and inputs as graph
    inputs, earlier nodes' outputs or constants (by a digest of their bytes)."""
    import hashlib

    where = {id(v): f"input {i}" for i, v in enumerate(graph.inputs)}
    rows = []
    for k, n in enumerate(graph.nodes):
        args = [None if v is None else (v.dtype.str, v.shape, hashlib.sha256(v.const.tobytes()).hexdigest())
                if v.is_const else where[id(v)] for v in n.inputs]
        where.update({id(o): f"node {k}:{j}" for j, o in enumerate(n.outputs)})
        rows.append((n.op, repr(sorted(n.attrs.items())), args, [(o.shape, o.dtype.str) for o in n.outputs]))
    return [rows, [where[id(v)] for v in graph.outputs]]


# Largest absolute errors seen (x86-64, AVX-512; outputs up to 1, 1.2, 3.3 and 21): bert 2.5e-7,
# mobilenet_v2 2.7e-5, resnet50 5.2e-4, efficientnet_b0 1.7e-4. TensorFlow's own two CPU paths
# (oneDNN and Eigen) differ by 1.8e-5, 1.8e-4 and 2.2e-4 on the last three: the deep networks get
# a tolerance of that order.
@pytest.mark.parametrize(("name", "tol"), [("bert", 1e-4), ("mobilenet_v2", 1e-4), ("resnet50", 1e-3),
                                           ("efficientnet_b0", 5e-4)])
def test_keras_models_match_tensorflow(fx, tmp_path, name, tol):
    # bert: Embedding, MultiHeadAttention (Einsum as MatMul), Dense with exact and tanh gelu,
    # LayerNormalization. The keras.applications models have random weights and BatchNorm statistics
    # taken from a random batch, so that 50 layers neither vanish nor explode.
    if name == "bert":
        check_against_tf(fx, name, tmp_path / "pb", tol=tol)
    else:  # the frozen graph imports to the same IR as the SavedModel, constants included: one compile
        meta, _, _ = fixture(fx, name)
        frozen = import_graphdef(fx / f"{name}.pb", name=name, outputs=meta["outputs"])
        assert structure(frozen) == structure(import_saved_model(fx / f"{name}_saved_model", name=name))
    check_against_tf(fx, name, tmp_path, "saved_model", tol=tol)
