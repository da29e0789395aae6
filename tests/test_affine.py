"""The affine index expressions of aotc.ops.affine fold constants, and the generated C shows it."""

from __future__ import annotations

import re

from test_cross_targets import small_cnn, transformer_block

from aotc.codegen.library import generate
from aotc.frontends.onnx import import_onnx
from aotc.ops.affine import Ix, for_each, offset, task_share
from aotc.passes.pipeline import run_passes
from aotc.target import resolve


def test_folding() -> None:
    t = Ix.of("t")
    assert str(t // 1) == "t" and str(t % 1) == "0" and str(t * 0) == "0" and str(t * 1) == "t"
    assert str(t // 1 % 1) == "0" and str(Ix.of(6) // 4 + 2) == "3" and str(Ix.of(7) % 4) == "3"
    assert str(t // 4 % 3) == "t / 4 % 3"
    assert str(3 * (t // 4)) == "3 * (t / 4)"  # not 3 * t / 4
    assert str((t * 4 + 8) // 4) == "t + 2" and str((t + 1) // 2) == "(t + 1) / 2"
    assert str(t * 2 + Ix.of("u") + t * -2) == "u"


def test_helpers() -> None:
    assert task_share(1) == ("task / ntasks", "(task + 1) / ntasks")
    assert task_share(16) == ("(size_t)16 * task / ntasks", "(size_t)16 * (task + 1) / ntasks")
    assert for_each("l", 0, 1) == "{ const size_t l = 0;"
    assert for_each("l", "lo", Ix.of("lo") + 1) == "{ const size_t l = lo;"
    assert for_each("l", 0, 4) == "for (size_t l = 0; l < 4; l++) {"
    assert offset("A", Ix.of("b") * 0) == "A" and offset("A", Ix.of("b") * 8) == "A + 8 * b"


def _kernels(model, name: str) -> str:
    tgt = resolve(None, None, None, None, None)
    g = import_onnx(model, {}, name, None)
    run_passes(g, target=tgt)
    lib = generate(g, name, [v.name for v in g.inputs], [v.name for v in g.outputs], "m", target=tgt)
    return "".join(v.decode() for k, v in sorted(lib.files.items()) if "_kernels_" in k)


def test_generated_c_has_no_unit_arithmetic() -> None:
    """The Transformer block (GEMMs of batch 1 and 2, Softmax, LayerNorm) and the CNN's GEMM, Softmax
    and reductions: no division or remainder by 1, no product by 0, no counted loop of one trip, and each
    system header once per file; the CNN's conv and pool kernels too."""
    for model, name in ((transformer_block(), "block"), (small_cnn(), "cnn")):
        c = _kernels(model, name)
        funcs = re.split(r"\n(?=/\* k\d+_|/\* ---- GEMM)", c)
        for f in funcs:
            for bad in (r"/ 1\b", r"% 1\b", r"\* \(size_t\)0\b", r"\(size_t\)1 \*", r"= 0; [a-z_]+ < 1;"):
                assert not re.search(bad, f), (bad, f[:2000])
        assert all(c.count(i) == 1 for i in set(re.findall(r"#include <[a-z_0-9]+\.h>", c))), name
