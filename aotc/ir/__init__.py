"""The graph IR: typed SSA values with static shapes, nodes with an op name and attributes."""

from aotc.ir.graph import Graph, Node, Value

__all__ = ["Graph", "Node", "Value"]
