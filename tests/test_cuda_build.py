"""--target cuda without a GPU: the CUDA libraries of the seed graph, a CNN and a Transformer block build
with nvcc for sm_80 and sm_90 with every warning an error; the C API's argument checks run on the host;
the GPU kernels' tiling and index math, mirrored in Python, is checked against numpy. What these tests
cannot check (the kernels' results on a GPU) is listed in docs/cuda.md; benchmarks/cuda.py runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_models import cnn, data_movement, transformer
from models import mlp, reduce_sum_xyz

from aotc.codegen.cuda import gemm
from aotc.codegen.cuda.common import decompose
from aotc.codegen.cuda.loops import reduction_plan
from aotc.compiler import compile_model
from aotc.errors import AotcError
from aotc.target import resolve

# nvcc's and ptxas's warnings and the host compiler's -Wall -Wextra, all errors.
STRICT = ["-Werror", "all-warnings", "-Xptxas", "-Werror", "-Xcompiler", "-Wall,-Wextra,-Werror"]


def _build(model, tmp_path: Path, name: str, **kw):
    return compile_model(model, tmp_path, name, target="cuda", extra_cflags=STRICT, **kw)


def test_seed_graph_is_one_deterministic_kernel(tmp_path: Path) -> None:
    """reduce_sum(x + y*z) over 1M floats: one kernel that reads x, y and z once; its 128 chunks are combined
    through partial results and an integer arrival count, never a float atomic."""
    res = _build(reduce_sum_xyz(1 << 20), tmp_path, "seed", cuda_arch="sm_80,sm_90", gen_test=True)
    assert res.num_kernels == 1
    src = (res.build_dir / "seed_kernels_0.cu").read_text()
    assert len(re.findall(r"__global__ void", src)) == 1
    assert re.findall(r"atomic\w*\(([^,]*)", src) == ["&arrived[o]"]
    assert "aotc_shfl_xor" in src
    for exe in ("seed_test", "libseed.so", "libseed.a"):
        assert (tmp_path / exe).is_file()
    ninja = (res.build_dir / "build.ninja").read_text()
    assert "code=sm_80" in ninja and "code=sm_90" in ninja  # both architectures' machine code


@pytest.mark.parametrize("tf32", [False, True])
def test_cnn_builds(tmp_path: Path, tf32: bool) -> None:
    res = _build(cnn(), tmp_path, "cnn", cuda_tf32=tf32, cuda_arch="sm_80" if tf32 else "sm_80,sm_90")
    kinds = [k.kind for k in res.graph.kernels]
    assert kinds.count("conv") == 4 and "gemm" in kinds
    kernels = (res.build_dir / "cnn_kernels_0.cu").read_text()
    assert ("nvcuda::wmma::mma_sync" in kernels) == tf32


def test_transformer_builds(tmp_path: Path) -> None:
    res = _build(transformer(), tmp_path, "block", gen_test=True, cuda_arch="sm_90")
    ops = [k.ops for k in res.graph.kernels]
    assert ["Softmax"] in ops and ["LayerNormalization"] in ops
    assert any(k.kind == "gemm" and "Gelu" in k.ops for k in res.graph.kernels)  # the FFN's GELU is its epilogue
    assert (tmp_path / "block_test").is_file()


def test_data_movement_and_attention_build(tmp_path: Path) -> None:
    res = _build(data_movement(), tmp_path, "dm", cuda_arch="sm_80")
    assert [k.ops for k in res.graph.kernels] == [["Gather"], ["Split"], ["Concat"], ["Pad"], ["Tile"], ["ArgMax"],
                                                  ["Attention"], ["Attention"]]
    src = (res.build_dir / "dm_kernels_0.cu").read_text()
    gather = src[src.index("dm_k0_gather("):src.index("dm_k1_split(")]
    assert "atomicExch(status, 3)" in gather  # an out-of-range id sets NAME_ERR_INDEX_OUT_OF_RANGE
    assert "#define DM_STATUS_OFFSET" in (tmp_path / "dm.h").read_text()


def test_reversed_and_empty_slices_build(tmp_path: Path) -> None:
    """A negative stride is a subtraction of unsigned indices (nvcc -Werror refuses a sign change); a
    kernel with no elements is an empty function that the run never launches."""
    from models import init, make, vi

    from aotc.codegen.cuda.common import affine
    from aotc.codegen.loops import Access

    assert affine(Access("x", 999, [-50, 1, -2]), {0: "i0", 1: "i1", 2: "i2"}) == "x[999 - 50 * i0 + i1 - 2 * i2]"
    from onnx import helper

    def const(name: str, v: list[int]):
        return init(name, np.array(v, np.int64))

    model = make([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["rev"]),
                  helper.make_node("Slice", ["x", "s2", "e2", "a2"], ["empty"])],
                 [vi("x", [4, 6])], [vi("rev", [4, 3]), vi("empty", [0, 6])],
                 [const("s", [-1]), const("e", [-100]), const("a", [1]), const("st", [-2]), const("s2", [10]),
                  const("e2", [20]), const("a2", [0])])
    res = _build(model, tmp_path, "sl", cuda_arch="sm_80")
    run = (res.build_dir / "sl.cu").read_text()
    assert run.count("<<<") == 1 and "no elements: nothing to launch" in run


def test_unsupported_ops_are_listed_in_one_line(tmp_path: Path) -> None:
    from models import init, make, vi
    from onnx import TensorProto, helper

    model = make([helper.make_node("TopK", ["x", "k"], ["v", "i"]),
                  helper.make_node("CumSum", ["v", "axis"], ["y"])],
                 [vi("x", [4, 8])], [vi("y", [4, 3]), vi("i", [4, 3], TensorProto.INT64)],
                 [init("k", np.array([3], np.int64)), init("axis", np.array(1, np.int64))])
    with pytest.raises(AotcError) as e:
        compile_model(model, tmp_path, "m", target="cuda")
    msg = str(e.value)
    assert "\n" not in msg and "TopK" in msg and "CumSum" in msg


def test_target_options_are_checked() -> None:
    for kw, text in (({"cuda_arch": "sm_60"}, "sm_75 or newer"), ({"cuda_arch": "sm_75", "tf32": True}, "sm_80"),
                     ({"cpu": "x86-64-v3"}, "--target-cpu")):
        with pytest.raises(AotcError, match=re.escape(text)):
            resolve("cuda", **kw)
    with pytest.raises(AotcError, match="need --target cuda"):
        resolve(None, cuda_arch="sm_80")
    t = resolve("cuda", cuda_arch="sm_90,sm_80,sm_90")
    assert t.cuda_arch == ("sm_80", "sm_90")
    assert "-gencode=arch=compute_90,code=compute_90" in t.flags  # PTX of the newest for later GPUs


HOST_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include "mlp.h"
int main(void) {
  float x = 0.0f, y = 0.0f;
  int rc = mlp_run(NULL, &y, (const void *)&x, (void *)256, 0);
  if (rc != MLP_ERR_NULL_ARGUMENT) return 1;
  rc = mlp_run(&x, &y, NULL, (void *)256, 0);
  if (rc != MLP_ERR_NULL_ARGUMENT) return 2;
  rc = mlp_run(&x, &y, &x, (void *)((char *)256 + 64), 0);
  if (rc != MLP_ERR_WORKSPACE) return 3;
  if (mlp_load_constants(NULL, 0) != MLP_ERR_NULL_ARGUMENT) return 4;
  if (strcmp(mlp_status_name(MLP_ERR_CUDA), "MLP_ERR_CUDA") != 0) return 5;
  if (mlp_workspace_size() != MLP_WORKSPACE_BYTES || mlp_constants_size() != MLP_CONSTANTS_BYTES) return 6;
  if (MLP_CONSTANTS_BYTES < (784 * 512 + 512 * 512) * 4) return 7;
  /* No GPU here: a launch fails, and the run says so instead of printing or exiting. */
  rc = mlp_run(&x, &y, &x, (void *)256, 0);
  printf("%s\n", mlp_status_name(rc));
  return rc == MLP_ERR_CUDA || rc == MLP_OK ? 0 : 8;
}
"""


def test_c_api_checks_arguments_on_the_host(tmp_path: Path) -> None:
    """The header compiles as C; the run checks its pointers before any CUDA call, and a failed launch is a
    status, not a message or an exit."""
    _build(mlp(1), tmp_path, "mlp", cuda_arch="sm_80")
    (tmp_path / "main.c").write_text(HOST_PROGRAM)
    nvcc = resolve("cuda").cc
    dry = subprocess.run([nvcc, "--dryrun", "-c", str(tmp_path / "mlp.cu"), "-o", "/dev/null"],
                         capture_output=True, text=True).stderr
    include = re.search(r'INCLUDES="-I([^"]*)"', dry).group(1).strip()  # where nvcc finds cuda_runtime_api.h
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}", f"-I{include}",
                    str(tmp_path / "main.c"), str(tmp_path / "libmlp.so"), f"-Wl,-rpath,{tmp_path}", "-o",
                    str(tmp_path / "main")], check=True)
    run = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    if "MLP_OK" not in run.stdout:  # no GPU: nothing but the status name was printed
        assert run.stdout == "MLP_ERR_CUDA\n" and run.stderr == ""


def test_python_refuses_without_a_gpu(tmp_path: Path) -> None:
    import aotc
    from aotc.cuda_bindings import CudaRuntime

    _build(reduce_sum_xyz(8), tmp_path, "seed", cuda_arch="sm_80", gen_benchmark=True, profile=True)
    assert (tmp_path / "seed_benchmark").is_file() and "seed_run_profiled" in (tmp_path / "seed.h").read_text()
    try:
        has_gpu = CudaRuntime.get().device_count() > 0
    except AotcError:
        has_gpu = False
    if has_gpu:
        pytest.skip("a GPU is present: benchmarks/cuda.py --check runs the models")
    with pytest.raises(AotcError, match="no usable CUDA GPU|CUDA runtime"):
        aotc.load(tmp_path / "seed")
    # Importing aotc needs no CUDA.
    code = "import sys, aotc; assert 'aotc.cuda_bindings' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "ok\n"


# -- the index math of the kernels, mirrored in Python -------------------------------------------------------

def _c_eval(expr: str, env: dict[str, int]) -> int:
    return eval(expr.replace("/", "//"), {}, dict(env))  # noqa: S307 - our own generated integer arithmetic


@pytest.mark.parametrize("extents", [[5], [3, 1, 4], [2, 3, 5, 7]])
def test_decompose_matches_unravel_index(extents: list[int]) -> None:
    names = [f"d{i}" for i in range(len(extents))]
    lines = decompose("o", extents, names, "unsigned")
    exprs = [re.match(rf"const unsigned {n} = (.*); \(void\){n};", ln).group(1)
             for n, ln in zip(names, lines, strict=True)]
    for o in range(int(np.prod(extents))):
        assert [_c_eval(e, {"o": o}) for e in exprs] == list(np.unravel_index(o, extents))


@pytest.mark.parametrize("m,n,k,rows_fastest,k_fastest,tile", [(70, 130, 37, False, False, 64),
                                                                (64, 64, 16, True, True, 64),
                                                                (1, 200, 50, False, True, 64),
                                                                (45, 40, 20, True, False, 32)])
def test_gemm_tiling_matches_numpy(m: int, n: int, k: int, rows_fastest: bool, k_fastest: bool, tile: int) -> None:
    """The FP32 kernel's block, staging and per-thread output math, run in numpy order for every block."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    c = np.full((m, n), np.nan)
    for by in range(-(-m // tile)):
        for bx in range(-(-n // tile)):
            row0, col0 = gemm.tile_origin(bx, by, tile)
            acc = np.zeros((256, (tile // 16) ** 2))
            for k0 in range(0, k, gemm.BK):
                a_s, b_s = np.full((gemm.BK, tile), np.nan), np.full((gemm.BK, tile), np.nan)
                for t in range(256):
                    for q in range(tile * gemm.BK // 256):
                        i, kk = gemm.a_slot(t + 256 * q, rows_fastest, tile)
                        a_s[kk, i] = a[row0 + i, k0 + kk] if row0 + i < m and k0 + kk < k else 0.0
                    for q in range(gemm.BK * tile // 256):
                        kk, j = gemm.b_slot(t + 256 * q, k_fastest, tile)
                        b_s[kk, j] = b[k0 + kk, col0 + j] if k0 + kk < k and col0 + j < n else 0.0
                assert not np.isnan(a_s).any() and not np.isnan(b_s).any()  # every slot staged
                for t in range(256):
                    for o, (i, j) in enumerate(gemm.thread_outputs(t, tile)):
                        acc[t, o] += a_s[:, i] @ b_s[:, j]
            for t in range(256):
                for o, (i, j) in enumerate(gemm.thread_outputs(t, tile)):
                    if row0 + i < m and col0 + j < n:
                        assert np.isnan(c[row0 + i, col0 + j])  # each element written once
                        c[row0 + i, col0 + j] = acc[t, o]
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


def test_small_grids_take_small_tiles() -> None:
    assert gemm.tile_size(128, 768, 1, tf32=False) == 32      # GPT-2 at batch 1: 24 blocks of 64x64
    assert gemm.tile_size(4096, 768, 1, tf32=False) == 64     # batch 32: 768 blocks
    assert gemm.tile_size(128, 768, 1, tf32=True) == 64       # the WMMA kernel's warps tile 64x64


@pytest.mark.parametrize("n_out,n_red,column", [(1, 1 << 24, False), (3, 100_000, False), (1000, 37, False),
                                                (5, 5000, False), (1, 0, False), (300, 20000, False),
                                                (8192, 300, True), (100, 300, True)])
def test_reduction_plan_covers_each_element_once(n_out: int, n_red: int, column: bool) -> None:
    group, chunks, length = reduction_plan(n_out, n_red, column)
    assert group in (1, 32, 256) and (group == 1) == (column and n_out >= 4096)
    assert chunks == 1 or group == 256  # a split reduction's last block combines with the whole block
    assert chunks * n_out <= max(2048, n_out)
    seen = np.zeros(n_red, np.int64)
    for c in range(chunks):
        rlo, rhi = c * length, min(c * length + length, n_red)
        for lane in range(group):
            seen[rlo + lane:rhi:group] += 1
    assert (seen == 1).all()


def test_device_arrays_and_streams_are_read_without_a_copy() -> None:
    """The bindings' reading of __cuda_array_interface__ and of stream objects (no GPU needed)."""
    from aotc.bindings import TensorSpec
    from aotc.cuda_bindings import device_pointer, stream_handle

    class Dev:
        def __init__(self, shape, typestr="<f4", strides=None, readonly=False) -> None:
            self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides,
                                             "data": (0x7000, readonly), "version": 3}

    t = TensorSpec("x", np.dtype(np.float32), (2, 3))
    assert device_pointer(Dev((2, 3)), t, "m", writable=True) == 0x7000
    assert device_pointer(Dev((2, 3), strides=(12, 4)), t, "m", writable=False) == 0x7000
    assert device_pointer(np.zeros((2, 3), np.float32), t, "m", writable=False) is None  # host: copied
    for bad, err in ((Dev((2, 3), "<f8"), TypeError), (Dev((3, 2)), ValueError),
                     (Dev((2, 3), strides=(4, 8)), ValueError)):
        with pytest.raises(err):
            device_pointer(bad, t, "m", writable=False)
    with pytest.raises(ValueError, match="read-only"):
        device_pointer(Dev((2, 3), readonly=True), t, "m", writable=True)

    class TorchStream:
        cuda_stream = 0x55

    class CupyStream:
        ptr = 0x66

    assert [stream_handle(s) for s in (None, 7, TorchStream(), CupyStream())] == [0, 7, 0x55, 0x66]
    with pytest.raises(TypeError):
        stream_handle("default")
