"""Index expressions for generated C that fold their constants as they are built (used by the op
emitters and by codegen, so it lives with the ops, below codegen).

Emitters used to paste sizes into fixed C text, so a size of 1 or a stride of 0 came out as
``t / 1 % 1``, ``x * (size_t)0`` or ``for (l = 0; l < 1; l++)``. An ``Ix`` is a sum of
coefficient * atom terms plus a constant, where an atom is a C variable or a quotient or remainder
by a positive constant; building one with ``+``, ``*``, ``//`` and ``%`` drops what is known: ``x / 1``,
``x % 1``, ``x * 0``, ``x * 1``, constant sums. Values are unsigned (``size_t``) indices, so integer
arithmetic is exact and the folded C computes the same numbers as the unfolded one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ix:
    """``sum(coeff * atom) + const``; atoms are C text that binds at least as tightly as ``/``."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(x: Ix | int | str) -> Ix:
        """An expression from an int (a constant), a C variable name, or an expression."""
        if isinstance(x, Ix):
            return x
        if isinstance(x, int):
            return Ix((), x)
        return Ix(((x, 1),), 0)

    def is_const(self) -> bool:
        return not self.terms

    def __add__(self, other: Ix | int | str) -> Ix:
        o = Ix.of(other)
        coeffs = dict(self.terms)
        for atom, c in o.terms:
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Ix(tuple((a, c) for a, c in coeffs.items() if c), self.const + o.const)

    __radd__ = __add__

    def __mul__(self, k: int) -> Ix:
        assert isinstance(k, int), "affine: products of two variables are not affine"
        if k == 0:
            return Ix()
        return Ix(tuple((a, c * k) for a, c in self.terms), self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, d: int) -> Ix:
        assert d > 0
        if d == 1:
            return self
        if self.is_const():
            return Ix((), self.const // d)
        if all(c % d == 0 for _, c in self.terms) and self.const % d == 0:
            return Ix(tuple((a, c // d) for a, c in self.terms), self.const // d)
        return Ix.of(f"{self._operand()} / {d}")

    def __mod__(self, d: int) -> Ix:
        assert d > 0
        if d == 1:
            return Ix()
        if self.is_const():
            return Ix((), self.const % d)
        return Ix.of(f"{self._operand()} % {d}")

    def _operand(self) -> str:
        """This expression as the left operand of ``/`` or ``%`` (which associate to the left)."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and not self.const:
            return self.terms[0][0]
        return f"({self})"

    def __str__(self) -> str:
        parts = []
        for atom, c in self.terms:
            a = f"({atom})" if c != 1 and (" / " in atom or " % " in atom) else atom
            parts.append(a if c == 1 else f"{c} * {a}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def task_share(n: int, task: str = "task", ntasks: str = "ntasks") -> tuple[str, str]:
    """C for the bounds [lo, hi) of this task's contiguous share of ``n`` work items; ``task`` and
    ``ntasks`` are size_t, so the product cannot overflow where the items fit in memory."""
    if n == 0:
        return "0", "0"
    first = "" if n == 1 else f"(size_t){n} * "
    return f"{first}{task} / {ntasks}", f"{first}({task} + 1) / {ntasks}"


def for_each(var: str, lo: Ix | int | str, hi: Ix | int | str, indent: str = "") -> str:
    """The head of a loop of ``var`` over [lo, hi); a loop of one constant trip is a block binding
    ``var`` to ``lo``. The caller writes the body and the closing brace."""
    lo_, hi_ = Ix.of(lo), Ix.of(hi)
    if (hi_ + lo_ * -1).is_const() and (hi_ + lo_ * -1).const == 1:
        return f"{indent}{{ const size_t {var} = {lo_};"
    return f"{indent}for (size_t {var} = {lo_}; {var} < {hi_}; {var}++) {{"


def offset(ptr: str, ix: Ix | int | str) -> str:
    """C for ``ptr`` advanced by ``ix`` elements (just ``ptr`` where ``ix`` is 0)."""
    i = Ix.of(ix)
    return ptr if i.is_const() and i.const == 0 else f"{ptr} + {i}"
