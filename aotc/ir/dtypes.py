"""The element types aotc knows, and how each one is spelled in numpy, ONNX and C.

Types C has no arithmetic type for (bfloat16, the float8/float4 formats, int4/uint4/int2/uint2) are
*emulated*. Their numpy spelling is ml_dtypes' (what onnx itself uses). In memory each element sits
in an integer container, one element per byte (uint16_t for bfloat16), with the bit layout of
ml_dtypes' arrays, so numpy buffers and weights pass through unchanged; ``runtime/aotc_types.h``
documents it for C users. Kernels never compute on the containers: a read converts to the compute
type (float, or int32_t for the small integers), every result of an emulated type is rounded back
to it right away (the reference rounds op by op), and a write converts to the container. Rounding
is to nearest even, overflowing as ml_dtypes does (inf, NaN, or wrapping integers); Cast and
QuantizeLinear add their saturating variants themselves.

Strings (ONNX STRING) are numpy ``object`` arrays of ``str``, as onnx uses. In C an element is an
``aotc_string``, a ``const char *`` to a NUL-terminated UTF-8 string that the caller owns. Strings
can be read (compared, looked up, moved by views), never created: a new string would need memory the
library cannot allocate, so string constants and string outputs are refused (aotc/passes/strings.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

# numpy dtype -> (C type, ONNX enum, short name used in headers and metadata)
_TABLE: dict[np.dtype, tuple[str, int, str]] = {
    np.dtype(np.float32): ("float", TensorProto.FLOAT, "float32"),
    np.dtype(np.float64): ("double", TensorProto.DOUBLE, "float64"),
    # C23/ISO TS 18661-3 half precision (GCC >= 12, Clang >= 15 on x86-64 and AArch64); arithmetic
    # is done in it directly, math functions go through double.
    np.dtype(np.float16): ("_Float16", TensorProto.FLOAT16, "float16"),
    np.dtype(np.int64): ("int64_t", TensorProto.INT64, "int64"),
    np.dtype(np.int32): ("int32_t", TensorProto.INT32, "int32"),
    np.dtype(np.int16): ("int16_t", TensorProto.INT16, "int16"),
    np.dtype(np.int8): ("int8_t", TensorProto.INT8, "int8"),
    np.dtype(np.uint64): ("uint64_t", TensorProto.UINT64, "uint64"),
    np.dtype(np.uint32): ("uint32_t", TensorProto.UINT32, "uint32"),
    np.dtype(np.uint16): ("uint16_t", TensorProto.UINT16, "uint16"),
    np.dtype(np.uint8): ("uint8_t", TensorProto.UINT8, "uint8"),
    np.dtype(np.bool_): ("_Bool", TensorProto.BOOL, "bool"),
    # Emulated: the C type is the container (see the module docstring and _EMULATED).
    np.dtype(ml_dtypes.bfloat16): ("uint16_t", TensorProto.BFLOAT16, "bfloat16"),
    np.dtype(ml_dtypes.float8_e4m3fn): ("uint8_t", TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"),
    np.dtype(ml_dtypes.float8_e4m3fnuz): ("uint8_t", TensorProto.FLOAT8E4M3FNUZ, "float8_e4m3fnuz"),
    np.dtype(ml_dtypes.float8_e5m2): ("uint8_t", TensorProto.FLOAT8E5M2, "float8_e5m2"),
    np.dtype(ml_dtypes.float8_e5m2fnuz): ("uint8_t", TensorProto.FLOAT8E5M2FNUZ, "float8_e5m2fnuz"),
    np.dtype(ml_dtypes.float8_e8m0fnu): ("uint8_t", TensorProto.FLOAT8E8M0, "float8_e8m0fnu"),
    np.dtype(ml_dtypes.float4_e2m1fn): ("uint8_t", TensorProto.FLOAT4E2M1, "float4_e2m1fn"),
    np.dtype(ml_dtypes.int4): ("uint8_t", TensorProto.INT4, "int4"),
    np.dtype(ml_dtypes.uint4): ("uint8_t", TensorProto.UINT4, "uint4"),
    np.dtype(ml_dtypes.int2): ("uint8_t", TensorProto.INT2, "int2"),
    np.dtype(ml_dtypes.uint2): ("uint8_t", TensorProto.UINT2, "uint2"),
    # A pointer per element (see the module docstring); typedef'd in the header and aotc_types.h.
    np.dtype(object): ("aotc_string", TensorProto.STRING, "string"),
}
STRING = np.dtype(object)
_FROM_ONNX = {onnx_t: dt for dt, (_, onnx_t, _) in _TABLE.items()}
_FROM_NAME = {name: dt for dt, (_, _, name) in _TABLE.items()}

# Stable numeric codes for the generated metadata (NAME_input_dtype()); never renumber. The codes
# are ONNX's TensorProto numbers.
DTYPE_CODES: dict[str, int] = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "string": 8, "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13,
    "bfloat16": 16, "float8_e4m3fn": 17, "float8_e4m3fnuz": 18, "float8_e5m2": 19, "float8_e5m2fnuz": 20,
    "uint4": 21, "int4": 22, "float4_e2m1fn": 23, "float8_e8m0fnu": 24, "uint2": 25, "int2": 26,
}


@dataclass(frozen=True)
class Emulated:
    """How kernels compute on an emulated type (functions of runtime/aotc_types.h)."""

    compute: str   # the C type arithmetic happens in
    load: str      # container -> compute type
    store: str     # compute type -> container; ``{x}`` is the value
    suffix: str    # the type's name in aotc_types.h (aotc_f32_to_SUFFIX, aotc_SUFFIX_to_f32)


def _small_float(suffix: str, store: str | None = None) -> Emulated:
    return Emulated("float", f"aotc_{suffix}_to_f32", store or f"aotc_f32_to_{suffix}({{x}}, 0)", suffix)


_EMULATED: dict[np.dtype, Emulated] = {
    np.dtype(ml_dtypes.bfloat16): _small_float("bf16", "aotc_f32_to_bf16({x})"),
    np.dtype(ml_dtypes.float8_e4m3fn): _small_float("e4m3fn"),
    np.dtype(ml_dtypes.float8_e4m3fnuz): _small_float("e4m3fnuz"),
    np.dtype(ml_dtypes.float8_e5m2): _small_float("e5m2"),
    np.dtype(ml_dtypes.float8_e5m2fnuz): _small_float("e5m2fnuz"),
    # E8M0 holds scales; nothing computes in it. Nearest keeps every E8M0 value, 2^-127 included.
    np.dtype(ml_dtypes.float8_e8m0fnu): _small_float("e8m0", "aotc_f32_to_e8m0({x}, 1, AOTC_E8M0_NEAREST)"),
    np.dtype(ml_dtypes.float4_e2m1fn): _small_float("e2m1", "aotc_f32_to_e2m1({x})"),
    np.dtype(ml_dtypes.int4): Emulated("int32_t", "aotc_i4_to_i32", "aotc_to_4bit({x})", "i4"),
    np.dtype(ml_dtypes.uint4): Emulated("int32_t", "aotc_u4_to_i32", "aotc_to_4bit({x})", "u4"),
    np.dtype(ml_dtypes.int2): Emulated("int32_t", "aotc_i2_to_i32", "aotc_to_2bit({x})", "i2"),
    np.dtype(ml_dtypes.uint2): Emulated("int32_t", "aotc_u2_to_i32", "aotc_to_2bit({x})", "u2"),
}


def c_type(dt: np.dtype) -> str:
    """The C type of an element in memory (a container for emulated types)."""
    return _TABLE[np.dtype(dt)][0]


def onnx_type(dt: np.dtype) -> int:
    return _TABLE[np.dtype(dt)][1]


def dtype_name(dt: np.dtype) -> str:
    return _TABLE[np.dtype(dt)][2]


def emulated(dt: np.dtype) -> Emulated | None:
    """How to compute on ``dt``; None for types C computes on directly."""
    return _EMULATED.get(np.dtype(dt))


def compute_type(dt: np.dtype) -> str:
    """The C type kernels compute values of ``dt`` in."""
    em = emulated(dt)
    return em.compute if em else c_type(dt)


def load(dt: np.dtype, expr: str) -> str:
    """A C expression of the compute type for ``expr``, an element read from memory."""
    em = emulated(dt)
    return f"{em.load}({expr})" if em else expr


def store(dt: np.dtype, expr: str) -> str:
    """``expr`` (of the compute type) as the element to write to memory."""
    em = emulated(dt)
    return em.store.format(x=expr) if em else expr


def round_to(dt: np.dtype, expr: str) -> str:
    """``expr`` rounded to ``dt``'s values, still of the compute type: an emulated op's result."""
    return load(dt, store(dt, expr)) if emulated(dt) else expr


def from_onnx(elem_type: int) -> np.dtype:
    from aotc.errors import AotcError

    if elem_type not in _FROM_ONNX:
        raise AotcError(f"unsupported tensor element type {TensorProto.DataType.Name(elem_type)}")
    return _FROM_ONNX[elem_type]


def from_name(name: str) -> np.dtype:
    from aotc.errors import AotcError

    key = name.lower().removeprefix("dt_")
    key = {"float": "float32", "double": "float64"}.get(key, key)
    if key not in _FROM_NAME:
        raise AotcError(f"unknown dtype {name!r}")
    return _FROM_NAME[key]


def is_supported(dt: np.dtype) -> bool:
    return np.dtype(dt) in _TABLE


def is_string(dt: np.dtype | None) -> bool:
    return dt is not None and np.dtype(dt) == STRING
