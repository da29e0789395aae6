"""The optimizers' updates as elementwise IR nodes, PyTorch's formulas (weight decay 0).

Written as ordinary Sub/Mul/Add/Sqrt nodes, each parameter's update fuses into one loop kernel that
reads the gradient and overwrites the parameter (and its moments) in place in the state buffer
(``Graph.add_update``; aotc/passes/fuse.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from aotc.ir.graph import Value
from aotc.ops.grads.builder import GradBuilder
from aotc.training.spec import Optimizer

# (name, role, shape, dtype[, initial value]) -> a new state input, zero before the first step unless given.
MakeState = Callable[..., Value]


def apply_optimizer(b: GradBuilder, opt: Optimizer, params: list[Value], grads: dict[str, Value],
                    state: MakeState, step: Value) -> None:
    """Append ``opt``'s update of every parameter to ``b``'s graph, as in-place updates of the state, and
    count the step (``step``, the state's int64 counter, which Adam's bias correction and Dropout read).
    The learning rate is the state's ``lr``, a scalar the caller may change between steps (a schedule)."""
    g = b.graph
    dt = np.dtype(params[0].dtype)
    lr = state("lr", "hyperparameter", (), dt, np.array(opt["lr"], dt))
    t = b.op("Add", step, b.const(np.int64(1)))
    g.add_update(step, t)
    if opt.kind in ("adam", "adamw"):  # the bias corrections: scalars computed once per step, not per element
        tf = b.op("Cast", t, to=onnx.helper.np_dtype_to_tensor_dtype(dt))
        one = b.const(1.0, tf.dtype)
        bc1 = b.op("Sub", one, b.op("Pow", b.const(opt["beta1"], tf.dtype), tf))
        bc2 = b.op("Sub", one, b.op("Pow", b.const(opt["beta2"], tf.dtype), tf))
        step_size = b.op("Div", lr, bc1)
        sqrt_bc2 = b.op("Sqrt", bc2)
    wd = opt.params.get("weight_decay", 0.0)
    for p in params:
        grad = grads[p.name]

        def c(x: float, like: Value = p) -> Value:
            return b.const(x, like.dtype)

        if wd and opt.kind != "adamw":  # L2: the decay joins the gradient (AdamW's decays the weight)
            grad = b.op("Add", grad, b.op("Mul", p, c(wd)))
        if opt.kind == "sgd":
            new = b.op("Sub", p, b.op("Mul", grad, lr))
        elif opt.kind == "momentum":
            buf = state(f"{p.name}.momentum", "moment", p.shape, p.dtype)
            buf_new = b.op("Add", b.op("Mul", buf, c(opt["momentum"])), grad)
            g.add_update(buf, buf_new)
            direction = b.op("Add", grad, b.op("Mul", buf_new, c(opt["momentum"]))) if opt["nesterov"] else buf_new
            new = b.op("Sub", p, b.op("Mul", direction, lr))
        else:  # adam, adamw
            b1, b2 = opt["beta1"], opt["beta2"]
            m = state(f"{p.name}.exp_avg", "moment", p.shape, p.dtype)
            v = state(f"{p.name}.exp_avg_sq", "moment", p.shape, p.dtype)
            m_new = b.op("Add", b.op("Mul", m, c(b1)), b.op("Mul", grad, c(1 - b1)))
            v_new = b.op("Add", b.op("Mul", v, c(b2)), b.op("Mul", b.op("Mul", grad, grad), c(1 - b2)))
            g.add_update(m, m_new)
            g.add_update(v, v_new)
            denom = b.op("Add", b.op("Div", b.op("Sqrt", v_new), sqrt_bc2), c(opt["eps"]))
            decayed = p if opt.kind == "adam" or not wd else b.op("Mul", p, b.op("Sub", c(1.0), b.op("Mul", lr, c(wd))))
            new = b.op("Sub", decayed, b.op("Mul", b.op("Div", m_new, denom), step_size))
        g.add_update(p, new)
