"""Pass tests written as IR text in, IR text out (XLA's HLO rewrite tests, LLVM's FileCheck): each case
runs one pass of the pipeline (aotc/passes/pipeline.py) on a small graph and compares the whole
listing with the expected one, so a change in what a pass does shows up as a readable diff.

Expected texts are parsed and printed again before the comparison, so they may leave out what the
printer adds on its own (``opset=17``, ``1.0`` for ``1``, ``@name`` equal to the output's name);
the kernels list that ``fuse`` adds is compared as written.
"""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest

from aotc.errors import AotcError
from aotc.ir.graph import Graph
from aotc.passes.fuse import kernels_text
from aotc.passes.pipeline import DEFAULT_PASSES, run_passes
from aotc.target import for_isa

PASSES = {p.name: p for p in DEFAULT_PASSES}


def run(passes: str, before: str) -> Graph:
    """``before`` through the named passes of the pipeline (which verifies the graph after each)."""
    g = Graph.from_text(textwrap.dedent(before))
    run_passes(g, [PASSES[p] for p in passes.split()])
    return g


def listing(g: Graph) -> str:
    return g.to_text(elide=None) + ("\n" + kernels_text(g) if g.kernels else "")


def check(passes: str, before: str, after: str) -> None:
    got = listing(run(passes, before))
    graph_text, _, kernels = textwrap.dedent(after).strip().partition("\nkernels:\n")
    want = Graph.from_text(graph_text).to_text(elide=None) + (f"\nkernels:\n{kernels}\n" if kernels else "")
    assert got == want


def check_unchanged(passes: str, text: str) -> None:
    g = Graph.from_text(textwrap.dedent(text))
    before = g.to_text(elide=None)
    run_passes(g, [PASSES[p] for p in passes.split()])
    assert g.to_text(elide=None) == before


# -- prune --------------------------------------------------------------------------------------------
def test_prune_removes_what_no_output_needs_and_keeps_the_inputs() -> None:
    check("prune", """
        graph g {
          input %x: float32[4]
          input %unused: float32[4]
          %a: float32[4] = Relu(%x)
          %dead: float32[4] = Neg(%a)
          %c: float32[4] = constant [1, 2, 3, 4]
          %dead2: float32[4] = Add(%dead, %c)
          return %a
        }""", """
        graph g {
          input %x: float32[4]
          input %unused: float32[4]
          %a: float32[4] = Relu(%x)
          return %a
        }""")


def test_prune_keeps_a_node_when_one_of_its_outputs_is_needed() -> None:
    check_unchanged("prune", """
        graph g {
          input %x: float32[2,6]
          %split: int64[2] = constant [2, 4]
          %lo: float32[2,2], %hi: float32[2,4] = Split(%x, %split) axis=1
          return %hi
        }""")


# -- propagate: shape inference and constant folding ----------------------------------------------------
def test_propagate_infers_shapes_and_folds_a_shape_computation() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat becomes the Reshape's constant shape once y's shape is
    inferred; the MatMul and Add (broadcast bias) get their types."""
    check("propagate", """
        graph g {
          input %x: float32[2,3]
          %w: float32[3,4] = constant [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
          %mm: ?[?] = MatMul(%x, %w) _opset=17
          %b: float32[4] = constant [0.5, -0.5, 1, -1]
          %y: ?[?] = Add(%mm, %b) _opset=17
          %s: ?[?] = Shape(%y) _opset=17
          %i: int64[] = constant [0]
          %n: ?[?] = Gather(%s, %i) _opset=17 axis=0
          %zero: int64[1] = constant [0]
          %nn: ?[?] = Unsqueeze(%n, %zero) _opset=17
          %m1: int64[1] = constant [-1]
          %shape: ?[?] = Concat(%nn, %m1) _opset=17 axis=0
          %r: ?[?] = Reshape(%y, %shape) _opset=17
          return %r
        }""", """
        graph g {
          input %x: float32[2,3]
          %w: float32[3,4] = constant [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
          %mm: float32[2,4] = MatMul(%x, %w) _opset=17
          %b: float32[4] = constant [0.5, -0.5, 1, -1]
          %y: float32[2,4] = Add(%mm, %b) _opset=17
          %shape: int64[2] = constant [2, -1]
          %r: float32[2,4] = Reshape(%y, %shape) _opset=17
          return %r
        }""")


def test_propagate_folds_arithmetic_on_constants_through_to_an_output() -> None:
    check("propagate", """
        graph g {
          input %x: float32[3]
          %a: float32[3] = constant [1, 2, 3]
          %b: float32[] = constant [2]
          %ab: ?[?] = Mul(%a, %b) _opset=17
          %y: ?[?] = Add(%x, %ab) _opset=17
          %c: ?[?] = Sqrt(%b) _opset=17
          return %y, %c
        }""", """
        graph g {
          input %x: float32[3]
          %ab: float32[3] = constant [2, 4, 6]
          %y: float32[3] = Add(%x, %ab) _opset=17
          %c: float32[] = constant [1.4142135]
          return %y, %c
        }""")


def test_propagate_does_not_fold_a_broadcast_into_huge_weights() -> None:
    """A 64 MB result from a 4-byte scalar stays an Expand (typed), not a constant."""
    check("propagate", """
        graph g {
          input %x: float32[4096,4096]
          %one: float32[] = constant [1]
          %shape: int64[2] = constant [4096, 4096]
          %ones: ?[?] = Expand(%one, %shape) _opset=17
          %y: ?[?] = Add(%x, %ones) _opset=17
          return %y
        }""", """
        graph g {
          input %x: float32[4096,4096]
          %one: float32[] = constant [1]
          %shape: int64[2] = constant [4096, 4096]
          %ones: float32[4096,4096] = Expand(%one, %shape) _opset=17
          %y: float32[4096,4096] = Add(%x, %ones) _opset=17
          return %y
        }""")


def test_propagate_turns_castlike_into_cast() -> None:
    check("propagate", """
        graph g {
          input %x: float32[2]
          input %like: int32[3]
          %y: ?[?] = CastLike(%x, %like) _opset=17
          return %y
        }""", """
        graph g {
          input %x: float32[2]
          input %like: int32[3]
          %y: int32[2] = Cast(%x) _opset=17 to=6
          return %y
        }""")


def test_propagate_refuses_an_input_with_open_dims() -> None:
    g = Graph.from_text("graph g {\n  input %x: float32[N,3]\n  %y: ?[?] = Relu(%x)\n  return %y\n}")
    with pytest.raises(AotcError, match=r"^input 'x' has dynamic shape \[N,3\]; pin it with --input-shape x="):
        run_passes(g, [PASSES["propagate"]])


# -- patterns: decomposed GELU and LayerNorm ---------------------------------------------------------------
GELU_ERF = """
    graph g {
      input %x: float32[2,8]
      %sqrt2: float32[] = constant [1.4142135]
      %d: float32[2,8] = Div(%x, %sqrt2)
      %e: float32[2,8] = Erf(%d)
      %one: float32[] = constant [1]
      %p: float32[2,8] = Add(%e, %one)
      %m: float32[2,8] = Mul(%x, %p)
      %half: float32[] = constant [0.5]
      %y: float32[2,8] = Mul(%m, %half)
      return %y
    }"""


def test_patterns_recognise_erf_gelu() -> None:
    check("patterns", GELU_ERF, """
        graph g {
          input %x: float32[2,8]
          %y: float32[2,8] = Gelu(%x) _opset=20 @y/gelu
          return %y
        }""")


def test_patterns_leave_a_gelu_whose_inner_value_is_fetched() -> None:
    """The Erf's result is a graph output too: folding the chain would lose it."""
    check_unchanged("patterns", GELU_ERF.replace("return %y", "return %y, %e"))


def test_patterns_recognise_tanh_gelu() -> None:
    """GPT-2's gelu_new, written 0.5x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    check("patterns", """
        graph g {
          input %x: float32[2,8]
          %three: float32[] = constant [3]
          %x3: float32[2,8] = Pow(%x, %three)
          %k: float32[] = constant [0.044715]
          %t: float32[2,8] = Mul(%x3, %k)
          %inner: float32[2,8] = Add(%x, %t)
          %c: float32[] = constant [0.7978846]
          %u: float32[2,8] = Mul(%inner, %c)
          %th: float32[2,8] = Tanh(%u)
          %one: float32[] = constant [1]
          %p: float32[2,8] = Add(%th, %one)
          %half: float32[] = constant [0.5]
          %h: float32[2,8] = Mul(%x, %half)
          %y: float32[2,8] = Mul(%h, %p)
          return %y
        }""", """
        graph g {
          input %x: float32[2,8]
          %y: float32[2,8] = Gelu(%x) _opset=20 approximate="tanh" @y/gelu
          return %y
        }""")


def test_patterns_recognise_layernorm_with_scale_and_bias() -> None:
    check("patterns", """
        graph g {
          input %x: float32[2,4]
          %mean: float32[2,1] = ReduceMean(%x) axes=[-1] keepdims=1
          %d: float32[2,4] = Sub(%x, %mean)
          %two: float32[] = constant [2]
          %sq: float32[2,4] = Pow(%d, %two)
          %var: float32[2,1] = ReduceMean(%sq) axes=[-1]
          %eps: float32[] = constant [1e-05]
          %ve: float32[2,1] = Add(%var, %eps)
          %std: float32[2,1] = Sqrt(%ve)
          %n: float32[2,4] = Div(%d, %std)
          %gamma: float32[4] = constant [1, 2, 3, 4]
          %g: float32[2,4] = Mul(%n, %gamma)
          %beta: float32[4] = constant [0, 0.5, 0, -0.5]
          %y: float32[2,4] = Add(%g, %beta)
          return %y
        }""", """
        graph g {
          input %x: float32[2,4]
          %gamma: float32[4] = constant [1, 2, 3, 4]
          %beta: float32[4] = constant [0, 0.5, 0, -0.5]
          %y: float32[2,4] = LayerNormalization(%x, %gamma, %beta) _opset=17 axis=1 epsilon=1e-05f @y/layernorm
          return %y
        }""")


def test_patterns_leave_a_mean_over_leading_axes() -> None:
    """Normalizing over axis 0 of [2,4] is not a LayerNorm over trailing axes."""
    check_unchanged("patterns", """
        graph g {
          input %x: float32[2,4]
          %mean: float32[1,4] = ReduceMean(%x) axes=[0] keepdims=1
          %d: float32[2,4] = Sub(%x, %mean)
          %two: float32[] = constant [2]
          %sq: float32[2,4] = Pow(%d, %two)
          %var: float32[1,4] = ReduceMean(%sq) axes=[0]
          %std: float32[1,4] = Sqrt(%var)
          %y: float32[2,4] = Div(%d, %std)
          return %y
        }""")


# -- simplify --------------------------------------------------------------------------------------------
def test_simplify_removes_identity_and_rewires_the_output() -> None:
    check("simplify", """
        graph g {
          input %x: float32[4]
          %a: float32[4] = Relu(%x)
          %b: float32[4] = Identity(%a)
          %y: float32[4] = Neg(%b)
          return %y, %b
        }""", """
        graph g {
          input %x: float32[4]
          %a: float32[4] = Relu(%x)
          %y: float32[4] = Neg(%a)
          return %y, %a
        }""")


def test_simplify_lowers_gemm_with_constant_weights_into_one_matmul() -> None:
    """transB and alpha end up in the weights (the fixpoint folds the Transpose, then the scale), the
    bias stays an Add for the GEMM epilogue."""
    check("simplify", """
        graph g {
          input %a: float32[2,4]
          %b: float32[3,4] = constant [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
          %bias: float32[3] = constant [1, 2, 3]
          %y: float32[2,3] = Gemm(%a, %b, %bias) alpha=2.0 transB=1 @fc
          return %y
        }""", """
        graph g {
          input %a: float32[2,4]
          %fc:Transpose: float32[4,3] = constant [2, 10, 18, 4, 12, 20, 6, 14, 22, 8, 16, 24]
          %fc:Mul: float32[2,3] = MatMul(%a, %fc:Transpose) _opset=17 @fc
          %bias: float32[3] = constant [1, 2, 3]
          %y: float32[2,3] = Add(%fc:Mul, %bias) _opset=17 @fc
          return %y
        }""")


def test_simplify_lowers_gemm_with_run_time_weights() -> None:
    """A fed B keeps its Transpose and alpha its Mul; beta is folded into the constant bias."""
    check("simplify", """
        graph g {
          input %a: float32[2,4]
          input %b: float32[3,4]
          %bias: float32[3] = constant [1, 2, 3]
          %y: float32[2,3] = Gemm(%a, %b, %bias) alpha=2.0 beta=0.5 transB=1 @fc
          return %y
        }""", """
        graph g {
          input %a: float32[2,4]
          input %b: float32[3,4]
          %fc:Transpose: float32[4,3] = Transpose(%b) _opset=17 perm=[1, 0] @fc
          %fc:MatMul: float32[2,3] = MatMul(%a, %fc:Transpose) _opset=17 @fc
          %c: float32[] = constant [2]
          %fc:Mul: float32[2,3] = Mul(%fc:MatMul, %c) _opset=17 @fc
          %fc:Mul~1: float32[3] = constant [0.5, 1, 1.5]
          %y: float32[2,3] = Add(%fc:Mul, %fc:Mul~1) _opset=17 @fc
          return %y
        }""")


def test_simplify_collapses_a_reshape_chain() -> None:
    check("simplify prune", """
        graph g {
          input %x: float32[2,3,4]
          %f: float32[2,12] = Flatten(%x) axis=1
          %s: int64[2] = constant [4, 6]
          %y: float32[4,6] = Reshape(%f, %s)
          return %y
        }""", """
        graph g {
          input %x: float32[2,3,4]
          %shape: int64[2] = constant [4, 6]
          %y: float32[4,6] = Reshape(%x, %shape) _opset=17
          return %y
        }""")


def test_simplify_folds_batchnorm_into_the_conv_before_it() -> None:
    """s = scale / sqrt(var + eps) = [1, 2] and t = bias - mean * s = [-1, -1] go into W and b."""
    check("simplify prune", """
        graph g {
          input %x: float32[1,2,3,3]
          %w: float32[2,2,1,1] = constant [1, 2, 3, 4]
          %conv: float32[1,2,3,3] = Conv(%x, %w) kernel_shape=[1, 1]
          %scale: float32[2] = constant [2, 4]
          %bias: float32[2] = constant [0, 1]
          %mean: float32[2] = constant [1, 1]
          %var: float32[2] = constant [3, 3]
          %y: float32[1,2,3,3] = BatchNormalization(%conv, %scale, %bias, %mean, %var) epsilon=1.0
          return %y
        }""", """
        graph g {
          input %x: float32[1,2,3,3]
          %w: float32[2,2,1,1] = constant [1, 2, 6, 8]
          %conv_bias: float32[2] = constant [-1, -1]
          %y: float32[1,2,3,3] = Conv(%x, %w, %conv_bias) _opset=17 kernel_shape=[1, 1] @conv
          return %y
        }""")


def test_simplify_folds_a_column_scale_into_matmul_weights() -> None:
    check("simplify", """
        graph g {
          input %x: float32[1,2]
          %w: float32[2,3] = constant [1, 2, 3, 4, 5, 6]
          %m: float32[1,3] = MatMul(%x, %w)
          %s: float32[3] = constant [1, 10, 100]
          %y: float32[1,3] = Mul(%m, %s)
          return %y
        }""", """
        graph g {
          input %x: float32[1,2]
          %w: float32[2,3] = constant [1, 20, 300, 4, 50, 600]
          %y: float32[1,3] = MatMul(%x, %w) _opset=17 @m
          return %y
        }""")


def test_simplify_keeps_the_scale_when_the_product_is_fetched() -> None:
    check_unchanged("simplify", """
        graph g {
          input %x: float32[1,2]
          %w: float32[2,3] = constant [1, 2, 3, 4, 5, 6]
          %m: float32[1,3] = MatMul(%x, %w)
          %s: float32[3] = constant [1, 10, 100]
          %y: float32[1,3] = Mul(%m, %s)
          return %y, %m
        }""")


def test_simplify_merges_constant_adds() -> None:
    check("simplify", """
        graph g {
          input %x: float32[2,3]
          %c1: float32[3] = constant [1, 2, 3]
          %a: float32[2,3] = Add(%x, %c1)
          %c2: float32[3] = constant [10, 20, 30]
          %y: float32[2,3] = Add(%a, %c2)
          return %y
        }""", """
        graph g {
          input %x: float32[2,3]
          %c1: float32[3] = constant [11, 22, 33]
          %y: float32[2,3] = Add(%x, %c1) _opset=17
          return %y
        }""")


# -- widen_emulated --------------------------------------------------------------------------------------
def test_widen_casts_a_bfloat16_matmul_to_float32_and_back() -> None:
    check("widen_emulated", """
        graph g {
          input %a: bfloat16[2,3]
          input %b: bfloat16[3,4]
          %y: bfloat16[2,4] = MatMul(%a, %b)
          return %y
        }""", """
        graph g {
          input %a: bfloat16[2,3]
          input %b: bfloat16[3,4]
          %a_wide: float32[2,3] = Cast(%a) saturate=0 to=1 @y_widen0
          %b_wide: float32[3,4] = Cast(%b) saturate=0 to=1 @y_widen1
          %y_wide: float32[2,4] = MatMul(%a_wide, %b_wide) @y
          %y: bfloat16[2,4] = Cast(%y_wide) saturate=0 to=16 @y_narrow0
          return %y
        }""")


# -- fuse ------------------------------------------------------------------------------------------------
WEIGHTS_8X4 = "[" + ", ".join(str(i % 5) for i in range(32)) + "]"


def test_fuse_makes_matmul_bias_relu_one_gemm_kernel() -> None:
    graph = f"""
        graph g {{
          input %x: float32[2,8]
          %w: float32[8,4] = constant {WEIGHTS_8X4}
          %mm: float32[2,4] = MatMul(%x, %w)
          %b: float32[4] = constant [1, 2, 3, 4]
          %z: float32[2,4] = Add(%mm, %b)
          %y: float32[2,4] = Relu(%z)
          return %y
        }}"""
    check("fuse", graph, graph + """
        kernels:
          k0_matmul_add_relu [gemm] ops=MatMul+Add+Relu -> y: float32[2,4]""")


def test_fuse_stops_the_epilogue_at_a_fetched_value() -> None:
    """The MatMul's result is also an output, so it is written: the Relu gets a loop of its own."""
    graph = f"""
        graph g {{
          input %x: float32[2,8]
          %w: float32[8,4] = constant {WEIGHTS_8X4}
          %mm: float32[2,4] = MatMul(%x, %w)
          %y: float32[2,4] = Relu(%mm)
          return %y, %mm
        }}"""
    check("fuse", graph, graph + """
        kernels:
          k0_matmul [gemm] ops=MatMul -> mm: float32[2,4]
          k1_relu [loop] ops=Relu -> y: float32[2,4]""")


def test_fuse_puts_a_reduction_with_its_producer_and_epilogue_in_one_loop() -> None:
    graph = """
        graph g {
          input %x: float32[4,8]
          %sq: float32[4,8] = Mul(%x, %x)
          %axes: int64[1] = constant [1]
          %s: float32[4,1] = ReduceSum(%sq, %axes) _opset=17 keepdims=1
          %y: float32[4,1] = Sqrt(%s)
          return %y
        }"""
    check("fuse", graph, graph + """
        kernels:
          k0_mul_reducesum_sqrt [loop] ops=Mul+ReduceSum+Sqrt -> y: float32[4,1]""")


def test_fuse_ends_a_kernel_at_a_value_read_by_two_kernels() -> None:
    graph = """
        graph g {
          input %x: float32[4]
          %a: float32[4] = Exp(%x)
          %y1: float32[4] = Neg(%a)
          %y2: float32[4] = Abs(%a)
          return %y1, %y2
        }"""
    check("fuse", graph, graph + """
        kernels:
          k0_exp [loop] ops=Exp -> a: float32[4]
          k1_neg [loop] ops=Neg -> y1: float32[4]
          k2_abs [loop] ops=Abs -> y2: float32[4]""")


def test_fuse_gives_outputs_that_alias_an_input_a_copy() -> None:
    """A Reshape of an input and the input itself, fetched: no kernel writes them, so each gets a Copy
    (named as the output it stands for: the listing shows the repeated names as ~1)."""
    check("fuse", """
        graph g {
          input %x: float32[2,3]
          %shape: int64[1] = constant [6]
          %y: float32[6] = Reshape(%x, %shape)
          return %y, %x
        }""", """
        graph g {
          input %x: float32[2,3]
          %shape: int64[1] = constant [6]
          %y: float32[6] = Reshape(%x, %shape)
          %y~1: float32[6] = Copy(%y) @copy_output_0
          %x~1: float32[2,3] = Copy(%x) @copy_output_1
          return %y~1, %x~1
        }
        kernels:
          k0_copy [loop] ops=Copy -> y: float32[6]
          k1_copy [loop] ops=Copy -> x: float32[2,3]""")


# -- schedule and plan_memory ----------------------------------------------------------------------------
SCHEDULED = """
    graph g {
      input %a: float32[64,300]
      input %b: float32[300,127]
      input %x: float32[2,1048576]
      input %i: float32[1,4,16,16]
      %mm: float32[64,127] = MatMul(%a, %b)
      %y: float32[64,127] = Relu(%mm)
      %axes: int64[1] = constant [1]
      %s: float32[2] = ReduceSum(%x, %axes) _opset=17 keepdims=0
      %w: float32[8,4,1,1] = constant [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8,
                                       1, 2, 3, 4, 5, 6, 7, 8]
      %c: float32[1,8,16,16] = Conv(%i, %w) _opset=17
      return %y, %s, %c
    }"""


def scheduled(isa: str) -> Graph:
    return run_passes(Graph.from_text(textwrap.dedent(SCHEDULED)), [PASSES["fuse"], PASSES["schedule"]],
                      target=for_isa(isa))


def test_schedule_plans_each_kernel_for_the_target() -> None:
    """A GEMM with a run-time B gets AVX2's 6x16 register tiles and a K block whose B micro-panel fits
    half of L1 (150 x 16 floats), packing B per task; a full reduction over 2**20 elements per output
    is cut into 16 chunks of 2**16; a 1x1 conv takes the rows path."""
    assert kernels_text(scheduled("avx2")).splitlines() == [
        "kernels:",
        "  k0_matmul_relu [gemm] ops=MatMul+Relu -> y: float32[64,127]",
        "    plan: up to 302 tasks; gemm 64x127x300 on avx2 6x16 tiles, KC=150 MC=66 NC=128, A in place, "
        "B packed, tasks split columns; scratch 76800 bytes per task",
        "  k1_reducesum [loop] ops=ReduceSum -> s: float32[2]",
        "    plan: up to 256 tasks; 16 chunks per output (256 bytes of partials)",
        "  k2_conv [conv] ops=Conv -> c: float32[1,8,16,16]",
        "    plan: one task; conv rows"]
    gemm = scheduled("avx512").kernels[0].plan.gemm
    assert (gemm.isa.mr, gemm.isa.nr, gemm.kc) == (12, 32, 100)  # 32-wide panels: a shorter K block


def test_plan_memory_takes_scratch_and_partials_from_the_plans() -> None:
    """The memory planner places what the kernels' plans ask for, whatever decided it."""
    g = scheduled("avx2")
    gemm, red, _ = g.kernels
    gemm.plan = dataclasses.replace(gemm.plan, scratch_bytes=1000)
    red.plan = dataclasses.replace(red.plan, partials_bytes=100)
    run_passes(g, [PASSES["plan_memory"]])
    assert g.memory.scratch_per_task == 1024 and list(g.memory.scratch) == [gemm.index]  # 64-byte aligned
    assert g.memory.partials[red.index].size == 128 and g.memory.workspace_bytes == 128 + 1024


# -- the pipeline ----------------------------------------------------------------------------------------
def test_pipeline_turns_a_decomposed_layernorm_into_one_row_kernel() -> None:
    """From an ONNX-like import (types not inferred yet, a dead branch) to the fused graph."""
    g = run("prune propagate patterns simplify prune_again widen_emulated fuse", """
        graph g {
          input %x: float32[2,4]
          %axes: int64[1] = constant [-1]
          %mean: ?[?] = ReduceMean(%x, %axes) _opset=18 keepdims=1
          %d: ?[?] = Sub(%x, %mean) _opset=18
          %two: float32[] = constant [2]
          %sq: ?[?] = Pow(%d, %two) _opset=18
          %var: ?[?] = ReduceMean(%sq, %axes) _opset=18 keepdims=1
          %eps: float32[] = constant [1e-05]
          %ve: ?[?] = Add(%var, %eps) _opset=18
          %std: ?[?] = Sqrt(%ve) _opset=18
          %n: ?[?] = Div(%d, %std) _opset=18
          %unused: ?[?] = Exp(%n) _opset=18
          %y: ?[?] = Identity(%n) _opset=18
          return %y
        }""")
    assert listing(g) == textwrap.dedent("""\
        graph g opset=17 {
          input %x: float32[2,4]
          %n/ones: float32[1] = constant [1.0]
          %n: float32[2,4] = LayerNormalization(%x, %n/ones) _opset=18 axis=1 epsilon=1e-05f @n/layernorm
          return %n
        }

        kernels:
          k0_layernormalization [op] ops=LayerNormalization -> n: float32[2,4]
        """)
    assert g.nodes[0].attrs["epsilon"] == float(np.float32(1e-5))  # the constant's float32, exactly
