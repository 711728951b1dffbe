"""What a candidate costs in accuracy, in three tiers; every number says which tier made it.

- Tier 0, per (layer, candidate): SQNR (dB) of the layer's output against the original layer, on the
  real activations the profiler sampled. Cheap (one small matmul each), additive-ish, used to warm
  start the search and to explain choices. Higher is better. Calibrated algorithms (GPTQ, AWQ,
  SmoothQuant, HQQ) are fitted on part of the sample and every candidate is measured on the rows
  held out from that fit (heldout_split), so a fit is not scored on the rows it fitted.
- Tier 1, per plan: a fast proxy on held-out inputs, against the unquantized model's outputs, with
  no labels. For a causal LM (integer token inputs, [B, T, V] logits): top-1 agreement per token
  (`accuracy`; the drop is in points of it, below the model's own numerical noise: "drops by at
  most 1 point" = 1% more tokens change their argmax than bf16 rounding alone changes), KL per
  token; for an embedding model: cosine similarity and nearest-neighbour agreement; for any other
  model: relative L2 error of the outputs (`drop` = that error).
- Tier 2, per plan: lm-eval tasks (autoao.evaluators.lmeval), or the user's callable(model) -> float.

Tier 0 and tier 1 results are cached on disk (evaluators.cache.ResultCache), keyed by the digest of
the weights, the data and the candidate / plan, so a re-run of the same search re-measures nothing.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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


def _pooled(out: torch.Tensor, example: Any) -> torch.Tensor:
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


class ProxyEvaluator:
    """Tier 1: compare a (quantized) model's outputs with the reference model's on held-out inputs.
    It needs no labels; how it compares depends on the outputs (`output_mode`):

    - causal LM: top-1 agreement with the reference, per token (the share of positions whose
      argmax token is the reference's), `accuracy`; also KL(reference || plan) per token, and where
      the inputs have T >= 2, next-token accuracy and loss on the text itself. Works on any token
      count, one token included.
    - embedding model: the mean cosine similarity of each held-out row's embedding to the
      reference's (`accuracy`; a drop of 0.01 = mean cosine 0.99), the least one, nearest-neighbour
      agreement (the share of rows whose nearest other row is the reference's: on prose, whose
      neighbours are near ties, int8_dyn on all-MiniLM-L6-v2 flips 3 of 128 while its cosine stays
      0.997 and its retrieval accuracy moves +0.5 points, too strict to bound a budget) and the
      relative L2 error.
    - anything else: 1 - relative L2 error of the outputs.

    `drop` = floor - accuracy, floor = the unchanged model's score (1.0 by definition) unless
    `calibrate` found the model's own numerical noise lower: then a plan whose outputs differ from
    the reference less than the model's own float32 outputs do is never rejected for accuracy.

    The reference outputs are computed once, at construction, from `reference` (the unquantized
    model), and kept on the CPU (log-probabilities in float32 for LMs: B*T*V*4 bytes; 1024 tokens
    of a 49k vocabulary are 200 MB). `inputs` follow autoao.profile's convention (one example or a
    list).
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
        self.mode = output_mode(outs, self.inputs)
        self.lm = self.mode == "lm"
        self.ntokens = 0
        if self.lm:
            tokens = [token_ids(ex) for ex in self.inputs]
            # next tokens [B, T-1] where there is text to score (T >= 2)
            self.labels = [t[:, 1:].cpu() if t.shape[1] >= 2 else None for t in tokens]  # type: ignore[union-attr]
            self.ref = [torch.log_softmax(o.float(), -1).cpu() for o in outs]  # [B, T, V]
            self.ntokens = sum(t.numel() for t in tokens)  # type: ignore[union-attr]
            self.nlabels = sum(lab.numel() for lab in self.labels if lab is not None)
        elif self.mode == "embedding":
            self.ref = [_pooled(o, ex) for o, ex in zip(outs, self.inputs)]  # [B, D] each
            self.ref_nn = _neighbours(torch.cat(self.ref))
        else:
            self.ref = [o.float().cpu() for o in outs]
        self.data_digest = digest("tier1", *[o for o in self.ref])
        self.baseline = self._score(self.ref, reference_pass=True)
        self.floor = self.baseline["accuracy"]
        self.noise = ""  # what calibrated the floor, for `source`

    def calibrate(self, reference: nn.Module) -> None:
        """Lower the floor to the agreement the reference model reaches with itself run in float32
        (a bf16 / fp16 model only; its weights are put back bit-exact): the noise of its own
        numerics, the size of the difference between its eager and compiled runs (measured: a
        1.2-1.3% relative logits error between eager and compiled bf16 Llama / Qwen layers on the
        H200). An fp32 model has no lower precision to compare with: its floor stays 1."""
        if self.mode != "lm":
            return
        with upcast(reference) as changed:
            if not changed:
                return
            metrics = self._score(self._run(reference))
        self.floor = min(self.floor, metrics["accuracy"])
        self.baseline["noise_agreement"] = metrics["accuracy"]
        self.baseline["noise_kl"] = metrics["kl"]
        self.noise = "float32-vs-bf16"

    def _run(self, model: nn.Module) -> list[torch.Tensor]:
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                return [_logits(call_model(model, ex)) for ex in self.inputs]
        finally:
            model.train(was)

    def _score(self, outs: list[torch.Tensor], reference_pass: bool = False) -> dict[str, float]:
        if self.mode == "embedding":
            emb = self.ref if reference_pass else [_pooled(o, ex) for o, ex in zip(outs, self.inputs)]
            e, r = torch.cat(emb), torch.cat(self.ref)  # [R, D]
            if not torch.isfinite(e).all():
                return {"accuracy": -math.inf, "cosine": -math.inf, "cosine_min": -math.inf, "rel_error": math.inf}
            cos = (e * r).sum(-1)  # [R]
            return {"accuracy": cos.mean().item(), "cosine": cos.mean().item(), "cosine_min": cos.min().item(),
                    "nn_agreement": (_neighbours(e) == self.ref_nn).float().mean().item(),
                    "rel_error": math.sqrt((e - r).pow(2).sum().item() / max(r.pow(2).sum().item(), 1e-30))}
        if not self.lm:
            num = sum((o.float().cpu() - r).pow(2).sum().item() for o, r in zip(outs, self.ref))
            den = sum(r.pow(2).sum().item() for r in self.ref)
            rel = math.sqrt(num / max(den, 1e-30)) if math.isfinite(num) else math.inf
            return {"rel_error": rel, "accuracy": 1.0 - rel}
        correct = kl = nll = agree = 0.0
        for o, ref, lab in zip(outs, self.ref, self.labels):
            logp = ref if reference_pass else torch.log_softmax(o.float(), -1).cpu()  # [B, T, V]
            agree += (logp.argmax(-1) == ref.argmax(-1)).sum().item()
            kl += (ref.exp() * (ref - logp)).sum().item()  # KL(ref || plan), summed over tokens
            if lab is not None:
                correct += (logp[:, :-1].argmax(-1) == lab).sum().item()
                nll -= logp[:, :-1].gather(-1, lab[..., None]).sum().item()
        n = self.ntokens
        out = {"accuracy": agree / n, "agreement": agree / n, "kl": kl / n}
        if self.nlabels:
            out.update(next_token=correct / self.nlabels, loss=nll / self.nlabels)
        return out

    def describe(self) -> str:
        """What `accuracy` and `drop` mean here, in words (the budget's unit)."""
        if self.lm:
            what = f"top-1 agreement with the unmodified model on {self.ntokens} tokens"
            if self.noise:
                what += (f"; drop = points below {self.floor:.4f}, the agreement its own {self.noise} "
                         "difference reaches")
            return what
        if self.mode == "embedding":
            rows = sum(r.shape[0] for r in self.ref)
            return f"mean cosine similarity to the unmodified model's embeddings of {rows} held-out rows"
        return "1 - relative L2 error of the outputs on held-out inputs"

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
        return Accuracy(1, acc, self.floor - acc, {k: v for k, v in metrics.items() if isinstance(v, float)},
                        f"proxy: {self.describe()}")


def _neighbours(e: torch.Tensor) -> torch.Tensor:
    """[R] index of each row's nearest other row by cosine, for [R, D] unit rows."""
    sims = e @ e.T  # [R, R]
    sims.fill_diagonal_(-math.inf)
    return sims.argmax(-1)


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
                  "seconds": r.seconds, "samples": r.samples, "documents": r.documents}
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
    """Tier 2 from the user's own metric: fn(model) -> float, higher is better. A callable with a
    `last_metrics` dict (autoao.evaluators.retrieval.RetrievalTask) has it recorded with each value."""

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
        extra = getattr(self.fn, "last_metrics", None)
        metrics = {k: float(v) for k, v in extra.items()} if isinstance(extra, dict) else {}
        return Accuracy(2, value, self.baseline - value, {name: value, **metrics}, f"user metric: {name}")
