"""Run from the repository root: python benchmarks/results/2026-12-02-xeon/smoothquant-tensor/probe.py "int8_dyn(act=tensor);int8_dyn(act=tensor, algorithm=smoothquant)" (14:43 UTC, ~4 min; writes /tmp/x/sq_probe.json, kept here as result.json).
Uniform int8_dyn(act=tensor) with and without SmoothQuant on SmolLM2: autoao_facts and speed vs quantize_dynamic."""
import sys, time, copy, json, statistics, torch
from torch import nn
sys.path.insert(0, "benchmarks")
from cpu_bench import demo, workload, demo_timings, timed_plan
import autoao
from autoao.common import cache_dir
from autoao.profile import profile
from autoao.evaluators import lmeval
bf16, tok, ids, shapes = demo()
examples = [ids] + [ids[:, i:i+1] for i in range(32)]
prof = profile(bf16, examples)
names = sys.argv[1].split(";")
table = demo_timings(shapes, names, 120, cache=cache_dir() / "timings.sqlite")
variants = {"bf16": bf16}
fp32 = copy.deepcopy(bf16).float()
qd = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32), {nn.Linear}, dtype=torch.qint8)
qd.config.tie_word_embeddings = False
variants["qd"] = qd
for name in names:
    plan = timed_plan(bf16, name, table, shapes)
    variants[name] = autoao.apply(copy.deepcopy(bf16), plan, calibration=prof.calibration)
for m in variants.values(): workload(m, ids)
res = {v: [] for v in variants}
for r in range(4):
    for v, m in variants.items():
        t = time.perf_counter(); workload(m, ids); res[v].append((time.perf_counter() - t) * 1e3)
out = {}
for v in variants:
    paired = [b / x for b, x in zip(res["bf16"], res[v])]
    out[v] = {"ms": [round(x) for x in res[v]], "speedup_median": round(statistics.median(paired), 3)}
    print(v, out[v], flush=True)
for v, m in variants.items():
    if v == "bf16" and len(sys.argv) > 2: continue
    r = lmeval.evaluate(m, tok, ["autoao_facts"], batch_size=8)
    out[v]["facts"] = r.metrics["autoao_facts"]["acc"]
    print(v, "facts", out[v]["facts"], flush=True)
json.dump(out, open("/tmp/x/sq_probe.json", "w"), indent=1)
