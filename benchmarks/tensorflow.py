"""aotc on TensorFlow models beside TensorFlow itself and the ONNX path, measured in one run; prints medians
and ratios.

    python benchmarks/tensorflow.py [--threads 1 2] [--quick] [--no-large] [--write-docs docs/benchmarks_tensorflow.md]

Models: the Keras MobileNetV2 (alpha 0.35, 96x96) and the BERT-like block of tests/tf_fixtures.py (their
cached frozen graphs, ``AOTC_TF_FIXTURES``), and unless ``--no-large`` a MobileNetV2 at full size (alpha
1.0, 224x224, random weights) built by the same fixture code; batch 1, except the BERT block's 2x8 ids.
Each frozen GraphDef is compiled by aotc and run beside

- TensorFlow: the same frozen graph as a tf.function (``wrap_function``), with
  ``tf.config.threading`` set to N intra-op threads and 1 inter-op thread;
- the ONNX path: the graph converted by tf2onnx (when it is installed: ``pip install tf2onnx``; its
  Erfc, which it cannot convert, rewritten as 1 - Erf first), compiled by aotc, and run by onnxruntime
  (all graph optimizations, N threads).

TensorFlow's thread counts are fixed once per process, so each thread count runs in a process of its
own; inside it every runtime is timed in alternating slices (benchmarks/compare.py's
``interleaved_medians``: medians over many iterations after warm-up), through its Python API with
numpy arrays out. ``tf/aotc`` > 1 means aotc is faster than TensorFlow; ``onnx path/aotc`` is the
aotc-compiled tf2onnx model's time over the aotc-compiled GraphDef's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, this file's folder heads sys.path, and this file would be imported as TensorFlow: the
# folder goes, and compare.py (which puts it back) is imported only after TensorFlow.
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "tests"))

FIXTURES = {"mobilenet_v2": "MobileNetV2 0.35 96x96 b1", "bert": "BERT-like block (Keras) 2x8"}
LARGE = "mobilenet_v2_224"
LARGE_LABEL = "MobileNetV2 1.0 224x224 b1"
OPSET = 17


def _quiet_tensorflow(threads: int):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


# -- preparing the models (a process of its own: it imports TensorFlow) -------------------------------
def prepare(out: Path, large: bool) -> None:
    """Write ``out/models.json``: per model its frozen graph, feed/fetch names, inputs, and the tf2onnx
    export (or why there is none)."""
    import numpy as np
    from tf_fixtures import fixtures_dir

    tf = _quiet_tensorflow(1)
    fx = fixtures_dir()
    models = []
    for name, label in FIXTURES.items():
        meta = json.loads((fx / f"{name}.json").read_text())
        data = np.load(fx / f"{name}.npz")
        feeds = out / f"{name}_in.npy"
        np.save(feeds, data["in_0"])
        models.append({"name": name, "label": label, "pb": str(fx / f"{name}.pb"), "inputs": meta["inputs"],
                       "outputs": meta["outputs"], "feed": str(feeds)})
    if large:
        models.append(_large_mobilenet(tf, out))
    try:
        import tf2onnx
    except ImportError:
        tf2onnx = None
    for m in models:
        if tf2onnx is None:
            m["onnx_error"] = "tf2onnx is not installed"
            continue
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(Path(m["pb"]).read_bytes())
        _erfc_as_erf(tf, graph_def)
        try:
            proto, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=m["inputs"], output_names=m["outputs"],
                                                      opset=OPSET)
        except Exception as e:  # a converter failure is a result to report, not a crash
            m["onnx_error"] = f"tf2onnx: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            continue
        path = out / f"{m['name']}.onnx"
        path.write_bytes(proto.SerializeToString())
        m["onnx"] = str(path)
    (out / "models.json").write_text(json.dumps(models, indent=1))
    versions = {"tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__ if tf2onnx else "not installed"}
    (out / "versions.json").write_text(json.dumps(versions))


def _large_mobilenet(tf, out: Path) -> dict:
    """MobileNetV2 at full size, random weights calibrated as the fixtures' are, frozen as they are."""
    import keras
    import numpy as np
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    from tf_fixtures import _application

    fn, args, _ = _application(lambda **kw: keras.applications.MobileNetV2(alpha=1.0, **kw), 224)
    frozen = convert_variables_to_constants_v2(fn)
    pb = out / f"{LARGE}.pb"
    pb.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    feeds = out / f"{LARGE}_in.npy"
    np.save(feeds, args[0])
    return {"name": LARGE, "label": LARGE_LABEL, "pb": str(pb), "feed": str(feeds),
            "inputs": [t.name for t in frozen.inputs if t.dtype != tf.resource],
            "outputs": [t.name for t in frozen.outputs]}


def _erfc_as_erf(tf, graph_def) -> None:
    """Keras' exact gelu uses Erfc, which tf2onnx 1.17 cannot convert: 1 - Erf(x) in its place."""
    for n in list(graph_def.node):
        if n.op != "Erfc":
            continue
        erf = graph_def.node.add()
        erf.CopyFrom(n)
        erf.name, erf.op = f"{n.name}/erf", "Erf"
        one = graph_def.node.add()
        one.name, one.op = f"{n.name}/one", "Const"
        one.attr["dtype"].type = n.attr["T"].type
        one.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(1.0, tf.as_dtype(n.attr["T"].type)))
        n.op = "Sub"
        del n.input[:]
        n.input.extend([one.name, erf.name])


# -- compiling (this process: no TensorFlow) ----------------------------------------------------------
def compile_all(models: list[dict], out: Path) -> None:
    """aotc libraries of every frozen graph and every tf2onnx export; compile time and kernels."""
    from aotc.compiler import compile_model
    from aotc.frontends.tensorflow import import_graphdef

    for i, m in enumerate(models):
        t0 = time.perf_counter()
        graph = import_graphdef(Path(m["pb"]), None, m["name"], outputs=m["outputs"])
        res = compile_model(graph, out / f"tf{i}", f"tf{i}")
        m["aotc"] = {"prefix": str(res.prefix), "compile_s": time.perf_counter() - t0, "kernels": res.num_kernels}
        if "onnx" in m:
            t0 = time.perf_counter()
            res = compile_model(m["onnx"], out / f"onnx{i}", f"onnx{i}")
            m["aotc_onnx"] = {"prefix": str(res.prefix), "compile_s": time.perf_counter() - t0,
                              "kernels": res.num_kernels}
        print(f"  compiled {m['label']}", file=sys.stderr)


# -- timing (a process per thread count) --------------------------------------------------------------
def worker(out: Path, threads: int, quick: bool) -> None:
    """Time every runtime on every model at ``threads`` threads; one JSON line per model on stdout."""
    import numpy as np
    import onnxruntime as ort

    import aotc

    tf = _quiet_tensorflow(threads)
    interleaved_medians = _compare().interleaved_medians
    iters, secs = (5, 0.3) if quick else (30, 2.0)
    for m in json.loads((out / "models.json").read_text()):
        x = np.load(m["feed"])
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(Path(m["pb"]).read_bytes())
        wrapped = tf.compat.v1.wrap_function(lambda gd=graph_def: tf.compat.v1.import_graph_def(gd, name=""), [])
        fn = wrapped.prune([wrapped.graph.as_graph_element(n) for n in m["inputs"]],
                           [wrapped.graph.as_graph_element(n) for n in m["outputs"]])
        tx = tf.constant(x)
        lib = aotc.load(m["aotc"]["prefix"], threads=threads)
        fns = {"aotc": lambda lib=lib, x=x: lib.run([x])[0], "tf": lambda fn=fn, tx=tx: fn(tx)[0].numpy()}
        if "onnx" in m:
            lib_onnx = aotc.load(m["aotc_onnx"]["prefix"], threads=threads)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(m["onnx"], opts, providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x}
            fns["aotc_onnx"] = lambda lib=lib_onnx, x=x: lib.run([x])[0]
            fns["ort"] = lambda s=sess, f=feed: s.run(None, f)[0]
        want = fns["tf"]().astype(np.float64)
        scale = float(np.max(np.abs(want))) or 1.0
        errors = {k: float(np.max(np.abs(f() - want))) / scale for k, f in fns.items() if k != "tf"}
        load = os.getloadavg()[0]
        times = interleaved_medians(fns, iters, secs)
        load = max(load, os.getloadavg()[0])
        print(json.dumps({"name": m["name"], "threads": threads, "times": times, "errors": errors, "load": load}),
              flush=True)


def _compare():
    """benchmarks/compare.py, for its timing and machine description."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare", HERE / "compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# -- report -------------------------------------------------------------------------------------------
def _fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def _ratio(v: float | None, base: float) -> str:
    return f"{v / base:.2f}" if v else "-"


def table(models: list[dict], rows: list[dict]) -> str:
    by_name = {m["name"]: m for m in models}
    out = ["| model | threads | aotc (GraphDef) | TensorFlow | aotc (tf2onnx ONNX) | onnxruntime (tf2onnx) | "
           "**tf/aotc** | **onnx path/aotc** | ort/aotc | max err / max |out| vs TF | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, t = by_name[r["name"]], r["times"]
        onnx_t, ort_t = t.get("aotc_onnx"), t.get("ort")
        err = ", ".join(f"{k} {v:.1e}" for k, v in r["errors"].items())
        out.append(f"| {m['label']} | {r['threads']} | {_fmt_t(t['aotc'])} | {_fmt_t(t['tf'])} | {_fmt_t(onnx_t)} | "
                   f"{_fmt_t(ort_t)} | **{_ratio(t['tf'], t['aotc'])}** | **{_ratio(onnx_t, t['aotc'])}** | "
                   f"{_ratio(ort_t, t['aotc'])} | {err} | {r['load']:.1f} |")
    return "\n".join(out)


def shared_text(rows: list[dict]) -> str:
    """A sentence for a run on a machine busier than its cores (empty otherwise)."""
    loads, cores = [r["load"] for r in rows], os.cpu_count() or 1
    if max(loads, default=0) <= cores:
        return ""
    return (f"\nThis run shared the machine with other work: its load average was {min(loads):.1f} to "
            f"{max(loads):.1f} against {cores} cores, so the absolute times are inflated and a second thread "
            "found no idle core (the 2-thread rows say more about the load than about threading). The "
            "ratios, measured in the same process in alternating slices, are what count.\n")


def compile_table(models: list[dict]) -> str:
    out = ["| model | aotc from the GraphDef | aotc from tf2onnx's ONNX |", "|---|---|---|"]
    for m in models:
        a, o = m["aotc"], m.get("aotc_onnx")
        onnx_text = f"{o['kernels']} kernels, {o['compile_s']:.1f} s" if o else m.get("onnx_error", "-")
        out.append(f"| {m['label']} | {a['kernels']} kernels, {a['compile_s']:.1f} s | {onnx_text} |")
    return "\n".join(out)


def machine_text(versions: dict) -> str:
    import platform

    import numpy as np
    import onnxruntime as ort

    import aotc
    from aotc.target import resolve

    machine = _compare().machine

    return (f"Machine: {machine()} ({platform.machine()}; aotc's kernels for {resolve().isa.name}). "
            f"aotc {aotc.__version__}, TensorFlow {versions['tensorflow']}, tf2onnx {versions['tf2onnx']}, "
            f"onnxruntime {ort.__version__}, numpy {np.__version__}.")


DOC = """# Benchmarks: TensorFlow models

Generated by `{command}`; do not edit by hand. Every number below comes from one run of that script:
each Keras model's frozen GraphDef compiled by aotc, run beside TensorFlow itself (the same frozen graph
as a tf.function; `tf.config.threading` with N intra-op threads and 1 inter-op thread) and beside the
ONNX path (the graph converted by tf2onnx, compiled by aotc, and run by onnxruntime with all graph
optimizations and N threads). TensorFlow fixes its thread counts once per process, so each thread count
is timed in a process of its own; within it the runtimes take turns in alternating slices of a few
hundred milliseconds, and times are medians over many iterations after warm-up, through each runtime's
Python API with numpy arrays out. Ratios > 1 mean aotc (from the GraphDef) is faster. On a shared
machine (the `load` column says how busy it was) compare ratios within a run, not absolute times
across runs. See [benchmarks.md](benchmarks.md) for the ONNX models.

{head}

{table}
{shared}
Kernels and compile time (passes, code generation and the C compiler):

{compile}

Notes:

- `load` is the machine's 1-minute load average while that row was timed (the larger of its values
  before and after), against {cores} cores: above the thread count, other processes took turns on
  the cores, and the timings, two threads' most of all, say more about the load than the code.
- `onnx path/aotc` is the issue's yardstick: the same network from tf2onnx's ONNX export, compiled by
  aotc, against aotc's library from the GraphDef (1.00: the same speed; > 1: the GraphDef is faster).
- TensorFlow's time includes calling a concrete function from Python, which dominates the small
  models (a call that does nothing costs TensorFlow tens of microseconds); aotc and onnxruntime are
  called through their Python APIs too.
- The models are those of `tests/tf_fixtures.py` with random weights: the fixtures' MobileNetV2
  (alpha 0.35, 96x96) and BERT-like block (sequence 8, width 32) are small enough that per-call
  overheads weigh; the full-size MobileNetV2 is built by the same fixture code.
- The layout pass (`aotc/passes/layout.py`) is what makes a GraphDef's NHWC convolutions as fast as
  the ONNX export's: without it MobileNetV2 kept a transposing loop per layer.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument("--no-large", action="store_true", help="only the fixtures' small models")
    ap.add_argument("--write-docs", metavar="FILE", help="also write the results as Markdown to FILE")
    ap.add_argument("--prepare", metavar="DIR", help=argparse.SUPPRESS)  # the subprocesses' entry points
    ap.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:
        prepare(Path(args.prepare), not args.no_large)
        return
    if args.worker:
        worker(Path(args.worker), args.threads[0], args.quick)
        return
    me = [sys.executable, str(Path(__file__).resolve())]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        print("preparing models (TensorFlow, tf2onnx)", file=sys.stderr)
        subprocess.run([*me, "--prepare", tmp, *(["--no-large"] if args.no_large else [])], check=True)
        models = json.loads((out / "models.json").read_text())
        versions = json.loads((out / "versions.json").read_text())
        compile_all(models, out)
        (out / "models.json").write_text(json.dumps(models, indent=1))
        rows = []
        for threads in args.threads:
            print(f"timing at {threads} thread(s)", file=sys.stderr)
            proc = subprocess.run([*me, "--worker", tmp, "--threads", str(threads),
                                   *(["--quick"] if args.quick else [])], check=True, stdout=subprocess.PIPE, text=True)
            rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    head = machine_text(versions)
    text, comp = table(models, rows), compile_table(models)
    print(head, text, comp, sep="\n\n")
    if args.write_docs:
        command = " ".join(["python", "benchmarks/tensorflow.py", *sys.argv[1:]])
        Path(args.write_docs).write_text(DOC.format(command=command, head=head, table=text, compile=comp,
                                                    cores=os.cpu_count(), shared=shared_text(rows)))


if __name__ == "__main__":
    main()
