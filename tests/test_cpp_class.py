"""The C++ class header (--cpp-class: aotc/codegen/cpp_class.py, templates/cpp_class.hpp.j2) and
examples/tfcompile_cpp, a program written for tfcompile's generated header.

Every C++ program here is compiled with g++ -std=c++11 -Wall -Wextra -Werror, the unit program also
under AddressSanitizer and UBSan."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from models import init, make, ort_run, vi
from onnx import TensorProto, helper
from tf_small_fixtures import small_fixtures_dir

from aotc.codegen.cpp_class import parse_cpp_class
from aotc.compiler import compile_model
from aotc.errors import AotcError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "tfcompile_cpp"
CXX = os.environ.get("CXX", "g++")
CXXFLAGS = ["-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1", "-g"]
TIMEOUT = 300
EVIL = "pos */ #error"  # an output name that would end a comment and break the header if pasted raw


@pytest.fixture(scope="module")
def cxx() -> str:
    if shutil.which(CXX) is None:
        pytest.skip(f"no C++ compiler ({CXX}) on PATH")
    return CXX


def unit_model():
    """Arguments whose names collide once mangled ("x:0" and "x_0") or with a member ("data": arg_data),
    an index input (Gather: an out-of-range index is a run-time status), a bool result (g++ needs
    <stdbool.h> for the C header's _Bool), and two chained 64x64 GEMMs: a workspace to misuse and
    kernels big enough to be split over a thread pool."""
    rng = np.random.default_rng(0)
    i64, b = TensorProto.INT64, TensorProto.BOOL
    return make([helper.make_node("Mul", ["x:0", "two"], ["x2"]),
                 helper.make_node("Add", ["x2", "x_0"], ["y"]),
                 helper.make_node("Greater", ["x:0", "zero"], [EVIL]),
                 helper.make_node("Gather", ["table", "data"], ["g"]),
                 helper.make_node("MatMul", ["m", "w"], ["mm1"]),
                 helper.make_node("MatMul", ["mm1", "w"], ["mm0"]),
                 helper.make_node("Relu", ["mm0"], ["mm"])],
                [vi("x:0", [2, 3]), vi("data", [3], i64), vi("x_0", [1]), vi("m", [64, 64])],
                [vi("y", [2, 3]), vi(EVIL, [2, 3], b), vi("g", [3]), vi("mm", [64, 64])],
                [init("two", np.float32(2)), init("zero", np.float32(0)),
                 init("table", np.array([1, 2, 3, 4], np.float32)),
                 init("w", (rng.standard_normal((64, 64)) * 0.2).astype(np.float32))])


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpp_unit")
    compile_model(unit_model(), out, "unit", cpp_class="testns::inner::Unit")
    return out


def build(lib: Path, sources: dict[str, str], work: Path, flags: tuple[str, ...] = ()) -> Path:
    """Compile ``sources`` (file name -> text) against ``lib`` (OUT/libNAME.a; its headers beside it)."""
    for fname, text in sources.items():
        (work / fname).write_text(text)
    exe = work / "prog"
    cmd = [CXX, *CXXFLAGS, *flags, f"-I{lib.parent}", *(str(work / f) for f in sources), str(lib), "-lm",
           "-pthread", "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return exe


UNIT_PROGRAM = r"""
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "unit.hpp"

using testns::inner::Unit;

std::size_t other_unit_num_args();  // other.cc: the header in a second translation unit

#define CHECK(c)                                                    \
  do {                                                              \
    if (!(c)) {                                                     \
      std::fprintf(stderr, "line %d: CHECK(%s)\n", __LINE__, #c);   \
      return 1;                                                     \
    }                                                               \
  } while (0)

static bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

struct Counter {
  std::size_t calls;
};

// A serial "pool" that runs the tasks backwards (any order must do) and counts its parallel-fors.
static void run_backwards(void *ctx, std::size_t n, void (*fn)(void *, std::size_t), void *arg) {
  ++static_cast<Counter *>(ctx)->calls;
  for (std::size_t t = n; t-- > 0;) fn(arg, t);
}

static void fill(Unit &u, const float *m) {
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) u.arg_x_0(i, j) = 0.25f * static_cast<float>(3 * i + j) - 0.5f;
  const std::int64_t idx[3] = {0, 3, -1};
  std::copy(idx, idx + 3, u.arg_data_2_data());
  u.arg_x_0_2(0) = 0.5f;
  std::copy(m, m + 64 * 64, u.arg3_data());
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  std::vector<float> m(64 * 64);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(static_cast<int>(i % 13) - 6) / 4.0f;

  // Counts, names and sizes.
  CHECK(Unit::kNumArgs == 4 && Unit::kNumResults == 4 && Unit::kNumVariables == 0);
  CHECK(std::min(Unit::kNumArgs, std::size_t{9}) == 4);  // binds a reference: needs the definitions
  CHECK(other_unit_num_args() == 4);
  Unit u;
  CHECK(u.num_args() == 4 && u.num_results() == 4 && u.num_variables() == 0);
  CHECK(u.LookupArgIndex("x:0") == 0 && u.LookupArgIndex("data") == 1 && u.LookupArgIndex("x_0") == 2);
  CHECK(u.LookupArgIndex("m") == 3 && u.LookupArgIndex("nope") == -1 && u.LookupArgIndex("") == -1);
  CHECK(u.LookupResultIndex("g") == 2 && u.LookupResultIndex("pos */ #error") == 1 && u.LookupResultIndex("x:0") == -1);
  CHECK(std::string(u.GetArgName(1)) == "data" && u.GetArgName(4) == nullptr && u.GetResultName(-1) == nullptr);
  CHECK(Unit::ArgSize(0) == 24 && Unit::ArgSize(1) == 24 && Unit::ArgSize(4) == -1 && Unit::ResultSize(1) == 6);
  CHECK(Unit::ArgRank(3) == 2 && Unit::ArgShape(3)[1] == 64);
  CHECK(Unit::ResultRank(2) == 1 && Unit::ResultShape(2)[0] == 3);
  CHECK(Unit::ArgShape(9) == nullptr && Unit::ArgRank(9) == -1);
  CHECK(u.arg0_count() == 6 && u.arg_x_0_size() == 24 && u.arg_data_2_count() == 3 && u.arg_x_0_2_size() == 4);
  CHECK(u.result1_size() == 6 && u.result_pos_error_count() == 6 && u.result_mm_size() == 64 * 64 * 4);
  CHECK(u.arg_data(4) == nullptr && u.result_data(4) == nullptr);
  u.set_arg_data(99, m.data());  // out of range: no effect
  CHECK(u.error_msg().empty());

  // Owned buffers: 64-byte aligned, distinct, arguments zeroed.
  CHECK(reinterpret_cast<std::uintptr_t>(u.arg3_data()) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(u.result3_data()) % 64 == 0);
  CHECK(u.arg0_data() == u.arg_x_0_data() && u.arg1_data() != reinterpret_cast<void *>(u.arg0_data()));
  CHECK(u.arg3(63, 63) == 0.0f);

  // A run, checked by element accessors and typed pointers.
  fill(u, m.data());
  CHECK(u.Run());
  CHECK(u.error_msg().empty());
  CHECK(u.result0(0, 0) == -1.0f + 0.5f && u.result_y(1, 2) == 2.0f * 0.75f + 0.5f);
  CHECK(u.result1(0, 0) == false && u.result_pos_error(1, 2) == true && u.result1_data()[3] == true);
  CHECK(u.result_g(0) == 1.0f && u.result_g(1) == 4.0f && u.result2_data()[2] == 4.0f);
  std::FILE *f = std::fopen(argv[1], "wb");
  CHECK(f != nullptr && std::fwrite(u.result_mm_data(), 4, 64 * 64, f) == 64 * 64 && std::fclose(f) == 0);
  std::vector<float> mm(u.result3_data(), u.result3_data() + 64 * 64);

  // An out-of-range index: Run fails with the status; the next good run clears the message.
  u.arg_data_2(1) = 4;
  CHECK(!u.Run());
  CHECK(contains(u.error_msg(), "unit_run returned 3 (UNIT_ERR_INDEX_OUT_OF_RANGE): an index input holds"));
  u.arg_data_2(1) = 3;
  CHECK(u.Run() && u.error_msg().empty());

  // A caller workspace: misaligned, too small, then good; nullptr goes back to the owned one.
  std::vector<unsigned char> ws(Unit::WorkspaceSize(4) + 128);
  unsigned char *aligned = ws.data() + (64 - reinterpret_cast<std::uintptr_t>(ws.data()) % 64) % 64;
  u.set_workspace(aligned + 1, Unit::WorkspaceSize());
  CHECK(!u.Run() && contains(u.error_msg(), "unit_run returned 2 (UNIT_ERR_WORKSPACE): the workspace is"));
  u.set_workspace(aligned, UNIT_WORKSPACE_BYTES - 1);
  CHECK(!u.Run() && contains(u.error_msg(), "UNIT_ERR_WORKSPACE"));
  u.set_workspace(aligned, Unit::WorkspaceSize(4));
  CHECK(u.Run() && std::equal(mm.begin(), mm.end(), u.result_mm_data()));
  u.set_workspace(nullptr, 0);
  CHECK(u.Run());

  // Thread pools: the caller's own parallel-for, then the library's; results bit-identical.
  Counter counter = {0};
  const aotc_parallel backwards = {run_backwards, &counter, 4};
  u.set_thread_pool(&backwards);
  CHECK(u.Run() && counter.calls > 0 && std::equal(mm.begin(), mm.end(), u.result_mm_data()));
  aotc_parallel *pool = unit_pool_create(3);
  CHECK(pool != nullptr);
  u.set_thread_pool(pool);
  std::fill(u.result_mm_data(), u.result_mm_data() + 64 * 64, -1.0f);
  CHECK(u.Run() && std::equal(mm.begin(), mm.end(), u.result_mm_data()));
  u.set_thread_pool(nullptr);
  unit_pool_destroy(pool);
  CHECK(u.Run());

  // The caller provides the arguments: Run fails until every one is set, then reads them in place.
  Unit c(Unit::AllocMode::RESULTS_PROFILES_AND_TEMPS_ONLY);
  CHECK(c.arg0_data() == nullptr && c.result0_data() != nullptr);
  CHECK(!c.Run());
  CHECK(contains(c.error_msg(), "argument 0 (x:0) has no buffer: call set_arg0_data()"));
  const float x[6] = {-0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f};
  const std::int64_t idx[3] = {0, 3, -1};
  const float bias = 0.5f;
  c.set_arg0_data(x);
  c.set_arg_data_2_data(idx);
  c.set_arg_x_0_2_data(&bias);
  CHECK(!c.Run() && contains(c.error_msg(), "argument 3 (m) has no buffer"));
  c.set_arg_m_data(m.data());
  CHECK(c.Run() && c.error_msg().empty());
  CHECK(c.arg0_data() == x && c.arg_m_data() == m.data());
  CHECK(std::equal(mm.begin(), mm.end(), c.result_mm_data()) && c.result_y(1, 2) == 2.0f);
  std::printf("ok\n");
  return 0;
}
"""

OTHER_TU = r"""
#include <algorithm>
#include "unit.hpp"
std::size_t other_unit_num_args() { return std::max(testns::inner::Unit::kNumArgs, std::size_t{0}); }
"""


def test_class_methods(unit: Path, tmp_path: Path, cxx: str) -> None:
    """Every method of the class, under ASan/UBSan, in two translation units; the GEMM result matches
    onnxruntime."""
    exe = build(unit / "libunit.a", {"main.cc": UNIT_PROGRAM, "other.cc": OTHER_TU}, tmp_path, tuple(SANITIZE))
    proc = subprocess.run([str(exe), str(tmp_path / "mm.bin")], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stdout + proc.stderr
    m = ((np.arange(64 * 64) % 13 - 6) / 4).astype(np.float32).reshape(64, 64)
    model = unit_model()
    feeds = {"x:0": np.zeros((2, 3), np.float32), "data": np.zeros(3, np.int64),
             "x_0": np.zeros(1, np.float32), "m": m}
    expected = ort_run(model, feeds)[3]
    np.testing.assert_allclose(np.fromfile(tmp_path / "mm.bin", np.float32).reshape(64, 64), expected,
                               rtol=1e-4, atol=1e-4)


TYPES_PROGRAM = r"""
#include "dt.hpp"
int main() {
  Types t;
  t.arg_h(1, 2) = t.arg_h(0, 0);  // _Float16
  aotc_string s[3] = {"a", "x", "c"};
  aotc_string s2[3] = {"a", "b", "c"};
  t.set_arg_s_data(s);
  t.set_arg_s2_data(s2);
  t.arg_scalar() = -1.0f;
  if (!t.Run()) return 1;
  if (t.result_eq(0) != true || t.result_eq(1) != false || t.result_scalar_out() != 0.0f) return 2;
  if (t.result_empty_out_count() != 0 || t.result_empty_out_data() == nullptr) return 3;
  if (t.result_d_out_size() != 48 || t.result_bf_out_size() != 12 || t.arg_i4_count() != 6) return 4;
  return 0;
}
"""


def test_element_types(tmp_path: Path, cxx: str) -> None:
    """Every element type C++ sees differently from C (_Float16, emulated containers, strings, the
    _Bool of the C header), a scalar and an empty tensor, under -pedantic and the sanitizers."""
    t = TensorProto
    types = {"h": t.FLOAT16, "bf": t.BFLOAT16, "d": t.DOUBLE, "u8": t.UINT8, "i8": t.INT8, "i32": t.INT32,
             "u64": t.UINT64, "i4": t.INT4}
    model = make([*(helper.make_node("Identity", [k], [f"{k}_out"]) for k in types),
                  helper.make_node("Equal", ["s", "s2"], ["eq"]), helper.make_node("Relu", ["scalar"], ["scalar_out"]),
                  helper.make_node("Relu", ["empty"], ["empty_out"])],
                 [*(vi(k, [2, 3], dt) for k, dt in types.items()), vi("s", [3], t.STRING), vi("s2", [3], t.STRING),
                  vi("scalar", []), vi("empty", [0, 3])],
                 [*(vi(f"{k}_out", [2, 3], dt) for k, dt in types.items()), vi("eq", [3], t.BOOL),
                  vi("scalar_out", []), vi("empty_out", [0, 3])], opset=21)
    compile_model(model, tmp_path / "out", "dt", cpp_class="Types")
    exe = build(tmp_path / "out" / "libdt.a", {"main.cc": TYPES_PROGRAM}, tmp_path, tuple(SANITIZE))
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr


def test_header_names(unit: Path) -> None:
    """Named methods mangled without collisions; model names reach the header only in comments, with
    comment delimiters broken; no variables, so no var_ methods."""
    text = (unit / "unit.hpp").read_text()
    for method in ("arg_x_0_data()", "arg_data_2_data()", "arg_x_0_2_data()", "arg_m_data()",
                   "result_pos_error_data()", "result_y_data()"):
        assert f" *{method} {{" in text, method
    assert "namespace testns {\nnamespace inner {\n" in text and "class Unit : public" in text
    assert "pos *_/ #error" in text and "*/ #error" not in text
    assert "var_" not in text and "kNumVariables = 0;" in text


@pytest.mark.parametrize(("cpp_class", "fragment"), [
    ("1abc", "'1abc' is not a C++ identifier"),
    ("ns::", "'(empty)' is not a C++ identifier"),
    ("::Name", "'(empty)' is not a C++ identifier"),
    ("a__b", "'a__b' is not a C++ identifier"),
    ("_Name", "'_Name' is not a C++ identifier"),
    ("ns::Näme", "'Näme' is not a C++ identifier"),
    ("ns::class", "'class' is a C or C++ keyword"),
    ("NULL", "'NULL' is taken"),
    ("aotc_detail::X", "'aotc_detail' is taken"),
    ("ns::size_t", "'size_t' is taken"),
    ("ns::unit_run", "'unit_run' is taken"),
    ("UNIT_OK", "'UNIT_OK' is taken"),
    ("std::Model", "namespace std belongs to the C++ library"),
    ("ns::Run", "a member named 'Run'"),
    ("ns::arg0_data", "a member named 'arg0_data'"),
    ("ns::AllocMode", "a member named 'AllocMode'"),
])
def test_bad_class_names(cpp_class: str, fragment: str) -> None:
    with pytest.raises(AotcError, match=re.escape(fragment)):
        parse_cpp_class(cpp_class, "unit")


def test_good_class_names() -> None:
    assert parse_cpp_class("Model", "unit") == ([], "Model")
    assert parse_cpp_class("a::std::b1_c::Model", "unit") == (["a", "std", "b1_c"], "Model")
    assert parse_cpp_class("ns::unit", "unit") == (["ns"], "unit")  # the model's bare name is no C identifier


def test_cli_refuses_a_bad_class_before_reading_the_model(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "aotc", "compile", str(tmp_path / "missing.pb"), "-o",
                           str(tmp_path / "out"), "-n", "m", "--cpp-class", "ns::new"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == "aotc: error: --cpp-class 'ns::new': 'new' is a C or C++ keyword; choose another name\n"


def test_hpp_in_depfile_and_removed_when_no_longer_asked_for(tmp_path: Path) -> None:
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    out = tmp_path / "out"
    compile_model(model, out, "tiny", cpp_class="Tiny", depfile=tmp_path / "tiny.d")
    assert (out / "tiny.hpp").is_file()
    assert str(out / "tiny.hpp") in (tmp_path / "tiny.d").read_text().split(":", 1)[0].replace("\\:", ":")
    (out / "other.hpp").write_text("/* not aotc's */\n")
    compile_model(model, out, "tiny")
    assert not (out / "tiny.hpp").exists() and (out / "other.hpp").is_file()


def aotc_command() -> str:
    beside = Path(sys.executable).with_name("aotc")
    return str(beside) if beside.is_file() else f"{sys.executable} -m aotc"


def expected_probs() -> list[float]:
    text = (EXAMPLE / "expected.txt").read_text()
    return [float(v) for v in re.findall(r"^probs\[\d\]\[\d\] = (\S+)$", text, re.M)]


def check_example_output(stdout: str) -> None:
    got = [float(v) for v in re.findall(r"^probs\[\d\]\[\d\] = (\S+)$", stdout, re.M)]
    assert len(got) == 8, stdout
    np.testing.assert_allclose(got, expected_probs(), atol=2e-6)  # TensorFlow's, printed to 6 digits
    assert "\nexample::Mlp: 1 argument(s), 1 result(s), runs agree\n" in stdout, stdout


def test_example_makefile(tmp_path: Path, cxx: str) -> None:
    """examples/tfcompile_cpp: the frozen Keras graph through aotc compile --cpp-class, the program
    written for tfcompile's header built with -Werror, and TensorFlow's outputs reproduced."""
    if shutil.which("make") is None:
        pytest.skip("make not on PATH")
    work = tmp_path / "tfcompile_cpp"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("build"))
    proc = subprocess.run(["make", "-C", str(work), "run", f"AOTC={aotc_command()}", f"CXX={cxx}",
                           "CXXFLAGS=-O2 " + " ".join(CXXFLAGS)], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_example_output(proc.stdout)
    again = subprocess.run(["make", "-C", str(work), "-q", "all"], capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, "a second make would rebuild: " + again.stdout


CMAKELISTS = """
cmake_minimum_required(VERSION 3.16)
project(tfcompile_cpp LANGUAGES CXX)
include("{module}")
aotc_add_model(mlp MODEL mlp.pb CONFIG mlp.config.pbtxt CPP_CLASS example::Mlp)
add_executable(app main.cc)
target_link_libraries(app PRIVATE mlp)
if(NOT mlp_AOTC_CPP_HEADER MATCHES "/mlp_aotc/mlp.hpp$")
  message(FATAL_ERROR "mlp_AOTC_CPP_HEADER is '${{mlp_AOTC_CPP_HEADER}}'")
endif()
"""


def cmake_build(src: Path, build: Path, cxx: str) -> str:
    """Configure and build ``src`` in ``build``; the build's output."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not on PATH")
    exe = Path(sys.executable).with_name("aotc")
    aotc = str(exe) if exe.is_file() else f"{sys.executable};-m;aotc"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", str(src), "-B", str(build), *gen, f"-DAOTC_EXECUTABLE={aotc}",
                 f"-DCMAKE_CXX_COMPILER={shutil.which(cxx)}", "-DCMAKE_CXX_FLAGS=" + " ".join(CXXFLAGS)],
                ["cmake", "--build", str(build)]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_example_cmake(tmp_path: Path, cxx: str) -> None:
    """cmake/aotc.cmake's aotc_add_model takes the .pb, its config and CPP_CLASS, as tf_library did."""
    src = tmp_path / "src"
    src.mkdir()
    for f in ("mlp.pb", "mlp.config.pbtxt", "main.cc"):
        shutil.copy2(EXAMPLE / f, src / f)
    (src / "CMakeLists.txt").write_text(CMAKELISTS.format(module=REPO / "cmake" / "aotc.cmake"))
    cmake_build(src, tmp_path / "b", cxx)
    run = subprocess.run([str(tmp_path / "b" / "app")], capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    check_example_output(run.stdout)


SAVED_MODEL_CMAKELISTS = """
cmake_minimum_required(VERSION 3.16)
project(saved_model_cpp LANGUAGES CXX)
include("{module}")
aotc_add_model(mlp MODEL "{model}" CPP_CLASS sm::Mlp SIGNATURE serving_default TAG_SET serve)
add_executable(app main.cc)
target_link_libraries(app PRIVATE mlp)
"""

# Runs the signature by its keys: argv = input.bin, input key, output key, output.bin.
SAVED_MODEL_PROGRAM = r"""
#include <cstdio>
#include "mlp.hpp"
int main(int argc, char **argv) {
  if (argc != 5) return 2;
  sm::Mlp mlp;
  const int a = mlp.LookupArgIndex(argv[2]), r = mlp.LookupResultIndex(argv[3]);
  if (sm::Mlp::kNumArgs != 1 || a != 0 || r < 0) return 3;
  const std::size_t in_bytes = static_cast<std::size_t>(sm::Mlp::ArgSize(a));
  const std::size_t out_bytes = static_cast<std::size_t>(sm::Mlp::ResultSize(r));
  std::FILE *f = std::fopen(argv[1], "rb");
  if (f == nullptr || std::fread(mlp.arg_data(a), 1, in_bytes, f) != in_bytes) return 4;
  std::fclose(f);
  if (!mlp.Run()) {
    std::fprintf(stderr, "%s\n", mlp.error_msg().c_str());
    return 5;
  }
  f = std::fopen(argv[4], "wb");
  if (f == nullptr || std::fwrite(mlp.result_data(r), 1, out_bytes, f) != out_bytes) return 6;
  return std::fclose(f) == 0 ? 0 : 7;
}
"""


def test_saved_model_cmake(tmp_path: Path, cxx: str) -> None:
    """What saved_model_cli aot_compile_cpu did: a Keras SavedModel directory (from tests/tf_fixtures.py)
    through aotc_add_model with SIGNATURE, TAG_SET and CPP_CLASS; the class, looked up by the
    signature's keys, gives TensorFlow's outputs; a changed checkpoint recompiles the model."""
    from tf_fixtures import fixtures_dir

    fx = fixtures_dir()
    meta = json.loads((fx / "mlp.json").read_text())
    data = np.load(fx / "mlp.npz")
    (key_in,), (key_out,) = meta["signature_inputs"], meta["signature_outputs"]
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.cc").write_text(SAVED_MODEL_PROGRAM)
    shutil.copytree(fx / "mlp_saved_model", src / "saved")
    (src / "CMakeLists.txt").write_text(SAVED_MODEL_CMAKELISTS.format(module=REPO / "cmake" / "aotc.cmake",
                                                                      model="saved"))
    assert "aotc: compiling" in cmake_build(src, tmp_path / "b", cxx)
    assert "aotc: compiling" not in cmake_build(src, tmp_path / "b", cxx)
    data_file = next((src / "saved" / "variables").glob("variables.data-*"))
    later = time.time() + 10  # the copy kept the fixture's old times
    os.utime(data_file, (later, later))
    assert "aotc: compiling" in cmake_build(src, tmp_path / "b", cxx)
    x = data["in_0"]
    x.astype(np.float32).tofile(tmp_path / "x.bin")
    run = subprocess.run([str(tmp_path / "b" / "app"), str(tmp_path / "x.bin"), key_in, key_out,
                          str(tmp_path / "y.bin")], capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    expected = data[f"sig_{key_out}"]
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


VARIABLES_PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "g.hpp"

int main(int argc, char **argv) {
  (void)argc;
  float in[2][6 + 12 + 4 + 8];  // per run: x, then (first run only) w, b, c
  FILE *f = std::fopen(argv[1], "rb");
  if (!f || std::fread(in, sizeof in, 1, f) != 1) return 2;
  std::fclose(f);
  static_assert(vars::G::kNumVariables == 3 && vars::G::kNumArgs == 4, "variables are arguments");
  vars::G model;
  std::memcpy(model.var_w_data(), in[0] + 6, sizeof(float) * 12);
  std::memcpy(model.var_b_data(), in[0] + 18, sizeof(float) * 4);
  const float c[8] = {in[0][22], in[0][23], in[0][24], in[0][25], in[0][26], in[0][27], in[0][28], in[0][29]};
  model.set_var_cee_data(c);  // read-only: takes a const pointer
  const float *read_only = model.var_cee_data();
  if (read_only != c || model.num_variables() != 3 || model.var_w_count() != 12) return 3;
  for (int run = 0; run < 2; ++run) {
    std::memcpy(model.arg_x_data(), in[run], sizeof(float) * 6);
    if (!model.Run()) {
      std::printf("%s\n", model.error_msg().c_str());
      return 1;
    }
    for (int i = 0; i < 8; ++i) std::printf("%.7g ", model.result_y_data()[i]);
    for (int i = 0; i < 12; ++i) std::printf("%.7g ", model.var_w(static_cast<std::size_t>(i / 4), i % 4));
    for (int i = 0; i < 4; ++i) std::printf("%.7g ", model.var_b_data()[i]);
    std::printf("\n");
  }
  return 0;
}
"""


def test_variables_in_the_class(tmp_path: Path, cxx: str) -> None:
    """A TF graph's config variables: var_<name>_data accessors over the argument buffers, const for a
    read-only one, kNumVariables; Run updates w and b in place, twice, as TensorFlow did (ASan/UBSan)."""
    fx = small_fixtures_dir()
    data = np.load(fx / "graph.npz")
    cfg = tmp_path / "g.config.pbtxt"
    cfg.write_text('feed { id { node_name: "x" } } fetch { id { node_name: "y" } }\n'
                   'variable { node_name: "w" } variable { node_name: "b" }\n'
                   'variable { node_name: "c" readonly: true name: "cee" }\n')
    compile_model(fx / "graph.pb", tmp_path, "g", config=cfg, cpp_class="vars::G")
    header = (tmp_path / "g.hpp").read_text()
    assert "void set_var_w_data(float *data)" in header and "void set_var_cee_data(const float *data)" in header
    first = np.concatenate([data[k].ravel() for k in ("x_0", "init_w", "init_b", "init_c")])
    second = np.concatenate([data["x_1"].ravel(), np.zeros(24, np.float32)])
    (tmp_path / "in.bin").write_bytes(np.concatenate([first, second]).astype(np.float32).tobytes())
    exe = build(tmp_path / "libg.a", {"main.cc": VARIABLES_PROGRAM}, tmp_path, tuple(SANITIZE))
    proc = subprocess.run([str(exe), str(tmp_path / "in.bin")], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and "runtime error" not in proc.stderr, proc.stdout + proc.stderr
    for run, line in enumerate(proc.stdout.splitlines()):
        got = np.array(line.split(), np.float32)
        want = np.concatenate([data[f"y_{run}"].ravel(), data[f"w_{run}"].ravel(), data[f"b_{run}"].ravel()])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
