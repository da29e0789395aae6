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
from aotc.jit import JitModel, jit  # noqa: E402
from aotc.training.spec import Train  # noqa: E402

__all__ = ["AotcError", "CompiledModel", "IndexOutOfRangeError", "JitModel", "NullArgumentError", "RunError",
           "Train", "WorkspaceError", "compile", "jit", "load", "__version__"]
