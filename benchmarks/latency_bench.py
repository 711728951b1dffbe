"""Issue 3's benchmark: how fast autoao measures a model's kernels, and how well it predicts.

    source benchmarks/device_env.sh; python3 benchmarks/latency_bench.py --out $OUT

1. Cold / warm timing: every unique linear shape of a Llama-3-8B-shaped model (q/o 4096x4096,
   k/v 1024x4096, gate/up 14336x4096, down 4096x14336, lm_head 128256x4096) x every candidate x
   M = 1 and 2048, through `measure_latencies` with a fresh on-disk cache (cold), then again (warm).
2. Predicted vs measured: an 8-layer Llama-3-8B-shaped stack (benchmarks/llama_stack.py), profiled
   on [1, M] tokens; bf16 measured end to end gives the non-linear remainder ("rest"); for bf16
   and uniform plans the cost model's prediction (rest + sum of cached layer timings) is compared
   with the measured end-to-end time of the quantized model. CUDA graphs, L2 flushed, median.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import llama_stack  # noqa: E402

import autoao  # noqa: E402
from autoao import search_space  # noqa: E402
from autoao.cost import CostModel, token_counts  # noqa: E402
from autoao.evaluators.cache import TimingCache  # noqa: E402
from autoao.evaluators.timing import measure_latencies, measure_model  # noqa: E402
from autoao.profile import profile  # noqa: E402

PLANS = ["bf16", "int4_wo(group_size=128)", "fp8_dyn(granularity=row)", "int8_dyn", "sparse24_int8_dyn"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", default="1,2048")
    ap.add_argument("--plans", default=";".join(PLANS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    import triton

    lines = [f"# latency_bench ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             f"- command: python {' '.join(sys.argv)}",
             f"- gpu: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}",
             f"- model: Llama-3-8B-shaped stack, {args.layers} layers + lm_head, bf16, random weights", ""]

    # 1. cold / warm timing of every unique shape
    c = llama_stack.LlamaShape(n_layers=args.layers)
    shapes = [(c.dim, c.dim), (c.n_kv_heads * c.dim // c.n_heads, c.dim), (c.hidden, c.dim), (c.dim, c.hidden),
              (c.vocab, c.dim)]
    cache_path = Path(tempfile.mkdtemp()) / "timings.sqlite"
    cands = search_space.all_candidates()
    t0 = time.perf_counter()
    cold = measure_latencies(shapes, tokens, cands, device="cuda", cache=TimingCache(cache_path), progress=False)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = measure_latencies(shapes, tokens, cands, device="cuda", cache=TimingCache(cache_path), progress=False)
    warm_s = time.perf_counter() - t0
    lines += ["## Timing every unique shape x candidate x M", "",
              "| run | kernel timings measured | from cache | wall s |", "|---|---|---|---|",
              f"| cold | {cold.measured} | {len(cold.rows) - cold.measured} | {cold_s:.1f} |",
              f"| warm | {warm.measured} | {len(warm.rows) - warm.measured} | {warm_s:.2f} |", ""]
    print("\n".join(lines[-6:]), flush=True)

    # 2. predicted vs measured, per M
    model = llama_stack.build(c)
    rows = []
    lines += ["## Predicted vs measured end to end", "",
              "| M | plan | layers in plan | predicted ms | measured ms | error | speed-up measured |",
              "|---|---|---|---|---|---|---|"]
    for m in tokens:
        x = torch.randint(0, c.vocab, (1, m), device="cuda")
        prof = profile(model, x, max_sample_rows=16)
        assert token_counts(prof) == [m]
        base = measure_model(model, x)
        cost = CostModel.build(prof, cold).with_rest_from(base.median_us)
        for name in args.plans.split(";"):
            plan = autoao.Plan.uniform(model, name)
            if name == "bf16":
                meas = base
            else:
                q = copy.deepcopy(model)
                autoao.apply(q, plan)
                meas = measure_model(q, x)
                del q
                torch.cuda.empty_cache()
            pred = cost.predict(plan)
            err = (pred - meas.median_us) / meas.median_us
            row = dict(m=m, plan=name, layers=len(plan.layers), predicted_ms=pred / 1e3,
                       measured_ms=meas.median_us / 1e3, error=err, speedup=base.median_us / meas.median_us,
                       rest_ms=cost.rest_us / 1e3, measure_error=meas.error or "")
            rows.append(row)
            lines.append(f"| {m} | {name} | {row['layers']} | {row['predicted_ms']:.3f} | {row['measured_ms']:.3f} "
                         f"| {100 * err:+.1f}% | {row['speedup']:.2f}x |")
            print(lines[-1], flush=True)
    lines += ["", "rest (non-linear part, measured bf16 end to end minus the bf16 layer timings): " +
              ", ".join(f"M={r['m']}: {r['rest_ms']:.3f} ms" for r in rows if r["plan"] == "bf16")]
    with open(out / "latency_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "latency_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
