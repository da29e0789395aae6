"""Gradient rules, one module per op family; importing this package attaches them to the op table
(``OpDef.grad``) and registers the internal ops some of them build (domain ``aotc.``)."""

# The families' op modules first (aotc.ops imports this package among them): rules attach to their OpDefs.
import aotc.ops.attention
import aotc.ops.conv
import aotc.ops.elementwise
import aotc.ops.index
import aotc.ops.linalg
import aotc.ops.nn
import aotc.ops.norm
import aotc.ops.reduce
import aotc.ops.rnn
import aotc.ops.shape  # noqa: F401
from aotc.ops.grads import (  # noqa: F401
    attention,
    conv,
    depthwise,
    elementwise,
    linalg,
    losses,
    nn,
    norm,
    pool,
    reduce,
    resize,
    rnn,
    shape,
)
from aotc.ops.grads.builder import GradBuilder, differentiable, rule

__all__ = ["GradBuilder", "differentiable", "rule"]
