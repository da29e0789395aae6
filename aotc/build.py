"""Builds a generated library with ninja and the system C compiler.

Files are only rewritten when their content changes, so ninja rebuilds nothing for an unchanged
model. ``CC``, ``CFLAGS``, ``LDFLAGS`` and ``AR`` are respected.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from aotc import __version__
from aotc.codegen.library import Library, env
from aotc.errors import AotcError, BuildError

# -fno-math-errno lets sqrt vectorize. -fno-trapping-math lets compilers evaluate a comparison on both
# sides of a select, which vectorizes clamps such as HardSwish's (MobileNetV3's depthwise convs were
# scalar without it); no code here reads floating-point exception flags. Values keep IEEE semantics:
# NaN, infinities and signed zeros as written (no -ffast-math).
BASE_CFLAGS = ["-O3", "-std=c11", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math",
               "-fno-semantic-interposition"]


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def ninja_file(lib: Library, target_flags: list[str], extra_cflags: list[str] | None = None) -> str:
    cc = os.environ.get("CC", "cc")
    cflags = BASE_CFLAGS + target_flags + (extra_cflags or []) + shlex.split(os.environ.get("CFLAGS", ""))
    def obj(fname: str) -> dict:
        return {"src": fname, "obj": f"obj/{fname[:-2]}.o",
                "implicit": fname[:-2] + ".bin" if fname.endswith(".S") else "",
                "threads": fname in (f"{lib.name}_pool.c", f"{lib.name}_benchmark.c", f"{lib.name}_test.c")}

    in_programs = {f for srcs in lib.programs.values() for f in srcs}
    objects = [obj(f) for f in sorted(lib.files) if f.endswith((".c", ".S")) and f not in in_programs]
    programs = [{"exe": exe, "objects": [obj(f) for f in srcs]} for exe, srcs in sorted(lib.programs.items())]
    return env().get_template("build.ninja.j2").render(
        name=lib.name, version=__version__, cc=cc, ar=os.environ.get("AR", "ar"),
        cflags=" ".join(shlex.quote(f) for f in cflags), ldflags=os.environ.get("LDFLAGS", ""),
        objects=objects, programs=programs, threads=any(o["threads"] for o in objects))


def ninja_binary() -> str:
    try:
        import ninja  # the PyPI package ships the binary

        exe = Path(ninja.BIN_DIR) / "ninja"
        if exe.exists():
            return str(exe)
    except ImportError:
        pass
    found = shutil.which("ninja")
    if not found:
        raise AotcError("ninja not found: pip install ninja")
    return found


def write_and_build(lib: Library, out_dir: Path, target_flags: list[str],
                    extra_cflags: list[str] | None = None,
                    progress: Callable[[str], None] | None = None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "obj").mkdir(exist_ok=True)
    for fname, data in lib.files.items():
        write_if_changed(out_dir / fname, data)
    write_if_changed(out_dir / "build.ninja", ninja_file(lib, target_flags, extra_cflags).encode())
    run_ninja(out_dir, progress=progress)


def run_ninja(out_dir: Path, targets: list[str] | None = None,
              progress: Callable[[str], None] | None = None) -> None:
    """Build; ``progress`` gets ninja's status lines ("[3/12] CC obj/m_kernels_0.o") as they come."""
    jobs = str(max(1, os.cpu_count() or 1))
    cmd = [ninja_binary(), "-C", str(out_dir), "-j", jobs, *(targets or [])]
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if progress and line.startswith("["):
                progress(line.strip())
    if proc.returncode != 0:
        failed = [_source_of(out_dir, ln.split("FAILED:", 1)[1]) for ln in lines if "FAILED:" in ln]
        tail = "\n".join(lines[-40:])
        raise BuildError(f"C build failed for {', '.join(failed) or out_dir}; the build directory "
                         f"{out_dir} is kept for a bug report.\n{tail}")


def _source_of(out_dir: Path, target: str) -> str:
    """The generated file behind a failed ninja target ("[code=1] obj/m.o" -> OUT/m.c)."""
    target = re.sub(r"^\s*\[code=\d+\]\s*", "", target).strip()
    if target.startswith("obj/") and target.endswith(".o"):
        stem = target[4:-2]
        for ext in (".c", ".S"):
            if (out_dir / (stem + ext)).exists():
                return str(out_dir / (stem + ext))
    return str(out_dir / target)
