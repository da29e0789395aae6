"""Making untrusted model strings safe for C.

Names in a model file are attacker-controlled: they may contain ``*/``, newlines, quotes,
``#include`` or anything else. Nothing from the model reaches generated C except through these
functions: identifiers keep only [A-Za-z0-9_] (and get a counter suffix where mangling collides),
comments keep only printable ASCII with comment delimiters broken, and string literals escape every
byte outside a small safe set as an octal escape.
"""

from __future__ import annotations

import re

from aotc.errors import AotcError

_C_KEYWORDS = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
    "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
    "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
    "volatile", "while", "_Bool", "_Complex", "_Imaginary", "_Alignas", "_Alignof", "_Atomic",
    "_Generic", "_Noreturn", "_Static_assert", "_Thread_local", "bool", "true", "false",
}


def check_model_name(name: str) -> str:
    """The library name becomes a C prefix and a file name: it must be a plain identifier."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name) or name in _C_KEYWORDS:
        raise AotcError(f"model name {name!r} must be a C identifier: a letter, then letters, digits "
                        "or '_' (at most 64 characters)")
    return name


class Mangler:
    """Stable, unique C identifiers for arbitrary strings (same input order -> same names)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, raw: str, prefix: str = "") -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", raw)[:40].strip("_") or "t"
        base = prefix + base
        if base[0].isdigit():
            base = "_" + base
        name, i = base, 1
        while name in self.used or name in _C_KEYWORDS:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def comment(text: str, limit: int = 80) -> str:
    """Text safe inside a /* */ or // comment: printable ASCII, no delimiters, no line breaks."""
    s = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    s = s.replace("*/", "*_/").replace("/*", "/_*").replace("\\", "/")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def c_string(text: str) -> str:
    """A C string literal holding the UTF-8 bytes of ``text``, every unusual byte octal-escaped."""
    out = []
    for b in text.encode("utf-8"):
        ch = chr(b)
        if b < 128 and (ch.isalnum() or ch in " _-.:/,;[]()+=@"):
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def c_bytes(data: bytes) -> str:
    """A C string literal of ``data`` with every byte octal-escaped (keys and other byte strings from a
    model file: no quote, backslash, newline, ``*/`` or ``??`` trigraph can break out)."""
    return '"' + "".join(f"\\{b:03o}" for b in data) + '"'
