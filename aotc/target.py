"""What a library is compiled for: the target triple, the C compiler and its flags, the instruction set
of the hand-vectorized kernels (an ``aotc.isa`` entry), the cache sizes the kernels block for, and
whether this machine can run the result (natively, under qemu-user, or not at all).

``resolve`` builds a ``Target`` from the command line's ``--target``, ``--target-cpu``,
``--target-features`` and ``--sysroot`` (tfcompile's ``--target_triple``, ``--target_cpu`` and
``--target_features``). The compiler decides the ISA: it is asked which macros its flags predefine
(``__AVX512F__``, ``__AVX2__`` and ``__FMA__``, ``__ARM_NEON``), so ``-march=native``, a named CPU,
``+avx512f`` or ``CFLAGS`` all select the kernels the build can compile. The ``Target`` is then passed
explicitly to the passes, the memory planner and the code generators.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from aotc.errors import AotcError
from aotc.isa import ISAS, Isa, isa_for_macros

# The cache model the GEMM and conv blocking derive their block sizes from: a 32 KiB L1d and a 512 KiB
# L2 per core (Zen 3/4, Skylake-SP and later, Neoverse N1), what the kernels were tuned on. ``native``
# keeps it too rather than reading this machine's caches, so one set of flags gives one library.
L1D_BYTES = 32 * 1024
L2_BYTES = 512 * 1024


@dataclass(frozen=True)
class _Triple:
    arch: str        # what the compiler's -dumpmachine starts with
    cpu_option: str  # how a --target-cpu name reaches the compiler
    qemu: str        # the qemu-user program that runs its binaries elsewhere


TRIPLES = {
    "x86_64-linux-gnu": _Triple("x86_64", "-march", "qemu-x86_64"),
    "aarch64-linux-gnu": _Triple("aarch64", "-mcpu", "qemu-aarch64"),
    "riscv64-linux-gnu": _Triple("riscv64", "-mcpu", "qemu-riscv64"),
}
# Plain C with no intrinsics, built by the host's compiler (CC or cc): what any gcc or clang builds.
GENERIC = "generic"
# CUDA C++ for NVIDIA GPUs, built by nvcc (aotc/codegen/cuda): the host code runs on this machine.
CUDA = "cuda"
CUDA_ARCHS = ("sm_80", "sm_90")  # Ampere and Hopper: the default --cuda-arch

# Compiler macros of x86 instruction-set extensions -> /proc/cpuinfo's names: the extensions a library
# built with those flags may execute, so the ones a CPU must have to load it.
_X86_FEATURES = {
    "__SSE3__": "pni", "__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2",
    "__POPCNT__": "popcnt", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c",
    "__BMI__": "bmi1", "__BMI2__": "bmi2", "__LZCNT__": "abm", "__MOVBE__": "movbe",
    "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512CD__": "avx512cd",
    "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BF16__": "avx512_bf16", "__AVX512FP16__": "avx512_fp16", "__AVX512IFMA__": "avx512ifma",
    "__AVX512VBMI__": "avx512vbmi", "__AVX512VBMI2__": "avx512_vbmi2", "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq", "__AVXVNNI__": "avx_vnni", "__GFNI__": "gfni",
    "__VAES__": "vaes", "__VPCLMULQDQ__": "vpclmulqdq",
}
# The same for AArch64 (cpuinfo's Features line).
_ARM_FEATURES = {
    "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp", "__ARM_FEATURE_DOTPROD": "asimddp",
    "__ARM_FEATURE_SVE": "sve", "__ARM_FEATURE_SVE2": "sve2", "__ARM_FEATURE_MATMUL_INT8": "i8mm",
    "__ARM_FEATURE_BF16_VECTOR_ARITHMETIC": "bf16",
}


@dataclass(frozen=True)
class Target:
    triple: str                 # as asked: a key of TRIPLES, or "generic"
    cpu: str                    # --target-cpu ("generic": the compiler's default for the triple)
    features: tuple[str, ...]   # --target-features, e.g. ("+avx512f", "-avx512bw")
    cc: str                     # the C compiler command (CC, else cc or TRIPLE-gcc)
    ar: str                     # the archiver (AR, else ar or TRIPLE-ar)
    flags: tuple[str, ...]      # what the target adds to the compiler's flags
    sysroot: str | None
    isa: Isa
    machine: str                # the compiler's -dumpmachine: what its binaries run on
    requires: tuple[str, ...] = ()  # CPU features (cpuinfo names) the code may use
    l1d_bytes: int = L1D_BYTES
    l2_bytes: int = L2_BYTES
    qemu: str = field(default="", compare=False)
    cuda_arch: tuple[str, ...] = ()  # --target cuda: the GPU architectures compiled for (sm_80, ...)
    tf32: bool = False               # --target cuda: float32 GEMMs and convs may use TF32 tensor cores

    @property
    def is_cuda(self) -> bool:
        return self.triple == CUDA

    @property
    def arch(self) -> str:
        return self.machine.split("-", 1)[0]

    def summary(self) -> str:
        """One line for the header comment and ``aotc compile -v``."""
        flags = " ".join(self.flags) or "no target flags"
        if self.is_cuda:
            return f"cuda {','.join(self.cuda_arch)} ({'TF32' if self.tf32 else 'exact FP32'} GEMM), {self.cc}"
        return f"{self.triple}, --target-cpu {self.cpu} ({flags}), {self.isa.name} kernels, {self.cc}"

    def metadata(self) -> dict:
        """What NAME.json records, and ``host_problem`` reads back."""
        return {"triple": self.triple, "cpu": self.cpu, "features": list(self.features), "cc": self.cc,
                "flags": list(self.flags), "sysroot": self.sysroot, "isa": self.isa.name,
                "machine": self.machine, "requires": list(self.requires),
                "l1d_bytes": self.l1d_bytes, "l2_bytes": self.l2_bytes,
                **({"cuda_arch": list(self.cuda_arch), "tf32": self.tf32} if self.is_cuda else {})}

    def runner(self) -> list[str] | None:
        """How this machine runs a program built for the target: ``[]`` natively, the qemu-user command
        line to prefix, or None when it cannot."""
        if host_problem(self.metadata()) is None:
            return []
        if self.arch == host_arch() or not self.qemu or shutil.which(self.qemu) is None:
            return None
        root = self.sysroot or f"/usr/{self.triple}"
        return [self.qemu, "-L", root] if Path(root).is_dir() else None


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def host_triple() -> str:
    return f"{host_arch()}-linux-gnu"


def host_cpu_features() -> set[str]:
    """This CPU's instruction-set features as /proc/cpuinfo names them (x86 ``flags``, Arm ``Features``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def host_problem(meta: dict) -> str | None:
    """Why this machine cannot load a library whose NAME.json says ``target`` is ``meta``; None if it can."""
    if meta.get("triple") == CUDA:
        return None  # its host code runs here; aotc.cuda_bindings says if there is no GPU
    arch = str(meta.get("machine", "")).split("-", 1)[0]
    if arch and arch != host_arch():
        qemu = TRIPLES[meta["triple"]].qemu if meta.get("triple") in TRIPLES else f"qemu-{arch}"
        return (f"it was compiled for {meta.get('triple')} ({arch}) and this machine is {host_arch()}: run its "
                f"generated test program (--gen-test) under {qemu}, or compile it for this machine")
    have = host_cpu_features()
    missing = sorted(set(meta.get("requires", ())) - have)
    if have and missing:  # no /proc/cpuinfo (not Linux): no way to tell, so no refusal
        return (f"it was compiled with --target-cpu {meta.get('cpu')} for a CPU with {', '.join(missing)}, which "
                "this CPU lacks: compile it here, or with an older --target-cpu (x86-64-v3, generic)")
    return None


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _features(text: str | None) -> tuple[str, ...]:
    feats = tuple(f.strip() for f in (text or "").split(",") if f.strip())
    for f in feats:
        if f[0] not in "+-" or not _NAME.match(f[1:]):
            raise AotcError(f"--target-features: expected +FEATURE or -FEATURE separated by commas, got {f!r}")
    return feats


def _cpu_flags(triple: str, cpu: str, feats: tuple[str, ...]) -> list[str]:
    """Compiler options for a CPU and features: x86 ``-march=CPU -mFEAT -mno-FEAT``; AArch64
    ``-mcpu=CPU+FEAT+noFEAT`` (``-march=armv8-a+...`` for generic); RISC-V ``-march=rv64gc`` plus
    extensions (single letters appended, longer ones after ``_``) and ``-mcpu=CPU``."""
    arch = TRIPLES[triple].arch if triple in TRIPLES else host_arch()
    option = TRIPLES[triple].cpu_option if triple in TRIPLES else "-mcpu"
    res = [] if cpu == "generic" else [f"{option}={cpu}"]
    if not feats:
        return res
    if arch == "x86_64":
        return res + [f"-m{f[1:]}" if f[0] == "+" else f"-mno-{f[1:]}" for f in feats]
    if arch == "aarch64":
        ext = "".join(f"+{f[1:]}" if f[0] == "+" else f"+no{f[1:]}" for f in feats)
        return [f"-mcpu={cpu}{ext}"] if cpu != "generic" else [f"-march=armv8-a{ext}"]
    if arch == "riscv64":
        if any(f[0] == "-" for f in feats):
            raise AotcError("--target-features: riscv64 extensions can only be added (+NAME), not removed")
        ext = "".join(f[1:] if len(f) == 2 else f"_{f[1:]}" for f in feats)
        return [f"-march=rv64gc{ext}", *res]
    raise AotcError(f"--target-features is not supported for {triple}")


@lru_cache(maxsize=32)
def _ask_compiler(cc: str, flags: tuple[str, ...]) -> tuple[str, frozenset[str]]:
    """(-dumpmachine, predefined macros) of compiler ``cc`` with ``flags``."""
    argv = shlex.split(cc)
    try:
        machine = subprocess.run([*argv, *flags, "-dumpmachine"], capture_output=True, text=True, check=True)
        macros = subprocess.run([*argv, *flags, "-dM", "-E", "-x", "c", os.devnull], capture_output=True,
                                text=True, check=True)
    except FileNotFoundError:
        raise AotcError(f"C compiler {argv[0]!r} not found") from None
    except subprocess.CalledProcessError as e:
        first = next((ln for ln in (e.stderr or "").splitlines() if ln.strip()), f"exit status {e.returncode}")
        raise AotcError(f"C compiler {cc!r} refuses the flags {' '.join(flags) or '(none)'}: {first}") from None
    names = frozenset(ln.split()[1] for ln in macros.stdout.splitlines() if ln.startswith("#define "))
    return machine.stdout.strip(), names


def resolve(triple: str | None = None, cpu: str | None = None, features: str | None = None,
            sysroot: str | None = None, extra_cflags: list[str] | None = None,
            cuda_arch: str | None = None, tf32: bool = False) -> Target:
    """The target for the command line's choices. ``triple`` defaults to this machine's; ``cpu`` to
    ``native`` for this machine's triple (the library then needs a CPU with this one's instruction
    sets) and to ``generic`` (the compiler's baseline for the triple) for any other. The compiler is
    CC, else ``cc`` for this machine's triple and ``TRIPLE-gcc`` for a cross one. For a cross triple, a
    CPU name other than native, generic and the x86-64 levels, or features, it is asked (with
    ``extra_cflags`` and CFLAGS) which machine it builds for and which ISA its flags enable."""
    triple = triple or host_triple()
    if triple == CUDA:
        if cpu or features or sysroot:
            raise AotcError("--target cuda takes no --target-cpu, --target-features or --sysroot (--cuda-arch "
                            "chooses the GPUs)")
        return cuda_target(cuda_arch, tf32)
    if cuda_arch or tf32:
        raise AotcError("--cuda-arch and --cuda-tf32 need --target cuda")
    if triple != GENERIC and triple not in TRIPLES and triple != host_triple():
        raise AotcError(f"unknown --target {triple!r}; choose one of {', '.join([*TRIPLES, GENERIC, CUDA])}")
    info = TRIPLES.get(triple)
    host = triple == GENERIC or info is None or info.arch == host_arch()
    cpu = cpu or ("native" if host and triple != GENERIC else "generic")
    if not _NAME.match(cpu):
        raise AotcError(f"--target-cpu: not a CPU name: {cpu!r}")
    if cpu == "native" and not host:
        raise AotcError(f"--target-cpu native names this machine's CPU ({host_arch()}); for {triple} give a CPU "
                        "name or generic")
    feats = _features(features)
    if triple == GENERIC and (cpu != "generic" or feats):
        raise AotcError("--target generic is portable C for GCC or Clang: it takes no --target-cpu or "
                        "--target-features")
    env_cc = os.environ.get("CC")
    cc = env_cc or ("cc" if host else f"{triple}-gcc")
    ar = os.environ.get("AR") or ("ar" if host else f"{triple}-ar")
    flags = _cpu_flags(triple, cpu, feats)
    if not host and "clang" in Path(shlex.split(cc)[0]).name:
        flags.insert(0, f"--target={triple}")
    if sysroot:
        flags.append(f"--sysroot={sysroot}")
    arch = info.arch if info is not None and triple != GENERIC else host_arch()
    table = _X86_FEATURES if arch == "x86_64" else _ARM_FEATURES if arch == "aarch64" else {}
    known = _known_cpu(arch, cpu) if host and not feats else None
    if known is not None:  # no need to run the compiler (which may be slow: ccache, a wrapper)
        machine, names = host_triple(), known
        macros = {m for m, f in table.items() if f in names} | set(_ARCH_MACROS.get(arch, ()))
    else:
        machine, macros = _ask(cc, flags, extra_cflags, host, env_cc is not None, triple)
        if machine.split("-", 1)[0] != arch:
            raise AotcError(f"C compiler {cc!r} builds for {machine}, not {triple}: "
                            f"{'unset CC or set it to' if env_cc else 'set CC to'} a compiler for {triple}")
        names = {f for m, f in table.items() if m in macros}
    isa = ISAS["generic"] if triple == GENERIC else isa_for_macros(macros)
    return Target(triple, cpu, feats, cc, ar, tuple(flags), sysroot, isa, machine, tuple(sorted(names)),
                  qemu=info.qemu if info else "")


# What every compiler for these architectures predefines.
_ARCH_MACROS = {"aarch64": ("__aarch64__", "__ARM_NEON")}
# The x86-64 micro-architecture levels (cpuinfo names of what each adds to the baseline's SSE2).
_V2 = ("pni", "ssse3", "sse4_1", "sse4_2", "popcnt")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")
_X86_LEVELS = {"generic": (), "x86-64": (), "x86-64-v2": _V2, "x86-64-v3": _V3,
               "x86-64-v4": (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")}


def _known_cpu(arch: str, cpu: str) -> set[str] | None:
    """The instruction-set features (cpuinfo names) of a CPU of this machine's architecture that needs no
    compiler to know: native (this CPU's), the x86-64 levels, generic; None for other names."""
    table = _X86_FEATURES if arch == "x86_64" else _ARM_FEATURES if arch == "aarch64" else {}
    if cpu == "native":
        return host_cpu_features() & set(table.values())
    if arch == "x86_64":
        return set(_X86_LEVELS[cpu]) if cpu in _X86_LEVELS else None
    return set() if cpu == "generic" else None


def _ask(cc: str, flags: list[str], extra_cflags: list[str] | None, host: bool, env_cc: bool,
         triple: str) -> tuple[str, set[str]]:
    """The compiler's machine and predefined macros with the target's flags and, where it accepts them,
    the user's (``extra_cflags``, CFLAGS): flags that break preprocessing (an ``-include`` of a missing
    file) are left to fail the build, which names them."""
    user = [*(extra_cflags or []), *shlex.split(os.environ.get("CFLAGS", ""))]
    try:
        try:
            machine, macros = _ask_compiler(cc, (*flags, *user))
        except AotcError:
            if not user:
                raise
            machine, macros = _ask_compiler(cc, tuple(flags))
    except AotcError as e:
        if host or env_cc:
            raise
        raise AotcError(f"{e}: install a cross compiler for {triple} (Debian: gcc-{triple.replace('_', '-')}) "
                        "or set CC") from None
    return machine, set(macros)


def find_nvcc() -> str:
    """nvcc: CUDACXX, else on PATH, else /usr/local/cuda/bin, else the one pip's nvidia-cuda-nvcc wheel installs
    (site-packages/nvidia/cu13/bin, which ``pip install '.[test]'`` brings)."""
    env = os.environ.get("CUDACXX")
    if env:
        return env
    found = shutil.which("nvcc")
    if found:
        return found
    candidates = [Path("/usr/local/cuda/bin/nvcc")]
    try:
        import nvidia  # the namespace package of NVIDIA's wheels

        candidates += [Path(p) / "cu13" / "bin" / "nvcc" for p in nvidia.__path__]
    except ImportError:
        pass
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise AotcError("nvcc not found for --target cuda: set CUDACXX, put nvcc on PATH, install the CUDA toolkit "
                    "in /usr/local/cuda, or pip install nvidia-cuda-nvcc nvidia-cuda-runtime")


_SM = re.compile(r"^sm_(\d{2,3})a?$")


def cuda_target(arch: str | None = None, tf32: bool = False) -> Target:
    """The CUDA target: kernels for ``arch`` (``"sm_90,sm_80"``; default sm_80 and sm_90), each as SASS plus the
    newest one's PTX for GPUs that come later. Its ``isa`` (portable C) and cache sizes only steer the shared
    passes; an L2 of 0 keeps the CPU's expand-depthwise conv fusion off, which the GPU emitter does not write."""
    archs = tuple(a.strip() for a in (arch or ",".join(CUDA_ARCHS)).split(",") if a.strip())
    for a in archs:
        m = _SM.match(a)
        if not m or int(m.group(1)) < 75:
            raise AotcError(f"--cuda-arch: expected sm_75 or newer (sm_80, sm_90, ...; CUDA 13 builds no older "
                            f"GPUs), got {a!r}")
    if not archs:
        raise AotcError("--cuda-arch: no architecture given")
    if tf32 and min(int(_SM.match(a).group(1)) for a in archs) < 80:  # type: ignore[union-attr]
        raise AotcError("--cuda-tf32 needs tensor cores with TF32: sm_80 or newer for every --cuda-arch")
    archs = tuple(sorted(dict.fromkeys(archs), key=lambda a: int(_SM.match(a).group(1))))  # type: ignore[union-attr]
    flags = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1][3:]},code=compute_{archs[-1][3:]}")
    return Target(CUDA, "generic", (), find_nvcc(), os.environ.get("AR") or "ar", tuple(flags), None,
                  ISAS["generic"], host_triple(), l2_bytes=0, cuda_arch=archs, tf32=tf32)


def for_isa(isa: str = "generic") -> Target:
    """A target with ``isa``'s kernels and the default cache model, for planning and generating code
    without asking a compiler (tests of the generators, and passes run without a target)."""
    return Target(GENERIC, "generic", (), "cc", "ar", (), None, ISAS[isa], host_triple())
