"""The compile driver: model file -> IR -> passes -> C -> built library (+ metadata, depfile)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from aotc.build import StagedBuild, build_dir, check_output_dir, output_errors, write_if_changed
from aotc.codegen.cpp_class import cpp_header, parse_cpp_class
from aotc.codegen.cuda.library import cuda_cdef, generate_cuda
from aotc.codegen.cuda.programs import cuda_benchmark_program, cuda_test_program
from aotc.codegen.library import Entry, Library, bounded_layout, cdef, generate, metadata
from aotc.codegen.names import check_model_name
from aotc.codegen.programs import benchmark_program, test_program
from aotc.config import Config, load_config
from aotc.errors import AotcError
from aotc.frontends.onnx import import_onnx, load_model
from aotc.frontends.tensorflow import (
    check_graph_options,
    import_tensorflow,
    is_tensorflow_model,
    tensorflow_model_files,
)
from aotc.ir import dtypes
from aotc.ir.graph import Graph
from aotc.passes.counts import expose_counts
from aotc.passes.pipeline import run_passes
from aotc.passes.prune import apply_config
from aotc.reference import random_inputs, run_reference, to_onnx
from aotc.resources import runtime_dir, templates_dir
from aotc.target import resolve

if TYPE_CHECKING:
    from aotc.bindings import CompiledModel
    from aotc.training.spec import Train


# Not "build": CMake, Meson and many Makefiles own that directory.
DEFAULT_OUT_DIR = "aotc-out"


@dataclass
class CompileResult:
    out_dir: Path
    name: str
    library: Library
    graph: Graph
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def num_kernels(self) -> int:
        return len(self.graph.kernels)

    @property
    def prefix(self) -> Path:
        return self.out_dir / self.name

    @property
    def build_dir(self) -> Path:
        """The model's build tree: generated sources, build.ninja, objects, build.log."""
        return build_dir(self.out_dir, self.name)


def compile_model(model: str | Path | onnx.ModelProto | Graph, out_dir: str | Path, name: str,
                  config: str | Path | Config | None = None,
                  input_shapes: dict[str, tuple[int, ...]] | None = None,
                  target_cpu: str | None = None, dump_to: str | Path | None = None,
                  depfile: str | Path | None = None, extra_cflags: list[str] | None = None,
                  log: Callable[[str], None] | None = None, profile: bool = False,
                  thread_pool: bool = True, gen_test: bool = False, gen_benchmark: bool = False,
                  test_tolerance: tuple[float, float] = (1e-3, 1e-4), tag_set: str | None = None,
                  signature: str | None = None, variables_to_feed: list[str] | None = None,
                  cpp_class: str | None = None, target: str | None = None, target_features: str | None = None,
                  sysroot: str | None = None,
                  test_data: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
                  train: Train | str | None = None,
                  cuda_arch: str | None = None, cuda_tf32: bool = False) -> CompileResult:
    """Compile ``model`` into ``out_dir``: NAME.h, libNAME.a, libNAME.so, NAME.json and NAME.cdef
    (built in ``out_dir/.aotc/NAME/``, delivered only when the build succeeded; see aotc.build).

    ``profile`` builds NAME_run_profiled (per-kernel timestamps; the default build has no timing
    code at all); ``thread_pool=False`` leaves out the pthread pool for systems without threads.
    ``gen_test`` adds the program NAME_test, which checks the library against expected outputs
    computed now by onnxruntime (or onnx.reference) within ``test_tolerance`` (rtol, atol), or on
    ``test_data``: (inputs in the library's order, expected outputs in the model's) when given;
    ``gen_benchmark`` adds NAME_benchmark, which prints latency percentiles. ``cpp_class``
    (``"ns::Name"``) adds NAME.hpp, a C++ class with the interface tfcompile generated (docs/tfcompile.md).
    ``tag_set``, ``signature`` and ``variables_to_feed`` choose what of a TensorFlow SavedModel
    directory is compiled (aotc.frontends.tensorflow.import_saved_model).

    ``target`` (a triple: this machine's by default, ``aarch64-linux-gnu``, ``riscv64-linux-gnu``, or
    ``generic`` for plain C), ``target_cpu`` (default ``native`` for this machine's triple: the library
    then needs a CPU with this one's instruction sets; ``generic`` for a cross triple),
    ``target_features`` (``+avx512f,-avx512bw``) and ``sysroot`` choose what the library is built for
    (aotc.target.resolve); a library for another machine is tested through its generated test program.
    ``target="cuda"`` builds a CUDA library with nvcc instead (docs/cuda.md): ``cuda_arch`` (``"sm_90,sm_80"``)
    chooses the GPUs, ``cuda_tf32`` lets float32 GEMMs and convs use TF32 tensor cores.

    ``train`` (``aotc.Train``: loss, optimizer, trainable parameters; a string is the loss, with SGD) adds
    NAME_train_step and the state buffer the parameters live in (aotc.training); NAME_run then reads them
    from the state.
    """
    check_model_name(name)
    if cpp_class is not None:
        parse_cpp_class(cpp_class, name)
    tgt = resolve(target, target_cpu, target_features, sysroot, extra_cflags, cuda_arch, cuda_tf32)
    if tgt.is_cuda and (cpp_class is not None or train is not None):
        raise AotcError("--target cuda does not take --cpp-class or --train")
    out = Path(out_dir)
    check_output_dir(out, "output directory")
    if dump_to:
        check_output_dir(Path(dump_to), "dump directory")
    model_path = Path(model) if isinstance(model, (str, Path)) else None
    if depfile:
        deps = ([] if model_path is None else tensorflow_model_files(model_path)
                if is_tensorflow_model(model_path) else [model_path])
        if isinstance(config, (str, Path)):
            deps.append(Path(config))
        check_depfile(Path(depfile), [out, *deps])
    times: dict[str, float] = {}
    say = log or (lambda _msg: None)
    say(f"target {tgt.summary()}")

    t0 = time.perf_counter()
    say("import")
    cfg = load_config(config) if isinstance(config, (str, Path)) else config
    shapes = dict(input_shapes or {})
    proto: onnx.ModelProto | None = None
    if isinstance(model, Graph):  # imported by the caller (any frontend); the config still applies
        graph = model
        graph.name = name
        if cfg is not None:
            apply_config(graph, cfg)
    elif model_path is not None and is_tensorflow_model(model_path):
        graph = import_tensorflow(model_path, shapes, name, cfg, tag_set, signature, variables_to_feed)
    else:
        check_graph_options(model_path or "the model", tag_set, signature, variables_to_feed)
        proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
        graph = import_onnx(proto, shapes, name, cfg)
    if (gen_test or gen_benchmark) and any(dtypes.is_string(v.dtype) for v in graph.inputs):
        raise AotcError("--gen-test and --gen-benchmark do not support string inputs: the generated "
                        "programs store inputs as fixed-size binary elements, not strings")
    if train is not None:
        from aotc.training.build import inference_mode

        inference_mode(graph)  # what NAME_run computes (from the initial state: the reference below)
    reference_model = to_onnx(graph) if gen_test and test_data is None else None
    training = None
    if train is not None:
        given = ([v.name for v in graph.inputs], [v.name for v in graph.outputs])
        training = _training_graphs(graph, train, proto, cpp_class is not None)
        graph = training.inference
        own = [v.name for i, v in enumerate(graph.inputs) if i not in training.inference_state]
        if reference_model is not None and given != (own, [v.name for v in graph.outputs]):
            raise AotcError("--gen-test with --train checks NAME_run against the model, which takes other "
                            "inputs or gives other outputs when the loss is one of its tensors")
    input_names = [v.name for v in graph.inputs]
    bounded = expose_counts(graph)  # data-dependent outputs get their count outputs (ops/dynamic.py)
    output_names = [v.name for v in graph.outputs]
    times["import"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with output_errors(dump_to or out):
        run_passes(graph, dump_dir=Path(dump_to) if dump_to else None, log=say, target=tgt)
        if training is not None:
            say("training step")
            run_passes(training.train, dump_dir=Path(dump_to) / "train" if dump_to else None, log=say, target=tgt)
    times["passes"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    say(f"codegen: {len(graph.kernels)} kernels")
    source = model_path.name if model_path else "<model>"
    train_entry = None if training is None else Entry(training.train, [v.name for v in training.train.inputs],
                                                      [v.name for v in training.train.outputs], training.train_state)
    if tgt.is_cuda:
        if bounded:
            raise AotcError("--target cuda does not compile data-dependent outputs (NonZero, Unique, ...)")
        if graph.updates:
            raise AotcError("--target cuda does not compile inputs updated in place (variables the graph assigns)")
        lib = generate_cuda(graph, name, input_names, output_names, source, target=tgt, profile=profile)
        thread_pool = False
    else:
        lib = generate(graph, name, input_names, output_names, source, target=tgt, profile=profile,
                       pool=thread_pool, bounded=bounded, state=training.layout if training else None,
                       state_inputs=training.inference_state if training else None, train=train_entry)
    times["codegen"] = time.perf_counter() - t0
    if gen_test:
        t0 = time.perf_counter()
        say("reference outputs for the generated test")
        if test_data is not None:
            (inputs, expected), ref_name = test_data, "given with the model"
            if len(inputs) != len(lib.inputs):
                raise AotcError(f"test_data holds {len(inputs)} inputs; {name} takes {len(lib.inputs)}")
        else:
            inputs = random_inputs([(t.dtype, tuple(t.shape)) for t in lib.inputs])
            expected, ref_name = run_reference(reference_model, inputs)
        expected = bounded_layout(lib, expected)
        if tgt.is_cuda:
            lib.files.update(cuda_test_program(lib, inputs, expected, ref_name, *test_tolerance))
            lib.programs[f"{name}_test"] = [f"{name}_test.cu", f"{name}_test_data.S"]
        else:
            lib.files.update(test_program(lib, inputs, expected, ref_name, *test_tolerance, thread_pool))
            lib.programs[f"{name}_test"] = [f"{name}_test.c", f"{name}_test_data.S"]
        times["reference"] = time.perf_counter() - t0
    if gen_benchmark and tgt.is_cuda:
        lib.files.update(cuda_benchmark_program(lib))
        lib.programs[f"{name}_benchmark"] = [f"{name}_benchmark.cu"]
    elif gen_benchmark:
        lib.files.update(benchmark_program(lib, thread_pool))
        lib.programs[f"{name}_benchmark"] = [f"{name}_benchmark.c"]

    t0 = time.perf_counter()
    say("C compilation")
    with output_errors(out), StagedBuild(out, name) as staged:
        build_id = staged.build(lib, tgt, extra_cflags,
                                progress=lambda line: say(f"C compilation {line}"))
        cpp = {f"{name}.hpp": cpp_header(lib, cpp_class, source)} if cpp_class is not None else {}
        info = {"target_cpu": tgt.cpu, "isa": tgt.isa.name, "target": tgt.metadata(), "profile": profile,
                "thread_pool": thread_pool,
                "memory": graph.memory.summary(), "build_id": build_id}
        if training is not None:
            info["train"] = training.metadata(lib, model_path)
        staged.commit({**cpp, f"{name}.json": metadata(lib, graph, info).encode(),
                       f"{name}.cdef": (f"/* aotc build {build_id} */\n"
                                        f"const char *{name}_build_id(void);\n"
                                        + (cuda_cdef(name, profile) if tgt.is_cuda else
                                           cdef(name, profile, thread_pool, training is not None))).encode()})
    times["c_compile"] = time.perf_counter() - t0
    if cpp_class is None:
        _remove_generated(out / f"{name}.hpp", f"/* {name}.hpp: generated by aotc ")

    if dump_to:
        with output_errors(dump_to):
            for fname, data in lib.files.items():
                if fname.endswith((".c", ".h", ".cu", ".cuh")):
                    write_if_changed(Path(dump_to) / fname, data)
    if depfile:
        targets = [out / f"lib{name}.a", out / f"lib{name}.so", out / f"{name}.h"]
        if cpp_class is not None:
            targets.append(out / f"{name}.hpp")
        with output_errors(depfile):
            write_depfile(Path(depfile), targets, deps)
            for t in targets:  # make compares mtimes: the rule ran, so its targets are now fresh
                os.utime(t)
    return CompileResult(out, name, lib, graph, times)


def _training_graphs(graph: Graph, train: Train | str, proto: onnx.ModelProto | None, cpp_class: bool):
    """The inference and training graphs of a --train compile (aotc.training.build)."""
    from aotc.training.build import build_training
    from aotc.training.spec import Train

    if isinstance(train, str):
        train = Train(train)
    if cpp_class:
        raise AotcError("--train does not combine with --cpp-class yet")
    if proto is not None:
        initializers = {t.name for t in proto.graph.initializer}
    else:  # a graph imported by the caller: its float constants are the candidates
        initializers = {v.name for v in graph.values() if v.is_const}
    return build_training(graph, train, initializers)


def _remove_generated(path: Path, first: str) -> None:
    """Remove ``path`` if an earlier compile wrote it (its text starts with ``first``): a C++ header left
    from a compile with --cpp-class would describe a library that is gone."""
    try:
        with open(path, "rb") as f:
            mine = f.read(len(first)) == first.encode()
    except OSError:
        return
    if mine:
        with output_errors(path):
            path.unlink()


def aotc_sources() -> list[Path]:
    """aotc's own files: a change to any of them must rebuild generated libraries."""
    pkg = Path(__file__).resolve().parent
    files = sorted(pkg.rglob("*.py"))
    for d in (templates_dir(), runtime_dir()):
        files += sorted(p for p in d.iterdir() if p.is_file() and p.suffix in (".j2", ".h", ".c"))
    return files


def check_depfile(path: Path, paths: list[Path]) -> None:
    """Refuse now what ``write_depfile`` could not write: Make has no escape for a line break."""
    if path.is_dir():
        raise AotcError(f"depfile {path} is a directory")
    check_output_dir(path.parent, "depfile directory")
    for p in [path, *paths]:
        if "\n" in str(p) or "\r" in str(p):
            raise AotcError(f"cannot write a depfile naming {str(p)!r}: Make cannot express a path with a "
                            "line break (rename it or leave out --depfile)")


def write_depfile(path: Path, targets: list[Path], inputs: list[Path]) -> None:
    def esc(p: Path) -> str:  # as GNU make and ninja read a depfile (make stops at a bare ':')
        return (str(p).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")
                .replace(":", "\\:"))

    deps = [*inputs, *aotc_sources()]
    text = f"{' '.join(esc(t) for t in targets)}: \\\n  " + " \\\n  ".join(esc(d.resolve()) for d in deps) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, text.encode())


def compile(model: str | Path | onnx.ModelProto | Graph, out_dir: str | Path = DEFAULT_OUT_DIR, name: str | None = None,
            threads: int = 1, **options) -> CompiledModel:  # noqa: A001
    """Compile a model and load it: ``aotc.compile("m.onnx", out_dir="aotc-out", name="m").run(feeds)``.

    ``threads`` is how many threads each run uses; ``options`` are those of ``compile_model``."""
    from aotc.bindings import load

    if name is None:
        name = "model" if isinstance(model, (onnx.ModelProto, Graph)) else _default_name(Path(model))
    result = compile_model(model, out_dir, name, **options)
    loaded = load(result.prefix, threads=threads)
    if isinstance(model, onnx.ModelProto):
        loaded.source_model = model  # what save() writes back with the trained initializers
    return loaded


def _default_name(path: Path) -> str:
    import re

    stem = re.sub(r"[^A-Za-z0-9_]", "_", path.stem) or "model"
    return stem if stem[0].isalpha() else "m_" + stem

