"""Targets (aotc/target.py, aotc/isa.py): libraries cross-compiled for aarch64 (NEON kernels) and
riscv64 (the portable kernels) with Debian's cross compilers, checked by their generated test programs
under qemu-user -- a small CNN, a Transformer block and a sample of the ONNX backend node cases with the
suite's own data; the ``generic`` target with gcc and clang; every ISA table entry compiled by its
compiler; and what this machine refuses to load.

CI installs the cross compilers, qemu-user and clang (.ci/run), so a missing tool fails these tests
instead of skipping them. Small shapes and -O1 keep qemu's share short.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aotc
import aotc.target
from aotc.codegen.gemm import render_gemm
from aotc.compiler import compile_model
from aotc.errors import AotcError
from aotc.isa import ISAS, isa_for_macros
from aotc.ops.conv import bcast_tile_kernel
from aotc.ops.gemm_plan import GemmSpec, plan_gemm
from aotc.target import for_isa, host_arch, resolve

CROSS = ["aarch64-linux-gnu", "riscv64-linux-gnu"]
FAST = ["-O1"]
F = TensorProto.FLOAT


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    assert not missing, (f"{', '.join(missing)} not installed (Debian: apt-get install gcc-aarch64-linux-gnu "
                         "gcc-riscv64-linux-gnu qemu-user clang; .ci/run installs them)")


def _need_cross(triple: str) -> list[str]:
    """The command prefix that runs ``triple``'s programs here (qemu-user, or nothing on that machine)."""
    _need(f"{triple}-gcc", f"{triple}-ar")
    runner = resolve(triple).runner()
    if runner is None:
        _need(aotc.target.TRIPLES[triple].qemu)
        pytest.fail(f"qemu-user cannot run {triple} programs: no sysroot at /usr/{triple}")
    return runner


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else 4)).astype(np.float32)


def small_cnn() -> onnx.ModelProto:
    """Conv paths in miniature: a padded 3x3 stem (tiled), a 16-channel 3x3 (Winograd), an expanding 1x1
    fused into its depthwise conv, a 1x1 projection, a stride-2 depthwise conv, max and global average
    pooling, then Gemm and Softmax."""
    rng = np.random.default_rng(20)
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6, np.float32), "six")]
    nodes = []

    def conv(x: str, y: str, ci: int, co: int, k: int, stride: int = 1, pad: int = 0, group: int = 1,
             act: str = "") -> str:
        inits.extend([numpy_helper.from_array(_w(rng, co, ci // group, k, k), f"{y}_w"),
                      numpy_helper.from_array(_w(rng, co), f"{y}_b")])
        out = f"{y}_conv" if act else y
        nodes.append(helper.make_node("Conv", [x, f"{y}_w", f"{y}_b"], [out], kernel_shape=[k, k],
                                      strides=[stride] * 2, pads=[pad] * 4, group=group))
        if act == "relu":
            nodes.append(helper.make_node("Relu", [out], [y]))
        elif act == "clip":
            nodes.append(helper.make_node("Clip", [out, "zero", "six"], [y]))
        return y

    h = conv("x", "stem", 3, 16, 3, pad=1, act="relu")
    h = conv(h, "wino", 16, 16, 3, pad=1, act="relu")
    h = conv(h, "expand", 16, 32, 1, act="clip")
    h = conv(h, "dw", 32, 32, 3, pad=1, group=32, act="clip")
    h = conv(h, "project", 32, 16, 1)
    h = conv(h, "dw2", 16, 16, 3, stride=2, pad=1, group=16, act="relu")
    inits += [numpy_helper.from_array(_w(rng, 16, 10), "fc_w"), numpy_helper.from_array(_w(rng, 10), "fc_b")]
    nodes += [helper.make_node("MaxPool", [h], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("GlobalAveragePool", ["mp"], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", F, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def transformer_block(seq: int = 8, d: int = 32, heads: int = 2, ff: int = 64) -> onnx.ModelProto:
    """Self-attention (MatMul, batched MatMul, Softmax), residual LayerNorms and a GELU feed-forward (as
    Erf, which the patterns pass makes one Gelu)."""
    rng = np.random.default_rng(21)
    dh = d // heads
    arrays = {"wq": _w(rng, d, d), "wk": _w(rng, d, d), "wv": _w(rng, d, d), "wo": _w(rng, d, d),
              "w1": _w(rng, d, ff), "w2": _w(rng, ff, d), "g1": 1 + _w(rng, d), "b1": _w(rng, d),
              "g2": 1 + _w(rng, d), "b2": _w(rng, d), "bf1": _w(rng, ff),
              "split": np.array([1, seq, heads, dh], np.int64), "merge": np.array([1, seq, d], np.int64),
              "scale": np.array(dh ** -0.5, np.float32), "half": np.array(0.5, np.float32),
              "one": np.array(1, np.float32), "rsqrt2": np.array(2 ** -0.5, np.float32)}
    n = helper.make_node
    nodes = []
    for p in "qkv":
        nodes += [n("MatMul", ["x", f"w{p}"], [f"{p}0"]), n("Reshape", [f"{p}0", "split"], [f"{p}1"])]
    nodes += [n("Transpose", ["q1"], ["qh"], perm=[0, 2, 1, 3]), n("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
              n("Transpose", ["v1"], ["vh"], perm=[0, 2, 1, 3]), n("MatMul", ["qh", "kt"], ["s0"]),
              n("Mul", ["s0", "scale"], ["s1"]), n("Softmax", ["s1"], ["p"], axis=-1),
              n("MatMul", ["p", "vh"], ["c0"]), n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
              n("Reshape", ["c1", "merge"], ["c2"]), n("MatMul", ["c2", "wo"], ["o0"]), n("Add", ["o0", "x"], ["r1"]),
              n("LayerNormalization", ["r1", "g1", "b1"], ["h1"], axis=-1, epsilon=1e-5),
              n("MatMul", ["h1", "w1"], ["f0"]), n("Add", ["f0", "bf1"], ["f1"]),
              n("Mul", ["f1", "rsqrt2"], ["e0"]), n("Erf", ["e0"], ["e1"]), n("Add", ["e1", "one"], ["e2"]),
              n("Mul", ["f1", "e2"], ["e3"]), n("Mul", ["e3", "half"], ["f2"]),
              n("MatMul", ["f2", "w2"], ["f3"]), n("Add", ["f3", "h1"], ["r2"]),
              n("LayerNormalization", ["r2", "g2", "b2"], ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", F, [1, seq, d])],
                              [helper.make_tensor_value_info("y", F, [1, seq, d])],
                              [numpy_helper.from_array(a, k) for k, a in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(runner: list[str], program: Path) -> str:
    proc = subprocess.run([*runner, str(program)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and f"{program.name}: PASSED" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def _kernel_sources(res) -> str:
    return "".join(p.read_text() for p in sorted(res.build_dir.glob(f"{res.name}_kernels_*.c")))


@pytest.mark.parametrize("triple", CROSS)
def test_cnn_and_transformer_pass_their_generated_tests_under_qemu(tmp_path: Path, triple: str) -> None:
    runner = _need_cross(triple)
    for name, model in (("cnn", small_cnn()), ("block", transformer_block())):
        res = compile_model(model, tmp_path, name, target=triple, gen_test=True, extra_cflags=FAST)
        meta = json.loads((tmp_path / f"{name}.json").read_text())["target"]
        assert meta["triple"] == triple and meta["machine"].startswith(triple.split("-")[0])
        header = (tmp_path / f"{name}.h").read_text()
        assert f"Target: {triple}, --target-cpu generic" in header
        kernels = _kernel_sources(res)
        if triple.startswith("aarch64"):  # the NEON kernels, unreachable before cross targets
            assert meta["isa"] == "neon" and "#include <arm_neon.h>" in kernels and "vfmaq_f32" in kernels
        else:
            assert meta["isa"] == "generic" and "aotc_v4f_load" in kernels and "_mm" not in kernels
        out = (tmp_path / f"lib{name}.so").read_bytes()
        assert out[:4] == b"\x7fELF" and int.from_bytes(out[18:20], "little") == {"aarch64": 183, "riscv64": 243}[
            triple.split("-")[0]]  # e_machine: EM_AARCH64, EM_RISCV
        _run(runner, tmp_path / f"{name}_test")


def _backend_sample() -> list[list]:
    """32 ONNX backend node cases, the same every run: of the two opsets with the most cases, 16 each,
    evenly spaced by name, among the collected ones that pass on x86 with plain tensors, default
    tolerances and no float16 (riscv64's gcc 12 has no _Float16). One merged model per opset."""
    sys.path.insert(0, str(Path(__file__).parent))
    from backend_expected_failures import EXPECTED_FAILURES
    from backend_suite import is_collected, load_node_cases

    cases = [c for c in load_node_cases() if is_collected(c) and c.id not in EXPECTED_FAILURES
             and all(isinstance(v, np.ndarray) and v.dtype not in (np.float16, object) for v in c.inputs + c.outputs)
             and (c.rtol, c.atol) == (1e-3, 1e-7)]
    counts: dict[int, int] = {}
    for c in cases:
        counts[c.opset] = counts.get(c.opset, 0) + 1
    groups = []
    for opset in sorted(counts, key=lambda o: (-counts[o], o))[:2]:
        group = sorted((c for c in cases if c.opset == opset), key=lambda c: c.id)
        groups.append([group[i * len(group) // 16] for i in range(16)])
    return groups


@pytest.fixture(scope="module")
def backend_sample() -> list[list]:
    return _backend_sample()


@pytest.mark.parametrize("triple", CROSS)
def test_backend_node_sample_passes_under_qemu(tmp_path: Path, triple: str, backend_sample: list[list]) -> None:
    from backend_suite import merge

    runner = _need_cross(triple)
    for i, group in enumerate(backend_sample):
        model, feeds, out_names = merge(group)
        res = compile_model(model, tmp_path, f"b{i}", input_shapes={k: tuple(v.shape) for k, v in feeds.items()},
                            target=triple, gen_test=True, test_tolerance=(1e-3, 1e-7), extra_cflags=FAST,
                            test_data=(list(feeds.values()), [o for c in group for o in c.outputs]))
        out = _run(runner, res.prefix.parent / f"b{i}_test")
        assert len(re.findall(r"^ok ", out, re.M)) == sum(len(n) for n in out_names), out


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_generic_target_builds_with_gcc_and_clang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cc: str) -> None:
    """``--target generic``: no intrinsics, no -march; the library and its test build and pass with either
    compiler, and load here."""
    _need(cc)
    monkeypatch.setenv("CC", cc)
    res = compile_model(small_cnn(), tmp_path, "g", target="generic", gen_test=True, extra_cflags=FAST)
    kernels = _kernel_sources(res)
    assert "immintrin.h" not in kernels and "arm_neon.h" not in kernels and "__attribute__((target" not in kernels
    assert f"cc = {cc}\n" in (res.build_dir / "build.ninja").read_text()
    meta = json.loads((tmp_path / "g.json").read_text())["target"]
    assert (meta["triple"], meta["isa"], meta["flags"], meta["cc"]) == ("generic", "generic", [], cc)
    _run([], tmp_path / "g_test")
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    y, = aotc.load(res.prefix).run({"x": x})
    assert y.shape == (1, 10) and abs(float(y.sum()) - 1) < 1e-5


def test_generic_kernels_are_clean_under_sanitizers(tmp_path: Path) -> None:
    """The portable vectors (aotc_v4f) of the conv and GEMM kernels under ASan and UBSan."""
    from onnx_helpers import run_generated_test_under_sanitizers

    run_generated_test_under_sanitizers(small_cnn(), tmp_path, target="generic")


def test_load_refuses_a_library_for_another_machine(tmp_path: Path) -> None:
    triple = next(t for t in CROSS if not t.startswith(host_arch()))
    _need(f"{triple}-gcc")
    compile_model(transformer_block(), tmp_path, "m", target=triple, extra_cflags=FAST)
    arch = triple.split("-")[0]
    with pytest.raises(AotcError, match=rf"cannot load .*m: it was compiled for {triple} \({arch}\) and this machine "
                                        rf"is {host_arch()}: run its generated test program \(--gen-test\) under "
                                        rf"qemu-{arch}"):
        aotc.load(tmp_path / "m")


def test_load_refuses_a_library_for_features_this_cpu_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A native build records the instruction sets it may use; a CPU without them is refused."""
    compile_model(transformer_block(), tmp_path, "m", extra_cflags=FAST)
    needs = json.loads((tmp_path / "m.json").read_text())["target"]["requires"]
    aotc.load(tmp_path / "m")
    if not needs:
        pytest.skip("this CPU has none of the instruction-set extensions aotc records")
    monkeypatch.setattr(aotc.target, "host_cpu_features", lambda: {"fpu", "sse2"})
    with pytest.raises(AotcError, match=rf"compiled with --target-cpu native for a CPU with {re.escape(needs[0])}.*"
                                        "which this CPU lacks"):
        aotc.load(tmp_path / "m")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "aotc", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--target", "mips-linux-gnu"], {}, "unknown --target 'mips-linux-gnu'; choose one of x86_64-linux-gnu, "
                                         "aarch64-linux-gnu, riscv64-linux-gnu, generic"),
    (["--target", "generic", "--target-cpu", "x86-64-v3"], {}, "--target generic is portable C for GCC or Clang"),
    (["--target-features", "avx2"], {}, "--target-features: expected +FEATURE or -FEATURE"),
    (["--target-cpu", "no such cpu"], {}, "--target-cpu: not a CPU name: 'no such cpu'"),
    (["--target-cpu", "not-a-cpu-aotc-knows"], {"CC": "cc"},
     "C compiler 'cc' refuses the flags -march=not-a-cpu-aotc-knows"),
    (["--target", "CROSS", "--target-cpu", "native"], {}, "--target-cpu native names this machine's CPU"),
    (["--target", "CROSS"], {"CC": "cc"}, "C compiler 'cc' builds for"),
    (["--target", "CROSS"], {"CC": "no-such-compiler-for-aotc"}, "C compiler 'no-such-compiler-for-aotc' not found"),
])
def test_target_errors_are_one_line(tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    cross = next(t for t in CROSS if not t.startswith(host_arch()))
    onnx.save(transformer_block(), tmp_path / "m.onnx")
    proc = _cli("compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"),
                *[cross if a == "CROSS" else a for a in args], env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aotc: error: ") and message in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_help_states_the_native_default() -> None:
    proc = _cli("compile", "--help")
    text = " ".join(proc.stdout.split())
    assert "--target TRIPLE" in text and "aarch64-linux-gnu" in text and "--target-features" in text
    assert "default native for this machine's triple" in text


@pytest.mark.parametrize("name", sorted(ISAS))
def test_isa_entry(tmp_path: Path, name: str) -> None:
    """Each ISA table entry: its macros select it, its GEMM tile fits its accumulators, and a GEMM and a
    conv register tile written with its spellings compile warning-free with a compiler for it (x86 ISAs
    on x86-64 hosts, NEON with the aarch64 cross compiler, generic with gcc and clang)."""
    isa = ISAS[name]
    assert isa_for_macros(set(isa.macros)) is isa
    assert isa.gemm_mr * isa.gemm_nv <= isa.acc_budget < isa.registers
    src = ("#include <stddef.h>\n#include <string.h>\n" + render_gemm(plan_gemm(GemmSpec(13, 21, 9, isa=name)), "g")
           + isa.include + "\n" + bcast_tile_kernel(for_isa(name), "tile", 3, 2, 8, 8, "nk")
           + "\nvoid use(const float *a, const float *b, float *c, float *s, float *y) {\n"
           "  g(a, b, c, s, 0, 1);\n  tile(a, b, c, y, 4);\n}\n")
    (tmp_path / "k.c").write_text(src)
    compilers = {"avx512": [["cc", "-march=x86-64-v4"]], "avx2": [["cc", "-march=x86-64-v3"]],
                 "neon": [["aarch64-linux-gnu-gcc"]], "generic": [["gcc"], ["clang"]]}[name]
    if name in ("avx512", "avx2") and host_arch() != "x86_64":
        pytest.skip("x86 ISAs are compiled on x86-64 hosts")
    for cc in compilers:
        _need(cc[0])
        proc = subprocess.run([*cc, "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror", "-c", str(tmp_path / "k.c"),
                               "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
