"""What one eager call of a plan's weight-only module costs the host at a prompt's rows (above the
GEMV's), next to nn.Linear: transformers' generate() runs its prefill uncompiled, so there each
module's Python and each kernel launch is host time the compiled decode steps never see.

    python benchmarks/prefill_host.py --device cuda --out $OUT/prefill-host

Sides, interleaved in each round, on SmolLM2-135M's shapes (576 -> 576, the q/k/v group 576 -> 960
as three fused members, 576 -> 49152 for the LM head) and a Llama-1B MLP's 2048 -> 8192 at --rows
rows: nn.Linear in bf16; fp8_wo's module (eagerly up to 64 rows: kernels/cuda_rows.py's kernel);
its dequantizing path's three ops (per_channel_weight_only, no module); the rows kernel alone. Per call: host us
(the loop's time before the closing synchronize: the device runs behind) and wall us. Then the
module's calls under cProfile: where its host time goes. With --launch-paths: one-row calls of
modules whose kernels launch through aten, Triton and ctypes (int4's CUDA kernel, the rows
kernel). With --plan: eager generate() of one new token (the prefill alone) on the random-init
SmolLM2 twin, as it came and with the plan, each under cProfile (where the Python time goes) and
torch.profiler (aten ops by host time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from generate_bench import generate, plan_sides, synthetic_model  # noqa: E402
from host_overhead import per_call_us  # noqa: E402

from autoao import search_space  # noqa: E402
from autoao.kernels import cuda_rows  # noqa: E402
from autoao.kernels.weight_only import per_channel_weight_only  # noqa: E402
from autoao.kernels.fused import FusedRows  # noqa: E402
from autoao.kernels.weight_only import per_channel_weight_only  # noqa: E402


def sides(device: torch.device, rows: int) -> dict[str, object]:
    """name -> a zero-argument call."""
    torch.manual_seed(0)
    fp8 = search_space.get("fp8_wo")
    out: dict[str, object] = {}
    for k, n_out, tag in ((576, 576, "576x576"), (576, 49152, "lm_head 49152x576"), (2048, 8192, "1B gate 8192x2048")):
        x = torch.randn(1, rows, k, dtype=torch.bfloat16, device=device)
        lin = nn.Linear(k, n_out, bias=False).to(device, torch.bfloat16)
        mod = fp8.build(lin)
        w_q, w_s = mod.w_q, mod.w_scale
        out[f"{tag}: nn.Linear"] = lambda lin=lin, x=x: lin(x)
        out[f"{tag}: fp8_wo module"] = lambda mod=mod, x=x: mod(x)
        out[f"{tag}: fp8_wo dequantizing ops"] = \
            lambda w_q=w_q, w_s=w_s, x=x: per_channel_weight_only(x, w_q, w_s, False)
        if device.type == "cuda":
            out[f"{tag}: the rows kernel alone"] = lambda w_q=w_q, w_s=w_s, x=x: cuda_rows.rows_linear(x, w_q, w_s)
    x = torch.randn(1, rows, 576, dtype=torch.bfloat16, device=device)
    lins = [nn.Linear(576, n, bias=False).to(device, torch.bfloat16) for n in (576, 192, 192)]
    members = [fp8.build(lin) for lin in lins]
    FusedRows(members)
    out["q/k/v: three nn.Linear"] = lambda: [lin(x) for lin in lins]
    out["q/k/v: three fused fp8_wo members"] = lambda: [m(x) for m in members]
    return out


def launch_sides(device: torch.device) -> dict[str, object]:
    """--launch-paths: one row (a decode step's), eagerly, on 576x576 and the LM head's 49152x576:
    what each way of launching a kernel costs the host, and (wall us, the LM head) the device:
    aten's (nn.Linear), Triton's Python launcher (the fp8 and int4_wo GEMVs) and a compiled kernel
    called through ctypes (int4_wo's "cuda" kernel and the rows kernel, which an eager fp8_wo module
    runs, built with nvcc; CUDA only)."""
    torch.manual_seed(0)
    out: dict[str, object] = {}
    for n_out, tag in ((576, "576x576"), (49152, "lm_head")):
        lin = nn.Linear(576, n_out, bias=False).to(device, torch.bfloat16)
        x = torch.randn(1, 1, 576, dtype=torch.bfloat16, device=device)
        fp8 = search_space.get("fp8_wo").build(lin)
        mods = {"nn.Linear": lin, "fp8_wo (eagerly: the rows kernel where built)": fp8}
        if device.type == "cuda":
            out[f"1 row, {tag}: fp8 Triton GEMV alone"] = \
                lambda x=x, w_q=fp8.w_q, w_s=fp8.w_scale: per_channel_weight_only(x, w_q, w_s, True)
            int4 = search_space.get("int4_wo", group_size=64)  # K = 576: 9 groups of 64
            mods["int4_wo g64 (Triton GEMV)"] = int4.build(lin).set_kernel("triton")
            mods["int4_wo g64 (CUDA kernel through ctypes)"] = int4.build(lin).set_kernel("cuda")
            out[f"1 row, {tag}: fp8 rows kernel alone (ctypes)"] = \
                lambda x=x, w_q=fp8.w_q, w_s=fp8.w_scale: cuda_rows.rows_linear(x, w_q, w_s)
        out.update({f"1 row, {tag}: {k}": (lambda m=m, x=x: m(x)) for k, m in mods.items()})
    return out


def generate_profiles(plan: Path, device: torch.device, calls: int) -> list[str]:
    """Markdown: per side, `calls` eager one-token generate()s under cProfile (top 25 by own time)
    and one under torch.profiler (top 25 ops by host time)."""
    from torch.profiler import ProfilerActivity, profile

    base = synthetic_model("smollm2-135m", device)
    config = base.config
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, config.vocab_size, (1, 32), generator=gen).to(device)
    models = {"as it came": base, **plan_sides(base, [("the plan", plan)], lambda: [
        torch.randint(0, config.vocab_size, (1, 256), generator=gen).to(device) for _ in range(4)])}
    lines = []
    for name, m in models.items():
        for _ in range(3):
            generate(m, ids, 1, "eager")
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.runcall(lambda: [generate(m, ids, 1, "eager") for _ in range(calls)])
        ms = (time.perf_counter() - t0) / calls * 1e3
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            generate(m, ids, 1, "eager")
        table = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        lines += [f"## {name}: {ms:.1f} ms a generate() under cProfile", "", "```", text.getvalue().strip(), "```",
                  "", "```", table.strip(), "```", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=32, help="the prompt's tokens")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000, help="calls a side per round")
    ap.add_argument("--plan", type=Path, help="also profile eager one-token generate() with this plan.json")
    ap.add_argument("--launch-paths", action="store_true", help="also one-row calls: aten, Triton and ctypes launches")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    calls = {**sides(device, args.rows), **(launch_sides(device) if args.launch_paths else {})}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, fn in calls.items():
                got[name].append(per_call_us(fn, args.calls, sync))
        prof = cProfile.Profile()
        module = calls["576x576: fp8_wo module"]
        prof.runcall(lambda: [module() for _ in range(args.calls)])
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    rows = {name: {"host_us": statistics.median(h for h, _ in v), "wall_us": statistics.median(w for _, w in v),
                   "host_us_range": [min(h for h, _ in v), max(h for h, _ in v)]} for name, v in got.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(["python benchmarks/prefill_host.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__, "host": platform.processor(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()}
    (args.out / "prefill_host.json").write_text(json.dumps({**meta, "rows": args.rows, "sides": rows}, indent=1))
    lines = [f"# Eager calls at {args.rows} rows: host and wall us per call (median of {args.rounds} rounds "
             f"of {args.calls})", "", f"`{meta['command']}`; {meta['date']}; {meta['device']}; torch {meta['torch']}",
             "", "| side | host us | host us range | wall us |", "|---|---|---|---|"]
    lines += [f"| {n} | {r['host_us']:.1f} | {r['host_us_range'][0]:.1f}-{r['host_us_range'][1]:.1f} | "
              f"{r['wall_us']:.1f} |" for n, r in rows.items()]
    lines += ["", "fp8_wo's 576x576 module under cProfile:", "", "```", text.getvalue().strip(), "```"]
    if args.plan:
        lines += ["", *generate_profiles(args.plan, device, max(1, args.calls // 100))]
    (args.out / "prefill_host.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6 + len(rows)]))


if __name__ == "__main__":
    main()
