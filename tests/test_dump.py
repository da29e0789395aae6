"""Tests for aotc/dump.py: GraphViz text, kernel/memory summary, memory-plan SVG and dump files.

Graphs come from compiling small ONNX models, so the pictures are checked against what the compiler
really produced (kernel names, the memory plan). When GraphViz is installed the dot text is also
rendered with ``dot -Tsvg``, which is the real test of the escaping.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotc import dump
from aotc.compiler import compile_model
from aotc.frontends.onnx import import_onnx
from aotc.ir.graph import Graph
from aotc.ops.cost import node_flops
from aotc.passes.pipeline import DEFAULT_PASSES, run_passes

DOT = shutil.which("dot")
HOSTILE_IN = 'a"b\\n}{<x>'
HOSTILE_MID = 'x*/ system("rm -rf /"); /*'
SVG_NS = "{http://www.w3.org/2000/svg}"
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def _model(layers: list[int], batch: int = 1, names: tuple[str, ...] = (), softmax: bool = True,
           flatten: bool = False) -> onnx.ModelProto:
    """An MLP: MatMul+Add(+Relu) per layer, then Softmax. ``names`` renames the input and hiddens."""
    rng = np.random.default_rng(0)
    x = names[0] if names else "x"
    inits, nodes, cur = [], [], x
    if flatten:
        nodes.append(helper.make_node("Flatten", [cur], ["flat"], name="flatten"))
        cur = "flat"
    for i, (k, n) in enumerate(zip(layers, layers[1:], strict=False)):
        w = rng.standard_normal((k, n)).astype(np.float32) * 0.1
        b = np.zeros(n, np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(layers) - 2
        out = names[i + 1] if len(names) > i + 1 else f"h{i}"
        nodes += [helper.make_node("MatMul", [cur, f"W{i}"], [f"mm{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}" if not last else "logits"])]
        cur = f"add{i}" if not last else "logits"
        if not last:
            nodes.append(helper.make_node("Relu", [cur], [out], name=f"relu{i}"))
            cur = out
    if softmax:
        nodes.append(helper.make_node("Softmax", [cur], ["y"], axis=-1))
        cur = "y"
    in_shape = [batch, 1, layers[0]] if flatten else [batch, layers[0]]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info(x, TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _before_fusion(model: onnx.ModelProto) -> Graph:
    graph = import_onnx(model, {}, "m")
    cut = [p.name for p in DEFAULT_PASSES].index("fuse")
    return run_passes(graph, DEFAULT_PASSES[:cut])


def _check_dot(text: str) -> None:
    """Structural check that works without GraphViz: strings close, braces balance, ids are declared."""
    bare = QUOTED.sub('""', text)
    assert '"' not in QUOTED.sub("", text), "unterminated string"
    depth = 0
    for ch in bare:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    declared = set(re.findall(r"^\s*(\w+) \[", bare, re.MULTILINE)) - {"graph", "node", "edge"}
    for a, b in re.findall(r"^\s*(\w+) -> (\w+)", bare, re.MULTILINE):
        assert a in declared and b in declared, (a, b)
    if DOT:
        res = subprocess.run([DOT, "-Tsvg"], input=text.encode(), capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr.decode()


def _render_texts(text: str) -> list[str]:
    """The text elements of dot's SVG rendering, i.e. what a reader of the picture sees."""
    res = subprocess.run([DOT, "-Tsvg"], input=text.encode(), capture_output=True, timeout=60, check=True)
    root = ET.fromstring(res.stdout)
    return [t.text or "" for t in root.iter(f"{SVG_NS}text")]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory):
    return compile_model(_model([784, 512, 10]), tmp_path_factory.mktemp("mlp"), "mlp")


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory):
    """Enough layers that the planner reuses bytes, plus a Flatten alias at the front."""
    model = _model([64, 96, 80, 96, 80, 32], batch=4, flatten=True)
    return compile_model(model, tmp_path_factory.mktemp("deep"), "deep")


def test_dot_has_one_cluster_per_kernel(mlp) -> None:
    text = dump.graph_dot(mlp.graph, "mlp after fusion")
    _check_dot(text)
    clusters = re.findall(r"subgraph (cluster_k\d+) \{", text)
    assert clusters == [f"cluster_k{i}" for i in range(mlp.num_kernels)]
    for k in mlp.graph.kernels:
        assert f'label="{k.name} [{k.kind}]"' in text
    assert 'label="k0_matmul_add_relu [gemm]"' in text
    assert 'label="MatMul\\nfloat32[1,512]"' in text
    assert 'label="[1,784]"' in text   # edges carry shapes


def test_dot_before_fusion_has_no_clusters() -> None:
    graph = _before_fusion(_model([16, 8, 4]))
    assert not graph.kernels
    text = dump.graph_dot(graph, "before")
    _check_dot(text)
    assert "subgraph" not in text
    for i, n in enumerate(graph.nodes):
        assert re.search(rf'^  n{i} \[label="{n.op}\\n', text, re.MULTILINE)


def test_dot_aliases_dashed_and_deterministic(deep, tmp_path: Path) -> None:
    text = dump.graph_dot(deep.graph, "deep")
    _check_dot(text)
    flat = next(i for i, n in enumerate(deep.graph.nodes) if n.op == "Reshape")  # Flatten, simplified
    line = next(x for x in text.splitlines() if x.strip().startswith(f"n{flat} ["))
    assert "dashed" in line and line.startswith("  n")   # top level: an alias is in no kernel
    again = compile_model(_model([64, 96, 80, 96, 80, 32], batch=4, flatten=True), tmp_path, "deep")
    assert dump.graph_dot(again.graph, "deep") == text


def test_scalar_constants_fold_into_consumer() -> None:
    nodes = [helper.make_node("Mul", ["x", "half"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    text = dump.graph_dot(_before_fusion(model), "scale")
    _check_dot(text)
    assert "in1 = 0.5" in text
    assert not re.search(r"^\s*c\d+ \[", text, re.MULTILINE)


def test_hostile_names_are_escaped(tmp_path: Path) -> None:
    model = _model([8, 6, 4], names=(HOSTILE_IN, HOSTILE_MID))
    model.graph.node[0].name = 'mm"0\\'
    graph = run_passes(import_onnx(model, {}, "m"))
    assert graph.memory.buffers, "the hostile hidden tensor should be a workspace buffer"
    text = dump.graph_dot(graph, f"title {HOSTILE_MID}")
    _check_dot(text)
    assert 'a\\"b\\\\n}{<x>' in text
    assert 'x*/ system(\\"rm -rf /\\"); /*' in text
    bare = QUOTED.sub('""', text)   # nothing from the model may leak outside a quoted string
    assert "system" not in bare and "rm -rf" not in bare and "<x>" not in bare
    if DOT:
        shown = "\n".join(_render_texts(text))
        assert HOSTILE_IN in shown   # the literal backslash-n, not a line break
        assert HOSTILE_MID in shown

    svg = dump.memory_svg(graph)
    root = ET.fromstring(svg)
    titles = [t.text for r in root.iter(f"{SVG_NS}rect") for t in r.iter(f"{SVG_NS}title")]
    assert any(t and t.startswith(HOSTILE_MID + ":") for t in titles)
    assert json.loads(json.dumps(dump.summary_dict(graph)))["memory"]["buffers"][0]["name"] == HOSTILE_MID
    assert HOSTILE_MID in dump.summary_text(graph)


def test_summary_numbers_for_mlp(mlp) -> None:
    d = dump.summary_dict(mlp.graph)
    assert [k["name"] for k in d["kernels"]] == [k.name for k in mlp.graph.kernels]
    k0 = d["kernels"][0]
    assert k0["name"] == "k0_matmul_add_relu" and k0["kind"] == "gemm"
    assert k0["ops"] == ["MatMul", "Add", "Relu"]
    mm = next(n for n in mlp.graph.kernels[0].nodes if n.op == "MatMul")
    assert node_flops(mm) == 2 * 784 * 512
    assert k0["flops"] == 2 * 784 * 512 + 512 + 512          # + bias add + relu
    assert k0["bytes_read"] == 4 * (784 + 784 * 512 + 512)   # x, W0, b0
    assert k0["bytes_written"] == 4 * 512
    assert k0["bytes_moved"] == k0["bytes_read"] + k0["bytes_written"]
    assert d["kernels"][1]["flops"] == 2 * 512 * 10 + 10
    assert d["kernels"][2]["flops"] == 10                     # softmax: one per output element
    assert d["total_flops"] == sum(k["flops"] for k in d["kernels"])

    plan = mlp.graph.memory
    mem = d["memory"]
    assert mem["workspace_bytes"] == plan.workspace_bytes
    assert mem["intermediate_bytes"] == plan.intermediate_bytes
    assert len(mem["buffers"]) == len(plan.buffers) + len(plan.scratch)
    h0 = next(b for b in mem["buffers"] if b["name"] == "h0")
    assert (h0["size"], h0["first"], h0["last"]) == (2048, 0, 1)
    assert h0["first_kernel"] == "k0_matmul_add_relu"
    json.dumps(d)

    text = dump.summary_text(mlp.graph)
    assert f"{2 * 784 * 512 + 1024:,}" in text
    assert "k0_matmul_add_relu" in text and "MatMul+Add+Relu" in text
    assert f"workspace: {plan.workspace_bytes:,} bytes" in text


def test_reduction_flops_count_input_elements() -> None:
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    g = run_passes(import_onnx(model, {}, "m"))
    (k,) = dump.summary_dict(g)["kernels"]
    assert k["ops"] == ["Mul", "ReduceSum"]
    assert k["flops"] == 32 + 32
    assert k["bytes_read"] == 4 * 32 and k["bytes_written"] == 4 * 4


def test_memory_svg_one_rect_per_buffer(deep) -> None:
    plan = deep.graph.memory
    assert plan.workspace_bytes < plan.intermediate_bytes, "this model should reuse workspace bytes"
    svg = dump.memory_svg(deep.graph)
    root = ET.fromstring(svg)
    rects = list(root.iter(f"{SVG_NS}rect"))
    assert len(rects) == len(plan.buffers) + len(plan.scratch)
    for b in [*plan.buffers.values(), *plan.scratch.values()]:
        assert any((r.find(f"{SVG_NS}title").text or "").startswith(f"{b.name}: {b.size:,} bytes")
                   for r in rects)
    title = "".join(root.find(f"{SVG_NS}title").itertext())
    assert f"peak {plan.workspace_bytes:,} bytes" in title
    assert "kernel index" in svg and "workspace offset" in svg


def test_memory_svg_without_plan() -> None:
    root = ET.fromstring(dump.memory_svg(_before_fusion(_model([8, 4]))))
    assert not list(root.iter(f"{SVG_NS}rect"))


def test_write_dumps_and_summary(mlp, tmp_path: Path) -> None:
    dump.write_dumps(mlp.graph, tmp_path, "graph_after_fusion")
    dump.write_summary(mlp.graph, tmp_path)
    assert "cluster_k0" in (tmp_path / "graph_after_fusion.dot").read_text()
    assert (tmp_path / "graph_after_fusion.png").exists() == bool(DOT)
    if DOT:
        assert (tmp_path / "graph_after_fusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["kernels"][0]["name"] == "k0_matmul_add_relu"
    assert "k0_matmul_add_relu" in (tmp_path / "summary.txt").read_text()
    ET.parse(tmp_path / "memory_plan.svg")


def test_write_dumps_survives_missing_or_broken_dot(mlp, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _before_fusion(_model([8, 4]))
    stale = tmp_path / "graph_before_fusion.png"
    stale.write_bytes(b"old")
    monkeypatch.setattr(dump.shutil, "which", lambda _name: None)
    dump.write_dumps(graph, tmp_path, "graph_before_fusion")
    assert (tmp_path / "graph_before_fusion.dot").exists() and not stale.exists()
    for broken in ("/bin/false", str(tmp_path / "no-such-dot")):
        monkeypatch.setattr(dump.shutil, "which", lambda _name, b=broken: b)
        dump.write_dumps(graph, tmp_path, "graph_before_fusion")
        assert not stale.exists()
