"""End to end: bf16 (eager, compiled), every uniform autoao plan, autoao's searched plan and torchao's
autoquant on Llama-shaped stacks with random weights (speed only).

    source benchmarks/device_env.sh; python3 benchmarks/e2e.py --out $OUT [--models llama8,smollm2]
        [--tokens 1,2048,2048+32x1] [--candidates "int4_wo(group_size=128);int8_wo"] [--no-search]
        [--budget 40] [--torchao] [--only-torchao] [--no-uniform] [--kernels triton,cuda] [--profile]
        [--sample-stacks]
    python benchmarks/e2e.py --cpu-smoke --out /tmp/e2e_smoke    # tiny model on the CPU, no torchao

Every row runs input tokens [1, M] through autoao's measure_model (CUDA: graph replay, L2 flushed
before each repeat; median and p20/p80) and records the speed-up against the *compiled* bf16 model,
the search's wall time, the bytes of the model's parameters and buffers (the tensors its kernels
read; tied storage once) and, at M=1, the fraction of the bandwidth roofline: bytes read per forward
/ measured time / peak copy bandwidth (measured at start-up). $OUT/e2e.md and $OUT/e2e.json are
rewritten after every row, so a timeout keeps what finished; a failing row is recorded, not fatal.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import datetime
import gc
import importlib.metadata
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

sys.path.insert(0, str(Path(__file__).parent / "lib"))  # the helper modules: benchmarks/lib/
import llama_stack  # noqa: E402
from bandwidth import copy_bandwidth  # noqa: E402
from stack_sampler import StackSampler  # noqa: E402

import autoao  # noqa: E402
from autoao import search_space  # noqa: E402
from autoao.kernels import cuda_int4  # noqa: E402
from autoao.profile import profile  # noqa: E402
from autoao.evaluators.timing import Timing, device_name, kernel_names, measure_model  # noqa: E402

SHAPES = {"llama8": llama_stack.LlamaShape(), "smollm2": llama_stack.LlamaShape.smollm2(),
          "tiny": llama_stack.LlamaShape.tiny()}
Row = dict[str, Any]


def weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(stored, read per forward) bytes of the model's parameters and buffers, each storage once (a
    tied lm_head and embedding count once). Unlike autoao.api.weight_bytes (the saved state) this
    counts the runtime tensors the kernels read, and looks inside tensor subclasses (torchao's
    quantized weights) at their inner tensors. `read` leaves out what only an nn.Embedding holds:
    a forward reads M of its rows, not the table."""
    size: dict[tuple, int] = {}
    read: set[tuple] = set()

    def leaves(t: torch.Tensor):
        if is_traceable_wrapper_subclass(t):
            for name in t.__tensor_flatten__()[0]:
                yield from leaves(getattr(t, name))
        elif t.numel():
            yield (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)), t.numel() * t.element_size()

    mods = list(model.modules())
    # a fused sibling group's module (kernels.FusedRows) holds the runtime tensors; it is not a submodule
    mods += [m.fused[0].module for m in mods if getattr(m, "fused", None) is not None and m.fused[1] == 0]
    for mod in mods:
        for t in [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]:
            for key, n in leaves(t):
                size[key] = n
                if not isinstance(mod, nn.Embedding):
                    read.add(key)
    return sum(size.values()), sum(size[k] for k in read)


class Report:
    """The rows so far, rewritten to out/e2e.md (one table per model) and out/e2e.json on every add."""

    def __init__(self, out: Path, header: str, start: float) -> None:
        self.out, self.header, self.start, self.rows = out, header, start, []

    def add(self, r: Row) -> None:
        r["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        self.rows.append(r)
        print(f"[{r['elapsed_s']:.0f} s] {r['model']} {self._line(r)}", flush=True)
        self._write()

    def _write(self) -> None:
        (self.out / "e2e.json").write_text(json.dumps(self.rows, indent=1))
        md = [self.header]
        for model in dict.fromkeys(r["model"] for r in self.rows):
            md += [f"\n## {model}\n", "| M | plan | median ms | p20-p80 ms | speed-up vs compiled bf16 | search s | "
                   "weights MB | roofline | notes |", "|---|---|---|---|---|---|---|---|---|"]
            md += [self._line(r) for r in self.rows if r["model"] == model]
        (self.out / "e2e.md").write_text("\n".join(md) + "\n")

    def refer(self, ctx: dict[str, Any]) -> None:
        """The speed-ups of this model and workload's rows measured before its reference row."""
        for r in self.rows:
            if (r["model"], r["m"]) == (ctx["model"], ctx["m"]) and r["ms"] and r["speedup"] is None:
                r["speedup"] = ctx["ref_us"] / (r["ms"] * 1e3) if ctx["ref_us"] else None
                print(f"{r['model']} {self._line(r)}", flush=True)
        self._write()

    @staticmethod
    def _line(r: Row) -> str:
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        notes = [r["error"] and f"**error**: {r['error']}", r["note"],
                 r["details"] and ", ".join(f"{k}: {v}" for k, v in r["details"].items())]
        notes_s = "; ".join(n for n in notes if n).replace("|", "\\|").replace("\n", " ")
        spread = "-" if r["ms"] is None else f"{r['p20_ms']:.3f}-{r['p80_ms']:.3f}"
        return (f"| {r['m']} | {r['plan']} | {f(r['ms'], '.3f')} | {spread} | {f(r['speedup'], '.2f')} | "
                f"{r['search_s']:.0f} | {f(r['weight_bytes'] and r['weight_bytes'] / 1e6, '.1f')} | "
                f"{f(r['roofline'], '.1%')} | {notes_s} |")


def measure_row(report: Report, ctx: dict[str, Any], plan: str, make: Callable[[Row], nn.Module],
                timer: Callable[[nn.Module, Row], Timing] | None = None, reference: bool = False) -> None:
    """One row: make(row) builds the model (and may fill search_s, note, details), timer(model, row)
    times it (default: compiled, CUDA graph). reference: this row's time becomes ctx["ref_us"], which
    the speed-ups divide. Any failure becomes the row's error; memory is freed afterwards."""
    torch._dynamo.reset()  # fresh compile caches: every plan's forward is the same code object
    r: Row = {"model": ctx["model"], "m": ctx["m"], "plan": plan, "ms": None, "p20_ms": None, "p80_ms": None,
              "speedup": None, "search_s": 0.0, "weight_bytes": None, "read_bytes": None, "roofline": None,
              "note": "", "details": None, "error": None}
    model = None
    try:
        model = make(r)
        r["weight_bytes"], r["read_bytes"] = weight_bytes(model)
        t = (timer or (lambda mod, _: timed(mod, ctx["inputs"], compile=True)))(model, r)
        if not t.ok:
            raise RuntimeError(t.error)
        r.update(ms=t.median_us / 1e3, p20_ms=t.p20_us / 1e3, p80_ms=t.p80_us / 1e3)
        if reference:
            ctx["ref_us"] = t.median_us
        r["speedup"] = ctx["ref_us"] / t.median_us if ctx["ref_us"] else None
        if ctx["m"] == "1":  # one decode step: the weights are read once
            r["roofline"] = r["read_bytes"] / (t.median_us * 1e-6) / ctx["bw"]
        if ctx.get("profile") and timer is None and ctx["inputs"][0][0].is_cuda:
            rows, sequence = kernel_profile(model, ctx["inputs"])
            write_profile(ctx["out"], f"{ctx['model']} M={ctx['m']} {plan}", rows, r["ms"], sequence)
    except Exception as e:  # noqa: BLE001 - one failing plan is a row, not the end of the run
        r["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    report.add(r)
    del model
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def uniform(base: nn.Module, cand: search_space.Candidate, device: torch.device, r: Row,
            kernel: str | None = None, siblings: list[tuple[str, ...]] | None = None) -> nn.Module:
    """A copy of `base` with `cand` (and its CUDA kernel `kernel`, None: the default) on every linear
    layer that supports it (Plan.uniform leaves the others in bf16 and says why; apply raises
    PlanError if the plan does not fit); with `siblings` (the profile's), each sibling group runs as
    one fused module (Plan.fuse)."""
    q = copy.deepcopy(base)
    plan = autoao.Plan.uniform(q, cand)
    if kernel is not None:
        plan.kernels = {fqn: kernel for fqn in plan.layers}
    if siblings:
        plan.fuse(siblings)
    skipped = plan.metadata.get("skipped", {})
    if not plan.layers:
        raise ValueError(f"no layer supports it: {next(iter(skipped.values()), 'no linear layers')}")
    autoao.apply(q, plan)
    notes = [f"{len(skipped)} layers left bf16 ({next(iter(skipped.values()))})" if skipped else "",
             f"emulated on {device.type}: {cand.emulated(device)}" if cand.emulated(device) else ""]
    r["note"], r["details"] = "; ".join(n for n in notes if n), plan.summary()
    if plan.fusions:
        r["details"]["fused groups"] = len(plan.fusions)
    return q


def searched(base: nn.Module, inputs: list[tuple[torch.Tensor, int]], held: list[torch.Tensor],
             budget: str | int, out: Path, tag: str, r: Row, sample: bool = False, progress: bool = False) -> nn.Module:
    """autoao.optimize on a copy for the workload (each input repeated by its call count; pure speed
    search: accuracy drop allowed up to 1); search_s = its wall time; its summary.json and
    context.json are copied to out/search_<tag>_{summary,context}.json. sample: also write where
    its wall time went (stack_sampler.py) to out/stacks_<tag>.md and .folded. progress: the run's
    progress lines (each stamped with its elapsed seconds) on stderr."""
    x = [t for t, n in inputs for _ in range(n)]
    x = x[0] if len(x) == 1 else x
    work = Path(tempfile.gettempdir()) / "autoao_e2e" / tag
    shutil.rmtree(work, ignore_errors=True)  # a fresh study, not a continuation of an earlier run's
    model = copy.deepcopy(base)
    with StackSampler() if sample else contextlib.nullcontext() as sampler:
        t0 = time.perf_counter()
        res = autoao.optimize(model, x, budget=budget, eval_inputs=held, max_accuracy_drop=1.0, out_dir=work,
                              progress=progress)
        r["search_s"] = time.perf_counter() - t0
    if sampler is not None:
        sampler.write(out / f"stacks_{tag}.md", title=f"autoao.optimize, {tag}")
    for name in ("summary", "context"):
        shutil.copy(work / f"{name}.json", out / f"search_{tag}_{name}.json")
    shutil.rmtree(work / "model", ignore_errors=True)  # the saved quantized model: GBs for llama8
    s = res.summary
    r["note"] = (f"{s.trials} trials; autoao's own check vs bf16: predicted "
                 f"{s.speedup.predicted:.2f}x, measured {s.speedup.measured:.2f}x")
    r["details"] = res.plan.summary() or {"bf16 (no change)": 0}
    if res.plan.fusions:
        r["details"]["fused groups"] = len(res.plan.fusions)
    if res.plan.kernels:  # which CUDA kernel timing chose, counted over the layers
        r["details"].update({f"kernel {k}": n for k, n in collections.Counter(res.plan.kernels.values()).items()})
    return res.model


def autoquant(base: nn.Module, inputs: list[tuple[torch.Tensor, int]], r: Row) -> nn.Module:
    """torchao 0.16's documented use: autoquant(torch.compile(model, mode="max-autotune")), then one
    call, which logs the shapes, benchmarks each layer's candidates, swaps the weights and compiles
    (manual=False: no finalize_autoquant needed). search_s = that call's wall time; details = the
    weight classes it chose, counted over the linear layers."""
    import torchao

    t0 = time.perf_counter()
    model = torchao.autoquant(torch.compile(copy.deepcopy(base), mode="max-autotune"))
    with torch.no_grad():  # as measure_model runs it: no recompile for grad mode later
        for x, _ in inputs:  # every shape of the workload is logged, benchmarked and compiled
            model(x)
    torch.cuda.synchronize()
    r["search_s"] = time.perf_counter() - t0
    r["details"] = dict(collections.Counter(type(mod.weight).__name__ for mod in model.modules()
                                            if isinstance(mod, nn.Linear)))
    return model


def autoquant_timer(model: nn.Module, inputs: list[tuple[torch.Tensor, int]], r: Row) -> Timing:
    """Already compiled: time it as is; max-autotune replays its own CUDA graphs, which may refuse
    capture inside ours, so fall back to timing launches (graph=False) and say so."""
    t = timed(model, inputs)
    if not t.ok:
        r["note"] = f"our CUDA graph capture failed ({t.error}): timed without it (graph=False)"
        t = timed(model, inputs, graph=False)
    return t


def parse_workload(spec: str) -> list[tuple[int, int]]:
    """"2048" -> [(2048, 1)]; "2048+32x1" (one 2048-token prefill and 32 one-token steps) ->
    [(2048, 1), (1, 32)]: (M, calls) pairs; a bad spec raises ValueError naming it."""
    out = []
    for part in spec.split("+"):
        count, _, m = part.rpartition("x")
        try:
            out.append((int(m), int(count) if count else 1))
        except ValueError:
            raise ValueError(f"bad workload {spec!r}: expected M or COUNTxM terms joined by '+', "
                             "e.g. 1, 2048 or 2048+32x1") from None
    return out


def timed(model: nn.Module, inputs: list[tuple[torch.Tensor, int]], **kw: Any) -> Timing:
    """measure_model over a workload: each distinct input timed once, times summed with its call
    count (median and p20/p80 alike); the first failure fails the whole."""
    parts = [(measure_model(model, x, **kw), n) for x, n in inputs]
    bad = next((t for t, _ in parts if not t.ok), None)
    if bad is not None:
        return bad
    return Timing(*(sum(getattr(t, f) * n for t, n in parts) for f in ("median_us", "p20_us", "p80_us")),
                  min(t.reps for t, _ in parts))


# GPU kernels that do a linear layer's work (names as the profiler shows them): cuBLAS/CUTLASS/
# cuSPARSELt GEMMs, tinygemm, torch's int8 mm, autoao's Triton GEMVs. Everything else is "rest",
# including inductor's fused kernels (named triton_*, even when a GEMV's name is in theirs) and
# flash attention (a CUTLASS template).
_LINEAR = re.compile(r"gemm|gemv|cutlass|cublas|nvjet|sm90_|cusparse|tinygemm|_int4|_per_channel|xmma|splitK", re.I)


def is_linear_kernel(name: str) -> bool:
    return not name.startswith("triton_") and "flash" not in name and bool(_LINEAR.search(name))


def kernel_profile(model: nn.Module, inputs: list[tuple[torch.Tensor, int]]
                   ) -> tuple[list[tuple[str, float, float]], list[tuple[str, float]]]:
    """GPU time per workload of each kernel of the compiled model (no CUDA graph, so launch gaps are
    not in it; kernel durations are): [(kernel name, us, launches)], longest first; and the kernels
    of the last forward of the first input in launch order, [(name, us)] (which GEMV is which
    layer: a per-layer view the totals mix up)."""
    fn = torch.compile(model)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    sequence: list[tuple[str, float]] = []
    reps = 5
    with torch.no_grad():
        for x, n in inputs:
            fn(x)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fn(x)
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.device_type != DeviceType.CUDA:  # CPU-side op records would count kernels twice
                    continue
                us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
                if us > 0:
                    totals[e.key][0] += us * n / reps
                    totals[e.key][1] += e.count * n / reps
            if not sequence:
                kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                                 key=lambda e: e.time_range.start)
                per_rep = len(kernels) // reps
                sequence = [(e.name, e.time_range.elapsed_us()) for e in kernels[-per_rep:]] if per_rep else []
    return sorted(((k, us, c) for k, (us, c) in totals.items()), key=lambda t: -t[1]), sequence


def write_profile(out: Path, title: str, rows: list[tuple[str, float, float]], measured_ms: float | None,
                  sequence: list[tuple[str, float]] | None = None) -> None:
    """Append one model's kernel breakdown to out/profile.md: linear vs rest, the top kernels, then
    (if given) one forward's kernels in launch order."""
    lin = sum(us for k, us, _ in rows if is_linear_kernel(k))
    total = sum(us for _, us, _ in rows)
    lines = [f"## {title}", "",
             f"kernel time {total / 1e3:.3f} ms = linear {lin / 1e3:.3f} ms + rest {(total - lin) / 1e3:.3f} ms"
             f" ({sum(c for _, _, c in rows):.0f} launches); measured in a CUDA graph: "
             f"{'-' if measured_ms is None else f'{measured_ms:.3f} ms'}", "",
             "| kernel | linear | us | launches |", "|---|---|---|---|"]
    lines += [f"| `{k[:90]}` | {'y' if is_linear_kernel(k) else ''} | {us:.1f} | {c:.0f} |" for k, us, c in rows[:25]]
    if sequence:
        lines += ["", "One forward in launch order:", "", "| # | kernel | linear | us |", "|---|---|---|---|"]
        lines += [f"| {i} | `{k[:70]}` | {'y' if is_linear_kernel(k) else ''} | {us:.1f} |"
                  for i, (k, us) in enumerate(sequence)]
    with open(out / "profile.md", "a") as f:
        f.write("\n".join(lines) + "\n\n")


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n")[:2]))
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama8,smollm2", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--tokens", default=None,
                    help="comma-separated workloads, each M or COUNTxM terms joined by '+' (e.g. "
                         "2048+32x1: one 2048-token prefill and 32 one-token steps); default 1,2048 "
                         "(cpu-smoke 1,8)")
    ap.add_argument("--budget", default=None, help="optimize's budget: trials (default 40) or time (5s, 2m)")
    ap.add_argument("--candidates", default=None,
                    help="';'-separated candidate names for the uniform rows (default: all)")
    ap.add_argument("--kernels", default=None,
                    help="comma-separated CUDA kernels for the uniform rows of candidates that have several "
                         "(e.g. triton,cuda for int4; default: every kernel)")
    ap.add_argument("--fuse", choices=("both", "only", "none"), default="both",
                    help="uniform rows with sibling layers (q/k/v, gate/up) fused into one module, without, "
                         "or both (default)")
    ap.add_argument("--no-search", action="store_true", help="skip the searched-plan row")
    ap.add_argument("--search-first", action="store_true",
                    help="the searched row before compiled bf16 (the search meets cold compile caches)")
    ap.add_argument("--no-uniform", action="store_true",
                    help="skip the bf16-eager and uniform-plan rows (compiled bf16 and the search only)")
    ap.add_argument("--torchao", action="store_true", help="add torchao autoquant rows")
    ap.add_argument("--only-torchao", action="store_true", help="only compiled bf16 and torchao autoquant")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU, no CUDA graphs, no torchao")
    ap.add_argument("--profile", action="store_true",
                    help="CUDA: also write each compiled row's kernel breakdown (linear vs rest, and one "
                         "forward's kernels in launch order) to $OUT/profile.md")
    ap.add_argument("--progress", action="store_true",
                    help="the search's progress lines on stderr, stamped with its elapsed seconds")
    ap.add_argument("--sample-stacks", action="store_true",
                    help="write where the search's wall time went (sampled stacks) to $OUT/stacks_<model>_m<M>.md")
    args = ap.parse_args()
    if args.cpu_smoke and (args.torchao or args.only_torchao):
        ap.error("--cpu-smoke runs without torchao")
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    models = ["tiny"] if args.cpu_smoke else args.models.split(",")
    specs = (args.tokens or ("1,8" if args.cpu_smoke else "1,2048")).split(",")
    try:
        workloads = {spec: parse_workload(spec) for spec in specs}
    except ValueError as e:
        ap.error(str(e))
    budget = args.budget or ("5s" if args.cpu_smoke else "40")
    budget = int(budget) if budget.isdigit() else budget  # a bare number is a trial count
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    bw = copy_bandwidth(device)
    opts = cuda_int4.OPTIONS  # launch options of the CUDA int4 GEMV (LaunchOptions)
    header = (f"# End-to-end latency: bf16, uniform autoao plans, searched plan"
              f"{', torchao autoquant' if args.torchao or args.only_torchao else ''}\n\n"
              f"command: python {' '.join(sys.argv)}\n\n"
              f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; "
              f"device: {device_name(device)}; torch {torch.__version__}, triton {_version('triton')}, "
              f"torchao {_version('torchao')}; peak copy bandwidth {bw / 1e9:.0f} GB/s; programmatic dependent "
              f"launch: autoao's CUDA int4 GEMV {'on' if opts.pdl else 'off'} (AUTOAO_CUDA_PDL), inductor's "
              f"kernels {'on' if torch._inductor.config.triton.enable_pdl else 'off'} (TORCHINDUCTOR_ENABLE_PDL); "
              f"the CUDA int4 GEMV prefetches {opts.prefetch_mb:g} MB of the next one's weights "
              f"(AUTOAO_CUDA_PREFETCH_MB); early weight loads {'on' if opts.early else 'off'} (AUTOAO_CUDA_EARLY)\n\n"
              f"Random weights (speed only), tokens [1, M] (M column: the workload, e.g. 2048+32x1 = one "
              f"2048-token forward + 32 one-token forwards, times summed); median of autoao's measure_model "
              f"({'CUDA graph replay, L2 flushed' if device.type == 'cuda' else 'CPU wall clock'}); "
              "speed-up vs compiled bf16; weights = parameters + buffers (tied once); roofline (M=1) = "
              "bytes read (all but embedding-only tables) / median time / peak copy bandwidth.")
    print(header, flush=True)
    report = Report(out, header, start)
    for name in models:
        shape = SHAPES[name]
        base = llama_stack.build(shape, device=device).requires_grad_(False)
        gen = torch.Generator(device=device).manual_seed(1)
        for spec, workload in workloads.items():
            inputs = [(torch.randint(0, shape.vocab, (1, m), device=device, generator=gen), n) for m, n in workload]
            held = [torch.randint(0, shape.vocab, (1, 256), device=device, generator=gen)]
            ctx: dict[str, Any] = {"model": name, "m": spec, "inputs": inputs, "bw": bw, "ref_us": None,
                                   "profile": args.profile, "out": out}
            tag = f"{name}_m{spec.replace('+', '_')}"
            if args.search_first:  # the search meets caches as cold as a fresh machine's; its speed-up after
                measure_row(report, ctx, "searched (autoao.optimize)",
                            lambda r: searched(base, inputs, held, budget, out, tag, r, args.sample_stacks, args.progress))
            measure_row(report, ctx, "bf16 compiled", lambda r: base, reference=True)
            if args.search_first:
                report.refer(ctx)
            if not args.only_torchao:
                if not args.no_uniform:
                    measure_row(report, ctx, "bf16 eager", lambda r: base, lambda mod, r: timed(mod, inputs))
                cands = ([] if args.no_uniform else [search_space.get(c) for c in args.candidates.split(";")]
                         if args.candidates else search_space.all_candidates())
                siblings = profile(base, inputs[0][0], max_sample_rows=0).siblings
                fusing = {"both": (False, True), "only": (True,), "none": (False,)}[args.fuse]
                for cand in cands:
                    for kern in kernel_names(cand, device):  # each CUDA kernel of the candidate
                        if args.kernels and kern is not None and kern not in args.kernels.split(","):
                            continue
                        for fuse in fusing if cand.fusable else (False,):
                            label = f"uniform {cand.name}" + (f"@{kern}" if kern else "") + (" +fused" if fuse else "")
                            measure_row(report, ctx, label, lambda r, c=cand, k=kern, f=fuse:
                                        uniform(base, c, device, r, k, siblings if f else None))
                if not args.no_search and not args.search_first:
                    measure_row(report, ctx, "searched (autoao.optimize)",
                                lambda r: searched(base, inputs, held, budget, out, tag, r, args.sample_stacks, args.progress))
            if args.torchao or args.only_torchao:
                # autoquant sets global inductor options (coordinate descent tuning, ...): undo them after
                saved, precision = torch._inductor.config.get_config_copy(), torch.get_float32_matmul_precision()
                try:
                    measure_row(report, ctx, "torchao autoquant (max-autotune)", lambda r: autoquant(base, inputs, r),
                                lambda mod, r: autoquant_timer(mod, inputs, r))
                finally:
                    torch._inductor.config.load_config(saved)
                    torch.set_float32_matmul_precision(precision)
        base = None  # free the model before the next one is built (the rows above hold no reference)
        gc.collect()
    print(f"done in {time.perf_counter() - start:.0f} s: {out}/e2e.md, {out}/e2e.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
