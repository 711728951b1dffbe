"""What a candidate costs in accuracy, in three tiers; every number says which tier made it.

- Tier 0, per (layer, candidate): SQNR (dB) of the layer's output against the original layer, on the
  real activations the profiler sampled. Cheap (one small matmul each), additive-ish, used to warm
  start the search and to explain choices. Higher is better. Calibrated algorithms (GPTQ, AWQ,
  SmoothQuant, HQQ) are fitted on part of the sample and every candidate is measured on the rows
  held out from that fit (heldout_split), so a fit is not scored on the rows it fitted.
- Tier 1, per plan: a fast proxy on held-out inputs, against the unquantized model's outputs. For a
  causal LM (integer token inputs, [B, T, V] logits): next-token accuracy on the held-out text
  (`accuracy`), KL(reference || plan) per token, loss; the accuracy *drop* is reference accuracy
  minus plan accuracy, in the same units as lm-eval's `acc`. For any other model: relative L2 error
  of the outputs (`drop` = that error).
- Tier 2, per plan: lm-eval tasks (autoao.evaluators.lmeval), or the user's callable(model) -> float.

Tier 0 and tier 1 results are cached on disk (evaluators.cache.ResultCache), keyed by the digest of
the weights, the data and the candidate / plan, so a re-run of the same search re-measures nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from autoao.evaluators.cache import ResultCache, digest
from autoao.kernels._base import canonical_on_device
from autoao.profile import ModelProfile, call_model
from autoao.search_space import Candidate


@dataclass(frozen=True)
class Accuracy:
    """One accuracy measurement of a plan, with its provenance."""

    tier: int  # 1: proxy, 2: lm-eval / user metric
    accuracy: float  # higher is better (tier 1 LM: next-token accuracy; tier 2: the task metric)
    drop: float  # baseline accuracy minus this (what max_accuracy_drop bounds)
    metrics: dict[str, float]  # everything measured, e.g. {"kl": ..., "loss": ...}
    source: str  # "proxy: next-token accuracy on 1024 held-out tokens", "lm-eval: autoao_facts acc", ...


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
        linear = model.get_submodule(lay.fqn)
        device = linear.weight.device
        rows = lay.stats.sample.shape[0]
        split = heldout_split(rows)
        x = lay.stats.sample[split if split < rows else 0:].to(device)  # [S', K] real activations, held out
        fit_stats = lay.stats.subset(slice(0, split)) if split < rows else lay.stats
        key_base = digest("tier0-heldout", linear.weight, linear.bias if linear.bias is not None else 0,
                          lay.stats.sample, lay.stats.act_norm)
        with torch.no_grad():
            ref = None
            per: dict[str, float] = {}
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
        out[lay.fqn] = per
    bar.close()
    return out


##### tier 1 ####################################################################################

def _logits(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find the output tensor in a {type(output).__name__}; return a tensor, "
                    "a tuple starting with one, or an object with .logits")


def _token_ids(example: Any) -> torch.Tensor | None:
    """The [B, T] integer token ids of an LM input (tensor, first positional arg, or input_ids)."""
    t = example
    if isinstance(example, tuple) and example:
        t = example[0]
    elif isinstance(example, dict):
        t = example.get("input_ids")
    if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.dtype.is_floating_point:
        return t
    return None


class ProxyEvaluator:
    """Tier 1: compare a (quantized) model's outputs with the reference model's on held-out inputs.

    The reference outputs are computed once, at construction, from `reference` (the unquantized
    model), and kept on the CPU (log-probabilities in float32 for LMs: B*T*V*4 bytes; 1024 tokens
    of a 49k vocabulary are 200 MB). `inputs` follow autoao.profile's convention (one example or a
    list). LM mode is used when every input has [B, T] integer token ids and the output is [B, T, V].
    """

    def __init__(self, reference: nn.Module, inputs: Any, *, cache: ResultCache | None = None,
                 reference_key: str | None = None) -> None:
        """reference_key: the `key` that names the reference model itself (a plan that changes no
        layer): scored as the baseline without running the model again."""
        self.inputs = inputs if isinstance(inputs, list) else [inputs]
        self.reference_key = reference_key
        if not self.inputs:
            raise ValueError("the proxy needs at least one held-out input")
        self.cache = cache
        outs = self._run(reference)
        tokens = [_token_ids(ex) for ex in self.inputs]
        # LM mode needs next tokens to score: [B, T] ids with T >= 2 and [B, T, V] logits
        self.lm = all(t is not None and t.shape[1] >= 2 for t in tokens) and all(
            o.dim() == 3 and o.shape[:2] == t.shape for o, t in zip(outs, tokens))
        if self.lm:
            self.labels = [t[:, 1:].cpu() for t in tokens]  # next tokens [B, T-1]
            self.ref = [torch.log_softmax(o[:, :-1].float(), -1).cpu() for o in outs]  # [B, T-1, V]
            self.ntokens = sum(lab.numel() for lab in self.labels)
        else:
            self.ref = [o.float().cpu() for o in outs]
        self.data_digest = digest("tier1", *[o for o in self.ref])
        self.baseline = self._score(self.ref, reference_pass=True)

    def _run(self, model: nn.Module) -> list[torch.Tensor]:
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                return [_logits(call_model(model, ex)) for ex in self.inputs]
        finally:
            model.train(was)

    def _score(self, outs: list[torch.Tensor], reference_pass: bool = False) -> dict[str, float]:
        if not self.lm:
            num = sum((o.float().cpu() - r).pow(2).sum().item() for o, r in zip(outs, self.ref))
            den = sum(r.pow(2).sum().item() for r in self.ref)
            rel = math.sqrt(num / max(den, 1e-30)) if math.isfinite(num) else math.inf
            return {"rel_error": rel, "accuracy": 1.0 - rel}
        correct = kl = nll = agree = 0.0
        for o, ref, lab in zip(outs, self.ref, self.labels):
            logp = ref if reference_pass else torch.log_softmax(o[:, :-1].float(), -1).cpu()  # [B, T-1, V]
            correct += (logp.argmax(-1) == lab).sum().item()
            agree += (logp.argmax(-1) == ref.argmax(-1)).sum().item()
            nll -= logp.gather(-1, lab[..., None]).sum().item()
            kl += (ref.exp() * (ref - logp)).sum().item()  # KL(ref || plan), summed over tokens
        n = self.ntokens
        return {"accuracy": correct / n, "kl": kl / n, "loss": nll / n, "agreement": agree / n}

    def __call__(self, model: nn.Module, key: str | None = None) -> Accuracy:
        """Tier-1 accuracy of `model`; `key` (e.g. the plan's digest) enables the on-disk cache."""
        full_key = f"{self.data_digest}:{key}" if key is not None and self.cache is not None else None
        metrics = (dict(self.baseline) if key is not None and key == self.reference_key
                   else self.cache.get(full_key) if full_key else None)
        if metrics is None:
            try:
                metrics = self._score(self._run(model))
            except Exception as e:  # noqa: BLE001 - a plan that cannot run scores as useless
                metrics = {"accuracy": -math.inf, "error": f"{type(e).__name__}: {e}"}  # type: ignore[dict-item]
            if not all(math.isfinite(v) for v in metrics.values() if isinstance(v, float)):
                metrics["accuracy"] = -math.inf
            if full_key:
                self.cache.put(full_key, metrics)
        acc = metrics["accuracy"]
        what = (f"next-token accuracy on {self.ntokens} held-out tokens" if self.lm
                else "1 - relative L2 error of the outputs on held-out inputs")
        return Accuracy(1, acc, self.baseline["accuracy"] - acc,
                        {k: v for k, v in metrics.items() if isinstance(v, float)}, f"proxy: {what}")


##### tier 2 ####################################################################################

class LmEvalEvaluator:
    """Tier 2: lm-eval tasks through autoao.evaluators.lmeval; accuracy = the mean of each task's
    headline metric (acc for multiple choice; for perplexity tasks, -bits_per_byte is not an
    accuracy, so only tasks with `acc` or `acc_norm` count toward `accuracy`)."""

    HEADLINE = ("acc", "acc_norm", "exact_match")

    def __init__(self, tokenizer: Any, tasks: list[str], *, limit: int | float | None = None,
                 batch_size: int = 8, cache: ResultCache | None = None) -> None:
        from autoao.evaluators import lmeval  # lazy: lm-eval is heavy

        self.tokenizer, self.tasks, self.limit, self.batch_size, self.cache = tokenizer, tasks, limit, batch_size, cache
        self._lmeval = lmeval
        self.baseline: dict[str, float] | None = None

    def measure(self, model: nn.Module, key: str | None = None) -> dict[str, Any]:
        full_key = f"tier2:{self.tasks}:{self.limit}:{key}" if key and self.cache is not None else None
        hit = self.cache.get(full_key) if full_key else None
        if hit is not None:
            return hit
        r = self._lmeval.evaluate(model, self.tokenizer, self.tasks, limit=self.limit, batch_size=self.batch_size)
        # each task's first headline metric present (tasks with none, e.g. perplexity, do not count)
        accs = [next(m[h] for h in self.HEADLINE if h in m) for m in r.metrics.values()
                if any(h in m for h in self.HEADLINE)]
        result = {"metrics": r.metrics, "accuracy": sum(accs) / len(accs) if accs else math.nan,
                  "seconds": r.seconds, "samples": r.samples}
        if full_key:
            self.cache.put(full_key, result)
        return result

    def __call__(self, model: nn.Module, key: str | None = None) -> Accuracy:
        res = self.measure(model, key)
        if self.baseline is None:
            raise RuntimeError("set_baseline(reference_model) first")
        flat = {f"{t}/{k}": v for t, m in res["metrics"].items() for k, v in m.items()}
        return Accuracy(2, res["accuracy"], self.baseline["accuracy"] - res["accuracy"], flat,
                        f"lm-eval: {', '.join(self.tasks)}" + (f" (limit {self.limit})" if self.limit else ""))

    def set_baseline(self, reference: nn.Module, key: str | None = None) -> None:
        self.baseline = self.measure(reference, key)

    @property
    def seconds(self) -> float:
        """What the baseline's evaluation took when it ran (the same when read from the cache)."""
        return float(self.baseline["seconds"]) if self.baseline else 0.0


class CallableEvaluator:
    """Tier 2 from the user's own metric: fn(model) -> float, higher is better."""

    def __init__(self, fn: Callable[[nn.Module], float]) -> None:
        self.fn = fn
        self.baseline: float | None = None
        self.seconds = 0.0  # what scoring the unmodified model took

    def set_baseline(self, reference: nn.Module, key: str | None = None) -> None:
        """Score the unmodified model; ValueError naming the callable if it raises or does not
        return a finite number (checked before any measurement, so a broken metric costs nothing)."""
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        t0 = time.perf_counter()
        try:
            value = self.fn(reference)
        except Exception as e:  # noqa: BLE001 - the user's code: report it, with its own message
            raise ValueError(f"accuracy callable {name} raised on the unmodified model: "
                             f"{type(e).__name__}: {e}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not (
                isinstance(value, torch.Tensor) and value.numel() == 1):
            raise ValueError(f"accuracy callable {name} returned {type(value).__name__} on the unmodified model; "
                             "it must return one number (higher is better)")
        if not math.isfinite(float(value)):
            raise ValueError(f"accuracy callable {name} returned {float(value)} on the unmodified model; it must "
                             "return a finite number (higher is better)")
        self.baseline = float(value)
        self.seconds = time.perf_counter() - t0

    def __call__(self, model: nn.Module, key: str | None = None) -> Accuracy:
        value = float(self.fn(model))
        assert self.baseline is not None, "set_baseline first"
        name = getattr(self.fn, "__name__", "metric")
        return Accuracy(2, value, self.baseline - value, {name: value}, f"user metric: {name}")
