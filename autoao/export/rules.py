"""The serving engines' rules that both the plan checks (targets.py) and the checks of a written
compressed-tensors config (compressed_tensors.py) apply: which sibling layers an engine fuses, and
the shapes and group sizes vLLM's Marlin weight-only kernels take (from vLLM's loader and its
GPTQ_MARLIN_MIN_THREAD_K / _N)."""

from __future__ import annotations

# vLLM's packed_modules_mapping for llama-like models: the fused module -> its shards' names
FUSED = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))
MARLIN_K, MARLIN_N = 128, 64
MARLIN_GROUPS = (None, -1, 32, 64, 128)


def marlin_reason(k: int, n: int, group_size: int | None) -> str | None:
    """Why vLLM's Marlin cannot run a weight-only int layer of K inputs and N outputs, or None."""
    if k % MARLIN_K:
        return f"K={k} is not a multiple of {MARLIN_K} (vLLM's Marlin weight-only kernels need it)"
    if n % MARLIN_N:
        return f"N={n} is not a multiple of {MARLIN_N} (vLLM's Marlin weight-only kernels need it)"
    if group_size not in MARLIN_GROUPS:
        return f"group size {group_size} is not one Marlin runs (32, 64, 128 or per channel)"
    return None


def fused_groups(names: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(fused name, present shards) for each parent module that has two or more of a FUSED group's
    shards among `names`, e.g. ("model.layers.0.self_attn.qkv_proj", (q, k, v FQNs))."""
    present = set(names)
    out = []
    for parent in dict.fromkeys(n.rpartition(".")[0] for n in names):
        for fused, shards in FUSED:
            members = tuple(f"{parent}.{s}" if parent else s for s in shards)
            found = tuple(m for m in members if m in present)
            if len(found) >= 2:
                out.append((f"{parent}.{fused}" if parent else fused, found))
    return out
