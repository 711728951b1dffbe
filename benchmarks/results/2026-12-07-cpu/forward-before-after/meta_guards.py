"""Guard evaluation of a compiled step off the host: forward_bench's stack built on the CPU, moved
to "meta" (which stands in for a GPU: weight-only modules run the packed parameter's traced reader),
compiled (backend "eager", fullgraph) and called once; then one evaluation of its guard tree, warm
(best mean of 5 x 300). One JSON line: variant -> {guards, warm_us}."""
from __future__ import annotations

import json
import sys

import torch
import torch._dynamo.guards as dynamo_guards

sys.argv = [sys.argv[0], sys.argv[1], "cpu"]
import forward_bench as fb  # noqa: E402


def measure(cand: str, fused: bool) -> dict:
    model = fb.build(cand, fused).to("meta")
    x = torch.randn(1, 1, 64, dtype=torch.bfloat16, device="meta")
    seen = []
    original = dynamo_guards.profile_guard_manager

    def hook(root, scope, n_iters):
        seen.append((fb.leaf_guards(root), fb.best_mean_us(lambda: root.check(scope))))
        return original(root, scope, n_iters)

    dynamo_guards.profile_guard_manager = hook
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend="eager", fullgraph=True)(x)
    finally:
        dynamo_guards.profile_guard_manager = original
    assert len(seen) == 1, seen
    return {"guards": seen[0][0], "warm_us": seen[0][1]}


def main() -> None:
    torch.set_num_threads(1)
    out = {"side": sys.argv[1], "torch": torch.__version__, "device": "meta"}
    for cand in ("int8_wo", "fp8_wo", "int8_dyn"):
        for fused in (False, True):
            name = cand + ("_fused" if fused else "")
            try:
                out[name] = measure(cand, fused)
            except Exception as e:  # one variant failing is a row
                out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
