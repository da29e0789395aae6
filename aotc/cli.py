"""The ``aotc`` command line: compile, run, profile, inspect."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from aotc.errors import AotcError

if TYPE_CHECKING:
    import onnx


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,..., got {text!r}")
    try:
        shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad dimensions in {text!r}") from None
    if any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"negative dimension in {text!r}")
    return name, shape


def _parser() -> argparse.ArgumentParser:
    from aotc import __version__
    from aotc.compiler import DEFAULT_OUT_DIR
    from aotc.target import CUDA, GENERIC, TRIPLES, host_triple

    p = argparse.ArgumentParser(prog="aotc", description="Ahead-of-time compiler: ONNX -> C library")
    p.add_argument("--version", action="version", version=f"aotc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile a model into a C library")
    c.add_argument("model", help="ONNX model file, TensorFlow frozen GraphDef (.pb, .pbtxt) or SavedModel directory")
    c.add_argument("-o", "--out-dir", default=DEFAULT_OUT_DIR,
                   help=f"output directory (default: {DEFAULT_OUT_DIR}): NAME.h, libNAME.a, libNAME.so, "
                        "NAME.json, NAME.cdef; the sources and build files are in OUT_DIR/.aotc/NAME/")
    c.add_argument("-n", "--name", help="library name, a C identifier (default: from the file name)")
    c.add_argument("-c", "--config", help="feed/fetch config (tfcompile text format)")
    c.add_argument("--input-shape", action="append", type=_shape_arg, default=[], metavar="NAME=D1,D2",
                   help="pin the shape of an input with dynamic dimensions (repeatable)")
    c.add_argument("--dynamic", action="append", default=[], metavar="DIM<=MAX|DIM=S1,S2",
                   help="leave a dimension (the model's symbolic name or INPUT:AXIS) to run time: a batch, "
                        "from 1 to MAX, or the sizes listed; gives NAME_run_dims (docs/dynamic_shapes.md)")
    c.add_argument("--tag-set", help="SavedModel: the MetaGraph's tags, comma-separated (default: serve)")
    c.add_argument("--signature", help="SavedModel: the signature to compile (default: serving_default)")
    c.add_argument("--variables-to-feed", type=lambda t: [v for v in t.split(",") if v], metavar="A,B",
                   help="SavedModel: variables that become inputs instead of constants ('all' for every one)")
    c.add_argument("--target", metavar="TRIPLE",
                   help=f"what the library is built for: {', '.join(TRIPLES)} (with TRIPLE-gcc, or CC, and "
                        f"TRIPLE-ar), {GENERIC} (portable C without intrinsics, for GCC or Clang), or {CUDA} "
                        f"(CUDA kernels for NVIDIA GPUs, built by nvcc; docs/cuda.md); default: this machine's "
                        f"({host_triple()})")
    c.add_argument("--target-cpu", metavar="CPU",
                   help="the CPU to build for (-march or -mcpu): default native for this machine's triple, "
                        "which gives a library that needs this machine's instruction sets; generic (the "
                        "compiler's baseline) for a cross triple; or a name such as x86-64-v3, x86-64-v4, "
                        "neoverse-n1")
    c.add_argument("--target-features", metavar="+F,-F",
                   help="instruction-set features to add or remove, e.g. +avx512f,-avx512bw")
    c.add_argument("--sysroot", help="the cross compiler's --sysroot (also where qemu finds the target's libc)")
    c.add_argument("--cuda-arch", metavar="sm_80,sm_90",
                   help="with --target cuda: the GPU architectures to compile for (default sm_80,sm_90; the newest "
                        "also as PTX for later GPUs)")
    c.add_argument("--cuda-tf32", action="store_true",
                   help="with --target cuda: float32 MatMul and Conv may use TF32 tensor cores (sm_80+; inputs "
                        "rounded to 10 mantissa bits, about 1e-3 relative error) instead of exact FP32")
    c.add_argument("--depfile", help="write a Make-style depfile for the generated library (no path may "
                   "hold a line break)")
    c.add_argument("--dump-to", help="write the IR after each pass and the generated C here")
    c.add_argument("--profile", action="store_true",
                   help="also build NAME_run_profiled, which records per-kernel times (see `aotc profile`)")
    c.add_argument("--gen-test", action="store_true",
                   help="also build NAME_test: checks the library against outputs computed now by onnxruntime")
    c.add_argument("--gen-benchmark", action="store_true",
                   help="also build NAME_benchmark: prints latency percentiles (-t THREADS -n ITERATIONS)")
    c.add_argument("--cpp-class", metavar="NS::NAME",
                   help="also write NAME.hpp: a C++ class with the interface of tfcompile's --cpp_class "
                        "header (see docs/tfcompile.md)")
    c.add_argument("--train", action="store_true",
                   help="also build NAME_train_step and the state buffer the parameters live in (needs --loss)")
    c.add_argument("--loss", metavar="NAME|softmax_ce:LABELS|mse:TARGETS",
                   help="with --train: a float scalar tensor of the model, or softmax cross-entropy (int64 classes) "
                        "or mean squared error against a new input LABELS/TARGETS, on the first output "
                        "(or :OUTPUT, e.g. softmax_ce:labels:logits)")
    c.add_argument("--optimizer", default="sgd:lr=0.01", metavar="sgd:lr=..|momentum:..|adam:..",
                   help="with --train (default sgd:lr=0.01): sgd:lr=L, momentum:lr=L,momentum=M[,nesterov=1], "
                        "adam:lr=L,beta1=B1,beta2=B2,eps=E or adamw:..., each also with weight_decay=D")
    c.add_argument("--trainable", default="all", metavar="all|NAME,...",
                   help="with --train: the initializers to train (default all float ones but BatchNorm's "
                        "running statistics)")
    c.add_argument("--no-thread-pool", action="store_true",
                   help="leave out NAME_pool_create (for systems without pthreads)")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    c.add_argument("-v", "--verbose", action="store_true", help="print each compilation step")

    r = sub.add_parser("run", help="run a compiled model on .npy inputs")
    r.add_argument("model", help="OUTDIR/NAME of a compiled model")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--output-dir", help="write each output as NAME.npy here (default: print them)")
    r.add_argument("-t", "--threads", type=_positive, default=1, help="threads per run (default 1)")

    f = sub.add_parser("profile", help="time each kernel of a model compiled with --profile")
    f.add_argument("model", help="OUTDIR/NAME of a model compiled with --profile")
    f.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="inputs (default: random normal floats, zero integers)")
    f.add_argument("-i", "--iterations", type=_positive, default=100)
    f.add_argument("-t", "--threads", type=_positive, default=1)
    f.add_argument("--trace", help="Chrome trace JSON to write (default: OUTDIR/NAME_trace.json)")

    i = sub.add_parser("inspect", help="list a model's ops, inputs, outputs and what is unsupported")
    i.add_argument("model", help="ONNX model file, TensorFlow frozen GraphDef (.pb, .pbtxt) or SavedModel directory")
    return p


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


class _StatusLine:
    """One status line on a terminal, rewritten in place; nothing at all when stderr is a log."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, msg: str) -> None:
        width = shutil.get_terminal_size((80, 20)).columns - 1
        sys.stderr.write("\r\033[K" + f"aotc: {msg}"[:width])
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _cmd_compile(args: argparse.Namespace) -> None:
    from aotc.compiler import _default_name, compile_model

    status = None
    if args.verbose:
        def log(m: str) -> None:
            print(f"aotc: {m}", file=sys.stderr)
    elif not args.quiet and sys.stderr.isatty():
        log = status = _StatusLine()
    else:
        log = None
    name = args.name or _default_name(Path(args.model))
    if args.dynamic:
        _compile_dynamic(args, name, log, status)
        return
    train = None
    if args.train or args.loss:
        from aotc.training.spec import Train

        if not (args.train and args.loss):
            raise AotcError("--train and --loss go together: --train --loss NAME|softmax_ce:LABELS|mse:TARGETS")
        train = Train(args.loss, args.optimizer, args.trainable)
    try:
        res = compile_model(args.model, args.out_dir, name, config=args.config,
                            input_shapes=dict(args.input_shape), target=args.target, target_cpu=args.target_cpu,
                            target_features=args.target_features, sysroot=args.sysroot,
                            cuda_arch=args.cuda_arch, cuda_tf32=args.cuda_tf32,
                            dump_to=args.dump_to, depfile=args.depfile, log=log, profile=args.profile,
                            thread_pool=not args.no_thread_pool, gen_test=args.gen_test,
                            gen_benchmark=args.gen_benchmark, tag_set=args.tag_set, signature=args.signature,
                            variables_to_feed=args.variables_to_feed, cpp_class=args.cpp_class, train=train)
    finally:
        if status is not None:
            status.clear()
    if not args.quiet:
        plan = res.graph.memory
        total = sum(res.seconds.values())
        train = (f" (+{len(res.library.kernels) - res.num_kernels} for the training step, state "
                 f"{res.library.state.nbytes} bytes)" if res.library.state else "")
        print(f"aotc: compiled {name}: {res.num_kernels} kernels{train}, workspace {res.library.workspace_bytes} bytes "
              f"(intermediates {plan.intermediate_bytes}), constants {res.library.consts_bytes} bytes, "
              f"{total:.2f}s -> {res.out_dir}/{name}.h{f', {name}.hpp' if args.cpp_class else ''}, "
              f"lib{name}.a, lib{name}.so"
              + "".join(f", {p}" for p in sorted(res.library.programs)))


def _compile_dynamic(args: argparse.Namespace, name: str, log, status: _StatusLine | None) -> None:  # noqa: ANN001
    from aotc.dynamic_library import compile_dynamic

    other = [o for o, v in (("--config", args.config), ("--dump-to", args.dump_to), ("--depfile", args.depfile),
                            ("--profile", args.profile), ("--gen-test", args.gen_test),
                            ("--gen-benchmark", args.gen_benchmark), ("--cpp-class", args.cpp_class)) if v]
    if other:
        raise AotcError(f"--dynamic does not take {', '.join(other)} yet")
    try:
        res = compile_dynamic(args.model, args.out_dir, name, args.dynamic, input_shapes=dict(args.input_shape),
                              target=args.target, target_cpu=args.target_cpu, target_features=args.target_features,
                              sysroot=args.sysroot, thread_pool=not args.no_thread_pool, log=log)
    finally:
        if status is not None:
            status.clear()
    if not args.quiet:
        dims = ", ".join(f"{d.name} 1..{d.max}" if d.sizes is None else f"{d.name} = {', '.join(map(str, d.sizes))}"
                         for d in res.dims)
        print(f"aotc: compiled {name} for {dims} (cores at {', '.join(map(str, res.cores))}), workspace "
              f"{res.workspace_bytes} bytes, {sum(res.seconds.values()):.2f}s -> {res.out_dir}/{name}.h, "
              f"lib{name}.a, lib{name}.so")

def _read_inputs(items: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise AotcError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise AotcError(f"cannot read {path}: {e}") from None
    return feeds


def _cmd_run(args: argparse.Namespace) -> None:
    from aotc.bindings import load
    from aotc.build import check_output_dir, output_errors

    if args.output_dir:
        check_output_dir(Path(args.output_dir), "--output-dir")
    m = load(args.model, threads=args.threads)
    feeds = {k: np.ascontiguousarray(v) for k, v in _read_inputs(args.input).items()}
    try:
        outs = m.run(feeds)
    except (ValueError, TypeError) as e:
        raise AotcError(str(e)) from None
    # An input updated in place (a TensorFlow variable) is shown or saved after the outputs, as updated.
    results = [*zip(m.outputs, outs, strict=True), *((t, feeds[t.name]) for t in m.inputs if t.updated)]
    for t, y in results:
        if args.output_dir:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in t.name)
            with output_errors(args.output_dir):
                Path(args.output_dir).mkdir(parents=True, exist_ok=True)
                np.save(Path(args.output_dir) / f"{safe}.npy", y)
        else:
            print(f"{t.name}: {y.dtype}{list(y.shape)}")
            print(np.array2string(y, threshold=50))


def _cmd_profile(args: argparse.Namespace) -> None:
    from aotc.bindings import load
    from aotc.build import output_errors
    from aotc.reference import random_inputs

    m = load(args.model, threads=args.threads)
    feeds: dict[str, np.ndarray] = _read_inputs(args.input)
    if not feeds:
        feeds = dict(zip([t.name for t in m.inputs],
                         random_inputs([(t.dtype, t.shape) for t in m.inputs]), strict=True))
    trace = Path(args.trace) if args.trace else Path(args.model).parent / f"{m.name}_trace.json"
    try:
        with output_errors(trace):
            prof = m.profile(feeds, iterations=args.iterations, trace=trace)
    except (ValueError, TypeError) as e:
        raise AotcError(str(e)) from None
    print(prof.table())
    print(f"trace: {trace} (open in chrome://tracing or ui.perfetto.dev)")


def _type_text(t: onnx.TypeProto) -> str:
    """``float32 [1, 'N', 3]``, ``sequence of float32 [2]``, ``optional of ...``."""
    import onnx.helper

    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        return "sequence of " + _type_text(t.sequence_type.elem_type)
    if kind == "optional_type":
        return "optional of " + _type_text(t.optional_type.elem_type)
    if kind != "tensor_type":
        return kind or "unknown type"
    tt = t.tensor_type
    try:  # numpy names strings "object"
        dtype = "string" if tt.elem_type == onnx.TensorProto.STRING else \
            onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
    except (KeyError, ValueError):
        dtype = f"elem_type {tt.elem_type}"
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return f"{dtype} {dims}" if tt.HasField("shape") else f"{dtype} (rank unknown)"


def _inspect_tensorflow(path: str) -> None:
    from aotc.frontends.tensorflow import summarize

    s = summarize(path)
    print(f"model: {path} ({s.kind})")
    print("inputs:")
    for name, type_text in s.inputs:
        print(f"  {name!r}: {type_text}")
    print("outputs:")
    for name in s.outputs:
        print(f"  {name!r}")
    print("ops:")
    for op, (n, ok) in sorted(s.ops.items()):
        print(f"  {op:24s} x{n}{'' if ok else '   UNSUPPORTED'}")
    missing = [op for op, (_, ok) in sorted(s.ops.items()) if not ok]
    print(f"unsupported: {', '.join(missing) if missing else 'none'}")


def _cmd_inspect(args: argparse.Namespace) -> None:
    from aotc.frontends.onnx import FRONTEND_OPS, list_ops, load_model
    from aotc.frontends.tensorflow import is_tensorflow_model
    from aotc.ops import OPS

    if is_tensorflow_model(args.model):
        _inspect_tensorflow(args.model)
        return
    model = load_model(args.model)
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), "?")
    print(f"model: {args.model} (ir_version {model.ir_version}, opset {opset})")
    for title, vis in (("inputs", [v for v in model.graph.input
                                   if v.name not in {i.name for i in model.graph.initializer}]),
                       ("outputs", model.graph.output)):
        print(f"{title}:")
        for v in vis:
            print(f"  {v.name!r}: {_type_text(v.type)}")
    ops = list_ops(model)
    print("ops:")
    missing = []
    for op, n in sorted(ops.items()):
        ok = op in OPS or op in FRONTEND_OPS
        print(f"  {op:24s} x{n}{'' if ok else '   UNSUPPORTED'}")
        if not ok:
            missing.append(op)
    print(f"unsupported: {', '.join(missing) if missing else 'none'}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        {"compile": _cmd_compile, "run": _cmd_run, "profile": _cmd_profile,
         "inspect": _cmd_inspect}[args.command](args)
    except AotcError as e:
        print(f"aotc: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
