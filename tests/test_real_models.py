"""Real architectures (timm, transformers) exported to ONNX, compiled by aotc, compared with onnxruntime.

Slow (export on first use, then cached; a few seconds of C compile each). Skipped when torch, timm,
transformers or onnxscript are absent: ``pip install -e '.[test,models]' && pip install --no-deps
timm==1.0.31`` (timm's declared torchvision must stay out). Exports that aotc cannot compile yet are
strict xfails naming the missing ops or the bug, so a fix shows up as an XPASS to remove here.
"""

from __future__ import annotations

import numpy as np
import pytest
from real_models import ARCHS, EXPORTS, evaluate, export_id, torchvision_stub

from aotc.errors import AotcError

for _mod in ("torch", "transformers", "onnxscript", "onnxruntime"):
    pytest.importorskip(_mod)
with torchvision_stub():  # timm imports torchvision, which must not be installed
    pytest.importorskip("timm")
pytestmark = pytest.mark.slow

# (arch, export) -> why aotc cannot compile it yet (missing ops, or a bug). Strict: a fix shows up
# as an XPASS. Empty: every architecture and export compiles and matches.
KNOWN: dict[tuple[str, str], str] = {}


def _params():
    for arch in ARCHS:
        for opset, dynamo in EXPORTS:
            eid = export_id(opset, dynamo)
            marks = []
            if (arch, eid) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, raises=AotcError, reason=KNOWN[arch, eid]))
            yield pytest.param(arch, opset, dynamo, marks=marks, id=f"{arch}-{eid}")


@pytest.mark.parametrize("arch,opset,dynamo", list(_params()))
def test_real_model(arch: str, opset: int, dynamo: bool, tmp_path) -> None:
    r = evaluate(arch, opset, dynamo, tmp_path, raise_errors=True)
    assert r.ok, f"{arch} {r.export}: max abs error {r.max_abs:.3g}, max rel {r.max_rel:.3g} (tol 1e-3)"
    assert np.isfinite(r.max_abs)
    assert 0 < r.workspace_bytes <= r.intermediate_bytes + (1 << 20), "memory plan larger than no plan"


@pytest.mark.parametrize("eps", [1e-5, 1e-12])
@pytest.mark.parametrize("dynamo", [False, True], ids=["classic", "dynamo"])
def test_handwritten_layernorm_export(dynamo: bool, eps: float, tmp_path, monkeypatch) -> None:
    """The LayerNorm older BERT ports write by hand exports as ReduceMean/Sub/Pow/...; the pattern
    pass turns it (and the erf GELU) back into single ops."""
    import warnings

    import onnx
    import torch
    from real_models import IR_VERSION, close, ort_session, with_patterns

    import aotc
    from aotc.compiler import compile_model
    from aotc.passes import pipeline

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)
            self.weight = torch.nn.Parameter(torch.randn(64))
            self.bias = torch.nn.Parameter(torch.randn(64))

        def forward(self, x):
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            x = self.weight * ((x - u) / torch.sqrt(s + eps)) + self.bias
            return torch.nn.functional.gelu(self.fc(x))

    torch.manual_seed(0)
    path = tmp_path / "block.onnx"
    x = torch.randn(2, 8, 64) * 2 + 3
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Block().eval(), (x,), str(path), opset_version=17 if not dynamo else 18,
                          dynamo=dynamo, input_names=["x"], output_names=["y"],
                          **({"external_data": False} if dynamo else {}))
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.save(model, str(path))
    monkeypatch.setattr(pipeline, "DEFAULT_PASSES", with_patterns())
    res = compile_model(model, tmp_path / "out", "block")
    ops = [n.op for n in res.graph.nodes]
    assert "LayerNormalization" in ops and "Gelu" in ops and "ReduceMean" not in ops, ops
    feeds = {"x": x.numpy()}
    got = aotc.load(res.prefix).run(feeds)[0]
    assert close(got, ort_session(path).run(None, feeds)[0])
