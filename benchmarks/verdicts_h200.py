"""The accuracy verdicts and the reported speed-up on the H200, against independent measurements.

    python3 benchmarks/verdicts_h200.py --out DIR --part decode      # transformers Llama / Qwen2
    python3 benchmarks/verdicts_h200.py --out DIR --part stack       # the llama8 stack

--part decode: transformers `LlamaForCausalLM` (Llama-3-8B layer shapes) and `Qwen2ForCausalLM`
(Qwen2.5-7B layer shapes), 4 layers, random init, bf16, searched by `autoao.optimize` on one
decode step's input (1 token) with the default judge (accuracy=None, 1-point budget) and the
given time budget. Then, independently of autoao's judges: the returned model's top-1 agreement
with an untouched copy on 256 fresh held-out positions (the model's own samples of a seed no judge
used), next to the noise floor (the untouched model run in float32 against itself in bf16); and
greedy generation from 16 prompts x 16 new tokens with the KV cache: tokens matching the untouched
model, next to the float32 twin's.

--part stack: the llama8 stack (benchmarks/llama_stack.py, 8 layers) at M=1 with a 120 s budget on a
cold cache and the default judge (does it ship a plan, or say which stage took the time?); then at
M=1 and M=2048 a speed search (max_accuracy_drop=1.0), whose reported speed-up is compared with an
independent harness: a second stack with the same weights and the plan applied from plan.json,
each model torch.compile'd and captured as one CUDA graph, replayed back to back in blocks of 20
with CUDA events, blocks of the two models interleaved (10 each); speed-up = median block time of
bf16 / of the plan.

Writes DIR/<part>.json, a row at a time (a failure loses only its row); each run's own files
(summary.json, plan.json, report.html; not its saved model) are copied to DIR/<run>/.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_stack  # noqa: E402

import autoao  # noqa: E402
from autoao.evaluators.generation import greedy  # noqa: E402
from autoao.evaluators.heldout import model_samples  # noqa: E402
from autoao.evaluators.sensitivity import upcast  # noqa: E402

DECODE_SHAPES = {
    "llama": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                  num_key_value_heads=8),
    "qwen2": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                  num_key_value_heads=4),
}


RUNS = Path("/tmp/verdicts-runs")  # optimize's out_dir: its saved model stays on the machine


def keep(run: Path, dest: Path) -> None:
    """A run's small files (no model weights) into the results folder."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "plan.json", "context.json", "report.html"):
        if (run / name).is_file():
            (dest / name).write_bytes((run / name).read_bytes())


def record(out: Path, part: str, row: dict) -> None:
    path = out / f"{part}.json"
    rows = json.loads(path.read_text()) if path.is_file() else []
    rows.append(row)
    path.write_text(json.dumps(rows, indent=1, default=str))
    print(json.dumps(row, default=str), flush=True)


def logits(model, ids):
    out = model(ids)
    return getattr(out, "logits", out)


def agreement(model, reference, ids: list[torch.Tensor]) -> tuple[float, int]:
    agree = total = 0
    with torch.no_grad():
        for x in ids:
            a, b = logits(model, x).argmax(-1), logits(reference, x).argmax(-1)
            agree, total = agree + int((a == b).sum()), total + a.numel()
    return agree / total, total


TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def decode_part(out: Path, budget: str, device: str = "cuda", tiny: bool = False) -> None:
    import transformers

    for arch, shape in DECODE_SHAPES.items():
        shape = TINY if tiny else shape
        try:
            torch.manual_seed(0)
            cfg_cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
            cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
            cfg = cfg_cls(num_hidden_layers=4, max_position_embeddings=4096, **shape)
            with torch.device(device):
                model = cls(cfg).to(torch.bfloat16).eval()
            untouched = copy.deepcopy(model)
            t0 = time.perf_counter()
            res = autoao.optimize(model, (torch.tensor([[17]], device=device),), budget=budget,
                                  out_dir=RUNS / f"decode-{arch}", progress=True)
            keep(RUNS / f"decode-{arch}", out / f"decode-{arch}")
            seconds = time.perf_counter() - t0
            s = res.summary
            ids = model_samples(untouched, n_seqs=4, seq_len=64, seed=4242)  # 256 fresh positions
            plan_agree, n = agreement(res.model, untouched, ids)
            with upcast(untouched):
                twin_logits = [logits(untouched, x).argmax(-1) for x in ids]
            bf16_logits = [logits(untouched, x).argmax(-1) for x in ids]
            floor = sum(int((a == b).sum()) for a, b in zip(twin_logits, bf16_logits)) / n
            prompts = torch.cat([x[:, :16] for x in model_samples(untouched, n_seqs=16, seq_len=16, seed=77)])
            ref = greedy(untouched, prompts, 16)
            mine = greedy(res.model, prompts, 16)
            with upcast(untouched):
                twin = greedy(untouched, prompts, 16)
            record(out, "decode", {
                "model": arch, "budget": budget, "seconds": round(seconds, 1), "plan": res.plan.summary(),
                "speedup": s.speedup.measured, "speedup_bound": s.speedup_bound, "rounds": s.rounds,
                "verdicts": [v.describe() for v in s.verdicts], "decisions": s.notes,
                "agreement_256": plan_agree, "floor_256": floor, "positions": n,
                "greedy_match": int((mine == ref).sum()), "greedy_twin_match": int((twin == ref).sum()),
                "greedy_tokens": ref.numel(), "stages": [(x.name, x.spent_s, x.planned_s) for x in s.stages]})
            del model, untouched, res
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - one model failing must not lose the other's row
            record(out, "decode", {"model": arch, "error": traceback.format_exc()})


def harness(plan_path: Path, tokens: int, blocks: int = 10, per_block: int = 20) -> dict:
    """The independent measurement (module docstring)."""
    base = llama_stack.build(llama_stack.LlamaShape(), device="cuda").requires_grad_(False)
    planned = llama_stack.build(llama_stack.LlamaShape(), device="cuda").requires_grad_(False)
    autoao.apply(planned, autoao.Plan.load(plan_path))
    x = torch.randint(0, 128256, (1, tokens), device="cuda")
    graphs = []
    for model in (base, planned):
        torch._dynamo.reset()
        fn = torch.compile(model)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):
                fn(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            fn(x)
        graphs.append(g)
    times: list[list[float]] = [[], []]
    for _ in range(blocks):
        for i, g in enumerate(graphs):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(per_block):
                g.replay()
            b.record()
            torch.cuda.synchronize()
            times[i].append(a.elapsed_time(b) / per_block)
    ratios = [t0 / t1 for t0, t1 in zip(*times)]
    return {"bf16_ms": statistics.median(times[0]), "plan_ms": statistics.median(times[1]),
            "speedup": statistics.median(times[0]) / statistics.median(times[1]),
            "block_ratios": [round(r, 3) for r in ratios]}


def stack_part(out: Path) -> None:
    runs = [("m1-120s-default", 1, "120s", 0.01), ("m1-speed", 1, "60", 1.0), ("m2048-speed", 2048, "40", 1.0)]
    for name, tokens, budget, drop in runs:
        try:
            model = llama_stack.build(llama_stack.LlamaShape(), device="cuda").requires_grad_(False)
            x = torch.randint(0, 128256, (1, tokens), device="cuda")
            t0 = time.perf_counter()
            res = autoao.optimize(model, x, budget=budget, max_accuracy_drop=drop, out_dir=RUNS / name, progress=True)
            keep(RUNS / name, out / name)
            s = res.summary
            row = {"run": name, "tokens": tokens, "budget": budget, "max_drop": drop,
                   "seconds": round(time.perf_counter() - t0, 1), "plan": res.plan.summary(),
                   "speedup": s.speedup.measured, "speedup_bound": s.speedup_bound, "rounds": s.rounds,
                   "verdicts": [v.describe() for v in s.verdicts], "decisions": s.notes,
                   "stages": [(x.name, x.spent_s, x.planned_s) for x in s.stages]}
            del model, res
            torch.cuda.empty_cache()
            if row["plan"] and drop == 1.0:
                row["harness"] = harness(RUNS / name / "plan.json", tokens)
                row["reported_over_harness"] = row["speedup"] / row["harness"]["speedup"]
            record(out, "stack", row)
        except Exception:  # noqa: BLE001
            record(out, "stack", {"run": name, "error": traceback.format_exc()})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--part", choices=["decode", "stack"], required=True)
    p.add_argument("--budget", default="2m", help="decode part: optimize's time budget")
    p.add_argument("--cpu-smoke", action="store_true", help="decode part on the CPU with tiny shapes (a check of this script)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}",
          flush=True)
    if args.part == "decode":
        decode_part(out, args.budget, "cpu" if args.cpu_smoke else "cuda", tiny=args.cpu_smoke)
    else:
        stack_part(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
