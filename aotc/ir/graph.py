"""A small SSA graph.

A ``Value`` is produced by at most one ``Node`` (or is a graph input, or a constant holding a numpy
array). Nodes are kept in a topological order. Shapes are static: frontends pin every dimension
before the passes run, so every pass and the code generator can rely on concrete sizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    producer: Node | None = None
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def size(self) -> int:
        """The element count, exact: numpy's product wraps past 2**63 without a word, and sizes are
        checked against the target's limits after shape inference."""
        assert self.shape is not None
        return math.prod(int(d) for d in self.shape)

    @property
    def nbytes(self) -> int:
        assert self.dtype is not None
        return self.size * np.dtype(self.dtype).itemsize

    def type_str(self) -> str:
        from aotc.ir.dtypes import dtype_name

        dt = dtype_name(self.dtype) if self.dtype is not None else "?"
        dims = "?" if self.shape is None else ",".join(str(d) for d in self.shape)
        return f"{dt}[{dims}]"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


class Graph:
    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.opset: int = 17
        # Inputs whose shape the model leaves open: name -> dims as written, for error messages.
        self.dynamic_inputs: dict[str, str] = {}
        # Set by the fusion pass: the kernels in execution order (aotc.passes.fuse.Kernel).
        self.kernels: list[Any] = []
        # Set by the memory planner (aotc.passes.memory.MemoryPlan).
        self.memory: Any = None
        # Inputs updated in place (XLA's input/output aliasing): the last len(updates) outputs are
        # their new values, in this order. See add_update.
        self.updates: list[Value] = []
        # Inputs that are TensorFlow variables (tfcompile's config ``variable``), by name -> whether
        # read-only: the C++ class gives them tfcompile's var_<name> methods.
        self.variables: dict[str, bool] = {}

    # -- construction -----------------------------------------------------------------------
    def add_node(self, op: str, inputs: list[Value | None], n_outputs: int = 1,
                 attrs: dict[str, Any] | None = None, name: str = "",
                 out_names: list[str] | None = None) -> Node:
        outs = [Value(out_names[i] if out_names else f"{name or op}:{i}") for i in range(n_outputs)]
        node = Node(op, list(inputs), outs, dict(attrs or {}), name)
        for v in outs:
            v.producer = node
        self.nodes.append(node)
        return node

    def add_update(self, target: Value, value: Value) -> None:
        """Make the run write ``value`` into input ``target``'s buffer (an in-place argument: a TF
        variable, a training step's parameter). Every read of ``target`` in the graph sees its value
        from before the run; ``value`` becomes a trailing output, which the passes keep alive as any
        output, and which the code generator stores into ``target``'s buffer once nothing reads the
        old value any more (passes/fuse.py), instead of giving the run an output argument for it."""
        assert any(target is v for v in self.inputs), f"{target.name!r} is not an input"
        assert not any(target is v for v in self.updates), f"{target.name!r} is updated twice"
        assert value.shape == target.shape and value.dtype == target.dtype, \
            f"update of {target.name!r}: {value.type_str()} for {target.type_str()}"
        self.updates.append(target)
        self.outputs.append(value)

    @property
    def num_fetches(self) -> int:
        """How many outputs are the run's own (the rest are the new values of ``updates``)."""
        return len(self.outputs) - len(self.updates)

    def update_pairs(self) -> list[tuple[Value, int]]:
        """(updated input, position of its new value in ``outputs``), in ``updates`` order."""
        return [(v, self.num_fetches + k) for k, v in enumerate(self.updates)]

    @staticmethod
    def constant(array: np.ndarray, name: str = "const") -> Value:
        arr = np.asarray(array, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        return Value(name, tuple(int(d) for d in arr.shape), arr.dtype, None, arr)

    # -- queries ----------------------------------------------------------------------------
    def consumers(self) -> dict[int, list[Node]]:
        """Map id(value) -> nodes that read it."""
        users: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    users.setdefault(id(v), []).append(n)
        return users

    def values(self) -> Iterable[Value]:
        seen: set[int] = set()
        for v in self.inputs:
            seen.add(id(v))
            yield v
        for n in self.nodes:
            for v in [*n.inputs, *n.outputs]:
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    yield v

    def replace_uses(self, old: Value, new: Value) -> None:
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    def toposort(self) -> None:
        """Reorder nodes topologically, keeping the existing order where it is already valid."""
        produced = {id(v) for n in self.nodes for v in n.outputs}
        done: set[int] = set()
        order: list[Node] = []
        pending = list(self.nodes)
        while pending:
            rest = []
            for n in pending:
                if all(v is None or id(v) not in produced or id(v) in done for v in n.inputs):
                    order.append(n)
                    done.update(id(v) for v in n.outputs)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                from aotc.errors import AotcError

                raise AotcError(f"graph has a cycle through node {rest[0].name!r}")
            pending = rest
        self.nodes = order

    # -- checking and printing --------------------------------------------------------------
    def verify(self) -> None:
        """Check SSA and topological order; raise AssertionError on a malformed graph (a bug)."""
        defined = {id(v) for v in self.inputs}
        for n in self.nodes:
            for v in n.inputs:
                assert v is None or v.is_const or id(v) in defined, \
                    f"{n.op} {n.name!r} uses {v.name!r} before it is defined"
            for v in n.outputs:
                assert v.producer is n, f"{v.name!r} has the wrong producer"
                assert id(v) not in defined, f"{v.name!r} defined twice"
                defined.add(id(v))
        for v in self.outputs:
            assert v.is_const or id(v) in defined, f"output {v.name!r} is not defined"
        for v, pos in self.update_pairs():
            assert any(v is x for x in self.inputs) and pos >= 0, f"update of {v.name!r}: not an input"

    def to_text(self, elide: int | None = 16) -> str:
        """The graph as text (aotc/ir/text.py), for dumps, bug reports and pass tests; constants of
        more than ``elide`` elements print as ``<elided>`` (None: every element, for from_text)."""
        from aotc.ir.text import print_graph

        return print_graph(self, elide)

    @staticmethod
    def from_text(text: str, fill_elided: bool = False) -> Graph:
        """Read ``to_text``'s listing back; ``fill_elided`` gives elided constants placeholder data."""
        from aotc.ir.text import parse_graph

        return parse_graph(text, fill_elided)
