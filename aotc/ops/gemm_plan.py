"""GEMM planning: the blocking and code paths of one fp32 GEMM with every size known at compile time.

Every ONNX MatMul/Gemm the compiler sees has M, N and K fixed at compile time, so each becomes one C
function in which all sizes, strides and block sizes are literals (``aotc/codegen/gemm.py`` renders it
from ``templates/gemm.c.j2``). This module takes the decisions, for the target's ISA and caches, once per
kernel (the schedule step, ``aotc/passes/schedule.py``). The algorithm is the Goto/BLIS decomposition,
written from its published description:

* ``B`` is cut into KC x NC blocks packed into panels ``NR`` columns wide; each KC x NR micro-panel is
  contiguous (zero padded past N), so the micro-kernel streams it linearly.  One micro-panel stays in
  L1 while every MR-row panel of the A block passes over it.
* ``A`` is cut into MC x KC blocks copied into a contiguous buffer that stays in L2.
* An MR x NR register tile of ``C`` lives in vector registers for a whole K block: per ``k`` the
  micro-kernel loads one row of the B micro-panel, broadcasts MR elements of A and does MR * NR / lanes
  fused multiply-adds.

When ``B`` is a constant (weights) it is packed here, at compile time, by :func:`pack_b`.  Shapes that
get no reuse from a copy skip it: with M <= MR (GEMV-like) A is read in place, K is not blocked and a
run-time row-major B is streamed in place too; with N <= 2 * NR, with all of K in one block, or when tasks
split the columns of an A that is one M block and fits in half of L2, A is read in place.  In that last
case, with B constant, K is blocked only past a 64 KB B micro-panel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from aotc.isa import ISAS
from aotc.ops.linalg import gemm_batch_strides
from aotc.target import L1D_BYTES, L2_BYTES

if TYPE_CHECKING:
    from aotc.ir.graph import Node
    from aotc.target import Target


@dataclass(frozen=True)
class IsaParams:
    """The register tile of one instruction set (``aotc.isa``) and the block sizes that the target's caches
    give it: what the blocking depends on."""

    name: str
    lanes: int  # floats per vector register
    mr: int  # rows of the register tile
    nv: int  # vectors per row of the register tile (NR = nv * lanes)
    acc_budget: int  # how many accumulator registers a kernel may use without spilling
    kc: int  # K block: a KC x NR micro-panel of B plus an MR x KC sliver of A fit in L1
    mc: int  # M block: an MC x KC block of packed A fits in (a quarter of) L2
    nc: int  # N block: a KC x NC block of packed B fits in a share of L3

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


# The K block caps the passes over C that a long K makes; 256 measured best on Zen 3 (avx2).
KC_MAX = 256
# The KC x NC block of B is sized for a share of L3 (3 MiB at KC = 256), which the target does not model.
NC = 3072
# With an A read in place because it fits in half of L2 and a constant B (see plan_gemm), the K block is
# capped by this size of a KC x NR micro-panel of B (K = 1024 on AVX2) instead of KC.
SHARED_A_PANEL_BYTES = 64 * 1024


def gemm_params(isa: str, l1d_bytes: int, l2_bytes: int) -> IsaParams:
    """``isa``'s register tile (``aotc.isa``) with block sizes for a core with these caches.

    KC: the KC x NR micro-panel of B that stays in L1 while the A row panels stream past it fills at most
    half of L1 (32 KiB: 256 x 16 floats = 16 KiB for avx2, 128 x 32 for avx512's 32-wide panels), up to
    KC_MAX. MC: whole pairs of row panels whose MC x KC block of packed A fills at most a quarter of L2,
    leaving room for the B block streaming through (512 KiB: 120 rows x 256 for avx2, 120 KiB; pairs keep
    that tuned value).
    """
    e = ISAS[isa]
    kc = max(1, min(KC_MAX, l1d_bytes // 2 // (4 * e.gemm_nr)))
    mc = max(2 * e.gemm_mr, l2_bytes // 4 // (4 * kc) // (2 * e.gemm_mr) * (2 * e.gemm_mr))
    return IsaParams(isa, e.lanes, e.gemm_mr, e.gemm_nv, e.acc_budget, kc, mc, NC)


@dataclass(frozen=True)
class GemmSpec:
    """One GEMM ``C[b] = A[b] @ B[b]`` (b < batch) with every size known at compile time.

    The batch strides default to 0 (they need a default to follow ``batch`` in a dataclass); 0 means the
    operand is shared by all batch entries, e.g. constant weights applied to a batch of activations.
    """

    m: int
    n: int
    k: int
    batch: int = 1  # number of independent GEMMs
    a_batch_stride: int = 0  # elements between consecutive A matrices (0: one shared A)
    b_batch_stride: int = 0  # same for B (0: one shared B)
    c_batch_stride: int = 0  # same for C (>= m * n when batch > 1)
    trans_a: bool = False  # A stored as [K, M] instead of [M, K]
    trans_b: bool = False  # B stored as [N, K] instead of [K, N]
    b_const: bool = False  # B is a compile-time constant, passed to the kernel as pack_b()'s output
    isa: str = "avx2"  # an aotc.isa.ISAS key: "avx512" | "avx2" | "neon" | "generic"
    l1d_bytes: int = L1D_BYTES  # the target's caches, which the block sizes derive from (aotc.target)
    l2_bytes: int = L2_BYTES
    # (KC, MC, NC) caps replacing the cache-derived ones, for tuning (benchmarks/gemm_kernel.py).
    blocking: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if min(self.m, self.n, self.k, self.batch) < 1:
            raise ValueError(f"GEMM sizes must be >= 1: m={self.m} n={self.n} k={self.k} batch={self.batch}")
        if min(self.a_batch_stride, self.b_batch_stride, self.c_batch_stride) < 0:
            raise ValueError("batch strides must be >= 0")
        if self.batch > 1 and self.c_batch_stride < self.m * self.n:
            raise ValueError("c_batch_stride must be >= m * n when batch > 1 (outputs may not overlap)")
        if self.isa not in ISAS:
            raise ValueError(f"unknown isa {self.isa!r}; expected one of {sorted(ISAS)}")


@dataclass(frozen=True)
class GemmPlan:
    """Every decision taken for one spec: the schedule step keeps it in the kernel's plan, the memory
    planner sizes the scratch from it and codegen renders it (``aotc.codegen.gemm.render_gemm``)."""

    spec: GemmSpec
    isa: IsaParams
    kc: int  # K block (all blocks are kc long except possibly the last, which is shorter)
    mc: int  # M block, a multiple of MR (or M itself when M <= MR)
    nc: int  # N block, a multiple of NR
    pack_a: bool  # copy A blocks into scratch (False: the kernel reads A in place)
    direct_b: bool  # run-time B read in place (row-major, small M: every B element is used once)
    split_m: bool  # tasks take row panels (True) or column panels (False)
    a_floats: int  # scratch floats for one packed A block
    b_floats: int  # scratch floats for one packed B block (or the zero-padded edge panel if direct_b)

    def describe(self) -> str:
        """One line for the dumps: the blocking and what is packed."""
        s = self.spec
        return (f"gemm {s.m}x{s.n}x{s.k}{f' batch {s.batch}' if s.batch > 1 else ''} on {self.isa.name} "
                f"{self.isa.mr}x{self.isa.nr} tiles, KC={self.kc} MC={self.mc} NC={self.nc}, "
                f"A {'packed' if self.pack_a else 'in place'}, B "
                f"{'packed at compile time' if s.b_const else 'in place' if self.direct_b else 'packed'}, "
                f"tasks split {'rows' if self.split_m else 'columns'}")

    @property
    def task_floats(self) -> int:
        """Scratch floats per task, rounded so every task's slice starts 64-byte aligned."""
        return _round_up(self.a_floats, 16) + _round_up(self.b_floats, 16)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def ceil_div(x: int, m: int) -> int:
    return (x + m - 1) // m


def _balanced(total: int, cap: int, mult: int) -> int:
    """Block size (a multiple of mult, at most cap) that cuts total into the fewest equal-ish blocks.

    Equal blocks avoid a short last block, which would pay a full pass over C (K blocks) or repack
    (M and N blocks) for little work.
    """
    if total <= cap:
        return _round_up(total, mult)
    nblocks = ceil_div(total, cap)
    return _round_up(ceil_div(total, nblocks), mult)


def plan_gemm(spec: GemmSpec) -> GemmPlan:
    """Choose block sizes and code paths for ``spec`` (pure function of the spec)."""
    isa = gemm_params(spec.isa, spec.l1d_bytes, spec.l2_bytes)
    if spec.blocking is not None:
        isa = replace(isa, kc=spec.blocking[0], mc=spec.blocking[1], nc=spec.blocking[2])
    mr, nr = isa.mr, isa.nr
    small_m = spec.m <= mr
    direct_b = small_m and not spec.b_const and not spec.trans_b
    mc = spec.m if small_m else min(_balanced(spec.m, isa.mc, mr), _round_up(spec.m, mr))
    nc = min(_balanced(spec.n, isa.nc, nr), _round_up(spec.n, nr))
    mslabs, nslabs = ceil_div(spec.m, mr), ceil_div(spec.n, nr)
    if spec.b_const:
        # Row split costs nothing extra (each task packs only its rows of A); prefer it when there are
        # at least as many row panels as column panels so tasks stay balanced.
        split_m = mslabs >= nslabs
    else:
        # Each task must pack what it reads itself: a row split repacks all of B per task, a column
        # split all of A, so split the larger dimension and duplicate the smaller operand.
        split_m = spec.m > spec.n and mslabs > 1
    # Packing A pays off through reuse across column panels; with one or two panels (N <= 2 * NR) every A
    # element is read once or twice anyway, so the kernel reads A in place.  So it does when tasks split
    # columns, all of M is one block and A fits in half of L2 (the MLP layers at batch 64): A stays in L2
    # either way, and every task would pack the same A again (2.3% of the 64x784x512 layer on 2 threads).
    shared_a = not split_m and spec.m <= mc and spec.m * spec.k * 4 <= spec.l2_bytes // 2
    # With one row panel, a B micro-panel is used exactly once, so K blocking buys no reuse: take all of
    # K at once (fewer passes over C), unless B must be packed at run time (bounded scratch).
    if small_m and (spec.b_const or direct_b):
        kc = spec.k
    elif shared_a and spec.b_const:
        # A read in place as one M block, B packed at compile time: a K block only keeps the B
        # micro-panel in L1 across a few row panels, and costs a pass over C. Whole K (the panel then
        # streams from L2) measured 2-6% faster on the MLP's 64x784x512 and 64x512x512 layers and
        # on 64x1024x512, at 1 and 2 threads.
        kc = _balanced(spec.k, max(isa.kc, SHARED_A_PANEL_BYTES // (4 * nr)), 1)
    else:
        kc = _balanced(spec.k, isa.kc, 1)
    # With all of K in one block a row panel of A is read once per column panel, straight from its rows
    # (MR streams): the copy measured 2-5% slower at 256x256x256, 1 and 2 threads, and no faster on
    # BERT's 128x256x256 and 128x256x1024. Over several K blocks (1024x1024x1024) packing is 13% faster.
    pack_a = not small_m and nslabs > 2 and not shared_a and kc < spec.k
    a_floats = mc * kc if pack_a else 0
    if spec.b_const:
        b_floats = 0
    elif direct_b:
        b_floats = kc * nr if spec.n % nr else 0
    else:
        b_floats = kc * nc
    return GemmPlan(spec, isa, kc, mc, nc, pack_a, direct_b, split_m, a_floats, b_floats)


def packed_b_shape(spec: GemmSpec) -> tuple[int, int, int, int]:
    """Shape of :func:`pack_b`'s result: (batches, panels, K, NR)."""
    nr = ISAS[spec.isa].gemm_nr
    nb = spec.batch if spec.b_batch_stride else 1
    return (nb, ceil_div(spec.n, nr), spec.k, nr)


def pack_b(b: np.ndarray, spec: GemmSpec) -> np.ndarray:
    """Pack a constant ``B`` into the layout the generated kernel reads (done once, at compile time).

    ``b`` is B as stored: ``[K, N]`` (``[N, K]`` if ``trans_b``), or ``[batch, ...]`` of those when
    ``b_batch_stride`` is non-zero (any array whose flat view holds batch entry ``i`` at offset
    ``i * b_batch_stride`` is accepted).  The result is C-contiguous float32 of shape
    ``packed_b_shape(spec)``: for each batch, for each NR-column panel, K rows of NR floats, with the
    columns past N zero.  Panel-major over the whole K means the KC x NR micro-panel the kernel wants
    for any K block is contiguous, and the layout does not depend on the block sizes.
    """
    nb, npan, k, nr = packed_b_shape(spec)
    flat = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    need = (nb - 1) * spec.b_batch_stride + k * spec.n
    if flat.size < need:
        raise ValueError(f"pack_b: B has {flat.size} elements, spec needs at least {need}")
    out = np.zeros((nb, npan, k, nr), dtype=np.float32)
    for i in range(nb):
        off = i * spec.b_batch_stride
        mat = flat[off:off + k * spec.n]
        kn = mat.reshape(spec.n, k).T if spec.trans_b else mat.reshape(k, spec.n)
        padded = np.zeros((k, npan * nr), dtype=np.float32)
        padded[:, :spec.n] = kn
        out[i] = padded.reshape(k, npan, nr).transpose(1, 0, 2)
    return out


def scratch_bytes(spec: GemmSpec, ntasks: int) -> int:
    """Bytes of scratch for ``ntasks`` concurrent tasks (each gets a 64-byte aligned slice).

    Scratch holds the packed A block and, when B is not a packed constant, the packed B block.
    """
    if ntasks < 1:
        raise ValueError("ntasks must be >= 1")
    return plan_gemm(spec).task_floats * 4 * ntasks


def matmul_spec(mm: Node, target: Target) -> GemmSpec | None:
    """The GEMM of MatMul node ``mm`` for ``target``; None when the naive loop computes it (other
    dtypes, empty operands, batch dims that broadcast on both sides)."""
    strides = gemm_batch_strides(mm)
    if strides is None:
        return None
    a, b = mm.inputs[0], mm.inputs[1]
    m, k = a.shape[-2:]
    n = b.shape[-1]
    nb = int(np.prod(mm.outputs[0].shape[:-2]))
    return GemmSpec(m=m, n=n, k=k, batch=nb, a_batch_stride=strides[0], b_batch_stride=strides[1],
                    c_batch_stride=m * n if nb > 1 else 0, b_const=b.is_const, isa=target.isa.name,
                    l1d_bytes=target.l1d_bytes, l2_bytes=target.l2_bytes)
