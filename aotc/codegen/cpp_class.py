"""NAME.hpp: a header-only C++11 class over the C API, shaped like the class tfcompile generated.

tfcompile users call ``MyClass c; c.set_arg0_data(p); c.Run(); c.result0_data(); c.error_msg()``
(docs/tfcompile.md maps every method). The class here has those methods, implemented on NAME_run_parallel
and the metadata functions of NAME.h, so such a program compiles against aotc's library with only its
include changed. Everything from the model reaches the header as a mangled identifier (method names),
a comment, or not at all: names for LookupArgIndex are read from the C library at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aotc import __version__
from aotc.codegen.library import Library, TensorInfo, env
from aotc.codegen.names import C_KEYWORDS, c_string, comment, fixed_macros, library_pattern, reserved
from aotc.errors import RUN_ERRORS, AotcError
from aotc.ir import dtypes
from aotc.passes.memory import MAX_TASKS

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# Members a per-tensor method name must not repeat: ``arg_<x>(...)`` for a feed named "data" would
# overload ``arg_data(index)``.
_MEMBER_SUFFIXES = frozenset({"data"})
# The class's public members (its private ones start with aotc_, which no part may).
_MEMBERS = frozenset({"AllocMode", "Run", "LookupArgIndex", "LookupResultIndex", "GetArgName", "GetResultName",
                      "ArgSize", "ResultSize", "ArgRank", "ResultRank", "ArgShape", "ResultShape",
                      "WorkspaceSize", "kNumArgs", "kNumResults", "kNumVariables"})
_MEMBER_PATTERN = re.compile(r"(?:set_)?(?:arg|result|var)(?:\d+|_\w+)\w*|num_(?:args|results|variables)"
                             r"|error_msg|set_thread_pool|set_workspace")
_INT_MAX = 2**31 - 1
ALIGN = 64


def parse_cpp_class(text: str, model: str) -> tuple[list[str], str]:
    """``"ns1::ns2::Name"`` -> (["ns1", "ns2"], "Name"), as tfcompile's ``--cpp_class`` reads it.

    Each part must be a plain C++ identifier that the headers around the class leave free: not a
    keyword, not a reserved spelling (``__`` anywhere, a leading ``_``), not a macro or type of the C
    headers or of the model's own library (``mlp_run``, ``MLP_OK``); the outermost namespace is not
    ``std``, and the class is not named like one of its members (C++ forbids that)."""
    parts = text.split("::")
    for part in parts:
        if not _IDENTIFIER.fullmatch(part) or "__" in part:
            shown = part if part else "(empty)"
            raise AotcError(f"--cpp-class {text!r}: {shown!r} is not a C++ identifier: write ns1::ns2::Name, "
                            "each part a letter, then letters, digits or single '_'")
        if part in C_KEYWORDS:
            raise AotcError(f"--cpp-class {text!r}: {part!r} is a C or C++ keyword; choose another name")
        if reserved(part, model):
            raise AotcError(f"--cpp-class {text!r}: {part!r} is taken: a name of aotc (aotc_*), of the C "
                            f"headers (macros such as NULL, types *_t) or of library {model}'s C API; "
                            "choose another")
    if len(parts) > 1 and parts[0] == "std":
        raise AotcError(f"--cpp-class {text!r}: namespace std belongs to the C++ library; choose another")
    if parts[-1] in _MEMBERS or _MEMBER_PATTERN.fullmatch(parts[-1]):
        raise AotcError(f"--cpp-class {text!r}: the class would have a member named {parts[-1]!r} (C++ "
                        "forbids a member named like its class); choose another name")
    return parts[:-1], parts[-1]


@dataclass
class _Tensor:
    """One argument or result as the class template needs it."""

    index: int
    label: str          # the model's name, comment-safe
    ctype: str          # C++ element type
    dtype: str
    shape: list[int]
    count: int
    bytes: int
    offset: int         # in the class's buffer block
    named: str | None   # the suffix of the named methods (arg_<named>_data), None when the name has none
    note: str = ""
    variable: bool = False  # a TensorFlow variable: also var_<named>_data(), const when read-only
    readonly: bool = False

    @property
    def size_type(self) -> str:
        """tfcompile's arg0_size() is an int; a tensor past INT_MAX bytes needs more."""
        return "int" if self.bytes <= _INT_MAX else "std::int64_t"

    @property
    def index_expr(self) -> str:
        """The row-major element offset of dims ``dim0, dim1, ...``."""
        strides, step = [], 1
        for d in reversed(self.shape):
            strides.append(step)
            step *= d
        terms = [f"dim{i} * {s}u" if s != 1 else f"dim{i}" for i, s in enumerate(reversed(strides))]
        return " + ".join(terms) if terms else "0"

    @property
    def dim_params(self) -> str:
        return ", ".join(f"std::size_t dim{i}" for i in range(len(self.shape)))


def _is_macro(member: str, model: str) -> bool:
    """Whether a member name would be expanded or shadowed by a name of the C header: macros and the
    library's own identifiers (a model named "arg" has ``arg_run``). Type names such as ``*_t`` do not
    matter inside a class, so ``names.reserved`` would refuse more than it needs to."""
    return member in fixed_macros() or library_pattern(model).fullmatch(member) is not None


def _method_names(tensors: list[TensorInfo], model: str) -> list[str | None]:
    """``x:0`` -> ``x_0``: letters, digits and single underscores, neither leading nor trailing (a
    double underscore is a reserved C++ spelling). A name whose methods (``arg_<x>``, ``arg_<x>_data``,
    ``_size``, ``_count``) another's already use gets ``_2``, ``_3``, ...: feeds "x" and "x_data" must
    not both declare ``arg_x_data()``. A name with nothing left (``::``) gets no named methods."""
    taken = set(_MEMBER_SUFFIXES)
    names: list[str | None] = []
    for t in tensors:
        base = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9]", "_", t.name)).strip("_")[:48]
        if not base:
            names.append(None)
            continue
        name, k = base, 1
        while True:
            members = {name, f"{name}_data", f"{name}_size", f"{name}_count"}
            if not members & taken and not any(_is_macro(f"{p}_{m}", model)
                                               for p in ("arg", "result", "var") for m in members):
                break
            k += 1
            name = f"{base}_{k}"
        taken.update(members)
        names.append(name)
    return names


def _layout(infos: list[TensorInfo], start: int, model: str) -> tuple[list[_Tensor], int]:
    """The tensors' places in one 64-byte aligned block from ``start``; returns them and the end."""
    out, offset = [], start
    for i, (t, named) in enumerate(zip(infos, _method_names(infos, model), strict=True)):
        nbytes = t.size * dtypes.from_name(t.dtype).itemsize  # a string element is a pointer
        note = ""
        if t.count is not None:
            note = f"valid extent along axis {t.bound_axis} in result {t.count}"
        elif t.count_for:
            note = "valid extent of result " + ", ".join(str(c) for c in t.count_for)
        if t.updated:
            note = "a variable updated in place by Run"
        out.append(_Tensor(i, comment(t.name, 60), "bool" if t.ctype == "_Bool" else t.ctype, t.dtype,
                           list(t.shape), t.size, nbytes, offset, named, note, t.variable, t.readonly))
        offset += -(-max(nbytes, 1) // ALIGN) * ALIGN  # at least one aligned slot: never a shared address
    return out, offset


def _status_texts(model: str) -> list[tuple[int, str]]:
    """Each documented status and what it means, as C++ string literals for error_msg()."""
    return [(e.code, c_string(e.meaning.replace("NAME_", f"{model.upper()}_"))) for e in RUN_ERRORS]


def cpp_header(lib: Library, cpp_class: str, source: str) -> bytes:
    """The text of NAME.hpp for class ``cpp_class`` (validated by ``parse_cpp_class``) over ``lib``.

    Results come first in the buffer block, so the mode where the caller provides the arguments
    allocates only the front of it."""
    namespaces, cls = parse_cpp_class(cpp_class, lib.name)
    results, results_end = _layout(lib.outputs, 0, lib.name)
    args, total = _layout(lib.inputs, results_end, lib.name)
    return env().get_template("cpp_class.hpp.j2").render(
        name=lib.name, version=__version__, source=comment(source, 60), namespaces=namespaces, cls=cls,
        qualified="::".join([*namespaces, cls]), args=args, results=results, results_bytes=results_end,
        total_bytes=total, statuses=_status_texts(lib.name), max_threads=MAX_TASKS, align=ALIGN,
        has_bool=any(t.ctype == "bool" for t in args + results)).encode()
