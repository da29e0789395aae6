"""TensorFlow's DataType, TensorShapeProto, TensorProto and AttrValue as numpy and Python values."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from aotc.errors import AotcError
from aotc.frontends.tensorflow.proto import types
from aotc.ir import dtypes

# TF's DataType names -> numpy; a name types_pb2 lacks (an older tensorboard) is simply not mapped.
_NUMPY = {
    "DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_HALF": np.float16, "DT_BFLOAT16": ml_dtypes.bfloat16,
    "DT_INT64": np.int64, "DT_INT32": np.int32, "DT_INT16": np.int16, "DT_INT8": np.int8,
    "DT_UINT64": np.uint64, "DT_UINT32": np.uint32, "DT_UINT16": np.uint16, "DT_UINT8": np.uint8,
    "DT_BOOL": np.bool_, "DT_STRING": object,
    "DT_FLOAT8_E5M2": ml_dtypes.float8_e5m2, "DT_FLOAT8_E4M3FN": ml_dtypes.float8_e4m3fn,
    "DT_FLOAT8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "DT_FLOAT8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
}
# The repeated field of TensorProto that holds each type's values when tensor_content is empty.
_VALUE_FIELD = {
    np.dtype(np.float32): "float_val", np.dtype(np.float64): "double_val", np.dtype(np.int64): "int64_val",
    np.dtype(np.int32): "int_val", np.dtype(np.int16): "int_val", np.dtype(np.int8): "int_val",
    np.dtype(np.uint8): "int_val", np.dtype(np.uint16): "int_val", np.dtype(np.uint32): "uint32_val",
    np.dtype(np.uint64): "uint64_val", np.dtype(np.bool_): "bool_val",
    # 16-bit floats travel as their bit patterns in half_val, the float8 types as bytes in float8_val.
    np.dtype(np.float16): "half_val", np.dtype(ml_dtypes.bfloat16): "half_val",
    **{np.dtype(t): "float8_val" for t in (ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn,
                                           ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz)},
}


def type_name(dt: int) -> str:
    try:
        return types().DataType.Name(dt)
    except ValueError:
        return f"DataType {dt}"


def to_numpy(dt: int, what: str) -> np.dtype:
    """The numpy dtype of TF DataType ``dt`` (a *_REF type as its value type)."""
    name = type_name(dt).removesuffix("_REF")
    if name not in _NUMPY:
        raise AotcError(f"{what}: unsupported type {name}")
    return np.dtype(_NUMPY[name])


def from_numpy(dt: np.dtype) -> str:
    """TF's name for a numpy dtype, for messages."""
    return next((k for k, v in _NUMPY.items() if np.dtype(v) == np.dtype(dt)), str(dt))


def shape_of(proto: Any) -> list[int | None] | None:
    """A TensorShapeProto as dims (None for an unknown dim), or None for an unknown rank."""
    if proto.unknown_rank:
        return None
    return [None if d.size < 0 else int(d.size) for d in proto.dim]


def to_array(t: Any, what: str) -> np.ndarray:
    """A TensorProto's value. As in TensorFlow, fewer values than elements repeat the last one (a
    splat constant stores one value) and none at all means zeros."""
    dt = to_numpy(t.dtype, what)
    shape = shape_of(t.tensor_shape)
    if shape is None or any(d is None for d in shape):
        raise AotcError(f"{what}: a constant needs a fully known shape, has {shape}")
    n = int(np.prod(shape, dtype=np.int64))
    if dt == dtypes.STRING:
        raise AotcError(f"{what} is a string tensor: string constants are not supported "
                        "(strings may only be graph inputs)")
    if t.tensor_content:
        if len(t.tensor_content) != n * dt.itemsize:
            raise AotcError(f"{what}: tensor_content has {len(t.tensor_content)} bytes, shape {shape} of "
                            f"{from_numpy(dt)} needs {n * dt.itemsize}")
        return np.frombuffer(t.tensor_content, dtype=dt.newbyteorder("<")).astype(dt).reshape(shape)
    field = _VALUE_FIELD[dt]
    if field == "float8_val":
        vals = np.frombuffer(t.float8_val, dtype=np.uint8).view(dt)
    elif field == "half_val":
        vals = np.array(list(t.half_val), dtype=np.uint16).view(dt)
    else:
        vals = np.array(list(getattr(t, field))).astype(dt).reshape(-1)
    if len(vals) > n:
        raise AotcError(f"{what}: {len(vals)} values for shape {shape}")
    if len(vals) < n:
        fill = vals[-1] if len(vals) else np.zeros((), dt)
        vals = np.concatenate([vals, np.full(n - len(vals), fill, dt)])
    return vals.reshape(shape)


def attr_value(a: Any, what: str) -> Any:
    """An AttrValue as Python: str, int, float, bool, a DataType number, dims (see ``shape_of``), a
    numpy array (for a tensor), or a list of those; a function as its name."""
    kind = a.WhichOneof("value")
    if kind == "s":
        return a.s.decode("utf-8", "replace")
    if kind in ("i", "f", "b", "type"):
        return getattr(a, kind)
    if kind == "shape":
        return shape_of(a.shape)
    if kind == "tensor":
        return to_array(a.tensor, what)
    if kind == "func":
        return a.func.name
    if kind == "list":
        lst = a.list
        if lst.s:
            return [s.decode("utf-8", "replace") for s in lst.s]
        for name in ("i", "f", "b", "type"):
            if getattr(lst, name):
                return list(getattr(lst, name))
        if lst.shape:
            return [shape_of(s) for s in lst.shape]
        if lst.tensor:
            return [to_array(t, what) for t in lst.tensor]
        return []
    return None
