"""Dilated convolutions written as SpaceToBatchND -> conv -> BatchToSpaceND become one dilated conv.

TensorFlow's ``tf.nn.convolution`` (and Keras layers built on it, and ``tf.nn.atrous_conv2d``,
``tf.nn.depthwise_conv2d``) computes a dilated convolution at rate ``r`` as: pad the input and move
each of the ``r`` block offsets of the spatial dimensions into the batch (SpaceToBatchND), an
undilated VALID conv, and the inverse move with crops (BatchToSpaceND). Row ``i = q*r + s`` of the
result is the conv of block ``s`` at ``q``, which reads input rows ``i + j*r``: exactly the dilated
conv of the padded input, cropped. Cropping ``c`` rows at a side removes ``c`` of that side's padding,
so the three nodes are one conv with dilation ``r`` and explicit paddings ``pad - crop``. Translated
as it stands it would be a pad, two reshapes, two transposes and a slice around a conv on ``r*r``
times the batch, which the layout pass cannot remove.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aotc.frontends.tensorflow.tensors import attr_value

_CONVS = frozenset({"Conv2D", "DepthwiseConv2dNative"})


def _key(ref: str) -> tuple[str, int]:
    node, _, index = ref.partition(":")
    return node, int(index) if index.isdigit() else 0


def _const(nodes: dict[str, Any], ref: str) -> np.ndarray | None:
    """The value of a Const node (through identities), else None."""
    name = _key(ref)[0]
    while name in nodes and nodes[name].op == "Identity" and nodes[name].input:
        name = _key(nodes[name].input[0])[0]
    n = nodes.get(name)
    if n is None or n.op != "Const":
        return None
    return np.asarray(attr_value(n.attr["value"], f"Const node {name!r}"))


def _ints(node: Any, key: str, default: list[int]) -> list[int]:
    return list(node.attr[key].list.i) if key in node.attr else default


def _str(node: Any, key: str) -> bytes:
    return node.attr[key].s if key in node.attr else b""  # (reading a missing key would add it)


def fold_space_to_batch(nodes: dict[str, Any]) -> dict[str, Any]:
    """``nodes`` (name -> NodeDef) with each SpaceToBatchND -> Conv2D/DepthwiseConv2dNative ->
    BatchToSpaceND chain whose intermediate tensors nothing else reads replaced by one conv, named as
    the BatchToSpaceND it replaces (so its readers read it). Other nodes are left as they are."""
    readers: dict[str, int] = {}
    for n in nodes.values():
        for ref in n.input:
            if not ref.startswith("^"):
                readers[_key(ref)[0]] = readers.get(_key(ref)[0], 0) + 1
    out = dict(nodes)
    for b in nodes.values():
        if b.op != "BatchToSpaceND" or len(b.input) < 3:
            continue
        conv = nodes.get(_key(b.input[0])[0])
        if conv is None or conv.op not in _CONVS or _key(b.input[0])[1] != 0 or readers.get(conv.name) != 1:
            continue
        s = nodes.get(_key(conv.input[0])[0]) if conv.input else None
        if s is None or s.op != "SpaceToBatchND" or _key(conv.input[0])[1] != 0 or readers.get(s.name) != 1:
            continue
        if _str(conv, "data_format") not in (b"", b"NHWC") or _str(conv, "padding") != b"VALID" \
                or _ints(conv, "strides", [1] * 4) != [1] * 4 or _ints(conv, "dilations", [1] * 4) != [1] * 4:
            continue
        block, block_b = _const(nodes, s.input[1]), _const(nodes, b.input[1])
        pads, crops = _const(nodes, s.input[2]), _const(nodes, b.input[2])
        if any(a is None for a in (block, block_b, pads, crops)) or block.shape != (2,) \
                or not np.array_equal(block, block_b) or pads.shape != (2, 2) or crops.shape != (2, 2):
            continue
        explicit = (pads - crops).astype(np.int64)
        if (explicit < 0).any() or (block < 1).any():
            continue
        new = type(conv)()
        new.CopyFrom(conv)
        new.name = b.name
        del new.input[:]
        new.input.extend([s.input[0], conv.input[1]])
        new.input.extend(ref for n in (s, conv, b) for ref in n.input if ref.startswith("^"))
        new.attr["padding"].s = b"EXPLICIT"
        new.attr["explicit_paddings"].list.i[:] = [0, 0, *explicit[0], *explicit[1], 0, 0]
        new.attr["dilations"].list.i[:] = [1, int(block[0]), int(block[1]), 1]
        out[b.name] = new
    return out
