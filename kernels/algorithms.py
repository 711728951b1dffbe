"""Calibrated quantization in plain torch: GPTQ, AWQ, HQQ and SmoothQuant.

Each algorithm produces the same canonical tensors as round-to-nearest (RTN, kernels/quant.py) for
the same kernels; only the stored numbers differ:

- GPTQ (Frantar et al. 2022): columns quantized left to right, each column's rounding error fed
  back into the columns not yet quantized through the Cholesky factor of the damped inverse input
  Hessian H = X^T X / S (damped more when the sample has few rows per channel: gptq_damping);
  group-wise scales fitted on the error-updated weights as each group starts. No act-order
  (keeps groups aligned with the kernels' contiguous groups). int4, and int8 weight-only with
  per-channel scales fitted once on the original rows.
- AWQ (Lin et al. 2023): a per-input-channel scale s = mean|x|^alpha (alpha on a grid, alpha = 0
  is RTN), the weight quantized as W * s and the input divided by s inside the module, alpha chosen
  by the layer's output error on the calibration sample; then AWQ's clipping search: each group's
  range shrunk by the ratio (1, 0.95, ..., 0.55) with the least error in that group's share of
  the output on the sample, kept where it lowers the layer's whole output error.
- HQQ (Badri & Shaji 2023): calibration-free; each group's zero point refined by half-quadratic
  splitting on an l_p (p < 1) weight error, keeping per group the best of RTN and the iterates by
  squared weight error.
- SmoothQuant (Xiao et al. 2022): s = max|x|^a / max|W|^(1-a) per input channel migrates the
  activations' outliers into the weight before int8 quantization of both; the input is divided by
  s inside the module.

The activation scales of AWQ and SmoothQuant are applied inside the quantized module (x / s before
its kernel, costing one elementwise op that timing measures); they are not folded into a preceding
normalization or linear layer. They are rounded to bfloat16 before the weight is scaled, so the
division the module does in bf16, fp16 or fp32 uses exactly the fitted scale.

Fits read the layer's `LayerStats` and fall back to RTN when what they need is absent. GPTQ's,
AWQ's and HQQ's fits are memoized in the statistics (`LayerStats.fits`) and their wall seconds
added to `FIT_SECONDS` (algorithm -> seconds) for the run's accounting; SmoothQuant's closed-form
scale is neither.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Iterator

import torch

from autoao.calibration import LayerStats
from autoao.kernels.quant import (
    INT8_MAX,
    dequantize_int4_groupwise,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)

# the algorithms whose module divides its input by a per-channel scale (a different runtime)
INPUT_SCALED = frozenset({"awq", "smoothquant"})
# the calibration statistics each algorithm reads (autoao.calibration.STATISTICS)
USES: dict[str, frozenset[str]] = {
    "rtn": frozenset(),
    "gptq": frozenset({"sample"}),  # the Hessian is computed from it, one layer at a time
    "awq": frozenset({"act_mean", "sample"}),
    "hqq": frozenset(),
    "smoothquant": frozenset({"act_absmax"}),
}
FIT_SECONDS: dict[str, float] = {}
# Bump when a fit's numbers change: results cached on disk by candidate name (layer errors, plan
# accuracies: evaluators.cache.ResultCache) are keyed by it. 2: AWQ's clipping search.
FIT_VERSION = 2

# Damping: the fraction of the mean Hessian diagonal added to its diagonal. GPTQ's 0.01 assumes
# many more sample rows S than input channels K; autoao's bounded sample often has fewer (256 rows
# for K = 576..14336), and X^T X / S then overfits those rows. gptq_damping shrinks it towards
# its diagonal by K / S, within [GPTQ_DAMP, 1] (SmolLM2, held-out rows, damping 0.01 / 0.1 / 1:
# down_proj K = 1536 from 1024 rows -3.9 / -1.6 / +0.2 dB vs RTN; q_proj K = 576 from 1024 rows
# +2.0 / +3.0 / +2.8 dB).
GPTQ_DAMP = 0.01
GPTQ_BLOCK = 128  # columns updated lazily as one block (a multiple of every int4 group size)
AWQ_GRID = 20  # alphas 0, 1/20, ..., 19/20 (AWQ's grid)
# AWQ's clipping grid: a group's [min, max] shrunk by 1 - i / 20 for i < 0.5 * 20 (AWQ's n_grid
# and max_shrink); output channels in chunks of AWQ_CLIP_CHUNK bound the [groups, S, chunk] errors
AWQ_CLIP_GRID, AWQ_CLIP_SHRINK, AWQ_CLIP_CHUNK = 20, 0.5, 1024
HQQ_ITERS, HQQ_P, HQQ_BETA, HQQ_KAPPA = 20, 0.7, 10.0, 1.01  # HQQ's defaults for 4 bits
SMOOTHQUANT_ALPHA = 0.5


def check_algorithm(algorithm: str, allowed: tuple[str, ...], what: str) -> None:
    """Raise ValueError naming the allowed algorithms (and the closest one) unless `algorithm` is one."""
    if algorithm in allowed:
        return
    import difflib

    close = difflib.get_close_matches(str(algorithm), allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"{what}: algorithm must be one of {', '.join(allowed)}, got {algorithm!r}{hint}")


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On the CPU, one intra-op thread for the block: the fits run thousands of small ops (GPTQ's
    column loop on [N] vectors, AWQ's and HQQ's loops), which threads slow down on a shared machine
    (a 1536 x 576 layer on a loaded 2-core CPU, 2 threads vs 1: GPTQ 5.9 vs 0.33 s, AWQ 4.9 vs 1.1 s,
    HQQ 3.9 vs 0.7 s)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def memoized_fit(stats: LayerStats | None, key: tuple, fit: Callable[[], tuple], device: torch.device) -> tuple:
    """fit() (on one CPU thread on the CPU), or its earlier result on the same statistics and key;
    its seconds go to FIT_SECONDS."""
    if stats is not None and key in stats.fits:
        return stats.fits[key]
    t0 = time.perf_counter()
    with _one_cpu_thread(device):
        out = fit()
    FIT_SECONDS[key[0]] = FIT_SECONDS.get(key[0], 0.0) + time.perf_counter() - t0
    if stats is not None:
        stats.fits[key] = out
    return out


def weight_key(weight: torch.Tensor) -> tuple:
    """The weight's identity for the memo: storage, version counter, shape and a checksum (a
    freed weight's address can be reused)."""
    return (weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype, str(weight.device),
            float(weight.detach().float().sum()))


def round_scale(s: torch.Tensor) -> torch.Tensor:
    """[K] float -> [K] float32 holding bfloat16 values (exact in bf16, fp16 within its range, fp32)."""
    return s.clamp(min=1e-4, max=1e4).to(torch.bfloat16).float()


##### GPTQ ######################################################################################

def gptq_damping(in_features: int, rows: int) -> float:
    """The damping for a Hessian from `rows` sample rows of `in_features` channels (GPTQ_DAMP)."""
    return min(1.0, max(GPTQ_DAMP, in_features / max(rows, 1)))


def gptq_columns(w: torch.Tensor, hessian: torch.Tensor, group: int,
          fit: Callable[[torch.Tensor], tuple], rnd: Callable[[torch.Tensor, tuple], tuple[torch.Tensor, torch.Tensor]],
          damp: float) -> tuple[torch.Tensor, list[tuple]]:
    """GPTQ's column loop. w [N, K] float, hessian [K, K] float32; `fit(w_group [N, g])` gives a
    group's quantization parameters from the current (error-updated) weights; `rnd(column [N],
    params) -> (q [N], dequantized [N] float32)`. group >= K: one fit on the original weight.
    Returns (q [N, K] in rnd's dtype, the parameters of each group in order). Holds H, its
    Cholesky factor and the weight in float32: 2 K^2 + N K floats."""
    w = w.float().clone()  # [N, K]
    n, k = w.shape
    h = hessian.float().clone()  # [K, K]
    dead = h.diagonal() == 0  # channels the sample never excited: any value does
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h.diagonal().add_(damp * h.diagonal().mean())
    # upper Cholesky factor of H^-1: row i holds how column i's error spreads to the columns after it
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)  # [K, K]
    del h
    params: list[tuple] = [fit(w)] if group >= k else []
    q = None
    for i1 in range(0, k, GPTQ_BLOCK):
        i2 = min(i1 + GPTQ_BLOCK, k)
        w1 = w[:, i1:i2].clone()  # [N, B]: updated column by column
        err = torch.zeros_like(w1)  # [N, B]: scaled errors, applied to the columns after the block at its end
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if group < k and col % group == 0:  # a group starts: fit it on its updated weights
                params.append(fit(w1[:, i:i + group]))
            qc, dq = rnd(w1[:, i], params[-1])
            if q is None:
                q = torch.empty(n, k, dtype=qc.dtype, device=w.device)
            q[:, col] = qc
            e = (w1[:, i] - dq) / hinv1[i, i]  # [N]
            w1[:, i:] -= e[:, None] * hinv1[i, i:][None, :]
            err[:, i] = e
        w[:, i2:] -= err @ hinv[i1:i2, i2:]
    assert q is not None
    return q, params


def output_error_energy(w: torch.Tensor, dq: torch.Tensor, hessian: torch.Tensor) -> float:
    """trace(E H E^T) for E = w - dq: the mean squared output error on the rows H came from."""
    e = w.float() - dq  # [N, K]
    return float(((e @ hessian) * e).sum())


def gptq_int4(weight: torch.Tensor, group_size: int, hessian: torch.Tensor, damp: float = GPTQ_DAMP
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K], hessian [K, K] -> (q [N, K] uint8, scales, zeros [N, K/g] bf16) in
    quantize_int4_groupwise's format, or RTN's where GPTQ's output error on the Hessian's rows is
    not lower (damping can make it so on a tiny sample)."""
    def fit(wg: torch.Tensor) -> tuple:
        _, s, z = quantize_int4_groupwise(wg, wg.shape[1])  # [N, 1] bf16 each
        return s, z

    def rnd(col: torch.Tensor, p: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        s, z = p[0][:, 0].float(), p[1][:, 0].float()
        qc = torch.round((col - z) / s + 8.0).clamp(0, 15)
        return qc.to(torch.uint8), (qc - 8.0) * s + z

    hessian = hessian.to(weight.device)
    q, params = gptq_columns(weight, hessian, group_size, fit, rnd, damp)
    scales = torch.cat([p[0] for p in params], dim=1)
    zeros = torch.cat([p[1] for p in params], dim=1)
    rtn = quantize_int4_groupwise(weight, group_size)
    if output_error_energy(weight, dequantize_int4_groupwise(q, scales, zeros), hessian) > \
            output_error_energy(weight, dequantize_int4_groupwise(*rtn), hessian):
        return rtn
    return q, scales, zeros


def gptq_int8(weight: torch.Tensor, hessian: torch.Tensor, damp: float = GPTQ_DAMP
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K], hessian [K, K] -> (q [N, K] int8, scale [N] float32) in
    quantize_int8_per_channel's format (its scales), or RTN's where GPTQ's error is not lower."""
    def fit(w: torch.Tensor) -> tuple:
        return (quantize_int8_per_channel(w)[1],)

    def rnd(col: torch.Tensor, p: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        qc = torch.round(col / p[0]).clamp(-INT8_MAX, INT8_MAX)
        return qc.to(torch.int8), qc * p[0]

    hessian = hessian.to(weight.device)
    q, params = gptq_columns(weight, hessian, weight.shape[1], fit, rnd, damp)
    scale = params[0][0]
    rq, rs = quantize_int8_per_channel(weight)
    if output_error_energy(weight, q.float() * scale[:, None], hessian) > \
            output_error_energy(weight, rq.float() * rs[:, None], hessian):
        return rq, rs
    return q, scale


##### AWQ #######################################################################################

def awq_scale(weight: torch.Tensor, group_size: int, act_mean: torch.Tensor, sample: torch.Tensor,
              grid: int = AWQ_GRID) -> torch.Tensor:
    """The per-input-channel scale s [K] (float32, bf16 values) minimizing the output error on
    `sample` [S, K] of (x / s) @ RTN(W * s)^T against x @ W^T, over s = mean|x|^alpha normalized to
    a geometric mean of 1, alpha in {0, 1/grid, ...}; alpha = 0 (s = 1) is RTN, so the result is
    never worse than RTN on the sample."""
    w = weight.float()  # [N, K]
    x = sample.to(w.device).float()  # [S, K]
    ref = x @ w.t()  # [S, N]
    base = act_mean.to(w.device).float().clamp(min=1e-6)
    best, best_s = math.inf, torch.ones_like(base)
    for i in range(grid):
        s = base.pow(i / grid)
        s = round_scale(s / (s.max() * s.min()).sqrt())
        dq = dequantize_int4_groupwise(*quantize_int4_groupwise(w * s, group_size))  # [N, K]
        err = float(((x / s) @ dq.t() - ref).pow(2).sum())
        if err < best:
            best, best_s = err, s
    return best_s


def awq_clip(weight: torch.Tensor, group_size: int, sample: torch.Tensor, grid: int = AWQ_CLIP_GRID,
             max_shrink: float = AWQ_CLIP_SHRINK) -> torch.Tensor:
    """weight [N, K] (already multiplied by AWQ's scale), sample [S, K] (already divided by it) ->
    the weight with each (output channel, group) clamped to its [min, max] shrunk by the ratio r in
    {1, 1 - 1 / grid, ..., above 1 - max_shrink} that minimizes that group's output error on the sample,
    ||x_g (w_g - Q(clamp(w_g, r)))^T||^2 (AWQ's auto_clip). The groups are chosen apart (their
    errors are not independent); where the clipped weight's whole output error on the sample is
    higher than the unclipped one's, the weight comes back unclipped."""
    w = weight.float()
    n, k = w.shape
    x = sample.to(w.device).float().reshape(-1, k // group_size, group_size).transpose(0, 1)  # [G, S, g]
    out = torch.empty_like(w)
    for lo in range(0, n, AWQ_CLIP_CHUNK):
        wg = w[lo:lo + AWQ_CLIP_CHUNK].reshape(-1, k // group_size, group_size)  # [n, G, g]
        wmin, wmax = wg.amin(2, keepdim=True), wg.amax(2, keepdim=True)  # [n, G, 1]
        best_err = torch.full(wg.shape[:2], math.inf, device=w.device)  # [n, G]
        best = wg
        for i in range(int(max_shrink * grid)):
            r = 1.0 - i / grid
            clipped = torch.minimum(torch.maximum(wg, wmin * r), wmax * r) if i else wg
            dq = dequantize_int4_groupwise(*quantize_int4_groupwise(clipped.reshape(len(wg), k), group_size))
            diff = (dq.reshape(wg.shape) - wg).transpose(0, 1)  # [G, n, g]
            err = torch.bmm(x, diff.transpose(1, 2)).pow(2).sum(1).t()  # [n, G]: per group's output
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best = torch.where(better[..., None], clipped, best)
        out[lo:lo + AWQ_CLIP_CHUNK] = best.reshape(-1, k)
    xs = sample.to(w.device).float()
    ref = xs @ w.t()  # [S, N]

    def output_error(v: torch.Tensor) -> float:
        return float((xs @ dequantize_int4_groupwise(*quantize_int4_groupwise(v, group_size)).t() - ref).pow(2).sum())
    return out if output_error(out) < output_error(w) else w


##### HQQ #######################################################################################

def _shrink_lp(x: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """HQQ's generalized soft-thresholding: the proximal step of the l_p (p < 1) norm."""
    return torch.sign(x) * torch.relu(x.abs() - (1.0 / beta) * x.abs().pow(p - 1))


def hqq_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (q [N, K] uint8, scales, zeros [N, K/g] bf16): RTN's min/max scales, each
    group's zero point refined by HQQ's half-quadratic iterations; per group the lowest squared
    weight error of RTN and every iterate (with bf16-rounded parameters) is kept."""
    n, k = weight.shape
    g = weight.float().reshape(-1, group_size)  # [N*K/g, g]
    _, s0, z0 = quantize_int4_groupwise(weight, group_size)
    s = s0.float().reshape(-1, 1)  # [G, 1]
    best_z = z0.float().reshape(-1, 1)  # ours: w ~ (q - 8) * s + z

    def error(z: torch.Tensor) -> torch.Tensor:
        q = torch.round((g - z) / s + 8.0).clamp(0, 15)
        return ((q - 8.0) * s + z - g).pow(2).sum(1, keepdim=True)  # [G, 1]

    best_err = error(best_z)
    zh = 8.0 - best_z / s  # HQQ's form: w ~ (q - zh) * s
    beta = HQQ_BETA
    for _ in range(HQQ_ITERS):
        q = torch.round(g / s + zh).clamp(0, 15)
        e = _shrink_lp(g - (q - zh) * s, beta, HQQ_P)
        zh = (q - (g - e) / s).mean(1, keepdim=True)
        beta *= HQQ_KAPPA
        z = ((8.0 - zh) * s).to(torch.bfloat16).float()
        err = error(z)
        better = err < best_err
        best_z, best_err = torch.where(better, z, best_z), torch.where(better, err, best_err)
    zeros = best_z.to(torch.bfloat16)
    q = torch.round((g - zeros.float()) / s + 8.0).clamp(0, 15).to(torch.uint8).reshape(n, k)
    return q, s0, zeros.reshape(n, k // group_size)


##### SmoothQuant ###############################################################################

def smoothquant_scale(weight: torch.Tensor, act_absmax: torch.Tensor, alpha: float = SMOOTHQUANT_ALPHA
                      ) -> torch.Tensor:
    """s [K] (float32, bf16 values) = max|x_k|^alpha / max|W_:,k|^(1 - alpha): dividing the input
    by s and multiplying the weight's columns by it leaves x @ W^T unchanged and evens out the
    per-channel ranges of both."""
    w_max = weight.float().abs().amax(0).clamp(min=1e-5)  # [K]
    x_max = act_absmax.to(weight.device).float().clamp(min=1e-5)
    return round_scale(x_max.pow(alpha) / w_max.pow(1 - alpha))


##### what the modules call #####################################################################

def quantize_int4(weight: torch.Tensor, group_size: int, algorithm: str, stats: LayerStats | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """weight [N, K] -> (q [N, K] uint8, scales, zeros [N, K/g] bf16, act_scale [K] float32 or None
    for the algorithms that scale no input). Falls back to RTN (act_scale 1) without the
    statistics the algorithm needs."""
    ones = torch.ones(weight.shape[1], device=weight.device) if algorithm in INPUT_SCALED else None
    if algorithm == "hqq":
        return (*memoized_fit(stats, ("hqq", group_size, weight_key(weight)), lambda: hqq_int4(weight, group_size),
                           weight.device), None)
    if algorithm == "gptq" and stats is not None and stats.sample is not None and len(stats.sample):
        damp = gptq_damping(weight.shape[1], len(stats.sample))
        return (*memoized_fit(stats, ("gptq", "int4", group_size, damp, weight_key(weight)),
                           lambda: gptq_int4(weight, group_size, stats.hessian(device=weight.device), damp),
                           weight.device), None)
    if algorithm == "awq" and stats is not None and stats.act_mean is not None \
            and stats.sample is not None and len(stats.sample):
        def fit() -> tuple:
            s = awq_scale(weight, group_size, stats.act_mean, stats.sample)
            clipped = awq_clip(weight.float() * s, group_size, stats.sample.float() / s)
            return (*quantize_int4_groupwise(clipped, group_size), s)
        return memoized_fit(stats, ("awq", group_size, weight_key(weight)), fit, weight.device)
    return (*quantize_int4_groupwise(weight, group_size), ones)


def quantize_int8(weight: torch.Tensor, algorithm: str, stats: LayerStats | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """weight [N, K] -> (q [N, K] int8, scale [N] float32, act_scale [K] float32 or None), as
    quantize_int8_per_channel; GPTQ or SmoothQuant where asked and their statistics are given,
    else RTN (act_scale 1 for SmoothQuant)."""
    if algorithm == "gptq" and stats is not None and stats.sample is not None and len(stats.sample):
        damp = gptq_damping(weight.shape[1], len(stats.sample))
        return (*memoized_fit(stats, ("gptq", "int8", damp, weight_key(weight)),
                           lambda: gptq_int8(weight, stats.hessian(device=weight.device), damp),
                           weight.device), None)
    if algorithm == "smoothquant":
        if stats is None or stats.act_absmax is None:
            return (*quantize_int8_per_channel(weight), torch.ones(weight.shape[1], device=weight.device))
        s = smoothquant_scale(weight, stats.act_absmax)
        return (*quantize_int8_per_channel(weight.float() * s), s)
    return (*quantize_int8_per_channel(weight), None)


def algorithm_seconds() -> dict[str, float]:
    """Wall seconds spent fitting, per algorithm, in this process so far (memo hits cost nothing)."""
    return dict(FIT_SECONDS)

