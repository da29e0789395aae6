"""Function calls inlined: a GraphDef whose nodes call functions of its library (``PartitionedCall``,
``StatefulPartitionedCall``, or a node whose op is a function's name) becomes one flat GraphDef.

A call node ``c`` calling ``f`` becomes ``f``'s nodes, renamed ``c/<node>``, reading the call's inputs
where they read ``f``'s arguments, and an ``IdentityN`` named ``c`` whose inputs are ``f``'s return
values, so whatever read ``c:k`` still does. That IdentityN also carries control inputs on ``f``'s
control outputs (the stateful ops the call runs for their effect, such as variable updates), so the
importer can tell a function that updates variables from one that only reads them. Nested calls are
inlined the same way, to any depth; a function that calls itself is refused.

Inside a FunctionDef, a node's output is spelled ``node:output_arg:index``, ``index`` counting within
that output argument; a GraphDef counts across all of them. The two agree for ops with one output
argument (which may be a list, as Unpack's or IdentityN's); the ops with several are listed here.
"""

from __future__ import annotations

from typing import Any

from aotc.errors import AotcError
from aotc.frontends.tensorflow.proto import messages

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# Ops whose outputs are several single-tensor output arguments, in their OpDef's order.
_FUSED_BN = ("y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2", "reserve_space_3")
OUTPUT_ARGS: dict[str, tuple[str, ...]] = {
    "FusedBatchNorm": _FUSED_BN[:5], "FusedBatchNormV2": _FUSED_BN[:5], "FusedBatchNormV3": _FUSED_BN,
    "TopKV2": ("values", "indices"), "TopK": ("values", "indices"), "Unique": ("y", "idx"),
    "SparseSoftmaxCrossEntropyWithLogits": ("loss", "backprop"), "SoftmaxCrossEntropyWithLogits": ("loss", "backprop"),
    "BroadcastGradientArgs": ("r0", "r1"),
}


def inline_functions(gd: Any) -> Any:
    """A GraphDef equal to ``gd`` with every function call replaced by the function's body."""
    library = {f.signature.name: f for f in gd.library.function}
    out = messages().GraphDef()
    out.versions.CopyFrom(gd.versions)
    taken = {n.name for n in gd.node}
    for n in gd.node:
        _add(out, n, library, taken, ())
    return out


def _callee(node: Any, library: dict[str, Any]) -> str | None:
    if node.op in CALL_OPS:
        name = node.attr["f"].func.name
        if name not in library:
            raise AotcError(f"{node.op} node {node.name!r} calls function {name!r}, which the graph's library "
                            "does not define")
        return name
    return node.op if node.op in library else None


def _add(out: Any, node: Any, library: dict[str, Any], taken: set[str], stack: tuple[str, ...]) -> None:
    """Append ``node`` to ``out``, or the inlined body of the function it calls."""
    fname = _callee(node, library)
    if fname is None:
        out.node.add().CopyFrom(node)
        return
    if fname in stack:
        raise AotcError(f"function {fname!r} calls itself (through {' -> '.join(stack)}): recursion cannot "
                        "be inlined")
    f = library[fname]
    args = [a.name for a in f.signature.input_arg]
    data = [i for i in node.input if not i.startswith("^")]
    if len(data) != len(args):
        raise AotcError(f"{node.op} node {node.name!r} passes {len(data)} inputs to function {fname!r}, which "
                        f"takes {len(args)}")
    bound = dict(zip(args, data, strict=True))
    renamed: dict[str, str] = {}
    for inner in f.node_def:
        new = f"{node.name}/{inner.name}"
        while new in taken:
            new += "_"
        taken.add(new)
        renamed[inner.name] = new
    ops = {inner.name: inner.op for inner in f.node_def}

    def outer(ref: str) -> str:
        """A function-body tensor reference as the flat graph spells it."""
        if ref in bound:
            return bound[ref]
        name, _, rest = ref.partition(":")
        if name not in renamed:
            raise AotcError(f"function {fname!r} reads {ref!r}, which is neither an argument nor a node of it")
        arg, _, index = rest.partition(":")
        k = int(index or 0)
        if arg:
            k += _arg_offset(ops[name], arg, library, fname, ref)
        return renamed[name] if k == 0 else f"{renamed[name]}:{k}"

    for inner in f.node_def:
        copy = type(node)()
        copy.CopyFrom(inner)
        copy.name = renamed[inner.name]
        del copy.input[:]
        for ref in inner.input:
            if ref.startswith("^"):
                if ref[1:] in renamed:  # an argument's control edge orders nothing once inlined
                    copy.input.append("^" + renamed[ref[1:]])
            else:
                copy.input.append(outer(ref))
        _add(out, copy, library, taken, (*stack, fname))
    result = out.node.add(name=node.name, op="IdentityN")
    for a in f.signature.output_arg:
        if a.name not in f.ret:
            raise AotcError(f"function {fname!r} does not return its output {a.name!r}")
        result.input.append(outer(f.ret[a.name]))
    result.input.extend("^" + renamed[c] for c in sorted(f.control_ret.values()) if c in renamed)
    result.input.extend(i for i in node.input if i.startswith("^"))


def _arg_offset(op: str, arg: str, library: dict[str, Any], fname: str, ref: str) -> int:
    """Where output argument ``arg`` of an ``op`` node starts among the node's outputs."""
    if op in library:  # a direct call: the callee's output arguments are single tensors
        names = [a.name for a in library[op].signature.output_arg]
    elif op in OUTPUT_ARGS:
        names = list(OUTPUT_ARGS[op])
    else:
        return 0
    if arg not in names:
        raise AotcError(f"function {fname!r} reads {ref!r}, but {op} has no output {arg!r}")
    return names.index(arg)
