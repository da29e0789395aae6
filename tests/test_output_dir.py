"""What aotc writes into an output directory and how it builds there: a failed or interrupted compile
leaves the previous model whole, ninja never outlives aotc, the library and its description share a
build id, nothing clashes with other build systems or models, and bad paths are one-line errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import dense_relu, ort_run

import aotc
from aotc.build import build_dir, ninja_binary, run_ninja
from aotc.cli import _parser, main
from aotc.compiler import compile_model
from aotc.errors import AotcError, BuildError

A = dense_relu(m=2, k=4, n=3, seed=0)  # the model already in the output directory
B = dense_relu(m=3, k=4, n=3, seed=1)  # the model a later compile brings


@pytest.fixture(scope="module")
def compiled_a(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a")
    compile_model(A, out, "m", gen_test=True, gen_benchmark=True, profile=True)
    return out


@pytest.fixture
def out(compiled_a: Path, tmp_path: Path) -> Path:
    """A copy of an output directory that holds model A as "m" (with its test and benchmark)."""
    return Path(shutil.copytree(compiled_a, tmp_path / "out"))


def _delivered(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def _assert_runs(out: Path, model: onnx.ModelProto) -> None:
    m = aotc.load(out / "m")
    x = np.random.default_rng(0).standard_normal(m.inputs[0].shape).astype(np.float32)
    np.testing.assert_allclose(m.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def _processes_in(path: Path) -> list[str]:
    """Command lines of the processes working in ``path`` (ninja -C and the compilers it starts)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cwd = os.readlink(proc / "cwd")
            if cwd == str(path) or cwd.startswith(f"{path}/"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # not a process, gone, or a zombie
            continue
    return found


def test_a_failed_build_leaves_the_previous_model(out):
    before = _delivered(out)
    with pytest.raises(BuildError) as info:
        compile_model(B, out, "m", extra_cflags=["-include", "no_such_header_for_aotc.h"])
    assert "\n" not in str(info.value)
    assert _delivered(out) == before
    _assert_runs(out, A)
    proc = subprocess.run([str(out / "m_test")], capture_output=True, text=True)
    assert proc.returncode == 0 and "m_test: PASSED" in proc.stdout


def test_an_exception_during_the_build_stops_ninja_and_leaves_the_previous_model(out):
    def log(msg: str) -> None:
        if msg.startswith("C compilation ["):
            raise RuntimeError("stop here")

    before = _delivered(out)
    with pytest.raises(RuntimeError, match="stop here"):
        compile_model(B, out, "m", log=log)
    assert _processes_in(build_dir(out, "m").resolve()) == []
    assert _delivered(out) == before
    _assert_runs(out, A)


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="finds processes through /proc")
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_aotc_alone_stops_ninja_and_leaves_the_previous_model(out, tmp_path, sig, status):
    """The signal reaches aotc only (as from `kill`, not the terminal's process group): aotc stops
    ninja and its compilers, exits with the signal's status and leaves model A as it was."""
    before = _delivered(out)
    onnx.save(B, tmp_path / "b.onnx")
    slow_cc = tmp_path / "slow-cc"
    slow_cc.write_text('#!/bin/sh\nsleep 60\nexec cc "$@"\n')
    slow_cc.chmod(0o755)
    build = build_dir(out, "m").resolve()
    proc = subprocess.Popen([sys.executable, "-m", "aotc", "compile", str(tmp_path / "b.onnx"), "-o", str(out),
                             "-n", "m"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CC": str(slow_cc)})
    try:
        deadline = time.monotonic() + 60
        while not any(cmd.startswith("sleep") for cmd in _processes_in(build)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == status and "Traceback" not in err, err
    assert _processes_in(build) == []
    assert _delivered(out) == before
    _assert_runs(out, A)


def test_an_interrupt_while_delivering_waits_for_the_whole_delivery(out, monkeypatch):
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == out / "m.h":  # the first file renamed into the output directory
            os.kill(os.getpid(), signal.SIGINT)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        compile_model(B, out, "m")
    monkeypatch.undo()
    _assert_runs(out, B)
    assert not (out / "m_test").exists()


def test_programs_and_trace_of_an_earlier_compile_are_removed(out):
    (out / "m_trace.json").write_text("{}")
    res = compile_model(B, out, "m")
    for gone in ("m_test", "m_benchmark", "m_trace.json"):
        assert not (out / gone).exists(), gone
    assert sorted(_delivered(out)) == ["aotc_types.h", "libm.a", "libm.so", "m.cdef", "m.h", "m.json"]
    left = {p.name for p in res.build_dir.rglob("*")}
    assert not left & {"m_test", "m_test.c", "m_test_data.bin", "m_test.o", "m_benchmark", "m_benchmark.c"}
    _assert_runs(out, B)


def test_a_library_from_another_build_is_refused(out, tmp_path):
    compile_model(B, tmp_path / "b", "m")
    shutil.copy(tmp_path / "b" / "libm.so", out / "libm.so")
    with pytest.raises(AotcError, match=r"libm.so is build \w+, not build \w+ that .*m.json describes"):
        aotc.load(out / "m")
    shutil.copy(tmp_path / "b" / "m.cdef", out / "m.cdef")
    with pytest.raises(AotcError, match=r"m.cdef is not from the build .*m.json describes"):
        aotc.load(out / "m")
    (out / "m.json").write_text('{"name": "m", "inputs": [], "outputs": [], "workspace_bytes": 0}')
    with pytest.raises(AotcError, match="no build id"):
        aotc.load(out / "m")


def test_the_default_output_directory_leaves_cmake_alone(tmp_path, monkeypatch):
    """`aotc compile m.onnx` in a CMake project root; even `-o build` leaves CMake's build.ninja."""
    monkeypatch.chdir(tmp_path)
    onnx.save(A, "m.onnx")
    (tmp_path / "build").mkdir()
    cmake_ninja = b"# CMAKE generated file: DO NOT EDIT!\n"
    (tmp_path / "build" / "build.ninja").write_bytes(cmake_ninja)
    assert _parser().parse_args(["compile", "m.onnx"]).out_dir == "aotc-out"
    aotc.compile("m.onnx")
    assert (tmp_path / "aotc-out" / "m.h").is_file() and (tmp_path / "aotc-out" / "libm.so").is_file()
    compile_model("m.onnx", "build", "m")
    assert (tmp_path / "build" / "build.ninja").read_bytes() == cmake_ninja
    assert [p.name for p in tmp_path.rglob("build.ninja")] == ["build.ninja"] * 3  # CMake's and two of aotc's


def test_recompiling_with_a_depfile_rebuilds_nothing(tmp_path):
    """The depfile flow touches the delivered header and libraries (Make compares mtimes); that must
    not make the build tree's sources look newer than their objects."""
    onnx.save(A, tmp_path / "a.onnx")
    for _ in range(2):
        res = compile_model(tmp_path / "a.onnx", tmp_path / "o", "m", depfile=tmp_path / "m.d")
    assert "ninja: no work to do." in (res.build_dir / "build.log").read_text()
    assert (tmp_path / "m.d").read_text().startswith(f"{tmp_path / 'o' / 'libm.a'} ")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_a_depfile_naming_a_colon_is_read_by_make(tmp_path):
    model = tmp_path / "a:b #1.onnx"
    onnx.save(A, model)
    compile_model(model, tmp_path / "o", "m", depfile=tmp_path / "m.d")
    assert "a\\:b\\ \\#1.onnx" in (tmp_path / "m.d").read_text()
    (tmp_path / "Makefile").write_text(f"include m.d\n{tmp_path / 'o' / 'libm.a'}:\n\techo rebuild\n")
    proc = subprocess.run(["make", "-n", str(tmp_path / "o" / "libm.a")], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "rebuild" not in proc.stdout, proc.stderr
    os.utime(model)  # the model is now newer than the library
    proc = subprocess.run(["make", "-n", str(tmp_path / "o" / "libm.a")], cwd=tmp_path, capture_output=True,
                          text=True)
    assert "rebuild" in proc.stdout, proc.stderr


def test_two_models_in_one_directory_both_stay_buildable(tmp_path):
    # A build.ninja from an aotc that built in OUT itself, for model b: it would rebuild b's old library.
    old = b"# build.ninja: generated by aotc 0.1.0 for b. Run `ninja` in this directory.\n"
    (tmp_path / "build.ninja").write_bytes(old)
    compile_model(A, tmp_path, "a")
    assert (tmp_path / "build.ninja").read_bytes() == old  # another model's
    compile_model(B, tmp_path, "b")
    assert not (tmp_path / "build.ninja").exists()
    for name in ("a", "b"):
        proc = subprocess.run([ninja_binary(), "-C", str(build_dir(tmp_path, name)), "-n"],
                              capture_output=True, text=True, check=True)
        assert "no work to do" in proc.stdout
        assert aotc.load(tmp_path / name).inputs[0].shape == ((2, 4) if name == "a" else (3, 4))


def test_a_build_ninja_aotc_did_not_write_is_not_overwritten(tmp_path):
    mine = build_dir(tmp_path, "m") / "build.ninja"
    mine.parent.mkdir(parents=True)
    mine.write_text("# written by hand\n")
    with pytest.raises(AotcError, match="build.ninja was not written by aotc: not overwriting it"):
        compile_model(A, tmp_path, "m")
    assert mine.read_text() == "# written by hand\n"


def test_a_compiler_error_names_the_kernel_and_the_log(tmp_path):
    res = compile_model(A, tmp_path, "m")
    fn = res.library.kernels[0].fn
    src = res.build_dir / "m_kernels_0.c"
    lines = src.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("void " + fn + "("))
    lines.insert(at + 1, "    int broken_by_the_test = ;\n")
    src.write_text("".join(lines))
    with pytest.raises(BuildError) as info:
        run_ninja(res.build_dir, kernels=[k.fn for k in res.library.kernels])
    msg = str(info.value)
    assert msg.startswith(f"C compiler failed on {src} in kernel {fn}: ") and "\n" not in msg, msg
    assert f"m_kernels_0.c:{at + 2}:" in msg and f"full output in {res.build_dir / 'build.log'}" in msg
    assert "broken_by_the_test" in (res.build_dir / "build.log").read_text()


def _error(capsys, *argv: str) -> str:
    """Run the CLI in this process; it must fail with exit status 1 and one line on stderr."""
    assert main(list(argv)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aotc: error: "), lines
    return lines[0]


def test_bad_output_paths_are_one_line_errors(compiled_a, tmp_path, capsys):
    model = str(tmp_path / "m.onnx")
    onnx.save(A, model)
    file = tmp_path / "file"
    file.write_text("not a directory")
    compile_m = ("compile", model, "-n", "m")
    assert f"output directory {file} is a file, not a directory" in _error(capsys, *compile_m, "-o", str(file))
    assert f"{file} is a file" in _error(capsys, *compile_m, "-o", str(file / "sub"))
    assert f"dump directory {file} is a file" in _error(capsys, *compile_m, "-o", str(tmp_path / "o"),
                                                        "--dump-to", str(file))
    assert "depfile directory" in _error(capsys, *compile_m, "-o", str(tmp_path / "o"), "--depfile",
                                         str(file / "m.d"))
    assert "is a directory" in _error(capsys, *compile_m, "-o", str(tmp_path / "o"), "--depfile", str(tmp_path))
    newline = tmp_path / "m\nx.onnx"
    onnx.save(A, newline)
    assert "line break" in _error(capsys, "compile", str(newline), "-n", "m", "-o", str(tmp_path / "o"),
                                  "--depfile", str(tmp_path / "m.d"))
    assert not (tmp_path / "o").exists()  # all refused before compiling
    # An OSError while writing: the output directory's build trees are in a file.
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / ".aotc").write_text("")
    assert f"cannot write {tmp_path / 'o' / '.aotc'}" in _error(capsys, *compile_m, "-o", str(tmp_path / "o"))
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert f"{ro} is not writable" in _error(capsys, *compile_m, "-o", str(ro / "sub"))
    assert f"--output-dir {file} is a file" in _error(capsys, "run", str(compiled_a / "m"), "--output-dir", str(file))
    assert f"cannot write {file}" in _error(capsys, "profile", str(compiled_a / "m"), "-i", "1",
                                                       "--trace", str(file / "t.json"))
