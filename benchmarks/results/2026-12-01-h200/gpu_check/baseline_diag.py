"""Validation diagnostic (not project code): is finalize()'s bf16 baseline (reps=5 right after a
fresh compile, after apply+restore) slower than the start's (reps=30)? Same calls as
stages.measure_examples / interleaved, on llama8 M=1."""
import sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import llama_stack  # noqa: E402
import autoao  # noqa: E402
from autoao import search_space  # noqa: E402
from autoao.plan import set_module  # noqa: E402
from autoao.profile import profile  # noqa: E402
from autoao.evaluators.timing import measure_model  # noqa: E402

dev = torch.device("cuda")
shape = llama_stack.LlamaShape()
base = llama_stack.build(shape, device=dev).requires_grad_(False)
x = torch.randint(0, shape.vocab, (1, 1), device=dev)


def m(tag, reps):
    torch._dynamo.reset()
    t = measure_model(base, x, compile=True, reps=reps)
    print(f"{tag:28s} reps={str(reps):4s} median {t.median_us / 1e3:.3f} ms  p20-p80 {t.p20_us / 1e3:.3f}-"
          f"{t.p80_us / 1e3:.3f}  n={t.reps}", flush=True)


m("bf16 fresh", None)
m("bf16 fresh", 5)
orig = {f: base.get_submodule(f) for f, mod in base.named_modules() if isinstance(mod, torch.nn.Linear)}
plan = autoao.Plan.uniform(base, search_space.get("int4_wo(group_size=128)"))
plan.kernels = {f: "cuda" for f in plan.layers}
plan.fuse(profile(base, x, max_sample_rows=0).siblings)
autoao.apply(base, plan)
applied = {f: base.get_submodule(f) for f in plan.layers}
for f in applied:
    set_module(base, f, orig[f])
m("bf16 after apply+restore", 5)
m("bf16 after apply+restore", None)
for f, mod in applied.items():
    set_module(base, f, mod)
m("plan int4 g128 cuda fused", 5)
m("plan int4 g128 cuda fused", None)
