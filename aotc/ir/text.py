"""The graph's text form: what ``Graph.to_text`` prints (dumps, bug reports, pass tests) and
``Graph.from_text`` reads back.

```
graph mlp opset=17 {
  input %image: float32[1,784]
  %fc1.weight: float32[784,128] = constant <elided>
  %hidden: float32[1,128] = MatMul(%image, %fc1.weight) _opset=17 @/fc1/MatMul
  %shape: int64[2] = constant [1, -1]
  %y: float32[1,128] = Reshape(%hidden, %shape) _opset=17
  return %y
}
```

- A value is ``%`` and its name in the model, as it is when it is a safe token (letters, digits and
  ``_ . $ / # -``, with ``:`` inside), else quoted with escapes: ``%"a b"``. Names need not be unique
  in the IR; the second value called ``x`` prints as ``%x~1``, the third ``%x~2``. The ``~N`` is not
  part of the name.
- A type is ``DTYPE[DIMS]``: ``float32[2,3]``, ``int64[]`` (a scalar), ``?[?]`` (not yet inferred).
  A graph input whose shape the model leaves open prints the model's dims: ``float32[N,3]``.
- A constant is declared on its own line just before the first node that reads it, with its elements
  in row-major order. ``to_text`` writes constants (and tensor attributes) of more than 16 elements
  as ``<elided>`` unless asked for every element (``to_text(elide=None)``); ``from_text`` refuses an
  elided constant unless ``fill_elided`` (deterministic placeholder data, to reproduce what a pass
  does with the graph's structure).
- The header ``graph NAME opset=N`` gives the graph's default opset (17 when left out).
- A node is ``OUTPUTS = OP(INPUTS) ATTRS @NAME``: ``_`` for an absent input, attributes sorted by
  name, and ``@NAME`` only when the node's name is not its first output's. The graph's name, ops and
  attribute keys are identifiers (letters, digits, ``_`` and ``.``) or quoted.
- Attribute values: ints (``3``), floats (``0.5``; ``1e-05f`` is the float32 nearest 1e-05, the
  shorter spelling of the double ``9.999999747378752e-06`` that ONNX's float attributes hold),
  strings (``"x"``), bytes (``b"x"``), ``true``/``false``, lists (``[1, 2]``), tensors
  (``int64[2] [1, 2]``). Lists and tuples both read back as lists.
- Floats print as the shortest decimal that reads back to the same bits (NaN payloads excepted).
- ``#`` starts a comment where a token may start (a dump's first line is one).
"""

from __future__ import annotations

import bisect
import contextlib
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value

_BARE_CHARS = r"[A-Za-z0-9_.$/#-]"
_BARE = re.compile(rf"{_BARE_CHARS}+(?::+{_BARE_CHARS}+)*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


class IRSyntaxError(AotcError):
    """Malformed IR text; ``line`` and ``column`` count from 1."""

    def __init__(self, line: int, column: int, message: str) -> None:
        self.line, self.column = line, column
        super().__init__(f"IR text, line {line}, column {column}: {message}")


# -- printing ---------------------------------------------------------------------------------------
def quote(s: str) -> str:
    """``s`` as a double-quoted literal: printable characters as they are, the rest escaped, so a
    listing is one line per statement whatever the model's names hold."""
    out = []
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch.isprintable():  # (surrogates and line separators are not)
            out.append(ch)
        else:
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


_SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quote_bytes(b: bytes) -> str:
    body = "".join("\\" + chr(c) if chr(c) in '"\\' else chr(c) if 0x20 <= c < 0x7F else f"\\x{c:02x}"
                   for c in b)
    return f'b"{body}"'


def _name(s: str) -> str:
    return s if _BARE.fullmatch(s) else quote(s)


def _ident(s: str) -> str:
    return s if _IDENT.fullmatch(s) else quote(s)


def _dtype_text(dt: np.dtype | None) -> str:
    if dt is None:
        return "?"
    return dtypes.dtype_name(dt) if dtypes.is_supported(dt) else np.dtype(dt).name


def type_text(dt: np.dtype | None, shape: tuple[int, ...] | None, dims: str | None = None) -> str:
    """``float32[2,3]``; ``dims`` is an open input's shape as the model wrote it (``N,3``)."""
    if shape is not None:
        body = ",".join(str(d) for d in shape)
    elif dims is not None:
        parts = dims.split(",")
        # (digits alone would read back as a known shape: then they are quoted)
        numbers = [p.isascii() and p.isdigit() for p in parts]
        body = ",".join(p if p == "?" or (num and not all(numbers)) else _ident(p)
                        for p, num in zip(parts, numbers, strict=True))
    else:
        body = "?"
    return f"{_dtype_text(dt)}[{body}]"


def _is_float(dt: np.dtype) -> bool:
    em = dtypes.emulated(dt)
    return em.compute == "float" if em else np.issubdtype(dt, np.floating)


def _elements(arr: np.ndarray) -> list[str]:
    flat = arr.reshape(-1)
    dt = arr.dtype
    if dt == dtypes.STRING:
        return [quote(x) if isinstance(x, str) else _quote_bytes(x) if isinstance(x, bytes) else quote(str(x))
                for x in flat]
    if dt == np.bool_:
        return ["true" if x else "false" for x in flat]
    if _is_float(dt):  # numpy's str is the shortest spelling that reads back to the same bits
        wide = flat if dt in (np.float16, np.float32, np.float64) else flat.astype(np.float32)
        return [str(x) for x in wide.astype(str)]
    if dtypes.emulated(dt) or np.issubdtype(dt, np.integer):
        return [str(x) for x in flat.astype(np.int64 if dtypes.emulated(dt) else dt).tolist()]
    return [str(x) for x in flat.tolist()]  # (a type the format cannot read back, e.g. complex)


def _literal(arr: np.ndarray, elide: int | None) -> str:
    if elide is not None and arr.size > elide:
        return "<elided>"
    return "[" + ", ".join(_elements(arr)) + "]"


def _float_text(x: float) -> str:
    r = repr(x)
    if abs(x) <= float(np.finfo(np.float32).max) and float(np.float32(x)) == x:
        short = str(np.float32(x))
        if len(short) + 1 < len(r):
            return short + "f"
    return r


def attr_text(a: Any, elide: int | None) -> str:
    """One attribute value as ``from_text`` reads it back."""
    if isinstance(a, (bool, np.bool_)):
        return "true" if a else "false"
    if isinstance(a, (int, np.integer)):
        return str(int(a))
    if isinstance(a, (float, np.floating)):
        return _float_text(float(a))
    if isinstance(a, str):
        return quote(a)
    if isinstance(a, bytes):
        return _quote_bytes(a)
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(attr_text(x, elide) for x in a) + "]"
    if isinstance(a, np.ndarray):
        return f"{type_text(a.dtype, a.shape)} {_literal(a, elide)}"
    return f"<opaque {type(a).__name__}>"  # (e.g. a protobuf message; from_text refuses it)


def print_graph(graph: Graph, elide: int | None) -> str:
    """The listing; tensors of more than ``elide`` elements print as ``<elided>``."""
    refs: dict[int, str] = {}
    used: dict[str, int] = {}

    def ref(v: Value | None) -> str:
        if v is None:
            return "_"
        if id(v) not in refs:
            k = used.get(v.name, 0)
            used[v.name] = k + 1
            refs[id(v)] = f"%{_name(v.name)}" + (f"~{k}" if k else "")
        return refs[id(v)]

    lines = [f"graph {_ident(graph.name)} opset={graph.opset} {{"]

    def declare_constants(values: list[Value | None]) -> None:
        for v in values:
            if v is not None and v.is_const and id(v) not in refs:
                lines.append(f"  {ref(v)}: {v.type_str()} = constant {_literal(v.const, elide)}")

    for v in graph.inputs:
        dims = graph.dynamic_inputs.get(v.name) if v.shape is None else None
        lines.append(f"  input {ref(v)}: {type_text(v.dtype, v.shape, dims)}")
    for n in graph.nodes:
        declare_constants(n.inputs)
        outs = ", ".join(f"{ref(v)}: {v.type_str()}" for v in n.outputs)
        args = ", ".join(ref(v) for v in n.inputs)
        attrs = "".join(f" {_ident(k)}={attr_text(a, elide)}" for k, a in sorted(n.attrs.items()))
        named = "" if n.outputs and n.name == n.outputs[0].name else f" @{_name(n.name)}"
        lines.append(f"  {outs} = {_ident(n.op)}({args}){attrs}{named}")
    declare_constants(list(graph.outputs))
    fetches = graph.outputs[:graph.num_fetches]
    lines.append("  return" + "".join(f"{',' if i else ''} {ref(v)}" for i, v in enumerate(fetches)))
    lines += [f"  update {ref(v)} = {ref(graph.outputs[pos])}" for v, pos in graph.update_pairs()]
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- reading ----------------------------------------------------------------------------------------
class _Token(NamedTuple):
    kind: str   # ref, at, ident, num, str, bytes, angle, a punctuation character, or end
    text: str
    value: Any
    pos: int


_STRING = r'"(?:[^"\\\n]|\\.)*"'
_TOKEN = re.compile(rf"""
    (?P<ws>[ \t\r\n]+) | (?P<comment>\#[^\n]*)
  | (?P<ref>%(?:(?P<ref_bare>{_BARE.pattern})|(?P<ref_q>{_STRING}))(?:~(?P<ref_k>\d+))?)
  | (?P<at>@(?:(?P<at_bare>{_BARE.pattern})|(?P<at_q>{_STRING})))
  | (?P<bytes>b{_STRING}) | (?P<str>{_STRING})
  | (?P<num>-inf|-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?f?)
  | (?P<ident>{_IDENT.pattern}) | (?P<angle><[^<>\n]*>) | (?P<punct>[{{}}()\[\],=:?])
""", re.VERBOSE | re.ASCII)
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_SIMPLE = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}


class _Parser:
    def __init__(self, text: str, fill_elided: bool) -> None:
        self.text = text
        self.fill_elided = fill_elided
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens: list[_Token] = []  # read on demand: text after the graph fails as such, not as a token
        self.lexer = self._lex()
        self.i = 0
        self.values: dict[tuple[str, int], tuple[Value, int]] = {}  # (name, ~N) -> value, line
        self.filled = 0

    # -- errors and tokens
    def error(self, pos: int, message: str) -> IRSyntaxError:
        line = bisect.bisect_right(self.line_starts, pos)
        return IRSyntaxError(line, pos - self.line_starts[line - 1] + 1, message)

    def _unquote(self, literal: str, pos: int, as_bytes: bool = False) -> Any:
        body = literal[1:-1]

        def one(m: re.Match) -> str:
            hx, u4, u8, ch = m.groups()
            if ch is not None:
                if ch not in _SIMPLE:
                    raise self.error(pos + 1 + m.start(), f"unknown escape \\{ch} in a string")
                return _SIMPLE[ch]
            if as_bytes and hx is None:
                raise self.error(pos + 1 + m.start(), "bytes literals take only \\xHH escapes")
            code = int(hx or u4 or u8, 16)
            if code > 0x10FFFF:
                raise self.error(pos + 1 + m.start(), f"escape {m.group(0)} is past U+10FFFF")
            return chr(code)
        s = _ESCAPE.sub(one, body)
        if as_bytes:
            if any(ord(c) > 0xFF for c in s):
                raise self.error(pos, "bytes literals hold only characters below U+0100")
            return s.encode("latin-1")
        return s

    def _lex(self) -> Iterator[_Token]:
        pos, text = 0, self.text
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                if text[pos] == '"' or text[pos:pos + 2] in ('%"', '@"', 'b"'):
                    raise self.error(pos, "unterminated string (strings end on the same line)")
                raise self.error(pos, f"unexpected character {text[pos]!r}")
            kind = m.lastgroup
            assert kind is not None
            if kind in ("ref_bare", "ref_q", "ref_k"):
                kind = "ref"
            elif kind in ("at_bare", "at_q"):
                kind = "at"
            start, pos = pos, m.end()
            value: Any = None
            if kind in ("ws", "comment"):
                continue
            if kind == "ref":
                q = m.group("ref_q")
                name = self._unquote(q, start + 1) if q is not None else m.group("ref_bare")
                value = (name, int(m.group("ref_k") or 0))
            elif kind == "at":
                q = m.group("at_q")
                value = self._unquote(q, start + 1) if q is not None else m.group("at_bare")
            elif kind == "str":
                value = self._unquote(m.group(0), start)
            elif kind == "bytes":
                value = self._unquote(m.group(0)[1:], start + 1, as_bytes=True)
            elif kind == "punct":
                kind = m.group(0)
            yield _Token(kind, m.group(0), value, start)
        while True:
            yield _Token("end", "", None, len(text))

    def peek(self, ahead: int = 0) -> _Token:
        while len(self.tokens) <= self.i + ahead:
            self.tokens.append(next(self.lexer))
        return self.tokens[self.i + ahead]

    def next(self) -> _Token:
        t = self.peek()
        self.i += t.kind != "end"
        return t

    def found(self, t: _Token) -> str:
        return "the end of the text" if t.kind == "end" else repr(t.text)

    def expect(self, kind: str, what: str) -> _Token:
        t = self.next()
        if t.kind != kind:
            raise self.error(t.pos, f"expected {what}, found {self.found(t)}")
        return t

    def accept(self, kind: str, text: str | None = None) -> _Token | None:
        t = self.peek()
        if t.kind == kind and (text is None or t.text == text):
            return self.next()
        return None

    def word(self, what: str) -> tuple[str, _Token]:
        """An identifier or a quoted string (an op, a key, the graph's name)."""
        t = self.next()
        if t.kind == "ident" or t.kind == "str":
            return (t.text if t.kind == "ident" else t.value), t
        raise self.error(t.pos, f"expected {what}, found {self.found(t)}")

    # -- grammar
    def graph(self) -> Graph:
        t = self.expect("ident", "'graph'")
        if t.text != "graph":
            raise self.error(t.pos, f"expected 'graph', found {self.found(t)}")
        g = Graph(self.word("the graph's name")[0])
        if self.accept("ident", "opset"):
            self.expect("=", "'=' after opset")
            g.opset = self.integer("the opset")
        self.expect("{", "'{' after the graph's name")
        while True:
            t = self.peek()
            if t.kind == "ident" and t.text == "return":
                self.next()
                break
            if t.kind == "ident" and t.text == "input":
                self.next()
                self.graph_input(g)
            elif t.kind == "ref":
                self.statement(g)
            else:
                raise self.error(t.pos, f"expected 'input', a value such as %x, or 'return', found {self.found(t)}")
        if self.peek().kind == "ref":
            g.outputs.append(self.use())
            while self.accept(","):
                g.outputs.append(self.use())
        while self.accept("ident", "update"):  # an input updated in place (Graph.add_update)
            t = self.peek()
            target = self.use()
            self.expect("=", "'=' after the updated input")
            value = self.use()
            if not any(target is v for v in g.inputs) or any(target is v for v in g.updates):
                raise self.error(t.pos, f"update {t.text}: not an input, or updated twice")
            if (value.shape, value.dtype) != (target.shape, target.dtype):
                raise self.error(t.pos, f"update {t.text}: a {value.type_str()} value for a {target.type_str()} input")
            g.add_update(target, value)
        self.expect("}", "'}' after the return values")
        t = self.peek()
        if t.kind != "end":
            hint = "; a dump's kernels list is not part of the graph: cut it" if t.text == "kernels" else ""
            raise self.error(t.pos, f"unexpected text after the graph's closing '}}': {self.found(t)}{hint}")
        return g

    def integer(self, what: str) -> int:
        t = self.expect("num", what)
        if not re.fullmatch(r"-?\d+", t.text):
            raise self.error(t.pos, f"expected {what} (an integer), found {t.text!r}")
        return int(t.text)

    def define(self, t: _Token, v: Value) -> None:
        key = t.value
        if key in self.values:
            first = self.error(self.values[key][1], "").line
            raise self.error(t.pos, f"value {t.text} is defined twice (first on line {first})")
        self.values[key] = (v, t.pos)

    def use(self) -> Value:
        t = self.expect("ref", "a value such as %x")
        if t.value not in self.values:
            raise self.error(t.pos, f"value {t.text} is used before it is defined")
        return self.values[t.value][0]

    def type(self, symbolic: bool, first: _Token | None = None) -> tuple[np.dtype | None, tuple[int, ...] | None,
                                                                         str | None]:
        """DTYPE[DIMS] -> dtype, shape, and the dims as text when they are not all integers
        (``symbolic``: a graph input's open dims). ``first``: the dtype's token, already read."""
        t = first or self.next()
        if t.kind == "?":
            dt = None
        elif t.kind == "ident":
            dt = self.dtype(t)
        else:
            raise self.error(t.pos, f"expected a dtype such as float32, found {self.found(t)}")
        self.expect("[", "'[' after the dtype")
        dims: list[str] = []
        ints = True
        start = self.peek()
        while self.peek().kind != "]":
            if dims:
                self.expect(",", "',' or ']' in the dims")
            d = self.next()
            if d.kind == "num" and re.fullmatch(r"\d+", d.text):
                dims.append(d.text)
            elif d.kind == "?" or (symbolic and d.kind == "ident"):
                dims.append(d.text)
                ints = False
            elif symbolic and d.kind == "str":
                dims.append(d.value)
                ints = False
            else:
                what = "a dimension (an integer, ? or a name)" if symbolic else "a dimension (an integer or ?)"
                raise self.error(d.pos, f"expected {what}, found {self.found(d)}")
        self.next()
        if ints:
            return dt, tuple(int(d) for d in dims), None
        if not symbolic and dims != ["?"]:
            raise self.error(start.pos, "a shape is either all known or a single ?, as in float32[?]")
        return dt, None, ",".join(dims)

    def dtype(self, t: _Token) -> np.dtype:
        """A dtype by the name the printer gives it (float32, bfloat16, ...; numpy's for the rest)."""
        with contextlib.suppress(AotcError):
            dt = dtypes.from_name(t.text)
            if dtypes.dtype_name(dt) == t.text:
                return dt
        with contextlib.suppress(TypeError):
            dt = np.dtype(t.text)
            if dt.name == t.text and not dtypes.is_supported(dt):
                return dt
        raise self.error(t.pos, f"unknown dtype {t.text!r}")

    def graph_input(self, g: Graph) -> None:
        t = self.expect("ref", "a value such as %x after 'input'")
        self.expect(":", "':' and the input's type")
        dt, shape, dims = self.type(symbolic=True)
        v = Value(t.value[0], shape, dt)
        self.define(t, v)
        g.inputs.append(v)
        if dims is not None and dims != "?":
            g.dynamic_inputs[v.name] = dims

    def statement(self, g: Graph) -> None:
        outs: list[tuple[_Token, Value]] = []
        while True:
            t = self.expect("ref", "a value such as %x")
            self.expect(":", f"':' and the type of {t.text}")
            type_at = self.peek().pos
            dt, shape, _ = self.type(symbolic=False)
            outs.append((t, Value(t.value[0], shape, dt)))
            if not self.accept(","):
                break
        self.expect("=", "'=' after the value's type")
        if self.peek().kind == "ident" and self.peek().text == "constant" and self.peek(1).kind != "(":
            self.next()
            if len(outs) != 1:
                raise self.error(outs[1][0].pos, "a constant defines one value")
            t, v = outs[0]
            if v.dtype is None or v.shape is None:
                raise self.error(type_at, f"constant {t.text} needs a known dtype and shape")
            v.const = self.tensor_data(v.dtype, v.shape, f"constant {t.text}")
            self.define(t, v)
            return
        op, _ = self.word("an op name or 'constant'")
        self.expect("(", f"'(' after {op}")
        inputs: list[Value | None] = []
        while self.peek().kind != ")":
            if inputs:
                self.expect(",", "',' or ')' in the inputs")
            if self.peek().kind == "ident" and self.peek().text == "_":
                self.next()
                inputs.append(None)
            else:
                inputs.append(self.use())
        self.next()
        attrs: dict[str, Any] = {}
        while self.peek().kind in ("ident", "str") and self.peek(1).kind == "=":
            key, kt = self.word("an attribute name")
            self.next()
            if key in attrs:
                raise self.error(kt.pos, f"attribute {key!r} is given twice")
            attrs[key] = self.value(f"attribute {key!r}")
        at = self.accept("at")
        values = [v for _, v in outs]
        node = Node(op, inputs, values, attrs, at.value if at else values[0].name)
        for t, v in outs:
            v.producer = node
            self.define(t, v)
        g.nodes.append(node)
        t = self.peek()
        if t.kind != "ref" and not (t.kind == "ident" and t.text in ("input", "return")):
            hint = ("; attributes are written key=value" if t.kind in ("ident", "str", "num") else "")
            raise self.error(t.pos, f"unexpected {self.found(t)} after the {op} node{hint}")

    def value(self, what: str) -> Any:
        t = self.next()
        if t.kind == "num":
            return self.number(t)
        if t.kind in ("str", "bytes"):
            return t.value
        if t.kind == "ident" and t.text in ("true", "false"):
            return t.text == "true"
        if t.kind == "ident" and t.text in ("inf", "nan"):
            return float(t.text)
        if t.kind == "ident" and self.peek().kind == "[":
            dt, shape, _ = self.type(symbolic=False, first=t)
            if dt is None or shape is None:
                raise self.error(t.pos, f"{what}: a tensor needs a known dtype and shape")
            return self.tensor_data(dt, shape, what)
        if t.kind == "[":
            items: list[Any] = []
            while self.peek().kind != "]":
                if items:
                    self.expect(",", "',' or ']' in the list")
                items.append(self.value(what))
            self.next()
            return items
        if t.kind == "angle":
            raise self.error(t.pos, f"{what} is {t.text}: a value the text format cannot hold")
        raise self.error(t.pos, f"expected a value for {what}, found {self.found(t)}")

    def number(self, t: _Token) -> int | float:
        s = t.text
        if s.endswith("f") and s != "-inf":  # 1e-05f: a float32, widened
            return float(np.float32(s[:-1]))
        if re.fullmatch(r"-?\d+", s):
            return int(s)
        return float(s)

    def tensor_data(self, dt: np.dtype, shape: tuple[int, ...], what: str) -> np.ndarray:
        t = self.next()
        size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if t.kind == "angle" and t.text == "<elided>":
            if not self.fill_elided:
                raise self.error(t.pos, f"{what} is elided: dump it with every element (to_text(elide=None)), "
                                        "or parse with fill_elided=True for placeholder data")
            return self.placeholder(dt, shape)
        if t.kind != "[":
            raise self.error(t.pos, f"expected '[' and the elements of {what}, or <elided>, found {self.found(t)}")
        toks: list[_Token] = []
        while self.peek().kind != "]":
            if toks:
                self.expect(",", "',' or ']' in the elements")
            toks.append(self.next())
        end = self.next()
        if len(toks) != size:
            raise self.error(end.pos, f"{what} has {len(toks)} elements, its type {type_text(dt, shape)} needs {size}")
        return self.elements(toks, np.dtype(dt), what).reshape(shape)

    def elements(self, toks: list[_Token], dt: np.dtype, what: str) -> np.ndarray:
        def check(ok: Any, kind: str) -> None:
            for tok in toks:
                if not ok(tok):
                    raise self.error(tok.pos, f"{what}: expected {kind}, found {self.found(tok)}")
        if dt == dtypes.STRING:
            check(lambda k: k.kind in ("str", "bytes"), "a string")
            arr = np.empty(len(toks), dtype=object)
            arr[:] = [k.value for k in toks]
            return arr
        if dt == np.bool_:
            check(lambda k: k.kind == "ident" and k.text in ("true", "false"), "true or false")
            return np.array([k.text == "true" for k in toks], dtype=np.bool_)
        if _is_float(dt):
            check(lambda k: (k.kind == "num" and (k.text == "-inf" or not k.text.endswith("f")))
                  or (k.kind == "ident" and k.text in ("inf", "nan")), "a number")
            texts = np.array([k.text for k in toks], dtype=str)
            wide = dt if dt in (np.float16, np.float32, np.float64) else np.dtype(np.float32)
            return texts.astype(wide).astype(dt)
        if dtypes.emulated(dt) or np.issubdtype(dt, np.integer):
            check(lambda k: k.kind == "num" and re.fullmatch(r"-?\d+", k.text) is not None, "an integer")
            ints = [int(k.text) for k in toks]
            info = ml_dtypes.iinfo(dt) if dtypes.emulated(dt) else np.iinfo(dt)
            for k, x in zip(toks, ints, strict=True):
                if not int(info.min) <= x <= int(info.max):
                    raise self.error(k.pos, f"{what}: {x} is out of range for {_dtype_text(dt)}")
            return np.array(ints, dtype=np.int64).astype(dt) if dtypes.emulated(dt) else np.array(ints, dtype=dt)
        raise self.error(toks[0].pos if toks else 0, f"{what}: elements of {dt} cannot be read back")

    def placeholder(self, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Elided data, filled deterministically: floats in [-1, 1) (zeros would let simplify fold
        what the real weights would not), integers and booleans zero (always valid indices)."""
        self.filled += 1
        if _is_float(dt):
            rng = np.random.default_rng(self.filled)
            return rng.uniform(-1, 1, shape).astype(np.float32).astype(dt)
        if dt == dtypes.STRING:
            return np.full(shape, "", dtype=object)
        return np.zeros(shape, dtype=dt)


def parse_graph(text: str, fill_elided: bool = False) -> Graph:
    """Read ``print_graph``'s text back into a Graph; IRSyntaxError (line, column) when malformed."""
    return _Parser(text, fill_elided).graph()
