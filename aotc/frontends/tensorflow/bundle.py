"""TensorFlow's tensor-bundle checkpoint (a SavedModel's ``variables/``), read without TensorFlow.

``PREFIX.index`` is a LevelDB-format table (an immutable sorted string table): data blocks of
prefix-compressed key/value entries, an index block whose values point at the data blocks, and a
48-byte footer pointing at the index. Its keys are the tensors' checkpoint names, its values
BundleEntryProto messages (type, shape, and where the bytes are: shard, offset, size); the empty key
holds the BundleHeaderProto (shard count, byte order). ``PREFIX.data-SSSSS-of-NNNNN`` hold the raw
tensor bytes. Checksums are not verified: a damaged file is caught by the sizes, not the CRCs.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from aotc.errors import AotcError
from aotc.frontends.tensorflow.proto import own_messages
from aotc.frontends.tensorflow.tensors import from_numpy, shape_of, to_numpy
from aotc.ir import dtypes

_FOOTER_SIZE = 48  # two block handles (at most 2 x 2 x 10 bytes of varints), padded to 40, then the magic
_MAGIC = 0xDB4775248B80FB57
_BLOCK_TRAILER = 5  # compression type byte + masked CRC32C


class _Corrupt(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A base-128 varint at ``pos``: its value and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Corrupt("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _block_handle(data: bytes, pos: int) -> tuple[tuple[int, int], int]:
    offset, pos = _varint(data, pos)
    size, pos = _varint(data, pos)
    return (offset, size), pos


def _block(table: bytes, handle: tuple[int, int]) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of the block at ``handle``. Each entry stores how many bytes of the
    previous key it shares, then the rest of its key and its value; the restart array after the
    entries only speeds up seeking, so a full scan skips it."""
    offset, size = handle
    if offset + size + _BLOCK_TRAILER > len(table):
        raise _Corrupt(f"block at {offset} of {size} bytes runs past the end")
    if table[offset + size] != 0:
        raise _Corrupt(f"block at {offset} is compressed (type {table[offset + size]}); TensorFlow writes "
                       "bundle indexes uncompressed")
    block = table[offset:offset + size]
    if size < 4:
        raise _Corrupt(f"block at {offset} is too short")
    (restarts,) = struct.unpack_from("<I", block, size - 4)
    end = size - 4 * (restarts + 1)
    if end < 0:
        raise _Corrupt(f"block at {offset} has {restarts} restarts in {size} bytes")
    entries, pos, key = [], 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + length > end:
            raise _Corrupt(f"bad entry in block at {offset}")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + length]))
        pos += length
    return entries


def read_table(data: bytes) -> dict[bytes, bytes]:
    """Every key and value of a LevelDB-format table."""
    if len(data) < _FOOTER_SIZE:
        raise _Corrupt(f"{len(data)} bytes is shorter than a table footer")
    footer = data[-_FOOTER_SIZE:]
    (magic,) = struct.unpack_from("<Q", footer, 40)
    if magic != _MAGIC:
        raise _Corrupt("no table magic number at the end")
    _metaindex, pos = _block_handle(footer, 0)
    index, _ = _block_handle(footer, pos)
    out: dict[bytes, bytes] = {}
    for _, handle in _block(data, index):
        h, _ = _block_handle(handle, 0)
        out.update(_block(data, h))
    return out


class Bundle:
    """The tensors of the checkpoint at ``prefix`` (``.../variables/variables``), read on demand."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        index = Path(f"{prefix}.index")
        if not index.is_file():
            raise AotcError(f"{index}: no checkpoint index (a SavedModel keeps its variables in "
                            "variables/variables.index and variables.data-*)")
        msgs = own_messages()
        try:
            table = read_table(index.read_bytes())
            header = msgs["BundleHeaderProto"].FromString(table.pop(b"", b""))
            self.entries: dict[str, Any] = {k.decode("utf-8", "replace"): msgs["BundleEntryProto"].FromString(v)
                                            for k, v in table.items()}
        except Exception as e:  # _Corrupt, protobuf's DecodeError
            raise AotcError(f"{index}: not a TensorFlow checkpoint index ({' '.join(str(e).split())})") from None
        self.shards = max(int(header.num_shards), 1)
        self.big_endian = header.endianness == 1

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def read(self, key: str) -> np.ndarray:
        if key not in self.entries:
            raise AotcError(f"checkpoint {self.prefix}: no tensor {key!r}")
        e = self.entries[key]
        what = f"checkpoint {self.prefix}: tensor {key!r}"
        if e.slices:
            raise AotcError(f"{what} is saved in slices (a partitioned variable): not supported")
        dt = to_numpy(e.dtype, what)
        if dt == dtypes.STRING:
            raise AotcError(f"{what} is a string tensor: not supported")
        shape = shape_of(e.shape)
        if shape is None or any(d is None for d in shape):
            raise AotcError(f"{what} has no static shape")
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if e.size != n:
            raise AotcError(f"{what}: {e.size} bytes stored, shape {shape} of {from_numpy(dt)} needs {n}")
        path = Path(f"{self.prefix}.data-{e.shard_id:05d}-of-{self.shards:05d}")
        try:
            with open(path, "rb") as f:
                f.seek(e.offset)
                raw = f.read(n)
        except OSError as err:
            raise AotcError(f"{what}: cannot read {path}: {err.strerror or err}") from None
        if len(raw) != n:
            raise AotcError(f"{what}: {path} ends before its {n} bytes at offset {e.offset}")
        order = dt.newbyteorder(">" if self.big_endian else "<")
        return np.frombuffer(raw, dtype=order).astype(dt).reshape(shape)
