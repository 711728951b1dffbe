"""CUDA check and kernel table: every candidate family correct on the GPU, and its time vs bf16.

    python benchmarks/cuda_check.py --out benchmarks/results            # everything (H200: ~4 min)
    python benchmarks/cuda_check.py --modes graph --tokens 1,2048       # quicker

1. Environment: GPU, compute capability, torch / triton / CUDA / cuSPARSELt versions, and the two
   ceilings measured here (device-to-device copy bandwidth, bf16 matmul rate).
2. Correctness: for each candidate on each Llama-3-8B layer shape (plus a biased fp32 layer), the
   module's output against its plain-torch reference (>= 40 dB SQNR) and against the ideal float32
   product (the per-family bounds of tests/test_candidates.py), at M = 1 and 128 (and 2048 for 2:4,
   whose rows are padded); and a state_dict round trip on CUDA that must be bit-exact.
3. Timing: each (shape, candidate, M) in CUDA graphs, L2 flushed before each of 50 repeats,
   median (evaluators/timing.py), in two modes: "graph" (the eager module captured) and
   "compile" (torch.compile(fullgraph=True), then captured). Speed-up is against bf16 in the same
   mode. The roofline column is max(bytes / copy bandwidth, FLOPs / matmul rate) for this kernel's
   minimum traffic, using the ceilings measured in step 1 (bf16 rate for every dtype: a lead only).

Writes cuda_check.csv (every number), cuda_check.md (the tables) and prints the tables.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import platform
import sys
import time
from pathlib import Path

import torch

from autoao.calibration import LayerStats
from autoao import search_space
from autoao.evaluators.sensitivity import sqnr_db as sqnr
from autoao.evaluators.timing import build_layer, time_cuda, time_module
from autoao.kernels.quant import prune_24_mask
from autoao.search_space import LayerSpec

sys.path.insert(0, str(Path(__file__).parent))
from bandwidth import copy_bandwidth  # noqa: E402

LLAMA3_8B_SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]  # (N, K)
SPARSE = {"sparse24", "sparse24_int8_dyn", "sparse24_fp8"}


def weight_bytes(family: str, params: dict, n: int, k: int) -> float:
    """Minimum bytes of the weight a kernel must read (values + scales/metadata)."""
    if family == "bf16":
        return 2 * n * k
    if family in ("int8_dyn", "int8_wo", "fp8_dyn", "fp8_wo"):
        return n * k + 4 * n
    if family == "int4_wo":
        return n * k / 2 + 2 * 2 * n * k / params["group_size"]
    if family == "sparse24":
        return 2 * n * k / 2 + n * k / 8  # half the values + 2-bit indices per kept value
    return n * k / 2 + n * k / 8 + 4 * n  # sparse int8 / fp8


def measure_ceilings() -> tuple[float, float]:
    """(copy bandwidth bytes/s counting read + write, bf16 matmul FLOP/s) on random data."""
    bw = copy_bandwidth("cuda", 2 * 1024**3)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    med, *_ = time_cuda(lambda: x @ w, reps=20, graph=False, flush_l2=False)
    return bw, 2 * 8192**3 / (med * 1e-6)


def check_correctness(cands, shapes, device: str) -> list[dict]:
    rows = []
    # every shape in bf16 without bias, plus one fp32 layer with a bias
    configs = [(n, k, torch.bfloat16, False) for n, k in shapes] + [(4096, 4096, torch.float32, True)]
    for n, k, dtype, bias in configs:
        for cand in cands:
            spec = LayerSpec("", k, n, bias, dtype)
            row = dict(shape=f"{n}x{k}", dtype=str(dtype).removeprefix("torch."), candidate=cand.name)
            reason = cand.supports(spec, device)
            if reason:
                rows.append(dict(row, m="", status="unsupported", detail=reason))
                continue
            try:
                lin = torch.nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
                torch.nn.init.normal_(lin.weight, std=k ** -0.5)
                if bias:
                    torch.nn.init.normal_(lin.bias, std=0.5)
                act_norm = torch.rand(k, device=device) + 0.1
                mod = cand.build(lin, LayerStats(act_norm=act_norm))
                w = lin.weight.float()
                if cand.family in SPARSE:
                    w = w * prune_24_mask(w, act_norm)
                kerns = [kern.name for kern in cand.kernels(device)]
                for kern in kerns:
                    if kern != "default":
                        mod.set_kernel(kern)
                    krow = dict(row, candidate=f"{cand.name}@{kern}") if len(kerns) > 1 else row
                    ms = (1, 4, 128, 2048) if cand.family in SPARSE else (1, 4, 128)
                    for m in ms:
                        x = torch.randn(m, k, device=device, dtype=dtype)
                        with torch.no_grad():
                            y = mod(x)
                            ideal = x.float() @ w.t() + (lin.bias.float() if bias else 0)
                            # a bf16 layer's bf16 "candidate" is the untouched nn.Linear: its reference is F.linear
                            ref = mod.reference(x) if hasattr(mod, "reference") else ideal
                            # compiled: GEMV rows and the largest M (where dynamic quantization
                            # and the epilogue are inductor's, kernels/quant.py)
                            y_c = torch.compile(mod, fullgraph=True)(x) if m in (4, ms[-1]) else y
                        s_ref, s_ideal, s_c = sqnr(ref, y), sqnr(ideal, y), sqnr(y, y_c)
                        bound = cand.sqnr_bound_db
                        ok = (bool(torch.isfinite(y).all()) and y.dtype == dtype and s_ref >= 40
                              and s_ideal >= bound and s_c >= 40)
                        rows.append(dict(krow, m=m, status="ok" if ok else "FAIL",
                                         detail=f"SQNR vs reference {s_ref:.1f} dB, vs ideal fp32 {s_ideal:.1f} dB "
                                                f"(bound {bound}), compiled vs eager {s_c:.1f} dB"))
                    torch._dynamo.reset()
                # state_dict round trip on the device: bit-exact, on the kernel the loop left `mod`
                # on (the kernel is the plan's choice, not part of the state)
                fresh = cand.empty(spec, device)
                fresh.load_state_dict(mod.state_dict())
                if getattr(mod, "kernel", "default") != getattr(fresh, "kernel", "default"):
                    fresh.set_kernel(mod.kernel)
                x = torch.randn(5, k, device=device, dtype=dtype)
                with torch.no_grad():
                    same = torch.equal(fresh(x), mod(x))
                rows.append(dict(row, m=5, status="ok" if same else "FAIL", detail="state_dict round trip bit-exact"))
                del mod, fresh, lin
            except Exception as e:  # noqa: BLE001
                rows.append(dict(row, m="", status="FAIL", detail=f"{type(e).__name__}: {e}"))
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


FIELDS = ["shape", "candidate", "mode", "m", "median_us", "p20_us", "p80_us", "roofline_us", "error", "wall_s"]


def time_all(cands, shapes, tokens, modes, bw, flops, device: str, csv_path: Path) -> list[dict]:
    """Time everything; each row is appended to csv_path as soon as it exists (a run cut short
    still leaves its numbers)."""
    rows: list[dict] = []
    f = open(csv_path, "w", newline="")
    writer = csv.DictWriter(f, fieldnames=FIELDS)
    writer.writeheader()

    def emit(row: dict) -> None:
        rows.append(row)
        writer.writerow(row)
        f.flush()
    for n, k in shapes:
        for cand in cands:
            reason = cand.supports(LayerSpec("", k, n, False, torch.bfloat16), device)
            if reason:
                for mode in modes:
                    for m in tokens:
                        emit(dict(shape=f"{n}x{k}", candidate=cand.name, mode=mode, m=m,
                                  median_us=math.inf, p20_us=math.inf, p80_us=math.inf,
                                  roofline_us="", error=f"unsupported: {reason}", wall_s=0))
                continue
            module = build_layer(cand, k, n, torch.bfloat16, torch.device(device))
            kerns = [kern.name for kern in cand.kernels(device)]
            for kern in kerns:
                if kern != "default":
                    module.set_kernel(kern)
                label = f"{cand.name}@{kern}" if len(kerns) > 1 else cand.name
                for mode in modes:
                    torch._dynamo.reset()  # one compiled module at a time; keeps dynamo's caches small
                    fn = torch.compile(module, fullgraph=True) if mode == "compile" else module
                    for m in sorted(tokens, reverse=True):
                        t0 = time.perf_counter()
                        t = time_module(fn, m, k, torch.bfloat16, torch.device(device))
                        bytes_ = weight_bytes(cand.family, cand.params(), n, k) + 2 * m * k + 2 * m * n
                        roof = max(bytes_ / bw, 2 * m * n * k / flops) * 1e6
                        emit(dict(shape=f"{n}x{k}", candidate=label, mode=mode, m=m,
                                  median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
                                  roofline_us=round(roof, 2), error=t.error or "",
                                  wall_s=round(time.perf_counter() - t0, 2)))
                        print(f"{n}x{k:<6} {label:<36} {mode:<8} M={m:<5} {t.median_us:9.1f} us"
                              f"{'  ' + t.error if t.error else ''}", flush=True)
            del module, fn
            if device == "cuda":
                torch.cuda.empty_cache()
    f.close()
    return rows


def speedup_tables(rows: list[dict], modes, tokens) -> str:
    out = []
    base = {(r["shape"], r["mode"], r["m"]): r["median_us"] for r in rows if r["candidate"] == "bf16"}
    cands = list(dict.fromkeys(r["candidate"] for r in rows))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    for mode in modes:
        for m in tokens:
            out.append(f"\n### {mode}, M = {m}: median us (speed-up vs bf16 {mode})\n")
            out.append("| candidate | " + " | ".join(shapes) + " |")
            out.append("|---|" + "---|" * len(shapes))
            for c in cands:
                cells = []
                for s in shapes:
                    r = next(r for r in rows if r["candidate"] == c and r["shape"] == s and r["mode"] == mode
                             and r["m"] == m)
                    if not math.isfinite(r["median_us"]):
                        cells.append("n/a" if r["error"].startswith("unsupported") else "FAIL")
                    else:
                        ref = base.get((s, mode, m))  # None when bf16 was not among --candidates
                        cells.append(f"{r['median_us']:.1f}" + (f" ({ref / r['median_us']:.2f}x)" if ref else ""))
                out.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results", help="directory for cuda_check.csv / .md")
    ap.add_argument("--tokens", default="1,16,128,2048", help="comma-separated M values")
    ap.add_argument("--modes", default="graph,compile", help="graph and/or compile; 'none' skips timing")
    ap.add_argument("--candidates", default=None, help="';'-separated names (default: all)")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--shapes", default=None, help="NxK,NxK,... (default: Llama-3-8B's five)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test this script")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_check needs a CUDA GPU (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes
              else LLAMA3_8B_SHAPES)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    modes = args.modes.split(",")
    cands = ([search_space.get(c) for c in args.candidates.split(";")] if args.candidates
             else search_space.all_candidates())
    import triton

    cuda = args.device == "cuda"
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name() if cuda else platform.processor(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else "",
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
        "cusparselt": torch.backends.cusparselt.version(), "python": platform.python_version(),
        "command": " ".join(["python"] + sys.argv),
    }
    bw, flops = measure_ceilings() if cuda else (50e9, 1e12)  # CPU: placeholders, smoke test only
    env["copy_bandwidth_TBps"] = round(bw / 1e12, 2)
    env["bf16_matmul_TFLOPs"] = round(flops / 1e12, 1)
    print(env, flush=True)
    md = ["# CUDA check", "", *(f"- {k}: {v}" for k, v in env.items())]
    if not args.skip_correctness:
        t0 = time.perf_counter()
        corr = check_correctness(cands, shapes, args.device)
        fails = [r for r in corr if r["status"] == "FAIL"]
        md += ["", f"## Correctness ({len(corr)} checks, {len(fails)} failed, {time.perf_counter() - t0:.0f} s)", "",
               "| shape | dtype | candidate | M | status | detail |", "|---|---|---|---|---|---|"]
        md += [f"| {r['shape']} | {r['dtype']} | {r['candidate']} | {r['m']} | {r['status']} | {r['detail']} |"
               for r in corr]
        (out / "cuda_check_correctness.md").write_text("\n".join(md) + "\n")
        with open(out / "cuda_check_correctness.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(corr[0]))
            w.writeheader()
            w.writerows(corr)
        print(f"correctness: {len(corr)} checks, {len(fails)} failed", flush=True)
        for r in fails:
            print("FAIL", r, flush=True)
    if args.modes == "none":
        return 0
    t0 = time.perf_counter()
    rows = time_all(cands, shapes, tokens, modes, bw, flops, args.device, out / f"cuda_check_{'_'.join(modes)}.csv")
    md += ["", f"## Timing ({time.perf_counter() - t0:.0f} s)", speedup_tables(rows, modes, tokens)]
    (out / f"cuda_check_{'_'.join(modes)}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[-1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
