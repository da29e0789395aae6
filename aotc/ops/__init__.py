"""Op definitions. Importing this package registers every supported op in ``registry.OPS``."""

from aotc.ops import conv, elementwise, index, linalg, nn, norm, reduce, shape  # noqa: F401
from aotc.ops.registry import OPS, OpDef, get

__all__ = ["OPS", "OpDef", "get"]
