"""aotc.training.autodiff.gradients on whole models: an MLP and a small CNN (Conv, training-mode
BatchNorm, Relu, MaxPool, Gemm, softmax cross-entropy) against torch.autograd; its errors; the backward
kernels under the sanitizers."""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import IR_VERSION, SANITIZE, run_generated_test_under_sanitizers
from test_generated_c_warnings import COMPILERS, WARNINGS

import aotc
from aotc.build import BASE_CFLAGS
from aotc.codegen.library import generate
from aotc.frontends.onnx import import_onnx
from aotc.passes.pipeline import run_passes
from aotc.target import resolve
from aotc.training.autodiff import NoGradientError, gradients


def _vi(name, shape, dt=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def _model(nodes, inputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, [_vi("loss", [])], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR_VERSION
    return m


def _with_gradients(model, wrt, name):
    graph = import_onnx(model, name=name)
    values = {v.name: v for v in graph.values()}
    grads = gradients(graph, values["loss"], [values[n] for n in wrt])
    graph.outputs = [values["loss"], *(grads[n] for n in wrt)]
    return graph


def _compare(got, loss, params, rtol=1e-4):
    np.testing.assert_allclose(got[0], loss.item(), rtol=rtol)
    for (name, p), g in zip(params.items(), got[1:], strict=True):
        want = p.grad.numpy()
        np.testing.assert_allclose(g, want, rtol=rtol, atol=rtol * max(np.abs(want).max(), 1e-3), err_msg=name)


def _params(rng, shapes, scale=0.3):
    return {n: (rng.standard_normal(s) * scale).astype(np.float32) for n, s in shapes.items()}


def _torch(arrays):
    return {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in arrays.items()}


def test_mlp_gradients_match_torch(tmp_path) -> None:
    rng = np.random.default_rng(0)
    shapes = {"w1": (32, 20), "b1": (32,), "w2": (32, 16), "b2": (16,), "w3": (10, 16), "b3": (10,)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
             helper.make_node("Relu", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["h2"]),
             helper.make_node("Tanh", ["h2"], ["a2"]),
             helper.make_node("Gemm", ["a2", "w3", "b3"], ["z"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["z", "t"], ["loss"])]
    inputs = [_vi("x", [8, 20]), *(_vi(n, list(s)) for n, s in shapes.items()), _vi("t", [8], TensorProto.INT64)]
    graph = _with_gradients(_model(nodes, inputs), list(shapes), "mlp")
    params = _params(rng, shapes)
    x = rng.standard_normal((8, 20)).astype(np.float32)
    t = rng.integers(0, 10, 8)
    got = aotc.compile(graph, tmp_path, name="mlp", threads=2).run({"x": x, "t": t, **params})
    p = _torch(params)
    a1 = torch.relu(torch.tensor(x, dtype=torch.float64) @ p["w1"].T + p["b1"])
    z = torch.tanh(a1 @ p["w2"] + p["b2"]) @ p["w3"].T + p["b3"]
    loss = F.cross_entropy(z, torch.tensor(t))
    loss.backward()
    _compare(got, loss, p)


def _cnn():
    shapes = {"w1": (4, 1, 3, 3), "b1": (4,), "s1": (4,), "o1": (4,), "w2": (6, 2, 3, 3),
              "w3": (10, 6 * 2 * 2), "b3": (10,)}
    inits = [numpy_helper.from_array(np.zeros(4, np.float32), "rm"),
             numpy_helper.from_array(np.ones(4, np.float32), "rv"),
             numpy_helper.from_array(np.array([0, -1], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s1", "o1", "rm", "rv"], ["n1"], training_mode=1),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Reshape", ["r2", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["z"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["z", "t"], ["loss"])]
    inputs = [_vi("x", [5, 1, 8, 8]), *(_vi(n, list(s)) for n, s in shapes.items()), _vi("t", [5], TensorProto.INT64)]
    return _model(nodes, inputs, inits, opset=15), shapes


def _cnn_logits(p):
    h = F.batch_norm(F.conv2d(p["x"], p["w1"], p["b1"], padding=1), None, None, p["s1"], p["o1"], training=True)
    h = F.conv2d(F.max_pool2d(torch.relu(h), 2), p["w2"], None, 2, 1, groups=2)
    return torch.relu(h).reshape(len(p["x"]), -1) @ p["w3"].T + p["b3"]


def _cnn_loss(p, t):
    return F.cross_entropy(_cnn_logits(p), torch.tensor(t))


def _cnn_feeds(seed):
    rng = np.random.default_rng(seed)
    params = _params(rng, _cnn()[1])
    params["s1"] += 1
    return {**params, "x": rng.standard_normal((5, 1, 8, 8)).astype(np.float32)}, rng.integers(0, 10, 5)


def test_cnn_gradients_match_torch(tmp_path) -> None:
    model, shapes = _cnn()
    arrays, t = _cnn_feeds(1)
    graph = _with_gradients(model, list(arrays), "cnn")
    # The grouped conv with trained weights runs as im2col + GEMM; the one-channel conv keeps its kernel.
    assert [n.op for n in graph.nodes].count("Conv") == 1 and any(n.op == "aotc.Im2Col" for n in graph.nodes)
    got = aotc.compile(graph, tmp_path, name="cnn", threads=2).run({**arrays, "t": t})
    p = _torch(arrays)
    loss = _cnn_loss(p, t)
    loss.backward()
    _compare(got, loss, p)


def test_every_op_without_a_rule_is_listed() -> None:
    nodes = [helper.make_node("CumProd", ["x", "ax"], ["a"]), helper.make_node("ReduceProd", ["a"], ["b"]),
             helper.make_node("CumProd", ["b", "ax"], ["c"]), helper.make_node("Det", ["c"], ["d"]),
             helper.make_node("Relu", ["d"], ["e"]), helper.make_node("ReduceSum", ["e"], ["loss"], keepdims=0)]
    axis = [numpy_helper.from_array(np.array(0, np.int64), "ax")]
    graph = import_onnx(_model(nodes, [_vi("x", [1, 2, 3])], axis, opset=26))
    values = {v.name: v for v in graph.values()}
    listing = "no gradient for: CumProd \\(nodes: .*, .*\\); Det .*; ReduceProd .*"
    with pytest.raises(NoGradientError, match=listing) as e:
        gradients(graph, values["loss"], [values["x"]])
    assert sorted(e.value.missing) == ["CumProd", "Det", "ReduceProd"]
    assert len(e.value.missing["CumProd"]) == 2


def test_refusals_and_values_the_loss_does_not_read() -> None:
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array(np.ones(3, np.float32), "w")]
    graph = import_onnx(_model(nodes, [_vi("x", [3]), _vi("u", [2, 2])], inits))
    values = {v.name: v for v in graph.values()}
    with pytest.raises(aotc.AotcError, match="'w': it is a constant"):
        gradients(graph, values["loss"], [values["w"]])
    with pytest.raises(aotc.AotcError, match="must be a float scalar"):
        gradients(graph, values["y"], [values["x"]])
    grads = gradients(graph, values["loss"], [values["x"], values["u"]])
    assert grads["u"].shape == (2, 2) and grads["u"].dtype == np.float32


GATHERED = np.random.default_rng(9).integers(-24, 24, (10, 5))
CLASS_WEIGHTS = np.linspace(0.5, 1.5, 10, dtype=np.float32)


def _every_backward_kernel():
    """The CNN plus Gather, GatherElements, TopK, a strided Slice, two AveragePools, a depthwise Conv and
    a weighted NLL loss on the loss: every internal kernel."""
    model, _ = _cnn()
    model.graph.node[-1].output[0] = "loss0"
    model.graph.node.extend([
        helper.make_node("Gather", ["w3", "idx"], ["g"], axis=1),
        helper.make_node("Slice", ["g", "st", "en", "ax", "sp"], ["s"]),
        helper.make_node("AveragePool", ["x"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceSum", ["s"], ["ls"], keepdims=0),
        helper.make_node("AveragePool", ["x"], ["ap2"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Mul", ["ap", "ap"], ["aq"]),
        helper.make_node("ReduceSum", ["aq"], ["la"], keepdims=0),
        helper.make_node("ReduceSum", ["ap2"], ["la2"], keepdims=0),
        helper.make_node("GatherElements", ["w3", "ge"], ["e"], axis=1),
        helper.make_node("TopK", ["w3", "k"], ["tv", "ti"]),
        helper.make_node("Mul", ["tv", "tv"], ["tq"]),
        helper.make_node("ReduceSum", ["e"], ["le"], keepdims=0),
        helper.make_node("ReduceSum", ["tq"], ["lt"], keepdims=0),
        helper.make_node("Conv", ["c1", "wd"], ["dwc"], group=4, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["dwc", "dwc"], ["dq"]),
        helper.make_node("ReduceSum", ["dq"], ["ld"], keepdims=0),
        helper.make_node("LogSoftmax", ["z"], ["lsm"], axis=1),
        helper.make_node("NegativeLogLikelihoodLoss", ["lsm", "t", "cw"], ["lnll"], ignore_index=3),
        helper.make_node("Sum", ["loss0", "ls", "la", "la2", "le", "lt", "ld", "lnll"], ["loss"])])
    model.graph.initializer.append(numpy_helper.from_array(CLASS_WEIGHTS, "cw"))
    model.graph.input.append(_vi("wd", [8, 1, 3, 3]))
    model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                                   (("idx", [3, 0, 3]), ("st", [-1]), ("en", [-100]), ("ax", [0]), ("sp", [-3]),
                                    ("ge", GATHERED), ("k", [2])))
    arrays, t = _cnn_feeds(2)
    arrays["wd"] = np.random.default_rng(8).standard_normal((8, 1, 3, 3)).astype(np.float32)
    return _with_gradients(model, list(arrays), "m"), arrays, t


@pytest.mark.slow
def test_backward_kernels_are_clean_under_sanitizers(tmp_path) -> None:
    """The internal kernels (im2col and col2im, the pool, batch-norm, gather, strided-slice and loss
    gradients) on one and two threads, checked by the generated test program against torch."""
    graph, arrays, t = _every_backward_kernel()
    p = _torch(arrays)
    loss = (_cnn_loss(p, t) + p["w3"][:, [3, 0, 3]][[9, 6, 3, 0]].sum()
            + (F.avg_pool2d(p["x"], 3, 2, 1, count_include_pad=False) ** 2).sum() + F.avg_pool2d(p["x"], 2).sum()
            + torch.gather(p["w3"], 1, torch.tensor(GATHERED % 24)).sum() + (torch.topk(p["w3"], 2).values ** 2).sum()
            + (F.conv2d(F.conv2d(p["x"], p["w1"], p["b1"], padding=1), p["wd"], None, 2, 1, groups=4) ** 2).sum()
            + F.nll_loss(_cnn_logits(p).log_softmax(1), torch.tensor(t), torch.tensor(CLASS_WEIGHTS).double(),
                         ignore_index=3))
    loss.backward()
    expected = [np.array(loss.item(), np.float32), *(p[n].grad.numpy().astype(np.float32) for n in arrays)]
    feeds = {**arrays, "t": t}
    run_generated_test_under_sanitizers(graph, tmp_path, SANITIZE, test_data=([feeds[v.name] for v in graph.inputs],
                                                                              expected))


@pytest.mark.skipif(not COMPILERS, reason="no C compiler")
def test_backward_kernels_are_warning_free(tmp_path) -> None:
    graph, _, _ = _every_backward_kernel()
    tgt = resolve(None, None, None, None, None)
    run_passes(graph, target=tgt)
    lib = generate(graph, "m", [v.name for v in graph.inputs], [v.name for v in graph.outputs], "m", target=tgt)
    for name, data in lib.files.items():
        (tmp_path / name).write_bytes(data)
    flags = [*BASE_CFLAGS, *tgt.flags, *WARNINGS]
    for cc in COMPILERS:
        for src in sorted(n for n in lib.files if n.endswith(".c")):
            proc = subprocess.run([cc, *flags, "-c", src, "-o", "/dev/null"], capture_output=True, text=True,
                                  cwd=tmp_path)
            assert proc.returncode == 0, f"{cc} {src}:\n{proc.stderr[:3000]}"


def test_float64_conv_keeps_its_node_and_its_rule(tmp_path) -> None:
    """Only float32 convs become im2col + GEMM; the Conv rule differentiates the others."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 1], pads=[1, 0, 1, 1], group=2),
             helper.make_node("Mul", ["y", "y"], ["y2"]), helper.make_node("ReduceSum", ["y2"], ["loss"], keepdims=0)]
    d = TensorProto.DOUBLE
    g = helper.make_graph(nodes, "m", [_vi("x", [2, 4, 5, 5], d), _vi("w", [4, 2, 3, 2], d)], [_vi("loss", [], d)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    graph = _with_gradients(model, ["x", "w"], "c64")
    assert [n.op for n in graph.nodes].count("Conv") == 1
    arrays = {"x": rng.standard_normal((2, 4, 5, 5)), "w": rng.standard_normal((4, 2, 3, 2))}
    got = aotc.compile(graph, tmp_path, name="c64").run(arrays)
    p = _torch(arrays)
    y = F.conv2d(F.pad(p["x"], (0, 1, 1, 1)), p["w"], stride=(2, 1), groups=2)
    loss = (y * y).sum()
    loss.backward()
    _compare(got, loss, p, rtol=1e-9)


def _transformer():
    """A one-block causal language model: embeddings (Gather), LayerNorm, two-head attention with a
    causal mask (Where), GELU MLP, residuals, a vocabulary projection and cross-entropy."""
    b, s, d, h, v = 2, 4, 8, 2, 11
    shapes = {"emb": (v, d), "pos": (s, d), "g1": (d,), "o1": (d,), "wqkv": (d, 3 * d), "wo": (d, d),
              "g2": (d,), "w1": (d, 16), "c1": (16,), "w2": (16, d), "head": (d, v)}
    inits = [numpy_helper.from_array(np.array(a, np.int64), n) for n, a in
             (("heads", [b, s, 3, h, d // h]), ("merged", [b, s, d]))]
    inits += [numpy_helper.from_array(np.tril(np.ones((s, s), bool)), "causal"),
              numpy_helper.from_array(np.array(-1e9, np.float32), "minus_inf"),
              numpy_helper.from_array(np.array((d // h) ** -0.5, np.float32), "scale")]
    n = helper.make_node
    nodes = [n("Gather", ["emb", "ids"], ["e"]), n("Add", ["e", "pos"], ["x0"]),
             n("LayerNormalization", ["x0", "g1", "o1"], ["l1"]),
             n("MatMul", ["l1", "wqkv"], ["qkv"]), n("Reshape", ["qkv", "heads"], ["qkv5"]),
             n("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4]),
             n("Split", ["qkvt"], ["q1", "k1", "v1"], axis=0, num_outputs=3),
             *(n("Squeeze", [f"{t}1", "zero"], [t]) for t in "qkv"),
             n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kt"], ["sc0"]),
             n("Mul", ["sc0", "scale"], ["sc1"]), n("Where", ["causal", "sc1", "minus_inf"], ["sc"]),
             n("Softmax", ["sc"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["att"]),
             n("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3]), n("Reshape", ["att_t", "merged"], ["att_m"]),
             n("MatMul", ["att_m", "wo"], ["proj"]), n("Add", ["x0", "proj"], ["x1"]),
             n("LayerNormalization", ["x1", "g2"], ["l2"]), n("MatMul", ["l2", "w1"], ["f0"]),
             n("Add", ["f0", "c1"], ["f1"]), n("Gelu", ["f1"], ["f2"]), n("MatMul", ["f2", "w2"], ["f3"]),
             n("Add", ["x1", "f3"], ["x2"]), n("MatMul", ["x2", "head"], ["logits"]),
             n("Transpose", ["logits"], ["logits_t"], perm=[0, 2, 1]),
             n("SoftmaxCrossEntropyLoss", ["logits_t", "tgt"], ["loss"])]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    inputs = [*(_vi(k, list(sh)) for k, sh in shapes.items()), _vi("ids", [b, s], TensorProto.INT64),
              _vi("tgt", [b, s], TensorProto.INT64)]
    return _model(nodes, inputs, inits, opset=21), shapes


def _transformer_loss(p, ids, tgt):
    b, s = ids.shape
    d = p["emb"].shape[1]
    x0 = p["emb"][torch.tensor(ids)] + p["pos"]
    qkv = (F.layer_norm(x0, (d,), p["g1"], p["o1"]) @ p["wqkv"]).reshape(b, s, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    sc = (qkv[0] @ qkv[1].transpose(-1, -2)) * (d // 2) ** -0.5
    sc = torch.where(torch.tril(torch.ones(s, s, dtype=torch.bool)), sc, torch.tensor(-1e9, dtype=sc.dtype))
    att = (sc.softmax(-1) @ qkv[2]).transpose(1, 2).reshape(b, s, d)
    x1 = x0 + att @ p["wo"]
    x2 = x1 + F.gelu(F.layer_norm(x1, (d,), p["g2"]) @ p["w1"] + p["c1"]) @ p["w2"]
    return F.cross_entropy((x2 @ p["head"]).transpose(1, 2), torch.tensor(tgt))


def test_transformer_block_gradients_match_torch(tmp_path) -> None:
    rng = np.random.default_rng(4)
    model, shapes = _transformer()
    params = _params(rng, shapes, 0.5)
    params["g1"] += 1
    params["g2"] += 1
    ids, tgt = rng.integers(0, 11, (2, 4)), rng.integers(0, 11, (2, 4))
    graph = _with_gradients(model, list(shapes), "lm")
    got = aotc.compile(graph, tmp_path, name="lm", threads=2).run({**params, "ids": ids, "tgt": tgt})
    p = _torch(params)
    loss = _transformer_loss(p, ids, tgt)
    loss.backward()
    _compare(got, loss, p)


class _TorchCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.dw = torch.nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=4)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        h = torch.nn.functional.avg_pool2d(torch.sigmoid(self.dw(h)), 2)
        return torch.log_softmax(self.fc(torch.flatten(h, 1)), 1)


@pytest.mark.filterwarnings("ignore")  # the TorchScript exporter's deprecation and tracer warnings
def test_gradients_of_a_model_exported_by_pytorch(tmp_path) -> None:
    """PyTorch's exporter (parameters as inputs, BatchNorm in training mode), an NLL loss appended; the
    gradients of every parameter and of the input against the same module's autograd."""
    import io

    torch.manual_seed(0)
    module = _TorchCnn().train()
    x = torch.randn(4, 3, 8, 8)
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, export_params=False, dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    model = onnx.load_from_string(f.getvalue())
    out = model.graph.output[0].name
    model.graph.node.append(helper.make_node("NegativeLogLikelihoodLoss", [out, "labels"], ["loss"]))
    model.graph.input.append(_vi("labels", [4], TensorProto.INT64))
    del model.graph.output[:]
    model.graph.output.append(_vi("loss", []))
    names = [i.name for i in model.graph.input if "running" not in i.name and i.name != "labels"]
    graph = _with_gradients(model, names, "exported")
    params = {n: p.detach().numpy() for n, p in module.named_parameters()}
    feeds = {**params, "bn.running_mean": np.zeros(4, np.float32), "bn.running_var": np.ones(4, np.float32),
             names[0]: x.numpy(), "labels": np.array([0, 3, 4, 1])}
    got = aotc.compile(graph, tmp_path, name="exported", threads=2).run(feeds)
    module.double()
    xt = x.double().requires_grad_()
    loss = F.nll_loss(module(xt), torch.tensor(feeds["labels"]))
    loss.backward()
    _compare(got, loss, {names[0]: xt, **dict(module.named_parameters())})


def test_softmax_before_opset_13_normalizes_the_flattened_tail(tmp_path) -> None:
    rng = np.random.default_rng(5)
    r = rng.standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=1), helper.make_node("LogSoftmax", ["x"], ["l"], axis=2),
             helper.make_node("Add", ["s", "l"], ["y"]), helper.make_node("Mul", ["y", "r"], ["m"]),
             helper.make_node("ReduceSum", ["m"], ["loss"], keepdims=0)]
    graph = _with_gradients(_model(nodes, [_vi("x", [2, 3, 4])], [numpy_helper.from_array(r, "r")], opset=11),
                            ["x"], "sm11")
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    got = aotc.compile(graph, tmp_path, name="sm11").run({"x": x})
    p = _torch({"x": x})
    flat = p["x"].reshape(2, 12).softmax(1).reshape(2, 3, 4)
    loss = ((flat + p["x"].reshape(2, 3, 4).log_softmax(2)) * torch.tensor(r, dtype=torch.float64)).sum()
    loss.backward()
    _compare(got, loss, p)


def test_gradient_of_an_intermediate_value_and_a_one_element_loss(tmp_path) -> None:
    """d loss / d h for an activation h (what a layer's output receives), with a loss of shape [1, 1]."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["a"]),
             helper.make_node("Mul", ["a", "a"], ["q"]), helper.make_node("ReduceMean", ["q"], ["loss"])]
    g = helper.make_graph(nodes, "m", [_vi("x", [3, 4]), _vi("w", [4, 5])], [_vi("loss", [1, 1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    graph = _with_gradients(model, ["h", "w"], "mid")
    arrays = {"x": rng.standard_normal((3, 4)).astype(np.float32), "w": rng.standard_normal((4, 5)).astype(np.float32)}
    got = aotc.compile(graph, tmp_path, name="mid").run(arrays)
    p = _torch(arrays)
    h = p["x"] @ p["w"]
    h.retain_grad()
    loss = (torch.tanh(h) ** 2).mean()
    loss.backward()
    _compare([got[0].reshape(()), *got[1:]], loss, {"h": h, "w": p["w"]})
