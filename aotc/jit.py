"""Compile on first use: ``aotc.jit("model.onnx")`` is a callable that compiles the model for the shapes
of the feeds it is called with, the way XLA's JIT recompiles for a new shape.

The feeds' shapes pin the model's symbolic dimensions (what ``--input-shape`` does on the command
line). Each new shape signature costs one compile; the loaded libraries of the last few signatures
are kept in memory, and every library is kept on disk in a ``LibraryCache`` (aotc/cache.py), keyed
by what could change it: the model's bytes, the feed shapes, the compile options, aotc's version
and sources, the target and C compiler (and CC, CFLAGS, LDFLAGS, AR). Another process, or this one
later, with the same key loads the library instead of compiling it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from aotc import __version__
from aotc.bindings import CompiledModel, ThreadPool, load
from aotc.cache import DEFAULT_MAX_BYTES, LibraryCache
from aotc.compiler import _default_name, aotc_sources, compile_model
from aotc.config import Config, load_config
from aotc.dynamic_library import compile_dynamic, dynamic_inputs, parse_dynamic
from aotc.errors import AotcError
from aotc.frontends.tensorflow import is_tensorflow_model, tensorflow_model_files
from aotc.target import Target, resolve

# compile_model's options that the jit passes on (the others name output files or test programs).
OPTIONS = frozenset({"config", "target", "target_cpu", "target_features", "sysroot", "extra_cflags",
                     "profile", "thread_pool", "tag_set", "signature", "variables_to_feed"})
# Those that also apply with ``dynamic`` (aotc.dynamic_library.compile_dynamic).
DYNAMIC_OPTIONS = frozenset({"target", "target_cpu", "target_features", "sysroot", "extra_cflags", "thread_pool"})
_ENV = ("CC", "CFLAGS", "LDFLAGS", "AR")

Signature = tuple[tuple[str, tuple[int, ...]], ...]


class JitModel:
    """A model compiled for each new set of feed shapes: ``m(x=a)`` or ``m.run({"x": a})`` returns the
    outputs in fetch order, as ``CompiledModel.run`` does. See ``aotc.jit``."""

    def __init__(self, model: str | Path | onnx.ModelProto, *, name: str | None = None, threads: int = 1,
                 cache_dir: str | Path | None = None, max_cache_bytes: int | None = DEFAULT_MAX_BYTES,
                 memory_entries: int = 8, dynamic: str | None = None, **options: object) -> None:
        allowed = DYNAMIC_OPTIONS if dynamic else OPTIONS
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise TypeError(f"aotc.jit: unknown option(s) {', '.join(unknown)}"
                            f"{' with dynamic' if dynamic else ''}; it takes {', '.join(sorted(allowed))}")
        # One library for every size of a batch dimension (aotc compile --dynamic) instead of one per size.
        self.dynamic = parse_dynamic(dynamic) if dynamic else None
        if memory_entries < 1:
            raise ValueError(f"memory_entries must be >= 1, got {memory_entries}")
        self.model = model if isinstance(model, onnx.ModelProto) else Path(model)
        if isinstance(self.model, Path) and not self.model.exists():
            raise AotcError(f"model file not found: {self.model}")
        self.name = name or ("model" if isinstance(model, onnx.ModelProto) else _default_name(Path(model)))
        self.options = options
        self.threads = threads
        self.cache = LibraryCache(cache_dir, max_cache_bytes)
        self.compiles = 0     # libraries this object compiled
        self.disk_hits = 0    # libraries it loaded from the disk cache
        self._memory: OrderedDict[Signature, CompiledModel] = OrderedDict()
        self._memory_entries = memory_entries
        self._pool: ThreadPool | None = None
        self._lock = threading.Lock()
        self._loaded_proto: tuple[tuple, onnx.ModelProto] | None = None
        self._model_digest: tuple[tuple, str] | None = None
        self._target: Target | None = None

    def __repr__(self) -> str:
        return f"<aotc.JitModel {self.name}: {len(self._memory)} signatures loaded, {self.compiles} compiled>"

    def __call__(self, *args: object, **feeds: object) -> list[np.ndarray]:
        if args and feeds:
            raise TypeError("give the feeds by position or by name, not both")
        return self.run(feeds if feeds or not args else list(args))

    def run(self, feeds: Mapping[str, object] | Sequence[object], out: Sequence[np.ndarray] | None = None,
            raw: bool = False) -> list[np.ndarray]:
        """The outputs for ``feeds`` (a mapping by input name, or a sequence in input order), compiling
        first if no library for their shapes is loaded or cached; ``out`` and ``raw`` as in
        ``CompiledModel.run``."""
        named = self._named(feeds)
        return self.compiled(named).run(named, out=out, raw=raw)

    def compiled(self, feeds: Mapping[str, object]) -> CompiledModel:
        """The library for the shapes of ``feeds`` (by input name), loaded or compiled."""
        sig: Signature = tuple(sorted((k, tuple(int(d) for d in np.shape(v))) for k, v in feeds.items()))
        if self.dynamic is not None:  # the dimension's size is the run's, not the library's
            axes = self._dynamic_axes()
            sizes = {s[axes[k]] for k, s in sig if k in axes and len(s) > axes[k]}
            if not all(self.dynamic.allows(n) for n in sizes):
                raise ValueError(f"{self.name}: {self.dynamic.dim!r} is {sorted(sizes)}, which dynamic={self.dynamic} "
                                 "does not allow")
            sig = tuple((k, _at(s, axes[k], -1) if k in axes and len(s) > axes[k] else s) for k, s in sig)
        with self._lock:
            hit = self._memory.get(sig)
            if hit is not None:
                self._memory.move_to_end(sig)
                return hit
            key = self.key(dict(sig))
            shapes = {k: s for k, s in sig if self._pinned(k)}
            model, built = self.cache.get(key, lambda d: self._build(d, shapes), self._load)
            if built:
                self.compiles += 1
            else:
                self.disk_hits += 1
            self._memory[sig] = model
            if len(self._memory) > self._memory_entries:
                self._memory.popitem(last=False)
            return model

    def key(self, shapes: Mapping[str, tuple[int, ...]]) -> str:
        """The cache key of the library for these feed shapes."""
        tgt = self._resolved_target()
        described = {
            "aotc": [__version__, _sources_digest()], "model": self._digest(), "name": self.name,
            "shapes": sorted((k, list(s)) for k, s in shapes.items()), "options": self._options_key(),
            "target": tgt.metadata(), "cc": _compiler_version(tgt.cc),
            "cpu": _cpu_model() if tgt.cpu == "native" else None,
            "env": {k: os.environ.get(k) for k in _ENV}, "dynamic": str(self.dynamic) if self.dynamic else None,
        }
        text = json.dumps(described, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _build(self, directory: Path, shapes: dict[str, tuple[int, ...]]) -> None:
        if self.dynamic is not None:
            shapes = {k: tuple(1 if d == -1 else d for d in s) for k, s in shapes.items()}
            compile_dynamic(self.model, directory, self.name, [str(self.dynamic)], input_shapes=shapes,
                            **self.options)  # type: ignore[arg-type]
        else:
            compile_model(self.model, directory, self.name, input_shapes=shapes, **self.options)  # type: ignore[arg-type]
        # Only what loading needs stays: the build tree and the static library are for linking.
        shutil.rmtree(directory / ".aotc", ignore_errors=True)
        (directory / f"lib{self.name}.a").unlink(missing_ok=True)

    def _load(self, directory: Path) -> CompiledModel:
        model = load(directory / self.name, threads=self._pool or self.threads)
        if self._pool is None and model.pool is not None:
            self._pool = model.pool  # every signature's library runs on one pool
        return model

    def _named(self, feeds: Mapping[str, object] | Sequence[object]) -> Mapping[str, object]:
        if isinstance(feeds, Mapping):
            return feeds
        feeds = list(feeds)
        names = self._input_order()
        if len(feeds) != len(names):
            raise ValueError(f"{self.name}: expected {len(names)} inputs ({', '.join(names)}), got {len(feeds)}")
        return dict(zip(names, feeds, strict=True))

    def _input_order(self) -> list[str]:
        with self._lock:
            for m in self._memory.values():
                return [t.name for t in m.inputs]
        if not isinstance(self.model, onnx.ModelProto) and is_tensorflow_model(self.model) \
                or self.options.get("config") is not None:
            raise AotcError(f"{self.name}: give the feeds by name until one shape is compiled")
        proto = self._proto()
        constants = {i.name for i in proto.graph.initializer}
        return [i.name for i in proto.graph.input if i.name not in constants]

    def _dynamic_axes(self) -> dict[str, int]:
        """The inputs that have the ``dynamic`` dimension, and its axis in each."""
        assert self.dynamic is not None
        return dynamic_inputs(self._proto(), self.dynamic.dim, self.dynamic.batch)

    def _pinned(self, name: str) -> bool:
        """Whether the feed ``name`` is a graph input whose shape the compile takes from the feed (a
        config's feeds carry their own shapes)."""
        if isinstance(self.model, Path) and is_tensorflow_model(self.model):
            return True
        proto = self._proto()
        return name in {i.name for i in proto.graph.input} - {i.name for i in proto.graph.initializer}

    def _proto(self) -> onnx.ModelProto:
        """The ONNX model without its external data (read again when the file changes)."""
        if isinstance(self.model, onnx.ModelProto):
            return self.model
        stamp = _stamp([self.model])
        if self._loaded_proto is None or self._loaded_proto[0] != stamp:
            try:
                proto = onnx.load(str(self.model), load_external_data=False)
            except Exception as e:  # protobuf raises several unrelated types for garbage input
                raise AotcError(f"{self.model}: not a valid ONNX model ({type(e).__name__}: {e})") from None
            self._loaded_proto = (stamp, proto)
        return self._loaded_proto[1]

    def _digest(self) -> str:
        """SHA-256 of the model's bytes (every file of a SavedModel; an ONNX model's external data),
        computed again only when a file's size, time or inode changes."""
        if isinstance(self.model, onnx.ModelProto):
            if self._model_digest is None:
                self._model_digest = ((), hashlib.sha256(self.model.SerializeToString()).hexdigest())
            return self._model_digest[1]
        if is_tensorflow_model(self.model):
            files = sorted(tensorflow_model_files(self.model))
        else:
            files = [self.model, *_external_data_files(self._proto(), self.model.parent)]
        stamp = _stamp(files)
        if self._model_digest is None or self._model_digest[0] != stamp:
            h = hashlib.sha256()
            for f in files:
                h.update(f"{f.relative_to(self.model.parent)}\0".encode())
                with open(f, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        h.update(chunk)
            self._model_digest = (stamp, h.hexdigest())
        return self._model_digest[1]

    def _options_key(self) -> dict:
        opts = dict(self.options)
        cfg = opts.get("config")
        if isinstance(cfg, (str, Path)):
            opts["config"] = repr(load_config(cfg))
        elif isinstance(cfg, Config):
            opts["config"] = repr(cfg)
        return opts

    def _resolved_target(self) -> Target:
        if self._target is None:
            o = self.options
            self._target = resolve(o.get("target"), o.get("target_cpu"), o.get("target_features"),  # type: ignore[arg-type]
                                   o.get("sysroot"), o.get("extra_cflags"))  # type: ignore[arg-type]
        return self._target


def jit(model: str | Path | onnx.ModelProto, *, name: str | None = None, threads: int = 1,
        cache_dir: str | Path | None = None, max_cache_bytes: int | None = DEFAULT_MAX_BYTES,
        memory_entries: int = 8, dynamic: str | None = None, **options: object) -> JitModel:
    """A callable that compiles ``model`` on first use for the shapes of its feeds:
    ``m = aotc.jit("model.onnx"); y, = m(x=batch_of_4); y, = m(x=batch_of_9)`` compiles twice.

    ``cache_dir``: where libraries are kept (default ``$AOTC_CACHE_DIR``, else ``~/.cache/aotc``);
    ``max_cache_bytes``: its size limit (None: none), enforced least recently used first;
    ``memory_entries``: how many libraries stay loaded; ``threads`` as in ``aotc.load``; ``options``:
    ``compile_model``'s target and model options (``config``, ``target_cpu``, ``extra_cflags``, ...).
    ``dynamic="batch<=32"`` (or ``"seq=16,32,64"``): compile one library for every size of that batch
    dimension (or for the sizes listed; ``aotc compile --dynamic``, docs/dynamic_shapes.md) instead of
    one per size."""
    return JitModel(model, name=name, threads=threads, cache_dir=cache_dir, max_cache_bytes=max_cache_bytes,
                    memory_entries=memory_entries, dynamic=dynamic, **options)


def _stamp(files: list[Path]) -> tuple:
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def _external_data_files(proto: onnx.ModelProto, base: Path) -> list[Path]:
    """The files an ONNX model's external data lives in (initializers and tensor attributes, in
    subgraphs too)."""
    files: list[Path] = []

    def tensors(g: onnx.GraphProto):
        yield from g.initializer
        for node in g.node:
            for a in node.attribute:
                yield from [a.t] if a.HasField("t") else a.tensors
                for sub in ([a.g] if a.HasField("g") else a.graphs):
                    yield from tensors(sub)

    for t in tensors(proto.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc and (base / loc).is_file() and base / loc not in files:
                files.append(base / loc)
    return files


@functools.cache
def _sources_digest() -> str:
    """aotc's own files: an edited checkout makes new keys even without a new version number."""
    h = hashlib.sha256()
    for f in aotc_sources():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@functools.cache
def _compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


@functools.cache
def _cpu_model() -> str:
    """What -march=native tunes for, beyond the features the target lists."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "CPU part")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _at(shape: tuple[int, ...], axis: int, n: int) -> tuple[int, ...]:
    return (*shape[:axis], n, *shape[axis + 1:])
