"""The feed/fetch config, in tfcompile's protobuf text format.

    feed  { id { node_name: "x" } shape { dim { size: 1 } dim { size: 784 } } name: "x" }
    fetch { id { node_name: "y" output_index: 0 } name: "y" }

``node_name`` names an ONNX tensor, or a node (whose output ``output_index`` is meant). Feeds become
the library's inputs in the order given, fetches its outputs. Feeding an intermediate tensor cuts
everything upstream of it; fetching one prunes everything it does not need.

The parser knows tfcompile's messages (tf2xla.proto's Config, Feed, Fetch, Variable, TensorId and
TensorShapeProto), so every field is checked against its type as protobuf's own text parser would:
an unknown field, a string where an integer belongs, a scalar where a message belongs and a field
given twice are refused with the line they are on. Strings are C-escaped UTF-8, as in protobuf.
Nesting is as deep as the schema and no deeper, so no input can exhaust the parser's stack.
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
class Variable:
    """A TensorFlow variable the library takes as an argument (tfcompile's ``variable``): read-only, an
    input; otherwise an in-place argument, which the run updates where the graph assigns it."""
    node_name: str
    name: str = ""
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    readonly: bool = False
    line: int = 0  # where the config gives it, for errors found against the graph

    @property
    def label(self) -> str:
        return self.name or self.node_name


@dataclass
class Config:
    feeds: list[Feed] = field(default_factory=list)
    fetches: list[Fetch] = field(default_factory=list)
    variables: list[Variable] = field(default_factory=list)


# Each message's fields: name -> (kind, repeated). A kind is a scalar type ("string", "int", "bool",
# "dtype") or the name of another message. Variables name TensorFlow variable nodes (an ONNX model has
# none); a fetch's shape and type are not checked.
_SHAPE = {"dim": ("Dim", True), "unknown_rank": ("bool", False)}
_SCHEMA: dict[str, dict[str, tuple[str, bool]]] = {
    "Config": {"feed": ("Feed", True), "fetch": ("Fetch", True), "variable": ("Variable", True)},
    "Feed": {"id": ("TensorId", False), "shape": ("Shape", False), "name": ("string", False),
             "type": ("dtype", False)},
    "Fetch": {"id": ("TensorId", False), "name": ("string", False), "shape": ("Shape", False),
              "type": ("dtype", False)},
    "Variable": {"node_name": ("string", False), "name": ("string", False), "shape": ("Shape", False),
                 "type": ("dtype", False), "readonly": ("bool", False)},
    "TensorId": {"node_name": ("string", False), "output_index": ("int", False)},
    "Shape": _SHAPE,
    "Dim": {"size": ("int", False), "name": ("string", False)},
}
_WHAT = {"Config": "the config", "Feed": "a feed", "Fetch": "a fetch", "Variable": "a variable", "TensorId": "an id",
         "Shape": "a shape", "Dim": "a dim"}

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\f\v]+|\#[^\n]*) | (?P<newline>\n)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?\.?[0-9](?:[0-9A-Za-z_.]|[eE][-+])*)
  | (?P<punct>[{}<>\[\]:,;])
""", re.VERBOSE)
_INT = re.compile(r"-?(?:0[xX][0-9a-fA-F]+|0|[1-9][0-9]*)")  # no leading zeros: protobuf reads them as octal
_BOOL = {"true": True, "True": True, "t": True, "1": True, "false": False, "False": False, "f": False, "0": False}
_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, "'": 39, '"': 34, "?": 63}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)


@dataclass
class _Tok:
    kind: str
    text: str
    line: int


def _show(text: str) -> str:
    """A token for a message: as written, unless it holds characters a terminal would act on."""
    return text if text.isprintable() else repr(text)


class _Located(AotcError):
    """An error at a line of the config text (the file name is added by ``load_config``)."""

    def __init__(self, line: int, msg: str) -> None:
        self.line, self.msg = line, msg
        super().__init__(f"config line {line}: {msg}")


def _tokens(text: str) -> list[_Tok]:
    out, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] in "\"'":
                raise _Located(line, f"string {text[pos:].splitlines()[0][:30]!r} is not closed on its line")
            raise _Located(line, f"cannot parse near {text[pos:pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        if kind == "newline":
            line += 1
        elif kind != "space":
            out.append(_Tok(kind, m.group(), line))
    return out


def _unescape(tok: _Tok) -> str:
    """A quoted string's value: C escapes give bytes (as in protobuf), and the whole is UTF-8."""
    body = tok.text[1:-1]
    data = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(body):
        data += body[pos:m.start()].encode("utf-8")
        octal, hx, u4, u8, char = m.groups()
        if octal or hx:
            data.append(int(octal, 8) & 0xFF if octal else int(hx, 16))
        elif u4 or u8:
            code = int(u4 or u8, 16)
            if code > 0x10FFFF or 0xD800 <= code < 0xE000:
                raise _Located(tok.line, f"string {_show(tok.text)} has an invalid code point escape {m.group()}")
            data += chr(code).encode("utf-8")
        elif char in _ESCAPES:
            data.append(_ESCAPES[char])
        else:
            raise _Located(tok.line, f"string {_show(tok.text)} has an unknown escape {_show(m.group())}")
        pos = m.end()
    data += body[pos:].encode("utf-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Located(tok.line, f"string {_show(tok.text)} is not valid UTF-8") from None


def _scalar(kind: str, name: str, toks: list[_Tok], i: int) -> tuple[object, int]:
    """The value of scalar field ``name`` of type ``kind`` at ``toks[i]``; the index after it."""
    t = toks[i]
    if kind == "string":
        if t.kind != "string":
            raise _Located(t.line, f"{name} must be a quoted string, got {_show(t.text)}")
        parts = []
        while i < len(toks) and toks[i].kind == "string":  # adjacent strings concatenate
            parts.append(_unescape(toks[i]))
            i += 1
        return "".join(parts), i
    if kind == "int":
        if t.kind != "number" or not _INT.fullmatch(t.text):
            raise _Located(t.line, f"{name} must be an integer, got {_show(t.text)}")
        value = int(t.text, 0)
        if not -(1 << 63) <= value < 1 << 63:
            raise _Located(t.line, f"{name} {t.text} does not fit in 64 bits")
        return value, i + 1
    if kind == "bool":
        if t.text not in _BOOL or t.kind == "string":
            raise _Located(t.line, f"{name} must be true or false, got {_show(t.text)}")
        return _BOOL[t.text], i + 1
    assert kind == "dtype"
    if t.kind not in ("ident", "string"):
        raise _Located(t.line, f"{name} must be a type name such as DT_FLOAT, got {_show(t.text)}")
    value = _unescape(t) if t.kind == "string" else t.text
    try:
        return dtypes.from_name(value), i + 1
    except AotcError as e:
        raise _Located(t.line, str(e)) from None


_Fields = dict[str, list[tuple[object, int]]]  # field -> [(value, line)]


def _message(toks: list[_Tok], i: int, schema: str, opened: _Tok | None) -> tuple[_Fields, int]:
    """Fields of a ``schema`` message from ``toks[i]`` to its closing brace (the end for the top level);
    the index after it. Recursion follows the schema, so it is at most four deep."""
    fields = _SCHEMA[schema]
    close = None if opened is None else "}" if opened.text == "{" else ">"
    msg: _Fields = {}
    while True:
        if i >= len(toks):
            if opened is not None:
                raise _Located(opened.line, f"unbalanced braces: the {opened.text!r} of this line is never closed")
            return msg, i
        t = toks[i]
        if t.text == close and t.kind == "punct":
            return msg, i + 1
        if t.kind == "punct" and t.text in ",;":
            i += 1
            continue
        if t.kind != "ident":
            raise _Located(t.line, f"expected a field name, got {_show(t.text)}")
        if t.text not in fields:
            raise _Located(t.line, f"unknown field {t.text!r} in {_WHAT[schema]}"
                                   f" (known: {', '.join(fields)})")
        kind, repeated = fields[t.text]
        if not repeated and t.text in msg:
            raise _Located(t.line, f"{t.text} given twice in {_WHAT[schema]} (first on line {msg[t.text][0][1]})")
        i += 1
        if i < len(toks) and toks[i].text == ":" and toks[i].kind == "punct":
            i += 1
        if i >= len(toks):
            raise _Located(t.line, f"field {t.text!r} has no value")
        v = toks[i]
        if kind in _SCHEMA:
            if v.kind != "punct" or v.text not in "{<":
                raise _Located(v.line, f"{t.text} must be a message {{ ... }}, got {_show(v.text)}")
            value, i = _message(toks, i + 1, kind, v)
        else:
            if v.kind == "punct":
                raise _Located(v.line, f"{t.text} must be a single {kind} value, got {_show(v.text)}")
            value, i = _scalar(kind, t.text, toks, i)
        msg.setdefault(t.text, []).append((value, t.line))


def _one(msg: _Fields, key: str, default=None):
    vals = msg.get(key)
    return vals[0][0] if vals else default


def _tensor_id(msg: _Fields, where: str, line: int) -> TensorId:
    ident = _one(msg, "id")
    if ident is None or _one(ident, "node_name") is None:
        raise _Located(line, f"{where} has no id {{ node_name: ... }}")
    index = _one(ident, "output_index", 0)
    if index < 0:
        raise _Located(ident["output_index"][0][1], f"output_index must be >= 0, got {index}")
    return TensorId(_one(ident, "node_name"), index)


def _feed_shape(f: _Fields, name: str, kind: str = "feed") -> tuple[int, ...] | None:
    shape = _one(f, "shape")
    if shape is None:
        return None
    if _one(shape, "unknown_rank", False) or any(_one(d, "size", -1) < 0 for d, _ in shape.get("dim", [])):
        raise _Located(f["shape"][0][1], f"{kind} {name!r} has an unknown dimension; aotc needs static shapes")
    return tuple(_one(d, "size") for d, _ in shape.get("dim", []))


def _variable(f: _Fields, line: int) -> Variable:
    node = _one(f, "node_name")
    if not node:
        raise _Located(line, "a variable has no node_name")
    return Variable(node, _one(f, "name", ""), _feed_shape(f, node, "variable"), _one(f, "type"),
                    _one(f, "readonly", False), line)


def _refuse_duplicates(kind: str, plural: str, entries: list[tuple[TensorId, str, int]]) -> None:
    """The same tensor fed (or fetched) twice, or two feeds (fetches) of one name, is a mistake: the
    library would have two inputs (outputs) that cannot be told apart."""
    ids: dict[tuple[str, int], int] = {}
    names: dict[str, int] = {}
    for tid, name, line in entries:
        key = (tid.node_name, tid.output_index)
        if key in ids:
            raise _Located(line, f"{kind} of {tid.node_name!r} output {tid.output_index} given twice "
                                 f"(first on line {ids[key]})")
        ids[key] = line
        if name and name in names:
            raise _Located(line, f"two {plural} named {name!r} (the first on line {names[name]})")
        names.setdefault(name, line)


def parse_config(text: str) -> Config:
    top, _ = _message(_tokens(text), 0, "Config", None)
    cfg = Config()
    feeds, fetches = [], []
    for f, line in top.get("feed", []):
        tid = _tensor_id(f, "a feed", line)
        cfg.feeds.append(Feed(tid, _feed_shape(f, tid.node_name), _one(f, "name", ""), _one(f, "type")))
        feeds.append((tid, cfg.feeds[-1].name, line))
    for f, line in top.get("fetch", []):
        cfg.fetches.append(Fetch(_tensor_id(f, "a fetch", line), _one(f, "name", "")))
        fetches.append((cfg.fetches[-1].id, cfg.fetches[-1].name, line))
    for f, line in top.get("variable", []):
        cfg.variables.append(_variable(f, line))
        feeds.append((TensorId(cfg.variables[-1].node_name), cfg.variables[-1].name, line))
    _refuse_duplicates("feed", "feeds", feeds)  # a variable is an argument as a feed is
    _refuse_duplicates("fetch", "fetches", fetches)
    if not cfg.fetches:
        raise AotcError("config: no fetch given")
    return cfg


def load_config(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AotcError(f"cannot read config {path}: {e}") from None
    try:
        return parse_config(text)
    except _Located as e:
        raise AotcError(f"config {path}, line {e.line}: {e.msg}") from None
