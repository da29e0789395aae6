"""Shape/dtype inference and constant folding, in one sweep.

They belong together: a Reshape's target shape is often computed by a Shape -> Gather -> Concat
chain, which only becomes a constant once folded, and folding needs the input shapes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value
from aotc.ops import OPS
from aotc.passes.memory import check_tensor_size
from aotc.passes.strings import check_strings

# Folding must not turn a small graph into huge weights (e.g. a broadcast mask): above this,
# a result is folded only if it is no bigger than its inputs. The size is known from shape inference
# before anything is evaluated, so a huge result is never computed just to be thrown away.
_FOLD_LIMIT_BYTES = 16 << 20
# Ops that have no kernel ("static": Shape, EyeLike, ...) must be folded: their results become
# constants in the weights blob, at most this large.
_STATIC_LIMIT_BYTES = 1 << 30


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
    # Tensor attributes are numpy arrays in the IR; make_node wants TensorProtos.
    attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
             for k, v in node.attrs.items() if not k.startswith("_")}
    domain, _, op_type = node.op.rpartition(".")
    proto = helper.make_node(op_type, in_names, out_names, domain=domain or None, **attrs)
    graph = helper.make_graph(
        [proto], "fold",
        [helper.make_tensor_value_info(n, dtypes_onnx(a), a.shape) for n, a in zip(in_names, args, strict=True)
         if a is not None],
        [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, node.attr("_domain_opset", 1)))
    model = helper.make_model(graph, opset_imports=opsets)
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
        check_tensor_size(v, f"input {v.name!r}")
    changed = False
    kept: list[Node] = []
    for node in graph.nodes:
        if node.op == "CastLike":  # only the second operand's dtype matters: a Cast, not a read
            like = node.inputs[1]
            assert like is not None and like.dtype is not None
            node.op, node.inputs = "Cast", node.inputs[:1]
            node.attrs["to"] = dtypes.onnx_type(like.dtype)
        if node.op in ("QuantizeLinear", "DequantizeLinear"):
            kept += _per_axis(node)
        op = OPS[node.op]
        if node.attr("_opset", 7) < 7 and op.kind == "elementwise":
            _legacy_broadcast(node)
        ins = [v for v in node.inputs if v is not None]
        if all(v.is_const for v in ins) or op.kind == "static":
            args = [None if v is None else v.const for v in node.inputs]
            limit = _STATIC_LIMIT_BYTES if op.kind == "static" else max(_FOLD_LIMIT_BYTES, sum(v.nbytes for v in ins))
            predicted = _result_bytes(node)
            if op.kind == "static" and predicted is not None and predicted > limit:
                raise AotcError(f"{node.op} node {node.name!r}: its output ({predicted} bytes) is computed at "
                                f"compile time and would be a constant above {limit} bytes")
            results = _try_fold(node, args, graph.opset) if predicted is None or predicted <= limit else None
            if results is not None and (sum(r.nbytes for r in results) <= limit or op.kind == "static"):
                for v, r in zip(node.outputs, results, strict=True):
                    _check_dtype(node, r.dtype)
                    c = Graph.constant(r, v.name)
                    v.shape, v.dtype, v.const, v.producer = c.shape, c.dtype, c.const, None
                    check_tensor_size(v, f"{node.op} node {node.name!r}")
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
            check_tensor_size(v, f"{node.op} node {node.name!r}")
        kept.append(node)
    graph.nodes = kept
    check_strings(graph)  # now that every dtype is known
    return changed


def _per_axis(node: Node) -> list[Node]:
    """Line a per-axis or blocked scale/zero point up with the input for numpy broadcasting: a 1-D
    one along ``axis`` gets trailing unit dimensions, a blocked one is repeated ``block_size`` times
    along ``axis``. Constants are rewritten now; a run-time input through the nodes returned."""
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    rank = len(x.shape)
    axis = int(node.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    block = int(node.attrs.pop("block_size", 0))  # done here once and for all
    added: list[Node] = []

    def derive(v: Value, op: str, shape: tuple[int, ...], *consts: list[int]) -> Value:
        out = Value(f"{v.name}_{op.lower()}", shape, v.dtype)
        n = Node(op, [v, *(Graph.constant(np.array(c, np.int64)) for c in consts)], [out],
                 name=f"{node.name}_scale{len(added)}")
        out.producer = n
        added.append(n)
        return out

    for i in (1, 2):
        v = node.inputs[i] if i < len(node.inputs) else None
        if v is None or v.shape is None:
            continue
        s = v.shape
        if block and len(s) == rank and s != x.shape:
            if not 0 <= axis < rank:
                raise AotcError(f"{node.op} node {node.name!r}: axis {node.attr('axis', 1)} is out of range "
                                f"for an input of rank {rank}")
            d, n = x.shape[axis], s[axis]
            if block < 1 or n * block < d or (n - 1) * block >= d:
                raise AotcError(f"{node.op} node {node.name!r}: block_size {block} does not fit {n} blocks "
                                f"of scale along axis {axis} of extent {d}")
            block = max(1, min(block, d))  # a single block longer than the axis covers just the axis
            if v.is_const and d * v.nbytes // max(n, 1) <= max(_FOLD_LIMIT_BYTES, v.nbytes):
                rep = np.take(v.const, np.arange(d) // block, axis)
                node.inputs[i] = Graph.constant(rep, f"{v.name}_blocks")
                continue
            pre, post = s[:axis], s[axis + 1:]
            u = derive(v, "Reshape", (*pre, n, 1, *post), [*pre, n, 1, *post])
            u = derive(u, "Expand", (*pre, n, block, *post), [*pre, n, block, *post])
            u = derive(u, "Reshape", (*pre, n * block, *post), [*pre, n * block, *post])
            if n * block != d:
                u = derive(u, "Slice", tuple(x.shape), [0], [d], [axis])
            node.inputs[i] = u
            continue
        if len(s) != 1 or s[0] == 1 or rank < 2:
            continue
        shape = (s[0], *([1] * (rank - axis - 1)))
        if v.is_const:
            node.inputs[i] = Graph.constant(v.const.reshape(shape), f"{v.name}_axis")
        else:
            node.inputs[i] = derive(v, "Reshape", shape, list(shape))
    return added


def _legacy_broadcast(node: Node) -> None:
    """Opset < 7 binary ops align B with A at ``axis`` (B of shape (C,) with axis=1 against NCHW
    means C is dimension 1): reshape a constant B so numpy broadcasting says the same."""
    if len(node.inputs) != 2 or not (node.op == "PRelu" or ("axis" in node.attrs and node.attr("broadcast"))):
        return
    a, b = node.inputs[0], node.inputs[1]
    assert a is not None and b is not None and a.shape is not None and b.shape is not None
    # PRelu before opset 7: a 1-D slope is per channel (dimension 1).
    axis = int(node.attrs.pop("axis")) if node.op != "PRelu" else (1 if len(b.shape) == 1 and len(a.shape) > 1
                                                                   and b.shape[0] == a.shape[1] else 0)
    if node.op == "PRelu" and axis == 0:
        return
    axis = axis + len(a.shape) if axis < 0 else axis
    pad = len(a.shape) - axis - len(b.shape)
    if pad <= 0:
        return
    if not b.is_const:
        raise AotcError(f"{node.op} node {node.name!r}: legacy broadcast (axis) needs a constant operand")
    node.inputs[1] = Graph.constant(b.const.reshape(*b.shape, *([1] * pad)), f"{b.name}_bcast")


def _result_bytes(node: Node) -> int | None:
    """The bytes of ``node``'s outputs by shape inference (exact: Python ints), or None when inference
    cannot tell on its own (folding then finds out)."""
    try:
        inferred = OPS[node.op].infer(node)
        return sum(math.prod(int(d) for d in shape) * np.dtype(dt).itemsize for shape, dt in inferred)
    except Exception:  # reported by folding, or by inference below, with the node named
        return None


def _try_fold(node: Node, args: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    try:
        results = evaluate(node, args, opset)
    except AotcError:
        raise
    except Exception as e:
        if OPS[node.op].kind != "static":  # the op's own kernel computes it at run time instead
            return None
        raise AotcError(f"{node.op} node {node.name!r}: cannot evaluate on constants: {e}") from None
    return [np.asarray(r, order="C") for r in results]


def _check_dtype(node: Node, dt: np.dtype) -> None:
    if not dtypes.is_supported(dt):
        raise AotcError(f"{node.op} node {node.name!r}: dtype {np.dtype(dt)} is not supported")



