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
    meaning = "a size in dims is not one the library runs (below 1, above its bound, or not compiled), or dims is NULL"


class DynamicModel(CompiledModel):
    """A compiled model with dimensions that vary (``dims``: each one's name and largest size;
    ``sizes``: each one's sizes compiled, or None for a batch, which runs every size from 1 to the
    largest): ``run`` takes feeds of sizes it allows and returns outputs of those sizes.
    ``inputs``/``outputs`` list the largest shapes."""

    def __init__(self, prefix: str | Path, threads: int | ThreadPool = 1) -> None:
        super().__init__(prefix, threads)
        self.dims: list[tuple[str, int]] = [(d["name"], int(d["max"])) for d in self.metadata["dims"]]
        self.sizes: list[list[int] | None] = [d.get("sizes") for d in self.metadata["dims"]]
        # Per input and output: axis -> the dimension it is.
        self._axes_in = [_axes(t) for t in self.metadata["inputs"]]
        self._axes_out = [_axes(t) for t in self.metadata["outputs"]]
        self._run_dims = getattr(self._lib, f"{self.name}_run_dims_parallel")

    def __repr__(self) -> str:
        what = [f"{d}<={m}" if s is None else f"{d} in {s}" for (d, m), s in zip(self.dims, self.sizes, strict=True)]
        sig = ", ".join(f"{t.name}: {t.dtype}[" + ", ".join(what[axes[a]] if a in axes else str(n)
                                                          for a, n in enumerate(t.shape)) + "]"
                        for t, axes in zip(self.inputs, self._axes_in, strict=True))
        return f"<aotc.DynamicModel {self.name}({sig})>"

    def size_of(self, feeds: Mapping[str, object]) -> list[int]:
        """The size of each dimension that varies, from the feeds (the inputs that have it must agree)."""
        found: list[dict[str, int]] = [{} for _ in self.dims]
        for t, axes in zip(self.inputs, self._axes_in, strict=True):
            if t.name in feeds:
                shape = np.shape(feeds[t.name])
                for a, d in axes.items():
                    found[d][t.name] = int(shape[a]) if len(shape) > a else -1
        sizes = []
        for (dim, bound), allowed, seen in zip(self.dims, self.sizes, found, strict=True):
            if len(set(seen.values())) != 1:
                raise ValueError(f"{self.name}: the inputs disagree on {dim!r}: {seen}")
            n = next(iter(seen.values()))
            if allowed is None and not 1 <= n <= bound:
                raise ValueError(f"{self.name}: {dim!r} is {n}, outside 1..{bound} (the bound it was compiled for)")
            if allowed is not None and n not in allowed:
                raise ValueError(f"{self.name}: {dim!r} is {n}, not one of the sizes compiled ({allowed})")
            sizes.append(n)
        return sizes

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
        arrays = [self._array(t, feeds[t.name], _at(t.shape, axes, n))
                  for t, axes in zip(self.inputs, self._axes_in, strict=True)]
        shapes = [_at(t.shape, axes, n) for t, axes in zip(self.outputs, self._axes_out, strict=True)]
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
        dims = self._ffi.new("int64_t[]", n)
        rc = self._run_dims(dims, ins_c, outs_c, self._local.ws_c, ws.size, self._par)
        if rc == DimOutOfRangeError.code:
            raise DimOutOfRangeError(self.name)
        if rc != 0:
            raise run_error(self.name, rc)
        return outs

    def _array(self, t: TensorSpec, x: object, shape: tuple[int, ...]) -> np.ndarray:
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


def _axes(t: dict) -> dict[int, int]:
    """Axis -> dimension, for a tensor's metadata."""
    return {int(a): int(d) for a, d in t.get("dims", {}).items()}


def _at(shape: tuple[int, ...], axes: dict[int, int], sizes: list[int]) -> tuple[int, ...]:
    return tuple(sizes[axes[a]] if a in axes else n for a, n in enumerate(shape))
