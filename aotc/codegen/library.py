"""Writes a compiled graph out as C: header, run function, kernel sources, the weights blob and
the build file. Everything here is deterministic: the same graph gives byte-identical files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import jinja2
import numpy as np

from aotc import __version__
from aotc.codegen.kernels import KernelSource, emit_kernel
from aotc.codegen.names import Mangler, c_string, comment
from aotc.errors import RUN_ERRORS
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Value
from aotc.passes.fuse import storage_root
from aotc.resources import runtime_dir, templates_dir
from aotc.target import Target

if TYPE_CHECKING:
    from aotc.training.state import StateLayout

API = '__attribute__((visibility("default"))) '
KERNELS_PER_FILE = 24


@lru_cache(maxsize=1)
def env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


class _Described:
    """How the generated comments and metadata tables spell a tensor's ``name`` and ``dtype``."""

    name: str
    dtype: str

    @property
    def comment_name(self) -> str:
        return comment(self.name)

    @property
    def c_string(self) -> str:
        return c_string(self.name)

    @property
    def dtype_code(self) -> int:
        return dtypes.DTYPE_CODES[self.dtype]


@dataclass
class TensorInfo(_Described):
    name: str
    param: str
    dtype: str
    ctype: str
    shape: list[int]
    # A data-dependent output (aotc/ops/dynamic.py): ``shape`` is its upper bound, and only the leading
    # ``outputs[count]`` entries along ``bound_axis`` are valid (the rest is zeros).
    bound_axis: int | None = None
    count: int | None = None
    # A count output: the positions of the outputs whose valid extent it holds.
    count_for: list[int] = field(default_factory=list)
    # An input the run updates in place (Graph.add_update): a non-const pointer in the C API.
    updated: bool = False
    # A TensorFlow variable (Graph.variables), and whether it is read-only.
    variable: bool = False
    readonly: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def api_ctype(self) -> str:
        """The type the header declares: ``bool`` (from stdbool.h) reads as _Bool in C and as bool in C++."""
        return "bool" if self.ctype == "_Bool" else self.ctype

    @property
    def emulated(self) -> bool:
        return dtypes.emulated(dtypes.from_name(self.dtype)) is not None


@dataclass
class Library:
    """The generated files (name -> content) plus what the bindings and summaries need."""

    name: str
    files: dict[str, bytes] = field(default_factory=dict)
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    kernels: list[KernelSource] = field(default_factory=list)
    workspace_bytes: int = 0
    scratch_per_thread: int = 0
    consts_bytes: int = 0
    # Generated programs (NAME_test, NAME_benchmark): executable -> its own sources in ``files``.
    programs: dict[str, list[str]] = field(default_factory=dict)
    # A training library (aotc.training): NAME_train_step's inputs and outputs, and the state buffer.
    train_inputs: list[TensorInfo] = field(default_factory=list)
    train_outputs: list[TensorInfo] = field(default_factory=list)
    state: StateLayout | None = None


@dataclass
class Entry:
    """A graph compiled into one entry function of a library: NAME_run, or NAME_train_step, which
    updates the caller's state buffer. ``state_inputs`` maps graph input positions to byte offsets in
    the state; the other inputs are the function's arguments. The new values of updated inputs
    (``Graph.add_update``) are written where those inputs live, not into output arguments."""

    graph: Graph
    input_names: list[str]
    output_names: list[str]
    state_inputs: dict[int, int] = field(default_factory=dict)


class _Blob:
    """Constants laid out in one 64-byte-aligned blob, in first-use order."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.offsets: dict[int, int] = {}

    def offset(self, v: Value) -> int:
        if id(v) not in self.offsets:
            pad = (-self.size) % 64
            self.parts.append(b"\0" * pad)
            self.size += pad
            self.offsets[id(v)] = self.size
            data = np.asarray(v.const, order="C").astype(v.const.dtype.newbyteorder("<")).tobytes()
            self.parts.append(data)
            self.size += len(data)
        return self.offsets[id(v)]

    def data(self) -> bytes:
        return b"".join(self.parts)


def generate(graph: Graph, name: str, input_names: list[str], output_names: list[str],
             source: str, *, target: Target, profile: bool = False, pool: bool = True,
             bounded: dict[int, tuple[int, int]] | None = None, state: StateLayout | None = None,
             state_inputs: dict[int, int] | None = None, train: Entry | None = None) -> Library:
    """The library's files for ``graph`` (planned for ``target`` by the passes), its kernels written for
    ``target``'s ISA. ``profile`` adds NAME_run_profiled (per-kernel timestamps); ``pool`` adds the
    pthread pool. ``bounded``: output position -> (data-dependent axis, position of its count output),
    from ``aotc.ops.dynamic.expose_counts``. A training library (aotc.training) has a ``state`` buffer,
    which NAME_run reads (``state_inputs``: graph input position -> byte offset) and ``train``'s graph,
    NAME_train_step, updates."""
    lib = Library(name, state=state)
    mangle = _argument_mangler(name)
    entry = Entry(graph, input_names, output_names, dict(state_inputs or {}))
    lib.inputs, lib.outputs = _arguments(entry, mangle)
    for pos, (axis, count) in sorted((bounded or {}).items()):
        t = lib.outputs[pos]
        t.bound_axis, t.count = axis % len(t.shape), count
        lib.outputs[count].count_for.append(pos)
    plans = [graph.memory] + ([train.graph.memory] if train else [])
    # One workspace serves every entry: each checks it against these sizes, which hold its own plan.
    lib.workspace_bytes = max(p.workspace_bytes for p in plans)
    lib.scratch_per_thread = max(p.scratch_per_task for p in plans)
    blob = _Blob()
    calls = _calls(entry, f"{name}_", name, blob, lib, target)
    train_calls = []
    if train is not None:
        lib.train_inputs, lib.train_outputs = _arguments(train, _argument_mangler(name))
        train_calls = _calls(train, f"{name}_train_", name, blob, lib, target)
    slots = _slot_infos(state) if state else []
    inits = [(Graph.constant(s.init), info) for s, info in zip(state.slots, slots, strict=True)
             if s.init is not None] if state else []
    init = [(blob.offset(v), info) for v, info in inits]  # NAME_state_init copies these from the blob

    if blob.offsets and not blob.size:  # only empty constants: they still need an address
        blob.parts.append(b"\0" * 64)
        blob.size = 64
    common = {"name": name, "version": __version__, "api": API, "profile": profile, "pool": pool,
              "num_kernels": len(calls), "scratch_per_thread": lib.scratch_per_thread,
              "workspace_bytes": lib.workspace_bytes, "statuses": RUN_ERRORS, "state": state}
    files: dict[str, str | bytes] = {}
    files[f"{name}.h"] = env().get_template("header.h.j2").render(
        **common, source=comment(source, 60), target=comment(target.summary(), 1000),
        native=target.cpu == "native", inputs=lib.inputs, outputs=lib.outputs,
        checked=[c["comment"] for c in calls + train_calls if c["status"]],
        train_inputs=lib.train_inputs, train_outputs=lib.train_outputs,
        slots=slots)
    files[f"{name}.c"] = env().get_template("model.c.j2").render(
        **common, inputs=lib.inputs, outputs=lib.outputs, calls=calls)
    if train is not None:
        assert state is not None
        files[f"{name}_train.c"] = env().get_template("train_step.c.j2").render(
            **common, inputs=lib.train_inputs, outputs=lib.train_outputs, calls=train_calls,
            slots=slots, init=init)
    if pool:
        files[f"{name}_pool.c"] = env().get_template("pool.c.j2").render(**common)
    for start in range(0, len(lib.kernels), KERNELS_PER_FILE):
        fname = f"{name}_kernels_{start // KERNELS_PER_FILE}.c"
        includes, codes = hoist_includes([s.code for s in lib.kernels[start:start + KERNELS_PER_FILE]])
        files[fname] = env().get_template("kernels.c.j2").render(**common, file=fname, includes=includes, kernels=codes)
    lib.consts_bytes = blob.size
    files[f"{name}_internal.h"] = env().get_template("internal.h.j2").render(
        **common, isa=target.isa, has_consts=blob.size > 0, consts_bytes=blob.size,
        kernels=[f for s in lib.kernels for f in (s.fn, s.finish) if f])
    if blob.size:
        files[f"{name}_consts.bin"] = blob.data()
        files[f"{name}_consts.S"] = env().get_template("consts.S.j2").render(**common, symbol=f"{name}_consts")
    for header in ("aotc_math.h", "aotc_rows.h", "aotc_types.h"):
        files[header] = (runtime_dir() / header).read_text()
    lib.files = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    return lib


def _argument_mangler(name: str) -> Mangler:
    """Parameter names for an entry function: none may be one of the run functions' own names."""
    mangle = Mangler(name)
    mangle.used.update({"workspace", "inputs", "outputs", "in", "out", "ws", "i", "state"})
    return mangle


def _arguments(entry: Entry, mangle: Mangler) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The entry function's own inputs and outputs (those not in the state buffer)."""
    res: tuple[list[TensorInfo], list[TensorInfo]] = ([], [])
    for names, values, skip, dest in ((entry.input_names, entry.graph.inputs, entry.state_inputs, res[0]),
                                      (entry.output_names, entry.graph.outputs, {}, res[1])):
        for i, (n, v) in enumerate(zip(names, values, strict=True)):
            if i not in skip and (dest is res[0] or i < entry.graph.num_fetches):  # not an update's value
                var = entry.graph.variables.get(n) if dest is res[0] else None
                dest.append(TensorInfo(n, mangle(n), dtypes.dtype_name(v.dtype), dtypes.c_type(v.dtype),
                                       list(v.shape), updated=any(v is u for u in entry.graph.updates),
                                       variable=var is not None, readonly=bool(var)))
    return res


def _calls(entry: Entry, prefix: str, name: str, blob: _Blob, lib: Library, target: Target) -> list[dict]:
    """Write ``entry``'s kernels (C functions named ``prefix`` + kernel name, added to ``lib.kernels``)
    and return the calls of its run function: each kernel's arguments as C pointer expressions."""
    graph = entry.graph
    plan = graph.memory
    in_index: dict[int, int] = {}
    in_state: dict[int, int] = {}
    for i, v in enumerate(graph.inputs):
        if i in entry.state_inputs:
            in_state[id(v)] = entry.state_inputs[i]
        else:
            in_index[id(v)] = len(in_index)
    out_index = {id(storage_root(v)): i for i, v in enumerate(graph.outputs[:graph.num_fetches])}
    for k in graph.kernels:  # an in-place update writes its input's buffer
        if k.inplace is not None:
            for where in (in_index, in_state):
                if id(k.inplace) in where:
                    where[id(k.outputs[0])] = where[id(k.inplace)]

    def pointer(v: Value) -> str:
        root = storage_root(v)
        t = dtypes.c_type(v.dtype)
        if root.is_const:
            return f"(void *)({name}_consts + {blob.offset(root)})"
        if id(root) in in_index:
            return f"(void *)inputs[{in_index[id(root)]}]"
        if id(root) in out_index:
            return f"outputs[{out_index[id(root)]}]"
        if id(root) in in_state:
            return f"(void *)(state + {in_state[id(root)]}) /* {comment(v.name, 40)} {t} */"
        return f"(void *)(ws + {plan.buffers[id(root)].offset}) /* {comment(v.name, 40)} {t} */"

    calls = []
    for k in graph.kernels:
        src = emit_kernel(k, f"{prefix}{k.name}", target)
        lib.kernels.append(src)
        args = [pointer(v) for v, _ in src.args]
        if k.index in plan.partials:
            args.append(f"(void *)(ws + {plan.partials[k.index].offset}) /* partials, shared by the tasks */")
        elif src.scratch:
            args.append(f"(void *)(ws + {plan.scratch_offset}) /* scratch, one slot per task */")
        if src.status:
            args.append("(void *)&status")
        calls.append({"fn": src.fn, "finish": src.finish, "args": args, "name": k.name, "max_tasks": k.plan.tasks,
                      "comment": comment(f"{k.name}: {' + '.join(k.ops)}", 100), "status": src.status})
    return calls


@dataclass
class _SlotInfo(_Described):
    """A state tensor as the header and the state table describe it."""

    name: str
    macro: str
    role: str
    dtype: str
    ctype: str
    shape: list[int]
    offset: int
    nbytes: int




def _slot_infos(state: StateLayout) -> list[_SlotInfo]:
    """The state tensors with the identifier each gets in NAME_STATE_<X>_OFFSET and NAME_state_<x>_data:
    mangled in lower case, so that no two differ only in case (no "_" before a leading digit: the name is
    inside another identifier)."""
    mangle = Mangler()
    return [_SlotInfo(s.name, mangle(s.name.lower()).lstrip("_"), s.role, dtypes.dtype_name(s.dtype),
                      dtypes.c_type(s.dtype), list(s.shape), s.offset, s.nbytes) for s in state.slots]


def hoist_includes(codes: list[str]) -> tuple[list[str], list[str]]:
    """The system ``#include`` lines of kernels (each emitter names what it uses), once each in first-use
    order, and the kernels without them: a file of kernels includes every header once, at its top."""
    includes: dict[str, None] = {}
    rest = []
    for code in codes:
        lines = []
        for line in code.split("\n"):
            if line.startswith("#include <") and line.rstrip().endswith(">"):
                includes[line.rstrip()] = None
            else:
                lines.append(line)
        rest.append("\n".join(lines))
    return list(includes), rest


def metadata(lib: Library, graph: Graph, extra: dict) -> str:
    """The JSON the Python bindings and ``aotc inspect`` read (also a compile summary)."""
    plan = graph.memory
    data = {
        "name": lib.name,
        "aotc_version": __version__,
        "inputs": [{"name": t.name, "dtype": t.dtype, "shape": t.shape, **({"updated": True} if t.updated else {})}
                   for t in lib.inputs],
        "outputs": [_output_metadata(lib, t) for t in lib.outputs],
        "workspace_bytes": lib.workspace_bytes,
        "scratch_per_thread_bytes": lib.scratch_per_thread,
        "intermediate_bytes": plan.intermediate_bytes,
        "constants_bytes": lib.consts_bytes,
        "kernels": [{"name": k.name, "kind": k.kind, "ops": k.ops,
                     "reads": [v.name for v in k.inputs], "writes": [v.name for v in k.outputs]}
                    for k in graph.kernels],
        "num_kernels": len(graph.kernels),
        **extra,
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _output_metadata(lib: Library, t: TensorInfo) -> dict:
    """A data-dependent output says which axis is bounded and which output holds its valid extent;
    a count output says whose extent it holds (the bindings return neither separately)."""
    data: dict = {"name": t.name, "dtype": t.dtype, "shape": t.shape}
    if t.count is not None:
        data["bounded"] = {"axis": t.bound_axis, "count": lib.outputs[t.count].name}
    if t.count_for:
        data["count_for"] = [lib.outputs[i].name for i in t.count_for]
    return data


def bounded_layout(lib: Library, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The C library's outputs for the model's true outputs ``arrays`` (in fetch order, without
    count outputs): data-dependent ones zero-padded to their bound, their counts inserted."""
    visible = iter(arrays)
    exact = {i: next(visible) for i, t in enumerate(lib.outputs) if not t.count_for}
    res = []
    for i, t in enumerate(lib.outputs):
        if t.count_for:
            src, axis = exact[t.count_for[0]], lib.outputs[t.count_for[0]].bound_axis
            res.append(np.array(np.asarray(src).shape[axis], np.int64))
            continue
        a = np.asarray(exact[i])
        if t.bound_axis is not None:
            pad = [(0, 0)] * a.ndim
            pad[t.bound_axis] = (0, t.shape[t.bound_axis] - a.shape[t.bound_axis])
            a = np.pad(a, pad)
        res.append(a)
    return res


def cdef(name: str, profile: bool = False, pool: bool = True, state: bool = False) -> str:
    """Declarations for cffi (no preprocessor there): the untyped entry points the bindings use
    (``state``: a training library's, whose run functions take the state buffer)."""
    st = "const void *state, " if state else ""
    text = ("typedef struct aotc_parallel aotc_parallel;\n"
            f"int {name}_run_v(const void *const *inputs, void *const *outputs, {st}void *workspace);\n"
            f"int {name}_run_parallel(const void *const *inputs, void *const *outputs, {st}void *workspace,\n"
            "    size_t workspace_bytes, const aotc_parallel *par);\n"
            f"size_t {name}_workspace_size(void);\n"
            f"size_t {name}_workspace_size_for_threads(size_t num_threads);\n")
    if pool:
        text += (f"aotc_parallel *{name}_pool_create(size_t num_threads);\n"
                 f"void {name}_pool_destroy(aotc_parallel *pool);\n")
    if profile:
        text += (f"int {name}_run_profiled(const void *const *inputs, void *const *outputs, {st}void *workspace,\n"
                 "    size_t workspace_bytes, const aotc_parallel *par, uint64_t *times);\n")
    if state:
        text += (f"int {name}_state_init(void *state);\n"
                 f"int {name}_train_step_parallel(const void *const *inputs, void *const *outputs, void *state,\n"
                 "    void *workspace, size_t workspace_bytes, const aotc_parallel *par);\n")
    return text
