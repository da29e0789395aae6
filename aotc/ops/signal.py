"""Signal processing: DFT, STFT (direct transforms with compile-time twiddle tables) and
MelWeightMatrix (a constant, folded at compile time).

The transforms are direct O(n^2) sums in double precision rather than FFTs: the sizes in models
(frames of a few hundred samples, small spectra) keep that cheap, every output element is
independent (so tasks split outputs and results do not depend on the thread count), and the double
accumulators keep the result within float rounding of numpy's FFT. Twiddle factors come from one
table of ``cos``/``sin`` of 2*pi*j/n, indexed by (k * t) mod n, computed in float64 at compile time.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node
from aotc.ops.common import const_input
from aotc.ops.registry import OpDef, register


def _const_int(node: Node, i: int, default: int | None) -> int | None:
    """Scalar input ``i`` as an int (``default`` when absent); it must be a compile-time constant."""
    v = const_input(node, i, f"input {i}")
    return default if v is None else int(np.asarray(v).reshape(-1)[0])


def _twiddles(n: int, name: str) -> str:
    """C declarations of the cos/sin table for length n."""
    ang = 2 * np.pi * np.arange(n) / n
    cos = ", ".join(repr(float(c)) for c in np.cos(ang))
    sin = ", ".join(repr(float(s)) for s in np.sin(ang))
    return (f"static const double {name}_cos[{n}] = {{{cos}}};\n"
            f"static const double {name}_sin[{n}] = {{{sin}}};\n")


# -- DFT ----------------------------------------------------------------------------------------------------
def _dft_params(node: Node) -> tuple[int, int, int, bool, bool]:
    """(axis, n, output length along axis, inverse, onesided) with the axis made non-negative."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    rank = len(x.shape)
    if node.attr("_opset", 20) >= 20:
        axis = _const_int(node, 2, -2)
    else:
        axis = int(node.attr("axis", 1))
    assert axis is not None
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise AotcError(f"DFT node {node.name!r}: axis {axis} is not a signal axis of a rank-{rank} input")
    axis %= rank
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    length = x.shape[axis]
    n = _const_int(node, 1, None) or (2 * (length - 1) if inverse and onesided else length)
    if n < 1:
        raise AotcError(f"DFT node {node.name!r}: dft_length must be positive, got {n}")
    out_len = n // 2 + 1 if onesided and not inverse else n
    return axis, n, out_len, inverse, onesided


def _dft_infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    if x.shape[-1] not in (1, 2):
        raise AotcError(f"DFT node {node.name!r}: the last dimension must be 1 (real) or 2 (complex)")
    axis, _n, out_len, inverse, onesided = _dft_params(node)
    shape = list(x.shape)
    shape[axis] = out_len
    shape[-1] = 1 if inverse and onesided else 2
    return [(tuple(shape), x.dtype)]


def _transform_loop(ctype: str, n: int, taps: int, k_count: int, comps: int, inverse: bool, hermitian: bool,
                    load: str, store_re: str, store_im: str | None, tw: str) -> str:
    """Inner loops of one transform: output bins k < k_count from input samples t < taps.

    ``load`` formats to the C expression of component ``{c}`` (0: real, 1: imaginary) of sample
    ``{t}``. With ``hermitian`` the input is the first n/2+1 bins of a real signal's spectrum
    (irfft), expanded by conjugate symmetry, and only the real part of the result is stored."""
    sign = "+" if inverse else "-"
    scale = f" / {n}.0" if inverse else ""

    def part(c: int, t: str) -> str:
        return f"(double)({load.format(c=c, t=t)})" if c < comps else "0.0"

    if hermitian:
        # bin t of the full spectrum: X[t] for t <= n/2 (zero past the given bins), else conj(X[n-t]).
        sample = [f"        const size_t src = t <= {n // 2} ? t : {n} - t;",
                  f"        const double conj = t <= {n // 2} ? 1.0 : -1.0;",
                  "        double xr = 0, xi = 0;",
                  f"        if (src < {taps}) {{ xr = {part(0, 'src')}; xi = conj * {part(1, 'src')}; }}"]
        loop_n = n
    else:
        sample = [f"        const double xr = {part(0, 't')}, xi = {part(1, 't')};"]
        loop_n = taps
    lines = [f"    for (size_t k = 0; k < {k_count}; k++) {{",
             "      double re = 0, im = 0;",
             "      size_t j = 0;",
             f"      for (size_t t = 0; t < {loop_n}; t++) {{",
             *sample,
             f"        const double c = {tw}_cos[j], s = {sign}{tw}_sin[j];",
             "        re += xr * c - xi * s;",
             "        im += xr * s + xi * c;",
             f"        j += k; if (j >= {n}) j -= {n};",
             "      }",
             f"      {store_re} = ({ctype})(re{scale});",
             f"      {store_im} = ({ctype})(im{scale});" if store_im is not None else "      (void)im;"]
    lines.append("    }")
    return "\n".join(lines)


def _dft_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    axis, n, out_len, inverse, onesided = _dft_params(node)
    comps = x.shape[-1]
    length = x.shape[axis]
    outer = int(np.prod(x.shape[:axis]))
    inner = int(np.prod(x.shape[axis + 1:-1]))
    co = 1 if inverse and onesided else 2
    hermitian = inverse and onesided
    taps = min(length, n // 2 + 1) if hermitian else min(length, n)
    tw = "dft_tw"
    load = f"{ins[0]}[(o * {length} + {{t}}) * {inner * comps} + i * {comps} + {{c}}]"
    out_at = f"{outs[0]}[(o * {out_len} + k) * {inner * co} + i * {co}"
    body = _transform_loop(ctype, n, taps, out_len, comps, inverse, hermitian, load,
                           out_at + "]", out_at + " + 1]" if co == 2 else None, tw)
    return (_twiddles(n, tw)
            + f"for (size_t r = task; r < {outer * inner}; r += ntasks) {{\n"
            f"  const size_t o = r / {inner}, i = r % {inner};\n"
            f"  {{\n{body}\n  }}\n}}")


register(OpDef("DFT", "kernel", _dft_infer, emit=_dft_emit, const_inputs=(1, 2)))


# -- STFT ---------------------------------------------------------------------------------------------------
def _stft_params(node: Node) -> tuple[int, int, int, int, bool]:
    """(frame_step, frame_length, frames, bins, window given)."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    step = _const_int(node, 1, None)
    window = node.inputs[2] if len(node.inputs) > 2 else None
    length = _const_int(node, 3, None)
    if length is None:
        if window is None:
            raise AotcError(f"STFT node {node.name!r}: needs a window or a frame_length")
        assert window.shape is not None
        length = window.shape[0]
    if step is None or step < 1 or length < 1 or length > x.shape[1]:
        raise AotcError(f"STFT node {node.name!r}: bad frame_step {step} or frame_length {length} "
                        f"for a signal of {x.shape[1]} samples")
    if window is not None and window.shape != (length,):
        raise AotcError(f"STFT node {node.name!r}: window shape {window.shape} != ({length},)")
    frames = 1 + (x.shape[1] - length) // step
    bins = length // 2 + 1 if node.attr("onesided", 1) else length
    return step, length, frames, bins, window is not None


def _stft_infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) != 3 or x.shape[-1] not in (1, 2):
        raise AotcError(f"STFT node {node.name!r}: the signal must be [batch, length, 1 or 2]")
    _step, _length, frames, bins, _w = _stft_params(node)
    return [((x.shape[0], frames, bins, 2), x.dtype)]


def _stft_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    step, length, frames, bins, has_window = _stft_params(node)
    comps = x.shape[-1]
    win = f" * {ins[2]}[{{t}}]" if has_window else ""
    load = f"{ins[0]}[(b * {x.shape[1]} + f * {step} + {{t}}) * {comps} + {{c}}]{win}"
    out_at = f"{outs[0]}[((b * {frames} + f) * {bins} + k) * 2"
    body = _transform_loop(ctype, length, length, bins, comps, False, False, load,
                           out_at + "]", out_at + " + 1]", "stft_tw")
    return (_twiddles(length, "stft_tw")
            + f"for (size_t r = task; r < {x.shape[0] * frames}; r += ntasks) {{\n"
            f"  const size_t b = r / {frames}, f = r % {frames};\n"
            f"  {{\n{body}\n  }}\n}}")


register(OpDef("STFT", "kernel", _stft_infer, emit=_stft_emit, const_inputs=(1, 3)))


# -- MelWeightMatrix: a function of its (constant) scalar inputs only --------------------------------------
def _mel_infer(node: Node):
    bins = _const_int(node, 0, None)
    dft_length = _const_int(node, 1, None)
    assert bins is not None and dft_length is not None
    from aotc.ir import dtypes

    return [((dft_length // 2 + 1, bins), dtypes.from_onnx(int(node.attr("output_datatype", 1))))]


register(OpDef("MelWeightMatrix", "static", _mel_infer, const_inputs=(0, 1, 2, 3, 4)))
