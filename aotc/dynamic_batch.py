"""Proves that a dimension of an ONNX model is a batch: each output sample depends only on the same
sample of the inputs, through the same function whatever the batch size (docs/dynamic_shapes.md).

``batch_axes(model, inputs)`` walks the graph op by op with the dimension pinned to a small size and
tracks, for every tensor, where the batch lives (``Batch``: an axis and a factor), or raises
``AotcError`` naming the node that mixes samples or uses the batch size as data.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from aotc.errors import AotcError

# Pinned sizes the analysis runs at: two, so that a constant shape fitting one size by chance fails.
PROBE_SIZES = (3, 5)


@dataclass(frozen=True)
class Batch:
    """The batch lives on ``axis``, which has ``T * factor`` entries: sample i owns ``i*factor`` to
    ``i*factor + factor - 1``."""

    axis: int
    factor: int = 1


@dataclass(frozen=True, eq=False)
class Taint:
    """A value computed from the batch size (from a Shape or Size of a batch tensor): ``mask`` marks
    the elements that depend on it (a shape vector's batch entry, not its others)."""

    mask: np.ndarray

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Taint) and np.array_equal(self.mask, other.mask)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Iota:
    """Integers ``i * stride + r`` for sample index ``i`` along ``axis`` and an ``r`` in ``lo..hi`` that
    does not depend on the batch: the indices a Range over the batch size makes (transformers builds
    its attention masks by gathering ``mask.flatten()[i * seq + j]``). Only a Gather from a flattened
    batch tensor whose sample blocks are ``stride`` long may read them."""

    axis: int
    stride: int
    lo: int
    hi: int


ELEMENTWISE = frozenset("""
Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast
CastLike Ceil Celu Clip Cos Cosh DequantizeLinear Div Elu Equal Erf Exp Floor Gelu Greater GreaterOrEqual
HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Mean Min Mish Mod Mul Neg Not
Or PRelu Pow QuantizeLinear Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt
Sub Sum Tan Tanh ThresholdedRelu Where Xor Dropout
""".split())
# Ops whose axis 0 is the batch and whose other inputs (weights) must not carry it.
BATCH_FIRST = frozenset("""
Conv ConvTranspose ConvInteger QLinearConv MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool
GlobalLpPool BatchNormalization InstanceNormalization LRN DepthToSpace SpaceToDepth GroupNormalization
""".split())
REDUCE = frozenset("""
ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
ReduceSumSquare ArgMax ArgMin
""".split())
# Index arithmetic on shapes: ops that may compute on tainted values, elementwise or moving elements.
SHAPE_ELEMENTWISE = frozenset("Add Sub Mul Div Mod Max Min Equal Less Greater Where Abs Neg Cast Identity".split())
SHAPE_MOVES = frozenset("Gather Slice Concat Unsqueeze Squeeze Reshape Flatten".split())


class _Walk:
    def __init__(self, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...] | None],
                 folded: dict[str, np.ndarray], size: int, opset: int) -> None:
        self.shapes = shapes
        self.size = size
        self.opset = opset
        self.state: dict[str, Batch | Taint | Iota | None] = {}
        # Values known at compile time; read only where the batch analysis proved them independent of it.
        self.consts: dict[str, np.ndarray] = dict(folded)
        for t in model.graph.initializer:
            self.consts[t.name] = numpy_helper.to_array(t)
            self.state[t.name] = None

    def refuse(self, node: onnx.NodeProto, why: str) -> AotcError:
        label = node.name or node.op_type
        return AotcError(f"--dynamic: node {label!r} ({node.op_type}) {why}, so the dimension is not a batch "
                         "aotc can split (docs/dynamic_shapes.md)")

    def shape(self, node: onnx.NodeProto, name: str) -> tuple[int, ...]:
        s = self.shapes.get(name)
        if s is None:
            raise self.refuse(node, f"has a tensor {name!r} whose shape shape inference cannot tell")
        return s

    def const(self, node: onnx.NodeProto, i: int) -> np.ndarray | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        v = self.consts.get(node.input[i])
        if v is None:
            raise self.refuse(node, f"takes input {i} ({node.input[i]!r}) as data, where aotc needs a constant")
        return v

    def node(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        if op == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    self.consts[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    self.consts[node.output[0]] = np.array(onnx.helper.get_attribute_value(a))
            self.state[node.output[0]] = None
            return
        ins = [self.state.get(n) if n else None for n in node.input]
        if all(i is None for i in ins):  # nothing here depends on the batch
            outs: list = [None] * len(node.output)
        elif node.domain not in ("", "ai.onnx"):
            raise self.refuse(node, "is outside the ONNX domain, which the batch analysis does not know")
        elif any(isinstance(i, Taint) for i in ins) and not any(isinstance(i, Iota) for i in ins):
            outs = self.tainted(node, ins)
        elif any(isinstance(i, Iota) for i in ins):
            outs = self.iota(node, ins)
        else:
            outs = self.batched(node, ins)
        for name, out in zip(node.output, outs, strict=False):
            if name:
                self.state[name] = None if isinstance(out, Taint) and not out.mask.any() else out

    def tainted(self, node: onnx.NodeProto, ins: list) -> list:
        """Index arithmetic on values computed from the batch size; they may only end as the target
        of a Reshape or Expand, whose result the shape rules check."""
        op = node.op_type
        if op in ("Shape", "Size") and isinstance(ins[0], Taint):  # a shape vector's length is fixed
            return [None]
        if op in ("Reshape", "Expand") and isinstance(ins[0], Batch) and not isinstance(ins[1], Batch):
            return self.batched(node, [ins[0], None])
        if op == "Expand" and ins[0] is None and isinstance(ins[1], Taint):
            return [self.broadcast(node, ins[1])]
        if op == "ConstantOfShape":
            return [self.broadcast(node, ins[0])]
        if op == "Range" and ins[0] is None and ins[2] is None and isinstance(ins[1], Taint):
            start, delta = self.const(node, 0), self.const(node, 2)
            if int(start) == 0 and int(delta) == 1 and self.shape(node, node.output[0]) == (self.size,):
                return [Iota(0, 1, 0, 0)]
        if any(isinstance(i, Batch) for i in ins) or op not in SHAPE_ELEMENTWISE | SHAPE_MOVES:
            raise self.refuse(node, "uses the batch size as data (a Shape or Size of a batch tensor)")
        out = self.shapes.get(node.output[0])
        masks = [i.mask if isinstance(i, Taint) else np.zeros(self.shapes.get(n) or (), bool)
                 for n, i in zip(node.input, ins, strict=True)]
        try:
            if op in SHAPE_MOVES and op != "Concat" and any(i is not None for i in ins[1:]):
                raise ValueError("indices, bounds or a shape computed from the batch size")
            if op in SHAPE_ELEMENTWISE:
                mask = np.zeros(out, bool) if out is not None else np.zeros((), bool)
                for m in masks:
                    mask = mask | np.broadcast_to(m, mask.shape)
            elif op == "Gather":
                idx = self.const(node, 1)
                mask = np.take(masks[0], idx.astype(np.int64), axis=_attr(node, "axis", 0))
            elif op == "Concat":
                mask = np.concatenate(masks, axis=_attr(node, "axis", 0))
            elif op == "Slice":
                mask = _slice(masks[0], *[self.const(node, i) for i in range(1, 5)])
            else:  # a reshape of a shape value keeps each element
                mask = masks[0].reshape(out)
            if out is not None and mask.shape != tuple(out):
                raise ValueError("shape mismatch")
        except (ValueError, IndexError, TypeError, AotcError, np.exceptions.AxisError):
            mask = np.ones(out or (), bool)  # not followed element by element: all of it depends
        return [Taint(mask)] * len(node.output)

    def iota(self, node: onnx.NodeProto, ins: list) -> list:
        """Sample indices moved, scaled and offset on their way to a Gather (see ``Iota``)."""
        op = node.op_type
        it = ins[0]
        rest = ins[1:]
        if isinstance(it, Iota) and op in ("Shape", "Size"):
            return getattr(self, f"op_{op}")(node, [Batch(it.axis)])
        if isinstance(it, Iota) and op in ("Cast", "Identity"):
            return [it]
        if isinstance(it, Iota) and op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand") and \
                not any(isinstance(i, (Batch, Iota)) for i in rest):
            moved = self.expand(node, Batch(it.axis))[0] if op == "Expand" else self.regroup(node, Batch(it.axis))
            if moved.factor == 1:
                return [Iota(moved.axis, it.stride, it.lo, it.hi)]
        if op in ("Mul", "Add") and len(ins) == 2 and sum(isinstance(i, Iota) for i in ins) == 1 and None in ins:
            k = 0 if isinstance(ins[0], Iota) else 1
            it, other = ins[k], node.input[1 - k]
            c = self.consts.get(other)
            out = self.shape(node, node.output[0])
            axis = len(out) - len(self.shape(node, node.input[k])) + it.axis
            if c is not None and c.size:
                j = axis - (len(out) - c.ndim)
                if not (0 <= j < c.ndim and c.shape[j] != 1):
                    lo, hi = int(c.min()), int(c.max())
                    if op == "Add":
                        return [Iota(axis, it.stride, it.lo + lo, it.hi + hi)]
                    if c.ndim == 0 or c.size == 1:
                        f = int(c.reshape(-1)[0])
                        return [Iota(axis, it.stride * f, min(it.lo * f, it.hi * f), max(it.lo * f, it.hi * f))]
        if op == "Gather" and ins[0] is not None and isinstance(ins[1], Iota):
            return self.op_Gather(node, ins)
        raise self.refuse(node, "uses sample indices (a Range over the batch size) other than to gather "
                                "each sample's own elements")

    def broadcast(self, node: onnx.NodeProto, shape: Taint) -> Batch:
        """A tensor that does not depend on the batch, given a batch-sized axis by an Expand or
        ConstantOfShape whose shape holds the batch size: every sample gets the same data."""
        out = self.shape(node, node.output[0])
        where = np.flatnonzero(shape.mask.reshape(-1))
        if shape.mask.ndim != 1 or len(where) != 1:
            raise self.refuse(node, "makes a shape from the batch size in more than one place")
        axis = len(out) - shape.mask.shape[0] + int(where[0])
        if node.op_type == "Expand":
            src = self.shape(node, node.input[0])
            j = axis - (len(out) - len(src))
            if 0 <= j < len(src) and src[j] != 1:
                raise self.refuse(node, "expands a batch-sized axis")
        if out[axis] != self.size:
            raise self.refuse(node, "makes a shape from the batch size by arithmetic")
        return Batch(axis)

    def expand(self, node: onnx.NodeProto, b: Batch | None) -> list:
        out = self.shape(node, node.output[0])
        if b is None:
            raise self.refuse(node, "expands a tensor to a size computed from the batch size")
        src = self.shape(node, node.input[0])
        axis = len(out) - len(src) + b.axis
        if out[axis] != src[b.axis]:
            raise self.refuse(node, "expands the batch axis")
        return [Batch(axis, b.factor)]

    def batched(self, node: onnx.NodeProto, ins: list) -> list:
        op = node.op_type
        rule = getattr(self, f"op_{op}", None)
        if rule is not None:
            return rule(node, ins)
        if op in ELEMENTWISE:
            return self.elementwise(node, ins)
        if op in BATCH_FIRST:
            if ins[0] is None or ins[0] != Batch(0) or any(i is not None for i in ins[1:]):
                raise self.refuse(node, "does not have the batch on axis 0 of its data input alone")
            if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
                raise self.refuse(node, "returns indices into the whole batch")
            if op == "BatchNormalization" and _attr(node, "training_mode", 0):
                raise self.refuse(node, "computes statistics over the batch (training mode)")
            return [Batch(0)] + [None] * (len(node.output) - 1)
        if op in REDUCE:
            return self.reduce(node, ins)
        raise self.refuse(node, "is an op the batch analysis does not know")

    def elementwise(self, node: onnx.NodeProto, ins: list) -> list:
        out = self.shape(node, node.output[0])
        axis = factor = None
        for name, b in zip(node.input, ins, strict=False):
            if not name:
                continue
            s = self.shape(node, name)
            if isinstance(b, Batch):
                a = len(out) - len(s) + b.axis
                if axis is not None and (a, b.factor) != (axis, factor):
                    raise self.refuse(node, "combines tensors whose batches lie on different axes")
                axis, factor = a, b.factor
        assert axis is not None
        for name, b in zip(node.input, ins, strict=False):
            if name and b is None:
                s = self.shape(node, name)
                j = axis - (len(out) - len(s))
                if 0 <= j < len(s) and s[j] != 1:
                    raise self.refuse(node, f"combines the batch with {name!r}, which has {s[j]} entries along it")
        return [Batch(axis, factor)] * len(node.output)

    def _axis(self, node: onnx.NodeProto, name: str, default: int) -> int:
        rank = len(self.shape(node, node.input[0]))
        a = _attr(node, name, default)
        return a + rank if a < 0 else a

    def op_MatMul(self, node: onnx.NodeProto, ins: list) -> list:
        a, b = ins
        sa, sb = self.shape(node, node.input[0]), self.shape(node, node.input[1])
        out = self.shape(node, node.output[0])
        if len(sa) < 2 or len(sb) < 2:
            raise self.refuse(node, "multiplies a vector")
        res = None
        if isinstance(a, Batch):
            if a.axis == len(sa) - 1:
                raise self.refuse(node, "contracts the batch axis")
            res = Batch(len(out) - len(sa) + a.axis, a.factor)
        if isinstance(b, Batch):
            if b.axis == len(sb) - 2:
                raise self.refuse(node, "contracts the batch axis")
            rb = Batch(len(out) - len(sb) + b.axis, b.factor)
            if res is not None and res != rb:
                raise self.refuse(node, "multiplies tensors whose batches lie on different axes")
            res = rb
        assert res is not None
        for s, x in ((sa, a), (sb, b)):
            if x is None:  # a weight: it must broadcast along a batch dimension, and cannot be rows or columns
                j = res.axis - (len(out) - len(s))
                if res.axis >= len(out) - 2 and j >= len(s) - 2:
                    continue
                if 0 <= j < len(s) and s[j] != 1:
                    raise self.refuse(node, "multiplies the batch by a tensor with a batch-sized dimension")
        return [res]

    def op_Gemm(self, node: onnx.NodeProto, ins: list) -> list:
        a = ins[0]
        if not isinstance(a, Batch) or any(i is not None for i in ins[1:]) or \
                a.axis != (1 if _attr(node, "transA", 0) else 0):
            raise self.refuse(node, "does not have the batch on the rows of A alone")
        if len(node.input) > 2 and node.input[2]:
            c = self.shape(node, node.input[2])
            if len(c) == 2 and c[0] != 1:
                raise self.refuse(node, "adds a C with a batch-sized dimension")
        return [Batch(0, a.factor)]

    def op_Transpose(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        rank = len(self.shape(node, node.input[0]))
        perm = list(_attr(node, "perm", list(range(rank))[::-1]))
        return [Batch(perm.index(b.axis), b.factor)]

    def op_Reshape(self, node: onnx.NodeProto, ins: list) -> list:
        return [self.regroup(node, ins[0])]

    def op_Flatten(self, node: onnx.NodeProto, ins: list) -> list:
        return [self.regroup(node, ins[0])]

    def op_Squeeze(self, node: onnx.NodeProto, ins: list) -> list:
        return [self.regroup(node, ins[0])]

    def op_Unsqueeze(self, node: onnx.NodeProto, ins: list) -> list:
        return [self.regroup(node, ins[0])]

    def regroup(self, node: onnx.NodeProto, b: Batch) -> Batch:
        """Where the batch is after a change of shape that keeps the element order: the axis whose
        prefix product is the input's and whose sample block (factor times the suffix product) is
        the input's."""
        src, out = self.shape(node, node.input[0]), self.shape(node, node.output[0])
        prefix = int(np.prod(src[:b.axis]))
        block = b.factor * int(np.prod(src[b.axis + 1:]))
        for axis in range(len(out)):
            if int(np.prod(out[:axis])) == prefix and out[axis] % self.size == 0:
                factor = out[axis] // self.size
                if factor * int(np.prod(out[axis + 1:])) == block:
                    return Batch(axis, factor)
        raise self.refuse(node, f"reshapes {list(src)} to {list(out)}, which mixes samples")

    def op_Softmax(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        if self.opset >= 13:
            if self._axis(node, "axis", -1) == b.axis:
                raise self.refuse(node, "normalizes along the batch axis")
        elif b.axis >= self._axis(node, "axis", 1):  # opset < 13: the axes from `axis` on are one row
            raise self.refuse(node, "normalizes along the batch axis")
        return [b]

    op_LogSoftmax = op_Softmax
    op_Hardmax = op_Softmax

    def op_LayerNormalization(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        if not isinstance(b, Batch) or any(i is not None for i in ins[1:]) or b.axis >= self._axis(node, "axis", -1):
            raise self.refuse(node, "normalizes along the batch axis")
        return [b] + [None] * (len(node.output) - 1)

    def along(self, node: onnx.NodeProto, ins: list, axis: int) -> list:
        """An op working along ``axis`` of its first input, per position of the others."""
        b = ins[0]
        if not isinstance(b, Batch) or any(i is not None for i in ins[1:]) or axis == b.axis:
            raise self.refuse(node, "works along the batch axis, or takes the batch in a second input")
        return [b] * len(node.output)

    def op_CumSum(self, node: onnx.NodeProto, ins: list) -> list:
        axis = int(self.const(node, 1))
        rank = len(self.shape(node, node.input[0]))
        return self.along(node, ins, axis + rank if axis < 0 else axis)

    def op_TopK(self, node: onnx.NodeProto, ins: list) -> list:
        return self.along(node, ins, self._axis(node, "axis", -1))

    def op_Split(self, node: onnx.NodeProto, ins: list) -> list:
        return self.along(node, ins, self._axis(node, "axis", 0))

    def op_Concat(self, node: onnx.NodeProto, ins: list) -> list:
        axis = self._axis(node, "axis", 0)
        bs = {i for i in ins if i is not None}
        if len(bs) != 1 or any(i is None for i in ins) or next(iter(bs)).axis == axis:
            raise self.refuse(node, "joins along the batch axis, or joins batch tensors with others")
        return [next(iter(bs))]

    def op_Gather(self, node: onnx.NodeProto, ins: list) -> list:
        data, idx = ins
        axis = self._axis(node, "axis", 0)
        if isinstance(data, Batch) and idx is None and axis != data.axis:
            k = len(self.shape(node, node.input[1]))
            return [Batch(data.axis if data.axis < axis else data.axis + k - 1, data.factor)]
        if data is None and isinstance(idx, Batch) and idx.factor == 1:  # an embedding lookup
            return [Batch(axis + idx.axis)]
        if isinstance(data, Batch) and isinstance(idx, Iota) and data.axis == axis == 0 and \
                idx.stride == data.factor and 0 <= idx.lo and idx.hi < data.factor:
            # flat[i * f + r] with r < f: sample i's own element
            return [Batch(idx.axis)]
        raise self.refuse(node, "gathers along the batch axis")

    def op_Slice(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        if any(i is not None for i in ins[1:]):
            raise self.refuse(node, "slices with batch-dependent bounds")
        src, out = self.shape(node, node.input[0]), self.shape(node, node.output[0])
        if src[b.axis] != out[b.axis]:
            raise self.refuse(node, "slices the batch axis")
        axes = self.const(node, 3)
        rank = len(src)
        if axes is not None and any((int(a) + rank) % rank == b.axis for a in axes.reshape(-1)):
            raise self.refuse(node, "slices the batch axis")
        if axes is None and len(self.const(node, 1).reshape(-1)) > b.axis:
            raise self.refuse(node, "slices the batch axis")
        return [b]

    def op_Pad(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        if any(i is not None for i in ins[1:]):
            raise self.refuse(node, "pads by batch-dependent amounts")
        src, out = self.shape(node, node.input[0]), self.shape(node, node.output[0])
        if src[b.axis] != out[b.axis] or len(node.input) > 3 and node.input[3]:
            raise self.refuse(node, "pads the batch axis")
        return [b]

    def op_Tile(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        reps = self.const(node, 1)
        if reps is None or int(reps.reshape(-1)[b.axis]) != 1:
            raise self.refuse(node, "repeats along the batch axis")
        return [b]

    def op_Expand(self, node: onnx.NodeProto, ins: list) -> list:
        return self.expand(node, ins[0])

    def op_Shape(self, node: onnx.NodeProto, ins: list) -> list:
        mask = np.zeros(len(self.shape(node, node.input[0])), bool)
        mask[ins[0].axis] = True
        return [Taint(mask[_attr(node, "start", 0):_attr(node, "end", None)])]

    def op_Size(self, node: onnx.NodeProto, ins: list) -> list:
        return [Taint(np.ones((), bool))]

    def reduce(self, node: onnx.NodeProto, ins: list) -> list:
        b = ins[0]
        rank = len(self.shape(node, node.input[0]))
        if node.op_type in ("ArgMax", "ArgMin"):
            axes = [_attr(node, "axis", 0)]
        elif len(node.input) > 1 and node.input[1]:
            axes = [int(a) for a in self.const(node, 1).reshape(-1)]
        else:
            axes = list(_attr(node, "axes", []))
        axes = [a + rank if a < 0 else a for a in axes]
        if not axes and not _attr(node, "noop_with_empty_axes", 0):
            axes = list(range(rank))
        if b.axis in axes:
            raise self.refuse(node, "reduces over the batch axis")
        keep = _attr(node, "keepdims", 1)
        return [Batch(b.axis if keep else b.axis - sum(a < b.axis for a in axes), b.factor)]


def _attr(node: onnx.NodeProto, name: str, default):  # noqa: ANN202 - an attribute of any type
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _slice(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None,
           steps: np.ndarray | None) -> np.ndarray:
    axes = np.arange(len(starts)) if axes is None else axes
    steps = np.ones(len(starts), np.int64) if steps is None else steps
    index = [slice(None)] * mask.ndim
    for st, en, ax, sp in zip(starts.reshape(-1), ends.reshape(-1), axes.reshape(-1), steps.reshape(-1), strict=True):
        n = mask.shape[int(ax)]
        index[int(ax)] = slice(int(max(min(st, n), -n - 1)), int(max(min(en, n), -n - 1)), int(sp))
    return mask[tuple(index)]


def pinned(model: onnx.ModelProto, inputs: dict[str, int], size: int,
           shapes: dict[str, tuple[int, ...]] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with axis ``inputs[name]`` of each named input set to ``size`` and the
    other inputs' shapes from ``shapes``; outputs' and intermediate shapes left to inference."""
    m = copy.deepcopy(model)
    del m.graph.value_info[:]
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in (shapes or {}):
            given = list(shapes[vi.name])  # type: ignore[index]
            for d, v in zip(dims, given, strict=False):
                d.Clear()
                d.dim_value = v
        if vi.name in inputs:
            dims[inputs[vi.name]].Clear()
            dims[inputs[vi.name]].dim_value = size
    for vi in m.graph.output:
        vi.type.tensor_type.ClearField("shape")
    return m


def _inferred_shapes(model: onnx.ModelProto) -> tuple[dict[str, tuple[int, ...] | None], dict[str, np.ndarray]]:
    """Every tensor's shape in the pinned model, from aotc's own inference (which folds the shape
    arithmetic exporters write, such as PyTorch's Expand targets), else from ONNX's; and the values
    aotc's constant folding computed."""
    from aotc.frontends.onnx import import_onnx
    from aotc.passes.propagate import propagate

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises its own InferenceError and others
        raise AotcError(f"--dynamic: ONNX's shape inference fails on the model with the dimension pinned ({e})"
                        ) from None
    shapes: dict[str, tuple[int, ...] | None] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape") and \
                all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
        else:
            shapes[vi.name] = None
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    graph = import_onnx(model, {}, "probe")
    values = {v.name: v for n in graph.nodes for v in n.outputs if v is not None}
    propagate(graph)
    folded = {}
    for name, v in values.items():
        if v.shape is not None:
            shapes[name] = tuple(int(d) for d in v.shape)
        if v.is_const:
            folded[name] = v.const
    return shapes, folded


def batch_axes(model: onnx.ModelProto, inputs: dict[str, int],
               shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, int]:
    """Check that the dimension on axis ``inputs[name]`` of each named graph input is a batch
    (docs/dynamic_shapes.md) and return the axis it is on in each graph output. Refuses (AotcError)
    a model the analysis cannot prove, naming the node. ``shapes`` pins the other inputs."""
    if model.functions:
        from onnx import inliner

        model = inliner.inline_local_functions(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    found: list[dict[str, Batch | Taint | None]] = []
    for size in PROBE_SIZES:
        m = pinned(model, inputs, size, shapes)
        walk = _Walk(m, *_inferred_shapes(m), size=size, opset=opset)
        for vi in m.graph.input:
            if vi.name not in walk.state:
                walk.state[vi.name] = Batch(inputs[vi.name]) if vi.name in inputs else None
        for node in m.graph.node:
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                raise walk.refuse(node, "holds a subgraph (control flow)")
            walk.node(node)
        found.append(walk.state)
    if found[0] != found[1]:
        moved = next(k for k in found[0] if found[0][k] != found[1].get(k))
        raise AotcError(f"--dynamic: where the batch lies in {moved!r} depends on the batch size (a constant "
                        "shape that fits one size), so the dimension is not a batch aotc can split")
    state = found[0]
    result = {}
    for vi in model.graph.output:
        b = state.get(vi.name)
        if isinstance(b, Taint):
            raise AotcError(f"--dynamic: output {vi.name!r} is computed from the batch size")
        if not isinstance(b, Batch):
            raise AotcError(f"--dynamic: output {vi.name!r} does not depend on the batch: every output must "
                            "have the batch on an axis")
        if b.factor != 1 or b.axis != 0:
            raise AotcError(f"--dynamic: output {vi.name!r} has the batch on axis {b.axis}"
                            f"{f' grouped by {b.factor}' if b.factor != 1 else ''}; it must be the first axis")
        result[vi.name] = b.axis
    return result
