"""--gen-test and --gen-benchmark: C programs built by the library's own build.ninja; and what the
command line shows while it compiles (progress on a terminal, quiet in logs, C errors)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import numpy as np
import pytest
from models import make, mlp, vi
from onnx import TensorProto, helper

from aotc.build import run_ninja
from aotc.compiler import compile_model
from aotc.config import parse_config
from aotc.errors import BuildError


def _mixed_dtypes():
    """float, int64 and bool inputs; float, int64 and bool outputs."""
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=0),
             helper.make_node("Where", ["b", "g", "g"], ["w"]),
             helper.make_node("Softmax", ["w"], ["s"], axis=-1),
             helper.make_node("Cast", ["i"], ["ii"], to=TensorProto.INT64),
             helper.make_node("Not", ["b"], ["nb"])]
    return make(nodes, [vi("x", [6, 5]), vi("i", [4], TensorProto.INT64), vi("b", [4, 5], TensorProto.BOOL)],
                [vi("s", [4, 5]), vi("ii", [4], TensorProto.INT64), vi("nb", [4, 5], TensorProto.BOOL)])


@pytest.mark.parametrize("case", ["mlp", "mixed", "config"])
def test_generated_test_passes(tmp_path, case):
    model = _mixed_dtypes() if case == "mixed" else mlp(3)
    cfg = parse_config('fetch { id { node_name: "h0" } name: "hidden" }') if case == "config" else None
    res = compile_model(model, tmp_path, "m", config=cfg, gen_test=True)
    assert "build m_test:" in (res.build_dir / "build.ninja").read_text()
    proc = subprocess.run([str(tmp_path / "m_test")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    assert "m_test: PASSED" in proc.stdout
    assert len(re.findall(r"^ok ", proc.stdout, re.M)) == len(res.library.outputs)
    assert "2 threads gave different bits" not in proc.stdout


def test_generated_test_can_fail(tmp_path):
    """Corrupt one stored expected value: the program reports it and exits 1."""
    build = compile_model(mlp(2), tmp_path, "m", gen_test=True).build_dir
    blob = build / "m_test_data.bin"
    data = bytearray(blob.read_bytes())
    x_bytes = 2 * 784 * 4
    out_at = (x_bytes + 63) // 64 * 64
    first = np.frombuffer(bytes(data[out_at:out_at + 4]), np.float32)[0]
    data[out_at:out_at + 4] = np.float32(first + 1.0).tobytes()
    blob.write_bytes(bytes(data))
    run_ninja(build)  # the .incbin dependency rebuilds the test program
    proc = subprocess.run([str(build / "m_test")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "FAIL logits" in proc.stdout and "logits[0]" in proc.stdout and "FAILED" in proc.stdout


def test_generated_benchmark(tmp_path):
    compile_model(mlp(1), tmp_path, "m", gen_benchmark=True)
    for threads in ("1", "2"):
        proc = subprocess.run([str(tmp_path / "m_benchmark"), "-t", threads, "-n", "30", "-w", "3"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        m = re.search(r"30 iterations, (\d) thread\(s\), latency in us: min ([\d.]+)  p50 ([\d.]+)  "
                      r"p90 ([\d.]+)  p99 ([\d.]+)  max ([\d.]+)", proc.stdout)
        assert m and m.group(1) == threads, proc.stdout
        values = [float(v) for v in m.groups()[1:]]
        assert values == sorted(values) and values[0] > 0
    bad = subprocess.run([str(tmp_path / "m_benchmark"), "-x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def _cli(*args: str, tty: bool = False) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "aotc", *args]
    if not tty:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return proc.returncode, proc.stdout, proc.stderr
    leader, follower = pty.openpty()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.returncode, proc.stdout, b"".join(chunks).decode()


def test_progress_on_a_terminal_quiet_in_logs(tmp_path):
    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp(1).SerializeToString())
    rc, out, err = _cli("compile", str(model), "-o", str(tmp_path / "a"), "-n", "m")
    assert rc == 0 and err == "" and out.startswith("aotc: compiled m: 3 kernels")
    rc, out, err = _cli("compile", str(model), "-o", str(tmp_path / "b"), "-n", "m", "--gen-test", tty=True)
    assert rc == 0 and "\r\x1b[K" in err
    assert "pass fuse" in err and "C compilation [" in err and "m_test" in out
    rc, out, err = _cli("compile", str(model), "-o", str(tmp_path / "c"), "-n", "m", "-v")
    assert rc == 0 and "aotc: pass simplify" in err and "\x1b" not in err
    rc, out, err = _cli("compile", str(model), "-o", str(tmp_path / "d"), "-n", "m", "-q", tty=True)
    assert rc == 0 and out == "" and err == ""


def test_c_compiler_failure_names_the_file_and_keeps_the_directory(tmp_path):
    with pytest.raises(BuildError) as info:
        compile_model(mlp(1), tmp_path, "m", extra_cflags=["-include", "no_such_header_for_aotc.h"])
    msg, build = str(info.value), tmp_path / ".aotc" / "m"
    assert re.search(rf"C compiler failed on {re.escape(str(build))}/m\w*\.c", msg), msg
    assert "no_such_header_for_aotc.h" in msg and "kept for a bug report" in msg and "\n" not in msg
    assert f"full output in {build / 'build.log'}" in msg
    assert "no_such_header_for_aotc.h" in (build / "build.log").read_text()
    assert (build / "m.c").exists() and (build / "build.ninja").exists() and not (tmp_path / "m.h").exists()
