"""Compiled training steps (aotc compile --train, aotc.Train): trained on scikit-learn's handwritten
digits from Python and from C, compared step by step with PyTorch, under ASan/UBSan and -Werror."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx_helpers import SANITIZE, run_c_program_under_sanitizers
from train_models import (
    EXAMPLE,
    batches,
    digits,
    held_out_accuracy,
    make_data,
    mlp,
    mlp_params,
    small_cnn,
    transformer_block,
)

import aotc
from aotc.training.dropout import dropout_factors, node_key


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return digits()


def test_softmax_regression_learns_digits_from_zeros(tmp_path, data) -> None:
    """The seeds' example: from zeros, SGD lr 0.5, batch 100 -> >= 0.91 held out. Threads change nothing;
    save() writes an ONNX model that onnxruntime runs to the trained model's outputs."""
    x, y = data
    model = make_data.softmax_regression()
    m = aotc.compile(model, tmp_path, name="sm", train=aotc.Train("softmax_ce:labels", "sgd:lr=0.5"))
    m2 = aotc.load(tmp_path / "sm", threads=2)
    assert [t.name for t in m.train_inputs] == ["x", "labels"]
    assert not m.state["W"].any()
    assert held_out_accuracy(m, x, y) < 0.2  # all-zero weights: one class for everything
    losses = []
    for xb, yb in batches(x, y, 300):
        losses.append(m.train_step({"x": xb, "labels": yb}))
        assert m2.train_step({"x": xb, "labels": yb}) == losses[-1]
    np.testing.assert_array_equal(m2.state["W"], m.state["W"])
    assert losses[0] == pytest.approx(np.log(10), rel=1e-6) and losses[-1] < 0.4
    assert int(m.state["step"]) == 300
    assert held_out_accuracy(m, x, y) >= 0.91

    m.save(tmp_path / "trained.onnx")
    sess = ort.InferenceSession(str(tmp_path / "trained.onnx"))
    xb = x[-100:]
    np.testing.assert_allclose(sess.run(None, {"x": xb})[0], m.run({"x": xb})[0], rtol=1e-5, atol=1e-6)
    m.reset_state()
    assert not m.state["W"].any() and int(m.state["step"]) == 0


def _torch_optimizer(kind: str, params: list[torch.Tensor]) -> tuple[str, torch.optim.Optimizer]:
    if kind == "sgd":
        return "sgd:lr=0.5", torch.optim.SGD(params, lr=0.5)
    if kind == "nesterov":  # momentum, Nesterov's form, with an L2 term
        return ("momentum:lr=0.1,momentum=0.9,nesterov=1,weight_decay=0.001",
                torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.001))
    if kind == "adamw":
        return "adamw:lr=0.01,weight_decay=0.05", torch.optim.AdamW(params, lr=0.01, weight_decay=0.05)
    return "adam:lr=0.01,beta1=0.8,eps=1e-7", torch.optim.Adam(params, lr=0.01, betas=(0.8, 0.999), eps=1e-7)


@pytest.mark.parametrize("kind", ["sgd", "nesterov", "adam", "adamw"])
def test_matches_pytorch_for_100_steps(tmp_path, data, kind) -> None:
    """An MLP from the same initial weights, trained on the same batches, its learning rate halved after 50
    steps: the loss at every step within 1e-4 relative of PyTorch's, the parameters after 100 steps
    within 1e-4."""
    x, y = data
    params = mlp_params()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    spec, opt = _torch_optimizer(kind, list(tp.values()))
    m = aotc.compile(mlp(params), tmp_path, name="mlp", train=aotc.Train("softmax_ce:labels", spec))
    assert m.state["lr"] == opt.param_groups[0]["lr"]
    for step, (xb, yb) in enumerate(batches(x, y, 100)):
        if step == 50:  # a schedule: the learning rate lives in the state
            m.state["lr"][...] = opt.param_groups[0]["lr"] = opt.param_groups[0]["lr"] / 2
        loss = m.train_step({"x": xb, "labels": yb})
        opt.zero_grad()
        logits = torch.relu(torch.tensor(xb) @ tp["w1"] + tp["b1"]) @ tp["w2"] + tp["b2"]
        want = torch.nn.functional.cross_entropy(logits, torch.tensor(yb))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-4)
    for k, v in tp.items():
        np.testing.assert_allclose(m.state[k], v.detach().numpy(), rtol=0, atol=1e-4)


def test_pytorch_exported_model_with_batchnorm(tmp_path) -> None:
    """A model torch.onnx.export writes in training mode (Gemm with transB, BatchNormalization with its
    running statistics, initializers named "0.weight"): the same losses, parameters and running means
    as PyTorch for 5 steps; the header's names drop the '.'."""
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    torch.onnx.export(copy.deepcopy(net), (torch.randn(16, 64),), tmp_path / "net.onnx", input_names=["x"],
                      output_names=["logits"], dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False)
    m = aotc.compile(tmp_path / "net.onnx", tmp_path, name="net", train=aotc.Train("softmax_ce:labels", "sgd:lr=0.1"))
    assert "#define NET_STATE_0_WEIGHT_OFFSET" in (tmp_path / "net.h").read_text()
    with torch.no_grad():  # exporting ran a forward pass in training mode: start from what it exported
        net[1].running_mean.copy_(torch.tensor(m.state["1.running_mean"]))
    _sgd_steps_match(m, net, (16, 64), steps=5)
    for k, v in net.state_dict().items():
        if k.endswith(("weight", "bias", "running_mean")):
            np.testing.assert_allclose(m.state[k], v.numpy(), atol=1e-5, err_msg=k)



def _sgd_steps_match(m, net, shape: tuple[int, ...], steps: int) -> None:
    """``steps`` steps of SGD (lr 0.1, softmax cross-entropy over 10 classes) on random batches of
    ``shape``: each of aotc's losses within 1e-5 relative of PyTorch's on the same batch."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        xb, yb = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])
        loss = m.train_step({"x": xb, "labels": yb})
        opt.zero_grad()
        want = torch.nn.functional.cross_entropy(net(torch.tensor(xb)), torch.tensor(yb))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-5)


@pytest.mark.slow
def test_transformer_block_matches_pytorch(tmp_path) -> None:
    """A Transformer block (LayerNorm, attention with Softmax, GELU, residual Adds) exported from PyTorch:
    20 SGD steps give PyTorch's losses and parameters. Exported in training mode: an eval-mode export
    merges initializers of equal values (the two LayerNorms' ones) into one, which training would tie."""
    net = transformer_block()
    torch.onnx.export(copy.deepcopy(net), (torch.randn(16, 8, 16),), tmp_path / "t.onnx", input_names=["x"],
                      output_names=["logits"], dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False)
    m = aotc.compile(tmp_path / "t.onnx", tmp_path, name="t", train=aotc.Train("softmax_ce:labels", "sgd:lr=0.1"))
    _sgd_steps_match(m, net, (16, 8, 16), steps=20)
    for k, v in net.named_parameters():
        np.testing.assert_allclose(m.state[k], v.detach().numpy(), atol=1e-5, err_msg=k)


def test_loss_in_the_graph_and_mse(tmp_path, data) -> None:
    """--loss NAME trains on a loss the model computes (its labels input leaves NAME_run); mse:TARGETS
    appends mean squared error against a new input; --trainable leaves the others constant (with plain
    momentum, against PyTorch)."""
    x, y = data
    params = mlp_params(seed=2)
    m = aotc.compile(mlp(params, loss_node=True), tmp_path, name="g", train="loss")  # SGD, lr 0.01
    assert m.state["lr"] == np.float32(0.01)
    assert [t.name for t in m.inputs] == ["x"] and [t.name for t in m.outputs] == ["logits"]
    assert [t.name for t in m.train_inputs] == ["x", "labels"]
    sess = ort.InferenceSession(mlp(params, loss_node=True).SerializeToString())
    xb, yb = x[:100], y[:100]
    first = m.train_step({"x": xb, "labels": yb})
    assert first == pytest.approx(sess.run(["loss"], {"x": xb, "labels": yb})[0], rel=1e-5)
    assert m.train_step({"x": xb, "labels": yb}) < first

    target = np.eye(10, dtype=np.float32)[yb]
    m = aotc.compile(mlp(params), tmp_path, name="mse",
                     train=aotc.Train("mse:target", "momentum:lr=0.1,momentum=0.5", "w2,b2"))
    assert sorted(k for k, r in zip(m.state, m._train["state"]["tensors"], strict=True)
                  if r["role"] == "parameter") == ["b2", "w2"]
    tp = {k: torch.tensor(v, requires_grad=k in ("w2", "b2")) for k, v in params.items()}
    opt = torch.optim.SGD([tp["w2"], tp["b2"]], lr=0.1, momentum=0.5)
    for _ in range(5):
        loss = m.train_step({"x": xb, "target": target})
        opt.zero_grad()
        want = torch.nn.functional.mse_loss(torch.relu(torch.tensor(xb) @ tp["w1"] + tp["b1"]) @ tp["w2"] + tp["b2"],
                                            torch.tensor(target))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-5)
    np.testing.assert_allclose(m.state["w2"], tp["w2"].detach().numpy(), atol=1e-5)


def test_dropout_draws_a_new_mask_every_step(tmp_path, data) -> None:
    """Training-mode Dropout: factors from the counter-based generator keyed by the step (its numpy twin
    aotc.training.dropout.dropout_factors), so PyTorch with the same masks gives the same losses and
    parameters; NAME_run leaves Dropout out."""
    x, y = data
    params = mlp_params(seed=3)
    m = aotc.compile(mlp(params, dropout=0.3), tmp_path, name="dr", train=aotc.Train("softmax_ce:labels", "sgd:lr=0.3"))
    assert "ratio" not in m.state
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    opt = torch.optim.SGD(list(tp.values()), lr=0.3)
    kept = []
    for step, (xb, yb) in enumerate(batches(x, y, 5)):
        f = dropout_factors(step, node_key(5, 0), 0.3, (100, 32), np.float32)
        kept.append(f > 0)
        loss = m.train_step({"x": xb, "labels": yb})
        opt.zero_grad()
        h = torch.relu(torch.tensor(xb) @ tp["w1"] + tp["b1"]) * torch.tensor(f)
        want = torch.nn.functional.cross_entropy(h @ tp["w2"] + tp["b2"], torch.tensor(yb))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-5)
    assert all(0.6 < k.mean() < 0.8 for k in kept) and not (kept[0] == kept[1]).all()
    for k, v in tp.items():
        np.testing.assert_allclose(m.state[k], v.detach().numpy(), atol=1e-5)
    logits = torch.relu(torch.tensor(x[:100]) @ tp["w1"] + tp["b1"]) @ tp["w2"] + tp["b2"]
    np.testing.assert_allclose(m.run({"x": x[:100]})[0], logits.detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_small_cnn_learns_digits(tmp_path, data) -> None:
    """Conv-BatchNorm-Relu-MaxPool-Conv-Relu-MaxPool-Gemm with Adam: >= 0.97 held out. BatchNorm trains on
    batch statistics and NAME_run normalises with the running ones the steps updated. On 2 threads the
    steps give the same bits."""
    x, y = data
    m = aotc.compile(small_cnn(), tmp_path, name="cnn", train=aotc.Train("softmax_ce:labels", "adam:lr=0.01"))
    assert m.state["m1"].tolist() == [0.0] * 8
    # NAME_run's second conv (8 input channels, weights from the state) is an im2col + GEMM: the conv
    # kernels' fast paths need constant weights, and their generic loop is some 40 times slower.
    convs = [k["ops"] for k in m.metadata["kernels"] if "Conv" in k["ops"]]
    assert len(convs) == 1 and any("aotc.Im2Col" in k["ops"] for k in m.metadata["kernels"]), convs
    m2 = aotc.load(tmp_path / "cnn", threads=2)  # its own state: the same steps, split over 2 threads
    for step, (xb, yb) in enumerate(batches(x, y, 600)):
        loss = m.train_step({"x": xb, "labels": yb})
        if step < 20:
            assert m2.train_step({"x": xb, "labels": yb}) == loss
        if step == 19:
            np.testing.assert_array_equal(m2.state_buffer, m.state_buffer)
    assert m.state["m1"].any() and not np.allclose(m.state["v1"], 1)
    assert held_out_accuracy(m, x, y) >= 0.97


def _aotc_command() -> str:
    return f"{sys.executable} -m aotc"


def test_train_c_example(tmp_path) -> None:
    """examples/train_c: make writes the data and model, aotc compiles the training step, the C program
    trains 20 epochs and reports >= 0.91 held-out accuracy."""
    if shutil.which("make") is None:
        pytest.skip("make is not on PATH")
    work = tmp_path / "train_c"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("build", "train", "*.o"))
    proc = subprocess.run(["make", "-C", str(work), "run", f"PYTHON={sys.executable}", f"AOTC={_aotc_command()}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "steps: 300" in proc.stdout
    acc = float(re.search(r"held-out accuracy: ([0-9.]+)", proc.stdout).group(1))
    assert acc >= 0.91, proc.stdout


def test_train_step_clean_under_sanitizers_and_warnings(tmp_path) -> None:
    """The training library (BatchNorm CNN, Adam) built with ASan/UBSan and -Wall -Wextra -Werror, driven
    from C: two threads train two states at once (to the same bytes), a run reads the trained state,
    the state table matches the header, NULL arguments are refused."""
    from aotc.compiler import compile_model

    compile_model(small_cnn(batch=4), tmp_path, "cnn", extra_cflags=[*SANITIZE, "-Wall", "-Wextra", "-Werror"],
                  train=aotc.Train("softmax_ce:labels", "adam:lr=0.01"))
    source = """
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "cnn.h"
typedef struct {
  _Alignas(64) unsigned char state[CNN_STATE_BYTES], ws[CNN_WORKSPACE_BYTES];
  float loss;
  int rc;
} trainer;
static trainer a, b;
static float x[4 * 64];
static const int64_t labels[4] = {0, 3, 9, 7};
static void *train(void *p) {  /* three steps on a state of its own: the library keeps no state itself */
  trainer *t = p;
  t->rc = cnn_state_init(t->state);
  for (int s = 0; s < 3 && t->rc == CNN_OK; s++) t->rc = cnn_train_step(x, labels, &t->loss, t->state, t->ws);
  return 0;
}
int main(void) {
  float probs[4 * 10];
  pthread_t th;
  for (int i = 0; i < 4 * 64; i++) x[i] = (float)((i * 37) % 17) / 16.0f;
  if (pthread_create(&th, 0, train, &a)) return 1;
  train(&b);
  pthread_join(th, 0);
  if (a.rc != CNN_OK || b.rc != CNN_OK || memcmp(a.state, b.state, CNN_STATE_BYTES)) return 2;
  if (cnn_run(x, probs, a.state, a.ws) != CNN_OK) return 3;
  if (*cnn_state_step_data(a.state) != 3 || cnn_num_state_tensors() != CNN_NUM_STATE_TENSORS) return 4;
  if (cnn_state_offset(0) != CNN_STATE_C1W_OFFSET || strcmp(cnn_state_name(0), "c1w") ||
      strcmp(cnn_state_role(0), "parameter") || cnn_state_rank(0) != 4 || cnn_state_shape(0)[0] != 8) return 5;
  if (cnn_train_step(x, labels, 0, a.state, a.ws) != CNN_ERR_NULL_ARGUMENT ||
      cnn_train_step(x, labels, &a.loss, 0, a.ws) != CNN_ERR_NULL_ARGUMENT) return 6;
  printf("%g %g\\n", a.loss, probs[0]);
  return 0;
}
"""
    proc = run_c_program_under_sanitizers(tmp_path, source, "libcnn.a", SANITIZE)
    loss, logit = (float(v) for v in proc.stdout.split())
    assert np.isfinite(loss) and np.isfinite(logit)


def test_cli_train(tmp_path) -> None:
    onnx.save(mlp(mlp_params()), tmp_path / "m.onnx")
    run = [sys.executable, "-m", "aotc", "compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path), "-n", "net", "-q"]
    proc = subprocess.run([*run, "--train", "--loss", "softmax_ce:labels", "--optimizer", "momentum:lr=0.1",
                           "--gen-test"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    test = subprocess.run([str(tmp_path / "net_test")], capture_output=True, text=True)  # NAME_run from state_init
    assert test.returncode == 0 and "net_test: PASSED" in test.stdout, test.stdout
    header = (tmp_path / "net.h").read_text()
    assert ("int net_train_step(const float *x, const int64_t *labels, float *loss, void *state, "
            "void *workspace);") in header
    assert "#define NET_STATE_W1_OFFSET" in header and "net_state_w1_momentum_data" in header
    m = aotc.load(tmp_path / "net")
    m.state["w1"][:] = 0.5  # save() reads the model file compiled and writes the state's values
    m.save(tmp_path / "saved.onnx")
    assert (onnx.numpy_helper.to_array(onnx.load(tmp_path / "saved.onnx").graph.initializer[0]) == 0.5).all()
    assert set(m.state) == {"w1", "b1", "w2", "b2", "step", "lr", "w1.momentum", "b1.momentum", "w2.momentum",
                            "b2.momentum"}
    ce = ["--train", "--loss", "softmax_ce:labels"]
    for args, message in [([*ce, "--optimizer", "rmsprop:lr=1"], "unknown optimizer"),
                          ([*ce, "--trainable", "w1,nope"], "'nope' not among"),
                          (["--train", "--loss", "nothing"], "not in the model"),
                          (["--train", "--loss", "logits"], "must be a float scalar"),
                          (["--loss", "softmax_ce:labels"], "--train and --loss go together"),
                          ([*ce, "--cpp-class", "ns::Net"], "--train does not combine with --cpp-class")]:
        proc = subprocess.run([*run, *args], capture_output=True, text=True)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            (args, proc.stderr)
