"""Debug dumps that make a compile inspectable: the graph as GraphViz, a kernel/memory summary, and
a picture of the workspace plan.

Text IR dumps (``NN_<pass>.txt``) show everything but make fusion and buffer reuse hard to see; the
picture of kernels as clusters and the time x offset map of the workspace show them at a glance.
Every function here only reads the graph, and ``write_dumps`` never fails a compile because
GraphViz is missing or broken: dumps are a convenience, not an output.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape as _xml_escape

import numpy as np

from aotc.ir.graph import Graph, Node, Value
from aotc.ops import OPS
from aotc.ops.cost import kernel_reads, node_flops

_MAX_LABEL = 48  # model names are truncated in pictures; the text dumps keep them whole


# -- escaping ---------------------------------------------------------------------------------------

def _dot_str(text: str) -> str:
    """A quoted dot string showing ``text`` literally.

    Backslashes are doubled so dot's own escapes (``\\n``, ``\\l``, ``\\N``...) cannot be injected,
    quotes are escaped, and real line breaks become dot line breaks. Plain (non-record, non-HTML)
    labels give ``<>{}|`` no meaning, so they need no escaping.
    """
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("?")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _xml(text: str) -> str:
    """XML-escape ``text`` for content and attributes; drops control characters XML 1.0 forbids."""
    clean = "".join("?" if (ord(ch) < 0x20 and ch not in "\t\n") or ch in "\ufffe\uffff" else ch
                    for ch in text)
    return _xml_escape(clean, {'"': "&quot;", "'": "&apos;"})


def _short(name: str) -> str:
    return name if len(name) <= _MAX_LABEL else name[:_MAX_LABEL - 3] + "..."


def _shape_str(v: Value) -> str:
    return "[?]" if v.shape is None else "[" + ",".join(str(d) for d in v.shape) + "]"


def _nbytes(v: Value) -> int:
    return 0 if v.shape is None or v.dtype is None else v.nbytes


def _scalar_str(v: Value) -> str:
    assert v.const is not None
    if v.const.size == 0:
        return "[]"
    x = v.const.reshape(-1)[0].item()
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _attrs(raw: str = "", **kw: str) -> str:
    """A dot attribute list: ``kw`` values are escaped, ``raw`` is trusted fixed styling."""
    return "[" + ", ".join([*(f"{k}={_dot_str(v)}" for k, v in kw.items()), *([raw] if raw else [])]) + "]"


# -- GraphViz ---------------------------------------------------------------------------------------

def graph_dot(graph: Graph, title: str) -> str:
    """GraphViz text of ``graph``; after fusion each kernel is a cluster, so fusion decisions show.

    Node ids are assigned in graph order (never from ``id()``), so the same graph gives the same text.
    Scalar constants are folded into their consumer's label to keep the picture readable.
    """
    lines = [
        "digraph aotc {",
        f"  graph [label={_dot_str(title)}, labelloc=t, fontsize=16, fontname=Helvetica];",
        '  node [shape=box, fontname=Helvetica, fontsize=10, style=filled, fillcolor="#ffffff"];',
        '  edge [fontname=Helvetica, fontsize=8, color="#555555"];',
    ]
    ids: dict[int, str] = {}       # id(value) -> dot node id of the value's source
    node_ids: dict[int, str] = {}  # id(node) -> dot node id
    count = {"c": 0, "i": 0}

    def source(v: Value, decl: list[str]) -> str:
        """Declare (once) and return the dot node that provides a value from outside the ops."""
        if id(v) not in ids:
            if v.is_const:
                ids[id(v)] = f"c{count['c']}"
                count["c"] += 1
                label = f"{_short(v.name)}\n{v.type_str()}"
                if v.size <= 4:
                    label += "\n" + str(np.asarray(v.const).reshape(-1).tolist())
                style = 'fontsize=8, height=0.2, margin="0.05,0.02", fillcolor="#eeeeee", color="#999999"'
                decl.append(f"  {ids[id(v)]} {_attrs(style, label=label, tooltip=v.name)};")
            else:
                ids[id(v)] = f"i{count['i']}"
                count["i"] += 1
                label = f"{_short(v.name)}\n{v.type_str()}"
                style = 'style="rounded,filled", fillcolor="#d9ead3"'
                decl.append(f"  {ids[id(v)]} {_attrs(style, label=label, tooltip=v.name)};")
        return ids[id(v)]

    def folded(v: Value | None) -> bool:
        return v is not None and v.is_const and v.size <= 1

    sources: list[str] = []
    for v in graph.inputs:
        source(v, sources)
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and v.producer is None and not folded(v):
                source(v, sources)
    lines += sources

    def op_decl(n: Node, indent: str) -> str:
        nid = node_ids[id(n)]
        label = n.op + "\n" + "\n".join(v.type_str() for v in n.outputs)
        for i, v in enumerate(n.inputs):
            if folded(v):
                assert v is not None
                label += f"\nin{i} = {_scalar_str(v)}"
        alias = n.op in OPS and OPS[n.op].kind == "alias"
        style = 'style="dashed,filled", fillcolor="#fafafa"' if alias else ""
        return f"{indent}{nid} {_attrs(style, label=label, tooltip=n.name or n.op)};"

    for i, n in enumerate(graph.nodes):
        node_ids[id(n)] = f"n{i}"
        for v in n.outputs:
            ids[id(v)] = f"n{i}"
    in_kernel: set[int] = set()
    for k in graph.kernels:
        lines.append(f"  subgraph cluster_k{k.index} {{")
        label = f"{k.name} [{k.kind}]"
        lines.append(f"    graph [label={_dot_str(label)}, "
                     'style="rounded,filled", fillcolor="#eef3fb", color="#6f8fc7", fontsize=11];')
        for n in k.nodes:
            in_kernel.add(id(n))
            lines.append(op_decl(n, "    "))
        lines.append("  }")
    for n in graph.nodes:
        if id(n) not in in_kernel:
            lines.append(op_decl(n, "  "))

    for i, v in enumerate(graph.outputs):
        label = f"{_short(v.name)}\n{v.type_str()}"
        style = 'style="rounded,filled", fillcolor="#fce5cd"'
        lines.append(f"  o{i} {_attrs(style, label=label, tooltip=v.name)};")

    for n in graph.nodes:
        for v in n.inputs:
            if v is None or folded(v):
                continue
            lines.append(f"  {ids[id(v)] if id(v) in ids else source(v, lines)} -> {node_ids[id(n)]} "
                         f"{_attrs(label=_shape_str(v), tooltip=v.name)};")
    for i, v in enumerate(graph.outputs):
        src = ids[id(v)] if id(v) in ids else source(v, lines)
        lines.append(f"  {src} -> o{i} {_attrs(label=_shape_str(v), tooltip=v.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- summary ----------------------------------------------------------------------------------------

def _buffer_rows(graph: Graph) -> list[dict[str, Any]]:
    plan = graph.memory
    if plan is None:
        return []
    names = {k.index: k.name for k in graph.kernels}
    rows = [(b, False) for b in (*plan.buffers.values(), *plan.partials.values())]
    rows += [(b, True) for b in plan.scratch.values()]
    rows.sort(key=lambda r: (r[0].first, r[0].offset, r[0].name))
    return [{"name": b.name, "size": b.size, "offset": b.offset, "first": b.first, "last": b.last,
             "first_kernel": names.get(b.first, ""), "last_kernel": names.get(b.last, ""),
             "scratch": scratch} for b, scratch in rows]


def summary_dict(graph: Graph) -> dict[str, Any]:
    """Per-kernel cost estimates and the workspace plan as plain JSON-ready data (for tools and tests)."""
    kernels = []
    for k in graph.kernels:
        read = sum(_nbytes(v) for v in kernel_reads(k))
        written = sum(_nbytes(v) for v in k.outputs)
        flops = sum(node_flops(n) for n in k.nodes)
        kernels.append({
            "index": k.index, "name": k.name, "kind": k.kind, "ops": k.ops, "flops": flops,
            "bytes_read": read, "bytes_written": written, "bytes_moved": read + written,
            "outputs": [{"name": v.name, "type": v.type_str()} for v in k.outputs],
        })
    memory = None
    if graph.memory is not None:
        memory = {"workspace_bytes": graph.memory.workspace_bytes,
                  "intermediate_bytes": graph.memory.intermediate_bytes,
                  "buffers": _buffer_rows(graph)}
    return {
        "graph": graph.name,
        "kernels": kernels,
        "total_flops": sum(k["flops"] for k in kernels),
        "total_bytes_moved": sum(k["bytes_moved"] for k in kernels),
        "memory": memory,
    }


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def summary_text(graph: Graph) -> str:
    """The summary as aligned tables, for reading next to the IR dumps."""
    d = summary_dict(graph)
    lines = [f"graph {d['graph']}: {len(d['kernels'])} kernels", ""]
    rows = []
    for k in d["kernels"]:
        ai = k["flops"] / k["bytes_moved"] if k["bytes_moved"] else 0.0
        rows.append([k["name"], k["kind"], "+".join(k["ops"]), f"{k['flops']:,}",
                     f"{k['bytes_read']:,}", f"{k['bytes_written']:,}", f"{ai:.2f}"])
    read, written = (sum(k[key] for k in d["kernels"]) for key in ("bytes_read", "bytes_written"))
    rows.append(["total", "", "", f"{d['total_flops']:,}", f"{read:,}", f"{written:,}", ""])
    lines += _table(["kernel", "kind", "ops", "flops", "bytes read", "bytes written", "flops/byte"],
                    rows, {3, 4, 5, 6})
    mem = d["memory"]
    lines.append("")
    if mem is None:
        lines.append("no memory plan (the memory planner has not run)")
        return "\n".join(lines) + "\n"
    saved = mem["intermediate_bytes"] - mem["workspace_bytes"]
    lines.append(f"workspace: {mem['workspace_bytes']:,} bytes for {mem['intermediate_bytes']:,} bytes "
                 f"of intermediates ({saved:,} bytes saved by reuse)")
    if mem["buffers"]:
        lines.append("")
        brows = [[_short(b["name"]), "scratch" if b["scratch"] else "tensor", f"{b['size']:,}",
                  f"{b['offset']:,}", b["first_kernel"] or str(b["first"]),
                  b["last_kernel"] or str(b["last"])] for b in mem["buffers"]]
        lines += _table(["buffer", "kind", "size", "offset", "first kernel", "last kernel"], brows, {2, 3})
    return "\n".join(lines) + "\n"


# -- memory plan picture ----------------------------------------------------------------------------

def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f}".removesuffix(".0") + " " + unit
        n /= 1024
    raise AssertionError("unreachable")


def memory_svg(graph: Graph) -> str:
    """The workspace plan as an SVG: kernel index (time) across, byte offset up.

    Buffers that share bytes without overlapping in time are what the planner saves; here they sit
    at the same height in different columns. Only buffers are drawn as ``<rect>`` so tools and
    tests can count them; each has a ``<title>`` tooltip with its full name and numbers.
    """
    rows = _buffer_rows(graph)
    nk = max(len(graph.kernels), max((b["last"] + 1 for b in rows), default=0), 1)
    peak = graph.memory.workspace_bytes if graph.memory is not None else 0
    left, top, pw, ph = 90, 50, max(480, min(900, 80 * nk)), 360
    width, height = left + pw + 30, top + ph + 70
    sx, sy = pw / nk, ph / max(peak, 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="11" '
           'style="background:#ffffff">']
    human = f" ({_human(peak)})" if peak >= 1024 else ""
    title = f"{graph.name}: workspace plan, peak {peak:,} bytes{human}, {len(rows)} buffers"
    out.append(f"<title>{_xml(title)}</title>")
    out.append(f'<text x="{width / 2:.1f}" y="24" text-anchor="middle" font-size="14" '
               f'font-weight="bold">{_xml(title)}</text>')
    x0, y1 = left, top + ph
    out.append(f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{y1}" stroke="#000"/>')
    out.append(f'<line x1="{x0}" y1="{y1}" x2="{x0 + pw}" y2="{y1}" stroke="#000"/>')
    step = max(1, nk // 20)
    for i in range(0, nk, step):
        x = x0 + (i + 0.5) * sx
        out.append(f'<text x="{x:.1f}" y="{y1 + 16}" text-anchor="middle">k{i}</text>')
    for i in range(1, nk):
        x = x0 + i * sx
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y1}" stroke="#ddd" '
                   'stroke-dasharray="3,3"/>')
    tick = 1 << (max(peak // 4, 1).bit_length() - 1)  # a power of two: whole KiB/MiB labels
    for val in range(0, peak + 1, tick):
        y = y1 - val * sy
        out.append(f'<line x1="{x0 - 4}" y1="{y:.1f}" x2="{x0}" y2="{y:.1f}" stroke="#000"/>')
        if peak - val >= tick / 3:   # keep clear of the peak label
            out.append(f'<text x="{x0 - 7}" y="{y + 4:.1f}" text-anchor="end">{_xml(_human(val))}</text>')
    if peak:
        y = top
        out.append(f'<line x1="{x0 - 4}" y1="{y}" x2="{x0 + pw}" y2="{y}" stroke="#c00" '
                   'stroke-dasharray="5,3"/>')
        out.append(f'<text x="{x0 - 7}" y="{y + 4}" text-anchor="end" fill="#c00">{_human(peak)}</text>')
    out.append(f'<text x="{x0 + pw / 2:.1f}" y="{y1 + 38}" text-anchor="middle">'
               "kernel index (execution order)</text>")
    out.append(f'<text x="16" y="{top + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + ph / 2:.1f})">workspace offset (bytes)</text>')
    legend_y = y1 + 56
    for i, (label, color) in enumerate((("intermediate", "#9fc5e8"), ("scratch", "#f9cb9c"))):
        lx = x0 + i * 130
        out.append(f'<circle cx="{lx + 5}" cy="{legend_y - 4}" r="5" fill="{color}" stroke="#333"/>')
        out.append(f'<text x="{lx + 15}" y="{legend_y}">{label}</text>')
    for n, b in enumerate(rows):
        x = x0 + b["first"] * sx
        w = (b["last"] - b["first"] + 1) * sx
        h = max(b["size"] * sy, 1.0)
        y = y1 - (b["offset"] + b["size"]) * sy
        fill = "#f9cb9c" if b["scratch"] else ("#9fc5e8" if n % 2 == 0 else "#b6d7a8")
        tip = (f"{b['name']}: {b['size']:,} bytes at offset {b['offset']:,}, "
               f"kernels {b['first']}..{b['last']}")
        out.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{w - 2:.1f}" height="{h:.1f}" '
                   f'fill="{fill}" stroke="#333" stroke-width="0.8"><title>{_xml(tip)}</title></rect>')
        if h >= 12:
            chars = max(int((w - 6) / 6.2), 0)
            label = f"{b['name']} ({_human(b['size'])})"
            if len(label) > chars:
                label = label[:max(chars - 3, 0)] + "..." if chars > 3 else ""
            if label:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 4:.1f}" text-anchor="middle">'
                           f"{_xml(label)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- files ------------------------------------------------------------------------------------------

def write_dumps(graph: Graph, dump_dir: Path, stage: str) -> None:
    """Write ``{stage}.dot`` and, when GraphViz is installed, ``{stage}.png``.

    A missing or failing ``dot`` is ignored (and a stale picture removed) so a debugging aid can
    never break a compile.
    """
    dump_dir = Path(dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    dot_path, png = dump_dir / f"{stage}.dot", dump_dir / f"{stage}.png"
    dot_path.write_text(graph_dot(graph, f"{graph.name}: {stage}"), encoding="utf-8")
    png.unlink(missing_ok=True)
    exe = shutil.which("dot")
    if exe is None:
        return
    try:
        res = subprocess.run([exe, "-Tpng", "-o", str(png), str(dot_path)], capture_output=True,
                             timeout=120, check=False)
    except (OSError, subprocess.SubprocessError):
        res = None
    if res is None or res.returncode != 0:
        png.unlink(missing_ok=True)


def write_summary(graph: Graph, dump_dir: Path) -> None:
    """Write ``summary.txt``, ``summary.json`` and ``memory_plan.svg`` (after memory planning)."""
    dump_dir = Path(dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    (dump_dir / "summary.txt").write_text(summary_text(graph), encoding="utf-8")
    (dump_dir / "summary.json").write_text(json.dumps(summary_dict(graph), indent=2) + "\n",
                                           encoding="utf-8")
    (dump_dir / "memory_plan.svg").write_text(memory_svg(graph), encoding="utf-8")
