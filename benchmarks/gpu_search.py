"""autoao.optimize on the GPU: the 8-layer Llama-3-8B-shaped stack, random weights (speed only).

    source benchmarks/device_env.sh; python3 benchmarks/gpu_search.py --out $OUT

For M = 1 (decode-shaped) and M = 2048 (prefill-shaped) workloads: run the full pipeline (profile,
timings, tier-0 errors, tier-1 proxy, Optuna search, apply, measure) with `max_accuracy_drop=1.0`
(random weights have no accuracy to keep, so every plan is feasible and the search is a pure speed
search), then compare the measured end-to-end latency of the searched plan with bf16 and with the
best uniform plan. Records the search wall time (torchao 0.16 autoquant: 301 s + 98 s compile for
this stack at M=1, per issue 7).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import llama_stack  # noqa: E402

import autoao  # noqa: E402
from autoao.evaluators.timing import measure_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tokens", default="1,2048")
    ap.add_argument("--budget", default="40")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    c = llama_stack.LlamaShape()
    base = llama_stack.build(c)
    lines = ["| M | plan | measured ms | speed-up vs bf16 | search wall s |", "|---|---|---|---|---|"]
    results = []
    for m in [int(t) for t in args.tokens.split(",")]:
        x = torch.randint(0, c.vocab, (1, m), device="cuda")
        held = [torch.randint(0, c.vocab, (1, 256), device="cuda")]
        bf16 = measure_model(base, x).median_us
        model = copy.deepcopy(base)
        t0 = time.perf_counter()
        work = Path("/tmp/autoao_gpu_search") / f"m{m}"  # the saved model is GBs: keep it off $OUT
        r = autoao.optimize(model, x, budget=int(args.budget), eval_inputs=held, max_accuracy_drop=1.0,
                            out_dir=work, progress=False)
        (out / f"search_m{m}_summary.json").write_text((work / "summary.json").read_text())
        wall = time.perf_counter() - t0
        searched = r.summary["plan_ms"]["measured"] * 1e3
        del model
        torch.cuda.empty_cache()
        rows = [("bf16", bf16, 0.0), (f"searched {r.plan.summary()}", searched, wall)]
        for name in ["int4_wo(group_size=128)", "fp8_dyn(granularity=row)", "sparse24_int8_dyn"]:
            q = copy.deepcopy(base)
            autoao.apply(q, autoao.Plan.uniform(q, name))
            rows.append((f"uniform {name}", measure_model(q, x).median_us, 0.0))
            del q
            torch.cuda.empty_cache()
        for name, us, w in rows:
            lines.append(f"| {m} | {name} | {us / 1e3:.3f} | {bf16 / us:.2f}x | {w:.0f} |")
            results.append({"m": m, "plan": name, "ms": us / 1e3, "speedup": bf16 / us, "search_s": w,
                            "predicted_speedup": r.summary["speedup"]["predicted"] if name.startswith("searched") else None})
        print("\n".join(lines[-len(rows):]), flush=True)
    (out / "gpu_search.md").write_text(
        f"# autoao.optimize on {torch.cuda.get_device_name()} (torch {torch.__version__})\n\n"
        f"command: python {' '.join(sys.argv)}\n\n8-layer Llama-3-8B-shaped stack + lm_head, bf16, random weights; "
        "CUDA graphs, L2 flushed, median.\n\n" + "\n".join(lines) + "\n")
    (out / "gpu_search.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
