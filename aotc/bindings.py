"""Python bindings: load a compiled library with cffi and call it with numpy arrays.

cffi's ABI mode reads the declarations aotc wrote next to the library (NAME.cdef), so loading needs
no C compiler. cffi releases the GIL during the call; each thread gets its own workspace, so
several threads may run one model at once. ``threads=N`` runs each kernel on N threads of a pool;
models given the same ``ThreadPool`` share its threads instead of oversubscribing the machine.

Data-dependent outputs (NonZero, Unique, NonMaxSuppression; see ``aotc.ops.dynamic``) come out of
the C library at their upper-bound shape, with their valid extent in extra count outputs. ``run``
trims them to the true shape and leaves the count outputs out, so Python sees ONNX's outputs;
``run(..., raw=True)`` returns the C library's outputs as they are.

A training library (``aotc compile --train``) keeps its state buffer (parameters, optimizer moments,
step counter) in the ``CompiledModel``: ``train_step(feeds)`` updates it and returns the loss, ``run``
reads it, ``state`` maps each state tensor's name to a numpy view of it, and ``save`` writes the model
file back with the trained initializers. One model's state is not for several threads to train at once.

An input the model updates in place (a TensorFlow variable it assigns; ``TensorSpec.updated``) must
be a writable C-contiguous numpy array of its exact dtype and shape, sharing memory with no other
input: ``run`` leaves the new value in that array and returns only the outputs.

A nonzero status from the run raises the ``aotc.RunError`` subclass for it (``IndexOutOfRangeError``
for an out-of-range index input; see ``aotc.errors.RUN_ERRORS``); the outputs are then unspecified.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import cffi
import numpy as np

from aotc.errors import AotcError, run_error
from aotc.ir import dtypes

if TYPE_CHECKING:
    import onnx

    from aotc.profile import Profile


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # for a data-dependent output: its upper bound
    # A data-dependent output: the axis whose extent varies, and the output that holds it.
    bounded_axis: int | None = None
    count: str | None = None
    # An input the run updates in place (a variable the model assigns): ``run`` writes its new value
    # into the caller's array.
    updated: bool = False


def _spec(t: dict) -> TensorSpec:
    b = t.get("bounded")
    return TensorSpec(t["name"], dtypes.from_name(t["dtype"]), tuple(t["shape"]),
                      b["axis"] if b else None, b["count"] if b else None)


class ThreadPool:
    """A pthread pool made by a compiled library (any aotc library's pool can run any model)."""

    def __init__(self, model: CompiledModel, num_threads: int) -> None:
        if num_threads < 1:
            raise ValueError(f"threads must be >= 1, got {num_threads}")
        create = getattr(model._lib, f"{model.name}_pool_create", None)
        if create is None:
            raise AotcError(f"{model.name} was compiled without the thread pool")
        self.num_threads = num_threads
        self._lib = model._lib  # keeps the code alive while the pool exists
        handle = create(num_threads)
        if handle == model._ffi.NULL:
            raise AotcError(f"cannot start {num_threads} threads")
        # An address, so that models loaded through other cffi instances can use the pool too.
        self.address = int(model._ffi.cast("uintptr_t", handle))
        weakref.finalize(self, getattr(model._lib, f"{model.name}_pool_destroy"), handle)


class CompiledModel:
    """A compiled model: ``run(feeds) -> [outputs]`` in fetch order; ``.inputs``/``.outputs``.

    ``.outputs`` are the model's outputs; ``.raw_outputs`` the C library's, which add a count output
    after each data-dependent one.

    ``threads``: how many threads each run uses (default 1: the calling thread only), or a
    ``ThreadPool`` shared with other models (``other.pool``).
    """

    def __init__(self, prefix: str | Path, threads: int | ThreadPool = 1) -> None:
        prefix = Path(prefix)
        self.metadata = read_metadata(prefix)
        self.name: str = self.metadata["name"]
        self.inputs = [TensorSpec(t["name"], dtypes.from_name(t["dtype"]), tuple(t["shape"]),
                                  updated=bool(t.get("updated")))
                       for t in self.metadata["inputs"]]
        self.raw_outputs = [_spec(t) for t in self.metadata["outputs"]]
        self.outputs = [t for t, m in zip(self.raw_outputs, self.metadata["outputs"], strict=True)
                        if not m.get("count_for")]
        self.workspace_bytes: int = self.metadata["workspace_bytes"]
        self.library_path = prefix.parent / f"lib{self.name}.so"
        self._ffi = cffi.FFI()
        self._lib = _open_library(self._ffi, prefix, self.metadata)
        self._run = getattr(self._lib, f"{self.name}_run_parallel")
        self._local = threading.local()
        self.pool: ThreadPool | None = None
        self.threads = 1
        if isinstance(threads, ThreadPool):
            self.pool, self.threads = threads, threads.num_threads
        elif threads != 1:
            self.pool, self.threads = ThreadPool(self, int(threads)), int(threads)
        self.workspace_bytes_used = int(getattr(self._lib, f"{self.name}_workspace_size_for_threads")(self.threads))
        # Per-call work done once: a run of a small model costs a few microseconds of Python.
        self._input_names = [t.name for t in self.inputs]
        self._string_inputs = {t.name for t in self.inputs if dtypes.is_string(t.dtype)}
        self._has_counts = any(t.count is not None for t in self.outputs)
        self._pointers = self._ffi.typeof("void *[]")
        self._par = (self._ffi.cast("aotc_parallel *", self.pool.address) if self.pool is not None
                     else self._ffi.NULL)
        self._train = self.metadata.get("train")
        self.train_inputs: list[TensorSpec] = []
        # The ONNX model a training library came from, when compiled from memory (save() writes it back).
        self.source_model: onnx.ModelProto | None = None
        if self._train is not None:
            self._init_state()

    def _init_state(self) -> None:
        """Allocate the state (64-byte aligned), fill it with NAME_state_init, and bind the run functions to it."""
        assert self._train is not None
        n = int(self._train["state"]["bytes"])
        raw = np.zeros(n + 64, np.uint8)
        off = (-raw.ctypes.data) % 64
        self.state_buffer = raw[off:off + n]
        self._state_c = self._ffi.from_buffer(self.state_buffer)
        self.reset_state()
        self.train_inputs = [TensorSpec(t["name"], dtypes.from_name(t["dtype"]), tuple(t["shape"]))
                             for t in self._train["inputs"]]
        self._loss_spec = _spec(self._train["outputs"][0])
        run, train = self._run, getattr(self._lib, f"{self.name}_train_step_parallel")
        self._run = lambda ins, outs, *rest: run(ins, outs, self._state_c, *rest)
        self._train_step = lambda ins, outs, *rest: train(ins, outs, self._state_c, *rest)
        self._state_views = {t["name"]: np.ndarray(tuple(t["shape"]), dtypes.from_name(t["dtype"]),
                                                   buffer=self.state_buffer, offset=int(t["offset"]))
                             for t in self._train["state"]["tensors"]}

    def reset_state(self) -> None:
        """Back to the model's initial parameters and learning rate, zero moments and step count
        (NAME_state_init)."""
        self._need_train("reset_state")
        rc = getattr(self._lib, f"{self.name}_state_init")(self._state_c)
        if rc != 0:
            raise run_error(self.name, rc)

    def _need_train(self, what: str) -> None:
        if self._train is None:
            raise AotcError(f"{self.name}.{what}: the model was not compiled for training (--train)")

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Each state tensor (parameters, running statistics, moments, ``step``, ``lr``) by name: a writable
        view of the state buffer that ``run`` reads and ``train_step`` updates."""
        self._need_train("state")
        return dict(self._state_views)

    def train_step(self, feeds: Mapping[str, object] | Sequence[object]) -> float:
        """One training step on a batch (the inputs of ``train_inputs``: the model's and the labels);
        updates the state in place and returns the loss (computed before the update)."""
        self._need_train("train_step")
        loss = np.empty(self._loss_spec.shape, self._loss_spec.dtype)
        self._call(self._train_step, feeds, out=[loss], specs=self.train_inputs)
        return float(loss.reshape(-1)[0])

    def save(self, path: str | Path, source: str | Path | onnx.ModelProto | None = None) -> None:
        """Write the model compiled (``source``: the ONNX model, by default the file compiled) with its
        parameters and running statistics replaced by the state's current values."""
        import onnx
        from onnx import numpy_helper

        self._need_train("save")
        assert self._train is not None
        if source is None:
            source = self.source_model or self._train.get("source")
            if source is None:
                raise AotcError(f"{self.name}.save: the model was compiled from memory; pass source=")
        model = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
        model = onnx.ModelProto.FromString(model.SerializeToString())
        roles = {t["name"]: t["role"] for t in self._train["state"]["tensors"]}
        for i, init in enumerate(model.graph.initializer):
            if roles.get(init.name) in ("parameter", "running statistic"):
                value = self._state_views[init.name]
                if tuple(init.dims) != value.shape:
                    raise AotcError(f"{self.name}.save: the model's initializer {init.name!r} has shape "
                                    f"{list(init.dims)}, not the compiled {list(value.shape)}: not the model compiled")
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, init.name))
        onnx.save(model, str(path))

    @property
    def num_kernels(self) -> int:
        return int(self.metadata["num_kernels"])

    def __repr__(self) -> str:
        sig = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.inputs)
        return f"<aotc.CompiledModel {self.name}({sig})>"

    def _workspace(self) -> np.ndarray:
        ws = getattr(self._local, "ws", None)
        if ws is None:
            n = self.workspace_bytes_used
            raw = np.zeros(n + 64, np.uint8)
            off = (-raw.ctypes.data) % 64
            ws = raw[off:off + n]
            self._local.ws = ws
            self._local.ws_c = self._ptr(ws) if ws.size else self._ffi.NULL
        return ws

    def _check(self, feeds: Mapping[str, object] | Sequence[object],
               specs: list[TensorSpec] | None = None) -> list[np.ndarray]:
        specs = self.inputs if specs is None else specs
        if not isinstance(feeds, Mapping):
            feeds = list(feeds)
            if len(feeds) != len(specs):
                raise ValueError(f"{self.name}: expected {len(specs)} inputs, got {len(feeds)}")
            feeds = {t.name: x for t, x in zip(specs, feeds, strict=True)}
        expected = self._input_names if specs is self.inputs else [t.name for t in specs]
        if len(feeds) != len(expected) or any(k not in feeds for k in expected):
            unknown = [k for k in feeds if k not in expected]
            missing = [k for k in expected if k not in feeds]
            raise ValueError(f"{self.name}: feeds must be exactly {expected}"
                             + (f"; unknown: {unknown}" if unknown else "")
                             + (f"; missing: {missing}" if missing else ""))
        arrays = []
        for t in specs:
            x = feeds[t.name]
            if t.name in self._string_inputs:
                arrays.append(_string_pointers(self.name, t, x))
                continue
            if isinstance(x, np.ndarray):
                if x.dtype != t.dtype:
                    raise TypeError(f"{self.name}: input {t.name!r} must be {t.dtype}, got {x.dtype}")
            elif t.updated:
                raise TypeError(f"{self.name}: input {t.name!r} is updated in place: pass a numpy array")
            else:
                x = np.asarray(x, dtype=t.dtype)
            if x.shape != t.shape:
                raise ValueError(f"{self.name}: input {t.name!r} must have shape {list(t.shape)}, "
                                 f"got {list(x.shape)}")
            if t.updated and not (x.flags.c_contiguous and x.flags.writeable):
                raise ValueError(f"{self.name}: input {t.name!r} is updated in place: it must be a writable "
                                 "C-contiguous array")
            arrays.append(np.ascontiguousarray(x))
        if any(t.updated for t in self.inputs):
            _refuse_overlap(self.name, self.inputs, arrays)
        return arrays

    def _ptr(self, a: np.ndarray):
        if a.size == 0:  # a zero-size buffer has no address; the kernels will not touch it
            a = np.zeros(1, np.uint8)
        return self._ffi.from_buffer(a)

    def _outputs(self, out: Sequence[np.ndarray] | None, raw: bool = False) -> list[np.ndarray]:
        """Buffers for every C output: ``out`` (the model's outputs, or all C outputs if ``raw``)
        and fresh arrays for the rest."""
        if out is None:
            return [np.empty(t.shape, t.dtype) for t in self.raw_outputs]
        out = list(out)
        specs = self.raw_outputs if raw else self.outputs
        if len(out) != len(specs):
            raise ValueError(f"{self.name}: out must hold {len(specs)} arrays, got {len(out)}")
        for t, o in zip(specs, out, strict=True):
            if not isinstance(o, np.ndarray) or o.dtype != t.dtype or o.shape != t.shape \
                    or not o.flags.c_contiguous or not o.flags.writeable:
                raise ValueError(f"{self.name}: out for {t.name!r} must be a writable C-contiguous "
                                 f"{t.dtype} array of shape {list(t.shape)}")
        if raw:
            return out
        given = iter(out)
        return [next(given) if any(t is v for v in self.outputs) else np.empty(t.shape, t.dtype)
                for t in self.raw_outputs]

    def _trimmed(self, outs: list[np.ndarray]) -> list[np.ndarray]:
        """The model's outputs from the C outputs ``outs``: each data-dependent one cut to the
        extent its count output holds (a view of the leading part)."""
        if not self._has_counts:
            return outs
        by_name = {t.name: o for t, o in zip(self.raw_outputs, outs, strict=True)}
        res = []
        for t in self.outputs:
            o = by_name[t.name]
            if t.count is not None:
                n = int(by_name[t.count])
                if not 0 <= n <= t.shape[t.bounded_axis]:
                    raise RuntimeError(f"{self.name}: count {n} of {t.name!r} is out of range")
                o = o[(slice(None),) * t.bounded_axis + (slice(0, n),)]
            res.append(o)
        return res

    def _call(self, fn, feeds: Mapping[str, object] | Sequence[object], *extra,
              out: Sequence[np.ndarray] | None = None, raw: bool = False,
              specs: list[TensorSpec] | None = None) -> list[np.ndarray]:
        arrays = self._check(feeds, specs)
        outs = self._outputs(out, raw) if specs is None else list(out or [])
        keep = [*arrays, *outs]  # noqa: F841 - buffers must outlive the call
        ins_c = self._ffi.new(self._pointers, [self._ptr(a) for a in arrays] or [self._ffi.NULL])
        outs_c = self._ffi.new(self._pointers, [self._ptr(a) for a in outs] or [self._ffi.NULL])
        ws = self._workspace()
        rc = fn(ins_c, outs_c, self._local.ws_c, ws.size, self._par, *extra)
        if rc != 0:
            raise run_error(self.name, rc)
        return outs

    def run(self, feeds: Mapping[str, object] | Sequence[object],
            out: Sequence[np.ndarray] | None = None, raw: bool = False) -> list[np.ndarray]:
        """The outputs in fetch order. ``out``: arrays to write them into (reused buffers avoid the
        page faults of fresh large allocations on every call); a data-dependent output's array has
        its bound shape, and what is returned is a view of its valid part. ``raw``: return (and
        take as ``out``) the C library's outputs, untrimmed and with the count outputs."""
        outs = self._call(self._run, feeds, out=out, raw=raw)
        return outs if raw else self._trimmed(outs)

    def profile(self, feeds: Mapping[str, object] | Sequence[object], iterations: int = 10,
                trace: str | Path | None = None, warmup: int = 1) -> Profile:
        """Run ``iterations`` times recording each kernel's start and end; needs a library built with
        ``--profile``. Returns the per-kernel table; ``trace`` also writes a Chrome Trace Event JSON."""
        from aotc.profile import Profile

        fn = getattr(self._lib, f"{self.name}_run_profiled", None) if self.metadata.get("profile") else None
        if fn is None:
            raise AotcError(f"{self.name} was not compiled with --profile")
        if self._train is not None:
            profiled = fn
            fn = lambda ins, outs, *rest: profiled(ins, outs, self._state_c, *rest)  # noqa: E731
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        times = self._ffi.new("uint64_t[]", max(1, 2 * self.num_kernels))
        runs = []
        for i in range(warmup + iterations):
            self._call(fn, feeds, times)
            if i >= warmup:
                runs.append(list(times)[:2 * self.num_kernels])
        prof = Profile(self.metadata, runs, self.threads)
        if trace is not None:
            prof.write_trace(trace)
        return prof

    def __call__(self, **feeds: object) -> list[np.ndarray]:
        return self.run(feeds)


def _refuse_overlap(model: str, specs: list[TensorSpec], arrays: list[np.ndarray]) -> None:
    """An array updated in place must share no memory with another argument: the run would read
    values it has already overwritten."""
    for i, (t, a) in enumerate(zip(specs, arrays, strict=True)):
        if t.updated:
            for u, b in zip(specs[i + 1:], arrays[i + 1:], strict=True):
                if np.shares_memory(a, b):
                    raise ValueError(f"{model}: input {t.name!r} is updated in place and shares memory "
                                     f"with input {u.name!r}")
            for u, b in zip(specs[:i], arrays[:i], strict=True):
                if not u.updated and np.shares_memory(a, b):
                    raise ValueError(f"{model}: input {t.name!r} is updated in place and shares memory "
                                     f"with input {u.name!r}")


class _StringPointers(np.ndarray):
    """The C view of a string input: one address per element (``aotc_string``), pointing into
    ``strings``, NUL-terminated UTF-8 copies that live as long as this array does."""

    strings: np.ndarray


def _string_pointers(model: str, t: TensorSpec, x: object) -> np.ndarray:
    """A string input (numpy str/bytes/object array, or nested lists) as an array of pointers."""
    a = x if isinstance(x, np.ndarray) else np.asarray(x, dtype=object)
    if a.dtype.kind not in "OUS":
        raise TypeError(f"{model}: input {t.name!r} must hold strings (str, bytes or object), got {a.dtype}")
    if a.shape != t.shape:
        raise ValueError(f"{model}: input {t.name!r} must have shape {list(t.shape)}, got {list(a.shape)}")
    encoded = []
    for s in a.reshape(-1):
        if isinstance(s, str):
            try:
                data = s.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"{model}: input {t.name!r} holds a string that is not valid Unicode ({e})") from None
        elif isinstance(s, bytes):
            data = s
        else:
            raise TypeError(f"{model}: input {t.name!r} must hold strings, got a {type(s).__name__}")
        if b"\0" in data:
            raise ValueError(f"{model}: input {t.name!r} holds a string with a NUL character, which a C "
                             "string cannot contain")
        encoded.append(data + b"\0")
    strings = np.frombuffer(b"".join(encoded) or b"\0", np.uint8)
    starts = np.cumsum([0] + [len(e) for e in encoded[:-1]], dtype=np.uintp)[:len(encoded)]
    ptrs = (starts + np.uintp(strings.ctypes.data)).astype(np.uintp).reshape(a.shape).view(_StringPointers)
    ptrs.strings = strings
    return ptrs


# Resolved path -> build id of the library this process loaded from it. The dynamic loader returns
# the library already loaded from a path even after it was rebuilt, so a rebuilt library is loaded
# from a private copy instead.
_LOADED: dict[str, str] = {}


def read_metadata(prefix: Path) -> dict:
    """PREFIX.json, the description of the library compiled at ``prefix`` (C or CUDA)."""
    try:
        return json.loads((prefix.parent / f"{prefix.name}.json").read_text())
    except (OSError, ValueError) as e:
        raise AotcError(f"no compiled model at {prefix} ({e})") from None


def _open_library(ffi: cffi.FFI, prefix: Path, meta: dict):  # noqa: ANN202 - cffi's library object
    """dlopen libNAME.so once NAME.json, NAME.cdef and the library are known to come from one build:
    a compile that was interrupted, or files copied from another compile, would otherwise run one
    model's code on another's shapes."""
    name, want = meta["name"], meta.get("build_id")
    path = prefix.parent / f"lib{name}.so"
    cdef_path = prefix.parent / f"{name}.cdef"
    if want is None:
        raise AotcError(f"{prefix}.json has no build id (compiled by an older aotc): compile the model again")
    try:
        declarations = cdef_path.read_text()
    except OSError as e:
        raise AotcError(f"no compiled model at {prefix} (cannot read {cdef_path}: {e.strerror or e})") from None
    if not declarations.startswith(f"/* aotc build {want} */"):
        raise AotcError(f"{cdef_path} is not from the build {prefix}.json describes: compile the model again")
    ffi.cdef(declarations)
    key = str(path.resolve())
    target = key
    try:
        if _LOADED.get(key, want) != want:
            target = str(Path(tempfile.mkdtemp(prefix="aotc-")) / path.name)
            shutil.copy2(path, target)
        lib = ffi.dlopen(target)
    except OSError as e:
        raise AotcError(f"cannot load {path}: {e}") from None
    try:
        got = ffi.string(getattr(lib, f"{name}_build_id")()).decode(errors="replace")
    except AttributeError:
        got = "none"
    if target == key:
        _LOADED[key] = got
    if got != want:
        raise AotcError(f"{path} is build {got}, not build {want} that {prefix}.json describes (an interrupted "
                        "compile, or a file from another compile): compile the model again")
    return lib


def load(prefix: str | Path, threads: int | ThreadPool = 1) -> CompiledModel:
    """Load a compiled model from ``OUTDIR/NAME`` (the files NAME.json and libNAME.so). A library this
    machine cannot run (compiled for another architecture, or for instruction sets this CPU lacks) is
    refused before it is opened."""
    from aotc.cuda_bindings import is_cuda_library, load_cuda
    from aotc.target import host_problem

    prefix = Path(prefix)
    if is_cuda_library(prefix):  # --target cuda
        return load_cuda(prefix, threads)  # type: ignore[return-value]
    try:
        meta = json.loads((prefix.parent / f"{prefix.name}.json").read_text())
        target = meta.get("target")
    except (OSError, ValueError, AttributeError):
        meta = target = None  # CompiledModel says what is missing or malformed
    problem = host_problem(target) if isinstance(target, dict) else None
    if problem is not None:
        raise AotcError(f"cannot load {prefix}: {problem}")
    if isinstance(meta, dict) and "dims" in meta:  # aotc compile --dynamic
        from aotc.dynamic_model import DynamicModel

        return DynamicModel(prefix, threads)
    return CompiledModel(prefix, threads)
