"""The validation after import (aotc/frontends/validate.py and the ops' shape rules): a model that
onnx's checker or onnxruntime refuses is refused with one line naming the node, the attribute or input
and the value, before any C is generated; an unsupported op only matters if the fetches need it."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from models import init, make, vi
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import run_generated_test_under_sanitizers

import aotc
from aotc.compiler import compile_model
from aotc.config import Config, Feed, Fetch, TensorId
from aotc.errors import UnsupportedOpsError

W = np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32)


def _conv(inputs=("x", "W"), inits=(), x=(1, 2, 5, 5), **attrs) -> onnx.ModelProto:
    return make([helper.make_node("Conv", list(inputs), ["y"], name="c1", **attrs)], [vi("x", list(x))],
                [vi("y", None)], [init("W", W), *inits])


def _pool(op: str = "MaxPool", x=(1, 2, 6, 6), **attrs) -> onnx.ModelProto:
    return make([helper.make_node(op, ["x"], ["y"], name="p1", **attrs)], [vi("x", list(x))], [vi("y", None)])


def _relu(*extra_nodes, inputs=None, outputs=("y",), name="r", opset=17, **attrs) -> onnx.ModelProto:
    return make([helper.make_node("Relu", ["x"], list(outputs), name=name, **attrs), *extra_nodes],
                inputs or [vi("x", [2])], [vi("y", [2])], opset=opset)


def _with_attr(model: onnx.ModelProto, attr: onnx.AttributeProto) -> onnx.ModelProto:
    model.graph.node[0].attribute.append(attr)
    return model


def _refused(model: onnx.ModelProto, tmp_path, fragment: str) -> str:
    with pytest.raises(aotc.AotcError) as e:
        compile_model(model, tmp_path, "m")
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg, msg
    return msg


# Window attributes the emitters index with: each used to compile, several into C writing out of bounds.
WINDOW_CASES = {
    "conv_negative_pads": (_conv(pads=[-1, -1, -1, -1]),
                           "Conv node 'c1': attribute pads [-1, -1, -1, -1] must hold values >= 0"),
    "depthwise_negative_pads": (
        make([helper.make_node("Conv", ["x", "Wd"], ["y"], name="dw", group=2, pads=[0, -2, 0, 0])],
             [vi("x", [1, 2, 5, 5])], [vi("y", None)], [init("Wd", W[:2, :1])]), "attribute pads [0, -2, 0, 0]"),
    "maxpool_negative_pads": (_pool(kernel_shape=[3, 3], pads=[-1, 0, 0, 0]), "MaxPool node 'p1': attribute pads"),
    "avgpool_1d_negative_pads": (_pool("AveragePool", x=(1, 2, 6), kernel_shape=[3], pads=[0, -1]), "pads [0, -1]"),
    "dilations_zero": (_conv(dilations=[0, 1]), "attribute dilations [0, 1] must hold values >= 1"),
    "dilations_negative": (_conv(dilations=[1, -1]), "attribute dilations [1, -1]"),
    "strides_zero": (_conv(strides=[1, 0]), "attribute strides [1, 0]"),
    "kernel_shape_zero": (_pool(kernel_shape=[0, 3]), "attribute kernel_shape [0, 3] must hold values >= 1"),
    "pool_pads_not_below_kernel": (_pool("AveragePool", kernel_shape=[2, 2], pads=[0, 2, 0, 0]),
                                   "attribute pads [0, 2, 0, 0] must be smaller than kernel_shape [2, 2]"),
    "unknown_auto_pad": (_conv(auto_pad="SAME"), "attribute auto_pad 'SAME' is not one of NOTSET"),
    "group_zero": (_conv(group=0), "attribute group 0 must be >= 1"),
    "pads_and_auto_pad": (_conv(pads=[0, 0, 0, 0], auto_pad="VALID"),
                          "attributes pads [0, 0, 0, 0] and auto_pad 'VALID' exclude each other"),
    "lengths_disagree": (_conv(kernel_shape=[3, 3], strides=[1, 1, 1]), "disagree on the number of spatial axes"),
    "odd_pads": (_pool(kernel_shape=[2, 2], pads=[0, 0, 0]), "a begin and an end per spatial axis"),
    "conv_transpose_output_padding": (
        make([helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="ct", output_padding=[-1, 0])],
             [vi("x", [1, 4, 3, 3])], [vi("y", None)], [init("W", W)]), "attribute output_padding [-1, 0]"),
    # Needing shapes: aotc/ops/conv.py, during shape inference.
    "pads_rank": (_conv(pads=[1, 1]), "attribute pads [1, 1] has 2 values, the input's 2 spatial axes need 4"),
    "pool_kernel_rank": (_pool(kernel_shape=[2, 2, 2]), "attribute kernel_shape [2, 2, 2] has 3 values"),
    "group_does_not_divide": (_conv(group=3), "attribute group 3 does not divide the input's 2 channels"),
    "weight_channels": (_conv(x=(1, 3, 5, 5)), "weight shape [4, 2, 3, 3] has 2 input channels per group"),
    "bias_length": (_conv(("x", "W", "B"), [init("B", np.zeros(3, np.float32))]),
                    "Conv node 'c1': bias shape [3] does not match the 4 output channels"),
    "conv_transpose_bias": (
        make([helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], name="ct")], [vi("x", [1, 4, 3, 3])],
             [vi("y", None)], [init("W", W), init("B", np.zeros(4, np.float32))]),
        "ConvTranspose node 'ct': bias shape [4] does not match the 2 output channels"),
    "kernel_shape_vs_weights": (_conv(kernel_shape=[2, 2]), "kernel_shape [2, 2] does not match weight shape"),
    # onnxruntime refuses these two at run time; aotc shifted or padded the output instead.
    "conv_transpose_output_padding_vs_stride": (
        make([helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="ct", output_padding=[1, 2], strides=[2, 2])],
             [vi("x", [1, 4, 3, 3])], [vi("y", None)], [init("W", W)]),
        "attribute output_padding [1, 2] must be smaller than the larger of strides and dilations ([2, 2])"),
    "conv_transpose_output_shape": (
        make([helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="ct", output_shape=[12, 8], strides=[3, 2])],
             [vi("x", [1, 4, 3, 3])], [vi("y", None)], [init("W", W)]),
        "attribute output_shape [12, 8] exceeds the full output [9, 7] of input shape [3, 3] by a stride [3, 2]"),
}


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_window_attributes_are_checked(case: str, tmp_path) -> None:
    model, fragment = WINDOW_CASES[case]
    _refused(model, tmp_path, fragment)


def _empty_required_input() -> onnx.ModelProto:
    return make([helper.make_node("Add", ["x", ""], ["y"], name="a")], [vi("x", [2])], [vi("y", [2])])


def _relu_header(no_opset: bool = False, ir_version: int = 9, extra: tuple[str, int] | None = None) -> onnx.ModelProto:
    """A Relu model with an empty opset_import, the given IR version, or a (domain, version) import
    ``extra`` beside its default-domain opset 17."""
    model = _relu()
    if no_opset:
        del model.opset_import[:]
    if extra is not None:
        model.opset_import.append(helper.make_opsetid(*extra))
    model.ir_version = ir_version
    return model


def _ir3_model(declare_initializer: bool) -> onnx.ModelProto:
    inputs = [vi("x", [2])] + ([vi("c", [2])] if declare_initializer else [])
    model = make([helper.make_node("Add", ["x", "c"], ["y"])], inputs, [vi("y", [2])],
                 [init("c", np.ones(2, np.float32))], opset=8)
    model.ir_version = 3
    return model


def _ml_model(node: onnx.NodeProto) -> onnx.ModelProto:
    model = make([node], [vi("x", [3])], [vi("y", None)])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 5))
    return model


def _initializer_of_type(data_type: int, dims=(2,)) -> onnx.ModelProto:
    """Two float32 zeros as raw data, stored as ``data_type`` with ``dims``."""
    c = numpy_helper.from_array(np.zeros(2, np.float32), "c")
    c.data_type = data_type
    c.dims[:] = dims
    return make([helper.make_node("Add", ["x", "c"], ["y"], name="a")], [vi("x", [2])], [vi("y", [2])], [c])


SCHEMA_CASES = {
    "unknown_attribute": (_relu(foo=1), "Relu node 'r': unknown attribute 'foo' (Relu-14 has no attributes)"),
    "float_group": (_with_attr(_conv(), helper.make_attribute("group", 1.0)),
                    "Conv node 'c1': attribute 'group' is FLOAT, Conv-11 expects INT"),
    "float_kernel_shape": (_with_attr(_conv(), helper.make_attribute("kernel_shape", [3.0, 3.0])),
                           "attribute 'kernel_shape' is FLOATS, Conv-11 expects INTS"),
    "attribute_twice": (
        _with_attr(make([helper.make_node("LeakyRelu", ["x"], ["y"], name="l", alpha=0.1)], [vi("x", [2])],
                        [vi("y", [2])]), helper.make_attribute("alpha", 0.2)),
        "LeakyRelu node 'l': attribute 'alpha' is given twice"),
    "extra_input": (make([helper.make_node("Relu", ["x", "x"], ["y"], name="r")], [vi("x", [2])], [vi("y", [2])]),
                    "Relu node 'r': 2 inputs, Relu-14 takes 1"),
    # Was an AssertionError in ir/graph.py.
    "extra_output": (_relu(outputs=("y", "z")), "Relu node 'r': 2 outputs, Relu-14 takes 1"),
    "missing_required_attribute": (
        make([helper.make_node("Cast", ["x"], ["y"], name="k")], [vi("x", [2])], [vi("y", [2])]),
        "Cast node 'k': required attribute 'to' is missing"),
    "empty_required_input": (_empty_required_input(), "Add node 'a': input 1 (B) is required but empty"),
    # onnx's shape inference (still run later, for dtypes) crashed the process on this one.
    "empty_input_of_ml_op": (_ml_model(helper.make_node("TreeEnsemble", [""], ["y"], name="t", domain="ai.onnx.ml")),
                             "TreeEnsemble node 't': input 0 (X) is required but empty"),
    "duplicate_graph_input": (_relu(inputs=[vi("x", [2]), vi("x", [2])]), "graph input 'x' is declared twice"),
    "duplicate_node_output": (_relu(helper.make_node("Neg", ["x"], ["y"], name="n")),
                              "Neg node 'n': output 'y' redefines a tensor name"),
    "output_redefines_input": (_relu(helper.make_node("Neg", ["y"], ["x"], name="n")), "output 'x' redefines"),
    "opset_99": (_relu(opset=99), "opset 99 of domain 'ai.onnx' is not defined"),
    "no_opset_import": (_relu_header(no_opset=True), "the model imports no opset"),
    "ir_version_99": (_relu_header(ir_version=99), "IR version 99 is not defined (onnx"),
    "ir_version_unset": (_relu_header(ir_version=0), "IR version 0 is not defined"),
    "opset_import_before_ir_3": (_relu_header(ir_version=2), "IR version 2 predates opset_import"),
    "opset_out_of_range": (_relu_header(extra=("bogus.domain", 2**40)), "opset 1099511627776 of domain 'bogus.domain' "
                                                                       "is out of range"),
    # onnxruntime registers com.microsoft opset 1 only and refuses any later import, used or not.
    "com_microsoft_opset_21": (_relu_header(extra=("com.microsoft", 21)),
                               "opset 21 of domain 'com.microsoft' is not defined (onnxruntime defines 1 to 1)"),
    "ml_opset_7": (_relu_header(extra=("ai.onnx.ml", 7)), "opset 7 of domain 'ai.onnx.ml' is not defined (onnx"),
    "two_default_opsets": (_relu_header(extra=("ai.onnx", 18)), "opset_import gives domain 'ai.onnx' two versions"),
    "op_newer_than_opset": (
        make([helper.make_node("Gelu", ["x"], ["y"], name="g")], [vi("x", [2])], [vi("y", [2])], opset=17),
        "Gelu node 'g': Gelu is not defined in opset 17 of domain 'ai.onnx' (it was added in opset 20)"),
    # Element types, declared or inferred by onnx, against the schema's type constraints.
    "type_not_allowed": (
        make([helper.make_node("Gemm", ["x", "x"], ["y"], name="g")], [vi("x", [2, 2], TensorProto.BOOL)],
             [vi("y", [2, 2], TensorProto.BOOL)]),
        "Gemm node 'g': input 0 (A) 'x' is bool, which Gemm-13 does not take there"),
    "types_disagree": (make([helper.make_node("Add", ["x", "i"], ["y"], name="a")],
                            [vi("x", [2]), vi("i", [2], TensorProto.INT64)], [vi("y", [2])]),
                       "Add node 'a': input 1 (B) 'i' is int64 but input 0 (A) 'x' is float (both T of Add-14)"),
    "declared_output_type": (
        make([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], [vi("x", [2], TensorProto.INT64)],
             [vi("y", [2], TensorProto.INT16)]),
        "graph output 'y' is declared int16 but its node makes float"),
    "inferred_type": (
        make([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT64), helper.make_node("Neg", ["c"], ["n"]),
              helper.make_node("Add", ["n", "x"], ["y"], name="a")], [vi("x", [2])], [vi("y", [2])]),
        "Add node 'a': input 1 (B) 'x' is float but input 0 (A) 'n' is int64"),
    "internal_op": (make([helper.make_node("Copy", ["x"], ["y"], name="c")], [vi("x", [2])], [vi("y", [2])]),
                    "unsupported ops: Copy (nodes: c)"),
    # Was a ValueError raised while formatting the error.
    "unknown_elem_type": (_relu(inputs=[vi("x", [2], 99)]), "input 'x': unknown elem_type 99"),
    "initializer_data_type_39": (_initializer_of_type(39), "initializer 'c' has unknown data_type 39"),
    "initializer_negative_dims": (_initializer_of_type(TensorProto.FLOAT, dims=[-1]),
                                  "initializer 'c' has a negative dimension in its dims [-1]"),
    # onnxruntime: "Shape of initializer w does not match"; aotc ignored what the input declared.
    "initializer_input_declared_shape": (
        make([helper.make_node("Add", ["x", "c"], ["y"])], [vi("x", [2]), vi("c", [3])], [vi("y", [2])],
             [init("c", np.zeros(2, np.float32))]),
        "input 'c' is declared with shape [3] but its initializer has shape [2]"),
    "initializer_input_declared_type": (
        make([helper.make_node("Add", ["x", "c"], ["y"])], [vi("x", [2]), vi("c", [2], TensorProto.DOUBLE)],
             [vi("y", [2])], [init("c", np.zeros(2, np.float32))]),
        "input 'c' is declared double but its initializer is float32"),
    "output_elem_type_unknown": (make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2], 88)]),
                                 "graph output 'y' has unknown elem_type 88"),
    # onnxruntime crashed on the generated test's reference model of this one.
    "duplicate_graph_output": (make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])] * 2),
                               "graph output 'y' is listed 2 times"),
    "no_outputs": (make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], []),
                   "the model's graph has no outputs: nothing to compute"),
    # No shape is an unknown rank, not a scalar (aotc compiled it as one).
    "input_rank_unknown": (make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", None)], [vi("y", None)]),
                           "input 'x' has dynamic shape [rank unknown]; pin it with --input-shape x=..."),
    "initializer_short_data": (_initializer_of_type(TensorProto.FLOAT, dims=[4]),
                               "initializer 'c' cannot be read (dims [4])"),
}


def _op(op: str, inputs: list, opset: int = 17, **attrs) -> onnx.ModelProto:
    """One ``op`` node named "n" reading graph inputs ``inputs`` (name, shape[, dtype]), giving y."""
    return make([helper.make_node(op, [i[0] for i in inputs], ["y"], name="n", **attrs)],
                [vi(*i) for i in inputs], [vi("y", None)], opset=opset)


I64 = TensorProto.INT64
# Attribute values and shapes other emitters index with (aotc/ops/nn.py), and type-valued attributes.
OP_CASES = {
    "cast_to_99": (_op("Cast", [("x", [2])], to=99), "Cast node 'n': attribute to 99 is not an element type"),
    "eyelike_dtype_0": (_op("EyeLike", [("x", [2, 2])], dtype=0), "attribute dtype 0 is not an element type"),
    "tensor_attribute_type_99": (
        make([helper.make_node("ConstantOfShape", ["s"], ["y"], name="n",
                               value=onnx.TensorProto(data_type=99, dims=[1], raw_data=b"\0" * 4))],
             [], [vi("y", None)], [init("s", np.array([2]))]),
        "ConstantOfShape node 'n': attribute value holds a tensor of unknown data_type 99"),
    "lrn_size_0": (_op("LRN", [("x", [1, 4, 2, 2])], size=0), "LRN node 'n': attribute size 0 is not a positive odd"),
    "lrn_size_negative": (_op("LRN", [("x", [1, 4, 2, 2])], size=-3), "attribute size -3"),
    "lrn_size_even": (_op("LRN", [("x", [1, 4, 2, 2])], size=2), "attribute size 2"),
    "lp_normalization_p3": (_op("LpNormalization", [("x", [2, 3])], p=3), "attribute p 3 is not 1 or 2"),
    "loss_reduction": (_op("NegativeLogLikelihoodLoss", [("x", [2, 3]), ("t", [2], I64)], reduction="avg"),
                       "attribute reduction 'avg' is not one of none, mean, sum"),
    "loss_target_shape": (_op("SoftmaxCrossEntropyLoss", [("x", [2, 3]), ("t", [5], I64)]),
                          "target shape [5] does not match input shape [2, 3]"),
    "loss_weight_shape": (_op("NegativeLogLikelihoodLoss", [("x", [2, 3]), ("t", [2], I64), ("w", [2])]),
                          "weight shape [2] does not match the 3 classes"),
    "rms_scale_shape": (_op("RMSNormalization", [("x", [2, 4]), ("s", [3])], opset=23),
                        "scale shape [3] does not broadcast to the normalized dims [4]"),
    "rope_num_heads": (_op("RotaryEmbedding", [("x", [1, 2, 8]), ("c", [1, 2, 2]), ("s", [1, 2, 2])], opset=23,
                           num_heads=3), "attribute num_heads 3 must divide the hidden size 8"),
    "rope_dim_past_head": (_op("RotaryEmbedding", [("x", [1, 2, 8]), ("c", [1, 2, 4]), ("s", [1, 2, 4])], opset=23,
                               num_heads=2, rotary_embedding_dim=8),
                           "attribute rotary_embedding_dim 8 is not in 1..4 (the head size)"),
    "rope_cache_shape": (_op("RotaryEmbedding", [("x", [1, 2, 3, 4]), ("c", [1, 3, 1]), ("s", [1, 3, 1])], opset=23),
                         "cos_cache shape [1, 3, 1] and sin_cache shape [1, 3, 1] must both be [1, 3, 2]"),
}


@pytest.mark.parametrize("case", OP_CASES)
def test_op_attributes_and_shapes_are_checked(case: str, tmp_path) -> None:
    model, fragment = OP_CASES[case]
    _refused(model, tmp_path, fragment)


@pytest.mark.parametrize("case", SCHEMA_CASES)
def test_schema_is_checked(case: str, tmp_path) -> None:
    model, fragment = SCHEMA_CASES[case]
    _refused(model, tmp_path, fragment)


def test_accepted_headers() -> None:
    """What onnx.checker and onnxruntime both accept: an IR 3 initializer listed as a graph input,
    com.microsoft opset 1; and what the checker refuses and onnxruntime runs: an empty graph name, an
    IR 3 initializer that is not a graph input (the ONNX backend suite's PyTorch models have them)."""
    from aotc.frontends.onnx import import_onnx

    unnamed = _relu_header(extra=("com.microsoft", 1))
    unnamed.graph.name = ""
    for model in (_ir3_model(declare_initializer=True), _ir3_model(declare_initializer=False), unnamed):
        assert import_onnx(model).nodes


def test_depthwise_stride_past_the_plane(tmp_path) -> None:
    """A stride of 2^62 is valid (one output column): the depthwise phase path built tables and
    scratch as long as the stride (a MemoryError); it now stays on the row-by-row path."""
    import onnxruntime as ort

    w = np.random.default_rng(2).standard_normal((4, 1, 3, 3)).astype(np.float32)
    model = make([helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1], strides=[1, 2**62])],
                 [vi("x", [1, 4, 6, 6])], [vi("y", None)], [init("w", w)])
    model.ir_version = 10
    m = aotc.compile(model, out_dir=tmp_path, name="m")
    x = np.random.default_rng(3).standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(m.run({"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_input_of_unknown_rank_takes_a_pinned_shape(tmp_path) -> None:
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", None)], [vi("y", None)])
    m = aotc.compile(model, out_dir=tmp_path, name="m", input_shapes={"x": (2, 3)})
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(m.run({"x": x})[0], np.maximum(x, 0))


def test_nested_graph_nodes_are_checked(tmp_path) -> None:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="inner", foo=2)], "then", [],
                             [vi("t", [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [2])])
    model = make([helper.make_node("If", ["c"], ["y"], name="if1", then_branch=then, else_branch=other)],
                 [vi("c", [], TensorProto.BOOL), vi("x", [2])], [vi("y", [2])])
    _refused(model, tmp_path, "Relu node 'inner' (in attribute 'then_branch' of If node 'if1'): unknown "
                              "attribute 'foo'")


def test_constant_with_short_external_data(tmp_path) -> None:
    """The Constant's tensor says 16 floats, its file holds 2: one line naming the node, through the CLI."""
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    t = onnx.TensorProto(name="v", data_type=TensorProto.FLOAT, dims=[16], data_location=TensorProto.EXTERNAL)
    t.external_data.add(key="location", value="w.bin")
    model = make([helper.make_node("Constant", [], ["c"], name="k", value=t),
                  helper.make_node("Add", ["x", "c"], ["y"])], [vi("x", [16])], [vi("y", [16])])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    _assert_cli_error(_cli("compile", str(path), "-o", str(tmp_path / "out"), "-n", "m"),
                      "Constant node 'k': attribute value cannot be read (dims [16])")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True)


def _assert_cli_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("aotc: error:") and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr, proc.stderr


def test_cli_refuses_negative_pads_in_one_line(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(WINDOW_CASES["maxpool_negative_pads"][0].SerializeToString())
    _assert_cli_error(_cli("compile", str(path), "-o", str(tmp_path / "out")), "attribute pads [-1, 0, 0, 0]")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.c"))


def _invalid_utf8(where: str) -> bytes:
    """A Relu model whose node name, tensor name, graph input name or doc_string (``where``) holds
    bytes that are not UTF-8."""
    model = make([helper.make_node("Relu", ["INPUT"], ["MIDDL"], name="NODEN", doc_string="DOCST"),
                  helper.make_node("Neg", ["MIDDL"], ["y"])], [vi("INPUT", [2])], [vi("y", [2])])
    return model.SerializeToString().replace(where.encode(), b"bad\xff\xfe")  # same length


@pytest.mark.parametrize("where,fragment", [("NODEN", "model.graph.node[0].name is not valid UTF-8"),
                                            ("MIDDL", "model.graph.node[0].output is not valid UTF-8"),
                                            ("INPUT", "model.graph.node[0].input is not valid UTF-8")])
def test_invalid_utf8_names(where: str, fragment: str, tmp_path) -> None:
    data = _invalid_utf8(where)
    _refused(onnx.load_from_string(data), tmp_path, fragment)
    if where == "INPUT":  # through the CLI: compile (was a TypeError) and inspect
        path = tmp_path / "m.onnx"
        path.write_bytes(data)
        for args in (("compile", str(path), "-o", str(tmp_path / "out")), ("inspect", str(path))):
            _assert_cli_error(_cli(*args), "is not valid UTF-8: b'bad\\xff\\xfe'")


def test_invalid_utf8_in_free_text_is_left_alone(tmp_path) -> None:
    """A doc_string is never read: bytes that are not UTF-8 there do not stop a compile."""
    m = aotc.compile(onnx.load_from_string(_invalid_utf8("DOCST")), out_dir=tmp_path, name="m")
    np.testing.assert_array_equal(m.run({"INPUT": np.array([-1, 2], np.float32)})[0], [0, -2])


def _branches() -> onnx.ModelProto:
    """x -> Relu -> y, and beside it two unsupported ops (one in a custom domain) -> z."""
    return make([helper.make_node("Relu", ["x"], ["y"], name="keep"),
                 helper.make_node("FancyOp", ["x"], ["f"], name="fancy"),
                 helper.make_node("Frobnicate", ["f"], ["z"], name="frob", domain="com.example")],
                [vi("x", [2])], [vi("y", [2]), vi("z", [2])])


def test_unsupported_op_on_an_unfetched_branch(tmp_path) -> None:
    """README: the config prunes the graph to its fetches, so the rest may use any op."""
    cfg = Config(fetches=[Fetch(TensorId("y"))])
    m = aotc.compile(_branches(), out_dir=tmp_path, name="m", config=cfg)
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(m.run({"x": x})[0], np.maximum(x, 0))
    with pytest.raises(UnsupportedOpsError) as e:  # fetched: every unsupported op still in one error
        compile_model(_branches(), tmp_path / "all", "m")
    assert str(e.value) == "unsupported ops: FancyOp (nodes: fancy); com.example.Frobnicate (nodes: frob)"
    with pytest.raises(UnsupportedOpsError, match="FancyOp"):  # fetching z needs both
        compile_model(_branches(), tmp_path / "z", "m", config=Config(fetches=[Fetch(TensorId("z"))]))
    cut = Config(feeds=[Feed(TensorId("f"), (2,), dtype=np.dtype(np.float32))], fetches=[Fetch(TensorId("z"))])
    with pytest.raises(UnsupportedOpsError) as e:  # feeding f cuts FancyOp away
        compile_model(_branches(), tmp_path / "f", "m", config=cut)
    assert str(e.value) == "unsupported ops: com.example.Frobnicate (nodes: frob)"


def test_schema_free_ops_and_custom_domains_still_compile(tmp_path) -> None:
    """ai.onnx.ml ops are checked against their own domain's opset; an unknown domain has no schema,
    and its unsupported node is pruned when nothing needs it."""
    model = make([helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5),
                  helper.make_node("Whatever", ["x"], ["dead"], domain="com.microsoft", anything=1.5)],
                 [vi("x", [3])], [vi("y", [3])])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    m = aotc.compile(model, out_dir=tmp_path, name="m")
    x = np.array([0.2, 0.5, 0.9], np.float32)
    np.testing.assert_array_equal(m.run({"x": x})[0], (x > 0.5).astype(np.float32))
    del model.opset_import[1]
    _refused(model, tmp_path / "b", "Binarizer node 'Binarizer_0': the model imports no opset for its domain "
                                    "'ai.onnx.ml'")


def test_conv_pads_beyond_the_kernel_match_onnxruntime_under_sanitizers(tmp_path) -> None:
    """Conv (unlike the pools) accepts pads >= the kernel (onnxruntime does: border outputs see padding
    only). The tiled path (constant weights), the generic path (weights an input) and the depthwise
    path, built with ASan/UBSan, against onnxruntime; with them a ConvTranspose whose output_shape
    passes its full output by less than a stride (the extra rows go at the end, where aotc shifted
    the output by a negative begin pad)."""
    rng = np.random.default_rng(1)
    dw = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    wt = rng.standard_normal((2, 2, 1, 1)).astype(np.float32)
    model = make([helper.make_node("Conv", ["x", "W"], ["a"], pads=[3, 4, 3, 0]),
                  helper.make_node("Conv", ["x", "w"], ["b"], pads=[0, 3, 5, 1], strides=[2, 1]),
                  helper.make_node("Conv", ["x", "Wd"], ["c"], pads=[4, 4, 3, 3], group=2, dilations=[2, 1]),
                  helper.make_node("ConvTranspose", ["x", "Wt"], ["d"], strides=[3, 3], output_shape=[15, 14])],
                 [vi("x", [1, 2, 5, 5]), vi("w", [4, 2, 3, 3])],
                 [vi("a", None), vi("b", None), vi("c", None), vi("d", None)],
                 [init("W", W), init("Wd", dw), init("Wt", wt)])
    model.ir_version = 10
    run_generated_test_under_sanitizers(model, tmp_path)


@pytest.mark.parametrize(("a", "w", "c", "message"), [
    ([4], [4, 3], [3], "must be matrices"),
    ([2, 4], [5, 3], [3], "inner dimensions 4 and 5"),
    ([2, 4], [4, 3], [2, 2], "does not broadcast to [2, 3]"),
])
def test_gemm_shapes_are_checked(tmp_path, a, w, c, message):
    model = make([helper.make_node("Gemm", ["x", "W", "c"], ["y"])], [vi("x", a)], [vi("y", None)],
                 [init("W", np.ones(w, np.float32)), init("c", np.ones(c, np.float32))])
    with pytest.raises(aotc.AotcError, match=re.escape(message)):
        compile_model(model, tmp_path, "g")


@pytest.mark.parametrize(("node", "message"), [
    (helper.make_node("Gemm", ["x", "x"], ["y"], name="g", transB=-(2**63)), "attribute transB -9223372036854775808"),
    (helper.make_node("MaxPool", ["x4"], ["y"], name="p", kernel_shape=[2, 2], storage_order=2**31),
     "attribute storage_order 2147483648 must be 0 or 1"),
])
def test_flag_attributes_are_zero_or_one(tmp_path, node, message):
    model = make([node], [vi("x", [2, 2]), vi("x4", [1, 1, 4, 4])], [vi("y", None)])
    with pytest.raises(aotc.AotcError, match=message):
        compile_model(model, tmp_path, "f")
