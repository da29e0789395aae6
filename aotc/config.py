"""The feed/fetch config, in tfcompile's protobuf text format.

    feed  { id { node_name: "x" } shape { dim { size: 1 } dim { size: 784 } } name: "x" }
    fetch { id { node_name: "y" output_index: 0 } name: "y" }

``node_name`` names an ONNX tensor, or a node (whose output ``output_index`` is meant). Feeds become
the library's inputs in the order given, fetches its outputs. Feeding an intermediate tensor cuts
everything upstream of it; fetching one prunes everything it does not need.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aotc.errors import AotcError
from aotc.ir import dtypes


@dataclass
class TensorId:
    node_name: str
    output_index: int = 0


@dataclass
class Feed:
    id: TensorId
    shape: tuple[int, ...] | None = None
    name: str = ""
    dtype: np.dtype | None = None


@dataclass
class Fetch:
    id: TensorId
    name: str = ""


@dataclass
class Config:
    feeds: list[Feed] = field(default_factory=list)
    fetches: list[Fetch] = field(default_factory=list)


_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|([A-Za-z_][A-Za-z0-9_]*)|("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')'
                    r'|(-?[0-9][0-9.eE+-]*)|([{}:<>\[\],;]))')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            line = text.count("\n", 0, pos) + 1
            raise AotcError(f"config: cannot parse line {line} near {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group(1) is None and m.group(0).strip():
            out.append(m.group(0).strip())
    return out


def _parse_message(toks: list[str], i: int, close: str | None) -> tuple[dict[str, list], int]:
    msg: dict[str, list] = {}
    while i < len(toks):
        t = toks[i]
        if close and t == close:
            return msg, i + 1
        if t in (",", ";"):
            i += 1
            continue
        if not re.match(r"[A-Za-z_]", t):
            raise AotcError(f"config: expected a field name, got {t!r}")
        i += 1
        if i < len(toks) and toks[i] == ":":
            i += 1
        if i >= len(toks):
            raise AotcError(f"config: field {t!r} has no value")
        if toks[i] in ("{", "<"):
            sub, i = _parse_message(toks, i + 1, "}" if toks[i] == "{" else ">")
            msg.setdefault(t, []).append(sub)
        else:
            raw = toks[i]
            i += 1
            msg.setdefault(t, []).append(raw[1:-1].encode().decode("unicode_escape")
                                         if raw[0] in "\"'" else raw)
    if close:
        raise AotcError("config: unbalanced braces")
    return msg, i


def _one(msg: dict[str, list], key: str, default=None):
    vals = msg.get(key, [])
    return vals[-1] if vals else default


def _tensor_id(msg: dict[str, list], where: str) -> TensorId:
    ident = _one(msg, "id")
    if ident is None or _one(ident, "node_name") is None:
        raise AotcError(f"config: {where} has no id {{ node_name: ... }}")
    return TensorId(_one(ident, "node_name"), int(_one(ident, "output_index", 0)))


def parse_config(text: str) -> Config:
    top, _ = _parse_message(_tokens(text), 0, None)
    unknown = set(top) - {"feed", "fetch", "variable"}
    if unknown:
        raise AotcError(f"config: unknown field(s) {', '.join(sorted(unknown))}")
    cfg = Config()
    for f in top.get("feed", []):
        tid = _tensor_id(f, "a feed")
        shape = None
        if "shape" in f:
            shape = tuple(int(_one(d, "size", -1)) for d in _one(f, "shape").get("dim", []))
            if any(d < 0 for d in shape):
                raise AotcError(f"config: feed {tid.node_name!r} has an unknown dimension; aotc needs "
                                "static shapes")
        dt = _one(f, "type")
        cfg.feeds.append(Feed(tid, shape, _one(f, "name", "") or "",
                              dtypes.from_name(dt) if dt else None))
    for f in top.get("fetch", []):
        cfg.fetches.append(Fetch(_tensor_id(f, "a fetch"), _one(f, "name", "") or ""))
    if not cfg.fetches:
        raise AotcError("config: no fetch given")
    return cfg


def load_config(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AotcError(f"cannot read config {path}: {e}") from None
    return parse_config(text)
