"""What calibrated quantization costs to fit, per layer shape, on this device.

    source benchmarks/device_env.sh; python3 benchmarks/algorithms_cost.py --out $OUT/algorithms-cost

For each linear shape of the Llama-3-8B-shaped stack (benchmarks/llama_stack.py: q/o 4096x4096,
k/v 1024x4096, gate/up 14336x4096, down 4096x14336; N x K), a random bf16 weight and a calibration
sample of --rows rows with a few outlier channels (as real activations have), each algorithm's fit
through the module path autoao uses (kernels.algorithms.quantize_int4 / quantize_int8, memo off:
a fresh LayerStats per fit) is timed --reps times after one warm-up; the median wall seconds, with
the device synchronized, and the layer-output SQNR against the float product on held-out rows
(a sanity check only: on random weights and independent activations the calibrated fits have
little to exploit; their quality on real weights is in benchmarks/ACCURACY.md). Writes cost.md
and cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from autoao.calibration import LayerStats
from autoao.kernels.algorithms import quantize_int4, quantize_int8
from autoao.kernels.quant import dequantize_int4_groupwise, quantize_int8_per_token

SHAPES = {"q_proj / o_proj": (4096, 4096), "k_proj / v_proj": (1024, 4096), "gate_proj / up_proj": (14336, 4096),
          "down_proj": (4096, 14336)}
FITS = [("int4_wo g128", "rtn"), ("int4_wo g128", "hqq"), ("int4_wo g128", "awq"), ("int4_wo g128", "gptq"),
        ("int8_wo", "rtn"), ("int8_wo", "gptq"), ("int8_dyn", "rtn"), ("int8_dyn", "smoothquant")]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample_rows(rows: int, k: int, device: torch.device, seed: int) -> torch.Tensor:
    """[rows, K] bf16: unit Gaussian rows, 1% of the channels 20x larger (activation outliers)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, torch.randperm(k, generator=g)[: max(k // 100, 1)]] *= 20
    return x.to(device, torch.bfloat16)


def stats_for(x: torch.Tensor) -> LayerStats:
    xf = x.float()
    return LayerStats(act_norm=xf.norm(dim=0), act_absmax=xf.abs().amax(0), act_mean=xf.abs().mean(0), sample=x)


def fit(kind: str, algorithm: str, w: torch.Tensor, stats: LayerStats) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fitted weight [N, K] float32 and the input scale [K] (None: the input is not scaled)."""
    if kind.startswith("int4"):
        q, scales, zeros, act_scale = quantize_int4(w, 128, algorithm, stats)
        return dequantize_int4_groupwise(q, scales, zeros).float(), act_scale
    q, scale, act_scale = quantize_int8(w, algorithm, stats)
    return q.float() * scale.float()[:, None], act_scale  # [N, K]


def layer_output(kind: str, x: torch.Tensor, dq: torch.Tensor, act_scale: torch.Tensor | None) -> torch.Tensor:
    """What the layer computes on x [M, K]: (x / act_scale) @ dq^T, the input quantized to int8 per
    token first for int8_dyn (SmoothQuant's gain is there)."""
    xs = x.float() if act_scale is None else x.float() / act_scale.float()
    if kind == "int8_dyn":
        q, s = quantize_int8_per_token(xs)
        xs = q.float() * s
    return xs @ dq.t()


def sqnr_db(ref: torch.Tensor, y: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum().clamp_min(1e-30)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=1024, help="calibration rows per layer")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names from SHAPES")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = (torch.randn(n, k, device=device) * k ** -0.5).to(torch.bfloat16)
        x_fit, x_test = sample_rows(args.rows, k, device, 0), sample_rows(256, k, device, 1)
        ref = x_test.float() @ w.float().t()
        for kind, algorithm in FITS:
            times = []
            for _ in range(args.reps + 1):  # the first is the warm-up
                stats = stats_for(x_fit)  # fresh: the fit is memoized in its LayerStats
                sync(device)
                t0 = time.perf_counter()
                dq, act_scale = fit(kind, algorithm, w, stats)
                sync(device)
                times.append(time.perf_counter() - t0)
            row = {"shape": name, "n": n, "k": k, "format": kind, "algorithm": algorithm,
                   "seconds": statistics.median(times[1:]), "spread": [min(times[1:]), max(times[1:])],
                   "sqnr_db": sqnr_db(ref, layer_output(kind, x_test, dq, act_scale))}
            rows.append(row)
            print(json.dumps(row), flush=True)
            (args.out / "cost.json").write_text(json.dumps(rows, indent=1))
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = ["# Fit time of the calibrated algorithms per Llama-3-8B layer shape", "",
             f"command: `python3 benchmarks/algorithms_cost.py --out OUT --rows {args.rows} --reps {args.reps}`",
             f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; device: {dev}; torch {torch.__version__}",
             f"random bf16 weights, {args.rows} calibration rows (1% outlier channels x20), SQNR on 256 held-out rows "
             "(random data: a sanity check, not a quality measure)", "",
             "| shape (N x K) | format | algorithm | fit s (median) | min-max s | layer SQNR dB |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} ({r['n']}x{r['k']}) | {r['format']} | {r['algorithm']} | {r['seconds']:.3f} | "
                     f"{r['spread'][0]:.3f}-{r['spread'][1]:.3f} | {r['sqnr_db']:.2f} |")
    (args.out / "cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
