"""Shape/dtype inference and constant folding, in one sweep.

They belong together: a Reshape's target shape is often computed by a Shape -> Gather -> Concat
chain, which only becomes a constant once folded, and folding needs the input shapes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node
from aotc.ops import OPS

# Folding must not turn a small graph into huge weights (e.g. a broadcast mask): above this,
# a result is folded only if it is no bigger than its inputs.
_FOLD_LIMIT_BYTES = 16 << 20


def evaluate(node: Node, args: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Run one node on numpy arrays: the op's own fold rule, else onnx.reference."""
    op = OPS[node.op]
    if op.fold is not None:
        return op.fold(node, args)  # type: ignore[arg-type]
    if op.kind == "alias":  # same bytes, another shape
        return [args[0].reshape(shape) for shape, _ in op.infer(node)[:1]]
    from onnx.reference import ReferenceEvaluator

    in_names = [f"i{k}" if a is not None else "" for k, a in enumerate(args)]
    out_names = [f"o{k}" for k in range(len(node.outputs))]
    attrs = {k: v for k, v in node.attrs.items() if not k.startswith("_")}
    proto = helper.make_node(node.op, in_names, out_names, **attrs)
    graph = helper.make_graph(
        [proto], "fold",
        [helper.make_tensor_value_info(n, dtypes_onnx(a), a.shape) for n, a in zip(in_names, args, strict=True)
         if a is not None],
        [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: a for n, a in zip(in_names, args, strict=True) if a is not None}
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def dtypes_onnx(a: np.ndarray) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(a.dtype)


def propagate(graph: Graph) -> bool:
    for v in graph.inputs:
        if v.shape is None:
            dims = graph.dynamic_inputs.get(v.name, "?")
            raise AotcError(f"input {v.name!r} has dynamic shape [{dims}]; pin it with "
                            f"--input-shape {v.name}=... or a shape in the feed config")
    changed = False
    kept: list[Node] = []
    for node in graph.nodes:
        op = OPS[node.op]
        ins = [v for v in node.inputs if v is not None]
        if all(v.is_const for v in ins) or op.kind == "static":
            args = [None if v is None else v.const for v in node.inputs]
            in_bytes = sum(v.nbytes for v in ins)
            results = _try_fold(node, args, graph.opset)
            if results is not None and (sum(r.nbytes for r in results) <= max(_FOLD_LIMIT_BYTES, in_bytes)
                                        or op.kind == "static"):
                for v, r in zip(node.outputs, results, strict=True):
                    _check_dtype(node, r.dtype)
                    c = Graph.constant(r, v.name)
                    v.shape, v.dtype, v.const, v.producer = c.shape, c.dtype, c.const, None
                changed = True
                continue
        try:
            inferred = op.infer(node)
        except AotcError:
            raise
        except Exception as e:  # malformed attributes and the like in a user's model
            raise AotcError(f"{node.op} node {node.name!r}: {type(e).__name__}: {e}") from None
        for v, (shape, dt) in zip(node.outputs, inferred, strict=False):
            _check_dtype(node, dt)
            v.shape, v.dtype = tuple(int(d) for d in shape), np.dtype(dt)
        kept.append(node)
    graph.nodes = kept
    return changed


def _try_fold(node: Node, args: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    try:
        results = evaluate(node, args, opset)
    except AotcError:
        raise
    except Exception as e:
        raise AotcError(f"{node.op} node {node.name!r}: cannot evaluate on constants: {e}") from None
    return [np.asarray(r, order="C") for r in results]


def _check_dtype(node: Node, dt: np.dtype) -> None:
    if not dtypes.is_supported(dt):
        raise AotcError(f"{node.op} node {node.name!r}: dtype {np.dtype(dt)} is not supported")



