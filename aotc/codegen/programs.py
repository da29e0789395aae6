"""The generated test and benchmark programs (``--gen-test``, ``--gen-benchmark``), like
tf_library's gen_test/gen_benchmark: plain C mains linked against the static library."""

from __future__ import annotations

import numpy as np

from aotc import __version__
from aotc.codegen.library import Library, env


def _tensors(infos, arrays: list[np.ndarray] | None, blob: list[bytes], size: list[int]) -> list[dict]:
    rows = []
    for i, t in enumerate(infos):
        elem = np.dtype(t.dtype).itemsize
        row = {"dtype_code": t.dtype_code, "c_string": t.c_string, "elem": elem, "size": t.size,
               "count": t.size, "offset": 0, "updated": t.updated}
        if arrays is not None:
            data = np.ascontiguousarray(arrays[i]).astype(np.dtype(t.dtype).newbyteorder("<")).tobytes()
            pad = (-size[0]) % 64
            blob.append(b"\0" * pad)
            row["offset"] = size[0] + pad
            blob.append(data)
            size[0] += pad + len(data)
        rows.append(row)
    return rows


def test_program(lib: Library, inputs: list[np.ndarray], expected: list[np.ndarray], reference: str,
                 rtol: float, atol: float, pool: bool) -> dict[str, bytes]:
    """NAME_test.c plus the inputs and expected outputs, embedded with .incbin."""
    blob: list[bytes] = []
    size = [0]
    ins = _tensors(lib.inputs, inputs, blob, size)
    outs = _tensors(lib.outputs, expected, blob, size)
    blob.append(b"\0" * 64)  # never an empty blob
    name = lib.name
    common = {"name": name, "version": __version__, "pool": pool, "state": lib.state}
    return {
        f"{name}_test.c": env().get_template("test_main.c.j2").render(
            **common, inputs=ins, outputs=outs, reference=reference, rtol=repr(float(rtol)),
            atol=repr(float(atol))).encode(),
        f"{name}_test_data.bin": b"".join(blob),
        f"{name}_test_data.S": env().get_template("consts.S.j2").render(
            **common, symbol=f"{name}_test_data").encode(),
    }


def benchmark_program(lib: Library, pool: bool) -> dict[str, bytes]:
    common = {"name": lib.name, "version": __version__, "pool": pool, "state": lib.state}
    return {f"{lib.name}_benchmark.c": env().get_template("benchmark_main.c.j2").render(
        **common, inputs=_tensors(lib.inputs, None, [], [0]),
        outputs=_tensors(lib.outputs, None, [], [0])).encode()}
