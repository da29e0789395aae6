"""Per-kernel timings from a ``--profile`` build: a table and a Chrome Trace Event file.

The trace uses the JSON object format of the Trace Event spec ("X" complete events, microsecond
timestamps), which chrome://tracing and Perfetto (ui.perfetto.dev) open. Each run is one event on
the calling thread's track, with its kernels nested inside.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class KernelStats:
    name: str
    ops: list[str]
    calls: int
    total_ns: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0


class Profile:
    """Timings of ``len(runs)`` runs; ``runs[r][2*i]``/``[2*i+1]`` are kernel i's start/end in ns."""

    def __init__(self, metadata: dict[str, Any], runs: list[list[int]], threads: int = 1) -> None:
        self.metadata = metadata
        self.runs = runs
        self.threads = threads
        kernels = metadata["kernels"]
        self.kernels = [KernelStats(k["name"], k["ops"], len(runs),
                                    sum(r[2 * i + 1] - r[2 * i] for r in runs))
                        for i, k in enumerate(kernels)]

    @property
    def total_ns(self) -> int:
        return sum(k.total_ns for k in self.kernels)

    def rows(self) -> list[dict[str, Any]]:
        total = self.total_ns or 1
        return [{"name": k.name, "ops": "+".join(k.ops), "calls": k.calls, "total_us": k.total_ns / 1e3,
                 "mean_us": k.mean_ns / 1e3, "share": k.total_ns / total} for k in self.kernels]

    def table(self, top: int | None = None) -> str:
        """Kernels sorted by total time, slowest first."""
        rows = sorted(self.rows(), key=lambda r: -r["total_us"])[:top]
        name_w = max([6, *(len(r["name"]) for r in rows)])
        ops_w = min(40, max([3, *(len(r["ops"]) for r in rows)]))
        lines = [f"{'kernel':<{name_w}}  {'ops':<{ops_w}}  {'calls':>6}  {'total us':>10}  {'mean us':>9}  share",
                 "-" * (name_w + ops_w + 44)]
        for r in rows:
            ops = r["ops"] if len(r["ops"]) <= ops_w else r["ops"][:ops_w - 3] + "..."
            lines.append(f"{r['name']:<{name_w}}  {ops:<{ops_w}}  {r['calls']:>6}  {r['total_us']:>10.1f}  "
                         f"{r['mean_us']:>9.2f}  {100 * r['share']:5.1f}%")
        per_run = self.total_ns / max(1, len(self.runs)) / 1e3
        lines.append(f"{len(self.runs)} runs on {self.threads} thread(s): {per_run:.1f} us per run in kernels")
        return "\n".join(lines)

    def trace(self) -> dict[str, Any]:
        origin = min((r[0] for r in self.runs if r), default=0)
        name = self.metadata["name"]
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": f"aotc {name}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "run"}},
        ]
        for i, r in enumerate(self.runs):
            if not r:
                continue
            events.append({"name": f"{name}_run", "cat": "run", "ph": "X", "pid": 1, "tid": 1,
                           "ts": (r[0] - origin) / 1e3, "dur": (r[-1] - r[0]) / 1e3,
                           "args": {"iteration": i, "threads": self.threads}})
            for j, k in enumerate(self.kernels):
                events.append({"name": k.name, "cat": "kernel", "ph": "X", "pid": 1, "tid": 1,
                               "ts": (r[2 * j] - origin) / 1e3, "dur": (r[2 * j + 1] - r[2 * j]) / 1e3,
                               "args": {"ops": "+".join(k.ops), "iteration": i}})
        return {"traceEvents": events, "displayTimeUnit": "ns",
                "otherData": {"model": name, "aotc_version": self.metadata.get("aotc_version", "")}}

    def write_trace(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.trace()) + "\n")
        return path
