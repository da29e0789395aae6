"""The element types aotc knows, and how each one is spelled in numpy, ONNX and C."""

from __future__ import annotations

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
}
_FROM_ONNX = {onnx_t: dt for dt, (_, onnx_t, _) in _TABLE.items()}
_FROM_NAME = {name: dt for dt, (_, _, name) in _TABLE.items()}

# Stable numeric codes for the generated metadata (NAME_input_dtype()); never renumber.
DTYPE_CODES: dict[str, int] = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13,
}


def c_type(dt: np.dtype) -> str:
    return _TABLE[np.dtype(dt)][0]


def onnx_type(dt: np.dtype) -> int:
    return _TABLE[np.dtype(dt)][1]


def dtype_name(dt: np.dtype) -> str:
    return _TABLE[np.dtype(dt)][2]


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
