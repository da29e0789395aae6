"""Quantized models for the int8 tests and benchmark, made by onnxruntime's own quantizer.

``quantized(model, ...)`` runs ``onnxruntime.quantization.quantize_static`` on a float model with a
small random calibration set (fixed seed): QDQ format (QuantizeLinear/DequantizeLinear around float
Conv/Gemm, as onnxruntime writes it by default) or QOperator (QLinearConv, QLinearMatMul, ...),
per-channel or per-tensor weights, uint8 or int8 activations. ``resnet18_int8`` is timm's ResNet-18
(random weights, batch 1) quantized so (QDQ; its QOperator form needs onnxruntime's contrib ops
QLinearAdd, QLinearGlobalAveragePool and QGemm), cached next to the real-model exports
(tests/real_models.py).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
import onnx


def quantized(model: onnx.ModelProto, feeds: dict[str, np.ndarray], qdq: bool = True, per_channel: bool = True,
              int8_activations: bool = False, calibration: int = 4, seed: int = 0) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime, calibrated on ``calibration`` random inputs shaped like ``feeds``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(seed)
    batches = [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()}
               for _ in range(calibration)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(model, str(src))
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator,
                        per_channel=per_channel,
                        activation_type=QuantType.QInt8 if int8_activations else QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
        return onnx.load(str(dst))


def _resnet18_random_bn(image: int):
    """timm's ResNet-18 with random BatchNorm statistics and affine parameters: timm's init (unit
    scale, zero shift, zero-scaled last BN per block) would fold to equal biases, which the exporter
    shares, and to residual branches that add nothing."""
    build = __import__("real_models")._timm("resnet18", image=image)

    def built():
        import torch

        module, feeds = build()
        g = torch.Generator().manual_seed(1)
        for bn in module.modules():
            if isinstance(bn, torch.nn.BatchNorm2d):
                n = bn.num_features
                bn.weight.data = 0.5 + torch.rand(n, generator=g)
                bn.bias.data = 0.2 * torch.randn(n, generator=g)
                bn.running_mean.data = 0.2 * torch.randn(n, generator=g)
                bn.running_var.data = 0.5 + torch.rand(n, generator=g)
        return module, feeds
    return built


def resnet18_int8(image: int = 224) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(quantized model, float model, inputs): timm's ResNet-18 at ``image`` x ``image``, batch 1,
    quantized per channel with uint8 activations; exported and quantized on first use, then cached."""
    import real_models as rm

    name = f"int8_resnet18_{image}"
    if name not in rm.ARCHS:
        rm.ARCHS[name] = rm.Arch(name, _resnet18_random_bn(image), "timm")
    fpath, feeds = rm.exported(name, 17, False)
    import onnxruntime

    key = hashlib.sha1(f"{fpath.name}|{onnxruntime.__version__}|True|v1".encode()).hexdigest()[:10]
    qpath = fpath.with_name(f"{name}_qdq_{key}.onnx")
    if not qpath.exists():
        q = quantized(onnx.load(str(fpath)), feeds)
        tmp = qpath.with_suffix(".tmp")
        onnx.save(q, str(tmp))
        tmp.rename(qpath)
    return qpath, fpath, feeds
