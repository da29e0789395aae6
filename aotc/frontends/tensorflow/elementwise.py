"""Elementwise TF ops: activations, arithmetic, comparisons, Cast and Select."""

from __future__ import annotations

import numpy as np

from aotc.frontends.tensorflow.context import Ctx, tf_op
from aotc.frontends.tensorflow.tensors import to_numpy
from aotc.ir import dtypes
from aotc.ir.graph import Value

# TF op -> the ONNX op with the same semantics (TF's broadcasting is numpy's, as is ONNX's).
_SAME = {
    "Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Softplus": "Softplus", "Erf": "Erf", "Sqrt": "Sqrt",
    "Exp": "Exp", "Log": "Log", "Neg": "Neg", "Abs": "Abs", "Elu": "Elu", "Selu": "Selu", "Floor": "Floor",
    "Ceil": "Ceil", "Sign": "Sign", "Sin": "Sin", "Cos": "Cos", "Reciprocal": "Reciprocal", "Inv": "Reciprocal",
    "LogicalNot": "Not",
    "Add": "Add", "AddV2": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div", "Maximum": "Max",
    "Minimum": "Min", "Pow": "Pow", "Greater": "Greater", "GreaterEqual": "GreaterOrEqual", "Less": "Less",
    "LessEqual": "LessOrEqual", "Equal": "Equal", "LogicalAnd": "And", "LogicalOr": "Or", "AddN": "Sum",
}


def _same(ctx: Ctx) -> Value:
    return ctx.emit(_SAME[ctx.op_type], [ctx.x(i) for i in range(len(ctx.inputs))])


for _name in _SAME:
    tf_op(_name)(_same)


# A variable's value is the variable (a constant, or an input when fed): reading it is the identity.
@tf_op("Identity", "Snapshot", "StopGradient", "PreventGradient", "ReadVariableOp")
def identity(ctx: Ctx) -> Value:
    return ctx.x(0)


@tf_op("IdentityN")
def identity_n(ctx: Ctx) -> list[Value]:
    return list(ctx.inputs)


@tf_op("NotEqual")
def not_equal(ctx: Ctx) -> Value:
    return ctx.emit("Not", [ctx.emit("Equal", [ctx.x(0), ctx.x(1)])])


@tf_op("Rsqrt")
def rsqrt(ctx: Ctx) -> Value:
    return ctx.emit("Reciprocal", [ctx.emit("Sqrt", [ctx.x(0)])])


@tf_op("Square")
def square(ctx: Ctx) -> Value:
    return ctx.emit("Mul", [ctx.x(0), ctx.x(0)])


@tf_op("SquaredDifference")
def squared_difference(ctx: Ctx) -> Value:
    d = ctx.emit("Sub", [ctx.x(0), ctx.x(1)])
    return ctx.emit("Mul", [d, d])


@tf_op("FloorDiv")
def floor_div(ctx: Ctx) -> Value:
    a, b = ctx.x(0), ctx.x(1)
    if np.dtype(a.dtype).kind == "f":
        return ctx.emit("Floor", [ctx.emit("Div", [a, b])])
    # Integers: a - floormod(a, b) is a multiple of b, so the truncating Div is exact.
    return ctx.emit("Div", [ctx.emit("Sub", [a, ctx.emit("Mod", [a, b], fmod=0)]), b])


@tf_op("FloorMod")
def floor_mod(ctx: Ctx) -> Value:
    a, b = ctx.x(0), ctx.x(1)
    if np.dtype(a.dtype).kind != "f":
        return ctx.emit("Mod", [a, b], fmod=0)
    q = ctx.emit("Floor", [ctx.emit("Div", [a, b])])
    return ctx.emit("Sub", [a, ctx.emit("Mul", [q, b])])


@tf_op("LeakyRelu")
def leaky_relu(ctx: Ctx) -> Value:
    return ctx.emit("LeakyRelu", [ctx.x(0)], alpha=float(ctx.attr("alpha", 0.2)))


@tf_op("Relu6")
def relu6(ctx: Ctx) -> Value:
    x = ctx.x(0)
    return ctx.emit("Clip", [x, ctx.const(0, x.dtype), ctx.const(6, x.dtype)])


@tf_op("Softmax", "LogSoftmax")
def softmax(ctx: Ctx) -> Value:
    return ctx.emit(ctx.op_type, [ctx.x(0)], axis=-1)


@tf_op("Cast")
def cast(ctx: Ctx) -> Value:
    to = to_numpy(ctx.attr("DstT"), f"Cast node {ctx.name!r}: attribute DstT")
    return ctx.emit("Cast", [ctx.x(0)], to=dtypes.onnx_type(to))


@tf_op("SelectV2")
def select_v2(ctx: Ctx) -> Value:
    return ctx.emit("Where", [ctx.x(0), ctx.x(1), ctx.x(2)])


@tf_op("Select")
def select(ctx: Ctx) -> Value:
    c, x = ctx.x(0), ctx.x(1)
    if len(c.shape) == 1 and len(x.shape) > 1:  # a vector condition picks whole rows
        c = ctx.reshape(c, [c.shape[0], *[1] * (len(x.shape) - 1)])
    elif c.shape != x.shape:
        raise ctx.error(f"condition of shape {list(c.shape)} for values of shape {list(x.shape)}")
    return ctx.emit("Where", [c, x, ctx.x(2)])


@tf_op("BiasAdd", "BiasAddV1")
def bias_add(ctx: Ctx) -> Value:
    x, b = ctx.x(0), ctx.x(1)
    if ctx.attr("data_format", "NHWC").startswith("NC") and len(x.shape) > 2:
        b = ctx.reshape(b, [b.shape[0], *[1] * (len(x.shape) - 2)])
    return ctx.emit("Add", [x, b])


@tf_op("Erfc")
def erfc(ctx: Ctx) -> Value:
    # Keras' exact gelu is 0.5 * x * erfc(-x / sqrt(2)); 1 - erf loses only digits erfc has below
    # float32's epsilon of 1.
    x = ctx.x(0)
    return ctx.emit("Sub", [ctx.const(1, x.dtype), ctx.emit("Erf", [x])])
