"""What ``aotc inspect`` shows of a GraphDef: placeholders, default outputs, ops and their support."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotc.frontends.tensorflow.context import TF_OPS
from aotc.frontends.tensorflow.importer import FRONTEND_OPS, default_outputs, tensor_name
from aotc.frontends.tensorflow.proto import load_graphdef
from aotc.frontends.tensorflow.tensors import attr_value, to_numpy
from aotc.ir import dtypes


@dataclass
class GraphSummary:
    inputs: list[tuple[str, str]]  # name, "float32 [?,12,12,3]"
    outputs: list[str]
    ops: dict[str, tuple[int, bool]]  # op -> (nodes, supported)


def summarize(source: str | Path | Any) -> GraphSummary:
    gd = load_graphdef(source)
    inputs = []
    for n in gd.node:
        if n.op != "Placeholder":
            continue
        what = f"Placeholder node {n.name!r}"
        dt = dtypes.dtype_name(to_numpy(n.attr["dtype"].type, what))
        dims = attr_value(n.attr["shape"], what) if "shape" in n.attr else None
        shown = "(rank unknown)" if dims is None else "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"
        inputs.append((n.name, f"{dt} {shown}"))
    ops: dict[str, tuple[int, bool]] = {}
    for n in gd.node:
        count, _ = ops.get(n.op, (0, False))
        ops[n.op] = (count + 1, n.op in TF_OPS or n.op in FRONTEND_OPS)
    return GraphSummary(inputs, [tensor_name(k) for k in default_outputs(gd)], ops)
