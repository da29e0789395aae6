"""Matrix products, convolutions, pooling, batch normalization and reductions.

TF's image ops are NHWC; aotc's Conv and pools are ONNX's NCHW, so a translation transposes around
them (the layout pass, aotc/passes/layout.py, moves those transposes through the ops between two such
ops until they cancel) and the filters are put in ONNX's layout once, here.
"""

from __future__ import annotations

import numpy as np

from aotc.frontends.tensorflow.context import Ctx, tf_op
from aotc.frontends.tensorflow.tensors import to_numpy
from aotc.ir import dtypes
from aotc.ir.graph import Value

_TO_NCHW, _TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


@tf_op("MatMul")
def matmul(ctx: Ctx) -> Value:
    a, b = ctx.x(0), ctx.x(1)
    if ctx.attr("transpose_a", False):
        a = ctx.transpose(a, [1, 0])
    if ctx.attr("transpose_b", False):
        b = ctx.transpose(b, [1, 0])
    return ctx.emit("MatMul", [a, b])


@tf_op("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def batch_matmul(ctx: Ctx) -> Value:
    a, b = ctx.x(0), ctx.x(1)
    out_type = ctx.attr("Tout", None)
    if out_type is not None and ctx.attr("Ta", out_type) != out_type:
        raise ctx.error("an output type other than the input type is not supported")

    def adjoint(v: Value) -> Value:
        r = len(v.shape)
        return ctx.transpose(v, [*range(r - 2), r - 1, r - 2])
    if ctx.attr("adj_x", False):
        a = adjoint(a)
    if ctx.attr("adj_y", False):
        b = adjoint(b)
    return ctx.emit("MatMul", [a, b])


def _channels_last(ctx: Ctx) -> bool:
    fmt = ctx.attr("data_format", "NHWC")
    if fmt not in ("NHWC", "NCHW"):
        raise ctx.error(f"data_format {fmt!r} is not supported (NHWC or NCHW)")
    return fmt == "NHWC"


def _spatial(ctx: Ctx, key: str, nhwc: bool, default: list[int] | None = None) -> list[int]:
    """The two spatial entries of a 4-entry attribute given in the data format's order."""
    v = [int(a) for a in ctx.attr(key, default)]
    if len(v) != 4:
        raise ctx.error(f"attribute {key} must have 4 entries, has {v}")
    outer = (v[0], v[3]) if nhwc else (v[0], v[1])
    if outer != (1, 1):
        raise ctx.error(f"attribute {key} {v}: only the spatial dimensions may differ from 1")
    return v[1:3] if nhwc else v[2:4]


def _pads(ctx: Ctx, nhwc: bool, size: list[int], kernel: list[int], strides: list[int],
          dilations: list[int]) -> list[int]:
    """ONNX pads [top, left, bottom, right] for TF's padding attribute: SAME puts the odd pixel at the
    end, EXPLICIT lists (before, after) pairs for all four dimensions in the data format's order."""
    padding = ctx.attr("padding")
    if padding == "VALID":
        return [0, 0, 0, 0]
    if padding == "SAME":
        begin, end = [], []
        for n, k, s, d in zip(size, kernel, strides, dilations, strict=True):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            begin.append(total // 2)
            end.append(total - total // 2)
        return begin + end
    if padding == "EXPLICIT":
        p = [int(a) for a in ctx.attr("explicit_paddings")]
        if len(p) != 8 or min(p) < 0:
            raise ctx.error(f"explicit_paddings {p} must be 8 values >= 0")
        h, w = (1, 2) if nhwc else (2, 3)
        if p[0:2] != [0, 0] or p[6 if nhwc else 2:8 if nhwc else 4] != [0, 0]:
            raise ctx.error(f"explicit_paddings {p}: only the spatial dimensions may be padded")
        return [p[2 * h], p[2 * w], p[2 * h + 1], p[2 * w + 1]]
    raise ctx.error(f"padding {padding!r} is not supported (SAME, VALID or EXPLICIT)")


def _nchw_op(ctx: Ctx, x: Value, nhwc: bool, op: str, extra: list[Value], **attrs: object) -> Value:
    if len(x.shape) != 4:
        raise ctx.error(f"input of rank {len(x.shape)}, expected 4")
    y = ctx.emit(op, [ctx.transpose(x, _TO_NCHW) if nhwc else x, *extra], **attrs)
    return ctx.transpose(y, _TO_NHWC) if nhwc else y


@tf_op("Conv2D")
def conv2d(ctx: Ctx) -> Value:
    x, w = ctx.x(0), ctx.x(1)  # w: [kh, kw, in / groups, out]
    nhwc = _channels_last(ctx)
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ctx.error(f"input rank {len(x.shape)} and filter rank {len(w.shape)}, expected 4 and 4")
    strides, dilations = _spatial(ctx, "strides", nhwc), _spatial(ctx, "dilations", nhwc, [1, 1, 1, 1])
    size = list(x.shape[1:3] if nhwc else x.shape[2:4])
    channels = x.shape[3 if nhwc else 1]
    if w.shape[2] == 0 or channels % w.shape[2]:
        raise ctx.error(f"input channels {channels} are not a multiple of the filter's {w.shape[2]}")
    pads = _pads(ctx, nhwc, size, list(w.shape[:2]), strides, dilations)
    return _nchw_op(ctx, x, nhwc, "Conv", [ctx.transpose(w, [3, 2, 0, 1])], strides=strides,
                    dilations=dilations, pads=pads, group=channels // w.shape[2], kernel_shape=list(w.shape[:2]))


@tf_op("DepthwiseConv2dNative")
def depthwise_conv2d(ctx: Ctx) -> Value:
    x, w = ctx.x(0), ctx.x(1)  # w: [kh, kw, in, multiplier]; output channel c * multiplier + m
    nhwc = _channels_last(ctx)
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ctx.error(f"input rank {len(x.shape)} and filter rank {len(w.shape)}, expected 4 and 4")
    kh, kw, cin, mult = w.shape
    if x.shape[3 if nhwc else 1] != cin:
        raise ctx.error(f"input has {x.shape[3 if nhwc else 1]} channels, the filter {cin}")
    strides, dilations = _spatial(ctx, "strides", nhwc), _spatial(ctx, "dilations", nhwc, [1, 1, 1, 1])
    size = list(x.shape[1:3] if nhwc else x.shape[2:4])
    pads = _pads(ctx, nhwc, size, [kh, kw], strides, dilations)
    weight = ctx.reshape(ctx.transpose(w, [2, 3, 0, 1]), [cin * mult, 1, kh, kw])
    return _nchw_op(ctx, x, nhwc, "Conv", [weight], strides=strides, dilations=dilations, pads=pads,
                    group=cin, kernel_shape=[kh, kw])


@tf_op("MaxPool", "AvgPool")
def pool(ctx: Ctx) -> Value:
    x = ctx.x(0)
    nhwc = _channels_last(ctx)
    if len(x.shape) != 4:
        raise ctx.error(f"input of rank {len(x.shape)}, expected 4")
    kernel, strides = _spatial(ctx, "ksize", nhwc), _spatial(ctx, "strides", nhwc)
    size = list(x.shape[1:3] if nhwc else x.shape[2:4])
    pads = _pads(ctx, nhwc, size, kernel, strides, [1, 1])
    # TF's average leaves the padding out of the count, as ONNX's count_include_pad=0 does.
    op = "MaxPool" if ctx.op_type == "MaxPool" else "AveragePool"
    return _nchw_op(ctx, x, nhwc, op, [], kernel_shape=kernel, strides=strides, pads=pads)


@tf_op("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def fused_batch_norm(ctx: Ctx) -> Value:
    if ctx.attr("is_training", True):
        raise ctx.error("is_training=true normalizes with the batch's statistics (a training graph); "
                        "export the model for inference")
    x, scale, offset, mean, var = (ctx.x(i) for i in range(5))
    # y = x * s + (offset - mean * s) with s = scale / sqrt(var + epsilon): folded when constant.
    eps = ctx.const(float(ctx.attr("epsilon", 1e-4)), var.dtype)
    s = ctx.emit("Mul", [scale, ctx.emit("Reciprocal", [ctx.emit("Sqrt", [ctx.emit("Add", [var, eps])])])])
    shift = ctx.emit("Sub", [offset, ctx.emit("Mul", [mean, s])])
    if not _channels_last(ctx):
        s, shift = (ctx.reshape(v, [v.shape[0], *[1] * (len(x.shape) - 2)]) for v in (s, shift))
    if s.dtype != x.dtype:  # float16 activations with float32 statistics
        s, shift = (ctx.emit("Cast", [v], to=dtypes.onnx_type(x.dtype)) for v in (s, shift))
    return ctx.emit("Add", [ctx.emit("Mul", [x, s]), shift])


_REDUCE = {"Sum": "ReduceSum", "Mean": "ReduceMean", "Max": "ReduceMax", "Min": "ReduceMin", "Prod": "ReduceProd"}


@tf_op(*_REDUCE)
def reduce(ctx: Ctx) -> Value:
    x = ctx.x(0)
    axes = [ctx.axis(a, len(x.shape)) for a in ctx.ints(1, "reduction_indices")]
    # TF reduces nothing for empty axes; ONNX would reduce everything without noop_with_empty_axes.
    return ctx.emit(_REDUCE[ctx.op_type], [x, ctx.const(np.array(axes, np.int64))],
                    keepdims=int(bool(ctx.attr("keep_dims", False))), noop_with_empty_axes=1)


@tf_op("ArgMax", "ArgMin")
def arg_max(ctx: Ctx) -> Value:
    x = ctx.x(0)
    (axis, *rest) = ctx.ints(1, "dimension") or [None]
    if axis is None or rest:
        raise ctx.error("dimension must be one axis")
    y = ctx.emit(ctx.op_type, [x], axis=ctx.axis(axis, len(x.shape)), keepdims=0)
    out = to_numpy(ctx.attr("output_type", 9), f"{ctx.op_type} node {ctx.name!r}: attribute output_type")
    return y if out == np.int64 else ctx.emit("Cast", [y], to=dtypes.onnx_type(out))


@tf_op("Conv2DBackpropInput")
def conv2d_transpose(ctx: Ctx) -> Value:
    """The gradient of a Conv2D with respect to its input (Keras' Conv2DTranspose): ONNX's
    ConvTranspose with the forward convolution's pads, and output_padding for what they do not
    reach of ``input_sizes``."""
    sizes = ctx.ints(0, "input_sizes")
    w, dy = ctx.x(1), ctx.x(2)  # w: [kh, kw, in (of the forward conv: our output), out (our input)]
    nhwc = _channels_last(ctx)
    if len(sizes) != 4 or len(w.shape) != 4 or len(dy.shape) != 4:
        raise ctx.error(f"input_sizes {sizes}, filter rank {len(w.shape)} and input rank {len(dy.shape)}: expected "
                        "4 entries and ranks 4")
    channels = (sizes[3], dy.shape[3]) if nhwc else (sizes[1], dy.shape[1])
    if (w.shape[2], w.shape[3]) != channels:
        raise ctx.error(f"filter of shape {list(w.shape)} for {channels[1]} input and {channels[0]} output channels")
    strides, dilations = _spatial(ctx, "strides", nhwc), _spatial(ctx, "dilations", nhwc, [1, 1, 1, 1])
    size = list(sizes[1:3] if nhwc else sizes[2:4])
    kernel = list(w.shape[:2])
    pads = _pads(ctx, nhwc, size, kernel, strides, dilations)
    extra = []
    for i in range(2):
        n = (dy.shape[1:3] if nhwc else dy.shape[2:4])[i]
        full = strides[i] * (n - 1) + (kernel[i] - 1) * dilations[i] + 1 - pads[i] - pads[i + 2]
        extra.append(size[i] - full)
        if not 0 <= extra[i] < max(strides[i], dilations[i]):
            raise ctx.error(f"input_sizes {sizes} do not fit an input of shape {list(dy.shape)} with strides "
                            f"{strides} and padding {ctx.attr('padding')}")
    return _nchw_op(ctx, dy, nhwc, "ConvTranspose", [ctx.transpose(w, [3, 2, 0, 1])], strides=strides,
                    dilations=dilations, pads=pads, output_padding=extra, kernel_shape=kernel, group=1)


@tf_op("Einsum")
def einsum(ctx: Ctx) -> Value:
    """A one- or two-operand einsum without repeated or broadcast letters (all of Keras' EinsumDense
    and MultiHeadAttention) as Transpose, ReduceSum, Reshape and one MatMul, which the GEMM kernels
    run; any other as ONNX's Einsum, a plain loop nest."""
    eq = str(ctx.attr("equation")).replace(" ", "")
    xs = [ctx.x(i) for i in range(len(ctx.inputs))]
    terms = _einsum_terms(eq, xs)
    if terms is None:
        return ctx.emit("Einsum", xs, equation=eq)
    ins, out = terms
    size = {c: d for t, x in zip(ins, xs, strict=True) for c, d in zip(t, x.shape, strict=True)}

    def prepare(x: Value, t: str, other: str) -> tuple[Value, str]:
        """Sum the letters nobody else has, then order as batch, own, contracted."""
        alone = [i for i, c in enumerate(t) if c not in out and c not in other]
        if alone:
            x = ctx.emit("ReduceSum", [x, ctx.const(np.array(alone, np.int64))], keepdims=0)
        return x, "".join(c for c in t if c in out or c in other)

    if len(xs) == 1:
        x, t = prepare(xs[0], ins[0], "")
        return ctx.transpose(x, [t.index(c) for c in out])
    (a, ta), (b, tb) = prepare(xs[0], ins[0], ins[1]), prepare(xs[1], ins[1], ins[0])
    batch = [c for c in out if c in ta and c in tb]
    left = [c for c in out if c in ta and c not in tb]
    right = [c for c in out if c in tb and c not in ta]
    inner = [c for c in ta if c in tb and c not in out]
    n = {k: int(np.prod([size[c] for c in v], dtype=np.int64)) for k, v in
         (("b", batch), ("l", left), ("r", right), ("k", inner))}
    lead = [n["b"]] if batch else []
    a = ctx.reshape(ctx.transpose(a, [ta.index(c) for c in batch + left + inner]), lead + [n["l"], n["k"]])
    b = ctx.reshape(ctx.transpose(b, [tb.index(c) for c in batch + inner + right]), lead + [n["k"], n["r"]])
    y = ctx.reshape(ctx.emit("MatMul", [a, b]), [size[c] for c in batch + left + right])
    got = batch + left + right
    return ctx.transpose(y, [got.index(c) for c in out])


def _einsum_terms(eq: str, xs: list[Value]) -> tuple[list[str], str] | None:
    """The input terms and output term of ``eq`` with the ellipsis spelled out as letters, or None
    where the MatMul form does not apply."""
    lhs, arrow, out = eq.partition("->")
    ins = lhs.split(",")
    if not arrow or len(ins) != len(xs) or len(xs) > 2:
        return None
    spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in eq)
    ell_rank = max((len(x.shape) - len(t) + 3 for t, x in zip(ins, xs, strict=True) if "..." in t), default=0)
    ell = "".join(next(spare) for _ in range(ell_rank))
    spelled = []
    for t, x in zip(ins, xs, strict=True):
        if "..." in t:
            t = t.replace("...", ell[ell_rank - (len(x.shape) - len(t) + 3):])
        if len(t) != len(x.shape) or len(set(t)) != len(t):
            return None
        spelled.append(t)
    out = out.replace("...", ell)
    sizes: dict[str, int] = {}
    for t, x in zip(spelled, xs, strict=True):
        for c, d in zip(t, x.shape, strict=True):
            if sizes.setdefault(c, d) != d:
                return None  # broadcast letters: left to the Einsum loop
    if len(set(out)) != len(out) or any(c not in sizes for c in out):
        return None
    return spelled, out


@tf_op("TopKV2", "TopK")
def top_k(ctx: Ctx) -> list[Value]:
    x = ctx.x(0)
    (k,) = ctx.ints(1, "k") if ctx.op_type == "TopKV2" else [int(ctx.attr("k"))]
    if not x.shape or not 0 <= k <= x.shape[-1]:
        raise ctx.error(f"k={k} is out of range for an input of shape {list(x.shape)}")
    # Sorted whether or not TF's sorted asks for it: any order is TF's contract then.
    values, indices = ctx.emit_n("TopK", [x, ctx.const(np.array([k], np.int64))], 2, axis=-1, largest=1, sorted=1)
    out = to_numpy(ctx.attr("index_type", 3), f"{ctx.op_type} node {ctx.name!r}: attribute index_type")
    return [values, indices if out == np.int64 else ctx.emit("Cast", [indices], to=dtypes.onnx_type(out))]


@tf_op("Cumsum")
def cumsum(ctx: Ctx) -> Value:
    x = ctx.x(0)
    (axis,) = ctx.ints(1, "axis")
    return ctx.emit("CumSum", [x, ctx.const(np.array(ctx.axis(axis, len(x.shape)), np.int64))],
                    exclusive=int(bool(ctx.attr("exclusive", False))), reverse=int(bool(ctx.attr("reverse", False))))


@tf_op("ResizeBilinear", "ResizeNearestNeighbor")
def resize(ctx: Ctx) -> Value:
    """NHWC images resized along H and W by ONNX's Resize, whose coordinate modes cover TF's three:
    align_corners, half_pixel_centers (nearest: rounding half up of (i + 0.5) * scale - 0.5, which
    is TF's floor((i + 0.5) * scale)) and neither (legacy: i * scale, nearest rounding down)."""
    x = ctx.x(0)
    size = ctx.ints(1, "size")
    if len(x.shape) != 4 or len(size) != 2 or min(size) < 1:
        raise ctx.error(f"size {size} for images of shape {list(x.shape)}: expected 4-D images and 2 sizes >= 1")
    corners, half = bool(ctx.attr("align_corners", False)), bool(ctx.attr("half_pixel_centers", False))
    if corners and half:
        raise ctx.error("align_corners and half_pixel_centers cannot both be true")
    mode = "align_corners" if corners else "half_pixel" if half else "asymmetric"
    nearest = ctx.op_type == "ResizeNearestNeighbor"
    if not nearest and x.dtype != np.float32:  # TF's bilinear output is float32 whatever the input
        x = ctx.emit("Cast", [x], to=dtypes.onnx_type(np.dtype(np.float32)))
    sizes = ctx.const(np.array([x.shape[0], *size, x.shape[3]], np.int64))
    extra = {"nearest_mode": "floor" if mode == "asymmetric" else "round_prefer_ceil"} if nearest else {}
    return ctx.emit("Resize", [x, None, None, sizes], mode="nearest" if nearest else "linear",
                    coordinate_transformation_mode=mode, **extra)


@tf_op("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy(ctx: Ctx) -> list[Value]:
    """TF's fused loss of a training step: per row, -sum(labels * log_softmax(logits)), and its
    gradient softmax(logits) - labels (output 1, which GradientTape's graph reads). Sparse labels are
    class indices, made one-hot by comparing with 0..classes-1: an index out of range gives a zero
    row (TensorFlow's CPU kernel refuses one)."""
    logits, labels = ctx.x(0), ctx.x(1)
    if len(logits.shape) != 2:
        raise ctx.error(f"logits of rank {len(logits.shape)}, expected 2 (batch, classes)")
    classes = logits.shape[1]
    if ctx.op_type.startswith("Sparse"):
        if labels.shape != logits.shape[:1]:
            raise ctx.error(f"labels of shape {list(labels.shape)} for logits of shape {list(logits.shape)}")
        hit = ctx.emit("Equal", [ctx.reshape(labels, [labels.shape[0], 1]),
                                 ctx.const(np.arange(classes, dtype=labels.dtype))])
        labels = ctx.emit("Cast", [hit], to=dtypes.onnx_type(logits.dtype))
    elif labels.shape != logits.shape:
        raise ctx.error(f"labels of shape {list(labels.shape)} for logits of shape {list(logits.shape)}")
    log_p = ctx.emit("LogSoftmax", [logits], axis=-1)
    loss = ctx.emit("Neg", [ctx.emit("ReduceSum", [ctx.emit("Mul", [labels, log_p]), ctx.const(np.array([1]))],
                                     keepdims=0)])
    return [loss, ctx.emit("Sub", [ctx.emit("Exp", [log_p]), labels])]
