"""Gradient rules, one module per op family; importing this package attaches them to the op table
(``OpDef.grad``) and registers the internal ops some of them build (domain ``aotc.``)."""

from aotc.ops.grads import (  # noqa: F401
    conv,
    elementwise,
    linalg,
    losses,
    nn,
    norm,
    pool,
    reduce,
    shape,
)
from aotc.ops.grads.builder import GradBuilder, differentiable, rule

__all__ = ["GradBuilder", "differentiable", "rule"]
