"""Tests of the CMake integration (cmake/aotc.cmake and the top-level CMakeLists.txt)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 300

SOFTMAX_APP = r"""
#include <stdio.h>
#include <stdlib.h>
#include "mnist_softmax.h"

int main(void) {
    static float x[784];
    static float y[10];
    for (int i = 0; i < 784; ++i) x[i] = (float)(i % 17) / 16.0f;
    void *ws = aligned_alloc(64, (MNIST_SOFTMAX_WORKSPACE_BYTES + 127) / 64 * 64);
    if (ws == NULL) return 2;
    int rc = mnist_softmax_run(x, y, ws);
    free(ws);
    if (rc != 0) { fprintf(stderr, "rc=%d\n", rc); return 1; }
    for (int i = 0; i < 10; ++i) printf("prob[%d]: %.9g\n", i, (double)y[i]);
    return 0;
}
"""

CMAKELISTS = """
cmake_minimum_required(VERSION 3.16)
project(aotc_cmake_test LANGUAGES C)
include("{module}")

# Default NAME (the target name) and a relative MODEL path.
aotc_add_model(mlp MODEL models/mlp.onnx)
add_executable(app app.c)
target_link_libraries(app PRIVATE mlp)

# Explicit NAME and TARGET_CPU.
aotc_add_model(digits MODEL "${{CMAKE_CURRENT_SOURCE_DIR}}/models/softmax.onnx"
               NAME mnist_softmax TARGET_CPU generic)
add_executable(softmax_app softmax_app.c)
target_link_libraries(softmax_app PRIVATE digits)
"""


def aotc_command() -> str | None:
    beside = Path(sys.executable).with_name("aotc")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("aotc")


def generator_args() -> list[str]:
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def parse(prefix: str, text: str) -> np.ndarray:
    found = {int(i): float(v) for i, v in re.findall(rf"^{prefix}\[(\d+)\]:\s*(\S+)\s*$", text, re.M)}
    assert sorted(found) == list(range(10)), f"expected {prefix}[0..9] in output:\n{text}"
    return np.array([found[i] for i in range(10)])


@pytest.fixture(scope="module")
def toolchain() -> None:
    for tool in ("cmake", "cc"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH")


def test_toplevel_cmakelists_without_models(toolchain: None, tmp_path: Path) -> None:
    """Configuring and building the repository's CMakeLists.txt alone is harmless."""
    build = tmp_path / "build"
    run(["cmake", "-S", str(REPO), "-B", str(build), *generator_args()])
    run(["cmake", "--build", str(build)])


def test_aotc_add_model(toolchain: None, tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    aotc = aotc_command()
    if aotc is None:
        pytest.skip("the aotc command is not installed (pip install -e .)")

    sys.path.insert(0, str(REPO / "examples" / "mnist"))
    try:
        import make_models
    finally:
        sys.path.pop(0)

    src = tmp_path / "src"
    paths = make_models.write_models(src / "models")
    shutil.copy2(REPO / "examples" / "c_app" / "app.c", src / "app.c")
    (src / "softmax_app.c").write_text(SOFTMAX_APP)
    module = (REPO / "cmake" / "aotc.cmake").as_posix()
    (src / "CMakeLists.txt").write_text(CMAKELISTS.format(module=module))

    build = tmp_path / "build"
    run(["cmake", "-S", str(src), "-B", str(build), *generator_args(), f"-DAOTC_EXECUTABLE={aotc}"])
    run(["cmake", "--build", str(build)])

    logits = parse("logit", run([str(build / "app")]).stdout)
    probs = parse("prob", run([str(build / "softmax_app")]).stdout)
    assert np.all(np.isfinite(logits))
    assert abs(probs.sum() - 1.0) < 1e-5 and np.all(probs >= 0)

    i = np.arange(784)
    x_app = (((i * 37) % 256).astype(np.float32) / np.float32(255.0)).reshape(1, 784)
    x_softmax = ((i % 17).astype(np.float32) / np.float32(16.0)).reshape(1, 784)
    try:
        import onnxruntime as ort
    except ImportError:
        pass
    else:
        for path, x, got in ((paths["mlp"], x_app, logits), (paths["softmax"], x_softmax, probs)):
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            want = session.run(None, {"x": x})[0].reshape(-1)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)

    # A second build with nothing changed must not run aotc again.
    again = run(["cmake", "--build", str(build)])
    assert "aotc: compiling" not in again.stdout, again.stdout
