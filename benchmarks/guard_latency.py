"""What a compiled decode step pays before its graph runs: dynamo's guard evaluation, per call, for
SmolLM2-135M as it came and with autoao plans (uniform int8_wo, unfused and with its q/k/v and
gate/up groups fused). transformers' compiled generate() evaluates the guards once a token; a
captured CUDA graph replayed directly (autoao's own measurements) never does.

    python benchmarks/guard_latency.py --out benchmarks/results/2026-12-03-cpu/guard-latency

Each side's decode step (a static cache of 64 slots holding a 32-token prompt) is compiled by dynamo
alone (backend "eager": the guards are dynamo's, whatever the backend), and dynamo's own guard
profiler (the one behind its "Guard eval latency" log line, which flushes the CPU caches before
each evaluation) is run 5 x 200 times on the frame's locals at compile time; the best of the five
means is kept; also the same evaluation with warm caches (warm_us: 5 x 200 calls of the guard tree's
check, no flush, the best mean); --repeats compiles per side, in turn. Also the leaf guards the
tree's child managers hold (a lower bound of its guards: dict entries' own managers are not walked).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch._dynamo.guards as dynamo_guards

import autoao
import autoao.models as models
from autoao.plan import Plan
from autoao.profile import profile


def guards(manager) -> int:
    """Leaf guards in a guard tree."""
    return len(manager.get_leaf_guards()) + sum(guards(c) for c in manager.get_child_managers())


PROFILE = dynamo_guards.profile_guard_manager  # dynamo's own guard profiler, before on_each_compile


def on_each_compile(record: Callable[[Any, Any], None]) -> None:
    """Call record(guard tree, the frame's locals) for every frame dynamo compiles, from the guard
    profiler dynamo runs once per compiled frame (its log line then gets PROFILE's 5 iterations)."""
    def profiled(root, scope, n_iters):
        record(root, scope)
        return PROFILE(root, scope, 5)

    dynamo_guards.profile_guard_manager = profiled


def warm_us(root, scope) -> float:
    """Microseconds of one evaluation of the guards with warm CPU caches (no flush): best of 5 means
    of 200 calls."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            root.check(scope)
        best = min(best, (time.perf_counter() - t0) / 200 * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3, help="compiles of each side, in turn")
    args = ap.parse_args()
    import transformers

    measured: list[tuple[float, int]] = []

    def measure(root, scope) -> None:
        PROFILE(root, scope, 50)
        measured.append((min(PROFILE(root, scope, 200) for _ in range(5)), guards(root), warm_us(root, scope)))

    on_each_compile(measure)
    torch.set_num_threads(2)
    model, tok = models.load("smollm2-135m")
    model.requires_grad_(False)
    prompt = models.text_inputs(tok, seq_len=32, n_seqs=1)[0]
    siblings = profile(model, [prompt]).siblings
    sides = {"as it came": lambda: model,
             "uniform int8_wo": lambda: autoao.apply(copy.deepcopy(model), Plan.uniform(model, "int8_wo")),
             "uniform int8_wo, siblings fused": lambda: autoao.apply(
                 copy.deepcopy(model), Plan.uniform(model, "int8_wo").fuse(siblings))}
    rows: dict[str, dict[str, list]] = {name: {"guard_eval_us": [], "guards": [], "warm_us": []} for name in sides}
    for name, make in [item for _ in range(args.repeats) for item in sides.items()]:
        m = make()
        torch._dynamo.reset()
        cache = transformers.StaticCache(config=m.config, max_cache_len=64)
        with torch.no_grad():
            token = m(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            torch.compile(m, backend="eager", dynamic=False)(input_ids=token, past_key_values=cache, use_cache=True,
                                                              cache_position=torch.tensor([32]))
        us, count, warm = measured[-1]
        rows[name]["guard_eval_us"].append(us)
        rows[name]["guards"].append(count)
        rows[name]["warm_us"].append(warm)
        print(name, f"{us:.1f} us, {warm:.1f} us warm, {count} leaf guards", flush=True)
    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
              "transformers": transformers.__version__, "machine": platform.processor() or platform.machine(),
              "threads": 2, "sides": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "guard_latency.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
