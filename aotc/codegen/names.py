"""Making untrusted model strings safe for C.

Names in a model file are attacker-controlled: they may contain ``*/``, newlines, quotes,
``#include`` or anything else. Nothing from the model reaches generated C except through these
functions: identifiers keep only [A-Za-z0-9_] (and get a counter suffix where mangling collides),
comments keep only printable ASCII with comment delimiters broken, and string literals escape every
byte outside a small safe set as an octal escape.

A mangled identifier must also not be one the C around it already means something by: a keyword (of
C or of C++, which includes the header), a macro of the headers the generated files include or
define (``NULL``, ``INFINITY``, ``AOTC_HIDDEN``, ``M_OK``, ...: expanded, it breaks the parameter
list), or a type name used in the same parameter list (``int64_t``). The macros of aotc's own
templates and runtime headers are read from those files, so a new one is covered without a list here;
the C and POSIX library's are listed by the names and prefixes the standards reserve.
"""

from __future__ import annotations

import re
from functools import lru_cache

from aotc.errors import AotcError
from aotc.resources import runtime_dir, templates_dir

C_KEYWORDS = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
    "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
    "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
    "volatile", "while", "_Bool", "_Complex", "_Imaginary", "_Alignas", "_Alignof", "_Atomic",
    "_Generic", "_Noreturn", "_Static_assert", "_Thread_local", "bool", "true", "false",
    # C23
    "alignas", "alignof", "constexpr", "nullptr", "static_assert", "thread_local", "typeof", "typeof_unqual",
    # C++ (the header is included from C++ inside extern "C")
    "and", "and_eq", "asm", "bitand", "bitor", "catch", "char8_t", "char16_t", "char32_t", "class", "compl",
    "concept", "const_cast", "consteval", "constinit", "co_await", "co_return", "co_yield", "decltype",
    "delete", "dynamic_cast", "explicit", "export", "friend", "mutable", "namespace", "new", "noexcept", "not",
    "not_eq", "operator", "or", "or_eq", "private", "protected", "public", "reinterpret_cast", "requires",
    "static_cast", "template", "this", "throw", "try", "typeid", "typename", "using", "virtual", "wchar_t",
    "xor", "xor_eq",
}

# Object-like macros of the C library and POSIX headers the generated files (or a C program using the
# header) include, compiler-predefined ones (gcc's GNU modes define ``linux`` and ``unix``) and the
# lower-case ones glibc defines for struct members. Where a standard reserves a whole family (C11 7.31,
# POSIX 2.2.2: E*, *_MAX, SIG*, PTHREAD_*, SA_*, ...) the pattern is listed instead.
_STD_NAMES = {
    "NULL", "EOF", "WEOF", "BUFSIZ", "FILENAME_MAX", "FOPEN_MAX", "TMP_MAX", "L_tmpnam", "L_ctermid",
    "P_tmpdir", "stdin", "stdout", "stderr", "EXIT_SUCCESS", "EXIT_FAILURE", "RAND_MAX", "MB_CUR_MAX",
    "INFINITY", "NAN", "MAXFLOAT", "math_errhandling", "MATH_ERRNO", "MATH_ERREXCEPT", "CLOCKS_PER_SEC",
    "TIME_UTC", "errno", "assert", "offsetof", "noreturn", "complex", "imaginary", "I", "CHAR_BIT", "LONG_BIT",
    "WORD_BIT", "NZERO", "NSIG", "NGREG", "NFDBITS", "MINSIGSTKSZ", "BIG_ENDIAN", "LITTLE_ENDIAN", "PDP_ENDIAN",
    "BYTE_ORDER", "linux", "unix", "i386", "sched_priority", "ONCE_FLAG_INIT", "TSS_DTOR_ITERATIONS",
    "MAX_CANON", "MAX_INPUT", "PIPE_BUF", "WNOHANG", "WUNTRACED", "WSTOPPED", "WEXITED", "WCONTINUED", "WNOWAIT",
    "sa_handler", "sa_sigaction", "sigev_notify_function", "sigev_notify_attributes",
}
_STD_PATTERN = re.compile(
    r"E[0-9A-Z]\w*|[A-Z0-9_]*_(?:MAX|MIN|WIDTH)|U?INT\w*_C|FP_\w+|FE_\w+|M_\w+|HUGE_\w+|SNAN\w*"
    r"|(?:FLT|DBL|LDBL|DECIMAL)_\w+|ATOMIC_\w+|PTHREAD_\w+|SCHED_\w+|CLOCK_\w+|TIMER_\w+|CPU_\w+|SEEK_\w+"
    r"|SIG[A-Z_]\w*|(?:SA|SI|SS|BUS|CLD|FPE|ILL|POLL|SEGV|TRAP|FD)_\w+|(?:PRI|SCN)[a-zX]\w*"
    r"|LC_[A-Z]\w*|si_\w+|memory_order_\w*|atomic_\w*|\w*_t|(?i:aotc_)\w*")


@lru_cache(maxsize=1)
def _template_sources() -> tuple[str, ...]:
    """The runtime headers and every template rendered with the model's ``name`` (gemm.c.j2's ``name``
    is another variable)."""
    files = sorted(runtime_dir().glob("*.h")) + sorted(runtime_dir().glob("*.cuh")) + sorted(
        p for p in templates_dir().rglob("*.j2") if p.name != "gemm.c.j2")  # the CUDA templates too
    return tuple(p.read_text() for p in files)


@lru_cache(maxsize=1)
def fixed_macros() -> frozenset[str]:
    """The macros aotc's templates and runtime headers define whatever the model's name."""
    found = set()
    for text in _template_sources():
        found.update(m for m in re.findall(r"^\s*#\s*define\s+(\w+)(?![\w{])", text, re.M))
    return frozenset(found)


@lru_cache(maxsize=1)
def _named_identifiers() -> tuple[str, ...]:
    """Identifiers of the templates built from the model's name (``{{ name }}_run_v``,
    ``{{ name|upper }}_WORKSPACE_BYTES``, ...), as regular expressions with ``{N}``/``{U}`` for the name."""
    jinja = r"\{\{[^}]*\}\}"
    token = re.compile(rf"(?:\w|{jinja})*\{{\{{ *name(?:\|upper)? *\}}\}}(?:\w|{jinja})*")
    found = set()
    for text in _template_sources():
        for tok in token.findall(text):
            parts = re.split(rf"({jinja})", tok)
            regex = "".join("{U}" if re.fullmatch(r"\{\{ *name\|upper *\}\}", p)
                            else "{N}" if re.fullmatch(r"\{\{ *name *\}\}", p)
                            else r"\w*" if p.startswith("{{") else re.escape(p) for p in parts)
            if regex not in ("{N}", "{U}"):  # the bare name only ever appears in text and file names
                found.add(regex)
    return tuple(sorted(found))


@lru_cache(maxsize=8)
def library_pattern(model: str) -> re.Pattern[str]:
    named = [r.replace("{N}", re.escape(model)).replace("{U}", re.escape(model.upper()))
             for r in _named_identifiers()]
    return re.compile("|".join(named) if named else "(?!)")


def reserved(name: str, model: str = "") -> bool:
    """Whether ``name`` is taken in generated C: a keyword, a macro or a type name of the headers the
    library's sources include, or an identifier of the library of model ``model`` itself."""
    return (name in C_KEYWORDS or name in _STD_NAMES or name in fixed_macros()
            or _STD_PATTERN.fullmatch(name) is not None
            or (bool(model) and library_pattern(model).fullmatch(name) is not None))


def check_model_name(name: str) -> str:
    """The library name becomes a C prefix and a file name: it must be a plain identifier, outside
    aotc's own namespace (its runtime headers are aotc_*.h, its macros AOTC_*)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name) or name in C_KEYWORDS:
        raise AotcError(f"model name {name!r} must be a C identifier: a letter, then letters, digits "
                        "or '_' (at most 64 characters)")
    if name.lower().startswith("aotc_"):
        raise AotcError(f"model name {name!r} must not start with 'aotc_': aotc's runtime headers "
                        "(aotc_math.h, aotc_types.h, ...) use that prefix next to the library's files")
    guards = {f"AOTC_{name.upper()}_H", f"AOTC_{name.upper()}_INTERNAL_H"}
    if guards & fixed_macros():
        raise AotcError(f"model name {name!r} would give the header guard {sorted(guards & fixed_macros())[0]}, "
                        "which one of aotc's runtime headers uses; choose another name")
    return name


class Mangler:
    """Stable, unique C identifiers for arbitrary strings (same input order -> same names), none of
    them reserved (see ``reserved``) in the library of model ``model``."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.used: set[str] = set()

    def __call__(self, raw: str, prefix: str = "") -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", raw)[:40].strip("_") or "t"
        base = prefix + base
        if base[0].isdigit():
            base = "_" + base
        if reserved(base, self.model) and reserved(f"{base}_2", self.model):  # a reserved prefix
            base = "v_" + base
        name, i = base, 1
        while name in self.used or reserved(name, self.model):
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
