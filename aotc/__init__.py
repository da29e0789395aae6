"""aotc: an ahead-of-time compiler from ONNX graphs to plain, fused, vectorized C libraries."""

__version__ = "0.1.0"

from aotc.bindings import CompiledModel, load  # noqa: E402
from aotc.compiler import compile  # noqa: E402,A004
from aotc.errors import (  # noqa: E402
    AotcError,
    IndexOutOfRangeError,
    NullArgumentError,
    RunError,
    WorkspaceError,
)

__all__ = ["AotcError", "CompiledModel", "IndexOutOfRangeError", "NullArgumentError", "RunError", "WorkspaceError",
           "compile", "load", "__version__"]
