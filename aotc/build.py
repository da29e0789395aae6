"""Builds a generated library with ninja and the system C compiler.

Files are only rewritten when their content changes, so ninja rebuilds nothing for an unchanged
model. ``CC``, ``CFLAGS``, ``LDFLAGS`` and ``AR`` are respected.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from aotc import __version__
from aotc.codegen.library import Library, env
from aotc.errors import AotcError, BuildError

# -fno-math-errno lets sqrt vectorize; IEEE semantics for NaN and infinities are kept (no -ffast-math).
BASE_CFLAGS = ["-O3", "-std=c11", "-fPIC", "-fvisibility=hidden", "-fno-math-errno",
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
    objects = []
    for fname in sorted(lib.files):
        if fname.endswith(".c"):
            objects.append({"src": fname, "obj": f"obj/{fname[:-2]}.o", "implicit": ""})
        elif fname.endswith(".S"):
            objects.append({"src": fname, "obj": f"obj/{fname[:-2]}.o",
                            "implicit": fname[:-2] + ".bin"})
    return env().get_template("build.ninja.j2").render(
        name=lib.name, version=__version__, cc=cc, ar=os.environ.get("AR", "ar"),
        cflags=" ".join(shlex.quote(f) for f in cflags), ldflags=os.environ.get("LDFLAGS", ""),
        objects=objects)


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
                    extra_cflags: list[str] | None = None, verbose: bool = False) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "obj").mkdir(exist_ok=True)
    for fname, data in lib.files.items():
        write_if_changed(out_dir / fname, data)
    write_if_changed(out_dir / "build.ninja", ninja_file(lib, target_flags, extra_cflags).encode())
    run_ninja(out_dir, verbose=verbose)


def run_ninja(out_dir: Path, targets: list[str] | None = None, verbose: bool = False) -> None:
    jobs = str(max(1, os.cpu_count() or 1))
    cmd = [ninja_binary(), "-C", str(out_dir), "-j", jobs, *(targets or [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if verbose and proc.stdout:
        print(proc.stdout, end="")
    if proc.returncode != 0:
        failed = [ln.split("FAILED:", 1)[1].strip() for ln in proc.stdout.splitlines() if "FAILED:" in ln]
        msg = (proc.stdout + proc.stderr).strip().splitlines()
        tail = "\n".join(msg[-40:])
        raise BuildError(f"C build failed for {', '.join(failed) or out_dir}; the build directory "
                         f"{out_dir} is kept for a bug report.\n{tail}")
