"""``aotc compile --dynamic batch<=32``: one C library for every batch size up to a bound; and
``--dynamic seq=16,32,64``: one C library for a list of sizes of any dimension.

The library holds static compiles of the model (cores). For a batch, the cores are at the powers of two
up to the bound (and the bound), and ``NAME_run_dims`` splits a batch into them, each run in place on
its rows; the batch must be one aotc proves per-sample (aotc/dynamic_batch.py). For listed sizes
there is one core per size and ``NAME_run_dims`` runs the one for the size asked. docs/dynamic_shapes.md
has the design.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from aotc import __version__
from aotc.build import StagedBuild, check_output_dir, output_errors
from aotc.codegen.library import API, Library, TensorInfo, cdef, env, generate
from aotc.codegen.names import c_string, check_model_name, comment
from aotc.dynamic_batch import batch_axes
from aotc.errors import RUN_ERRORS, AotcError
from aotc.frontends.onnx import import_onnx, load_model
from aotc.frontends.tensorflow import is_tensorflow_model
from aotc.passes.counts import expose_counts
from aotc.passes.pipeline import run_passes
from aotc.target import Target, resolve

# NAME_ERR_DIM_OUT_OF_RANGE: apart from the static libraries' statuses (aotc.errors.RUN_ERRORS).
DIM_OUT_OF_RANGE = 16
MAX_BOUND = 1 << 20
_SPEC = re.compile(r"^(?P<dim>.+?)\s*<=\s*(?P<max>\d+)$")
_LIST = re.compile(r"^(?P<dim>.+?)\s*=\s*(?P<sizes>\d+(?:\s*,\s*\d+)+)$")
_SHARED = ("aotc_math.h", "aotc_rows.h", "aotc_types.h")  # runtime headers every core carries


@dataclass(frozen=True)
class DynamicSpec:
    """A dimension left to run time: every size from 1 to ``bound`` of a batch, or the ``sizes`` listed."""

    dim: str
    bound: int
    sizes: tuple[int, ...] | None = None

    @property
    def batch(self) -> bool:
        return self.sizes is None

    def allows(self, n: int) -> bool:
        return 1 <= n <= self.bound if self.sizes is None else n in self.sizes

    def __str__(self) -> str:
        return f"{self.dim}<={self.bound}" if self.sizes is None else f"{self.dim}={','.join(map(str, self.sizes))}"


def parse_dynamic(text: str) -> DynamicSpec:
    """``batch<=32`` or ``x:0<=32`` (a batch, every size up to the bound), or ``seq=16,32,64`` (those
    sizes of any dimension)."""
    m = _SPEC.match(text.strip())
    if m:
        spec = DynamicSpec(m.group("dim"), int(m.group("max")))
    elif (m := _LIST.match(text.strip())) is not None:
        sizes = tuple(sorted({int(v) for v in m.group("sizes").split(",")}))
        if len(sizes) < 2:
            raise AotcError(f"--dynamic {text}: list at least two sizes (one size is --input-shape)")
        spec = DynamicSpec(m.group("dim"), sizes[-1], sizes)
    else:
        raise AotcError(f"--dynamic: expected DIM<=MAX (a batch) or DIM=S1,S2,... (listed sizes), DIM a symbolic "
                        f"dimension of the model or INPUT:AXIS; got {text!r}")
    if not 1 <= min(spec.sizes or (spec.bound,)) or spec.bound > MAX_BOUND:
        raise AotcError(f"--dynamic {text}: sizes must be between 1 and {MAX_BOUND}")
    return spec


def core_sizes(spec: DynamicSpec) -> list[int]:
    """The sizes compiled: those listed, or for a batch the powers of two up to its bound, and the bound."""
    if spec.sizes is not None:
        return list(spec.sizes)
    sizes = [1 << k for k in range(spec.bound.bit_length()) if 1 << k <= spec.bound]
    return sizes if sizes[-1] == spec.bound else [*sizes, spec.bound]


@dataclass
class DimInfo:
    name: str
    max: int
    sizes: list[int] | None  # listed sizes; None: every size from 1 to max (a batch)

    @property
    def comment(self) -> str:
        return comment(self.name, 60)

    @property
    def c_string(self) -> str:
        return c_string(self.name)


@dataclass
class DynamicResult:
    out_dir: Path
    name: str
    cores: list  # the sizes of the cores (batch, listed, or (batch, listed) pairs)
    dims: list[DimInfo]
    workspace_bytes: int
    build_id: str
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def prefix(self) -> Path:
        return self.out_dir / self.name


def dynamic_inputs(model: onnx.ModelProto, dim: str, batch: bool = True) -> dict[str, int]:
    """Input name -> axis of the dimension ``dim`` (a symbolic name, or INPUT:AXIS); a ``batch`` must be
    axis 0."""
    constants = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in constants]
    found: dict[str, int] = {}
    for vi in inputs:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param and d.dim_param == dim:
                found[vi.name] = axis
    if not found and ":" in dim:
        name, _, axis_text = dim.rpartition(":")
        vi = next((v for v in inputs if v.name == name), None)
        if vi is None or not axis_text.lstrip("-").isdigit():
            raise AotcError(f"--dynamic {dim}: no input {name!r} (inputs: {', '.join(v.name for v in inputs)})")
        rank = len(vi.type.tensor_type.shape.dim)
        axis = int(axis_text)
        if not -rank <= axis < rank:
            raise AotcError(f"--dynamic {dim}: input {name!r} has rank {rank}")
        d = vi.type.tensor_type.shape.dim[axis % rank]
        if d.HasField("dim_value"):
            raise AotcError(f"--dynamic {dim}: axis {axis % rank} of {name!r} is fixed at {d.dim_value} by the model")
        found[name] = axis % rank
        if d.dim_param:  # the inputs sharing its symbol vary with it
            found.update(dynamic_inputs(model, d.dim_param, batch))
    if not found:
        symbols = sorted({d.dim_param for vi in inputs for d in vi.type.tensor_type.shape.dim if d.dim_param})
        raise AotcError(f"--dynamic {dim}: the model's inputs have no dimension {dim!r} (symbolic dimensions: "
                        f"{', '.join(symbols) or 'none'}; or give INPUT:AXIS)")
    for name, axis in found.items():
        if axis != 0 and batch:
            raise AotcError(f"--dynamic {dim}<=...: it is axis {axis} of input {name!r}; aotc splits a batch on axis "
                            f"0 only: list the sizes to compile instead ({dim}=16,32,...; docs/dynamic_shapes.md)")
    return found


def _core_shapes(model: onnx.ModelProto, fixed: dict[str, dict[int, int]],
                 shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Every input's shape in a core: ``fixed[input][axis]`` for the dynamic axes, the rest from
    ``shapes`` (--input-shape) or the model."""
    constants = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in constants:
            continue
        dims = vi.type.tensor_type.shape.dim
        given = shapes.get(vi.name)
        axes = fixed.get(vi.name, {})
        if given is not None:
            if len(given) != len(dims):
                raise AotcError(f"--input-shape {vi.name}: rank {len(given)}, but the model's is {len(dims)}")
            shape = list(given)
        elif all(d.HasField("dim_value") or i in axes for i, d in enumerate(dims)):
            shape = [d.dim_value for d in dims]
        else:
            raise AotcError(f"input {vi.name!r} has dimensions that vary other than the dynamic ones: pin them "
                            "with --input-shape (the dynamic axes' values there are ignored)")
        for axis, size in axes.items():
            shape[axis] = size
        out[vi.name] = tuple(shape)
    return out


def _fixed(*parts: tuple[dict[str, int], int | None]) -> dict[str, dict[int, int]]:
    """input -> {axis: size} from (inputs' axes of a dimension, its size) pairs."""
    out: dict[str, dict[int, int]] = {}
    for inputs, size in parts:
        if size is not None:
            for name, axis in inputs.items():
                out.setdefault(name, {})[axis] = size
    return out


def compile_dynamic(model: str | Path | onnx.ModelProto, out_dir: str | Path, name: str, dynamic: list[str],
                    input_shapes: dict[str, tuple[int, ...]] | None = None, target: str | None = None,
                    target_cpu: str | None = None, target_features: str | None = None, sysroot: str | None = None,
                    extra_cflags: list[str] | None = None, thread_pool: bool = True,
                    log: Callable[[str], None] | None = None) -> DynamicResult:
    """Compile an ONNX model into OUT/NAME.h, libNAME.a, libNAME.so, NAME.json, NAME.cdef with the
    dimensions ``dynamic`` left to run time: at most one batch (``"batch<=32"``) and one dimension of
    listed sizes (``"seq=16,32,64"``); see the module's docstring."""
    check_model_name(name)
    specs = [parse_dynamic(d) for d in dynamic]
    bspec = next((sp for sp in specs if sp.batch), None)
    lspec = next((sp for sp in specs if not sp.batch), None)
    if not specs or len(specs) != (bspec is not None) + (lspec is not None) or \
            (bspec and lspec and bspec.dim == lspec.dim):
        raise AotcError("--dynamic: one batch (DIM<=MAX) and one dimension of listed sizes (DIM=S1,S2,...) at most, "
                        "each named once (docs/dynamic_shapes.md)")
    groups: list[int | None] = list(lspec.sizes) if lspec and lspec.sizes else [None]
    bsizes: list[int | None] = list(core_sizes(bspec)) if bspec else [None]
    suffix = (f"_b{bsizes[-1]}" if bspec else "") + (f"_s{groups[-1]}" if lspec else "")
    if len(name) + len(suffix) > 64:
        raise AotcError(f"model name {name!r}: at most {64 - len(suffix)} characters with this --dynamic (its cores "
                        "add a suffix)")
    tgt = resolve(target, target_cpu, target_features, sysroot, extra_cflags)
    out = Path(out_dir)
    check_output_dir(out, "output directory")
    say = log or (lambda _msg: None)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    if not isinstance(model, onnx.ModelProto) and is_tensorflow_model(Path(model)):
        raise AotcError("--dynamic: ONNX models only for now (TensorFlow graphs: pin the shape with --input-shape)")
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    source = Path(model).name if not isinstance(model, onnx.ModelProto) else "<model>"
    shapes = dict(input_shapes or {})
    b_inputs = dynamic_inputs(proto, bspec.dim, True) if bspec else {}
    l_inputs = dynamic_inputs(proto, lspec.dim, False) if lspec else {}
    if any(b_inputs.get(k) == a for k, a in l_inputs.items()):
        raise AotcError(f"--dynamic: {bspec} and {lspec} name the same axis")
    if bspec:
        for g in groups:  # the batch must be per-sample at every listed size
            batch_axes(proto, b_inputs, _core_shapes(proto, _fixed((l_inputs, g), (b_inputs, 1)), shapes))
    times["analysis"] = time.perf_counter() - t0

    cores: dict[tuple[int | None, int | None], Library] = {}
    t0 = time.perf_counter()
    for g in groups:
        for b in bsizes:
            core = name + (f"_b{b}" if b else "") + (f"_s{g}" if g else "")
            say(f"core {core}")
            graph = import_onnx(proto, _core_shapes(proto, _fixed((l_inputs, g), (b_inputs, b)), shapes), core, None)
            input_names = [v.name for v in graph.inputs]
            if expose_counts(graph):
                raise AotcError("--dynamic: the model has data-dependent outputs (NonZero, Unique, NonMaxSuppression)")
            output_names = [v.name for v in graph.outputs]  # the passes may rename the values behind them
            with output_errors(out):
                run_passes(graph, target=tgt)
            cores[g, b] = generate(graph, core, input_names, output_names, source, target=tgt, profile=False,
                                   pool=thread_pool and not cores)
    times["cores"] = time.perf_counter() - t0

    dims = [DimInfo(sp.dim, sp.bound, list(sp.sizes) if sp.sizes else None) for sp in (bspec, lspec) if sp]
    bdim, ldim = (0 if bspec else None), ((1 if bspec else 0) if lspec else None)
    largest = [cores[g, bsizes[-1]] for g in groups]  # per listed size, its largest batch
    last = largest[-1]
    ins = [_DimTensor.of(t, {**({b_inputs[t.name]: bdim} if t.name in b_inputs else {}),
                             **({l_inputs[t.name]: ldim} if t.name in l_inputs else {})}) for t in last.inputs]
    outs = []
    for i, t in enumerate(last.outputs):
        axes = {0: bdim} if bspec else {}
        if lspec:
            a = _varying_axis(lspec, groups, largest, i)  # type: ignore[arg-type]
            if a is not None:
                axes[a] = ldim
        outs.append(_DimTensor.of(t, axes))
    # Bytes of one sample of each argument per listed size, for splitting a batch (0: passed whole).
    samples = [([_elems(c.inputs[i].shape) if t.name in b_inputs else 0 for i, t in enumerate(c.inputs)],
                [_elems(c.outputs[i].shape) if bspec else 0 for i in range(len(c.outputs))]) for c in largest]
    lib = _merge(name, list(cores.values()))
    workspace = max(c.workspace_bytes for c in cores.values())
    common = {"name": name, "version": __version__, "api": API, "dims": dims, "bdim": bdim, "ldim": ldim,
              "groups": groups, "bsizes": bsizes[::-1], "core_names": [[cores[g, b].name for b in bsizes[::-1]]
                                                                        for g in groups],
              "samples": samples, "inputs": ins, "outputs": outs, "statuses": RUN_ERRORS,
              "dim_error": DIM_OUT_OF_RANGE, "pool": thread_pool, "workspace_bytes": workspace,
              "first_core": next(iter(cores.values())).name}
    lib.files[f"{name}.h"] = env().get_template("dims.h.j2").render(
        **common, source=comment(source, 60), target=comment(tgt.summary(), 1000)).encode()
    lib.files[f"{name}_dims.c"] = env().get_template("dims.c.j2").render(**common).encode()
    if thread_pool:  # built with -pthread under this name
        lib.files[f"{name}_pool.c"] = lib.files.pop(f"{common['first_core']}_pool.c")

    t0 = time.perf_counter()
    say("C compilation")
    labels = [b if not lspec else g if not bspec else (b, g) for g in groups for b in bsizes]
    with output_errors(out), StagedBuild(out, name) as staged:
        build_id = staged.build(lib, tgt, extra_cflags, progress=lambda line: say(f"C compilation {line}"))
        meta = _metadata(name, dims, [c.name for c in cores.values()], ins, outs, workspace, len(lib.kernels),
                         build_id, tgt, thread_pool)
        staged.commit({f"{name}.json": meta.encode(), f"{name}.cdef": _cdef(name, build_id, thread_pool).encode()})
    times["c_compile"] = time.perf_counter() - t0
    return DynamicResult(out, name, labels, dims, workspace, build_id, times)  # type: ignore[arg-type]


def _elems(shape: list[int]) -> int:
    """Elements of one sample (the product past axis 0)."""
    return int(np.prod(shape[1:], dtype=np.int64))


@dataclass
class _DimTensor:
    """An argument of the dynamic library: a core's, at the largest sizes, with the axes that vary."""

    info: TensorInfo
    dims: list[int]        # per axis: the dimension it is, or -1

    @staticmethod
    def of(t: TensorInfo, axes: dict[int, int | None]) -> _DimTensor:
        dims = [-1] * len(t.shape)
        for axis, d in axes.items():
            if d is not None:
                dims[axis] = d
        return _DimTensor(t, dims)

    def __getattr__(self, attr: str):  # noqa: ANN204 - the TensorInfo's fields, for the templates
        return getattr(self.info, attr)


def _varying_axis(spec: DynamicSpec, sizes: list[int], cores: list[Library], i: int) -> int | None:
    """The axis of output ``i`` whose length is the listed size in every core (None: a length that does
    not vary); an output whose length varies otherwise (twice the size, say) is refused."""
    shapes = [c.outputs[i].shape for c in cores]
    varying = [a for a in range(len(shapes[0])) if len({s[a] for s in shapes}) > 1]
    if not varying:
        return None
    if len(varying) > 1 or any(s[varying[0]] != k for s, k in zip(shapes, sizes, strict=True)):
        raise AotcError(f"--dynamic {spec}: output {cores[-1].outputs[i].name!r} has shapes "
                        f"{', '.join(str(list(s)) for s in shapes)} at {spec.dim} = {', '.join(map(str, sizes))}: "
                        f"aotc needs one axis of length {spec.dim} where it varies")
    return varying[0]


def _merge(name: str, cores: list[Library]) -> Library:
    """One library's files from the cores' (each prefixed with its core's name; the runtime headers
    are the same in all). Cores whose constants are the same bytes (weights packed alike for every
    batch size) share one copy: one blob, with each core's symbol a label at its start."""
    lib = Library(name)
    for core in cores:
        for fname, data in core.files.items():
            if fname in lib.files and (fname not in _SHARED or lib.files[fname] != data):
                raise AotcError(f"internal: two cores of {name} write {fname}")
            lib.files[fname] = data
        lib.kernels.extend(core.kernels)
    owners: dict[bytes, list[str]] = {}
    for core in cores:
        blob = lib.files.get(f"{core.name}_consts.bin")
        if blob is not None:
            owners.setdefault(blob, []).append(core.name)
    for names in owners.values():
        for other in names[1:]:
            del lib.files[f"{other}_consts.bin"], lib.files[f"{other}_consts.S"]
        lib.files[f"{names[0]}_consts.S"] = _shared_consts(names).encode()
    return lib


def _shared_consts(cores: list[str]) -> str:
    """The assembler file that pulls in ``cores[0]``'s constants under every core's symbol (the
    directives of templates/consts.S.j2, one label per core)."""
    symbols = [f"{c}_consts" for c in cores]
    lines = [f"/* {symbols[0]}.S: generated by aotc {__version__}. Pulls {symbols[0]}.bin into the object file "
             f"for the cores {', '.join(cores)}, whose constants are the same bytes. */",
             "\t.section .rodata", "\t.balign 64"]
    for s in symbols:
        lines += [f"\t.globl {s}", f"\t.hidden {s}", f"\t.type {s}, %object"]
    lines += [f"{s}:" for s in symbols]
    lines.append(f'\t.incbin "{symbols[0]}.bin"')
    lines += [f"\t.size {s}, . - {s}" for s in symbols]
    lines.append('\t.section .note.GNU-stack,"",%progbits')
    return "\n".join(lines) + "\n"


def _metadata(name: str, dims: list[DimInfo], cores: list[str], ins: list[_DimTensor], outs: list[_DimTensor],
              workspace: int, kernels: int, build_id: str, tgt: Target, pool: bool) -> str:
    def tensor(t: _DimTensor) -> dict:
        return {"name": t.name, "dtype": t.dtype, "shape": t.shape,
                "dims": {str(a): d for a, d in enumerate(t.dims) if d >= 0}}

    data = {"name": name, "aotc_version": __version__,
            "dims": [{"name": d.name, "max": d.max, "sizes": d.sizes} for d in dims],
            "cores": cores, "inputs": [tensor(t) for t in ins], "outputs": [tensor(t) for t in outs],
            "workspace_bytes": workspace, "num_kernels": kernels, "build_id": build_id, "target_cpu": tgt.cpu,
            "isa": tgt.isa.name, "target": tgt.metadata(), "thread_pool": pool, "profile": False}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _cdef(name: str, build_id: str, pool: bool) -> str:
    """The bindings' declarations: a static library's entry points (run at the largest sizes) and
    NAME_run_dims_parallel."""
    return (f"/* aotc build {build_id} */\n"
            f"const char *{name}_build_id(void);\n"
            + cdef(name, pool=pool)
            + f"int {name}_run_dims_parallel(const int64_t *dims, const void *const *inputs, void *const *outputs,\n"
            "    void *workspace, size_t workspace_bytes, const aotc_parallel *par);\n")
