"""The ``aotc`` command line: compile, run, inspect."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from aotc.errors import AotcError


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
    from aotc.target import TARGETS

    p = argparse.ArgumentParser(prog="aotc", description="Ahead-of-time compiler: ONNX -> C library")
    p.add_argument("--version", action="version", version=f"aotc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile a model into a C library")
    c.add_argument("model", help="ONNX model file")
    c.add_argument("-o", "--out-dir", default="build", help="output directory (default: build)")
    c.add_argument("-n", "--name", help="library name, a C identifier (default: from the file name)")
    c.add_argument("-c", "--config", help="feed/fetch config (tfcompile text format)")
    c.add_argument("--input-shape", action="append", type=_shape_arg, default=[], metavar="NAME=D1,D2",
                   help="pin the shape of an input with dynamic dimensions (repeatable)")
    c.add_argument("--target-cpu", default="native", choices=TARGETS)
    c.add_argument("--depfile", help="write a Make-style depfile for the generated library")
    c.add_argument("--dump-to", help="write the IR after each pass and the generated C here")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    c.add_argument("-v", "--verbose", action="store_true", help="print each compilation step")

    r = sub.add_parser("run", help="run a compiled model on .npy inputs")
    r.add_argument("model", help="OUTDIR/NAME of a compiled model")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--output-dir", help="write each output as NAME.npy here (default: print them)")

    i = sub.add_parser("inspect", help="list a model's ops, inputs, outputs and what is unsupported")
    i.add_argument("model", help="ONNX model file")
    return p


def _cmd_compile(args: argparse.Namespace) -> None:
    from aotc.compiler import _default_name, compile_model

    log = (lambda m: print(f"aotc: {m}", file=sys.stderr)) if args.verbose else None
    name = args.name or _default_name(Path(args.model))
    res = compile_model(args.model, args.out_dir, name, config=args.config,
                        input_shapes=dict(args.input_shape), target_cpu=args.target_cpu,
                        dump_to=args.dump_to, depfile=args.depfile, log=log)
    if not args.quiet:
        plan = res.graph.memory
        total = sum(res.seconds.values())
        print(f"aotc: compiled {name}: {res.num_kernels} kernels, workspace {plan.workspace_bytes} bytes "
              f"(intermediates {plan.intermediate_bytes}), constants {res.library.consts_bytes} bytes, "
              f"{total:.2f}s -> {res.out_dir}/{name}.h, lib{name}.a, lib{name}.so")


def _cmd_run(args: argparse.Namespace) -> None:
    from aotc.bindings import load

    m = load(args.model)
    feeds = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            raise AotcError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise AotcError(f"cannot read {path}: {e}") from None
    try:
        outs = m.run(feeds)
    except (ValueError, TypeError) as e:
        raise AotcError(str(e)) from None
    for t, y in zip(m.outputs, outs, strict=True):
        if args.output_dir:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in t.name)
            np.save(Path(args.output_dir) / f"{safe}.npy", y)
        else:
            print(f"{t.name}: {y.dtype}{list(y.shape)}")
            print(np.array2string(y, threshold=50))


def _cmd_inspect(args: argparse.Namespace) -> None:
    from aotc.frontends.onnx import list_ops, load_model
    from aotc.ops import OPS

    model = load_model(args.model)
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), "?")
    print(f"model: {args.model} (ir_version {model.ir_version}, opset {opset})")
    for title, vis in (("inputs", [v for v in model.graph.input
                                   if v.name not in {i.name for i in model.graph.initializer}]),
                       ("outputs", model.graph.output)):
        print(f"{title}:")
        for v in vis:
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
            print(f"  {v.name!r}: elem_type {t.elem_type} shape {dims}")
    ops = list_ops(model)
    print("ops:")
    missing = []
    for op, n in sorted(ops.items()):
        ok = op in OPS or op == "Constant"
        print(f"  {op:24s} x{n}{'' if ok else '   UNSUPPORTED'}")
        if not ok:
            missing.append(op)
    print(f"unsupported: {', '.join(missing) if missing else 'none'}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        {"compile": _cmd_compile, "run": _cmd_run, "inspect": _cmd_inspect}[args.command](args)
    except AotcError as e:
        print(f"aotc: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
