"""Python bindings of a ``--target cuda`` library: ``aotc.load`` returns a ``CudaModel`` for one.

The library itself is opened with cffi (its NAME.cdef, the build id checked as for a C library). Device
memory and copies go through the CUDA runtime (libcudart), loaded with ctypes when a model is loaded, so
importing aotc needs no CUDA. Inputs and outputs may be numpy arrays (copied to and from the GPU) or
device arrays that expose ``__cuda_array_interface__`` (PyTorch CUDA tensors, CuPy and Numba arrays),
used in place with no copy; DLPack-only producers convert through one of those (``cupy.from_dlpack``).
A run with only device outputs returns without waiting for the GPU, as CUDA calls do; a run that copies
outputs to numpy waits for its stream, and so does a run of a model whose kernels read run-time indices
(Gather), to raise ``IndexOutOfRangeError`` as the C library's bindings do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cffi
import numpy as np

from aotc.bindings import TensorSpec, _open_library, read_metadata
from aotc.errors import AotcError, run_error
from aotc.ir import dtypes

if TYPE_CHECKING:
    from aotc.profile import Profile

_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
# NAME_ERR_CUDA (aotc/codegen/cuda/library.py).
CUDA_STATUS = 16


def _cudart_candidates() -> list[str]:
    names = []
    for root in filter(None, (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")):
        names += [str(p) for p in sorted(Path(root, "lib64").glob("libcudart.so*"))]
    try:
        import nvidia  # pip's nvidia-cuda-runtime wheels (CUDA 13 and 12 layouts)

        for base in nvidia.__path__:
            names += [str(p) for pat in ("cu13/lib/libcudart.so*", "cuda_runtime/lib/libcudart.so*")
                      for p in sorted(Path(base).glob(pat))]
    except ImportError:
        pass
    found = ctypes.util.find_library("cudart")
    return [*names, *([found] if found else []), "libcudart.so"]


class CudaRuntime:
    """The few CUDA runtime calls the bindings make, through ctypes."""

    _instance: CudaRuntime | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        errors = []
        for name in _cudart_candidates():
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError as e:
                errors.append(str(e))
        else:
            raise AotcError("cannot load the CUDA runtime (libcudart): install the CUDA toolkit or "
                            "pip install nvidia-cuda-runtime")
        lib = self.lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]

    @classmethod
    def get(cls) -> CudaRuntime:
        with cls._lock:
            if cls._instance is None:
                cls._instance = CudaRuntime()
            return cls._instance

    def check(self, code: int, what: str) -> None:
        if code != 0:
            msg = self.lib.cudaGetErrorString(code).decode(errors="replace")
            raise AotcError(f"{what} failed: {msg} (CUDA error {code})")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        code = self.lib.cudaGetDeviceCount(ctypes.byref(n))
        return n.value if code == 0 else 0

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), max(nbytes, 1)), f"cudaMalloc({nbytes})")
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(ptr))

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        if nbytes:
            self.check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind,
                                                ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def sync(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")


class DeviceBuffer:
    """Device memory owned by the bindings (freed with the object)."""

    def __init__(self, rt: CudaRuntime, nbytes: int) -> None:
        self.rt, self.nbytes, self.ptr = rt, nbytes, rt.malloc(nbytes)

    def __del__(self) -> None:
        if getattr(self, "ptr", 0):
            self.rt.free(self.ptr)


def stream_handle(stream: Any) -> int:
    """A cudaStream_t from None (the legacy default stream), an int, or a stream object of PyTorch
    (``cuda_stream``), CuPy (``ptr``) or Numba (``handle``)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    handle = getattr(stream, "handle", None)
    if handle is not None:
        return int(getattr(handle, "value", handle) or 0)
    raise TypeError(f"stream must be None, an int handle or a CUDA stream object, got {type(stream).__name__}")


def device_pointer(x: Any, t: TensorSpec, model: str, writable: bool) -> int | None:
    """The device address of ``x`` if it is a C-contiguous device array of ``t``'s dtype and shape (None if
    it is not a device array at all)."""
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = tuple(cai["shape"])
    dt = np.dtype(cai["typestr"])
    if dt != t.dtype:
        raise TypeError(f"{model}: {t.name!r} must be {t.dtype}, got a device array of {dt}")
    if shape != t.shape:
        raise ValueError(f"{model}: {t.name!r} must have shape {list(t.shape)}, got {list(shape)}")
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != tuple(np.empty(shape, dt).strides):
        raise ValueError(f"{model}: device array {t.name!r} must be C-contiguous")
    ptr, readonly = cai["data"]
    if writable and readonly:
        raise ValueError(f"{model}: device array for {t.name!r} is read-only")
    return int(ptr)


class CudaModel:
    """A compiled CUDA model: ``run(feeds, out=None, stream=None) -> [outputs]`` in fetch order."""

    def __init__(self, prefix: str | Path) -> None:
        prefix = Path(prefix)
        self.metadata = read_metadata(prefix)
        self.name: str = self.metadata["name"]
        self.inputs = [TensorSpec(t["name"], dtypes.from_name(t["dtype"]), tuple(t["shape"]))
                       for t in self.metadata["inputs"]]
        self.outputs = [TensorSpec(t["name"], dtypes.from_name(t["dtype"]), tuple(t["shape"]))
                        for t in self.metadata["outputs"]]
        self.rt = CudaRuntime.get()
        if self.rt.device_count() < 1:
            raise AotcError(f"cannot run {prefix}: it is a CUDA library and this machine has no usable CUDA GPU")
        self._ffi = cffi.FFI()
        self._lib = _open_library(self._ffi, prefix, self.metadata)
        self.workspace_bytes = int(getattr(self._lib, f"{self.name}_workspace_size")())
        self.constants_bytes = int(getattr(self._lib, f"{self.name}_constants_size")())
        offset = int(getattr(self._lib, f"{self.name}_status_offset")())
        self.status_offset = None if offset == int(self._ffi.cast("size_t", -1)) else offset
        self.constants = DeviceBuffer(self.rt, self.constants_bytes)
        self._check(getattr(self._lib, f"{self.name}_load_constants")(self._void(self.constants.ptr), self._void(0)))
        self.rt.sync(0)
        self._local = threading.local()

    def __repr__(self) -> str:
        sig = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.inputs)
        return f"<aotc.CudaModel {self.name}({sig})>"

    @property
    def num_kernels(self) -> int:
        return int(self.metadata["num_kernels"])

    def _void(self, ptr: int):  # noqa: ANN202 - a cffi pointer
        return self._ffi.cast("void *", ptr)

    def _check(self, rc: int) -> None:
        if rc == CUDA_STATUS:
            raise AotcError(f"{self.name}: a CUDA call of the run failed (status {self.name.upper()}_ERR_CUDA)")
        if rc != 0:
            raise run_error(self.name, rc)

    def _staging(self, key: str, nbytes: int) -> DeviceBuffer:
        """This thread's device buffer for copying a host array (kept for the next run)."""
        bufs = self._local.__dict__.setdefault("bufs", {})
        if key not in bufs or bufs[key].nbytes != nbytes:
            bufs[key] = DeviceBuffer(self.rt, nbytes)
        return bufs[key]

    def _feeds(self, feeds: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
        if not isinstance(feeds, Mapping):
            feeds = list(feeds)
            if len(feeds) != len(self.inputs):
                raise ValueError(f"{self.name}: expected {len(self.inputs)} inputs, got {len(feeds)}")
            return feeds
        names = [t.name for t in self.inputs]
        if sorted(feeds) != sorted(names):
            raise ValueError(f"{self.name}: feeds must be exactly {names}")
        return [feeds[n] for n in names]

    def _call(self, fn, feeds, out, stream, *extra) -> list[Any]:
        s = stream_handle(stream)
        ins = []
        for i, (t, x) in enumerate(zip(self.inputs, self._feeds(feeds), strict=True)):
            ptr = device_pointer(x, t, self.name, writable=False)
            if ptr is None:
                a = np.asarray(x)
                if a.dtype != t.dtype:
                    raise TypeError(f"{self.name}: input {t.name!r} must be {t.dtype}, got {a.dtype}")
                if a.shape != t.shape:
                    raise ValueError(f"{self.name}: input {t.name!r} must have shape {list(t.shape)}, "
                                     f"got {list(a.shape)}")
                a = np.ascontiguousarray(a)
                buf = self._staging(f"in{i}", a.nbytes)
                self.rt.copy(buf.ptr, a.ctypes.data, a.nbytes, _H2D, s)
                ptr = buf.ptr
            ins.append(ptr)
        if out is not None and len(out) != len(self.outputs):
            raise ValueError(f"{self.name}: out must hold {len(self.outputs)} arrays, got {len(out)}")
        results: list[Any] = []
        outs, copies = [], []
        for i, t in enumerate(self.outputs):
            o = out[i] if out is not None else np.empty(t.shape, t.dtype)
            ptr = device_pointer(o, t, self.name, writable=True)
            if ptr is None:
                if not isinstance(o, np.ndarray) or o.dtype != t.dtype or o.shape != t.shape \
                        or not o.flags.c_contiguous or not o.flags.writeable:
                    raise ValueError(f"{self.name}: out for {t.name!r} must be a writable C-contiguous {t.dtype} "
                                     f"array of shape {list(t.shape)}, or such a device array")
                buf = self._staging(f"out{i}", o.nbytes)
                copies.append((o, buf))
                ptr = buf.ptr
            outs.append(ptr)
            results.append(o)
        ws = self._staging("workspace", self.workspace_bytes) if self.workspace_bytes else None
        ins_c = self._ffi.new("void *[]", [self._void(p) for p in ins] or [self._ffi.NULL])
        outs_c = self._ffi.new("void *[]", [self._void(p) for p in outs] or [self._ffi.NULL])
        self._check(fn(ins_c, outs_c, self._void(self.constants.ptr), self._void(ws.ptr if ws else 0),
                       self._void(s), *extra))
        for o, buf in copies:
            self.rt.copy(o.ctypes.data, buf.ptr, o.nbytes, _D2H, s)
        if self.status_offset is not None:  # a kernel may have found a bad index: wait and read its word
            status = np.zeros(1, np.int32)
            self.rt.copy(status.ctypes.data, ws.ptr + self.status_offset, 4, _D2H, s)
            self.rt.sync(s)
            if status[0]:
                raise run_error(self.name, int(status[0]))
        elif copies:
            self.rt.sync(s)
        return results

    def run(self, feeds: Mapping[str, Any] | Sequence[Any], out: Sequence[Any] | None = None,
            stream: Any = None) -> list[Any]:
        """The outputs in fetch order: numpy arrays, or ``out``'s arrays (numpy or device) when given.
        ``stream``: a CUDA stream (PyTorch, CuPy or Numba object, or a handle; default the legacy default
        stream)."""
        return self._call(getattr(self._lib, f"{self.name}_run_v"), feeds, out, stream)

    def __call__(self, **feeds: Any) -> list[Any]:
        return self.run(feeds)

    def profile(self, feeds: Mapping[str, Any] | Sequence[Any], iterations: int = 10,
                trace: str | Path | None = None, warmup: int = 1) -> Profile:
        """Per-kernel GPU times from CUDA events (a ``--profile`` build); ``trace`` writes a Chrome trace."""
        from aotc.profile import Profile

        if not self.metadata.get("profile"):
            raise AotcError(f"{self.name} was not compiled with --profile")
        fn = getattr(self._lib, f"{self.name}_run_profiled")
        times = self._ffi.new("uint64_t[]", max(1, 2 * self.num_kernels))
        runs = []
        for i in range(warmup + iterations):
            self._call(fn, feeds, None, None, times)
            if i >= warmup:
                runs.append(list(times)[:2 * self.num_kernels])
        prof = Profile(self.metadata, runs, 1)
        if trace is not None:
            prof.write_trace(trace)
        return prof


def is_cuda_library(prefix: Path) -> bool:
    """Whether OUTDIR/NAME's NAME.json describes a --target cuda library (False when it cannot be read:
    the C loader then says what is wrong)."""
    try:
        target = json.loads((prefix.parent / f"{prefix.name}.json").read_text()).get("target")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(target, dict) and target.get("triple") == "cuda"


def load_cuda(prefix: Path, threads: object = 1) -> CudaModel:
    if threads != 1:
        raise AotcError(f"{prefix} is a CUDA library: it runs on the GPU and takes no threads")
    return CudaModel(prefix)
