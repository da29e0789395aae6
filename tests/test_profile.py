"""Timelines: --profile builds record per-kernel times; m.profile() gives a table and a Chrome trace."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from models import mlp, random_feeds

import aotc
from aotc.compiler import compile_model
from aotc.dump import summary_dict


def _check_trace_format(trace: dict) -> None:
    """The Trace Event Format (JSON object form) as chrome://tracing and Perfetto read it."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    assert trace.get("displayTimeUnit") in (None, "ms", "ns")
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["ts"] >= 0 and e["dur"] >= 0
        else:
            assert e["name"] in ("process_name", "thread_name") and "name" in e["args"]


@pytest.mark.parametrize("threads", [1, 2])
def test_profile_table_and_trace(tmp_path, threads):
    res = compile_model(mlp(16), tmp_path, "m", profile=True)
    m = aotc.load(tmp_path / "m", threads=threads)
    feeds = random_feeds(m)
    prof = m.profile(feeds, iterations=7, trace=tmp_path / "trace.json")
    summary_names = [k["name"] for k in summary_dict(res.graph)["kernels"]]
    rows = prof.rows()
    assert [r["name"] for r in rows] == summary_names == [k["name"] for k in m.metadata["kernels"]]
    assert all(r["calls"] == 7 and r["total_us"] > 0 for r in rows)
    assert rows[0]["ops"] == "MatMul+Add+Relu"
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-9
    table = prof.table()
    assert all(n in table for n in summary_names) and f"on {threads} thread" in table

    trace = json.loads((tmp_path / "trace.json").read_text())
    _check_trace_format(trace)
    runs = [e for e in trace["traceEvents"] if e.get("cat") == "run"]
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert len(runs) == 7 and len(kernels) == 7 * len(summary_names)
    assert {e["name"] for e in kernels} == set(summary_names)
    for run in runs:  # kernels nest inside their run, in order
        inside = [e for e in kernels if e["args"]["iteration"] == run["args"]["iteration"]]
        assert [e["name"] for e in inside] == summary_names
        assert all(run["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= run["ts"] + run["dur"] + 1e-3
                   for e in inside)
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(inside, inside[1:], strict=False))
    # The profiled run computes the same outputs as the plain one.
    np.testing.assert_array_equal(m.run(feeds)[0], aotc.load(tmp_path / "m").run(feeds)[0])


def test_no_timing_code_without_profile(tmp_path):
    compile_model(mlp(1), tmp_path, "m")
    source = (tmp_path / ".aotc" / "m" / "m.c").read_text()
    assert "clock_gettime" not in source and "times[" not in source
    assert "run_profiled" not in (tmp_path / "m.h").read_text()
    m = aotc.load(tmp_path / "m")
    with pytest.raises(aotc.AotcError, match="--profile"):
        m.profile(random_feeds(m))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True)


def test_cli_profile(tmp_path):
    (tmp_path / "mlp.onnx").write_bytes(mlp(2).SerializeToString())
    proc = _cli("compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "out"), "-n", "m", "--profile")
    assert proc.returncode == 0, proc.stderr
    proc = _cli("profile", str(tmp_path / "out" / "m"), "-i", "5", "-t", "2")
    assert proc.returncode == 0, proc.stderr
    assert "k0_matmul_add_relu" in proc.stdout and "5 runs on 2 thread(s)" in proc.stdout
    _check_trace_format(json.loads((tmp_path / "out" / "m_trace.json").read_text()))

    proc = _cli("compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "plain"), "-n", "m", "-q")
    assert proc.returncode == 0 and proc.stdout == ""
    proc = _cli("profile", str(tmp_path / "plain" / "m"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "not compiled with --profile" in proc.stderr
