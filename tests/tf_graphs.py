"""Hand-made TensorFlow GraphDefs for frontend tests (tensorboard's messages; no TensorFlow needed)."""

from __future__ import annotations


def graphdef(*nodes: tuple[str, str, list[str], dict]):
    """A GraphDef of (name, op, inputs, {attribute: fill(AttrValue)}) nodes."""
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    for name, op, inputs, attrs in nodes:
        n = gd.node.add(name=name, op=op, input=inputs)
        for k, fill in attrs.items():
            fill(n.attr[k])
    return gd


def dt_float(a) -> None:
    a.type = 1  # DT_FLOAT


def shape(*dims: int):
    def fill(a) -> None:
        for d in dims:
            a.shape.dim.add(size=d)
    return fill
