"""The generated test and benchmark programs of a CUDA library (``--gen-test``, ``--gen-benchmark``): CUDA
mains linked against the static library, the test data embedded as for the C library's programs."""

from __future__ import annotations

import numpy as np

from aotc import __version__
from aotc.codegen.library import Library, env
from aotc.codegen.programs import _tensors


def cuda_test_program(lib: Library, inputs: list[np.ndarray], expected: list[np.ndarray], reference: str,
                      rtol: float, atol: float) -> dict[str, bytes]:
    """NAME_test.cu plus the inputs and expected outputs, embedded with .incbin."""
    blob: list[bytes] = []
    size = [0]
    ins = _tensors(lib.inputs, inputs, blob, size)
    outs = _tensors(lib.outputs, expected, blob, size)
    blob.append(b"\0" * 64)
    common = {"name": lib.name, "version": __version__}
    return {
        f"{lib.name}_test.cu": env().get_template("cuda/test_main.cu.j2").render(
            **common, inputs=ins, outputs=outs, reference=reference, rtol=repr(float(rtol)),
            atol=repr(float(atol))).encode(),
        f"{lib.name}_test_data.bin": b"".join(blob),
        f"{lib.name}_test_data.S": env().get_template("consts.S.j2").render(
            **common, symbol=f"{lib.name}_test_data").encode(),
    }


def cuda_benchmark_program(lib: Library) -> dict[str, bytes]:
    common = {"name": lib.name, "version": __version__}
    return {f"{lib.name}_benchmark.cu": env().get_template("cuda/benchmark_main.cu.j2").render(
        **common, inputs=_tensors(lib.inputs, None, [], [0]), outputs=_tensors(lib.outputs, None, [], [0])).encode()}
