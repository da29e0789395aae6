"""Reference outputs for generated tests: the imported graph run by onnxruntime or onnx.reference.

The graph is captured right after import and the feed/fetch config, before any aotc pass, and
written back out as an ONNX model, so the expected values come from an implementation that shares
nothing with aotc's passes or C code.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

from aotc.errors import AotcError
from aotc.ir.graph import Graph, Value


def to_onnx(graph: Graph) -> onnx.ModelProto:
    """The graph as an ONNX model with inputs ``in0..`` and outputs ``out0..`` (untyped outputs)."""
    names: dict[int, str] = {}
    inits: list[onnx.TensorProto] = []

    def name(v: Value | None) -> str:
        if v is None:
            return ""
        if id(v) not in names:
            names[id(v)] = f"t{len(names)}"
            if v.is_const:
                inits.append(numpy_helper.from_array(np.asarray(v.const), names[id(v)]))
        return names[id(v)]

    for i, v in enumerate(graph.inputs):
        names[id(v)] = f"in{i}"
    domains: dict[str, int] = {"": graph.opset}
    nodes = []
    for n in graph.nodes:
        domain, _, op = n.op.rpartition(".")
        domains.setdefault(domain, n.attr("_domain_opset", 1))
        node = helper.make_node(op, [name(v) for v in n.inputs], [name(v) for v in n.outputs],
                                domain=domain or None)
        node.attribute.extend(_attribute(op, domain, graph.opset if not domain else n.attr("_domain_opset", 1),
                                         k, a) for k, a in n.attrs.items() if not k.startswith("_"))
        nodes.append(node)
    outputs = []
    for i, v in enumerate(graph.outputs):
        nodes.append(helper.make_node("Identity", [name(v)], [f"out{i}"]))
        # Typed (onnxruntime refuses an output of type UNDEFINED); shapes are left to the reference.
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)) if v.dtype is not None else 0
        outputs.append(helper.make_tensor_value_info(f"out{i}", elem, None))
    inputs = [helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)),
                                            list(v.shape or ())) for i, v in enumerate(graph.inputs)]
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(domains.items())]
    model = helper.make_model(helper.make_graph(nodes, "reference", inputs, outputs, inits),
                              opset_imports=opsets)
    model.ir_version = 9  # what onnxruntime releases of the last years all read
    return model


def _attribute(op: str, domain: str, opset: int, key: str, value) -> onnx.AttributeProto:
    """``value`` as an attribute; an empty list takes its type from the op's schema (make_attribute
    cannot tell ints from floats from an empty list)."""
    if isinstance(value, (list, tuple)) and not value:
        try:
            kind = onnx.defs.get_schema(op, opset, domain).attributes[key].type
        except (onnx.defs.SchemaError, KeyError):
            kind = onnx.AttributeProto.INTS
        return helper.make_attribute(key, [], attr_type=kind)
    return helper.make_attribute(key, value)


MAX_TEST_INPUT_BYTES = 1 << 30


def random_inputs(specs: list[tuple[str, tuple[int, ...]]], seed: int = 0) -> list[np.ndarray]:
    """Normal floats, random booleans, and zeros for integers (always a valid index)."""
    total = sum(math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in specs)
    if total > MAX_TEST_INPUT_BYTES:  # a stored test's inputs and outputs are files and C arrays
        raise AotcError(f"--gen-test: the inputs take {total} bytes; a generated test stores at most "
                        f"{MAX_TEST_INPUT_BYTES} (compile without --gen-test)")
    rng = np.random.default_rng(seed)
    out = []
    for dtype, shape in specs:
        dt = np.dtype(dtype)
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random(shape) < 0.5)
        elif dt.kind == "O":  # strings: empty ones, like the zeros for integers
            out.append(np.full(shape, "", object))
        else:
            out.append(np.zeros(shape, dt))
    return out


# Runs in a child interpreter: a crash inside onnxruntime (it has segfaulted on models it
# accepted) must not take the compiler with it. Only numpy and onnxruntime are imported there,
# not aotc or onnx, to keep the start-up short; -P keeps the working directory off sys.path.
_ORT_CHILD = """
import sys, numpy as np
d = sys.argv[1]
try:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    with open(d + "/model.onnx", "rb") as f:
        sess = ort.InferenceSession(f.read(), opts, providers=["CPUExecutionProvider"])
    with np.load(d + "/inputs.npz", allow_pickle=True) as z:
        feeds = {k: z[k] for k in z.files}
    outs = [np.asarray(r) for r in sess.run(None, feeds)]
except Exception as e:
    lines = str(e).strip().splitlines()
    with open(d + "/error.txt", "w") as f:
        f.write(type(e).__name__ + (": " + lines[0][:200] if lines else ""))
    sys.exit(1)
np.savez(d + "/outputs.npz", *outs)
with open(d + "/version.txt", "w") as f:
    f.write(ort.__version__)
"""

ORT_CHILD_TIMEOUT_S = 600


def _run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], str]:
    """onnxruntime's outputs in a child process; RuntimeError with one line when it fails or dies."""
    with tempfile.TemporaryDirectory(prefix="aotc-ref-") as tmp:
        d = Path(tmp)
        (d / "model.onnx").write_bytes(model.SerializeToString())
        np.savez(d / "inputs.npz", **feeds)
        try:
            proc = subprocess.run([sys.executable, "-P", "-c", _ORT_CHILD, tmp], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=ORT_CHILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"did not finish within {ORT_CHILD_TIMEOUT_S} s") from None
        if proc.returncode == 0:
            with np.load(d / "outputs.npz", allow_pickle=True) as z:
                outs = [z[f"arr_{i}"] for i in range(len(z.files))]
            return outs, f"onnxruntime {(d / 'version.txt').read_text()}"
        if (d / "error.txt").exists():
            raise RuntimeError((d / "error.txt").read_text())
        if proc.returncode < 0:
            raise RuntimeError(f"crashed (signal {-proc.returncode})")
        raise RuntimeError(f"exited with status {proc.returncode}")


def run_reference(model: onnx.ModelProto, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], str]:
    """The outputs and the name of the implementation that computed them."""
    feeds = {f"in{i}": x for i, x in enumerate(inputs)}
    try:
        return _run_onnxruntime(model, feeds)
    except RuntimeError as e:  # not installed, an op or type it lacks, or a crash: the pure-Python reference
        ort_error = str(e)
    from onnx.reference import ReferenceEvaluator

    try:
        outs = ReferenceEvaluator(model).run(None, feeds)
    except Exception as e:  # both references refuse the model (or these random inputs)
        raise AotcError("--gen-test: no reference could run the model on random inputs "
                        f"(onnxruntime: {ort_error}; onnx.reference: {_first_line(e)})") from None
    return [np.asarray(r) for r in outs], f"onnx.reference {onnx.__version__}"


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
