"""Classic machine-learning ops of the ``ai.onnx.ml`` domain: Binarizer, ArrayFeatureExtractor and
TreeEnsemble (gradient-boosted trees and random forests in one op).

A tree ensemble is known entirely at compile time, so it becomes constant tables in the kernel (one
row per interior node: feature, comparison, threshold, children) walked per input row. The
tables are checked here (indices in range, no cycles) because a model file is untrusted and a
cycle would make the generated walk loop forever.
"""

from __future__ import annotations

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node
from aotc.ops.common import FLOAT_CTYPES, c_array
from aotc.ops.registry import OpDef, register

_ML = "ai.onnx.ml."


def _in(node: Node, i: int = 0):
    v = node.inputs[i]
    assert v is not None and v.shape is not None
    return v


# -- Binarizer ----------------------------------------------------------------------------------------------
def _binarizer(node: Node, x: list[str], t: str) -> str:
    return f"({x[0]} > {float(node.attr('threshold', 0.0))!r} ? ({t})1 : ({t})0)"


register(OpDef(_ML + "Binarizer", "elementwise", lambda n: [(_in(n).shape, _in(n).dtype)], expr=_binarizer))


# -- ArrayFeatureExtractor: X[..., indices], a 1-D X giving one row ------------------------------------------
def _afe_infer(node: Node):
    x, idx = _in(node), _in(node, 1)
    k = int(np.prod(idx.shape))
    shape = (1, k) if len(x.shape) == 1 else (*x.shape[:-1], k)
    return [(shape, x.dtype)]


def _afe_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node), _in(node, 1)
    n = x.shape[-1]
    rows = int(np.prod(x.shape[:-1]))
    k = int(np.prod(idx.shape))
    # An index outside [0, n) is a run-time input error; it reads element 0 rather than out of bounds.
    return (f"for (size_t r = task; r < {rows}; r += ntasks)\n"
            f"  for (size_t j = 0; j < {k}; j++) {{\n"
            f"    const int64_t i = (int64_t){ins[1]}[j];\n"
            f"    {outs[0]}[r * {k} + j] = {ins[0]}[r * {n} + (i >= 0 && i < {n} ? (size_t)i : 0)];\n"
            f"  }}")


register(OpDef(_ML + "ArrayFeatureExtractor", "kernel", _afe_infer, emit=_afe_emit))


# -- TreeEnsemble -------------------------------------------------------------------------------------------
_MODES = {0: "x <= s", 1: "x < s", 2: "x >= s", 3: "x > s", 4: "x == s", 5: "x != s"}
_MEMBER = 6


def _ints(node: Node, key: str, n: int | None = None, default: int | None = None) -> np.ndarray:
    v = node.attr(key)
    if v is None:
        if default is None or n is None:
            raise AotcError(f"TreeEnsemble node {node.name!r}: attribute {key} is missing")
        return np.full(n, default, np.int64)
    a = np.asarray(v).astype(np.int64).reshape(-1)
    if n is not None and a.size != n:
        raise AotcError(f"TreeEnsemble node {node.name!r}: {key} has {a.size} entries, expected {n}")
    return a


def _tree_tables(node: Node, features: int) -> dict:
    """The ensemble as flat tables: children are node indices (>= 0) or ~leaf (< 0)."""
    modes = _ints(node, "nodes_modes")
    nn = modes.size
    feat = _ints(node, "nodes_featureids", nn)
    splits = np.asarray(node.attr("nodes_splits"), np.float64).reshape(-1)
    tid, fid = _ints(node, "nodes_truenodeids", nn), _ints(node, "nodes_falsenodeids", nn)
    tleaf, fleaf = _ints(node, "nodes_trueleafs", nn), _ints(node, "nodes_falseleafs", nn)
    missing = _ints(node, "nodes_missing_value_tracks_true", nn, 0)
    weights = np.asarray(node.attr("leaf_weights"), np.float64).reshape(-1)
    targets = _ints(node, "leaf_targetids", weights.size)
    roots = _ints(node, "tree_roots")
    n_targets = int(node.attr("n_targets", 1))
    bad = []
    if splits.size != nn:
        bad.append(f"nodes_splits has {splits.size} entries, expected {nn}")
    if np.any((modes < 0) | (modes > _MEMBER)):
        bad.append("unknown nodes_modes value")
    if np.any((feat < 0) | (feat >= features)):
        bad.append(f"a feature id is outside [0, {features})")
    if np.any((targets < 0) | (targets >= n_targets)):
        bad.append(f"a leaf target id is outside [0, {n_targets})")
    if np.any((roots < 0) | (roots >= nn)):
        bad.append("a tree root is not a node")
    for ids, leaf in ((tid, tleaf), (fid, fleaf)):
        if np.any(np.where(leaf != 0, (ids < 0) | (ids >= weights.size), (ids < 0) | (ids >= nn))):
            bad.append("a child index is out of range")
    if bad:
        raise AotcError(f"TreeEnsemble node {node.name!r}: {'; '.join(dict.fromkeys(bad))}")
    true_child = np.where(tleaf != 0, ~tid, tid)
    false_child = np.where(fleaf != 0, ~fid, fid)
    # Degenerate tree: a single node whose branches are the same leaf is that leaf.
    root_ref = np.where((tleaf[roots] != 0) & (fleaf[roots] != 0) & (tid[roots] == fid[roots]),
                        ~tid[roots], roots)
    _check_acyclic(node, root_ref, true_child, false_child)
    # Set members of each BRANCH_MEMBER node, in order, NaN-separated in membership_values.
    members = np.asarray(node.attr("membership_values", []), np.float64).reshape(-1)
    sets = np.split(members, np.flatnonzero(np.isnan(members)))
    sets = [s[~np.isnan(s)] for s in sets]
    n_member = int(np.sum(modes == _MEMBER))
    if n_member and len(sets) < n_member:
        raise AotcError(f"TreeEnsemble node {node.name!r}: membership_values lacks sets for "
                        f"{n_member} BRANCH_MEMBER nodes")
    set_lo, set_hi, flat, k = np.zeros(nn, np.int64), np.zeros(nn, np.int64), [], 0
    for i in np.flatnonzero(modes == _MEMBER):
        set_lo[i] = len(flat)
        flat += list(sets[k])
        set_hi[i] = len(flat)
        k += 1
    return dict(modes=modes, feat=feat, splits=splits, true_child=true_child, false_child=false_child,
                missing=missing, weights=weights, targets=targets, roots=root_ref, n_targets=n_targets,
                set_lo=set_lo, set_hi=set_hi, members=np.asarray(flat or [0.0]))


def _check_acyclic(node: Node, roots: np.ndarray, t: np.ndarray, f: np.ndarray) -> None:
    state = np.zeros(t.size, np.int8)  # 0 unseen, 1 on the current path, 2 done
    for r in roots:
        if r < 0:
            continue
        stack = [(int(r), 0)]
        while stack:
            i, step = stack.pop()
            if step == 0:
                if state[i] == 1:
                    raise AotcError(f"TreeEnsemble node {node.name!r}: the trees contain a cycle")
                if state[i] == 2:
                    continue
                state[i] = 1
                stack.append((i, 1))
                stack += [(int(c), 0) for c in (t[i], f[i]) if c >= 0]
            else:
                state[i] = 2


def _tree_infer(node: Node):
    x = _in(node)
    if len(x.shape) != 2:
        raise AotcError(f"TreeEnsemble node {node.name!r}: input must be [N, F], got {list(x.shape)}")
    return [((x.shape[0], int(node.attr("n_targets", 1))), x.dtype)]


def _tree_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    if ctype not in FLOAT_CTYPES:
        raise AotcError(f"TreeEnsemble node {node.name!r}: input must be floating point")
    rows, features = x.shape
    tb = _tree_tables(node, features)
    agg = int(node.attr("aggregate_function", 1))
    post = int(node.attr("post_transform", 0))
    if agg not in (0, 1, 2, 3) or post not in (0, 1, 2, 3):
        raise AotcError(f"TreeEnsemble node {node.name!r}: aggregate_function {agg} / post_transform "
                        f"{post} not supported (PROBIT is not implemented)")
    nt, ntrees = tb["n_targets"], tb["roots"].size
    big = repr(float(np.finfo(x.dtype).max))  # MIN/MAX start from the type's extremes
    init = {0: "0", 1: "0", 2: big, 3: "-" + big}[agg]
    combine = {0: "acc[tg] += w", 1: "acc[tg] += w", 2: "acc[tg] = w < acc[tg] ? w : acc[tg]",
               3: "acc[tg] = w > acc[tg] ? w : acc[tg]"}[agg]
    cmp = " : ".join(f"m == {m} ? ({c})" for m, c in _MODES.items())
    lines = [c_array("uint8_t", "te_mode", tb["modes"]), c_array("int32_t", "te_feat", tb["feat"]),
             c_array("double", "te_split", tb["splits"]), c_array("int32_t", "te_true", tb["true_child"]),
             c_array("int32_t", "te_false", tb["false_child"]), c_array("uint8_t", "te_nan", tb["missing"]),
             c_array("double", "te_w", tb["weights"]), c_array("int32_t", "te_tg", tb["targets"]),
             c_array("int32_t", "te_root", tb["roots"]), c_array("int32_t", "te_lo", tb["set_lo"]),
             c_array("int32_t", "te_hi", tb["set_hi"]), c_array("double", "te_set", tb["members"]),
             f"for (size_t r = task; r < {rows}; r += ntasks) {{",
             f"  double acc[{nt}];",
             f"  for (size_t j = 0; j < {nt}; j++) acc[j] = {init};",
             f"  for (size_t tr = 0; tr < {ntrees}; tr++) {{",
             "    int32_t i = te_root[tr];",
             "    while (i >= 0) {",
             f"      const double x = (double){ins[0]}[r * {features} + (size_t)te_feat[i]], s = te_split[i];",
             "      const unsigned m = te_mode[i];",
             "      int go = 0;",
             "      if (x != x) go = te_nan[i];",
             f"      else if (m == {_MEMBER})",
             "        for (int32_t k = te_lo[i]; k < te_hi[i]; k++) go |= x == te_set[k];",
             f"      else go = {cmp} : 0;",
             "      i = go ? te_true[i] : te_false[i];",
             "    }",
             "    const double w = te_w[~i];",
             "    const int32_t tg = te_tg[~i];",
             f"    {combine};",
             "  }"]
    if agg == 0:
        lines.append(f"  for (size_t j = 0; j < {nt}; j++) acc[j] /= {ntrees};")
    if post == 2:
        lines.append(f"  for (size_t j = 0; j < {nt}; j++) acc[j] = 1 / (1 + exp(-acc[j]));")
    elif post in (1, 3):  # softmax; SOFTMAX_ZERO leaves zeros at zero
        skip = "acc[j] == 0 ? 0 : " if post == 3 else ""
        lines += ["  double mx = -INFINITY, sum = 0;",
                  f"  for (size_t j = 0; j < {nt}; j++) if (acc[j] > mx) mx = acc[j];",
                  f"  for (size_t j = 0; j < {nt}; j++) {{ acc[j] = {skip}exp(acc[j] - mx); sum += acc[j]; }}",
                  f"  for (size_t j = 0; j < {nt}; j++) acc[j] = sum > 0 ? acc[j] / sum : 0;"]
    lines += [f"  for (size_t j = 0; j < {nt}; j++) {outs[0]}[r * {nt} + j] = ({ctype})acc[j];", "}"]
    return "\n".join(lines)


register(OpDef(_ML + "TreeEnsemble", "kernel", _tree_infer, emit=_tree_emit))
