"""The real architectures of the benchmark, at the sizes the performance issue names: ResNet-18 and
MobileNetV2 at 224x224, BERT with 4 layers, hidden 256 and sequence 128, all batch 1, random
weights. They reuse the test suite's export and cache machinery (tests/real_models.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def _bert_4l_256():
    import numpy as np
    import torch
    import transformers as tf
    from real_models import VOCAB, _Logits

    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=128, attn_implementation="eager")
    ids = np.random.default_rng(0).integers(0, VOCAB, (1, 128)).astype(np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones((1, 128), np.int64)}
    return _Logits(tf.BertModel(cfg).eval(), "last_hidden_state", True), inputs


def real_cases() -> list[tuple[str, object, dict, Callable]]:
    """(label, ONNX model, feeds, PyTorch eager call) per architecture that builds here."""
    try:
        import onnx
        import real_models as rm
        import torch
    except ImportError as e:
        print(f"skipping the real architectures: {e}", file=sys.stderr)
        return []
    archs = [("ResNet-18 224 b1", rm.Arch("bench_resnet18", rm._timm("resnet18", image=224), "timm")),
             ("MobileNetV2 224 b1", rm.Arch("bench_mobilenetv2", rm._timm("mobilenetv2_100", image=224), "timm")),
             ("BERT 4L-256 seq128 b1", rm.Arch("bench_bert", _bert_4l_256, "transformers"))]
    cases = []
    for label, arch in archs:
        rm.ARCHS[arch.name] = arch
        try:
            path, feeds = rm.exported(arch.name, 17, False)
        except Exception as e:  # noqa: BLE001 - a missing package or an export failure skips one model
            print(f"skipping {label}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        module, _ = arch.build()
        args = tuple(torch.from_numpy(v) for v in feeds.values())

        def eager(module=module, args=args):
            with torch.no_grad():
                return module(*args)
        cases.append((label, onnx.load(str(path)), feeds, eager))
    return cases
