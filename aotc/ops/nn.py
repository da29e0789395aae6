"""Neural-network ops that are template kernels of their own: softmax family, dropout."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Node
from aotc.ops.affine import Ix, for_each
from aotc.ops.common import axis_layout, const_input, norm_axis, row_loop_head
from aotc.ops.registry import OpDef, register


def softmax_layout(node: Node) -> tuple[int, int, int]:
    """(outer, n, inner): softmax runs over n elements spaced ``inner`` apart.

    Before opset 13 the input is coerced to 2-D at ``axis`` (default 1) and the softmax runs over the
    whole flattened tail; from 13 on it runs over the one axis (default -1).
    """
    shape = node.outputs[0].shape
    rank = len(shape)
    if rank == 0:
        return 1, 1, 1
    if node.attr("_opset", 13) < 13:
        axis = norm_axis(node.attr("axis", 1), rank, node)
        return int(np.prod(shape[:axis])), int(np.prod(shape[axis:])), 1
    return axis_layout(shape, norm_axis(node.attr("axis", -1), rank, node))


def _same(node: Node):
    x = node.inputs[0]
    assert x is not None
    return [(x.shape, x.dtype)]


def _low_precision_softmax(dt: np.dtype, ctype: str, x: str, y: str, n: int, inner: int) -> list[str]:
    """Softmax of one row of float16 or an emulated float type (bfloat16, float8), rounded where the
    reference (numpy / ml_dtypes) rounds: x - max, exp, the sum and the quotient each round to the
    type. ml_dtypes sums one addition at a time, each rounded; numpy sums float16 in float32 and
    rounds once along the contiguous last axis, but rounds each addition along any other axis."""
    def rnd(e: str) -> str:
        return f"(float)(_Float16)({e})" if ctype == "_Float16" else dtypes.round_to(dt, e)

    def load(e: str) -> str:
        return f"(float){e}" if ctype == "_Float16" else dtypes.load(dt, e)

    def store(e: str) -> str:
        return f"(_Float16)({e})" if ctype == "_Float16" else dtypes.store(dt, e)
    add = "s += e" if ctype == "_Float16" and inner == 1 else f"s = {rnd('s + e')}"
    xi, yi = load(f"xr[i * {inner}]"), load(f"yr[i * {inner}]")
    e = rnd(f"expf({rnd(f'{xi} - m')})")
    return [f"  const {ctype} *restrict xr = {x};",
            f"  {ctype} *restrict yr = {y};",
            "  float m = -INFINITY, s = 0;",
            "  int nan = 0;",
            f"  for (size_t i = 0; i < {n}; i++) {{ const float v = {xi}; "
            "m = v > m ? v : m; nan |= v != v; }",
            "  if (nan) m = NAN;",
            f"  for (size_t i = 0; i < {n}; i++) {{",
            f"    const float e = {e};",
            f"    yr[i * {inner}] = {store('e')};",
            f"    {add};",
            "  }",
            f"  s = {rnd('s')};",
            f"  for (size_t i = 0; i < {n}; i++) yr[i * {inner}] = {store(yi + ' / s')};"]


def _softmax_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    outer, n, inner = softmax_layout(node)
    head = row_loop_head(outer, inner)
    x, y = f"{ins[0]} + o * {n * inner} + k", f"{outs[0]} + o * {n * inner} + k"
    dt = node.outputs[0].dtype
    em = dtypes.emulated(dt)
    if node.op == "Softmax" and (ctype == "_Float16" or (em is not None and em.compute == "float")):
        return head + "\n".join(_low_precision_softmax(dt, ctype, x, y, n, inner)) + "\n}"
    if ctype == "float":  # the vectorized row kernels of runtime/aotc_rows.h
        fn = "aotc_log_softmax_row" if node.op == "LogSoftmax" else "aotc_softmax_row"
        return head + f"  {fn}({x}, {y}, {n}, {inner});\n}}"
    # double: the same three passes (max, sum of exp, normalize) with libm, NaN propagating.
    lines = [f"  const {ctype} *restrict xr = {x};",
             f"  {ctype} *restrict yr = {y};",
             f"  {ctype} m = -INFINITY, s = 0;",
             f"  for (size_t i = 0; i < {n}; i++) {{ const {ctype} v = xr[i * {inner}]; "
             f"m = (v > m || v != v) ? v : m; }}"]
    if node.op == "LogSoftmax":
        # (x - m) - log(s), as aotc_log_softmax_row: m + log(s) would round log(s) away on large rows.
        lines += [f"  for (size_t i = 0; i < {n}; i++) s += exp(xr[i * {inner}] - m);",
                  f"  const {ctype} log_sum = log(s);",
                  f"  for (size_t i = 0; i < {n}; i++) yr[i * {inner}] = (xr[i * {inner}] - m) - log_sum;"]
    else:
        lines += [f"  for (size_t i = 0; i < {n}; i++) {{ yr[i * {inner}] = exp(xr[i * {inner}] - m); "
                  f"s += yr[i * {inner}]; }}",
                  f"  for (size_t i = 0; i < {n}; i++) yr[i * {inner}] /= s;"]
    return head + "\n".join(lines) + "\n}"


register(OpDef("Softmax", "kernel", _same, emit=_softmax_emit))
register(OpDef("LogSoftmax", "kernel", _same, emit=_softmax_emit))
def _dropout_infer(node: Node):
    x = node.inputs[0]
    assert x is not None
    dropout_mask(node)  # checks the ratio
    return [(x.shape, x.dtype), (x.shape, np.dtype(np.bool_))]


def dropout_mask(node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(kept-element mask, ``x * factor`` factors) of a training-mode Dropout, None in inference mode.

    The ratio and training_mode must be compile-time constants, so the mask is drawn here, at compile
    time, the way the ONNX reference draws it: numpy's legacy generator seeded with the node's
    ``seed`` (0 when absent), ``uniform(0, 1) >= ratio``, kept elements scaled by ``1 / (1 - ratio)``.
    Every run of the compiled model applies the same mask: a library without mutable state has no
    generator to advance between runs."""
    x = node.inputs[0]
    assert x is not None
    ratio = const_input(node, 1, "the ratio")
    training = const_input(node, 2, "training_mode")
    r = node.attr("ratio", 0.5) if ratio is None else ratio.reshape(-1)[0]
    if not 0 <= float(r) < 1:
        raise AotcError(f"Dropout node {node.name!r}: ratio {float(r)} is not in [0, 1)")
    if training is None or not bool(training.reshape(-1)[0]) or float(r) == 0:
        return None
    mask = np.random.RandomState(int(node.attr("seed", 0))).uniform(0, 1.0, x.shape) >= r
    scale = np.asarray(1 / (1 - r)).astype(x.dtype)
    return mask, np.where(mask, scale, np.zeros((), x.dtype)).astype(x.dtype)


# Inference-mode dropout is the identity and training-mode dropout a product with constant factors:
# the simplifier rewrites both.
register(OpDef("Dropout", "alias", _dropout_infer, const_inputs=(1, 2)))


def bn_training(node: Node) -> bool:
    """Whether a BatchNormalization normalizes with batch statistics (opset 14's training_mode)."""
    return node.attr("_opset", 15) >= 14 and bool(node.attr("training_mode", 0))


def _bn_infer(node: Node):
    x, mean = node.inputs[0], node.inputs[3]
    assert x is not None and mean is not None
    if len(x.shape) < 2:
        raise AotcError(f"BatchNormalization node {node.name!r}: input must have rank >= 2")
    c = x.shape[1]
    for i in range(1, 5):
        v = node.inputs[i]
        if v is None or tuple(v.shape) != (c,):
            raise AotcError(f"BatchNormalization node {node.name!r}: input {i} must have shape ({c},)")
    res = [(x.shape, x.dtype)]
    if bn_training(node):  # running mean and variance, as many as the node asks for
        res += [((c,), mean.dtype)] * (len(node.outputs) - 1)
    return res


_LANES = 16  # partial sums per row: independent adds the compiler vectorizes (one sum would stay serial)


def channel_sums(n: int, c: int, inner: int, ctype: str, rows: dict[str, str], sums: dict[str, str]) -> list[str]:
    """Statements adding, over channel ``ch``'s rows of NC... tensors (``rows``: the name of each row
    pointer and its tensor), each expression of ``sums`` (in ``row[j]``) into the double of its name:
    lane by lane in ``ctype`` within a row, then in double."""
    lanes = ", ".join(f"L_{k}[{_LANES}] = {{0}}" for k in sums)

    def adds(lane: str, at: str) -> str:
        return " ".join(f"L_{k}[{lane}] += {e.replace('[j]', f'[{at}]')};" for k, e in sums.items())
    return [f"  for (size_t b = 0; b < {n}; b++) {{",
            *(f"    const {ctype} *{r} = {t} + (b * {c} + ch) * {inner};" for r, t in rows.items()),
            f"    {ctype} {lanes};",
            "    size_t k = 0;",
            f"    for (; k + {_LANES} <= {inner}; k += {_LANES})",
            f"      for (size_t l = 0; l < {_LANES}; l++) {{ {adds('l', 'k + l')} }}",
            f"    for (; k < {inner}; k++) {{ {adds('0', 'k')} }}",
            f"    for (size_t l = 0; l < {_LANES}; l++) {{ {' '.join(f'{k} += L_{k}[l];' for k in sums)} }}",
            "  }"]


def _bn_training_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Training mode: per channel, the mean and (biased) variance over N and the spatial axes (summed
    by ``channel_sums``), then Y normalized with them, and the running statistics moved towards them
    by ``1 - momentum``."""
    if not bn_training(node):
        raise AotcError(f"BatchNormalization node {node.name!r}: inference mode is rewritten, not emitted")
    x = node.inputs[0]
    assert x is not None
    n, c = x.shape[0], x.shape[1]
    inner = int(np.prod(x.shape[2:]))
    eps, mom = float(node.attr("epsilon", 1e-5)), float(node.attr("momentum", 0.9))
    st = dtypes.c_type(node.inputs[3].dtype)
    x_row = {"xr": ins[0]}
    lines = [f"const {ctype} *x = {ins[0]};",
             f"for (size_t ch = task; ch < {c}; ch += ntasks) {{",
             "  double s = 0, ss = 0;",
             *channel_sums(n, c, inner, ctype, x_row, {"s": "xr[j]"}),
             f"  const double m = s / {n * inner};",
             f"  const {ctype} mc = ({ctype})m;",
             *channel_sums(n, c, inner, ctype, x_row, {"ss": "(xr[j] - mc) * (xr[j] - mc)"}),
             f"  const double v = ss / {n * inner};",
             f"  const {ctype} sc = ({ctype})({ins[1]}[ch] / sqrt(v + {eps!r})), sh = ({ctype}){ins[2]}[ch];",
             f"  for (size_t b = 0; b < {n}; b++) {{",
             f"    const size_t at = (b * {c} + ch) * {inner};",
             f"    for (size_t k = 0; k < {inner}; k++) {outs[0]}[at + k] = (x[at + k] - mc) * sc + sh;",
             "  }"]
    for o, (inp, stat) in zip(outs[1:], ((ins[3], "m"), (ins[4], "v")), strict=False):
        lines.append(f"  {o}[ch] = ({st})({inp}[ch] * {mom!r} + {stat} * {1 - mom!r});")
    return "\n".join(lines + ["}"])


# Inference-mode batch norm never reaches codegen: the simplifier rewrites it into a per-channel
# scale and shift, which then folds into a preceding MatMul/Conv or fuses into the surrounding loop.
# Training mode (batch statistics) is this kernel.
register(OpDef("BatchNormalization", "kernel", _bn_infer, emit=_bn_training_emit))


# -- RMSNormalization: one row kernel (the other normalizations live in norm.py) --------------------
def _rms_infer(node: Node):
    x, scale = node.inputs[0], node.inputs[1]
    assert x is not None and scale is not None
    axis = norm_axis(node.attr("axis", -1), len(x.shape), node)
    try:  # the emitter's offset table broadcasts the scale against the normalized dims
        np.broadcast_shapes(tuple(scale.shape), tuple(x.shape[axis:]))
    except ValueError:
        raise AotcError(f"RMSNormalization node {node.name!r}: scale shape {list(scale.shape)} does not "
                        f"broadcast to the normalized dims {list(x.shape[axis:])}") from None
    if len(scale.shape) > len(x.shape) - axis:
        raise AotcError(f"RMSNormalization node {node.name!r}: scale shape {list(scale.shape)} has more dims "
                        f"than the normalized dims {list(x.shape[axis:])}")
    return _same(node)


def _rms_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, scale = node.inputs[0], node.inputs[1]
    assert x is not None and scale is not None
    rank = len(x.shape)
    axis = norm_axis(node.attr("axis", -1), rank, node)
    rows, n = int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))
    eps = float(node.attr("epsilon", 1e-5))
    if scale.size == n and tuple(scale.shape[-(rank - axis):]) == tuple(x.shape[axis:]):
        sc, table = f"{ins[1]}[j]", ""
    else:  # the scale broadcasts against the normalized dims: an offset table
        offs = np.broadcast_to(np.arange(scale.size).reshape(scale.shape), x.shape[axis:]).reshape(-1)
        table = f"static const size_t soff[{max(n, 1)}] = {{{', '.join(map(str, offs)) or '0'}}};\n"
        sc = f"{ins[1]}[soff[j]]"
    return (table + f"for (size_t r = task; r < {rows}; r += ntasks) {{\n"
            f"  const {ctype} *xr = {ins[0]} + r * {n};\n"
            f"  {ctype} *yr = {outs[0]} + r * {n};\n"
            f"  double s = 0;\n"
            f"  for (size_t j = 0; j < {n}; j++) s += (double)xr[j] * xr[j];\n"
            f"  const double inv = 1.0 / sqrt(s / {n} + {eps!r});\n"
            f"  for (size_t j = 0; j < {n}; j++) yr[j] = ({ctype})(xr[j] * inv * {sc});\n}}")


register(OpDef("RMSNormalization", "kernel", _rms_infer, emit=_rms_emit))


# -- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss: one sequential kernel ------------------------
def _loss_infer(node: Node):
    x, target = node.inputs[0], node.inputs[1]
    assert x is not None and target is not None
    what = f"{node.op} node {node.name!r}"
    reduction = node.attr("reduction", "mean")
    if reduction not in ("none", "mean", "sum"):
        raise AotcError(f"{what}: attribute reduction {reduction!r} is not one of none, mean, sum")
    if len(x.shape) < 2 or tuple(target.shape) != (x.shape[0], *x.shape[2:]):
        raise AotcError(f"{what}: target shape {list(target.shape)} does not match input shape {list(x.shape)} "
                        "(N, C, d1, ...) without its class axis")
    w = node.inputs[2] if len(node.inputs) > 2 else None
    if w is not None and tuple(w.shape) != (x.shape[1],):
        raise AotcError(f"{what}: weight shape {list(w.shape)} does not match the {x.shape[1]} classes")
    shape = target.shape if reduction == "none" else ()
    res = [(shape, x.dtype)]
    if len(node.outputs) > 1:  # SoftmaxCrossEntropyLoss's log_prob
        res.append((x.shape, x.dtype))
    return res


class LossParams(NamedTuple):
    """What the loss kernels (and their gradients') read from the node: scores (n, c, d...) as rows of c
    classes strided by d, the class weights' input position (None: unweighted), ignore_index, the
    reduction, and whether the scores are logits (SoftmaxCrossEntropyLoss) or log-probabilities."""

    n: int
    c: int
    d: int
    weights: int | None
    ignore: int | None
    reduction: str
    softmax: bool


def loss_params(node: Node, scores: int) -> LossParams:
    """``node``'s loss parameters, its scores at input ``scores`` and the weights two after them."""
    x = node.inputs[scores]
    assert x is not None
    w = scores + 2
    return LossParams(x.shape[0], x.shape[1], int(np.prod(x.shape[2:])),
                      w if len(node.inputs) > w and node.inputs[w] is not None else None,
                      node.attr("ignore_index"), node.attr("reduction", "mean"),
                      node.op.removeprefix("aotc.").startswith("SoftmaxCrossEntropyLoss"))


def loss_target(p: LossParams, var: str, targets: str, weights: str | None) -> list[str]:
    """C lines reading the target ``var`` from ``targets`` (an index expression), clamped into the classes,
    with ``var``_ignored (it is ignore_index) and its weight ``var``_w (0 when ignored)."""
    ign = f"{var} == INT64_C({int(p.ignore)})" if p.ignore is not None else "0"
    return [f"  int64_t {var} = (int64_t){targets};",
            f"  const int {var}_ignored = {ign};",
            f"  {var} = {var} < 0 ? 0 : ({var} >= {p.c} ? {p.c - 1} : {var});",
            f"  const double {var}_w = {var}_ignored ? 0 : {f'(double){weights}[{var}]' if weights else '1'};"]


def max_shifted_exp_sum(p: LossParams) -> list[str]:
    """C lines giving m, the largest of the row xr's scores, and s, the sum of their exp(x - m)."""
    return ["  double m = -INFINITY, s = 0;",
            f"  for (size_t j = 0; j < {p.c}; j++) m = xr[j * {p.d}] > m ? xr[j * {p.d}] : m;",
            f"  for (size_t j = 0; j < {p.c}; j++) s += exp((double)xr[j * {p.d}] - m);"]


def _loss_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    p = loss_params(node, 0)
    n, c, d = p.n, p.c, p.d
    lp = outs[1] if len(outs) > 1 else None
    lines = ["if (task != 0) return;", "double sl = 0, sw = 0;",
             f"for (size_t i = 0; i < {n}; i++) {for_each('k', 0, d)}",
             f"  const {ctype} *xr = {ins[0]} + i * {c * d} + k;",
             "  double lse = 0;"]
    if p.softmax:  # log-softmax over the class axis, max-shifted
        lines += [*max_shifted_exp_sum(p), "  lse = m + log(s);"]
        if lp:
            lines.append(f"  for (size_t j = 0; j < {c}; j++) {lp}[i * {c * d} + j * {d} + k] = "
                         f"({ctype})(xr[j * {d}] - lse);")
    lines += [*loss_target(p, "t", f"{ins[1]}[i * {d} + k]", ins[p.weights] if p.weights else None),
              f"  const double l = t_ignored ? 0 : -((double)xr[t * {d}] - lse) * t_w;"]
    if p.reduction == "none":
        lines.append(f"  {outs[0]}[i * {d} + k] = ({ctype})l;")
    lines += ["  sl += l; sw += t_w;", "}"]
    if p.reduction == "mean":
        lines.append(f"{outs[0]}[0] = ({ctype})(sl / sw);")
    elif p.reduction == "sum":
        lines.append(f"{outs[0]}[0] = ({ctype})sl; (void)sw;")
    else:
        lines.append("(void)sl; (void)sw;")
    return "\n".join(lines)


register(OpDef("NegativeLogLikelihoodLoss", "kernel", _loss_infer, emit=_loss_emit))
register(OpDef("SoftmaxCrossEntropyLoss", "kernel", _loss_infer, emit=_loss_emit))


# -- LpNormalization, LRN ------------------------------------------------------------------------------
def _lpnorm_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None
    rank = len(x.shape)
    axis = norm_axis(node.attr("axis", -1), rank, node)
    outer, n, inner = axis_layout(x.shape, axis)
    p = int(node.attr("p", 2))
    acc = "fabs((double)v)" if p == 1 else "(double)v * v"
    norm = "s" if p == 1 else "sqrt(s)"
    return (row_loop_head(outer, inner)
            + f"  const {ctype} *xr = {ins[0]} + o * {n * inner} + k;\n"
            f"  {ctype} *yr = {outs[0]} + o * {n * inner} + k;\n"
            f"  double s = 0;\n"
            f"  for (size_t i = 0; i < {n}; i++) {{ const {ctype} v = xr[i * {inner}]; s += {acc}; }}\n"
            f"  const double nrm = {norm};\n"
            f"  for (size_t i = 0; i < {n}; i++)\n"
            f"    yr[i * {inner}] = nrm == 0 ? 0 : ({ctype})(xr[i * {inner}] / nrm);\n}}")


def _lpnorm_infer(node: Node):
    if node.attr("p", 2) not in (1, 2):
        raise AotcError(f"LpNormalization node {node.name!r}: attribute p {node.attr('p')} is not 1 or 2")
    return _same(node)


register(OpDef("LpNormalization", "kernel", _lpnorm_infer, emit=_lpnorm_emit))


def _lrn_infer(node: Node):
    """onnxruntime's rules: an odd, positive window (the emitter's channel bounds assume it)."""
    x = node.inputs[0]
    assert x is not None
    size = node.attr("size")
    if size < 1 or size % 2 == 0:
        raise AotcError(f"LRN node {node.name!r}: attribute size {size} is not a positive odd number")
    if len(x.shape) < 3:
        raise AotcError(f"LRN node {node.name!r}: input shape {list(x.shape)} is not (N, C, D1, ...)")
    return _same(node)


def _lrn_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None
    n, c = x.shape[0], x.shape[1]
    inner = int(np.prod(x.shape[2:]))
    size = int(node.attr("size"))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    alpha, beta, bias = (float(node.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    r = Ix.of("r")
    return (f"for (size_t r = task; r < {n * c * inner}; r += ntasks) {{\n"
            f"  const size_t b = {r // max(c * inner, 1)}, ch = {r // max(inner, 1) % c}, k = {r % max(inner, 1)};\n"
            f"  const size_t c0 = ch >= {lo} ? ch - {lo} : 0, c1 = ch + {hi} < {c} ? ch + {hi} : {c - 1};\n"
            f"  double s = 0;\n"
            f"  for (size_t j = c0; j <= c1; j++) {{\n"
            f"    const double v = {ins[0]}[(b * {c} + j) * {inner} + k]; s += v * v;\n  }}\n"
            f"  {outs[0]}[r] = ({ctype})({ins[0]}[r] / pow({bias!r} + {alpha / size!r} * s, {beta!r}));\n}}")


register(OpDef("LRN", "kernel", _lrn_infer, emit=_lrn_emit))


# -- RotaryEmbedding: rotate pairs of each head's first rotary_embedding_dim features ----------------------
def _rope_infer(node: Node):
    """The cache and head sizes the emitter indexes with (onnxruntime's checks at run time)."""
    x, cos, sin = node.inputs[0], node.inputs[1], node.inputs[2]
    assert x is not None and cos is not None and sin is not None
    what = f"RotaryEmbedding node {node.name!r}"
    if len(x.shape) == 4:
        d = x.shape[3]
    elif len(x.shape) == 3:
        h = node.attr("num_heads")
        if h is None or h < 1 or x.shape[2] % h:
            raise AotcError(f"{what}: attribute num_heads {h} must divide the hidden size {x.shape[2]} of a "
                            "rank-3 input")
        d = x.shape[2] // h
    else:
        raise AotcError(f"{what}: input shape {list(x.shape)} is not rank 3 or 4")
    rot = node.attr("rotary_embedding_dim", 0) or d
    if not 0 < rot <= d:
        raise AotcError(f"{what}: attribute rotary_embedding_dim {rot} is not in 1..{d} (the head size)")
    b, s = x.shape[0], x.shape[2 if len(x.shape) == 4 else 1]
    pos = node.inputs[3] if len(node.inputs) > 3 else None
    if pos is not None and tuple(pos.shape) != (b, s):
        raise AotcError(f"{what}: position_ids shape {list(pos.shape)} is not (batch, sequence) {[b, s]}")
    rows = (cos.shape[0],) if pos is not None and len(cos.shape) == 2 else (b, s)
    if tuple(cos.shape) != (*rows, rot // 2) or sin.shape != cos.shape:
        raise AotcError(f"{what}: cos_cache shape {list(cos.shape)} and sin_cache shape {list(sin.shape)} "
                        f"must both be {[*rows, rot // 2]}")
    return _same(node)


def _rope_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None
    has_pos = len(node.inputs) > 3 and node.inputs[3] is not None
    if len(x.shape) == 4:  # (B, H, S, D)
        b, h, s, d = x.shape
        at = "((bi * {h} + hi) * {s} + si) * {d}"
    else:  # (B, S, H * D)
        b, s, hd = x.shape
        h = int(node.attr("num_heads"))
        d = hd // h
        at = "((bi * {s} + si) * {h} + hi) * {d}"
    at = at.format(h=h, s=s, d=d)
    rot = int(node.attr("rotary_embedding_dim", 0)) or d
    half = rot // 2
    # Row of the caches: position_ids[b, s] when given, else the caches are (B, S, half).
    if has_pos:  # clamped: a bad position must not read outside the caches
        rows = node.inputs[1].shape[0]
        p = f"(int64_t){ins[3]}[bi * {s} + si]"
        row = f"(size_t)({p} < 0 ? 0 : ({p} >= {rows} ? {rows - 1} : {p}))"
    else:
        row = f"(bi * {s} + si)"
    if node.attr("interleaved", 0):
        i1, i2 = "2 * j", "2 * j + 1"
    else:
        i1, i2 = "j", f"j + {half}"
    return (f"for (size_t r = task; r < {b * h * s}; r += ntasks) {{\n"
            f"  const size_t bi = r / {h * s}, hi = (r / {s}) % {h}, si = r % {s};\n"
            f"  const {ctype} *xr = {ins[0]} + {at};\n"
            f"  {ctype} *yr = {outs[0]} + {at};\n"
            f"  const {ctype} *cr = {ins[1]} + {row} * {half}, *sr = {ins[2]} + {row} * {half};\n"
            f"  for (size_t j = 0; j < {half}; j++) {{\n"
            f"    const {ctype} a = xr[{i1}], c = xr[{i2}];\n"
            f"    yr[{i1}] = cr[j] * a - sr[j] * c;\n"
            f"    yr[{i2}] = sr[j] * a + cr[j] * c;\n"
            f"  }}\n"
            f"  for (size_t j = {rot}; j < {d}; j++) yr[j] = xr[j];\n}}")


register(OpDef("RotaryEmbedding", "kernel", _rope_infer, emit=_rope_emit))
