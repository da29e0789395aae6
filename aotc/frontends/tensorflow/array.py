"""Shape and indexing ops: Reshape, Transpose, Concat, StridedSlice, Gather, Pad, Tile, Fill, Range, ...

Their index arguments must be compile-time constants (or fold to them at import), as tfcompile's
static shapes require.
"""

from __future__ import annotations

import numpy as np

from aotc.frontends.tensorflow.context import Ctx, tf_op
from aotc.frontends.tensorflow.tensors import to_numpy
from aotc.ir.graph import Value


def _i64(ctx: Ctx, values: list[int]) -> Value:
    return ctx.const(np.array(values, np.int64))


@tf_op("Const")
def const(ctx: Ctx) -> Value:
    return ctx.const(ctx.attr("value"))


@tf_op("Reshape")
def reshape(ctx: Ctx) -> Value:
    # TF's 0 is an empty dimension, not ONNX's "copy the input's": allowzero.
    return ctx.emit("Reshape", [ctx.x(0), _i64(ctx, ctx.ints(1, "shape"))], allowzero=1)


@tf_op("Transpose")
def transpose(ctx: Ctx) -> Value:
    x = ctx.x(0)
    perm = [ctx.axis(p, len(x.shape)) for p in ctx.ints(1, "perm")]
    if sorted(perm) != list(range(len(x.shape))):
        raise ctx.error(f"perm {perm} is not a permutation of the input's {len(x.shape)} dimensions")
    return ctx.transpose(x, perm)


@tf_op("Squeeze")
def squeeze(ctx: Ctx) -> Value:
    x = ctx.x(0)
    dims = [ctx.axis(a, len(x.shape)) for a in ctx.attr("squeeze_dims", [])]
    if not dims:
        dims = [i for i, d in enumerate(x.shape) if d == 1]
    return ctx.emit("Squeeze", [x, _i64(ctx, dims)])


@tf_op("ExpandDims")
def expand_dims(ctx: Ctx) -> Value:
    x = ctx.x(0)
    (axis, *rest) = ctx.ints(1, "dim") or [None]
    if axis is None or rest:
        raise ctx.error("dim must be one axis")
    return ctx.emit("Unsqueeze", [x, _i64(ctx, [ctx.axis(axis, len(x.shape) + 1)])])


@tf_op("Shape", "Size", "Rank")
def shape(ctx: Ctx) -> Value:
    x = ctx.x(0)
    dt = to_numpy(ctx.attr("out_type", 3), f"{ctx.op_type} node {ctx.name!r}: attribute out_type")
    value = {"Shape": list(x.shape), "Size": x.size, "Rank": len(x.shape)}[ctx.op_type]
    return ctx.const(np.array(value, dtype=dt if ctx.op_type != "Rank" else np.int32))


@tf_op("ConcatV2")
def concat(ctx: Ctx) -> Value:
    parts = [ctx.x(i) for i in range(len(ctx.inputs) - 1)]
    (axis,) = ctx.ints(len(ctx.inputs) - 1, "axis")
    axis = ctx.axis(axis, len(parts[0].shape))
    return parts[0] if len(parts) == 1 else ctx.emit("Concat", parts, axis=axis)


@tf_op("Pack")
def pack(ctx: Ctx) -> Value:
    parts = [ctx.x(i) for i in range(len(ctx.inputs))]
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(parts[0].shape) + 1)
    parts = [ctx.emit("Unsqueeze", [p, _i64(ctx, [axis])]) for p in parts]
    return parts[0] if len(parts) == 1 else ctx.emit("Concat", parts, axis=axis)


@tf_op("GatherV2", "Gather", "ResourceGather")
def gather(ctx: Ctx) -> Value:
    params, indices = ctx.x(0), ctx.x(1)  # ResourceGather's params: the variable's value
    if int(ctx.attr("batch_dims", 0)) != 0:
        raise ctx.error(f"batch_dims={ctx.attr('batch_dims')} is not supported (only 0)")
    (axis,) = ctx.ints(2, "axis") if ctx.op_type == "GatherV2" else [0]
    return ctx.emit("Gather", [params, indices], axis=ctx.axis(axis, len(params.shape)))


@tf_op("Pad", "PadV2")
def pad(ctx: Ctx) -> Value:
    x = ctx.x(0)
    p = ctx.const_input(1, "paddings").astype(np.int64)
    if p.shape != (len(x.shape), 2) or (p < 0).any():
        raise ctx.error(f"paddings {p.tolist()} must be ({len(x.shape)}, 2) values >= 0")
    value = [ctx.x(2)] if ctx.op_type == "PadV2" else []
    return ctx.emit("Pad", [x, _i64(ctx, [*p[:, 0], *p[:, 1]]), *value], mode="constant")


@tf_op("Slice")
def slice_(ctx: Ctx) -> Value:
    x = ctx.x(0)
    begin, size = ctx.ints(1, "begin"), ctx.ints(2, "size")
    if len(begin) != len(x.shape) or len(size) != len(x.shape):
        raise ctx.error(f"begin {begin} and size {size} must have {len(x.shape)} entries")
    end = []
    for d, (b, s, n) in enumerate(zip(begin, size, x.shape, strict=True)):
        e = n if s == -1 else b + s
        if not 0 <= b <= e <= n:
            raise ctx.error(f"begin {b} and size {s} are out of range for dimension {d} of size {n}")
        end.append(e)
    return ctx.emit("Slice", [x, _i64(ctx, begin), _i64(ctx, end), _i64(ctx, list(range(len(x.shape))))])


@tf_op("StridedSlice")
def strided_slice(ctx: Ctx) -> Value:
    """TF's masks resolved against the static shape: one Slice over the input's dimensions, then a
    Reshape for the new axes and the shrunk ones."""
    x = ctx.x(0)
    begin, end, strides = ctx.ints(1, "begin"), ctx.ints(2, "end"), ctx.ints(3, "strides")
    if not len(begin) == len(end) == len(strides):
        raise ctx.error(f"begin {begin}, end {end} and strides {strides} differ in length")
    mask = {k: int(ctx.attr(f"{k}_mask", 0)) for k in ("begin", "end", "ellipsis", "new_axis", "shrink_axis")}
    if bin(mask["ellipsis"]).count("1") > 1:
        raise ctx.error(f"ellipsis_mask {mask['ellipsis']} has more than one bit set")
    rank, n = len(x.shape), len(begin)
    ranges: list[tuple[int, int, int]] = []  # per input dimension: start, stop, step (Python's)
    out: list[int | None] = []  # output dimensions: an input dimension, or None for a new axis
    for i in range(n):
        bit = 1 << i
        if mask["ellipsis"] & bit:
            after = sum(1 for j in range(i + 1, n) if not mask["new_axis"] & (1 << j))
            for _ in range(rank - len(ranges) - after):
                out.append(len(ranges))
                ranges.append((0, x.shape[len(ranges)], 1))
            continue
        if mask["new_axis"] & bit:
            out.append(None)
            continue
        d = len(ranges)
        if d >= rank:
            raise ctx.error(f"more indices than the input's {rank} dimensions")
        size, step = x.shape[d], strides[i]
        if step == 0:
            raise ctx.error(f"stride 0 for dimension {d}")
        if mask["shrink_axis"] & bit:
            b = begin[i] + size if begin[i] < 0 else begin[i]
            if not 0 <= b < size:
                raise ctx.error(f"index {begin[i]} is out of range for dimension {d} of size {size}")
            ranges.append((b, b + 1, 1))
            continue
        b = None if mask["begin"] & bit else begin[i]
        e = None if mask["end"] & bit else end[i]
        ranges.append(slice(b, e, step).indices(size))
        out.append(d)
    while len(ranges) < rank:  # dimensions after the last index: whole
        out.append(len(ranges))
        ranges.append((0, x.shape[len(ranges)], 1))

    axes = [d for d, (s, e, st) in enumerate(ranges) if (s, e, st) != (0, x.shape[d], 1)]
    y = x
    if axes:
        starts = [ranges[d][0] for d in axes]
        # Python's stop -1 with a negative step means "past index 0"; ONNX reads -1 as the last index.
        ends = [ranges[d][1] if ranges[d][1] >= 0 else -x.shape[d] - 1 for d in axes]
        steps = [ranges[d][2] for d in axes]
        y = ctx.emit("Slice", [x, _i64(ctx, starts), _i64(ctx, ends), _i64(ctx, axes), _i64(ctx, steps)])
    sliced = [len(range(*r)) for r in ranges]
    return ctx.reshape(y, [1 if d is None else sliced[d] for d in out])


@tf_op("Tile")
def tile(ctx: Ctx) -> Value:
    return ctx.emit("Tile", [ctx.x(0), _i64(ctx, ctx.ints(1, "multiples"))])


@tf_op("BroadcastTo")
def broadcast_to(ctx: Ctx) -> Value:
    x, shape = ctx.x(0), ctx.ints(1, "shape")
    out = np.broadcast_shapes(tuple(x.shape), tuple(shape)) if len(shape) >= len(x.shape) else None
    if out != tuple(shape):  # TF refuses a shape the input does not broadcast to exactly
        raise ctx.error(f"cannot broadcast {list(x.shape)} to {shape}")
    return ctx.emit("Expand", [x, _i64(ctx, shape)])


@tf_op("Fill")
def fill(ctx: Ctx) -> Value:
    dims, value = ctx.ints(0, "dims"), ctx.x(1)
    if value.shape != ():
        raise ctx.error(f"value must be a scalar, has shape {list(value.shape)}")
    return ctx.emit("Expand", [value, _i64(ctx, dims)])


@tf_op("Range")
def range_(ctx: Ctx) -> Value:
    return ctx.emit("Range", [ctx.x(0), ctx.x(1), ctx.x(2)])


@tf_op("ZerosLike", "OnesLike")
def zeros_like(ctx: Ctx) -> Value:
    x = ctx.x(0)
    return ctx.const(np.full(x.shape, 0 if ctx.op_type == "ZerosLike" else 1, x.dtype))


@tf_op("SpaceToBatchND")
def space_to_batch(ctx: Ctx) -> Value:
    """Keras' dilated convolutions come as SpaceToBatchND -> Conv2D -> BatchToSpaceND: pad, then move
    each block offset of the spatial dimensions into the batch."""
    x = ctx.x(0)
    block = ctx.ints(1, "block_shape")
    p = ctx.const_input(2, "paddings").astype(np.int64)
    m = len(block)
    if p.shape != (m, 2) or len(x.shape) < m + 1 or min(block, default=1) < 1 or (p < 0).any():
        raise ctx.error(f"block_shape {block} and paddings {p.tolist()} do not fit an input of shape "
                        f"{list(x.shape)}")
    rest = list(x.shape[m + 1:])
    zeros = [0] * len(rest)
    if p.any():
        x = ctx.emit("Pad", [x, _i64(ctx, [0, *p[:, 0], *zeros, 0, *p[:, 1], *zeros])], mode="constant")
    spatial = x.shape[1:m + 1]
    if any(s % b for s, b in zip(spatial, block, strict=True)):
        raise ctx.error(f"padded spatial shape {list(spatial)} is not a multiple of block_shape {block}")
    split = [x.shape[0]] + [v for s, b in zip(spatial, block, strict=True) for v in (s // b, b)] + rest
    y = ctx.reshape(x, split)
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] + list(range(2 * m + 1, len(split)))
    y = ctx.transpose(y, perm)
    return ctx.reshape(y, [x.shape[0] * int(np.prod(block))] + [s // b for s, b in zip(spatial, block, strict=True)]
                       + rest)


@tf_op("BatchToSpaceND")
def batch_to_space(ctx: Ctx) -> Value:
    x = ctx.x(0)
    block = ctx.ints(1, "block_shape")
    c = ctx.const_input(2, "crops").astype(np.int64)
    m, nb = len(block), int(np.prod(block))
    if c.shape != (m, 2) or len(x.shape) < m + 1 or nb < 1 or x.shape[0] % nb or (c < 0).any():
        raise ctx.error(f"block_shape {block} and crops {c.tolist()} do not fit an input of shape {list(x.shape)}")
    batch, spatial, rest = x.shape[0] // nb, list(x.shape[1:m + 1]), list(x.shape[m + 1:])
    y = ctx.reshape(x, [*block, batch, *spatial, *rest])
    perm = [m] + [v for i in range(m) for v in (m + 1 + i, i)] + list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    y = ctx.reshape(ctx.transpose(y, perm), [batch, *[s * b for s, b in zip(spatial, block, strict=True)], *rest])
    if not c.any():
        return y
    ends = [s * b - e for s, b, e in zip(spatial, block, c[:, 1], strict=True)]
    return ctx.emit("Slice", [y, _i64(ctx, list(c[:, 0])), _i64(ctx, ends), _i64(ctx, list(range(1, m + 1)))])


@tf_op("Unpack")
def unpack(ctx: Ctx) -> list[Value]:
    x = ctx.x(0)
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(x.shape))
    num = int(ctx.attr("num", x.shape[axis]))
    if num != x.shape[axis]:
        raise ctx.error(f"num={num} but dimension {axis} has size {x.shape[axis]}")
    return [ctx.emit("Gather", [x, ctx.const(np.array(i, np.int64))], axis=axis) for i in range(num)]


@tf_op("MirrorPad")
def mirror_pad(ctx: Ctx) -> Value:
    """REFLECT is ONNX's reflect; SYMMETRIC (the edge repeated) has no ONNX mode: each padded side is
    a reversed slice, concatenated."""
    x = ctx.x(0)
    p = ctx.const_input(1, "paddings").astype(np.int64)
    mode = ctx.attr("mode")
    edge = {"REFLECT": 1, "SYMMETRIC": 0}.get(mode)
    if edge is None:
        raise ctx.error(f"mode {mode!r} is not supported (REFLECT or SYMMETRIC)")
    if p.shape != (len(x.shape), 2) or (p < 0).any() or any(
            max(b, a) > n - edge for (b, a), n in zip(p.tolist(), x.shape, strict=True)):
        raise ctx.error(f"paddings {p.tolist()} must be ({len(x.shape)}, 2) values from 0 to each dimension's size"
                        f"{' - 1' if edge else ''} for an input of shape {list(x.shape)}")
    if edge:
        return ctx.emit("Pad", [x, _i64(ctx, [*p[:, 0], *p[:, 1]])], mode="reflect")
    y = x
    for d, (before, after) in enumerate(p.tolist()):
        n = y.shape[d]
        parts = []
        if before:  # x[before-1::-1] along d
            parts.append(ctx.emit("Slice", [y, _i64(ctx, [before - 1]), _i64(ctx, [-n - 1]), _i64(ctx, [d]),
                                            _i64(ctx, [-1])]))
        parts.append(y)
        if after:  # x[n-1:n-1-after:-1] along d
            parts.append(ctx.emit("Slice", [y, _i64(ctx, [n - 1]), _i64(ctx, [n - 1 - after]), _i64(ctx, [d]),
                                            _i64(ctx, [-1])]))
        if len(parts) > 1:
            y = ctx.emit("Concat", parts, axis=d)
    return y


@tf_op("OneHot")
def one_hot(ctx: Ctx) -> Value:
    indices, on, off = ctx.x(0), ctx.x(2), ctx.x(3)
    (depth,) = ctx.ints(1, "depth")
    if depth < 0 or on.shape != () or off.shape != ():
        raise ctx.error(f"depth {depth} must be >= 0 and on_value, off_value scalars")
    axis = int(ctx.attr("axis", -1))
    if not -1 <= axis <= len(indices.shape):
        raise ctx.error(f"axis {axis} is out of range for indices of rank {len(indices.shape)}")
    # TF turns any index outside [0, depth) into a row of off_value; ONNX counts negative ones from the end.
    if np.dtype(indices.dtype).kind == "i":
        indices = ctx.emit("Where", [ctx.emit("Less", [indices, ctx.const(0, indices.dtype)]),
                                     ctx.const(depth, indices.dtype), indices])
    values = ctx.emit("Concat", [ctx.reshape(off, [1]), ctx.reshape(on, [1])], axis=0)
    return ctx.emit("OneHot", [indices, _i64(ctx, [depth]), values], axis=axis)
