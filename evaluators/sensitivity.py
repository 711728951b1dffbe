"""What a candidate costs in accuracy, in three tiers; every number says which tier made it.

- Tier 0, per (layer, candidate): SQNR (dB) of the layer's output against the original layer, on the
  real activations the profiler sampled. Cheap (one small matmul each), additive-ish, used to warm
  start the search and to explain choices. Higher is better. Calibrated algorithms (GPTQ, AWQ,
  SmoothQuant, HQQ) are fitted on part of the sample and every candidate is measured on the rows
  held out from that fit (heldout_split), so a fit is not scored on the rows it fitted.
- Tier 1, per plan: a label-free proxy on held-out inputs against the unquantized model's outputs
  (evaluators.proxy, with the helpers here that read a model's outputs), and greedy generation
  for causal LMs (evaluators.generation).
- Tier 2, per plan: lm-eval tasks or the user's metric (evaluators.tier2).

Tier 0 and tier 1 results are cached on disk (evaluators.cache.ResultCache), keyed by the digest of
the weights, the data and the candidate / plan, so a re-run of the same search re-measures nothing.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Iterator

import torch
from torch import nn

from autoao.evaluators.cache import ResultCache, digest
from autoao.kernels._base import canonical_on_device
from autoao.profile import ModelProfile, call_model
from autoao.search_space import Candidate


def sqnr_db(ref: torch.Tensor, y: torch.Tensor) -> float:
    ref, y = ref.double(), y.double()
    noise = (ref - y).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if not math.isfinite(noise):
        return -math.inf
    return math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)


##### tier 0 ####################################################################################

MIN_HELD_OUT_ROWS = 8  # below 2x this many sample rows, fits and measurements share all rows


def heldout_split(rows: int) -> int:
    """Sample rows [0, split) fit the calibrated algorithms, rows [split, rows) measure every
    candidate: the last quarter (at least MIN_HELD_OUT_ROWS); all rows for both on a small sample
    (split == rows)."""
    if rows < 2 * MIN_HELD_OUT_ROWS:
        return rows
    return rows - max(MIN_HELD_OUT_ROWS, rows // 4)


def layer_errors(
    model: nn.Module,
    profile: ModelProfile,
    candidates: list[Candidate],
    *,
    cache: ResultCache | None = None,
    progress: bool = True,
    deadline: float | None = None,
) -> dict[str, dict[str, float]]:
    """Tier 0: FQN -> candidate name -> SQNR (dB) of the candidate's layer output vs the original,
    on the profiled sample rows held out from the calibrated algorithms' fits (heldout_split;
    those fits use statistics of the other rows, LayerStats.subset). Past `deadline` (a
    time.perf_counter()) only cached errors are read (the search then starts from fewer greedy
    seeds, nothing else changes). Unsupported or failing candidates are absent from a layer's
    dict; NaN/Inf outputs give -inf. Runs on the layer's device; the model is not modified."""
    from tqdm.auto import tqdm

    out: dict[str, dict[str, float]] = {}
    layers = [lay for lay in profile.layers if lay.stats.sample is not None and lay.stats.sample.shape[0] > 0]
    bar = tqdm(total=len(layers) * len(candidates), desc="layer errors (tier 0)", disable=not progress,
               leave=False, unit="kernel")
    for lay in layers:
        out[lay.fqn] = _layer_sqnr(model.get_submodule(lay.fqn), lay, candidates, cache, deadline, bar)
    bar.close()
    return out


def _layer_sqnr(linear: nn.Module, lay: Any, candidates: list[Candidate], cache: ResultCache | None,
                deadline: float | None, bar: Any) -> dict[str, float]:
    """One layer's candidate name -> SQNR (dB), as layer_errors says."""
    device = linear.weight.device
    rows = lay.stats.sample.shape[0]
    split = heldout_split(rows)
    x = lay.stats.sample[split if split < rows else 0:].to(device)  # [S', K] real activations, held out
    fit_stats = lay.stats.subset(slice(0, split)) if split < rows else lay.stats
    key_base = digest("tier0-heldout", linear.weight, linear.bias if linear.bias is not None else 0,
                      lay.stats.sample, lay.stats.act_norm)
    ref = None
    per: dict[str, float] = {}
    with torch.no_grad():
        for cand in candidates:
            bar.update(1)
            if cand.supports(lay.spec, device):
                continue
            key = f"{key_base}:{cand.name}"
            hit = cache.get(key) if cache is not None else None
            if hit is not None:
                per[cand.name] = hit["sqnr_db"]
                continue
            if deadline is not None and time.perf_counter() > deadline:
                continue
            if ref is None:
                ref = linear(x).float()
            try:
                with canonical_on_device():  # measured, then dropped: no host copy of its weights
                    q = cand.build(linear, lay.stats if cand.algorithm == "rtn" else fit_stats, fqn=lay.fqn)
                value = sqnr_db(ref, q(x).float())
            except Exception:  # noqa: BLE001 - a candidate that fails here is left out, as unsupported
                continue
            per[cand.name] = value
            if cache is not None:
                cache.put(key, {"sqnr_db": value})
    return per


##### tier 1 ####################################################################################

def output_logits(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if getattr(output, "last_hidden_state", None) is not None:  # a transformers encoder's ModelOutput
        return output.last_hidden_state
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find the output tensor in a {type(output).__name__}; return a tensor, "
                    "a tuple starting with one, or an object with .logits or .last_hidden_state")


def token_ids(example: Any) -> torch.Tensor | None:
    """The [B, T] integer token ids of an LM input (tensor, first positional arg, or input_ids)."""
    t = example
    if isinstance(example, tuple) and example:
        t = example[0]
    elif isinstance(example, dict):
        t = example.get("input_ids")
    if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.dtype.is_floating_point:
        return t
    return None


def _attention_mask(example: Any) -> torch.Tensor | None:
    t = example.get("attention_mask") if isinstance(example, dict) else None
    return t if isinstance(t, torch.Tensor) and t.dim() == 2 else None


def output_mode(outs: list[torch.Tensor], inputs: list[Any]) -> str:
    """How the proxy compares a model's outputs with the reference's, from their type:

    - "lm": [B, T] integer token ids in, [B, T, V] out with V above every id (a vocabulary's
      logits), any T >= 1;
    - "embedding": [B, D] rows of unit norm (a sentence-embedding model), or [B, T, H] hidden states
      of token ids that are not logits (a transformers encoder: mean-pooled over the attention
      mask), and at least 3 rows in all (nearest neighbours need 2 others);
    - "output": anything else (relative L2 error).
    """
    tokens = [token_ids(ex) for ex in inputs]
    if all(t is not None for t in tokens):
        if all(o.dim() == 3 and o.shape[:2] == t.shape and o.shape[-1] > int(t.max()) for o, t in zip(outs, tokens)):
            return "lm"
        hidden = all(o.dim() == 3 and o.shape[:2] == t.shape and o.is_floating_point() for o, t in zip(outs, tokens))
    else:
        hidden = False
    unit = all(o.dim() == 2 and o.is_floating_point() and o.shape[0] > 0 and
               bool(((o.float().norm(dim=-1) - 1).abs() < 1e-3).all()) for o in outs)
    rows = sum(o.shape[0] for o in outs)
    return "embedding" if (hidden or unit) and rows >= 3 else "output"


def pooled_embeddings(out: torch.Tensor, example: Any) -> torch.Tensor:
    """[B, D] unit float32 embeddings: as given, or [B, T, H] mean-pooled over the attention mask."""
    e = out.float()
    if e.dim() == 3:
        mask = _attention_mask(example)
        m = (mask if mask is not None else torch.ones(e.shape[:2], device=e.device)).to(e)[..., None]  # [B, T, 1]
        e = (e * m).sum(1) / m.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(e, dim=-1).cpu()


@contextlib.contextmanager
def upcast(model: nn.Module) -> Iterator[bool]:
    """Inside: the model's bf16 / fp16 parameters and buffers in float32 (yields whether any were);
    after: each back in its own dtype, bit-exact (every bf16 / fp16 value is a float32 value)."""
    changed: list[tuple[dict[str, Any], str, torch.dtype]] = []
    seen: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for name, t in store.items():
                if t is None or t.dtype not in (torch.bfloat16, torch.float16):
                    continue
                if id(t) not in seen:  # a tied tensor is converted once and shared again
                    seen[id(t)] = (nn.Parameter(t.data.float(), t.requires_grad) if isinstance(t, nn.Parameter)
                                   else t.float())
                changed.append((store, name, t))  # type: ignore[arg-type]
                store[name] = seen[id(t)]
    try:
        yield bool(changed)
    finally:
        for store, name, t in changed:
            store[name] = t  # the original tensor object: nothing to round back


def run_model(model: nn.Module, inputs: list[Any]) -> list[torch.Tensor]:
    """The model's output tensor on each input (autoao.profile's convention), in eval mode, no grad."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [output_logits(call_model(model, ex)) for ex in inputs]
    finally:
        model.train(was)


def nearest_rows(e: torch.Tensor) -> torch.Tensor:
    """[R] index of each row's nearest other row by cosine, for [R, D] unit rows."""
    sims = e @ e.T  # [R, R]
    sims.fill_diagonal_(-math.inf)
    return sims.argmax(-1)
