"""A throwaway check, kept as the command behind a number in ../README.md: uniform RTN and AWQ int4 g64
on the demo, applied with a profile of the demo workload and timing-chosen kernels, timed interleaved with bf16."""
import sys, time, copy, statistics, torch
sys.path.insert(0, "benchmarks")
from cpu_bench import demo, workload, demo_timings, timed_plan
from autoao.common import cache_dir
import autoao
from autoao.plan import Plan
from autoao.profile import profile
bf16, tok, ids, shapes = demo()
examples = [ids] + [ids[:, i:i+1] for i in range(32)]
prof = profile(bf16, examples)
variants = {"bf16": bf16}
table = demo_timings(shapes, ["int4_wo(group_size=64)", "int4_wo(group_size=64, algorithm=awq)"], 60, cache=cache_dir() / "timings.sqlite")
for name in ["int4_wo(group_size=64)", "int4_wo(group_size=64, algorithm=awq)"]:
    plan = timed_plan(bf16, name, table, shapes)
    t = time.perf_counter()
    variants[name] = autoao.apply(copy.deepcopy(bf16), plan, calibration=prof.calibration)
    print(name, "applied in", round(time.perf_counter() - t), "s", flush=True)
for m in variants.values(): workload(m, ids)
res = {v: [] for v in variants}
for r in range(3):
    for v, m in variants.items():
        t = time.perf_counter(); workload(m, ids); res[v].append(time.perf_counter() - t)
print({v: [round(x*1e3) for x in xs] for v, xs in res.items()})
m = variants["int4_wo(group_size=64, algorithm=awq)"]
mods = [(n, x) for n, x in m.named_modules() if hasattr(x, "_route")][:3]
for n, x in mods:
    print(n, x._route, {k: (b.dtype, tuple(b.shape), float(b.abs().min()), float(b.abs().max())) for k, b in x._buffers.items() if "scale" in k})
