"""Real architectures (timm CNNs and ViT, transformers BERT/GPT-2/DistilBERT/T5 encoder) end to end.

Models are built from their libraries' own code with random weights (fixed seed, no downloads),
exported with ``torch.onnx.export`` (classic TorchScript exporter and the dynamo exporter), cached as
.onnx files, compiled with aotc and compared with onnxruntime. ``python tests/real_models.py
--report`` prints, per architecture and export: whether it compiles (or which ops are missing),
the max error, compile time (aotc passes vs C compiler), workspace vs intermediate bytes, and
median 1-thread latency beside onnxruntime. The pytest side lives in ``test_real_models.py``.

Install (no torchvision; see ../shared/ENVIRONMENT.md):
    pip install -e '.[test,models]' && pip install --no-deps timm==1.0.31
timm still imports torchvision at import time; ``torchvision_stub`` stands in for it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import shutil
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything
IR_VERSION = 9  # onnxruntime 1.31 cannot load newer IR versions
CACHE = Path(os.environ.get("AOTC_MODEL_CACHE", Path.home() / ".cache" / "aotc-test-models"))
SEQ = 32
VOCAB = 1000


@contextlib.contextmanager
def torchvision_stub() -> Iterator[None]:
    """Import timm inside this: timm imports torchvision at import time (transforms,
    FrozenBatchNorm2d) but building models never uses it, and the registry's only torchvision wheel
    is a CUDA build that breaks next to the CPU torch. While torchvision is absent, stand in a module
    whose every attribute is an inert class; afterwards remove it again, so nobody else (transformers'
    availability checks, torch.onnx) mistakes the stub for the real thing."""
    if importlib.util.find_spec("torchvision") is not None:
        yield
        return

    class _Meta(type):
        def __getattr__(cls, name: str) -> str:  # enum-like members: InterpolationMode.BILINEAR
            if name.startswith("__"):
                raise AttributeError(name)
            return f"{cls.__name__}.{name}"

    class _Stub(types.ModuleType):
        __path__: list[str] = []  # a package, so submodule imports resolve

        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Meta(name, (), {})

    class _Loader:
        def create_module(self, spec):
            return _Stub(spec.name)

        def exec_module(self, module) -> None:
            pass

    class _Finder:
        @staticmethod
        def find_spec(name: str, path=None, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.util.spec_from_loader(name, _Loader())
            return None

    finder = _Finder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]


# -- architectures -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arch:
    name: str
    build: Callable[[], tuple[object, dict[str, np.ndarray]]]  # -> (torch module, inputs)
    family: str  # "timm" | "transformers"


def _timm(model_name: str, image: int = 64, **kw) -> Callable:
    def build():
        import torch

        with torchvision_stub():
            import timm

        torch.manual_seed(0)
        m = timm.create_model(model_name, pretrained=False, num_classes=10, **kw).eval()
        x = np.random.default_rng(0).standard_normal((1, 3, image, image)).astype(np.float32)
        return m, {"x": x}
    return build


class _Logits:
    """Wraps a transformers model so that it takes positional tensors and returns one tensor."""

    def __new__(cls, model, attr: str, with_mask: bool):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask=None):
                kw = {"attention_mask": attention_mask} if with_mask else {}
                return getattr(self.m(input_ids=input_ids, **kw), attr)

        return Wrapper().eval()


def _hf(kind: str) -> Callable:
    def build():
        import torch
        import transformers as tf

        torch.manual_seed(0)
        common = {"attn_implementation": "eager"}
        if kind == "bert":
            cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=512, max_position_embeddings=128, **common)
            m, attr, mask = tf.BertModel(cfg), "last_hidden_state", True
        elif kind == "distilbert":
            cfg = tf.DistilBertConfig(vocab_size=VOCAB, dim=128, n_layers=2, n_heads=2, hidden_dim=512,
                                      max_position_embeddings=128, **common)
            m, attr, mask = tf.DistilBertModel(cfg), "last_hidden_state", True
        elif kind == "t5":
            cfg = tf.T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4,
                              relative_attention_num_buckets=32, feed_forward_proj="gated-gelu", **common)
            m, attr, mask = tf.T5EncoderModel(cfg), "last_hidden_state", True
        else:
            cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=2, n_positions=128,
                                use_cache=False, **common)
            # With an explicit mask transformers skips its packed-sequence check, whose aten::diff
            # the classic exporter cannot export.
            m, attr, mask = tf.GPT2LMHeadModel(cfg), "logits", True
        ids = np.random.default_rng(0).integers(0, VOCAB, (1, SEQ)).astype(np.int64)
        inputs = {"input_ids": ids} | ({"attention_mask": np.ones((1, SEQ), np.int64)} if mask else {})
        return _Logits(m.eval(), attr, mask), inputs
    return build


ARCHS = {a.name: a for a in [
    Arch("resnet18", _timm("resnet18"), "timm"),
    Arch("resnet18_gn", _timm("resnet18", norm_layer="groupnorm"), "timm"),  # GroupNorm for BatchNorm
    Arch("mobilenetv2_050", _timm("mobilenetv2_050"), "timm"),
    Arch("mobilenetv3_small", _timm("mobilenetv3_small_050"), "timm"),
    Arch("regnety_002", _timm("regnety_002"), "timm"),
    Arch("efficientnet_b0", _timm("efficientnet_b0"), "timm"),
    Arch("convnext_atto", _timm("convnext_atto"), "timm"),
    Arch("vit_tiny", _timm("vit_tiny_patch16_224", img_size=64, depth=4), "timm"),
    Arch("bert", _hf("bert"), "transformers"),
    Arch("gpt2", _hf("gpt2"), "transformers"),
    Arch("distilbert", _hf("distilbert"), "transformers"),
    Arch("t5_encoder", _hf("t5"), "transformers"),
]}
# (opset, dynamo): the classic exporter at 17 and the dynamo exporter at its native 18.
EXPORTS = [(17, False), (18, True)]


def export_id(opset: int, dynamo: bool) -> str:
    return f"op{opset}-{'dynamo' if dynamo else 'classic'}"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("torch", "timm", "transformers", "onnxscript"):
        try:
            out.append(f"{pkg}={version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg}=-")
    return ",".join(out)


def exported(arch: str, opset: int, dynamo: bool) -> tuple[Path, dict[str, np.ndarray]]:
    """The cached ONNX export (IR version 9) and its inputs; exported on first use."""
    key = hashlib.sha1(f"{arch}|{opset}|{dynamo}|{_versions()}|v1".encode()).hexdigest()[:10]
    path = CACHE / f"{arch}_{export_id(opset, dynamo)}_{key}.onnx"
    feeds_path = path.with_suffix(".npz")
    if path.exists() and feeds_path.exists():
        return path, dict(np.load(feeds_path))
    import torch

    module, feeds = ARCHS[arch].build()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    # The exporters print progress and tracer warnings: keep the report and test logs readable.
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(tmp), opset_version=opset, dynamo=dynamo,
                          input_names=list(feeds), output_names=["y"],
                          **({"external_data": False} if dynamo else {}))
    model = onnx.load(str(tmp))
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.save(model, str(path))
    tmp.unlink()
    for extra in CACHE.glob(tmp.name + "*"):
        extra.unlink()
    np.savez(feeds_path, **feeds)
    return path, feeds


# -- one comparison ------------------------------------------------------------------------------

@dataclass
class Result:
    arch: str
    export: str
    opset: int = 0
    ok: bool = False
    unsupported: list[str] = field(default_factory=list)
    error: str = ""
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    seconds: dict[str, float] = field(default_factory=dict)
    workspace_bytes: int = 0
    intermediate_bytes: int = 0
    kernels: int = 0
    aotc_ms: float = float("nan")
    ort_ms: float = float("nan")


def ort_session(model_path: Path, threads: int = 1):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])


def median_ms(fn: Callable[[], object], budget_s: float = 0.5, max_runs: int = 50) -> float:
    fn()  # warm up
    times = []
    end = time.perf_counter() + budget_s
    while len(times) < max_runs and (len(times) < 3 or time.perf_counter() < end):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _atol(want: np.ndarray) -> float:
    """1e-3, scaled down for outputs that are small overall (a randomly initialized EfficientNet's
    logits are ~1e-4, where a fixed 1e-3 would accept anything)."""
    return 1e-3 * min(1.0, float(np.abs(want).max(initial=0.0)))


def errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max abs error, and max rel error over elements above the absolute tolerance (the relative
    error of values near zero says nothing)."""
    d = np.abs(got.astype(np.float64) - want.astype(np.float64))
    big = np.abs(want) > _atol(want)
    return float(d.max(initial=0.0)), float((d[big] / np.abs(want[big])).max(initial=0.0))


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-3, atol=_atol(want)))


def evaluate(arch: str, opset: int, dynamo: bool, out_dir: Path, timing: bool = False,
             raise_errors: bool = False) -> Result:
    """Export (cached), compile, run and compare; errors are recorded in the Result, or raised."""
    import aotc
    from aotc.compiler import compile_model
    from aotc.errors import UnsupportedOpsError

    res = Result(arch, export_id(opset, dynamo))
    try:
        path, feeds = exported(arch, opset, dynamo)
    except Exception as e:  # an export failure is the exporter's, not aotc's: report it
        if raise_errors:
            raise
        res.error = f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return res
    model = onnx.load(str(path))
    res.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    name = f"{arch}_{res.export}".replace("-", "_")
    try:
        compiled = compile_model(model, out_dir, name)
    except UnsupportedOpsError as e:
        if raise_errors:
            raise
        res.unsupported = sorted(e.missing)
        res.error = str(e)
        return res
    except Exception as e:
        if raise_errors:
            raise
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        return res
    res.seconds = dict(compiled.seconds)
    res.kernels = compiled.num_kernels
    meta = json.loads((out_dir / f"{name}.json").read_text())
    res.workspace_bytes = int(meta.get("workspace_bytes", 0))
    res.intermediate_bytes = int(meta.get("intermediate_bytes", 0))
    m = aotc.load(compiled.prefix)
    got = m.run(feeds)
    sess = ort_session(path)
    want = sess.run(None, feeds)
    res.max_abs, res.max_rel = 0.0, 0.0
    for g, w in zip(got, want, strict=True):
        a, r = errors(g, w)
        res.max_abs, res.max_rel = max(res.max_abs, a), max(res.max_rel, r)
    res.ok = all(close(g, w) for g, w in zip(got, want, strict=True))
    if timing:
        res.aotc_ms = median_ms(lambda: m.run(feeds))
        res.ort_ms = median_ms(lambda: sess.run(None, feeds))
    return res


# -- report --------------------------------------------------------------------------------------

def _mb(n: int) -> str:
    return f"{n / 2**20:.2f}"


def report(archs: list[str], out_root: Path, timing: bool = True) -> list[Result]:
    rows = []
    print("| arch | export | opset | status | max abs | max rel | aotc s | C compile s | kernels "
          "| workspace MiB | intermediates MiB | aotc ms | ort ms | ort/aotc |")
    print("|---" * 14 + "|")
    for arch in archs:
        for opset, dynamo in EXPORTS:
            out_dir = out_root / f"{arch}_{export_id(opset, dynamo)}"
            shutil.rmtree(out_dir, ignore_errors=True)  # a fresh build, so the C compile time is real
            r = evaluate(arch, opset, dynamo, out_dir, timing=timing)
            rows.append(r)
            if r.unsupported:
                status = "missing: " + ", ".join(r.unsupported)
            elif r.error:
                status = "error: " + r.error.replace("|", "/")[:160]
            else:
                status = "ok" if r.ok else "MISMATCH"
            s = r.seconds
            passes = s.get("import", 0) + s.get("passes", 0) + s.get("codegen", 0)  # all but the C compiler
            done = bool(s)
            print(f"| {arch} | {r.export} | {r.opset} | {status} "
                  f"| {r.max_abs:.2e} | {r.max_rel:.2e} "
                  f"| {passes:.2f} | {s.get('c_compile', 0):.2f} | {r.kernels if done else '-'} "
                  f"| {_mb(r.workspace_bytes) if done else '-'} | {_mb(r.intermediate_bytes) if done else '-'} "
                  f"| {r.aotc_ms:.3f} | {r.ort_ms:.3f} | {r.ort_ms / r.aotc_ms:.2f} |", flush=True)
    return rows


def with_patterns() -> list:
    """The default pass list with aotc.passes.patterns right after shape inference (unchanged if
    the pipeline has it already)."""
    from aotc.passes import pipeline
    from aotc.passes.patterns import rewrite_patterns

    passes = list(pipeline.DEFAULT_PASSES)
    if all(p.name != "patterns" for p in passes):
        at = next(i for i, p in enumerate(passes) if p.name == "propagate") + 1
        passes.insert(at, pipeline.Pass("patterns", rewrite_patterns))
    return passes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="store_true", help="print the per-architecture table")
    p.add_argument("--arch", action="append", choices=sorted(ARCHS), help="only these (repeatable)")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--patterns", action="store_true", help="run the LayerNorm/GELU pattern pass")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "aotc-real-models")
    a = p.parse_args(argv)
    if not a.report:
        p.print_help()
        return 0
    if a.patterns:
        from aotc.passes import pipeline

        pipeline.DEFAULT_PASSES = with_patterns()
    report(a.arch or list(ARCHS), a.out, timing=not a.no_timing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
