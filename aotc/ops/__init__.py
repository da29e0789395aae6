"""Op definitions. Importing this package registers every supported op in ``registry.OPS``."""

from aotc.ops import (  # noqa: F401
    attention,
    conv,
    dynamic,
    elementwise,
    grads,
    index,
    integer,
    linalg,
    ml,
    nn,
    norm,
    reduce,
    rnn,
    shape,
    signal,
    training,
    vision,
)
from aotc.ops.registry import OPS, OpDef, get

__all__ = ["OPS", "OpDef", "get"]
