"""Python bindings of a library with a dimension that varies (aotc compile --dynamic): the size comes
from the feeds (docs/dynamic_shapes.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from aotc.bindings import CompiledModel, TensorSpec, ThreadPool
from aotc.errors import AotcError, RunError, run_error


class DimOutOfRangeError(RunError):
    code = 16  # aotc.dynamic_library.DIM_OUT_OF_RANGE
    status = "ERR_DIM_OUT_OF_RANGE"
    meaning = "a size in dims is below 1 or above its bound, or dims is NULL"


class DynamicModel(CompiledModel):
    """A compiled model whose first axis varies up to ``dims[0][1]``: ``run`` takes feeds of any size
    from 1 to the bound and returns outputs of that size. ``inputs``/``outputs`` list the bounds."""

    def __init__(self, prefix: str | Path, threads: int | ThreadPool = 1) -> None:
        super().__init__(prefix, threads)
        self.dims: list[tuple[str, int]] = [(d["name"], int(d["max"])) for d in self.metadata["dims"]]
        self._varies = [bool(t["dims"]) for t in self.metadata["inputs"]]
        self._run_dims = getattr(self._lib, f"{self.name}_run_dims_parallel")

    def __repr__(self) -> str:
        (dim, bound), = self.dims
        sig = ", ".join(f"{t.name}: {t.dtype}[{dim}<={bound}{''.join(f', {d}' for d in t.shape[1:])}]" if v
                        else f"{t.name}: {t.dtype}{list(t.shape)}"
                        for t, v in zip(self.inputs, self._varies, strict=True))
        return f"<aotc.DynamicModel {self.name}({sig})>"

    def size_of(self, feeds: Mapping[str, object]) -> int:
        """The size of the dimension that varies, from the feeds (each input that has it must agree)."""
        (dim, bound), = self.dims
        sizes = {t.name: int(np.shape(feeds[t.name])[0]) if np.ndim(feeds[t.name]) else -1
                 for t, v in zip(self.inputs, self._varies, strict=True) if v and t.name in feeds}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"{self.name}: the inputs disagree on {dim!r}: {sizes}")
        n = next(iter(sizes.values()))
        if not 1 <= n <= bound:
            raise ValueError(f"{self.name}: {dim!r} is {n}, outside 1..{bound} (the bound it was compiled for)")
        return n

    def run(self, feeds: Mapping[str, object] | Sequence[object], out: Sequence[np.ndarray] | None = None,
            raw: bool = False) -> list[np.ndarray]:
        """The outputs in fetch order, with the size of the feeds along the dimension that varies."""
        if not isinstance(feeds, Mapping):
            feeds = list(feeds)
            if len(feeds) != len(self.inputs):
                raise ValueError(f"{self.name}: expected {len(self.inputs)} inputs, got {len(feeds)}")
            feeds = {t.name: x for t, x in zip(self.inputs, feeds, strict=True)}
        missing = [t.name for t in self.inputs if t.name not in feeds]
        unknown = [k for k in feeds if k not in {t.name for t in self.inputs}]
        if missing or unknown:
            raise ValueError(f"{self.name}: feeds must be exactly {[t.name for t in self.inputs]}"
                             + (f"; unknown: {unknown}" if unknown else "")
                             + (f"; missing: {missing}" if missing else ""))
        n = self.size_of(feeds)
        arrays = [self._array(t, feeds[t.name], n if v else None)
                  for t, v in zip(self.inputs, self._varies, strict=True)]
        shapes = [(n, *t.shape[1:]) for t in self.outputs]
        if out is None:
            outs = [np.empty(s, t.dtype) for s, t in zip(shapes, self.outputs, strict=True)]
        else:
            outs = list(out)
            if len(outs) != len(self.outputs) or any(
                    not isinstance(o, np.ndarray) or o.dtype != t.dtype or o.shape != s or not o.flags.c_contiguous
                    or not o.flags.writeable for o, s, t in zip(outs, shapes, self.outputs, strict=False)):
                raise ValueError(f"{self.name}: out must be {len(self.outputs)} writable C-contiguous arrays of "
                                 f"shapes {[list(s) for s in shapes]}")
        keep = [*arrays, *outs]  # noqa: F841 - buffers must outlive the call
        ins_c = self._ffi.new(self._pointers, [self._ptr(a) for a in arrays] or [self._ffi.NULL])
        outs_c = self._ffi.new(self._pointers, [self._ptr(a) for a in outs] or [self._ffi.NULL])
        ws = self._workspace()
        dims = self._ffi.new("int64_t[]", [n])
        rc = self._run_dims(dims, ins_c, outs_c, self._local.ws_c, ws.size, self._par)
        if rc == DimOutOfRangeError.code:
            raise DimOutOfRangeError(self.name)
        if rc != 0:
            raise run_error(self.name, rc)
        return outs

    def _array(self, t: TensorSpec, x: object, n: int | None) -> np.ndarray:
        shape = t.shape if n is None else (n, *t.shape[1:])
        if isinstance(x, np.ndarray):
            if x.dtype != t.dtype:
                raise TypeError(f"{self.name}: input {t.name!r} must be {t.dtype}, got {x.dtype}")
        else:
            x = np.asarray(x, dtype=t.dtype)
        if x.shape != shape:
            raise ValueError(f"{self.name}: input {t.name!r} must have shape {list(shape)}, got {list(x.shape)}")
        return np.ascontiguousarray(x)

    def profile(self, *args: object, **kwargs: object):  # noqa: ANN201
        raise AotcError(f"{self.name} was compiled with --dynamic, which has no profiling build: profile a "
                        "compile for one size")
