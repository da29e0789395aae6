"""Recurrent ops as one sequential kernel each: RNN, GRU, LSTM.

Every (direction, batch row) pair is an independent recurrence, so the kernel splits those pairs over
tasks and runs each one's loop over time with its state (h, c, gates) in the task's working arrays
(on the stack, or in its scratch slot when the hidden size makes them large). Each gate
value is a dot product of a row of W (R) with x (h): the rows are contiguous in the ONNX layout, so
the weights are read as they are stored (they may be run-time inputs) and the dot products run in
independent lanes that the compiler vectorizes without -ffast-math.

Semantics follow onnxruntime where the spec is silent: ``sequence_lens`` stops a row's recurrence
after its length (a reverse direction starts at the row's last valid step), Y is zero past it and
Y_h/Y_c hold the state after the last valid step; a length outside 0..seq_length is an error, as in
onnxruntime (NAME_ERR_INDEX_OUT_OF_RANGE at run time); ``clip`` bounds every gate's pre-activation;
activation_alpha/beta are consumed in order by the activations that take them.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError, IndexOutOfRangeError
from aotc.ir.graph import Node
from aotc.ops.affine import Ix
from aotc.ops.common import aligned_inputs, c_literal
from aotc.ops.index import set_status, task_arrays
from aotc.ops.registry import OpDef, register

LANES = 8
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
# activation -> (takes alpha, takes beta, default alpha, default beta)
_ACT_PARAMS = {"affine": (True, True, 1.0, 0.0), "leakyrelu": (True, False, 0.01, 0.0),
               "thresholdedrelu": (True, False, 1.0, 0.0), "scaledtanh": (True, True, 1.0, 1.0),
               "hardsigmoid": (True, True, 0.2, 0.5), "elu": (True, False, 1.0, 0.0),
               "relu": (False, False, 0, 0), "tanh": (False, False, 0, 0), "sigmoid": (False, False, 0, 0),
               "softsign": (False, False, 0, 0), "softplus": (False, False, 0, 0)}


def _dims(node: Node) -> tuple[int, int, int, int, int]:
    """(seq, batch, input size, hidden size, directions)."""
    x, w, r = node.inputs[0], node.inputs[1], node.inputs[2]
    assert x is not None and w is not None and r is not None
    if len(x.shape) != 3 or len(w.shape) != 3 or len(r.shape) != 3:
        raise AotcError(f"{node.op} node {node.name!r}: X, W and R must have rank 3")
    s, b, i = x.shape if not node.attr("layout", 0) else (x.shape[1], x.shape[0], x.shape[2])
    h = int(node.attr("hidden_size", r.shape[-1]))
    d = w.shape[0]
    want_d = 2 if node.attr("direction", "forward") == "bidirectional" else 1
    g = _GATES[node.op]
    if d != want_d or w.shape[1:] != (g * h, i) or r.shape[1:] != (g * h, h):
        raise AotcError(f"{node.op} node {node.name!r}: W {list(w.shape)} / R {list(r.shape)} do not match "
                        f"direction {node.attr('direction', 'forward')!r}, hidden_size {h}, input size {i}")
    return s, b, i, h, d


def _infer(node: Node):
    x = node.inputs[0]
    assert x is not None
    if x.dtype not in (np.float32, np.float64):
        raise AotcError(f"{node.op} node {node.name!r}: dtype {x.dtype} not supported")
    s, b, _, h, d = _dims(node)
    layout = node.attr("layout", 0)
    y = (b, s, d, h) if layout else (s, d, b, h)
    state = (b, d, h) if layout else (d, b, h)
    return [(y if k == 0 else state, x.dtype) for k in range(len(node.outputs))]


def _activations(node: Node, d: int, ctype: str) -> list[list[str]]:
    """Per direction, the activations as C format strings over ``{x}``."""
    names = list(node.attr("activations", [])) or _DEFAULT_ACTS[node.op] * d
    per = len(_DEFAULT_ACTS[node.op])
    if len(names) != per * d:
        raise AotcError(f"{node.op} node {node.name!r}: expected {per * d} activations, got {len(names)}")
    alphas = list(node.attr("activation_alpha", []))
    betas = list(node.attr("activation_beta", []))
    res = []
    for name in names:
        key = name.lower()
        if key not in _ACT_PARAMS:
            raise AotcError(f"{node.op} node {node.name!r}: activation {name!r} is not supported")
        takes_a, takes_b, a, b = _ACT_PARAMS[key]
        if takes_a and alphas:
            a = float(alphas.pop(0))
        if takes_b and betas:
            b = float(betas.pop(0))
        res.append((key, a, b))
    return [[_act_c(*res[k * per + j], ctype) for j in range(per)] for k in range(d)]


def _act_c(key: str, a: float, b: float, ctype: str) -> str:
    """The activation as a C format string over ``{x}``."""
    sfx = "f" if ctype == "float" else ""
    fmt = {"relu": "({x} > 0 ? {x} : 0)",
           "tanh": "tanh~({x})",
           "sigmoid": "(1 / (1 + exp~(-{x})))",
           "affine": "({a} * {x} + {b})",
           "leakyrelu": "({x} >= 0 ? {x} : {a} * {x})",
           "thresholdedrelu": "({x} > {a} ? {x} : 0)",
           "scaledtanh": "({a} * tanh~({b} * {x}))",
           "hardsigmoid": "fmax~(0, fmin~(1, {a} * {x} + {b}))",
           "elu": "({x} >= 0 ? {x} : {a} * (exp~({x}) - 1))",
           "softsign": "({x} / (1 + fabs~({x})))",
           "softplus": "log1p~(exp~({x}))"}[key]
    return fmt.replace("~", sfx).replace("{a}", c_literal(a, ctype)).replace("{b}", c_literal(b, ctype))


def _dot(ctype: str, acc: str, a: str, b: str, n: int) -> list[str]:
    """C lines adding the dot product of ``a[0:n]`` and ``b[0:n]`` to ``acc``, in LANES lanes."""
    a, b = f"({a})", f"({b})"
    if n < LANES:
        return [f"for (size_t i = 0; i < {n}; i++) {acc} += {a}[i] * {b}[i];"]
    main = n - n % LANES
    lines = ["{", f"  {ctype} s[{LANES}] = {{0}};",
             f"  for (size_t i = 0; i < {main}; i += {LANES})",
             f"    for (size_t l = 0; l < {LANES}; l++) s[l] += {a}[i + l] * {b}[i + l];"]
    if main != n:
        lines.append(f"  for (size_t i = {main}; i < {n}; i++) s[0] += {a}[i] * {b}[i];")
    lines += [f"  for (size_t w = {LANES // 2}; w > 0; w /= 2)",
              "    for (size_t l = 0; l < w; l++) s[l] += s[l + w];",
              f"  {acc} += s[0];", "}"]
    return lines


def _emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    op = node.op
    s, bsz, isz, h, nd = _dims(node)
    g = _GATES[op]
    layout = node.attr("layout", 0)
    direction = node.attr("direction", "forward")
    acts = _activations(node, nd, ctype)
    fmax, fmin = ("fmaxf", "fminf") if ctype == "float" else ("fmax", "fmin")
    clip = node.attr("clip")
    names = aligned_inputs(node, ins)
    x, w, r, bias = names[0], names[1], names[2], names[3] if len(names) > 3 else None
    seq = names[4] if len(names) > 4 else None
    if seq and node.inputs[4].is_const:
        lens = np.asarray(node.inputs[4].const).astype(np.int64).reshape(-1)
        bad = lens[(lens < 0) | (lens > s)]
        if bad.size:
            raise AotcError(f"{op} node {node.name!r}: sequence length {int(bad[0])} is out of range 0..{s}")
    h0 = names[5] if len(names) > 5 else None
    c0 = names[6] if op == "LSTM" and len(names) > 6 else None
    peep = names[7] if op == "LSTM" and len(names) > 7 else None
    present = [i < len(outs) and bool(node.outputs[i].name) for i in range(3)]
    y, yh, yc = (outs[i] if present[i] else None for i in range(3))
    lbr = op == "GRU" and node.attr("linear_before_reset", 0)
    input_forget = op == "LSTM" and node.attr("input_forget", 0)

    x_at = "(b * {s} + t) * {i}" if layout else "(t * {b} + b) * {i}"
    y_at = "((b * {s} + t) * {d} + dir) * {h}" if layout else "((t * {d} + dir) * {b} + b) * {h}"
    st_at = ("(b * {d} + dir) * {h}" if layout else "(dir * {b} + b) * {h}").format(d=nd, b=bsz, h=h)
    x_at = x_at.format(s=s, b=bsz, i=isz)
    y_at = y_at.format(s=s, b=bsz, d=nd, h=h)

    def lit(v: float) -> str:
        return c_literal(v, ctype)

    def clipped(e: str) -> str:
        if clip is None:
            return e
        return f"{fmin}({fmax}({e}, {lit(-float(clip))}), {lit(float(clip))})"

    def act(fmt: str, e: str) -> str:
        return fmt.replace("{x}", f"({clipped(e)})")

    def gate_rows(j0: str, j1: str, with_r: bool, into: str) -> list[str]:
        """gates[j] = W[j].x (+ R[j].h) + biases for j in [j0, j1), into ``into[j]``."""
        lines = [f"for (size_t j = {j0}; j < {j1}; j++) {{", f"  {ctype} v = 0;"]
        lines += ["  " + ln for ln in _dot(ctype, "v", f"wd + j * {isz}", "xt", isz)]
        if with_r:
            lines += ["  " + ln for ln in _dot(ctype, "v", f"rd + j * {h}", "hs", h)]
        if bias:
            lines.append(f"  v += bd[j]{' + bd[j + ' + str(g * h) + ']' if with_r else ''};")
        lines += [f"  {into}[j] = v;", "}"]
        return lines

    def step(dir_: int) -> list[str]:
        f = acts[dir_]
        rev = direction == "reverse" or dir_ == 1
        body = [f"const {ctype} *wd = {w} + {dir_ * g * h * isz}, *rd = {r} + {dir_ * g * h * h};"]
        if bias:
            body.append(f"const {ctype} *bd = {bias} + {dir_ * 2 * g * h};")
        body.append("const size_t dir = " + str(dir_) + "; (void)dir;")
        init = f"{h0}[{st_at} + j]" if h0 else "0"
        body.append(f"for (size_t j = 0; j < {h}; j++) hs[j] = {init};")
        if op == "LSTM":
            body.append(f"for (size_t j = 0; j < {h}; j++) cs[j] = {f'{c0}[{st_at} + j]' if c0 else '0'};")
            if peep:
                body.append(f"const {ctype} *pd = {peep} + {dir_ * 3 * h};")
        if seq:
            body.append(f"const int64_t sl = (int64_t){seq}[b];")
            if not node.inputs[4].is_const:  # a length outside 0..seq_length: onnxruntime refuses it
                body.append(f"if (sl < 0 || sl > {s}) {{ {set_status(IndexOutOfRangeError.code)} return; }}")
            body.append("const size_t len = (size_t)sl;")
        else:
            body.append(f"const size_t len = {s};")
        loop = [f"const size_t t = {'len - 1 - st' if rev else 'st'};",
                f"const {ctype} *xt = {x} + {x_at};"]
        if op == "RNN":
            loop += gate_rows("0", str(h), True, "gs")
            loop.append(f"for (size_t j = 0; j < {h}; j++) hs[j] = {act(f[0], 'gs[j]')};")
        elif op == "GRU":
            loop += gate_rows("0", str(2 * h), True, "gs")
            loop.append(f"for (size_t j = 0; j < {2 * h}; j++) gs[j] = {act(f[0], 'gs[j]')};")
            loop += gate_rows(str(2 * h), str(3 * h), False, "gs")
            if lbr:  # r scales (R_h h + Rb_h)
                loop += [f"for (size_t j = 0; j < {h}; j++) {{", f"  {ctype} v = 0;"]
                loop += ["  " + ln for ln in _dot(ctype, "v", f"rd + ({2 * h} + j) * {h}", "hs", h)]
                if bias:
                    loop.append(f"  v += bd[{5 * h} + j];")
                loop += [f"  hr[j] = gs[{h} + j] * v;", "}"]
            else:  # R_h applies to r * h
                loop += [f"for (size_t j = 0; j < {h}; j++) rh[j] = gs[{h} + j] * hs[j];",
                         f"for (size_t j = 0; j < {h}; j++) {{", f"  {ctype} v = 0;"]
                loop += ["  " + ln for ln in _dot(ctype, "v", f"rd + ({2 * h} + j) * {h}", "rh", h)]
                if bias:
                    loop.append(f"  v += bd[{5 * h} + j];")
                loop += ["  hr[j] = v;", "}"]
            loop += [f"for (size_t j = 0; j < {h}; j++) {{",
                     f"  const {ctype} n = {act(f[1], f'gs[{2 * h} + j] + hr[j]')}, z = gs[j];",
                     "  hs[j] = (1 - z) * n + z * hs[j];", "}"]
        else:  # LSTM: gates i, o, f, c; peepholes i, o, f
            loop += gate_rows("0", str(4 * h), True, "gs")
            pi, po, pf = ((" + pd[j] * cs[j]", f" + pd[{h} + j] * c", f" + pd[{2 * h} + j] * cs[j]") if peep
                          else ("", "", ""))
            i_e = act(f[0], f"gs[j]{pi}")
            f_e = "1 - ig" if input_forget else act(f[0], f"gs[{2 * h} + j]{pf}")
            loop += [f"for (size_t j = 0; j < {h}; j++) {{",
                     f"  const {ctype} ig = {i_e};",
                     f"  const {ctype} fg = {f_e};",
                     f"  const {ctype} c = fg * cs[j] + ig * {act(f[1], f'gs[{3 * h} + j]')};",
                     f"  const {ctype} og = {act(f[0], f'gs[{h} + j]{po}')};",
                     "  cs[j] = c;",
                     f"  hs[j] = og * {act(f[2], 'c')};", "}"]
        if y:
            loop.append(f"for (size_t j = 0; j < {h}; j++) {y}[{y_at} + j] = hs[j];")
        body += ["for (size_t st = 0; st < len; st++) {", *["  " + ln for ln in loop], "}"]
        if y:  # steps past the row's length are zero
            body += [f"for (size_t t = len; t < {s}; t++)",
                     f"  for (size_t j = 0; j < {h}; j++) {y}[{y_at} + j] = 0;"]
        if yh:
            body.append(f"for (size_t j = 0; j < {h}; j++) {yh}[{st_at} + j] = hs[j];")
        if yc:
            body.append(f"for (size_t j = 0; j < {h}; j++) {yc}[{st_at} + j] = cs[j];")
        return body

    code = [_arrays(node)[1],
            f"for (size_t task_r = task; task_r < {nd * bsz}; task_r += ntasks) {{",
            f"  const size_t b = {Ix.of('task_r') % max(bsz, 1)};"]
    if nd == 1:
        code += ["  " + ln for ln in step(0)]
    else:
        code += [f"  if (task_r < {bsz}) {{", *["    " + ln for ln in step(0)],
                 "  } else {", *["    " + ln for ln in step(1)], "  }"]
    code.append("}")
    return "\n".join(code)


def _arrays(node: Node) -> tuple[int, str]:
    """A task's recurrence state (h, and c for LSTM), its gate values and GRU's two reset products;
    the hidden size may make them too large for the stack. Both directions reuse them."""
    h, g = _dims(node)[3], _GATES[node.op]
    dt = node.inputs[0].dtype
    names = {"RNN": ("hs",), "GRU": ("hs", "hr") if node.attr("linear_before_reset", 0) else ("hs", "hr", "rh"),
             "LSTM": ("hs", "cs")}[node.op]
    return task_arrays([(n, dt, h) for n in names] + [("gs", dt, g * h)])


for _op in ("RNN", "GRU", "LSTM"):
    register(OpDef(_op, "kernel", _infer, emit=_emit, scratch=lambda node: _arrays(node)[0]))
