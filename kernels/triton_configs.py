"""The launch configurations of autoao's Triton GEMVs (kernels/triton_gemv.py), as data: the tiles
each kernel may run with, which fit a layer, and the most rows the int4 GEMV takes. Plain Python (no
triton import): the int4 module asks int4_max_rows without loading triton."""

from __future__ import annotations

from dataclasses import dataclass

from autoao.kernels.weight_only import GEMV_MAX_ROWS as MAX_ROWS  # M <= MAX_ROWS; larger M: GEMM kernels

MMA_MAX_ROWS = 16  # the tensor-core int4 kernel pads x to 16 rows: up to 16 cost what 1 does


@dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    variant: str = ""  # int4 only: "" (_int4_kernel), "words" (_int4_words_kernel) or "mma" (_int4_mma_kernel)
    num_stages: int = 3  # software-pipelining depth of the K loop (Triton's default)


# What the int8/fp8 tuner times: every config that was fastest on at least one cell of a datacenter GPU's table
# of all 24 earlier ones (BLOCK_N/BLOCK_K/warps of 2-16 KB of weights per step x split-K 1/2/4)
# on llama8's and SmolLM2's 14 weight shapes x M = 1, 8 x int8/fp8
# (docs/kernels.md#int8_wo-and-fp8_wo-the-triton-weight-only-gemvs). Split-K serves long K and narrow N (4096 x 14336, whose
# 4096 / BLOCK_N programs cannot fill 132 SMs).
CONFIGS = tuple(Config(bn, bk, sk, w) for bn, bk, sk, w in [
    (16, 1024, 1, 8), (16, 2048, 1, 8), (32, 256, 4, 4), (16, 512, 1, 4), (32, 256, 1, 4), (16, 256, 4, 4),
    (16, 1024, 4, 8), (8, 512, 4, 4), (32, 256, 2, 4), (4, 512, 1, 2)])
# int4: the byte kernel on the tiles that won its datacenter-GPU sweep (gemv_v3), the words kernel (22-33%
# fewer SASS instructions per byte) on its leanest tiles, and the
# tensor-core kernel on the tiles that won datacenter-GPU sweeps (64 wide for the 4096/14336 layers, 128 wide
# with split-K 8 for 4096x14336, 256 wide for the 128256-wide lm_head; a sweep of ~330 tensor-core
# configs found nothing > 2% faster than this list on llama8's shapes; docs/kernels.md#int4_wo);
# kept short because every group size compiles its own set on first use.
INT4_CONFIGS = tuple(Config(bn, bk, sk, w, variant) for bn, bk, w, variant in [
    (16, 512, 4, ""), (16, 1024, 8, ""), (16, 2048, 8, ""), (32, 256, 4, ""),
    (16, 512, 4, "words"), (32, 512, 4, "words"), (64, 256, 4, "words"), (16, 1024, 4, "words")]
    for sk in (1, 4)) + tuple(Config(bn, 128, sk, w, "mma") for bn, sk, w in [(64, 1, 4), (64, 8, 4), (256, 1, 4),
                                                                              (256, 4, 4), (128, 8, 8)])
DEFAULT = Config(16, 256, 1, 4)


def fits(cfg: Config, k: int, group: int) -> bool:
    """Whether cfg can run a layer of in_features k (int4: group size `group`; 0: per-channel)."""
    # int4 steps hold whole groups (group 0: per-channel kernels); every split gets >= 1 step.
    whole = group == 0 or cfg.block_k % group == 0
    even = cfg.variant not in ("words", "mma") or k % cfg.block_k == 0  # these two have no K masks
    dot = cfg.variant != "mma" or group >= 64  # tl.dot needs K >= 16: a group's G/4 nibbles a position
    return whole and even and dot and cfg.block_k * cfg.split_k <= max(k, cfg.block_k)


def candidates(kind: str, k: int, group: int, m: int) -> list[Config]:
    """The configs that can run (kind, K, group) at M rows: above MAX_ROWS only the tensor-core
    int4 kernel (its x tile is 16 rows whatever M is; the others unroll a loop over the rows)."""
    configs = INT4_CONFIGS if kind == "int4" else CONFIGS
    return [c for c in configs if fits(c, k, group) and (m <= MAX_ROWS or c.variant == "mma")]


def int4_max_rows(k: int, group: int) -> int:
    """The most rows int4_gemv takes for in_features K and this group size: MMA_MAX_ROWS where the
    tensor-core kernel fits (K a multiple of its 128-wide step, groups >= 64), else MAX_ROWS."""
    return MMA_MAX_ROWS if candidates("int4", k, group, MMA_MAX_ROWS) else MAX_ROWS
