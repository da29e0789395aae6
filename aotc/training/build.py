"""From an inference graph to the two graphs of a training library.

The parameters (float initializers, or the ones named) stop being constants: they become inputs that
live in the state buffer (aotc.training.state), as do BatchNorm's running statistics, the optimizer's
moments and the step counter. The inference graph reads them; the training graph appends the loss,
the gradients (aotc.training.autodiff) and the optimizer's update, and writes every new value back into
the state in place (``Graph.add_update``). Training-mode semantics: BatchNorm normalises with the
batch's statistics and updates its running ones; Dropout draws a new mask every step
(aotc.training.dropout).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Graph, Value
from aotc.ops.grads.builder import GradBuilder
from aotc.ops.registry import OPS
from aotc.passes.propagate import propagate
from aotc.training.autodiff import gradients, lower_runtime_convs
from aotc.training.dropout import dropout_inference, dropout_training
from aotc.training.optimizers import MakeState, apply_optimizer
from aotc.training.spec import Loss, Train
from aotc.training.state import StateLayout

if TYPE_CHECKING:
    from aotc.codegen.library import Library

FLOATS = (np.float16, np.float32, np.float64)


@dataclass
class TrainingGraphs:
    """What a --train compile generates from: NAME_run's graph, NAME_train_step's, and the state."""

    inference: Graph
    train: Graph
    layout: StateLayout
    # Graph input position -> byte offset in the state, for each graph.
    inference_state: dict[int, int]
    train_state: dict[int, int]
    loss: str
    spec: Train

    def metadata(self, lib: Library, source: Path | None) -> dict:
        """NAME.json's "train": what the bindings need to call NAME_train_step and map the state, and the
        model file whose initializers ``CompiledModel.save`` replaces."""
        return {"inputs": [{"name": t.name, "dtype": t.dtype, "shape": t.shape} for t in lib.train_inputs],
                "outputs": [{"name": t.name, "dtype": t.dtype, "shape": t.shape} for t in lib.train_outputs],
                "loss": self.loss, "loss_spec": self.spec.loss, "optimizer": self.spec.optimizer,
                "state": self.layout.metadata(),
                "source": None if source is None else str(source.resolve())}


def build_training(graph: Graph, spec: Train, initializers: set[str]) -> TrainingGraphs:
    """Split imported ``graph`` (before the passes) into the inference and training graphs of ``spec``;
    ``initializers`` are the names of the model's initializers, the candidates for parameters."""
    loss_spec = spec.parsed_loss()
    optimizer = spec.parsed_optimizer()
    layout = StateLayout()
    params = _parameters(graph, initializers, spec.trainable_names())
    stats = _running_statistics(graph, initializers)
    offset: dict[int, int] = {}  # id(state input) -> byte offset
    state_inputs: dict[int, Value] = {}  # id(constant) -> the input replacing it
    for v, role in [(p, "parameter") for p in params] + [(s, "running statistic") for s in stats]:
        slot = layout.add(v.name, role, v.shape, v.dtype, v.const)
        x = Value(v.name, v.shape, v.dtype)
        state_inputs[id(v)] = x
        offset[id(x)] = slot.offset
        graph.inputs.append(x)
    for n in graph.nodes:
        n.inputs = [state_inputs.get(id(v), v) if v is not None else None for v in n.inputs]
    graph.outputs = [state_inputs.get(id(v), v) for v in graph.outputs]
    param_inputs = [state_inputs[id(p)] for p in params]
    propagate(graph)  # shapes and dtypes, now that the parameters are no constants to fold

    train = copy.deepcopy(graph)
    tmap = {id(a): b for a, b in zip(graph.inputs, train.inputs, strict=True)}
    toffset = {id(tmap[id(x)]): o for x in graph.inputs if (o := offset.get(id(x))) is not None}

    make_state = _state_input(train, layout, toffset)
    step = make_state("step", "step", (), np.dtype(np.int64))
    loss = _append_loss(train, loss_spec)
    if loss_spec.kind != "tensor" and "loss" not in {v.name for v in train.values()}:
        loss.name = "loss"
    _batchnorm_training(train, toffset)
    dropout_training(train, step)
    tparams = [tmap[id(p)] for p in param_inputs]
    grads = gradients(train, loss, tparams, prefix="grad")
    apply_optimizer(GradBuilder(train, "train"), optimizer, tparams, grads, make_state, step)
    train.outputs = [loss] + train.outputs[len(train.outputs) - len(train.updates):]
    _drop_unused_inputs(train, keep={id(x) for x in train.updates})

    inference_mode(graph)
    lower_runtime_convs(graph)  # the conv kernels' fast paths need constant weights; a GEMM does not
    if loss_spec.kind == "tensor":  # NAME_run computes what the model does but its loss
        graph.outputs = [v for v in graph.outputs if v.name != loss_spec.tensor]
    if not graph.outputs:
        raise AotcError(f"the model has no output besides the loss {loss_spec.tensor!r}: nothing for "
                        "NAME_run to compute")
    _drop_unused_inputs(graph, keep=set())
    return TrainingGraphs(graph, train, layout, _positions(graph, offset), _positions(train, toffset),
                          loss.name, spec)


def _positions(graph: Graph, offset: dict[int, int]) -> dict[int, int]:
    return {i: offset[id(v)] for i, v in enumerate(graph.inputs) if id(v) in offset}


def _state_input(graph: Graph, layout: StateLayout, offset: dict[int, int]) -> MakeState:
    """A factory the optimizer calls for each tensor it keeps between steps (a moment, the step
    counter, the learning rate): a new input of ``graph`` in a new state slot, ``init`` or zero at first."""
    def make(name: str, role: str, shape: tuple[int, ...], dtype: np.dtype, init: np.ndarray | None = None) -> Value:
        slot = layout.add(name, role, shape, dtype, init)
        x = Value(slot.name, tuple(shape), np.dtype(dtype))
        graph.inputs.append(x)
        offset[id(x)] = slot.offset
        return x
    return make


def _parameters(graph: Graph, initializers: set[str], names: list[str] | None) -> list[Value]:
    """The float initializers the graph computes with (in first-use order), or those named."""
    found: dict[int, Value] = {}
    excluded: set[int] = set()
    for n in graph.nodes:
        op = OPS.get(n.op)
        for i, v in enumerate(n.inputs):
            if v is None or not v.is_const or v.name not in initializers:
                continue
            fixed = (op is not None and i in op.const_inputs) or (n.op == "BatchNormalization" and i >= 3)
            if fixed or np.dtype(v.dtype).type not in FLOATS:
                excluded.add(id(v))
            else:
                found.setdefault(id(v), v)
    candidates = [v for k, v in found.items() if k not in excluded]
    if names is None:
        if not candidates:
            raise AotcError("the model has no float initializer to train")
        return candidates
    by_name = {v.name: v for v in candidates}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise AotcError(f"--trainable: {', '.join(repr(n) for n in unknown)} not among the float initializers "
                        f"the model computes with ({', '.join(by_name) or 'none'})")
    return [by_name[n] for n in dict.fromkeys(names)]


def _running_statistics(graph: Graph, initializers: set[str]) -> list[Value]:
    """BatchNorm's running mean and variance: state the training step updates, not parameters."""
    res: dict[int, Value] = {}
    for n in graph.nodes:
        if n.op == "BatchNormalization":
            for v in n.inputs[3:5]:
                if v is not None and v.is_const and v.name in initializers:
                    res.setdefault(id(v), v)
    return list(res.values())


def _value(graph: Graph, name: str) -> Value:
    for v in graph.values():
        if v.name == name:
            return v
    raise AotcError(f"the loss names tensor {name!r}, which is not in the model")


def _append_loss(graph: Graph, spec: Loss) -> Value:
    """The loss as a value of ``graph``; for softmax_ce and mse, a new input holds the labels."""
    if spec.kind == "tensor":
        assert spec.tensor is not None
        loss = _value(graph, spec.tensor)
        if loss.shape is None or loss.size != 1 or np.dtype(loss.dtype).type not in FLOATS:
            raise AotcError(f"the loss {spec.tensor!r} must be a float scalar, not {loss.type_str()}")
        return loss
    assert spec.labels is not None
    if spec.labels in {v.name for v in graph.values()}:
        raise AotcError(f"the labels input {spec.labels!r} has the name of a tensor of the model")
    y = _value(graph, spec.tensor) if spec.tensor else graph.outputs[0]
    if y.shape is None or np.dtype(y.dtype).type not in FLOATS:
        raise AotcError(f"the loss's prediction {y.name!r} must be a float tensor, not {y.type_str()}")
    b = GradBuilder(graph, "loss")
    if spec.kind == "mse":
        t = Value(spec.labels, y.shape, y.dtype)
        graph.inputs.append(t)
        d = b.op("Sub", y, t)
        return b.op("ReduceMean", b.op("Mul", d, d), keepdims=0)
    if len(y.shape) < 2:
        raise AotcError(f"softmax_ce needs logits of shape [N, C, ...]; {y.name!r} is {y.type_str()}")
    p = y.producer
    axis = p.attr("axis", -1 if graph.opset >= 13 else 1) % len(y.shape) if p is not None else None
    labels = Value(spec.labels, (y.shape[0], *y.shape[2:]), np.dtype(np.int64))
    graph.inputs.append(labels)
    if p is not None and p.op in ("Softmax", "LogSoftmax") and axis == 1 and p.inputs[0] is not None:
        # The model ends in (log-)softmax: the loss takes the logits, as PyTorch's cross_entropy does.
        op = "SoftmaxCrossEntropyLoss" if p.op == "Softmax" else "NegativeLogLikelihoodLoss"
        x = p.inputs[0] if p.op == "Softmax" else y
        return b.op(op, x, labels, reduction="mean")
    return b.op("SoftmaxCrossEntropyLoss", y, labels, reduction="mean")


def _batchnorm_training(graph: Graph, offset: dict[int, int]) -> None:
    """BatchNorm in training mode: batch statistics, and its running statistics, when they live in the
    state, updated in place."""
    for n in graph.nodes:
        if n.op != "BatchNormalization":
            continue
        n.attrs["training_mode"] = 1
        mean, var = n.inputs[3], n.inputs[4]
        while len(n.outputs) < 3:
            src = mean if len(n.outputs) == 1 else var
            assert src is not None
            v = Value(f"{n.name or 'bn'}:running{len(n.outputs)}", src.shape, src.dtype, n)
            n.outputs.append(v)
        for old, new in ((mean, n.outputs[1]), (var, n.outputs[2])):
            if old is not None and id(old) in offset:
                graph.add_update(old, new)


def inference_mode(graph: Graph) -> None:
    """NAME_run's semantics, whatever mode the model was exported in: BatchNorm normalises with its
    running statistics, Dropout is the identity."""
    _batchnorm_inference(graph)
    dropout_inference(graph)


def _batchnorm_inference(graph: Graph) -> None:
    for n in graph.nodes:
        if n.op == "BatchNormalization" and n.attr("training_mode", 0):
            n.attrs["training_mode"] = 0
            del n.outputs[1:]


def _drop_unused_inputs(graph: Graph, keep: set[int]) -> None:
    """Remove the inputs nothing the outputs need reads (a model's labels from NAME_run)."""
    needed = {id(v) for v in graph.outputs} | keep
    for n in reversed(graph.nodes):
        if any(id(v) in needed for v in n.outputs):
            needed.update(id(v) for v in n.inputs if v is not None)
    graph.inputs = [v for v in graph.inputs if id(v) in needed]
