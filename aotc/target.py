"""Target CPUs: the compiler flags for ``--target-cpu`` and the GEMM micro-kernel family they allow."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from aotc.errors import AotcError

TARGETS = ("native", "x86-64-v3", "x86-64-v4", "generic")


@dataclass(frozen=True)
class Target:
    cpu: str
    isa: str          # GEMM micro-kernel family: avx512 | avx2 | neon | generic
    flags: list[str]


def _host_isa() -> str:
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return "neon"
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "generic"
    if {"avx512f", "avx512vl", "avx512bw"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "generic"


def resolve(cpu: str) -> Target:
    if cpu == "native":
        return Target(cpu, _host_isa(), ["-march=native"])
    if cpu == "x86-64-v3":
        return Target(cpu, "avx2", ["-march=x86-64-v3"])
    if cpu == "x86-64-v4":
        return Target(cpu, "avx512", ["-march=x86-64-v4"])
    if cpu == "generic":
        return Target(cpu, "generic", [])
    raise AotcError(f"unknown --target-cpu {cpu!r}; choose one of {', '.join(TARGETS)}")
