"""End-to-end tests of the examples: examples/c_app (Makefile) and examples/mnist/run.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
C_APP = REPO / "examples" / "c_app"
MNIST = REPO / "examples" / "mnist"
TIMEOUT = 300  # seconds per subprocess; a hang should fail, not stall CI

LOGIT_RE = re.compile(r"^logit\[(\d+)\]:\s*(\S+)\s*$", re.MULTILINE)
ARGMAX_RE = re.compile(r"^argmax:\s*(\d+)\s*$", re.MULTILINE)


def aotc_command() -> str | None:
    """The aotc console script, preferring the one installed next to this Python."""
    beside = Path(sys.executable).with_name("aotc")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("aotc")


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"required tool(s) not on PATH: {', '.join(missing)}")


def app_input() -> np.ndarray:
    """The input app.c feeds the model: x[i] = ((i * 37) % 256) / 255.0f, shape [1, 784]."""
    i = np.arange(784, dtype=np.int64)
    return (((i * 37) % 256).astype(np.float32) / np.float32(255.0)).reshape(1, 784)


def parse_app_output(text: str) -> tuple[int, np.ndarray]:
    """Parse app.c's "argmax: k" and "logit[i]: v" lines."""
    found = {int(i): float(v) for i, v in LOGIT_RE.findall(text)}
    assert sorted(found) == list(range(10)), f"expected logit[0..9] in output:\n{text}"
    argmax = ARGMAX_RE.search(text)
    assert argmax is not None, f"no argmax line in output:\n{text}"
    return int(argmax.group(1)), np.array([found[i] for i in range(10)], dtype=np.float64)


def first_output(result: object) -> np.ndarray:
    if isinstance(result, dict):
        result = list(result.values())
    if isinstance(result, np.ndarray):
        return result
    return np.asarray(result[0])  # type: ignore[index]


class CApp:
    """A copy of examples/c_app in a temporary directory, driven with make."""

    def __init__(self, root: Path, aotc: str) -> None:
        self.dir = root / "c_app"
        shutil.copytree(C_APP, self.dir, ignore=shutil.ignore_patterns("build", "app", "*.o"))
        make_models = root / "make_models.py"
        shutil.copy2(MNIST / "make_models.py", make_models)
        self.variables = [
            f"MAKE_MODELS={make_models}",
            f"PYTHON={sys.executable}",
            f"AOTC={aotc}",
        ]
        self.build = self.dir / "build"
        self.lib = self.build / "libmlp.a"
        self.model = self.build / "mlp.onnx"

    def make(self, *goals: str) -> subprocess.CompletedProcess[str]:
        cmd = ["make", "-C", str(self.dir), *goals, *self.variables]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc


@pytest.fixture(scope="module")
def c_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[CApp, str]:
    """Build and run the C example once; return it and the output of `make run`."""
    require_tools("make", "cc")
    pytest.importorskip("onnx")
    aotc = aotc_command()
    if aotc is None:
        pytest.skip("the aotc command is not installed (pip install -e .)")
    app = CApp(tmp_path_factory.mktemp("examples"), aotc)
    proc = app.make("run")
    return app, proc.stdout


def test_c_app_prints_finite_logits(c_app: tuple[CApp, str]) -> None:
    app, out = c_app
    argmax, logits = parse_app_output(out)
    assert np.all(np.isfinite(logits))
    assert argmax == int(np.argmax(logits))
    assert app.lib.is_file() and (app.build / "mlp.h").is_file()


def test_c_app_matches_python(c_app: tuple[CApp, str]) -> None:
    app, out = c_app
    _, logits = parse_app_output(out)
    x = app_input()

    aotc = pytest.importorskip("aotc")
    compiled = aotc.load(str(app.build / "mlp"))
    via_python = first_output(compiled.run({"x": x})).reshape(-1)
    np.testing.assert_allclose(logits, via_python, rtol=0, atol=1e-4)

    try:
        import onnxruntime as ort
    except ImportError:
        return
    session = ort.InferenceSession(str(app.model), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0].reshape(-1)
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4)


def test_c_app_rebuilds_only_when_needed(c_app: tuple[CApp, str]) -> None:
    app, _ = c_app
    before = app.lib.stat().st_mtime_ns

    # Nothing changed: a second make must not run aotc again.
    proc = app.make()
    assert app.lib.stat().st_mtime_ns == before, f"libmlp.a was rebuilt:\n{proc.stdout}"
    assert " compile " not in proc.stdout

    # Touch the model (strictly later than the library, even on coarse
    # timestamp file systems): the library must be rebuilt.
    while time.time() < before / 1e9 + 1.05:
        time.sleep(0.1)
    app.model.touch()
    proc = app.make("run")
    assert app.lib.stat().st_mtime_ns > before, f"libmlp.a was not rebuilt:\n{proc.stdout}"
    assert " compile " in proc.stdout
    _, logits = parse_app_output(proc.stdout)
    assert np.all(np.isfinite(logits))


def test_mnist_run_py(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("aotc")
    require_tools("cc")
    proc = subprocess.run(
        [sys.executable, str(MNIST / "run.py"), "--out-dir", str(tmp_path), "--images", "2"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"run.py failed:\n{proc.stdout}\n{proc.stderr}"
    assert "max abs error" in proc.stdout
    assert "OK" in proc.stdout
    assert (tmp_path / "softmax.onnx").is_file() and (tmp_path / "mlp.onnx").is_file()
