"""Classic machine-learning ops of the ``ai.onnx.ml`` domain: Binarizer, ArrayFeatureExtractor,
TreeEnsemble (gradient-boosted trees and random forests in one op) and LabelEncoder (numeric or string
keys, numeric values); and the default domain's TfIdfVectorizer (integer tokens), its n-gram pool a
constant table.

A tree ensemble is known entirely at compile time, so it becomes constant tables in the kernel (one
row per interior node: feature, comparison, threshold, children) walked per input row. The
tables are checked here (indices in range, no cycles) because a model file is untrusted and a
cycle would make the generated walk loop forever.
"""

from __future__ import annotations

import math

import numpy as np

from aotc.errors import AotcError
from aotc.ir import dtypes
from aotc.ir.graph import Node
from aotc.ops.common import FLOAT_CTYPES, c_array, c_bytes, c_literal
from aotc.ops.index import checked_index, task_arrays
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
    k = math.prod(idx.shape)
    shape = (1, k) if len(x.shape) == 1 else (*x.shape[:-1], k)
    return [(shape, x.dtype)]


def _afe_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x, idx = _in(node), _in(node, 1)
    n = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    k = math.prod(idx.shape)
    # Indices count from 0 only; one outside [0, n) is an error, as in onnxruntime.
    values = np.asarray(idx.const).astype(np.int64) if idx.is_const else None
    check = checked_index(node, "i", f"{ins[1]}[j]", n, values, negative=False)
    return (f"for (size_t r = task; r < {rows}; r += ntasks)\n"
            f"  for (size_t j = 0; j < {k}; j++) {{\n"
            + "".join(f"    {ln}\n" for ln in check.split("\n"))
            + f"    {outs[0]}[r * {k} + j] = {ins[0]}[r * {n} + (size_t)i];\n"
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
             _tree_arrays(node)[1],
             f"for (size_t r = task; r < {rows}; r += ntasks) {{",
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


def _tree_arrays(node: Node) -> tuple[int, str]:
    """A row's sum per target (n_targets is an attribute: any size)."""
    return task_arrays([("acc", np.dtype(np.float64), int(node.attr("n_targets", 1)))])


register(OpDef(_ML + "TreeEnsemble", "kernel", _tree_infer, emit=_tree_emit,
               scratch=lambda node: _tree_arrays(node)[0]))


def _int_lit(v: int, ctype: str) -> str:
    """An integer literal of ``ctype`` that C never reads as too large for its type (INT64_MIN, and
    unsigned values past INT64_MAX, are not plain decimal literals)."""
    if v == -2**63:
        return "INT64_MIN"
    return f"UINT64_C({v})" if ctype.startswith("uint") else c_literal(v, ctype)


def _int_table(ctype: str, name: str, values: np.ndarray) -> str:
    """A ``static const`` integer table (at least one element, as C requires)."""
    vals = [int(v) for v in np.asarray(values).reshape(-1)] or [0]
    return f"static const {ctype} {name}[{len(vals)}] = {{{', '.join(_int_lit(v, ctype) for v in vals)}}};"


# -- TfIdfVectorizer (default domain): n-gram counts of integer token rows ------------------------------------
def _tfidf_grams(node: Node) -> tuple[list[tuple[int, ...]], list[int], int]:
    """The pool's n-grams of a counted length, each with its output column, sorted by tokens so the
    kernel can binary-search the first token; and the number of output columns. A model file is
    untrusted: every index is checked here so that the kernel's table reads stay in bounds."""
    def bad(msg: str) -> AotcError:
        return AotcError(f"TfIdfVectorizer node {node.name!r}: {msg}")

    if node.attr("pool_strings") is not None:
        raise bad("string pools are not supported (aotc compiles numeric tensors only)")
    pool = [int(v) for v in node.attr("pool_int64s", [])]
    counts = [int(v) for v in node.attr("ngram_counts", [])]
    indexes = [int(v) for v in node.attr("ngram_indexes", [])]
    lo, hi = int(node.attr("min_gram_length", 1)), int(node.attr("max_gram_length", 1))
    if not indexes or min(indexes) < 0:
        raise bad("ngram_indexes must be non-empty and non-negative")
    if lo < 1 or hi < lo:
        raise bad(f"gram lengths [{lo}, {hi}] are invalid")
    if any(c < 0 or c > len(pool) for c in counts) or counts != sorted(counts):
        raise bad("ngram_counts must be non-decreasing offsets into the pool")
    column: dict[tuple[int, ...], int] = {}
    gram_id = 0  # the reference numbers every pool n-gram, counted length or not
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        for k in range(max(end - start, 0) // size):
            if lo <= size <= hi:
                if gram_id >= len(indexes):
                    raise bad(f"the pool has more n-grams than ngram_indexes has entries ({len(indexes)})")
                column[tuple(pool[start + k * size:start + (k + 1) * size])] = indexes[gram_id]  # last wins
            gram_id += 1
    grams = sorted(column)
    return grams, [column[g] for g in grams], max(indexes) + 1


def _tfidf_infer(node: Node):
    x = _in(node)
    if x.dtype.kind not in "iu" or len(x.shape) not in (1, 2):
        raise AotcError(f"TfIdfVectorizer node {node.name!r}: input must be an integer [C] or [B, C] tensor")
    out = _tfidf_grams(node)[2]
    return [((out,) if len(x.shape) == 1 else (x.shape[0], out), np.dtype(np.float32))]


def _tfidf_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = _in(node)
    grams, cols, out = _tfidf_grams(node)
    rows, c = (1, x.shape[0]) if len(x.shape) == 1 else x.shape
    lo, hi = int(node.attr("min_gram_length", 1)), int(node.attr("max_gram_length", 1))
    skips = int(node.attr("max_skip_count", 0))
    mode = node.attr("mode", "TF")
    weights = np.asarray(node.attr("weights", []), np.float32).reshape(-1)
    if mode not in ("TF", "IDF", "TFIDF"):
        raise AotcError(f"TfIdfVectorizer node {node.name!r}: unknown mode {mode!r}")
    if mode != "TF" and weights.size and weights.size < out:
        raise AotcError(f"TfIdfVectorizer node {node.name!r}: {weights.size} weights for {out} outputs")
    lens = [len(g) for g in grams]
    offs = np.cumsum([0, *lens])[:-1]
    tokens = [t for g in grams for t in g]
    # Counts accumulate in the output row itself (exact in float up to 2^24), then get weighted.
    w = "tf_w[j]" if weights.size else "1.0f"
    final = {"TF": None, "IDF": f"y[j] > 0 ? {w} : 0.0f", "TFIDF": f"{w} * y[j]"}[mode]
    lines = [_int_table("int64_t", "tf_tok", np.array(tokens, np.int64)),
             _int_table("uint32_t", "tf_off", offs), _int_table("uint32_t", "tf_len", np.array(lens)),
             _int_table("uint32_t", "tf_col", np.array(cols)),
             c_array("float", "tf_w", weights[:out]), "(void)tf_w;",
             f"for (size_t r = task; r < {rows}; r += ntasks) {{",
             f"  const {dtypes.c_type(x.dtype)} *xr = {ins[0]} + r * {c};",
             f"  {ctype} *y = {outs[0]} + r * {out};",
             f"  for (size_t j = 0; j < {out}; j++) y[j] = 0;",
             # Unigrams do not depend on the skip, so only the first skip distance counts them.
             f"  for (size_t d = 1; d <= {skips + 1}; d++) {{",
             f"    const size_t nmin = d > 1 && {lo} == 1 ? 2 : {lo};",
             f"    if (nmin > {hi}) break;",
             f"    for (size_t i = 0; i < {c}; i++) {{",
             "      const int64_t x0 = (int64_t)xr[i];",
             f"      size_t a = 0, b = {len(grams)};",
             "      while (a < b) { const size_t m = a + (b - a) / 2; "
             "if (tf_tok[tf_off[m]] < x0) a = m + 1; else b = m; }",
             f"      for (size_t g = a; g < {len(grams)} && tf_tok[tf_off[g]] == x0; g++) {{",
             "        const size_t n = tf_len[g];",
             f"        if (n < nmin || i + (n - 1) * d >= {c}) continue;",
             "        size_t k = 1;",
             "        while (k < n && (int64_t)xr[i + k * d] == tf_tok[tf_off[g] + k]) k++;",
             "        if (k == n) y[tf_col[g]] += 1;",
             "      }",
             "    }",
             "  }"]
    if final:
        lines.append(f"  for (size_t j = 0; j < {out}; j++) y[j] = {final};")
    return "\n".join(lines + ["}"])


register(OpDef("TfIdfVectorizer", "kernel", _tfidf_infer, emit=_tfidf_emit))


# -- LabelEncoder: a constant map from numeric or string keys to numeric values ------------------------------
_NO_STRING_VALUES = ("string values are not supported: the output would be strings, and string outputs need "
                     "allocation, which the library never does")


def _le_attr(node: Node, kind: str) -> np.ndarray | None:
    for suffix, dt in (("int64s", np.int64), ("floats", np.float32), ("strings", object), ("tensor", None)):
        v = node.attr(f"{kind}_{suffix}")
        if v is not None:
            return np.asarray(v, dt)
    return None


def _type_name(dt: np.dtype) -> str:
    return dtypes.dtype_name(dt) if dtypes.is_supported(dt) else str(dt)


def _le_table(node: Node) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, values, default): keys as the input's dtype (str objects for a string input), values and
    default as the output's."""
    def bad(msg: str) -> AotcError:
        return AotcError(f"LabelEncoder node {node.name!r}: {msg}")

    keys, vals = _le_attr(node, "keys"), _le_attr(node, "values")
    if vals is not None and dtypes.is_string(vals.dtype):
        raise bad(_NO_STRING_VALUES)
    if keys is None or vals is None or keys.dtype.kind not in "iufO" or vals.dtype.kind not in "iuf":
        raise bad("needs keys (keys_int64s/keys_floats/keys_strings/keys_tensor) and numeric values "
                  "(values_int64s/values_floats/values_tensor)")
    keys, vals = keys.reshape(-1), vals.reshape(-1)
    if keys.size != vals.size:
        raise bad(f"{keys.size} keys but {vals.size} values")
    if node.attr("values_tensor") is not None:
        default = node.attr("default_tensor")
        default = np.asarray((-1 if vals.dtype.kind in "iu" else -0.0) if default is None else default)
    elif vals.dtype == np.int64:
        default = np.asarray(node.attr("default_int64", -1))
    else:
        default = np.asarray(node.attr("default_float", -0.0))
    if default.dtype.kind not in "iuf" or default.size == 0:
        raise bad("the default must be one number")
    x = _in(node)
    if dtypes.is_string(x.dtype) or dtypes.is_string(keys.dtype):
        if not (dtypes.is_string(x.dtype) and dtypes.is_string(keys.dtype)):
            raise bad(f"keys of type {_type_name(keys.dtype)} cannot match a {_type_name(x.dtype)} input")
        as_x = keys
    else:
        if (x.dtype.kind == "f") != (keys.dtype.kind == "f"):
            raise bad(f"keys of type {keys.dtype} cannot match a {x.dtype} input")
        as_x = keys.astype(x.dtype)
        if not np.array_equal(as_x.astype(keys.dtype), keys, equal_nan=True):
            raise bad(f"a key is not a {x.dtype} value")
    return as_x, vals, default.reshape(-1)[:1].astype(vals.dtype)


def _le_infer(node: Node):
    x = _in(node)
    return [(x.shape, _le_table(node)[1].dtype)]


def _string_keys(node: Node, keys: np.ndarray, vals: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The keys as UTF-8 bytes, sorted the way strcmp orders them, with their values. A duplicate key
    keeps its last value; a key holding a NUL byte is dropped, as no input (a C string) can equal it."""
    table: dict[bytes, object] = {}
    for k, v in zip(keys, vals, strict=True):
        try:
            data = str(k).encode("utf-8")
        except UnicodeEncodeError:
            raise AotcError(f"LabelEncoder node {node.name!r}: a key is not valid Unicode text") from None
        if b"\0" not in data:
            table.pop(data, None)
            table[data] = v
    # bytes sort by unsigned byte values, shorter prefix first: strcmp's order for NUL-free strings.
    order = sorted(table)
    return order, np.array([table[k] for k in order], vals.dtype)


def _le_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Binary search over the sorted keys. Float keys compare bitwise, as the spec says, so a NaN key
    maps NaN inputs (and -0.0 and 0.0 are different keys); string keys compare with strcmp."""
    x, out = _in(node), node.outputs[0]
    keys, vals, default = _le_table(node)
    if dtypes.is_string(x.dtype):
        skeys, vals = _string_keys(node, keys, vals)
        n_keys = len(skeys)
        key_table = (f"static const char *const le_key[{max(n_keys, 1)}] = "
                     f"{{{', '.join(c_bytes(k) for k in skeys) or '0'}}};")
        read = f"const char *const k = {ins[0]}[i];"
        less, equal = "strcmp(le_key[m], k) < 0", "strcmp(le_key[a], k) == 0"
    else:
        if x.dtype.kind == "f":
            bits = np.dtype(f"u{x.dtype.itemsize}")
            keys, ktype = keys.view(bits), f"uint{8 * x.dtype.itemsize}_t"
            read = f"{ktype} k; memcpy(&k, &{ins[0]}[i], sizeof k);"
        else:
            keys, ktype = keys.astype(np.int64), "int64_t"
            read = f"const int64_t k = (int64_t){ins[0]}[i];"
        _, first = np.unique(keys[::-1], return_index=True)  # duplicate keys: the last one wins
        pick = keys.size - 1 - first
        keys, vals = keys[pick], vals[pick]
        n_keys = keys.size
        key_table = _int_table(ktype, "le_key", keys)
        less, equal = "le_key[m] < k", "le_key[a] == k"
    vals = vals.astype(out.dtype)
    if out.dtype.kind == "f":
        table = (f"static const {ctype} le_val[{max(vals.size, 1)}] = "
                 f"{{{', '.join(c_literal(float(v), ctype) for v in vals) or '0'}}};")
        dflt = c_literal(float(default[0]), ctype)
    else:
        table, dflt = _int_table(ctype, "le_val", vals), _int_lit(int(default[0]), ctype)
    n = math.prod(x.shape)
    if n_keys == 0:  # e.g. every key held a NUL; ``a < 0`` on a size_t would not compile with -Wextra
        return f"for (size_t i = task; i < {n}; i += ntasks) {outs[0]}[i] = {dflt};"
    return "\n".join([
        key_table, table,
        f"const size_t lo = (size_t){n} * task / ntasks, hi = (size_t){n} * (task + 1) / ntasks;",
        "for (size_t i = lo; i < hi; i++) {",
        f"  {read}",
        f"  size_t a = 0, b = {n_keys};",
        f"  while (a < b) {{ const size_t m = a + (b - a) / 2; if ({less}) a = m + 1; else b = m; }}",
        f"  {outs[0]}[i] = a < {n_keys} && {equal} ? le_val[a] : {dflt};",
        "}"])


register(OpDef(_ML + "LabelEncoder", "kernel", _le_infer, emit=_le_emit))
