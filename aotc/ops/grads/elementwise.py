"""Gradients of the elementwise ops: each input's cotangent is the output's times the local
derivative, summed back over the axes broadcasting stretched (``GradBuilder.sum_to``)."""

from __future__ import annotations

import math

from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.grads.builder import GradBuilder, Grads, differentiable, rule


def _ins(node: Node) -> list[Value]:
    return [v for v in node.inputs if v is not None]


def _to_inputs(b: GradBuilder, node: Node, needs: list[bool], *grads: Value | None) -> Grads:
    """Each cotangent summed to its input's shape, for the inputs that need one."""
    return [b.sum_to(g, v.shape) if g is not None and need and v is not None else None
            for g, need, v in zip(grads, needs, node.inputs, strict=False)]


@rule("Add")
def _add(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g = dys[0]
    return _to_inputs(b, node, needs, g, g)


@rule("Sub")
def _sub(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g = dys[0]
    assert g is not None
    return _to_inputs(b, node, needs, g, b.neg(g) if needs[1] else None)


@rule("Mul")
def _mul(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g, (x, y) = dys[0], node.inputs
    assert g is not None and x is not None and y is not None
    return _to_inputs(b, node, needs, b.mul(g, y) if needs[0] else None, b.mul(g, x) if needs[1] else None)


@rule("Div")
def _div(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g, (_, y), out = dys[0], node.inputs, node.outputs[0]
    assert g is not None and y is not None
    gx = b.div(g, y)
    return _to_inputs(b, node, needs, gx, b.neg(b.mul(gx, out)) if needs[1] else None)


@rule("Sum")
def _sum(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return _to_inputs(b, node, needs, *[dys[0]] * len(node.inputs))


@rule("Mean")
def _mean(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g = dys[0]
    assert g is not None
    return _to_inputs(b, node, needs, *[b.scale(g, 1 / len(node.inputs))] * len(node.inputs))


@rule("Pow")
def _pow(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g, (x, e), y = dys[0], node.inputs, node.outputs[0]
    assert g is not None and x is not None and e is not None
    gx = ge = None
    if needs[0]:
        if e.is_const and e.size == 1:  # x ** k: k * x ** (k - 1), without a Pow where k - 1 is 0 or 1
            k = float(e.const.reshape(-1)[0])
            local = b.scalar(k, x) if k == 1 else b.scale(x, k) if k == 2 else \
                b.scale(b.op("Pow", x, b.const(k - 1, e.dtype)), k)
        else:
            local = b.mul(b.op("Cast", e, to=dtypes.onnx_type(x.dtype)) if e.dtype != x.dtype else e,
                          b.op("Pow", x, b.sub(e, b.scalar(1, e))))
        gx = b.mul(g, local)
    if needs[1]:
        ge = b.mul(b.mul(g, y), b.op("Log", x))
        if ge.dtype != e.dtype:
            ge = b.op("Cast", ge, to=dtypes.onnx_type(e.dtype))
    return _to_inputs(b, node, needs, gx, ge)


def _where_zero(b: GradBuilder, cond: Value, g: Value, keep_when: bool = True) -> Value:
    zero = b.scalar(0, g)
    return b.op("Where", cond, g, zero) if keep_when else b.op("Where", cond, zero, g)


@rule("Where")
def _where(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g, c = dys[0], node.inputs[0]
    assert g is not None and c is not None
    return _to_inputs(b, node, needs, None, _where_zero(b, c, g) if needs[1] else None,
                      _where_zero(b, c, g, keep_when=False) if needs[2] else None)


@rule("Max", "Min")
def _max_min(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """The cotangent goes to the input that won (the first of equal ones, as PyTorch's max does not
    promise more)."""
    g, out = dys[0], node.outputs[0]
    assert g is not None
    grads: Grads = []
    taken: Value | None = None  # where an earlier input already took the cotangent
    for v, need in zip(node.inputs, needs, strict=True):
        assert v is not None
        won = b.op("Equal", v, out)
        if taken is not None:
            won = b.op("And", won, b.op("Not", taken))
        grads.append(_where_zero(b, won, g) if need else None)
        taken = won if taken is None else b.op("Or", taken, won)
    return _to_inputs(b, node, needs, *grads)


def _unary(op: str):
    """Register a one-input rule: ``local(b, x, y, g)`` returns the input's cotangent."""
    def wrap(local):
        @rule(op)
        def grad(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
            g, x = dys[0], node.inputs[0]
            assert g is not None and x is not None
            return [local(b, node, x, node.outputs[0], g), *[None] * (len(node.inputs) - 1)]
        return local
    return wrap


def _times(derivative: str):
    """The rule of an op whose derivative is the op ``derivative`` of the same input."""
    return lambda b, node, x, y, g: b.mul(g, b.op(derivative, x))


for _op, _derivative in {"Abs": "Sign", "Softplus": "Sigmoid", "Sin": "Cos", "Sinh": "Cosh", "Cosh": "Sinh"}.items():
    _unary(_op)(_times(_derivative))


@_unary("Neg")
def _neg(b, node, x, y, g):
    return b.neg(g)


@_unary("Identity")
def _identity(b, node, x, y, g):
    return g


@_unary("Relu")
def _relu(b, node, x, y, g):
    return _where_zero(b, b.op("Greater", y, b.scalar(0, y)), g)


@_unary("LeakyRelu")
def _leaky_relu(b, node, x, y, g):
    return b.op("Where", b.op("Greater", x, b.scalar(0, x)), g, b.scale(g, float(node.attr("alpha", 0.01))))


@_unary("Sigmoid")
def _sigmoid(b, node, x, y, g):
    return b.mul(g, b.mul(y, b.sub(b.scalar(1, y), y)))


@_unary("Tanh")
def _tanh(b, node, x, y, g):
    return b.mul(g, b.sub(b.scalar(1, y), b.mul(y, y)))


@_unary("Exp")
def _exp(b, node, x, y, g):
    return b.mul(g, y)


@_unary("Log")
def _log(b, node, x, y, g):
    return b.div(g, x)


@_unary("Sqrt")
def _sqrt(b, node, x, y, g):
    return b.div(b.scale(g, 0.5), y)


@_unary("Reciprocal")
def _reciprocal(b, node, x, y, g):
    return b.neg(b.mul(g, b.mul(y, y)))


@_unary("Erf")
def _erf(b, node, x, y, g):
    return b.mul(g, b.scale(b.op("Exp", b.neg(b.mul(x, x))), 2 / math.sqrt(math.pi)))


@_unary("Gelu")
def _gelu(b, node, x, y, g):
    if node.attr("approximate", "none") == "tanh":  # y = x/2 (1 + tanh(u)), u = c (x + 0.044715 x^3)
        c = math.sqrt(2 / math.pi)
        x2 = b.mul(x, x)
        t = b.op("Tanh", b.scale(b.mul(x, b.add(b.scalar(1, x), b.scale(x2, 0.044715))), c))
        du = b.scale(b.add(b.scalar(1, x), b.scale(x2, 3 * 0.044715)), c)
        one = b.scalar(1, x)
        local = b.scale(b.add(b.add(one, t), b.mul(b.mul(x, b.sub(one, b.mul(t, t))), du)), 0.5)
    else:  # Phi(x) + x phi(x)
        cdf = b.scale(b.add(b.scalar(1, x), b.op("Erf", b.scale(x, 1 / math.sqrt(2)))), 0.5)
        pdf = b.scale(b.op("Exp", b.scale(b.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        local = b.add(cdf, b.mul(x, pdf))
    return b.mul(g, local)


@_unary("Clip")
def _clip(b, node, x, y, g):
    inside = b.op("Equal", x, y)  # clipped elements (x outside [min, max]) have y != x
    return _where_zero(b, inside, g)


@_unary("Cast")
def _cast(b, node, x, y, g):
    if not differentiable(x):
        return None
    return g if g.dtype == x.dtype else b.op("Cast", g, to=dtypes.onnx_type(x.dtype))


def _positive(b: GradBuilder, x: Value) -> Value:
    return b.op("Greater", x, b.scalar(0, x))


@rule("PRelu")
def _prelu(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g, (x, slope) = dys[0], node.inputs
    assert g is not None and x is not None and slope is not None
    pos = b.op("Less", x, b.scalar(0, x))  # the kernel's test: x < 0 takes the slope
    gx = b.op("Where", pos, b.mul(g, slope), g) if needs[0] else None
    gs = _where_zero(b, pos, b.mul(g, x)) if needs[1] else None
    return _to_inputs(b, node, needs, gx, gs)


@_unary("Elu")
def _elu(b, node, x, y, g):  # below zero y' = y + alpha
    alpha = float(node.attr("alpha", 1.0))
    return b.op("Where", b.op("Less", x, b.scalar(0, x)), b.mul(g, b.add(y, b.scalar(alpha, y))), g)


@_unary("Selu")
def _selu(b, node, x, y, g):  # gamma above zero, y + gamma alpha at or below
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))
    return b.op("Where", _positive(b, x), b.scale(g, gamma), b.mul(g, b.add(y, b.scalar(gamma * alpha, y))))


@_unary("Celu")
def _celu(b, node, x, y, g):  # below zero y' = exp(x / alpha) = y / alpha + 1
    alpha = float(node.attr("alpha", 1.0))
    return b.op("Where", b.op("Less", x, b.scalar(0, x)), b.mul(g, b.add(b.scale(y, 1 / alpha), b.scalar(1, y))), g)


@_unary("HardSigmoid")
def _hard_sigmoid(b, node, x, y, g):
    inside = b.op("And", _positive(b, y), b.op("Less", y, b.scalar(1, y)))
    return _where_zero(b, inside, b.scale(g, float(node.attr("alpha", 0.2))))


@_unary("HardSwish")
def _hard_swish(b, node, x, y, g):  # x / 3 + 1/2 on (-3, 3), 1 above, 0 below
    local = b.add(b.scale(x, 1 / 3), b.scalar(0.5, x))
    local = b.op("Where", b.op("Greater", x, b.scalar(3, x)), b.scalar(1, x), local)
    return b.mul(g, b.op("Where", b.op("Less", x, b.scalar(-3, x)), b.scalar(0, x), local))


@_unary("Softsign")
def _softsign(b, node, x, y, g):
    d = b.add(b.scalar(1, x), b.op("Abs", x))
    return b.div(g, b.mul(d, d))


@_unary("Cos")
def _cos(b, node, x, y, g):
    return b.neg(b.mul(g, b.op("Sin", x)))


@_unary("Swish")
def _swish(b, node, x, y, g):  # s + alpha x s (1 - s) with s = sigmoid(alpha x)
    alpha = float(node.attr("alpha", 1.0))
    s = b.op("Sigmoid", b.scale(x, alpha))
    return b.mul(g, b.add(s, b.mul(b.scale(y, alpha), b.sub(b.scalar(1, s), s))))


@_unary("Mish")
def _mish(b, node, x, y, g):  # t + x sigmoid(x) (1 - t^2) with t = tanh(softplus(x))
    t = b.op("Tanh", b.op("Softplus", x))
    return b.mul(g, b.add(t, b.mul(b.mul(x, b.op("Sigmoid", x)), b.sub(b.scalar(1, t), b.mul(t, t)))))


@rule("Sign", "Floor", "Ceil", "Round", "Hardmax")
def _flat(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Piecewise constant: no gradient (zeros, as PyTorch gives)."""
    return [None]


def _one_minus_square(b: GradBuilder, x: Value) -> Value:
    return b.sub(b.scalar(1, x), b.mul(x, x))


@_unary("Tan")
def _tan(b, node, x, y, g):
    return b.mul(g, b.add(b.scalar(1, y), b.mul(y, y)))


@_unary("Asin")
def _asin(b, node, x, y, g):
    return b.div(g, b.op("Sqrt", _one_minus_square(b, x)))


@_unary("Acos")
def _acos(b, node, x, y, g):
    return b.neg(b.div(g, b.op("Sqrt", _one_minus_square(b, x))))


@_unary("Atan")
def _atan(b, node, x, y, g):
    return b.div(g, b.add(b.scalar(1, x), b.mul(x, x)))


@_unary("Asinh")
def _asinh(b, node, x, y, g):
    return b.div(g, b.op("Sqrt", b.add(b.mul(x, x), b.scalar(1, x))))


@_unary("Acosh")
def _acosh(b, node, x, y, g):
    return b.div(g, b.op("Sqrt", b.sub(b.mul(x, x), b.scalar(1, x))))


@_unary("Atanh")
def _atanh(b, node, x, y, g):
    return b.div(g, _one_minus_square(b, x))


@_unary("ThresholdedRelu")
def _thresholded_relu(b, node, x, y, g):
    return _where_zero(b, b.op("Greater", x, b.scalar(float(node.attr("alpha", 1.0)), x)), g)


@_unary("Shrink")
def _shrink(b, node, x, y, g):  # slope 1 outside [-lambd, lambd], as the kernel's tests
    lambd = b.scalar(float(node.attr("lambd", 0.5)), x)
    return _where_zero(b, b.op("Or", b.op("Less", x, b.neg(lambd)), b.op("Greater", x, lambd)), g)
