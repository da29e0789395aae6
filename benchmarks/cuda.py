"""The GPU runs of the CUDA target (issue 23), for a session that has an NVIDIA GPU: what CI cannot do.

    python benchmarks/cuda.py --check [--arch sm_90]   # correctness: tier-1 ONNX node cases, models vs
                                                       # onnxruntime (CPU), the generated tests under
                                                       # compute-sanitizer
    python benchmarks/cuda.py --bench [--arch sm_90]   # the seed graph against copy bandwidth; ResNet-18,
                                                       # BERT 4L/256/128, GPT-2 small vs PyTorch eager
                                                       # and torch.compile at batch 1 and 32

Without a usable GPU it says so and exits 0 (it is not a test). Results print as markdown tables for
docs/benchmarks.md; name the GPU (printed first) beside them. Tolerances: rtol = atol = 1e-3 against
onnxruntime for exact FP32 builds, 1e-2 for --cuda-tf32 builds, as the issue asks.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# The ops of float32 CNNs, MLPs and Transformers: the node cases the GPU must pass (tier 1).
TIER1_OPS = {
    "Abs", "Add", "ArgMax", "ArgMin", "Attention", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Clip",
    "Concat", "Conv", "Div", "Dropout", "Elu", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather", "Gelu",
    "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater", "HardSigmoid", "HardSwish", "Identity",
    "LayerNormalization", "LeakyRelu", "Less", "Log", "LogSoftmax", "MatMul", "Max", "MaxPool", "Mean", "Min", "Mul",
    "Neg", "Not", "Pad", "Pow", "PRelu", "Reciprocal", "ReduceL2", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Selu", "Sigmoid", "Sign", "Slice", "Softmax",
    "Softplus", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile", "Transpose", "Unsqueeze", "Where",
}


# -- the GPU -------------------------------------------------------------------------------------------------

def gpu_name() -> str | None:
    """The GPU's name, or None when there is no usable CUDA GPU (or runtime)."""
    from aotc.cuda_bindings import CudaRuntime
    from aotc.errors import AotcError

    try:
        if CudaRuntime.get().device_count() < 1:
            return None
    except AotcError:
        return None
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    return "an NVIDIA GPU (nvidia-smi not found)"


class Events:
    """CUDA event timing through the runtime the bindings load."""

    def __init__(self) -> None:
        from aotc.cuda_bindings import CudaRuntime

        self.rt = CudaRuntime.get()
        self.start, self.stop = ctypes.c_void_p(), ctypes.c_void_p()
        for e in (self.start, self.stop):
            self.rt.check(self.rt.lib.cudaEventCreate(ctypes.byref(e)), "cudaEventCreate")

    def time_ms(self, fn: Callable[[], object], iters: int, stream: int = 0) -> float:
        """Mean milliseconds of ``fn`` over ``iters`` back-to-back calls on ``stream`` (after 3 warm-ups)."""
        for _ in range(3):
            fn()
        lib = self.rt.lib
        lib.cudaEventRecord(self.start, ctypes.c_void_p(stream))
        for _ in range(iters):
            fn()
        lib.cudaEventRecord(self.stop, ctypes.c_void_p(stream))
        self.rt.check(lib.cudaEventSynchronize(self.stop), "cudaEventSynchronize")
        ms = ctypes.c_float()
        self.rt.check(lib.cudaEventElapsedTime(ctypes.byref(ms), self.start, self.stop), "cudaEventElapsedTime")
        return ms.value / iters


# -- correctness ---------------------------------------------------------------------------------------------

def check_node_cases(work: Path, arch: str) -> dict[str, tuple[int, int]]:
    """The tier-1 float32 node cases through --target cuda; pass counts per op, failures printed."""
    import backend_suite as bs

    import aotc

    class CudaRunner(bs.Runner):
        def _compile_run(self, cases):  # noqa: ANN001, ANN202 - the suite's runner, compiled for the GPU
            model, feeds, out_names = bs.merge(cases)
            shapes = {k: None if v is None else tuple(v.shape) for k, v in feeds.items()}
            self.count += 1
            m = aotc.compile(model, out_dir=str(self.work_dir / f"m{self.count}"), name="b", input_shapes=shapes,
                             target="cuda", cuda_arch=arch)
            got = dict(zip([t.name for t in m.outputs], m.run({k: v for k, v in feeds.items() if v is not None}),
                           strict=True))
            return [[got[n] for n in names] for names in out_names]

    cases = [c for c in bs.load_node_cases() if c.op in TIER1_OPS and all(
        getattr(x, "dtype", None) in (None, np.float32, np.int64, np.bool_) for x in c.inputs)]
    for c in cases:  # the tolerance for the GPU against the stored expectations
        c.rtol, c.atol = max(c.rtol, 1e-3), max(c.atol, 1e-3)
    runner = CudaRunner(work, log=lambda m: print(f"  {m}", file=sys.stderr))
    runner.run_all(cases)
    for c in cases:
        status, detail = runner.results[c.id]
        if status != "pass":
            print(f"  {status}: {c.id}: {detail[:200]}")
    return bs.summarize(cases, runner.results)


def _models() -> list[tuple[str, object]]:
    from cuda_models import cnn, data_movement, transformer
    from models import mlp, reduce_sum_xyz

    return [("seed 1M", reduce_sum_xyz(1 << 20)), ("seed 16M", reduce_sum_xyz(1 << 24)), ("mlp b4", mlp(4)),
            ("cnn b2", cnn()), ("transformer block", transformer()), ("data movement + Attention", data_movement())]


def check_models(work: Path, arch: str) -> list[str]:
    """Each model against onnxruntime's CPU result (exact FP32 and TF32 builds), its generated test program
    (stored reference, a CUDA Graph replay that must give the same bits) under compute-sanitizer."""
    import onnxruntime as ort

    import aotc
    from aotc.compiler import compile_model

    sanitizer = shutil.which("compute-sanitizer") or next(
        (str(p) for p in [Path("/usr/local/cuda/bin/compute-sanitizer")] if p.is_file()), None)
    rows = ["| model | build | max abs error vs onnxruntime | within tolerance | NAME_test | compute-sanitizer |",
            "|---|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for number, (label, model) in enumerate(_models()):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            feeds[i.name] = (rng.integers(0, 50, shape) if "int64" in i.type else
                             rng.standard_normal(shape).astype(np.float32))
        want = sess.run(None, feeds)
        for tf32 in (False, True):
            name = f"m{number}{'_tf32' if tf32 else ''}"
            tol = 1e-2 if tf32 else 1e-3
            res = compile_model(model, work, name, target="cuda", cuda_arch=arch, cuda_tf32=tf32, gen_test=True,
                                test_tolerance=(tol, tol))
            got = aotc.load(res.prefix).run(feeds)
            err = max(float(np.max(np.abs(g.astype(np.float64) - w))) if g.size else 0.0
                      for g, w in zip(got, want, strict=True))
            ok = all(np.allclose(g, w, rtol=tol, atol=tol) for g, w in zip(got, want, strict=True))
            test = subprocess.run([str(work / f"{name}_test")], capture_output=True, text=True, timeout=600)
            san = "not found"
            if sanitizer:
                reports = []
                for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
                    r = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "9", str(work / f"{name}_test")],
                                       capture_output=True, text=True, timeout=1200)
                    reports.append(f"{tool} {'clean' if r.returncode == 0 else f'exit {r.returncode}'}")
                san = ", ".join(reports)
            rows.append(f"| {label} | {'TF32' if tf32 else 'FP32'} | {err:.2e} | {'yes' if ok else 'NO'} | "
                        f"{'PASSED' if test.returncode == 0 else 'FAILED'} | {san} |")
            print(rows[-1], file=sys.stderr)
    return rows


def check_real_models(work: Path, arch: str) -> list[str]:
    """The real-model tests' architectures (tests/real_models.py, classic export at opset 17) on the GPU
    against onnxruntime's CPU result at 1e-3."""
    import real_models as rm

    import aotc
    from aotc.errors import AotcError

    rows = ["| architecture | max abs error | within 1e-3 |", "|---|---|---|"]
    for arch_name in rm.ARCHS:
        try:
            path, feeds = rm.exported(arch_name, 17, False)
            want = rm.ort_session(path).run(None, feeds)
            m = aotc.compile(str(path), out_dir=str(work), name=arch_name, target="cuda", cuda_arch=arch)
            got = m.run(feeds)
        except AotcError as e:  # an op without a GPU kernel: reported, not a crash
            rows.append(f"| {arch_name} | not compiled: {str(e)[:150]} | |")
            continue
        err = max(float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(got, want, strict=True))
        ok = all(rm.close(g, w) for g, w in zip(got, want, strict=True))
        rows.append(f"| {arch_name} | {err:.2e} | {'yes' if ok else 'NO'} |")
        print(rows[-1], file=sys.stderr)
    return rows


# -- benchmarks ----------------------------------------------------------------------------------------------

def bench_seed(work: Path, arch: str) -> list[str]:
    """reduce_sum(x + y*z): bytes read per second against a device-to-device copy's (read + write) rate."""
    from models import reduce_sum_xyz

    import aotc
    from aotc.compiler import compile_model
    from aotc.cuda_bindings import _D2H, CudaRuntime, DeviceBuffer

    rt = CudaRuntime.get()
    ev = Events()
    rows = ["| floats | aotc (ms) | read GB/s | copy GB/s (read + write) | fraction |", "|---|---|---|---|---|"]
    for n in (1 << 24, 1 << 28):
        res = compile_model(reduce_sum_xyz(n), work, f"seed{n}", target="cuda", cuda_arch=arch)
        m = aotc.load(res.prefix)
        bufs = [DeviceBuffer(rt, n * 4) for _ in range(3)]
        out = DeviceBuffer(rt, 4)
        ones = np.ones(n, np.float32)
        for b in bufs:
            rt.copy(b.ptr, ones.ctypes.data, n * 4, 1, 0)

        class Dev:  # a device array for the bindings, by __cuda_array_interface__
            def __init__(self, ptr: int, shape: tuple[int, ...]) -> None:
                self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False),
                                                 "version": 3, "strides": None}

        ins = [Dev(b.ptr, (n,)) for b in bufs]
        outs = [Dev(out.ptr, ())]
        iters = 50 if n < 1 << 26 else 10
        t = ev.time_ms(lambda ins=ins, outs=outs, m=m: m.run(ins, out=outs), iters)
        got = np.zeros(1, np.float32)
        rt.copy(got.ctypes.data, out.ptr, 4, _D2H, 0)
        rt.sync(0)
        assert abs(got[0] - 2 * n) <= 1e-3 * 2 * n, got  # 1 + 1 * 1 per element
        dst = DeviceBuffer(rt, n * 4)
        copy = ev.time_ms(lambda dst=dst, src=bufs[0], n=n: rt.copy(dst.ptr, src.ptr, n * 4, 3, 0), iters)
        read_gbs = 3 * n * 4 / t / 1e6
        copy_gbs = 2 * n * 4 / copy / 1e6
        rows.append(f"| {n >> 20}M | {t:.3f} | {read_gbs:.0f} | {copy_gbs:.0f} | {read_gbs / copy_gbs:.2f} |")
        print(rows[-1], file=sys.stderr)
    return rows


def _exported(kind: str, batch: int, work: Path) -> tuple[object, Path, dict[str, np.ndarray]]:
    """(torch module, ONNX file, inputs) of ResNet-18 (224x224), BERT 4L/256 or GPT-2 small (sequence 128)."""
    import torch

    torch.manual_seed(0)
    if kind == "resnet18":
        from real_models import torchvision_stub

        with torchvision_stub():
            import timm
        module = timm.create_model("resnet18", pretrained=False).eval()
        feeds = {"x": np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    else:
        import transformers as tf
        from real_models import _Logits

        if kind == "bert":
            cfg = tf.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                intermediate_size=1024, max_position_embeddings=128, attn_implementation="eager")
            module, vocab = _Logits(tf.BertModel(cfg).eval(), "last_hidden_state", True), 30522
        else:
            cfg = tf.GPT2Config(use_cache=False, attn_implementation="eager")  # GPT-2 small: 12 x 768
            module, vocab = _Logits(tf.GPT2LMHeadModel(cfg).eval(), "logits", True), cfg.vocab_size
        ids = np.random.default_rng(0).integers(0, vocab, (batch, 128)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, 128), np.int64)}
    path = work / f"{kind}_b{batch}.onnx"
    if not path.exists():
        with torch.no_grad():
            torch.onnx.export(module, tuple(torch.from_numpy(v) for v in feeds.values()), str(path), opset_version=17,
                              dynamo=False, input_names=list(feeds), output_names=["y"])
    return module, path, feeds


def bench_models(work: Path, arch: str, batches: tuple[int, ...]) -> list[str]:
    import torch

    import aotc

    if not torch.cuda.is_available():
        return ["PyTorch has no CUDA here: the model benchmarks need a CUDA build of torch."]
    rows = ["| model | batch | aotc (ms) | eager (ms) | torch.compile (ms) | aotc / eager | aotc / compile | "
            "max abs diff vs eager |", "|---|---|---|---|---|---|---|---|"]
    ev = Events()
    for kind in ("resnet18", "bert", "gpt2"):
        for batch in batches:
            module, path, feeds = _exported(kind, batch, work)
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
                m = aotc.compile(str(path), out_dir=str(work), name=f"{kind}_b{batch}{'_tf32' if tf32 else ''}",
                                 target="cuda", cuda_arch=arch, cuda_tf32=tf32)
                dev = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
                outs = [torch.empty(t.shape, dtype=getattr(torch, str(t.dtype)), device="cuda") for t in m.outputs]
                stream = torch.cuda.current_stream()
                mod = module.cuda()
                args = tuple(dev.values())

                def eager(mod=mod, args=args):
                    with torch.no_grad():
                        return mod(*args)
                compiled = torch.compile(mod)

                def comp(compiled=compiled, args=args):
                    with torch.no_grad():
                        return compiled(*args)
                iters = 20 if kind == "gpt2" and batch > 1 else 50
                h = stream.cuda_stream
                t_aotc = ev.time_ms(lambda m=m, dev=dev, outs=outs, s=stream: m.run(dev, out=outs, stream=s), iters, h)
                t_eager = ev.time_ms(eager, iters, h)
                t_comp = ev.time_ms(comp, iters, h)
                ref = eager()
                diff = float((outs[0] - (ref if torch.is_tensor(ref) else ref[0])).abs().max())
                label = f"{kind}{' TF32' if tf32 else ''}"
                rows.append(f"| {label} | {batch} | {t_aotc:.3f} | {t_eager:.3f} | {t_comp:.3f} | "
                            f"{t_aotc / t_eager:.2f} | {t_aotc / t_comp:.2f} | {diff:.1e} |")
                print(rows[-1], file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="correctness runs")
    p.add_argument("--bench", action="store_true", help="performance runs")
    p.add_argument("--arch", default="sm_90", help="--cuda-arch for the builds (default sm_90: H100/H200)")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--no-node-cases", action="store_true", help="--check without the ONNX node cases")
    p.add_argument("--work", help="build directory (default: a temporary one)")
    args = p.parse_args(argv)
    gpu = gpu_name()
    if gpu is None:
        print("benchmarks/cuda.py: no usable CUDA GPU here: nothing run (see docs/cuda.md)")
        return 0
    print(f"GPU: {gpu}; --cuda-arch {args.arch}; {time.strftime('%Y-%m-%d')}")
    work = Path(args.work or tempfile.mkdtemp(prefix="aotc-cuda-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.check:
        if not args.no_node_cases:
            counts = check_node_cases(work / "node", args.arch)
            passed, total = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
            print(f"\nTier-1 node cases on the GPU: {passed}/{total} pass")
            for op, (ok, n) in sorted(counts.items()):
                if ok != n:
                    print(f"  {op}: {ok}/{n}")
        print("\n" + "\n".join(check_models(work / "models", args.arch)))
        print("\nReal models:\n" + "\n".join(check_real_models(work / "real", args.arch)))
    if args.bench:
        print("\nThe seed graph reduce_sum(x + y*z):\n" + "\n".join(bench_seed(work / "seed", args.arch)))
        batches = tuple(int(b) for b in args.batches.split(","))
        print("\nModels:\n" + "\n".join(bench_models(work / "bench", args.arch, batches)))
    if not (args.check or args.bench):
        p.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
