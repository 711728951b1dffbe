"""Per-call host cost of autoao's QuantizedLinear forward, one process = one side (before/after).

For each variant (the model as it came; int8_wo and int8_dyn plans, unfused and with q/k/v fused) on
a stack of LAYERS attention blocks (q/k/v/o 64 -> 64/32/32/64, bf16, one token [1, 1, 64]):
  guards     leaf guards of the compiled step's guard tree (backend "eager")
  warm_us    one evaluation of that guard tree, warm caches (best mean of 5 x 300 checks)
  comp_us    one call of the compiled step (backend "eager": guards + dynamo's frame + the graph's ops)
  eager_us   one eager call (torch.no_grad), best mean of 5 x 300 calls
Writes one JSON line to stdout.
"""
from __future__ import annotations

import json
import sys
import time

import torch
import torch._dynamo.guards as dynamo_guards
from torch import nn

import autoao
from autoao import search_space
from autoao.plan import Plan, fuse_layers

LAYERS = 8
QKV = ("q_proj", "k_proj", "v_proj")


class Attn(nn.Module):
    def __init__(self, dim: int = 64, kv: int = 32) -> None:
        super().__init__()
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv, bias=False)
        self.v_proj = nn.Linear(dim, kv, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):  # x: [B, T, dim]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return x + self.o_proj(q + torch.cat([k, v], -1))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Attn() for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build(cand: str | None, fused: bool) -> nn.Module:
    torch.manual_seed(0)
    model = Stack().to(torch.bfloat16).to(DEVICE)
    if cand is None:
        return model
    fqns = [f"layers.{i}.{p}" for i in range(LAYERS) for p in (*QKV, "o_proj")]
    autoao.apply(model, Plan.for_model(model, {f: search_space.get(cand) for f in fqns}))
    if fused:
        fuse_layers(model, [tuple(f"layers.{i}.{p}" for p in QKV) for i in range(LAYERS)])
    return model


DEVICE = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def best_mean_us(fn, n: int = 300, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def leaf_guards(manager) -> int:
    return len(manager.get_leaf_guards()) + sum(leaf_guards(c) for c in manager.get_child_managers())


def measure(cand: str | None, fused: bool) -> dict:
    model = build(cand, fused)
    x = torch.randn(1, 1, 64, dtype=torch.bfloat16, device=DEVICE)
    seen = []
    original = dynamo_guards.profile_guard_manager

    def hook(root, scope, n_iters):
        seen.append((leaf_guards(root), best_mean_us(lambda: root.check(scope))))
        return original(root, scope, n_iters)

    dynamo_guards.profile_guard_manager = hook
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
        assert torch.equal(want, got)
        comp = best_mean_us(lambda: compiled(x))
        eager = best_mean_us(lambda: model(x))
    dynamo_guards.profile_guard_manager = original
    assert len(seen) == 1, seen
    return {"guards": seen[0][0], "warm_us": seen[0][1], "comp_us": comp, "eager_us": eager}


def main() -> None:
    torch.set_num_threads(1)
    side = sys.argv[1]
    out = {"side": side, "torch": torch.__version__, "device": str(DEVICE)}
    for name, cand, fused in [("as_came", None, False), ("int8_wo", "int8_wo", False),
                              ("int8_wo_fused", "int8_wo", True), ("int8_dyn", "int8_dyn", False),
                              ("int8_dyn_fused", "int8_dyn", True)]:
        try:
            out[name] = measure(cand, fused)
        except Exception as e:  # one variant failing is a row
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
