"""Mutation fuzzer for aotc: every mutated model must give a clean one-line error, or a library that
matches onnxruntime when built with ASan/UBSan.

    python tools/fuzz.py --cases 10000 --seed 0 --jobs 2 --report out.json [--findings f.md]
    python tools/fuzz.py --replay tests/fuzz_corpus          # check the recorded outcomes
    python tools/fuzz.py --show 0:123                        # describe case 123 of seed 0

Case ``i`` of seed ``s`` is always the same model: a small seed model built in code (``SEEDS``), then
up to three protobuf-level mutations (dims, element types, attributes, initializers, graph structure,
names, opsets) and sometimes a byte-level one, drawn from ``random.Random(f"{s}:{i}")``. A mutation is
a plain JSON spec (``{"kind": "attr", "node": 2, ...}``) applied by ``build_model``, so a case can be
replayed, shown and minimized (drop one spec at a time) without the random stream.

Each case runs in a persistent worker process (aotc, onnx and onnxruntime imported once): compile
with ``gen_test=True`` under -fsanitize=address,undefined, run ``m_test``, and, when aotc did not
refuse the model, ask onnxruntime and ``onnx.checker`` whether the model is valid at all. Where no
reference can compute the test's expected outputs, the library is built with ``gen_benchmark=True``
instead and run once under the sanitizers. A worker that dies or outlives the case's time limit is
killed with its process group and replaced.

Outcomes: ``clean_error`` and ``ok`` are fine, and so are ``unchecked`` (a valid model that aotc
compiles but neither onnxruntime nor onnx.reference can run for the generated test: its library ran
clean under the sanitizers, without expected outputs, or its buffers are too large to run),
``nonfinite_mismatch`` (outputs differ only by NaN or infinity, in a model with a NaN or infinite
constant: see ``_nonfinite_only``) and ``ref_crash`` (onnxruntime or onnx itself crashed on the model,
not aotc's doing); failures are ``traceback``, ``multiline_error``, ``c_compile_error``,
``sanitizer``, ``mismatch``, ``crash``, ``hang`` and ``accepted_invalid`` (aotc built a library for a
model that onnxruntime or the onnx checker refuses).

Environment: ``AOTC_FUZZ_TREE`` makes the workers import aotc from another source tree (a snapshot of
a commit, say); ``AOTC_FUZZ_WORKER_MEMORY`` is each worker's address-space limit in bytes.
tests/test_fuzz.py runs a bounded campaign and replays tests/fuzz_corpus, where ``--save-corpus``
writes the smallest case of each new failure signature.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
FINE = ("ok", "clean_error", "unchecked", "nonfinite_mismatch", "ref_crash")
FAILURES = ("traceback", "multiline_error", "c_compile_error", "sanitizer", "mismatch", "crash", "hang",
            "accepted_invalid")
TAGGED = ("accepted_invalid", "mismatch", "crash", "hang")  # grouped by what the mutation did
# float-cast-overflow is undefined behaviour that gcc leaves out of -fsanitize=undefined (clang has it).
SANITIZE = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
            "-O1"]
# The worker's address-space limit: a compile-time structure that scales with a tensor's element count
# shows up as a MemoryError (a traceback) instead of taking the machine down.
WORKER_MEMORY = 6 << 30
RUN_LIMIT = 1 << 28  # bytes of workspace, inputs and outputs up to which a built library is run
WORKER_FILE_SIZE = 1 << 28  # and the largest file it (or the C compiler) may write: not a full disk
IR_VERSION = 10  # onnxruntime 1.31 reads IR versions up to 11
F = TensorProto.FLOAT


# ---------------------------------------------------------------------------------------------------
# Seed models: small, one feature each, all accepted by onnxruntime and onnx.checker.

def _model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray] | None = None,
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "seed", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def _vi(name: str, shape: list, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _w(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.5


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def seed_mlp_gemm() -> onnx.ModelProto:
    return _model([helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
                   helper.make_node("Relu", ["h"], ["r"]),
                   helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], alpha=0.5, beta=1.0)],
                  [_vi("x", [2, 8])], [_vi("y", [2, 4])],
                  {"w1": _w(6, 8), "b1": _w(6, seed=1), "w2": _w(6, 4, seed=2), "b2": _w(4, seed=3)})


def seed_matmul_add_relu() -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["x", "w"], ["xw"]),
                   helper.make_node("Add", ["xw", "b"], ["a"]),
                   helper.make_node("Relu", ["a"], ["y"])],
                  [_vi("x", [2, 3, 8])], [_vi("y", [2, 3, 5])], {"w": _w(8, 5), "b": _w(5, seed=1)})


def seed_conv_bn_relu_pool() -> onnx.ModelProto:
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                   helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["n"], epsilon=1e-5),
                   helper.make_node("Relu", ["n"], ["r"]),
                   helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                  [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 4, 4])],
                  {"w": _w(4, 3, 3, 3), "b": _w(4, seed=1), "s": _w(4, seed=2) + 1, "o": _w(4, seed=3),
                   "m": _w(4, seed=4), "v": np.abs(_w(4, seed=5)) + 0.5})


def seed_depthwise() -> onnx.ModelProto:
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], group=4, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                    strides=[1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [_vi("x", [1, 4, 6, 6])], [_vi("y", [1, 4, 6, 6])], {"w": _w(4, 1, 3, 3)})


def seed_conv1d_dilated() -> onnx.ModelProto:
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], dilations=[2], strides=[2],
                                    auto_pad="NOTSET")],
                  [_vi("x", [1, 2, 11])], [_vi("y", [1, 3, 4])], {"w": _w(3, 2, 3)})


def seed_avgpool() -> onnx.ModelProto:
    return _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1], count_include_pad=0)],
                  [_vi("x", [1, 2, 7, 7])], [_vi("y", [1, 2, 4, 4])])


def seed_pool1d() -> onnx.ModelProto:
    return _model([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3], pads=[1, 1]),
                   helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[2], strides=[2])],
                  [_vi("x", [1, 2, 9])], [_vi("y", [1, 2, 4])])


def seed_softmax() -> onnx.ModelProto:
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1),
                   helper.make_node("LogSoftmax", ["x"], ["z"], axis=1)],
                  [_vi("x", [3, 10])], [_vi("y", [3, 10]), _vi("z", [3, 10])])


def seed_layernorm() -> onnx.ModelProto:
    return _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
                  [_vi("x", [2, 4, 8])], [_vi("y", [2, 4, 8])], {"s": _w(8) + 1, "b": _w(8, seed=1)})


def seed_shape_ops() -> onnx.ModelProto:
    return _model([helper.make_node("Gather", ["x", "idx"], ["g"], axis=0),
                   helper.make_node("Concat", ["g", "x"], ["c"], axis=0),
                   helper.make_node("Reshape", ["c", "shape"], ["r"]),
                   helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
                   helper.make_node("Slice", ["t", "starts", "ends", "axes", "steps"], ["y"])],
                  [_vi("x", [4, 6])], [_vi("y", [2, 3, 2])],
                  {"idx": _i64(2, 0), "shape": _i64(3, 2, 6), "starts": _i64(0, 1), "ends": _i64(3, 5),
                   "axes": _i64(0, 2), "steps": _i64(1, 2)})


def seed_expand_tile() -> onnx.ModelProto:
    return _model([helper.make_node("Expand", ["x", "shape"], ["e"]),
                   helper.make_node("Tile", ["e", "reps"], ["t"]),
                   helper.make_node("Add", ["t", "t"], ["y"])],
                  [_vi("x", [1, 3])], [_vi("y", [4, 6])], {"shape": _i64(4, 3), "reps": _i64(1, 2)})


def seed_expand_softmax_reduce() -> onnx.ModelProto:
    return _model([helper.make_node("Expand", ["x", "shape"], ["e"]),
                   helper.make_node("Softmax", ["e"], ["s"], axis=-1),
                   helper.make_node("ReduceSum", ["s"], ["y"], keepdims=0)],
                  [_vi("x", [1])], [_vi("y", [])], {"shape": _i64(512)})


def seed_reduce() -> onnx.ModelProto:
    return _model([helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
                   helper.make_node("ReduceMax", ["x"], ["y"], axes=[2], keepdims=0)],
                  [_vi("x", [2, 3, 4])], [_vi("s", [2, 1, 4]), _vi("y", [2, 3])], {"axes": _i64(1)}, opset=17)


def seed_where_cast() -> onnx.ModelProto:
    return _model([helper.make_node("Greater", ["x", "zero"], ["pos"]),
                   helper.make_node("Where", ["pos", "x", "alt"], ["w"]),
                   helper.make_node("Cast", ["w"], ["i"], to=TensorProto.INT32),
                   helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)],
                  [_vi("x", [2, 5])], [_vi("y", [2, 5])],
                  {"zero": np.zeros((1,), np.float32), "alt": _w(5) * 4})


def seed_attention() -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["x", "wq"], ["q"]),
                   helper.make_node("MatMul", ["x", "wk"], ["k"]),
                   helper.make_node("MatMul", ["x", "wv"], ["v"]),
                   helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
                   helper.make_node("MatMul", ["q", "kt"], ["s"]),
                   helper.make_node("Div", ["s", "scale"], ["ss"]),
                   helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
                   helper.make_node("MatMul", ["p", "v"], ["y"])],
                  [_vi("x", [1, 4, 8])], [_vi("y", [1, 4, 8])],
                  {"wq": _w(8, 8), "wk": _w(8, 8, seed=1), "wv": _w(8, 8, seed=2),
                   "scale": np.array(np.sqrt(8.0), np.float32)})


def seed_batch_matmul_relu() -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["a", "b"], ["m"]),
                   helper.make_node("Relu", ["m"], ["y"])],
                  [_vi("a", [2, 1, 4, 8])], [_vi("y", [2, 3, 4, 5])], {"b": _w(1, 3, 8, 5)})


def seed_elementwise() -> onnx.ModelProto:
    return _model([helper.make_node("Sigmoid", ["x"], ["s"]),
                   helper.make_node("Mul", ["x", "s"], ["m"]),
                   helper.make_node("Tanh", ["m"], ["t"]),
                   helper.make_node("Sub", ["t", "c"], ["d"]),
                   helper.make_node("Clip", ["d", "lo", "hi"], ["y"])],
                  [_vi("x", [3, 1, 4])], [_vi("y", [3, 2, 4])],
                  {"c": _w(2, 1), "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)})


def seed_constant_reshape() -> onnx.ModelProto:
    shape = numpy_helper.from_array(_i64(2, -1), "shape_value")
    return _model([helper.make_node("Constant", [], ["shape"], value=shape),
                   helper.make_node("Reshape", ["x", "shape"], ["r"]),
                   helper.make_node("ReduceMean", ["r"], ["y"], axes=[1], keepdims=1)],
                  [_vi("x", [2, 3, 4])], [_vi("y", [2, 1])])


SEEDS: dict[str, Callable[[], onnx.ModelProto]] = {
    f.__name__.removeprefix("seed_"): f for f in (
        seed_mlp_gemm, seed_matmul_add_relu, seed_conv_bn_relu_pool, seed_depthwise, seed_conv1d_dilated,
        seed_avgpool, seed_pool1d, seed_softmax, seed_layernorm, seed_shape_ops, seed_expand_tile,
        seed_expand_softmax_reduce, seed_reduce, seed_where_cast, seed_attention, seed_batch_matmul_relu,
        seed_elementwise, seed_constant_reshape)}


# ---------------------------------------------------------------------------------------------------
# Mutations: ``gen_*`` draws a spec from the model; ``build_model`` applies specs (each a no-op when the
# model no longer has what it names, so dropping one spec of several still replays).

BIG_INTS = [0, -1, -2, 1, 2, 3, 7, 2**20, 2**30, 2**31 - 1, 2**31, 2**32 + 1, 2**62, 2**62 + 512, 2**63 - 1,
            -(2**63), -(2**31)]
DIMS = [0, -1, -7, 1, 2, 5, 2**31, 2**32 + 3, 2**40, 2**62, 2**62 + 512, 2**63 - 1]
ELEM_TYPES = list(range(0, 27)) + [39, 100, 2**20]
HOSTILE_NAMES = ["NULL", "INFINITY", "NAN", "AOTC_HIDDEN", "M_H", "AOTC_M_H", "M_OK", "m_run", "m_workspace_size",
                 "M_WORKSPACE_BYTES", "aotc_math", "main", "int", "errno", "__LINE__", "*/", "/*", "a\nb", "a\rb",
                 '"', "\\", "'", "", "\x00", "a\x00b", "x y", "\u00fc\u00df", "\u202e", "1x", "%s%n", "??=", "#define",
                 "a" * 300, "in0", "out0", "t0"]
INVALID_UTF8 = [b"t\xff\xfe\xfdx1", b"a\xc3(bcd", b"\xed\xa0\x80zzz", b"\xc0\xafabc"]
ATTR_NAMES = ["auto_pad", "pads", "strides", "dilations", "kernel_shape", "group", "axis", "axes", "keepdims",
              "perm", "transA", "transB", "alpha", "beta", "epsilon", "ceil_mode", "count_include_pad",
              "storage_order", "to", "stash_type", "noop_with_empty_axes", "allowzero", "select_last_index"]
AUTO_PADS = ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "BOGUS", "", "same_upper", "VALID\x00"]
OPS = ["Relu", "Sigmoid", "Add", "MatMul", "Conv", "MaxPool", "Softmax", "Gemm", "Reshape", "Identity", "Neg",
       "NoSuchOp", "Gather", "Concat", "Transpose", "Expand", "Tile", "ReduceSum", "Where", "Cast", "Slice",
       "LayerNormalization", "BatchNormalization", "AveragePool", "Loop", "If", "Scan", "Dropout", "Split"]
DOMAINS = ["", "ai.onnx", "ai.onnx.ml", "com.microsoft", "bogus.domain", "ai.onnx.preview.training"]


def _value_infos(m: onnx.ModelProto) -> list[tuple[str, int]]:
    g = m.graph
    return ([("input", i) for i in range(len(g.input))] + [("output", i) for i in range(len(g.output))]
            + [("value_info", i) for i in range(len(g.value_info))])


def _get_vi(m: onnx.ModelProto, where: str, index: int) -> onnx.ValueInfoProto | None:
    seq = getattr(m.graph, where)
    return seq[index] if index < len(seq) else None


def _tensor_names(m: onnx.ModelProto) -> list[str]:
    names: list[str] = []
    for n in m.graph.node:
        names += list(n.input) + list(n.output)
    names += [v.name for v in m.graph.input] + [v.name for v in m.graph.output]
    names += [t.name for t in m.graph.initializer]
    return sorted({x for x in names if x})


def _pick_int(rng: random.Random, values: list[int]) -> int:
    return rng.choice(values) if rng.random() < 0.8 else rng.randint(-(2**20), 2**20)


def gen_dim(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    vis = _value_infos(m)
    if not vis:
        return None
    where, index = rng.choice(vis)
    vi = _get_vi(m, where, index)
    rank = len(vi.type.tensor_type.shape.dim) if vi.type.HasField("tensor_type") else 0
    action = rng.choice(["set", "set", "set", "param", "drop", "add", "no_shape"])
    spec = {"kind": "dim", "where": where, "index": index, "action": action, "dim": rng.randrange(max(rank, 1))}
    if action in ("set", "add"):
        spec["value"] = _pick_int(rng, DIMS)
    elif action == "param":
        spec["value"] = rng.choice(["N", "batch", "", "x y", "N"])
    return spec


def gen_elem_type(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    vis = _value_infos(m)
    if not vis:
        return None
    where, index = rng.choice(vis)
    return {"kind": "elem_type", "where": where, "index": index, "value": rng.choice(ELEM_TYPES)}


def _tensors(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers, then the tensors held by Constant nodes."""
    consts = [a.t for n in m.graph.node if n.op_type == "Constant" for a in n.attribute
              if a.type == onnx.AttributeProto.TENSOR]
    return list(m.graph.initializer) + consts


def gen_initializer(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    tensors = _tensors(m)
    if not tensors:
        return None
    index = rng.randrange(len(tensors))
    t = tensors[index]
    action = rng.choice(["dims", "dtype", "short_raw", "long_raw", "clear", "value", "value", "value",
                         "external", "to_typed", "empty"])
    spec: dict = {"kind": "init", "index": index, "action": action}
    if action == "dims":
        dims = list(t.dims)
        choice = rng.random()
        if choice < 0.3 or not dims:
            dims.append(rng.choice([0, 1, 2, 2**62]))
        elif choice < 0.5:
            dims.pop(rng.randrange(len(dims)))
        else:
            dims[rng.randrange(len(dims))] = _pick_int(rng, DIMS)
        spec["dims"] = dims
    elif action == "dtype":
        spec["value"] = rng.choice(ELEM_TYPES)
    elif action in ("short_raw", "long_raw"):
        spec["n"] = rng.choice([1, 2, 3, 4, 7, 8, 64])
    elif action == "value":
        n = int(np.prod(t.dims)) if t.dims else 1
        spec["pos"] = rng.randrange(max(n, 1))
        if t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
            spec["value"] = rng.choice(["nan", "inf", "-inf", 0.0, -1.0, 1e30, -3.4e38, 1e-40])
        else:
            spec["value"] = _pick_int(rng, BIG_INTS)
    elif action == "external":
        spec["location"] = rng.choice(["nowhere.bin", "model.onnx", "../model.onnx", "/dev/zero", "", "sub/x.bin"])
        spec["offset"] = rng.choice([None, 0, 7, 2**40, -1])
        spec["length"] = rng.choice([None, 0, 3, 16, 2**40])
    return spec


def _attr_value(rng: random.Random, a: onnx.AttributeProto | None, name: str) -> tuple[str, object]:
    """A new (type, value) for an attribute: mostly the same type with a hostile value, sometimes a
    wrong type."""
    kinds = ["INT", "INTS", "FLOAT", "FLOATS", "STRING", "STRINGS", "TENSOR", "EMPTY_INTS"]
    same = {onnx.AttributeProto.INT: "INT", onnx.AttributeProto.INTS: "INTS", onnx.AttributeProto.FLOAT: "FLOAT",
            onnx.AttributeProto.FLOATS: "FLOATS", onnx.AttributeProto.STRING: "STRING"}.get(a.type) if a else None
    kind = same if same and rng.random() < 0.65 else rng.choice(kinds)
    if name == "auto_pad" and rng.random() < 0.7:
        return "STRING", rng.choice(AUTO_PADS)
    if kind == "INT":
        return kind, _pick_int(rng, BIG_INTS)
    if kind == "INTS":
        old = list(a.ints) if a is not None and a.type == onnx.AttributeProto.INTS else [1, 1]
        r = rng.random()
        if r < 0.6 and old:
            old[rng.randrange(len(old))] = _pick_int(rng, BIG_INTS)
        elif r < 0.8:
            old = old[: rng.randrange(len(old) + 1)]
        else:
            old = old + [_pick_int(rng, BIG_INTS) for _ in range(rng.randint(1, 3))]
        return kind, old
    if kind == "FLOAT":
        return kind, rng.choice(["nan", "inf", -1.0, 0.0, 2.5, 1e30])
    if kind == "FLOATS":
        return kind, [rng.choice([1.0, 2.5, -1.0, "nan"]) for _ in range(rng.randint(0, 4))]
    if kind == "STRING":
        return kind, rng.choice(["", "abc", "NOTSET", "1", "*/"])
    if kind == "STRINGS":
        return kind, ["a", "b"]
    if kind == "TENSOR":
        return kind, [1, 2]
    return "INTS", []


def gen_attr(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    nodes = m.graph.node
    if not nodes:
        return None
    ni = rng.randrange(len(nodes))
    node = nodes[ni]
    attrs = {a.name: a for a in node.attribute}
    r = rng.random()
    if attrs and r < 0.6:
        name = rng.choice(sorted(attrs))
    elif r < 0.85:
        name = rng.choice(ATTR_NAMES)
    else:
        name = rng.choice(["bogus", "Pads", "kernel_shape ", "_domain_opset", "_internal"])
    action = rng.choice(["set"] * 6 + ["drop", "dup"]) if name in attrs else "set"
    spec = {"kind": "attr", "node": ni, "name": name, "action": action}
    if action == "set":
        spec["type"], spec["value"] = _attr_value(rng, attrs.get(name), name)
    return spec


WINDOW_OPS = ("Conv", "MaxPool", "AveragePool", "ConvTranspose", "LpPool")
EDGE_INTS = [-1, -1, -2, 0, 0, 1, 2, 3, 4, 5, 9, 2**31 - 1, 2**62, -(2**31)]


def gen_window_attr(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    """Conv/pool window attributes with values of the right length but out of range (negative or zero
    pads, strides, dilations, kernel sizes; pads as large as the kernel; group not dividing channels)."""
    nodes = [i for i, n in enumerate(m.graph.node) if n.op_type in WINDOW_OPS]
    if not nodes:
        return None
    ni = rng.choice(nodes)
    node = m.graph.node[ni]
    attrs = {a.name: a for a in node.attribute}
    rank = max(len(attrs["kernel_shape"].ints), 1) if "kernel_shape" in attrs else 2
    name = rng.choice(["pads", "pads", "strides", "dilations", "kernel_shape", "group", "auto_pad"])
    if name == "auto_pad":
        return {"kind": "attr", "node": ni, "name": name, "action": "set", "type": "STRING",
                "value": rng.choice(AUTO_PADS)}
    if name == "group":
        return {"kind": "attr", "node": ni, "name": name, "action": "set", "type": "INT",
                "value": rng.choice([0, -1, 3, 5, 2**31])}
    n = 2 * rank if name == "pads" else rank
    old = list(attrs[name].ints) if name in attrs and len(attrs[name].ints) == n else [0 if name == "pads" else 1] * n
    for k in rng.sample(range(n), rng.randint(1, n)):
        old[k] = rng.choice(EDGE_INTS)
    return {"kind": "attr", "node": ni, "name": name, "action": "set", "type": "INTS", "value": old}


def gen_node(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    nodes = m.graph.node
    if not nodes:
        return None
    ni = rng.randrange(len(nodes))
    node = nodes[ni]
    names = _tensor_names(m)
    action = rng.choice(["drop_input", "dup_input", "swap_inputs", "extra_input", "empty_input", "rename_input",
                         "extra_output", "drop_output", "empty_output", "dup_output_name", "op_type", "domain",
                         "cycle", "drop_node", "dup_node", "swap_nodes", "clear_name"])
    spec: dict = {"kind": "node", "node": ni, "action": action,
                  "pos": rng.randrange(max(len(node.input), 1)), "pos2": rng.randrange(max(len(node.input), 1))}
    if action in ("extra_input", "rename_input"):
        spec["name"] = rng.choice(names + ["ghost", ""])
    elif action == "extra_output":
        spec["name"] = rng.choice(["extra_out", *names])
    elif action == "dup_output_name":
        spec["name"] = rng.choice(names)
    elif action == "op_type":
        spec["op"] = rng.choice(OPS)
    elif action == "domain":
        spec["domain"] = rng.choice(DOMAINS)
    elif action in ("cycle", "swap_nodes"):
        spec["other"] = rng.randrange(len(nodes))
    return spec


def gen_graph_io(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    which = rng.choice(["input", "output"])
    action = rng.choice(["drop", "dup", "swap", "extra", "rename", "clear"])
    n = len(getattr(m.graph, which))
    return {"kind": "graph_io", "which": which, "action": action, "index": rng.randrange(max(n, 1)),
            "other": rng.randrange(max(n, 1)), "name": rng.choice(_tensor_names(m) + ["ghost", "extra"])}


def gen_rename(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    names = _tensor_names(m)
    target = rng.choice(["tensor"] * 4 + ["node", "graph"])
    spec: dict = {"kind": "rename", "target": target,
                  "old": rng.choice(names) if names else "", "node": rng.randrange(max(len(m.graph.node), 1))}
    if rng.random() < 0.2:
        spec["new_hex"] = rng.choice(INVALID_UTF8).hex()
    else:
        spec["new"] = rng.choice(HOSTILE_NAMES + names)
    return spec


def gen_opset(m: onnx.ModelProto, rng: random.Random) -> dict | None:
    action = rng.choice(["set", "set", "remove", "add", "dup", "ai_onnx", "ir_version"])
    spec: dict = {"kind": "opset", "action": action}
    if action in ("set", "add", "dup"):
        spec["version"] = rng.choice([0, 1, 5, 6, 7, 11, 13, 18, 21, 23, 24, 99, -1, 2**40])
        spec["domain"] = rng.choice(DOMAINS[2:]) if action == "add" else ""
    elif action == "ir_version":
        spec["version"] = rng.choice([0, 1, 3, 7, 12, 99, -1])
    return spec


def gen_bytes(m: onnx.ModelProto, rng: random.Random, size: int) -> dict:
    action = rng.choice(["flip", "flip", "flip", "set", "truncate", "insert", "delete"])
    spec: dict = {"kind": "bytes", "action": action}
    if action == "truncate":
        spec["length"] = rng.randrange(size)
    elif action in ("flip", "set"):
        k = rng.randint(1, 4)
        spec["pos"] = [rng.randrange(size) for _ in range(k)]
        spec["val"] = [rng.randrange(1, 256) for _ in range(k)]
    else:
        spec["pos"] = rng.randrange(size)
        spec["n"] = rng.randint(1, 8)
        spec["val"] = [rng.randrange(256) for _ in range(spec["n"])]
    return spec


GENERATORS: list[tuple[float, Callable[[onnx.ModelProto, random.Random], dict | None]]] = [
    (3, gen_attr), (4, gen_window_attr), (2, gen_dim), (1, gen_elem_type), (3, gen_initializer), (2, gen_node),
    (1, gen_graph_io), (1, gen_rename), (1, gen_opset)]


def _float(v: object) -> float:
    return float(v) if not isinstance(v, str) else float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[v])


def _apply_dim(m: onnx.ModelProto, s: dict) -> None:
    vi = _get_vi(m, s["where"], s["index"])
    if vi is None:
        return
    shape = vi.type.tensor_type.shape
    if s["action"] == "no_shape":
        vi.type.tensor_type.ClearField("shape")
        return
    dims = shape.dim
    if s["action"] == "add":
        d = dims.add()
        d.dim_value = s["value"] if -(2**63) <= s["value"] < 2**63 else 2**62
        return
    if s["dim"] >= len(dims):
        return
    d = dims[s["dim"]]
    if s["action"] == "drop":
        del dims[s["dim"]]
    elif s["action"] == "param":
        d.dim_param = s["value"]
    else:
        d.dim_value = s["value"]


def _apply_init(m: onnx.ModelProto, s: dict) -> None:
    tensors = _tensors(m)
    if s["index"] >= len(tensors):
        return
    t = tensors[s["index"]]
    a = s["action"]
    if t.data_location == TensorProto.EXTERNAL and a in ("empty", "short_raw", "long_raw", "to_typed", "value"):
        return  # its data is not here (reading it could mean reading /dev/zero)
    if a == "empty":
        dims = list(t.dims) or [1]
        dims[0] = 0
        t.CopyFrom(numpy_helper.from_array(np.zeros(dims, helper.tensor_dtype_to_np_dtype(t.data_type)), t.name))
    elif a == "dims":
        del t.dims[:]
        t.dims.extend(s["dims"])
    elif a == "dtype":
        t.data_type = s["value"]
    elif a in ("short_raw", "long_raw", "clear", "to_typed"):
        arr = numpy_helper.to_array(t) if t.data_type != 0 else None
        if a == "to_typed" and arr is not None:
            t.ClearField("raw_data")
            if arr.dtype == np.float32:
                t.float_data.extend(arr.ravel().tolist())
            elif arr.dtype == np.int64:
                t.int64_data.extend(arr.ravel().tolist())
            return
        raw = t.raw_data
        if a == "short_raw":
            t.raw_data = raw[: max(len(raw) - s["n"], 0)]
        elif a == "long_raw":
            t.raw_data = raw + bytes(s["n"])
        else:
            for f in ("raw_data", "float_data", "int64_data", "int32_data", "double_data"):
                t.ClearField(f)
    elif a == "value":
        try:
            arr = numpy_helper.to_array(t).copy()
        except Exception:
            return
        if arr.size == 0:
            return
        flat = arr.reshape(-1)
        v = s["value"]
        if arr.dtype.kind == "f":
            flat[s["pos"] % arr.size] = _float(v)
        elif arr.dtype.kind in "iu":
            info = np.iinfo(arr.dtype)
            flat[s["pos"] % arr.size] = int(np.clip(int(_float(v)) if isinstance(v, str) else v, info.min, info.max))
        else:
            return
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
    elif a == "external":
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        entries = {"location": s["location"], "offset": s["offset"], "length": s["length"]}
        for k, v in entries.items():
            if v is not None:
                e = t.external_data.add()
                e.key, e.value = k, str(v)
        t.ClearField("raw_data")


def _set_attr(node: onnx.NodeProto, name: str, kind: str, value: object) -> None:
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    a = node.attribute.add()
    a.name = name
    if kind == "INT":
        a.type, a.i = onnx.AttributeProto.INT, max(-(2**63), min(int(value), 2**63 - 1))
    elif kind == "INTS":
        a.type = onnx.AttributeProto.INTS
        a.ints.extend(max(-(2**63), min(int(v), 2**63 - 1)) for v in value)
    elif kind == "FLOAT":
        a.type, a.f = onnx.AttributeProto.FLOAT, _float(value)
    elif kind == "FLOATS":
        a.type = onnx.AttributeProto.FLOATS
        a.floats.extend(_float(v) for v in value)
    elif kind == "STRING":
        a.type, a.s = onnx.AttributeProto.STRING, str(value).encode()
    elif kind == "STRINGS":
        a.type = onnx.AttributeProto.STRINGS
        a.strings.extend(str(v).encode() for v in value)
    elif kind == "TENSOR":
        a.type = onnx.AttributeProto.TENSOR
        a.t.CopyFrom(numpy_helper.from_array(np.array(value, np.int64)))


def _apply_attr(m: onnx.ModelProto, s: dict) -> None:
    if s["node"] >= len(m.graph.node):
        return
    node = m.graph.node[s["node"]]
    if s["action"] == "set":
        _set_attr(node, s["name"], s["type"], s["value"])
        return
    found = [a for a in node.attribute if a.name == s["name"]]
    if not found:
        return
    if s["action"] == "drop":
        keep = [a for a in node.attribute if a.name != s["name"]]
        del node.attribute[:]
        node.attribute.extend(keep)
    else:
        node.attribute.append(copy.deepcopy(found[0]))


def _apply_node(m: onnx.ModelProto, s: dict) -> None:
    nodes = m.graph.node
    if s["node"] >= len(nodes):
        return
    node = nodes[s["node"]]
    a, pos = s["action"], s["pos"]
    ins = node.input
    if a == "drop_input" and pos < len(ins):
        del ins[pos]
    elif a == "dup_input" and pos < len(ins):
        ins.append(ins[pos])
    elif a == "swap_inputs" and max(pos, s["pos2"]) < len(ins):
        ins[pos], ins[s["pos2"]] = ins[s["pos2"]], ins[pos]
    elif a == "extra_input":
        ins.append(s["name"])
    elif a == "empty_input" and pos < len(ins):
        ins[pos] = ""
    elif a == "rename_input" and pos < len(ins):
        ins[pos] = s["name"]
    elif a == "extra_output":
        node.output.append(s["name"])
    elif a == "drop_output" and node.output:
        del node.output[-1]
    elif a == "empty_output" and node.output:
        node.output[0] = ""
    elif a == "dup_output_name" and node.output:
        node.output[0] = s["name"]
    elif a == "op_type":
        node.op_type = s["op"]
    elif a == "domain":
        node.domain = s["domain"]
    elif a == "cycle" and s["other"] < len(nodes) and nodes[s["other"]].output and ins:
        ins[pos % len(ins)] = nodes[s["other"]].output[0]
    elif a == "drop_node":
        del nodes[s["node"]]
    elif a == "dup_node":
        nodes.insert(s["node"] + 1, copy.deepcopy(node))
    elif a == "swap_nodes" and s["other"] < len(nodes):
        a_copy, b_copy = copy.deepcopy(node), copy.deepcopy(nodes[s["other"]])
        nodes[s["node"]].CopyFrom(b_copy)
        nodes[s["other"]].CopyFrom(a_copy)
    elif a == "clear_name":
        node.name = ""


def _apply_graph_io(m: onnx.ModelProto, s: dict) -> None:
    seq = getattr(m.graph, s["which"])
    i, a = s["index"], s["action"]
    if a == "extra":
        seq.append(helper.make_tensor_value_info(s["name"], F, [2]))
        return
    if i >= len(seq):
        return
    if a == "drop":
        del seq[i]
    elif a == "dup":
        seq.append(copy.deepcopy(seq[i]))
    elif a == "swap" and s["other"] < len(seq):
        x, y = copy.deepcopy(seq[i]), copy.deepcopy(seq[s["other"]])
        seq[i].CopyFrom(y)
        seq[s["other"]].CopyFrom(x)
    elif a == "rename":
        seq[i].name = s["name"]
    elif a == "clear":
        seq[i].ClearField("type")


def _rename_tensor(m: onnx.ModelProto, old: str, new: str) -> None:
    g = m.graph
    for n in g.node:
        for seq in (n.input, n.output):
            for k, x in enumerate(seq):
                if x == old:
                    seq[k] = new
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.name == old:
            vi.name = new
    for t in g.initializer:
        if t.name == old:
            t.name = new


def _apply_rename(m: onnx.ModelProto, s: dict, subs: list[tuple[bytes, bytes]]) -> None:
    if "new_hex" in s:  # protobuf's Python API refuses invalid UTF-8: a placeholder is swapped in bytes
        raw = bytes.fromhex(s["new_hex"])
        new = f"\x7fPH{len(subs)}".ljust(len(raw), "q")
        subs.append((new.encode(), raw))
    else:
        new = s["new"]
    if s["target"] == "tensor":
        if s["old"]:
            _rename_tensor(m, s["old"], new)
    elif s["target"] == "node":
        if s["node"] < len(m.graph.node):
            m.graph.node[s["node"]].name = new
    else:
        m.graph.name = new


def _apply_opset(m: onnx.ModelProto, s: dict) -> None:
    a = s["action"]
    imports = m.opset_import
    if a == "set":
        for imp in imports:
            if imp.domain in ("", "ai.onnx"):
                imp.version = max(-(2**63), min(s["version"], 2**63 - 1))
    elif a == "remove":
        del imports[:]
    elif a in ("add", "dup"):
        imports.append(helper.make_opsetid(s["domain"], max(-(2**63), min(s["version"], 2**63 - 1))))
    elif a == "ai_onnx":
        for imp in imports:
            if imp.domain == "":
                imp.domain = "ai.onnx"
    elif a == "ir_version":
        m.ir_version = s["version"]


def _apply_bytes(data: bytes, s: dict) -> bytes:
    if not data:
        return data
    a = s["action"]
    if a == "truncate":
        return data[: s["length"] % len(data)]
    if a in ("flip", "set"):
        buf = bytearray(data)
        for p, v in zip(s["pos"], s["val"], strict=True):
            buf[p % len(buf)] = (buf[p % len(buf)] ^ v) if a == "flip" else v
        return bytes(buf)
    p = s["pos"] % len(data)
    if a == "insert":
        return data[:p] + bytes(s["val"]) + data[p:]
    return data[:p] + data[p + s["n"]:]


def build_model(seed_name: str, specs: list[dict]) -> bytes:
    """The serialized model: the seed with ``specs`` applied in order (byte-level specs last)."""
    m = SEEDS[seed_name]()
    subs: list[tuple[bytes, bytes]] = []
    for s in specs:
        try:
            _apply_proto_spec(m, s, subs)
        except Exception:  # the spec does not fit this model (an earlier one emptied a tensor, ...): a no-op
            pass
    data = m.SerializeToString()
    for placeholder, raw in subs:
        data = data.replace(placeholder, raw)
    for s in specs:
        if s["kind"] == "bytes":
            data = _apply_bytes(data, s)
    return data


def _apply_elem_type(m: onnx.ModelProto, s: dict) -> None:
    vi = _get_vi(m, s["where"], s["index"])
    if vi is not None:
        vi.type.tensor_type.elem_type = s["value"]


def _apply_proto_spec(m: onnx.ModelProto, s: dict, subs: list[tuple[bytes, bytes]]) -> None:
    if s["kind"] == "rename":
        _apply_rename(m, s, subs)
    elif s["kind"] != "bytes":
        APPLY[s["kind"]](m, s)


APPLY: dict[str, Callable[[onnx.ModelProto, dict], None]] = {
    "dim": _apply_dim, "elem_type": _apply_elem_type, "init": _apply_init, "attr": _apply_attr,
    "node": _apply_node, "graph_io": _apply_graph_io, "opset": _apply_opset}


@dataclass
class Case:
    id: str
    seed_model: str
    specs: list[dict]
    data: bytes = b""

    def describe(self) -> str:
        return f"{self.seed_model}: " + "; ".join(describe_spec(s) for s in self.specs)


def describe_spec(s: dict) -> str:
    rest = ", ".join(f"{k}={v!r}" for k, v in s.items() if k != "kind")
    return f"{s['kind']}({rest})"


def make_case(seed: int, index: int) -> Case:
    """Case ``index`` of campaign ``seed``: the same model on every run and every machine."""
    rng = random.Random(f"{seed}:{index}")
    seed_name = rng.choice(sorted(SEEDS))
    m = SEEDS[seed_name]()
    specs: list[dict] = []
    r = rng.random()
    n_proto = 0 if r < 0.1 else 1 if r < 0.7 else 2 if r < 0.92 else 3
    weights = [w for w, _ in GENERATORS]
    gens = [g for _, g in GENERATORS]
    for _ in range(n_proto):
        for _try in range(5):  # a generator may not apply to this model (no conv, no initializer, ...)
            spec = rng.choices(gens, weights)[0](m, rng)
            if spec is not None:
                break
        if spec is None:
            continue
        specs.append(spec)
        m = onnx.ModelProto.FromString(build_model_proto(seed_name, specs))
    if n_proto == 0 or rng.random() < 0.05:
        specs.append(gen_bytes(m, rng, len(m.SerializeToString())))
    case = Case(f"{seed}:{index}", seed_name, specs)
    case.data = build_model(seed_name, specs)
    return case


def build_model_proto(seed_name: str, specs: list[dict]) -> bytes:
    """Like ``build_model`` but with valid UTF-8 kept, so later generators can parse the result."""
    return build_model(seed_name, [s for s in specs if "new_hex" not in s and s["kind"] != "bytes"])


# ---------------------------------------------------------------------------------------------------
# The worker: one process, many cases. Protocol: JSON lines on stdin; JSON lines on a private copy of
# stdout ({"stage": ...} as it goes, then {"result": ...}); fd 1 itself goes to stderr so that a
# library printing to stdout cannot corrupt the protocol.

def _innermost_aotc_frame(tb: traceback.StackSummary) -> str:
    for fr in reversed(tb):
        p = Path(fr.filename)
        if "aotc" in p.parts and "tools" not in p.parts:
            i = len(p.parts) - 1 - list(reversed(p.parts)).index("aotc")
            return f"{'/'.join(p.parts[i:])}:{fr.name}:{fr.lineno}"
    return "<outside aotc>"


def _first_error_line(text: str) -> str:
    """The compiler's or linker's first error (the linker's own complaint rather than collect2's)."""
    lines = [ln.strip() for ln in text.splitlines() if not ln.startswith("FAILED:")]
    for pattern in (r": error: ", r"undefined reference|relocation truncated|multiple definition|ld: ", r"error"):
        for line in lines:
            if re.search(pattern, line) and not line.startswith("collect2"):
                return line[:300]
    return next((ln for ln in lines if "error" in ln), lines[-1] if lines else "")[:300]


# onnx.checker refusals that aotc deliberately accepts, as onnxruntime does (README: graph inputs and
# outputs without a shape or type, a node domain spelled ai.onnx, opset imports of unused domains).
CHECKER_EXCEPTIONS = (r"Field 'shape' of 'type' is required but missing",
                      r"Field 'type' of 'value_info' is required but missing",
                      r"No opset import for domain 'ai\.onnx'",
                      r"Field 'name' of 'graph' is required to be non-empty",
                      r"in initializer but not in graph input")


def checker_exception(message: str, path: Path) -> bool:
    """Whether an onnx.checker refusal is one of aotc's deliberate exceptions."""
    if any(re.search(p, message) for p in CHECKER_EXCEPTIONS):
        return True
    if re.search(r"Opset import version -?\d+ is out of supported range", message):
        m = onnx.load(str(path), load_external_data=False)
        used = {n.domain or "" for n in m.graph.node} | {""}
        return all(i.domain not in used for i in m.opset_import if not 0 < i.version < 2**31)
    return False


def _validity(path: Path) -> dict:
    """What onnxruntime and onnx.checker say about the model file (None: accepted). The checker runs
    without shape inference: onnxruntime too loads models whose declared shapes contradict it."""
    out: dict = {}
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        out["ort"] = None
    except Exception as e:
        msg = str(e).replace("\n", " ")[:400]
        # A missing kernel is onnxruntime's gap, not an invalid model.
        out["ort"] = None if "NOT_IMPLEMENTED" in msg or "Could not find an implementation" in msg else msg
    try:
        onnx.checker.check_model(str(path))
        out["checker"] = None
    except Exception as e:
        out["checker"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
        if out["ort"] is None and checker_exception(out["checker"], path):
            out["checker_excepted"], out["checker"] = out["checker"], None
        return out
    try:  # for the report only: onnxruntime accepts declared shapes that contradict inference
        model = onnx.load(str(path), load_external_data=False)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        out["shape_inference"] = None
    except Exception as e:
        out["shape_inference"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
    return out


def _compile(path: Path, out_dir: Path, **kw) -> dict | None:
    """Compiles the model with the sanitizers; None when it built, else the outcome. An error raised
    while computing the generated test's expected outputs is marked ``reference_failed``: it says
    nothing about whether aotc accepts the model."""
    from aotc.compiler import compile_model
    from aotc.errors import AotcError, BuildError

    try:
        compile_model(str(path), out_dir, "m", extra_cflags=SANITIZE, **kw)
        return None
    except BuildError as e:
        text = str(e)
        log = re.search(r"full output in (\S+)", text)
        output = Path(log.group(1)).read_text(errors="replace") if log and Path(log.group(1)).is_file() else text
        return {"outcome": "c_compile_error", "message": text[:600], "output": output[-3000:],
                "signature": "c_compile_error: " + _normalize(_first_error_line(output))}
    except BaseException as e:  # noqa: B036 - RecursionError, MemoryError, KeyboardInterrupt from aotc are bugs too
        tb = traceback.extract_tb(e.__traceback__)
        frame = _innermost_aotc_frame(tb)
        text = str(e)
        res: dict = {"reference_failed": "aotc/reference.py" in frame}
        if isinstance(e, AotcError) and ("\n" in text.strip() or not text.strip()):
            first = _normalize(text.splitlines()[0] if text else "")
            res.update(outcome="multiline_error", message=text[:600],
                       signature=f"multiline_error: {type(e).__name__}: {first}")
        elif isinstance(e, AotcError):
            res.update(outcome="clean_error", message=text[:300])
        else:
            res.update(outcome="traceback", message=f"{type(e).__name__}: {text}"[:400], frame=frame,
                       signature=f"traceback: {type(e).__name__} at {frame.rsplit(':', 1)[0]}",
                       traceback="".join(traceback.format_list(tb[-8:]))[-3000:])
        return res


def run_case_in_worker(path: Path, out_dir: Path, test_timeout: float, emit: Callable[[dict], None]) -> dict:
    emit({"stage": "compile"})
    res = _compile(path, out_dir, gen_test=True)
    if res is None:
        emit({"stage": "test"})
        res = _too_big_to_run(out_dir) or _run_test(out_dir / "m_test", test_timeout)
        if res["outcome"] == "mismatch" and _nonfinite_only(path, res.get("output", "")):
            res.update(outcome="nonfinite_mismatch", signature="nonfinite_mismatch")
    elif res.get("reference_failed"):
        # No expected outputs, but the library may still be unsafe: build it with the benchmark
        # program instead (it needs no reference) and run that once under ASan/UBSan.
        emit({"stage": "benchmark"})
        bench = out_dir.with_name("bench")
        built = _compile(path, bench, gen_benchmark=True)
        ran = built or _too_big_to_run(bench) or _run_test(bench / "m_benchmark", test_timeout, ["-n", "1", "-w", "0"])
        if ran["outcome"] not in ("ok", "mismatch", "unchecked"):  # mismatch: a nonzero status (random indices)
            res = {**ran, "reference_error": res["message"]}
        elif res["outcome"] == "clean_error":
            res = {"outcome": "unchecked", "message": res["message"]}
    elif res["outcome"] == "clean_error":
        return res
    emit({"stage": "validity"})
    res["validity"] = v = _validity(path)
    if (v["ort"] or v["checker"]) and (res["outcome"] in ("ok", "unchecked") or res.get("reference_failed")):
        # aotc compiled a model that onnxruntime or onnx refuses: it must refuse it too.
        who = "" if v["ort"] and v["checker"] else " (onnxruntime only)" if v["ort"] else " (onnx.checker only)"
        res.update(found_as=res["outcome"], outcome="accepted_invalid", signature="accepted_invalid" + who)
    return res


def _too_big_to_run(out_dir: Path) -> dict | None:
    """An outcome for a library whose buffers are too large to run under ASan in a few seconds (a
    valid model may have a tensor of 2^31 elements), else None."""
    meta = json.loads((out_dir / "m.json").read_text())
    total = int(meta.get("workspace_bytes", 0))
    for t in meta.get("inputs", []) + meta.get("outputs", []):
        try:
            item = np.dtype(t["dtype"]).itemsize
        except TypeError:
            item = 8
        total += item * int(np.prod(t["shape"], dtype=object))
    if total <= RUN_LIMIT:
        return None
    return {"outcome": "unchecked", "message": f"not run: its buffers take {total} bytes"}


def _nonfinite_only(path: Path, output: str) -> bool:
    """Whether a mismatch is one of non-finite arithmetic: the model holds a NaN or infinite constant and
    every mismatch the test printed has a NaN or an infinity on one side. Where NaN and infinity spread
    through padding, folded BatchNorms or Winograd transforms is not fixed by ONNX (onnxruntime's
    optimized and unoptimized sessions disagree there too), so these are counted apart, not failed."""
    pairs = re.findall(r"got (\S+), expected (\S+)", output)
    if not pairs or not all(any(re.search(r"nan|inf", v, re.I) for v in pair) for pair in pairs):
        return False
    m = onnx.load(str(path), load_external_data=False)
    tensors = list(m.graph.initializer) + [a.t for n in m.graph.node for a in n.attribute
                                           if a.type == onnx.AttributeProto.TENSOR]
    for t in tensors:
        try:
            arr = numpy_helper.to_array(t)
        except Exception:  # a tensor onnx cannot read: aotc refused it or had to
            continue
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return True
    return False


def _normalize(text: str) -> str:
    """A message without its variable parts (numbers, paths, addresses), for grouping."""
    text = re.sub(r"0x[0-9a-fA-F]+", "ADDR", text)
    text = re.sub(r"/[^\s:'\"]*/", "", text)
    text = re.sub(r"\d+", "N", text)
    text = re.sub(r"runtime error: \S+ is outside", "runtime error: VALUE is outside", text)
    return text[:200]


def _run_test(exe: Path, timeout: float, args: list[str] | None = None) -> dict:
    """Runs a generated program under the sanitizers: NAME_test, or with ``args`` NAME_benchmark."""
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:allocator_may_return_null=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")

    def unlimited() -> None:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))  # ASan reserves terabytes of shadow space

    try:
        p = subprocess.run([str(exe), *(args or [])], capture_output=True, text=True, errors="replace",
                           timeout=timeout, env=env, preexec_fn=unlimited, cwd=exe.parent)
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "message": f"{exe.name} ran over {timeout:.0f} s", "signature": f"hang: {exe.name}"}
    out = p.stdout + p.stderr
    san = re.search(r"(ERROR: AddressSanitizer: \S+|runtime error: [^\n]*|UndefinedBehaviorSanitizer: \S+)", out)
    if san:
        frame = re.search(r"#\d+ 0x[0-9a-f]+ in (\S+)", out[san.start():])
        where = frame.group(1) if frame else "?"
        return {"outcome": "sanitizer", "message": san.group(1)[:300], "output": out[-3000:],
                "signature": f"sanitizer: {_normalize(san.group(1))} in {_normalize(where)}"}
    if p.returncode < 0:
        return {"outcome": "crash", "message": f"{exe.name} died of signal {-p.returncode}", "output": out[-3000:],
                "signature": f"crash: {exe.name} signal {-p.returncode}"}
    if p.returncode == 0 and (args is not None or "m_test: PASSED" in p.stdout):
        return {"outcome": "ok"}
    status = re.search(r"FAIL m_run\w* returned (-?\d+)", p.stdout)
    sig = f"mismatch: m_run returned {status.group(1)}" if status else "mismatch: outputs differ"
    return {"outcome": "mismatch", "message": (p.stdout.strip().splitlines() or ["?"])[-1][:300],
            "output": out[-3000:], "signature": sig}


def worker_main() -> None:
    import faulthandler
    import resource

    faulthandler.enable()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = int(os.environ.get("AOTC_FUZZ_WORKER_MEMORY", WORKER_MEMORY))
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)  # a generated file that scales with a tensor
    resource.setrlimit(resource.RLIMIT_FSIZE, (WORKER_FILE_SIZE if hard == resource.RLIM_INFINITY
                                               else min(WORKER_FILE_SIZE, hard), hard))
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import onnxruntime  # noqa: F401

    import aotc.compiler  # noqa: F401 - imported once for all cases

    def emit(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    emit({"ready": True})
    for line in sys.stdin:
        job = json.loads(line)
        path = Path(job["path"])
        if job.get("validity_only"):
            emit({"result": _validity(path)})
            continue
        res = run_case_in_worker(path, path.parent / "out", job["test_timeout"], emit)
        emit({"result": res})


# ---------------------------------------------------------------------------------------------------
# The driver: a pool of workers, one case each at a time.

@dataclass
class Worker:
    proc: subprocess.Popen
    buf: bytes = b""
    job: dict | None = None
    started: float = 0.0
    stage: str = ""
    stderr_path: Path | None = None
    ready: bool = False


@dataclass
class Result:
    case_id: str
    outcome: str
    seconds: float
    info: dict = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)

    @property
    def base_signature(self) -> str:
        """What the worker saw: exception type and innermost aotc frame, sanitizer report, ..."""
        return self.info.get("signature") or self.outcome

    @property
    def signature(self) -> str:
        """The base signature, plus the mutations for outcomes that have no code location."""
        if self.outcome in TAGGED and self.tags:
            return f"{self.base_signature} [{' + '.join(self.tags)}]"
        return self.base_signature


class Pool:
    """``jobs`` worker processes; ``run`` hands each a job (a model file) and yields the answers as they come."""

    def __init__(self, jobs: int, workdir: Path, case_timeout: float, test_timeout: float) -> None:
        self.jobs, self.workdir = jobs, workdir
        self.case_timeout, self.test_timeout = case_timeout, test_timeout
        self.sel = selectors.DefaultSelector()
        self.workers: list[Worker] = []
        for k in range(jobs):
            self.workers.append(self._start(k))

    def _start(self, k: int) -> Worker:
        err = self.workdir / f"worker{k}.stderr"
        env = dict(os.environ)
        tree = os.environ.get("AOTC_FUZZ_TREE")  # another aotc source tree to test (default: `import aotc`)
        if tree:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
        with open(err, "wb") as f:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=f, start_new_session=True, env=env)
        w = Worker(proc, stderr_path=err)
        os.set_blocking(proc.stdout.fileno(), False)
        self.sel.register(proc.stdout, selectors.EVENT_READ, w)
        return w

    def _restart(self, w: Worker) -> Worker:
        self.sel.unregister(w.proc.stdout)
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        w.proc.wait()
        w.proc.stdout.close()
        w.proc.stdin.close()
        k = self.workers.index(w)
        self.workers[k] = self._start(k)
        return self.workers[k]

    def close(self) -> None:
        for w in self.workers:
            try:
                w.proc.stdin.close()
                os.killpg(w.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, BrokenPipeError, OSError):
                pass
            w.proc.wait()
        self.sel.close()

    def run(self, jobs: Iterable[dict]) -> Iterable[tuple[dict, dict]]:
        """Yields (job, answer): answer is the worker's result, or {"outcome": "crash"/"hang", ...}."""
        pending = iter(jobs)
        busy = 0
        exhausted = False
        while True:
            for w in self.workers:
                if w.job is None and not exhausted:
                    job = next(pending, None)
                    if job is None:
                        exhausted = True
                        break
                    self._send(w, job)
                    busy += 1
            if busy == 0:
                return
            for key, _ in self.sel.select(timeout=1.0):
                w = key.data
                try:
                    chunk = os.read(w.proc.stdout.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk and not w.ready:
                    tail = w.stderr_path.read_bytes()[-2000:].decode("utf-8", "replace") if w.stderr_path else ""
                    raise RuntimeError(f"a fuzz worker failed to start:\n{tail}")
                if not chunk:  # the worker died
                    if w.job is not None:
                        busy -= 1
                        yield w.job, self._death(w, "crash")
                    self._restart(w)
                    continue
                w.buf += chunk
                while b"\n" in w.buf:
                    line, w.buf = w.buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if "ready" in msg:
                        w.ready = True
                    elif "stage" in msg:
                        w.stage = msg["stage"]
                    elif "result" in msg and w.job is not None:
                        job, w.job = w.job, None
                        busy -= 1
                        yield job, msg["result"]
            now = time.monotonic()
            for w in list(self.workers):
                if w.job is not None and now - w.started > self.case_timeout:
                    job = w.job
                    busy -= 1
                    yield job, self._death(w, "hang")
                    self._restart(w)

    def _send(self, w: Worker, job: dict) -> None:
        w.job, w.started, w.stage = job, time.monotonic(), "starting"
        w.proc.stdin.write((json.dumps({**job, "test_timeout": self.test_timeout}) + "\n").encode())
        w.proc.stdin.flush()

    def _death(self, w: Worker, outcome: str) -> dict:
        stage = w.stage
        w.job = None
        if outcome == "hang":
            return {"outcome": "hang", "stage": stage, "signature": f"hang: during {stage}",
                    "message": f"no answer within {self.case_timeout:.0f} s (stage {stage})"}
        code = w.proc.poll()
        if code is None:
            try:
                code = w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        tail = w.stderr_path.read_bytes()[-3000:].decode("utf-8", "replace") if w.stderr_path else ""
        if stage == "validity":  # onnxruntime or onnx crashed on the model: not aotc's failure
            return {"outcome": "ref_crash", "stage": stage, "message": f"worker exit {code} in the validity check"}
        return {"outcome": "crash", "stage": stage, "signature": f"crash: worker exit {code} during {stage}",
                "message": f"worker died (exit {code}) during {stage}", "output": tail}


class Runner:
    """A pool of workers and a scratch folder, reused for every batch of a session (the campaign, then
    each minimization), so workers import aotc once."""

    def __init__(self, jobs: int = 1, case_timeout: float = 120.0, test_timeout: float = 30.0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="aotc-fuzz-")
        self.workdir = Path(self._tmp.name)
        self.pool = Pool(jobs, self.workdir, case_timeout, test_timeout)
        self.count = 0

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.close()
        self._tmp.cleanup()

    def _jobs(self, cases: list[Case], validity_only: bool = False) -> Iterable[dict]:
        for k, case in enumerate(cases):
            self.count += 1
            d = self.workdir / f"c{self.count}"
            d.mkdir()
            (d / "model.onnx").write_bytes(case.data)
            yield {"k": k, "id": case.id, "path": str(d / "model.onnx"), "t0": time.monotonic(),
                   "validity_only": validity_only}

    def run(self, cases: Iterable[Case], keep: Path | None = None,
            progress: Callable[[Result], None] | None = None) -> list[Result]:
        """The results in the order of ``cases``; ``keep``: copy every failing model there."""
        cases = list(cases)
        results: list[Result | None] = [None] * len(cases)
        for job, ans in self.pool.run(self._jobs(cases)):
            case_dir = Path(job["path"]).parent
            case = cases[job["k"]]
            r = Result(case.id, ans.get("outcome", "crash"), time.monotonic() - job["t0"], ans, case_tags(case))
            if r.outcome in FAILURES and keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(case_dir / "model.onnx", keep / f"{case.id.replace(':', '_')}.onnx")
            shutil.rmtree(case_dir, ignore_errors=True)
            results[job["k"]] = r
            if progress:
                progress(r)
        if any(r.outcome in ("crash", "hang") for r in results):
            self.complete_validity([r for r in results if r], cases)
        return [r for r in results if r is not None]

    def complete_validity(self, results: list[Result], cases: list[Case]) -> None:
        """Asks onnxruntime and onnx about the models of crashed or hung cases (their worker could not)."""
        todo = [(r, c) for r, c in zip(results, cases, strict=True)
                if r.outcome in ("crash", "hang") and "validity" not in r.info]
        for job, ans in self.pool.run(self._jobs([c for _, c in todo], validity_only=True)):
            shutil.rmtree(Path(job["path"]).parent, ignore_errors=True)
            todo[job["k"]][0].info["validity"] = ans if "ort" in ans else {"ort": f"validity check: {ans['outcome']}",
                                                                            "checker": None}


def run_cases(cases: Iterable[Case], jobs: int = 1, **kw) -> list[Result]:
    """Runs ``cases`` on a fresh pool of ``jobs`` workers (``Runner`` to reuse one)."""
    timeouts = {k: kw.pop(k) for k in ("case_timeout", "test_timeout") if k in kw}
    with Runner(jobs, **timeouts) as runner:
        return runner.run(cases, **kw)


# ---------------------------------------------------------------------------------------------------
# Tags: what each mutation did, in words, for grouping failures that have no code location.

def _schema(node: onnx.NodeProto, m: onnx.ModelProto) -> onnx.defs.OpSchema | None:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = next((i.version for i in m.opset_import if i.domain in ("", "ai.onnx")), 1) if not domain else 1000
    try:
        return onnx.defs.get_schema(node.op_type, max(1, min(int(version), 1000)), domain)
    except Exception:
        return None


def _value_class(v: object) -> str:
    if isinstance(v, list):
        classes = sorted({_value_class(x) for x in v})
        return "empty list" if not v else "list of " + "/".join(classes)
    if isinstance(v, str):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(v, f"string {v!r}")
    if isinstance(v, float):
        return "nan" if v != v else "negative" if v < 0 else "zero" if v == 0 else "positive"
    if isinstance(v, int):
        return ("huge negative" if v < -(2**31) else "negative" if v < 0 else "zero" if v == 0
                else "huge" if v >= 2**31 else "positive")
    return type(v).__name__


def _name_class(s: dict, names: list[str]) -> str:
    if "new_hex" in s:
        return "invalid UTF-8"
    new = s["new"]
    if new in names:
        return "an existing name"
    if not new:
        return "empty"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", new):
        return "a C identifier or macro" if len(new) < 64 else "a long name"
    return "special characters"


def spec_tag(s: dict, m: onnx.ModelProto) -> str:
    """A short description of what spec ``s`` does to model ``m`` (the model before it)."""
    k = s["kind"]
    nodes = m.graph.node
    if k == "attr":
        if s["node"] >= len(nodes):
            return "attr: no-op"
        node = nodes[s["node"]]
        op, name = node.op_type, s["name"]
        if s["action"] == "dup":
            return "attr: duplicated"
        if s["action"] != "set":
            return f"attr {op}.{name}: {s['action']}"
        schema = _schema(node, m)
        if schema is not None and name not in schema.attributes:
            return "attr: name not in the op's schema"
        if schema is not None:
            want = schema.attributes[name].type.name
            if want != s["type"] and not (want == "INTS" and s["type"] == "EMPTY_INTS"):
                return "attr: wrong type"
        return f"attr {op}.{name}: {_value_class(s['value'])}"
    if k == "node":
        if s["action"] == "op_type":
            return f"node op_type -> {s['op']}"
        if s["action"] == "domain":
            return f"node domain -> {s['domain'] or 'default'}"
        return f"node {s['action']}"
    if k == "graph_io":
        return f"graph {s['which']} {s['action']}"
    if k == "dim":
        return f"dim {s['where']} {s['action']}" + (f" {_value_class(s['value'])}" if s["action"] in ("set", "add")
                                                     else "")
    if k == "elem_type":
        known = s["value"] in TensorProto.DataType.values() and s["value"] != 0
        return f"elem_type {s['where']} {'changed' if known else 'unknown'}"
    if k == "init":
        if s["action"] == "value":
            return f"initializer value {_value_class(s['value'])}"
        if s["action"] == "dtype":
            known = s["value"] in TensorProto.DataType.values() and s["value"] != 0
            return f"initializer dtype {'changed' if known else 'unknown'}"
        return f"initializer {s['action']}"
    if k == "rename":
        return f"rename {s['target']} to {_name_class(s, _tensor_names(m))}"
    if k == "opset":
        if s["action"] in ("set", "add", "dup", "ir_version"):
            v = s["version"]
            top = 13 if s["action"] == "ir_version" else 24
            return f"opset {s['action']} {'unsupported' if v < 1 or v > top else 'changed'}"
        return f"opset {s['action']}"
    return f"bytes {s['action']}"


def case_tags(case: Case) -> list[str]:
    if case.seed_model not in SEEDS:
        return []
    m = SEEDS[case.seed_model]()
    tags = []
    for s in case.specs:
        tags.append(spec_tag(s, m))
        try:
            _apply_proto_spec(m, s, [])
        except Exception:  # as in build_model
            pass
    return tags


# ---------------------------------------------------------------------------------------------------
# Reports, minimization and the regression corpus.

def expected_outcomes(info: dict) -> list[str]:
    """What a fixed aotc must do with a failing case's model: refuse what onnxruntime/onnx refuse;
    anything else may be compiled (and must then match) or refused with a clean error."""
    v = info.get("validity") or {}
    if v.get("ort") or v.get("checker"):
        return ["clean_error"]
    return list(FINE)


def minimize(runner: Runner, case: Case, result: Result) -> tuple[Case, Result]:
    """Drops one mutation at a time while the failure keeps its base signature."""
    best, best_r = case, result
    changed = True
    while changed and len(best.specs) > 1:
        changed = False
        trials = []
        for k in range(len(best.specs)):
            specs = best.specs[:k] + best.specs[k + 1:]
            trials.append(Case(case.id, best.seed_model, specs, build_model(best.seed_model, specs)))
        for t, r in zip(trials, runner.run(trials), strict=True):
            if r.outcome == best_r.outcome and r.base_signature == best_r.base_signature:
                best, best_r, changed = t, r, True
                break
    return best, best_r


def group_failures(results: list[Result]) -> dict[str, list[Result]]:
    groups: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        if r.outcome in FAILURES:
            groups[r.signature].append(r)
    return dict(groups)


def pick_representative(rs: list[Result], cases: dict[str, Case]) -> Result:
    """The case with the fewest mutations, then the smallest model."""
    return min(rs, key=lambda r: (len(cases[r.case_id].specs), len(cases[r.case_id].data), r.case_id))


@dataclass
class Finding:
    signature: str
    results: list[Result]
    case: Case  # the smallest (minimized) case that shows it
    result: Result
    mutations_before: int = 0  # the case's mutations before minimization
    corpus: Path | None = None


def findings(results: list[Result], cases: dict[str, Case], runner: Runner | None = None) -> list[Finding]:
    """Failures grouped by signature; with ``runner``, each group's smallest case is minimized and
    groups whose minimized cases agree are merged."""
    merged: dict[str, Finding] = {}
    for rs in group_failures(results).values():
        rep = pick_representative(rs, cases)
        case, r = cases[rep.case_id], rep
        if runner is not None:
            case, r = minimize(runner, case, rep)
        f = merged.get(r.signature)
        if f is None:
            merged[r.signature] = Finding(r.signature, list(rs), case, r, len(cases[rep.case_id].specs))
        else:
            f.results += rs
            if (len(case.specs), len(case.data)) < (len(f.case.specs), len(f.case.data)):
                f.case, f.result, f.mutations_before = case, r, len(cases[rep.case_id].specs)
    return sorted(merged.values(), key=lambda f: (-len(f.results), f.signature))


def findings_markdown(results: list[Result], found: list[Finding], title: str) -> str:
    counts = Counter(r.outcome for r in results)
    lines = [f"# {title}", "",
             "Outcomes: " + ", ".join(f"{k} {counts[k]}" for k in (*FINE, *FAILURES) if counts[k]), "",
             f"{len(found)} distinct failure signatures (exception type and innermost aotc frame; sanitizer "
             "report; or, for outcomes without a code location, the outcome and what the mutations did). "
             "`python tools/fuzz.py --case SEED:INDEX` reruns one case (`--show` only describes it, "
             "`--write f.onnx` saves its model); `--replay tests/fuzz_corpus` checks the saved corpus.", ""]
    for f in found:
        r = f.result
        v = r.info.get("validity") or {}
        ids = sorted({x.case_id for x in f.results})
        lines += [f"## {f.signature}", "",
                  f"- {len(ids)} case(s): {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}",
                  f"- smallest: `{f.case.describe()}`",
                  f"- reproduce: `python tools/fuzz.py --case {f.case.id}`"
                  + (f" (it has {f.mutations_before} mutations; these {len(f.case.specs)} alone show the failure,"
                     " as the corpus file does)" if f.mutations_before > len(f.case.specs) else ""),
                  "- message: " + str(r.info.get("message", "")).replace("\n", " ")[:500]]
        if r.info.get("frame"):
            lines.append(f"- frame: {r.info['frame']}")
        if r.info.get("found_as"):
            lines.append(f"- aotc's own outcome: {r.info['found_as']}")
        if v:
            lines.append(("- onnxruntime: " + (v.get("ort") or "accepts") + "; onnx.checker: "
                          + (v.get("checker") or "accepts")).replace("\n", " ")[:700])
        if f.corpus:
            lines.append(f"- corpus: {f.corpus.relative_to(ROOT) if f.corpus.is_relative_to(ROOT) else f.corpus}")
        lines.append("")
    return "\n".join(lines)


def make_case_from_id(case_id: str) -> Case:
    seed, index = case_id.split(":")
    return make_case(int(seed), int(index))


def save_corpus(corpus: Path, f: Finding) -> Path:
    """Writes NAME.onnx and NAME.json: the outcome a fixed aotc must give (``expected``), and what was
    found. An entry that exists for the signature is kept, so the corpus only grows."""
    import zlib

    corpus.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "_", f.signature.lower()).strip("_")[:60]
    name = f"{slug}_{zlib.crc32(f.signature.encode()):08x}"
    path = corpus / f"{name}.onnx"
    if path.exists():
        return path
    path.write_bytes(f.case.data)
    meta = {"expected": expected_outcomes(f.result.info), "found": f.result.outcome, "signature": f.signature,
            "case": f.case.id, "seed_model": f.case.seed_model, "mutations": f.case.specs,
            "message": str(f.result.info.get("message", ""))[:300], "validity": f.result.info.get("validity")}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return path


def load_corpus(corpus: Path) -> list[tuple[Case, dict]]:
    out = []
    for meta_path in sorted(corpus.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        data = meta_path.with_suffix(".onnx").read_bytes()
        out.append((Case(meta_path.stem, meta.get("seed_model", "?"), meta.get("mutations", []), data), meta))
    return out


def replay_corpus(corpus: Path, jobs: int = 1, case_timeout: float = 120.0) -> list[tuple[Case, dict, Result]]:
    """Every corpus model run again: (case, its metadata, the result now)."""
    entries = load_corpus(corpus)
    results = run_cases([c for c, _ in entries], jobs=jobs, case_timeout=case_timeout)
    return [(c, meta, r) for (c, meta), r in zip(entries, results, strict=True)]


def campaign(seed: int, cases: int, start: int = 0, jobs: int = 1, case_timeout: float = 120.0,
             progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Cases ``start .. start + cases`` of ``seed``; the results in case order."""
    return run_cases((make_case(seed, i) for i in range(start, start + cases)), jobs=jobs,
                     case_timeout=case_timeout, progress=progress)


# ---------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--report", type=Path, help="JSON: every case's outcome and the counts")
    ap.add_argument("--findings", type=Path, help="Markdown: failures grouped by signature")
    ap.add_argument("--minimize", action="store_true", help="minimize one case per failure signature")
    ap.add_argument("--save-corpus", type=Path, help="save each signature's minimized case here (implies --minimize)")
    ap.add_argument("--keep", type=Path, help="copy every failing model here")
    ap.add_argument("--case", help="run one case SEED:INDEX and print its result")
    ap.add_argument("--show", help="describe case SEED:INDEX")
    ap.add_argument("--write", type=Path, help="with --show or --case: write the model here")
    ap.add_argument("--replay", type=Path, help="run every model of a corpus folder against its expectation")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.show or args.case:
        case = make_case_from_id(args.show or args.case)
        print(case.describe())
        if args.write:
            args.write.write_bytes(case.data)
        if args.case:
            r = run_cases([case], case_timeout=args.timeout)[0]
            print(json.dumps({"outcome": r.outcome, "signature": r.signature, **r.info}, indent=1))
        return 0
    if args.replay:
        bad = 0
        for case, meta, r in replay_corpus(args.replay, args.jobs, args.timeout):
            good = r.outcome in meta["expected"]
            bad += not good
            print(f"{'ok  ' if good else 'FAIL'} {case.id}: {r.outcome} (expected {'/'.join(meta['expected'])})"
                  + ("" if good else f": {str(r.info.get('message', ''))[:200]}"))
        return 1 if bad else 0

    cases: dict[str, Case] = {}

    def gen() -> Iterable[Case]:
        for i in range(args.start, args.start + args.cases):
            c = make_case(args.seed, i)
            cases[c.id] = c
            yield c

    t0 = time.monotonic()
    done: Counter = Counter()

    def progress(r: Result) -> None:
        done[r.outcome] += 1
        n = sum(done.values())
        if r.outcome in FAILURES and not args.quiet:
            print(f"[{n}] {r.case_id} {r.signature}", flush=True)
        if not args.quiet and n % 100 == 0:
            el = time.monotonic() - t0
            print(f"[{n}/{args.cases}] {el:.0f} s, {n / el:.2f} cases/s: {dict(done)}", flush=True)

    with Runner(args.jobs, case_timeout=args.timeout) as runner:
        results = runner.run(gen(), keep=args.keep, progress=progress)
        elapsed = time.monotonic() - t0
        found = findings(results, cases, runner if args.minimize or args.save_corpus else None)
    if args.save_corpus:
        for f in found:
            f.corpus = save_corpus(args.save_corpus, f)
    counts = Counter(r.outcome for r in results)
    summary = {"seed": args.seed, "start": args.start, "cases": len(results), "seconds": round(elapsed, 1),
               "cases_per_second": round(len(results) / max(elapsed, 1e-9), 3),
               "counts": {k: counts[k] for k in (*FINE, *FAILURES)}, "signatures": len(found)}
    print(json.dumps(summary))
    if args.report:
        args.report.write_text(json.dumps({"summary": summary, "results": [
            {"case": r.case_id, "outcome": r.outcome, "signature": r.signature, "seconds": round(r.seconds, 2),
             "description": cases[r.case_id].describe(), "seed_model": cases[r.case_id].seed_model,
             "mutations": cases[r.case_id].specs, **{k: v for k, v in r.info.items() if k != "outcome"}}
            for r in results]}, indent=1, default=str) + "\n")
    if args.findings:
        title = f"aotc fuzz findings: seed {args.seed}, cases {args.start}..{args.start + args.cases - 1}"
        args.findings.write_text(findings_markdown(results, found, title))
    return 1 if any(counts[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
