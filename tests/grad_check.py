"""Checking gradient rules: small ONNX graphs differentiated by aotc (aotc.training.autodiff), compiled
and run in float32, against PyTorch autograd in float64 and against central finite differences of the
same graph run by onnx.reference in float64.

A ``GradCase`` is one op (or a few) on its own inputs with a fixed random cotangent R per output: its
loss is sum(y * R). Many cases compile together into one library (their losses summed), so a whole
op family costs one C compile."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import IR_VERSION

import aotc
from aotc.frontends.onnx import import_onnx
from aotc.training.autodiff import gradients

OPSET = 24
_ids = itertools.count()


@dataclass
class GradCase:
    """Nodes over ``inputs`` (differentiated; float64 values, run as float32) and ``consts``
    (initializers), producing ``outputs``; ``torch_fn`` computes the outputs from torch tensors of
    the inputs (float64) and the consts."""

    id: str
    nodes: list[onnx.NodeProto]
    inputs: dict[str, np.ndarray]
    outputs: list[str]
    torch_fn: Callable[..., torch.Tensor | Sequence[torch.Tensor]]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    finite_differences: bool = True
    cotangents: dict[str, np.ndarray] = field(default_factory=dict)


def case(case_id: str, op: str, inputs: Sequence[np.ndarray | str], torch_fn: Callable[..., object],
         consts: dict[str, np.ndarray] | None = None, n_out: int = 1, **attrs: object) -> GradCase:
    """One ``op`` node. ``inputs`` are arrays (differentiated inputs, in order) or names of ``consts``
    (or "" for an absent optional input); ``torch_fn`` takes the same arguments as tensors."""
    k = next(_ids)
    names, ins = [], {}
    renamed = {f"{c}": f"c{k}_{c}" for c in (consts or {})}
    for i, v in enumerate(inputs):
        if isinstance(v, str):
            names.append(renamed.get(v, v))
        else:
            names.append(f"x{k}_{i}")
            ins[names[-1]] = np.asarray(v, np.float64)
    outs = [f"y{k}_{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    order = names

    def fn(t: dict[str, torch.Tensor]) -> object:
        return torch_fn(*[t.get(n) if n else None for n in order])

    return GradCase(case_id, [node], ins, outs, fn, {renamed[c]: a for c, a in (consts or {}).items()})


def rand(*shape: int, low: float | None = None, seed: int | None = None) -> np.ndarray:
    """Standard normal values (or uniform in [low, low + 1] when ``low`` is given)."""
    rng = np.random.default_rng(seed if seed is not None else next(_ids) + 1000)
    return rng.standard_normal(shape) if low is None else rng.uniform(low, low + 1, shape)


def _model(cases: Sequence[GradCase], dtype: int) -> onnx.ModelProto:
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    nodes, inputs, inits, losses = [], [], [], []
    for c in cases:
        nodes += c.nodes
        inputs += [helper.make_tensor_value_info(n, dtype, a.shape) for n, a in c.inputs.items()]
        for n, a in c.consts.items():
            a = np.asarray(a)
            inits.append(numpy_helper.from_array(a.astype(np_dt) if a.dtype.kind == "f" else a, n))
        for o in c.outputs:
            r = c.cotangents[o]
            inits.append(numpy_helper.from_array(r.astype(np_dt), f"{o}_r"))
            nodes += [helper.make_node("Mul", [o, f"{o}_r"], [f"{o}_m"]),
                      helper.make_node("ReduceSum", [f"{o}_m"], [f"{o}_l"], keepdims=0)]
            losses.append(f"{o}_l")
    nodes.append(helper.make_node("Sum", losses, ["loss"]))
    g = helper.make_graph(nodes, "grads", inputs, [helper.make_tensor_value_info("loss", dtype, [])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = IR_VERSION
    return m


def _torch_grads(c: GradCase) -> dict[str, np.ndarray]:
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in c.inputs.items()}
    args = dict(t)
    for n, a in c.consts.items():
        a = np.asarray(a)
        args[n] = torch.tensor(a, dtype=torch.float64) if a.dtype.kind == "f" else torch.tensor(a)
    ys = c.torch_fn(args)
    ys = [ys] if isinstance(ys, torch.Tensor) else list(ys)
    loss = sum((y * torch.tensor(c.cotangents[o])).sum() for y, o in zip(ys, c.outputs, strict=True))
    grads = torch.autograd.grad(loss, list(t.values()), allow_unused=True)
    return {n: np.zeros_like(c.inputs[n]) if g is None else g.numpy() for n, g in zip(t, grads, strict=True)}


def _fd_directional(c: GradCase, direction: dict[str, np.ndarray], eps: float = 1e-6) -> float:
    """(L(x + eps v) - L(x - eps v)) / 2 eps by onnx.reference in float64."""
    ref = ReferenceEvaluator(_model([c], TensorProto.DOUBLE))

    def loss(sign: float) -> float:
        feeds = {n: a + sign * eps * direction[n] for n, a in c.inputs.items()}
        return float(ref.run(None, feeds)[0])

    return (loss(1) - loss(-1)) / (2 * eps)


def check_gradients(cases: Sequence[GradCase], out_dir: Path, name: str = "grads", threads: int = 2) -> None:
    """Compile every case's gradients into one library and check each against PyTorch and, where the
    case allows, against finite differences."""
    rng = np.random.default_rng(len(cases))
    wants = []
    for c in cases:
        t = {n: torch.tensor(a, dtype=torch.float64) for n, a in c.inputs.items()}
        t.update({n: torch.tensor(np.asarray(a)) for n, a in c.consts.items()})
        with torch.no_grad():
            ys = c.torch_fn({n: v.double() if v.is_floating_point() else v for n, v in t.items()})
        ys = [ys] if isinstance(ys, torch.Tensor) else list(ys)
        c.cotangents = {o: rng.standard_normal(tuple(y.shape)) for o, y in zip(c.outputs, ys, strict=True)}
        wants.append(_torch_grads(c))
    graph = import_onnx(_model(cases, TensorProto.FLOAT), name=name)
    values = {v.name: v for v in graph.values()}
    names = [n for c in cases for n in c.inputs]
    grads = gradients(graph, values["loss"], [values[n] for n in names])
    graph.outputs = [grads[n] for n in names]
    compiled = aotc.compile(graph, out_dir, name=name, threads=threads)
    got = dict(zip(names, compiled.run({n: a.astype(np.float32) for c in cases for n, a in c.inputs.items()}),
                   strict=True))
    for c, want in zip(cases, wants, strict=True):
        for n in c.inputs:
            scale = max(float(np.abs(want[n]).max()), 1e-3)
            np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{c.id}: d loss / d {n} against PyTorch")
        if c.finite_differences:
            v = {n: rng.standard_normal(a.shape) for n, a in c.inputs.items()}
            fd = _fd_directional(c, v)
            analytic = sum(float((got[n].astype(np.float64) * v[n]).sum()) for n in c.inputs)
            size = sum(float(np.abs(got[n] * v[n]).sum()) for n in c.inputs)
            assert abs(fd - analytic) <= 1e-4 * max(size, 1e-3), f"{c.id}: finite differences {fd}, aotc {analytic}"
