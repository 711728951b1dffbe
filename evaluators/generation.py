"""Greedy-generation agreement of a causal LM with its unmodified self, as users run it.

    judge = GenerationJudge(reference, prompts, new_tokens=16)  # prompts: [P, L] int64 token ids
    evidence = judge.evidence(plan_model)   # autoao.types.Evidence: judge "generation", tier 1
    autoao.types.judge(evidence, 0.01)      # holds / breaks / unresolved
    judge.free_run(plan_model)              # matched prefix length per prompt, for display

The decode path (`decode`) is the one `generate()` runs: the prompt in one forward, then one token
per forward. For a transformers model that can generate, every step after the prompt feeds one
token against the KV cache (the M=1 matmuls a quantized decode kernel serves); for any other module
mapping input_ids [B, T] -> logits [B, T, V] (a tensor, or an object with .logits) the whole prefix
is recomputed each step, which gives the same tokens without a cache.

What a plan is scored on: the reference's greedy continuation of every prompt is computed once.
The plan is then teacher-forced along it through the decode path, and at each step it agrees (1)
when its argmax is the reference's next token. Teacher forcing keeps one early divergence from
deciding every later step, so each step is evidence about the plan, not about its own earlier
mistakes. The baseline is the model's own noise: the reference run in float32 (its bf16 / fp16
weights upcast, then put back bit-exact) teacher-forced along the same continuation. A plan that
agrees with bf16 as often as float32 does has dropped nothing. An fp32 reference has no noise: its
baseline agreement is 1.

With `references` (evaluators.cache.TensorCache, scoped to the model's weights, the device and
torch's version), the reference's continuation [P, N], its noise [P, N] and the seconds computing
them took are kept on disk by the prompts' digest, the new tokens and the decode path: a judge
built again from them is bit-identical and does not run the model.

This module knows nothing of plans, budgets or the search: it turns a model into Evidence.
"""

from __future__ import annotations

import inspect
import math
import sys
import time
from typing import Callable, Generator

import torch
from torch import nn

from autoao.common import call_model, model_device
from autoao.evaluators.cache import TensorCache, digest, scalar
from autoao.evaluators.judge import Judge, Merged, Say
from autoao.evaluators.sensitivity import output_logits, token_ids, upcast
from autoao.types import Evidence, Stratum

# choose(logits [B, V] of the current step, step index) -> the [B] token ids fed next
Choose = Callable[[torch.Tensor, int], torch.Tensor]
# yields the logits [B, V] of the last position; is sent the [B] tokens fed next
Steps = Generator[torch.Tensor, torch.Tensor, None]


##### the decode path ###########################################################################

def uses_kv_cache(model: nn.Module) -> bool:
    """True for a transformers model that can generate(): `decode` then feeds one token a step
    against its KV cache. Checked by type, without importing transformers (a PreTrainedModel
    cannot exist unless transformers was imported)."""
    transformers = sys.modules.get("transformers")
    return (transformers is not None and isinstance(model, transformers.PreTrainedModel)
            and bool(model.can_generate()))


def _cache_names(model: nn.Module) -> tuple[str, str]:
    """(forward keyword, output attribute) of the KV cache: transformers 5.x renamed
    `past_key_values` to `cache`; both are accepted, the newer first."""
    params = inspect.signature(model.forward).parameters
    return ("cache", "cache") if "cache" in params else ("past_key_values", "past_key_values")


def decode(model: nn.Module, prompts: torch.Tensor, steps: int, choose: Choose) -> torch.Tensor:
    """Run `model` along `prompts` [B, L] for `steps` steps: at step i, choose(logits [B, V], i)
    picks the [B] tokens fed next (greedy: the argmax; teacher-forced: given tokens). Returns the
    chosen tokens [B, steps] on the model's device. No grad; eval mode, training flag restored.
    The last chosen tokens are never fed (their logits are not needed): `steps` forwards in all."""
    ids = prompts.to(model_device(model))
    was = model.training
    model.eval()
    chosen: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            step = _cached_steps(model, ids) if uses_kv_cache(model) else _recomputed_steps(model, ids)
            logits = next(step)  # [B, V] after the prompt
            for i in range(steps):
                chosen.append(choose(logits, i).to(ids.device))
                if i + 1 < steps:
                    logits = step.send(chosen[-1])
    finally:
        model.train(was)
    return torch.stack(chosen, 1) if chosen else ids.new_zeros(ids.shape[0], 0)


def _cached_steps(model: nn.Module, ids: torch.Tensor) -> Steps:
    """Generator: yields the last position's logits [B, V]; is sent the next [B] tokens. The
    prompt runs once, then one token a step with the KV cache, as generate() runs it."""
    kwarg, attr = _cache_names(model)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out = model(input_ids=ids, use_cache=True, **keep)
    while True:
        token = yield output_logits(out)[:, -1]  # [B, V]
        out = model(input_ids=token[:, None], use_cache=True, **{kwarg: getattr(out, attr)}, **keep)


def _recomputed_steps(model: nn.Module, ids: torch.Tensor) -> Steps:
    """Generator as _cached_steps, for a module without a cache: the whole prefix each step."""
    while True:
        token = yield output_logits(call_model(model, ids))[:, -1]  # [B, V]
        ids = torch.cat([ids, token[:, None]], 1)  # [B, T + 1]


def greedy(model: nn.Module, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The model's greedy continuation [B, new_tokens] of `prompts` [B, L] through the decode path."""
    return decode(model, prompts, new_tokens, lambda logits, i: logits.argmax(-1))


def forced_argmax(model: nn.Module, prompts: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Teacher-force `model` along `tokens` [B, N] after `prompts` [B, L] through the decode path:
    (its argmax at each step [B, N], on the CPU; whether its logits were free of NaN and +inf). A
    -inf logit is a token ruled out (vocabulary padding is masked so), not a failure."""
    tokens = tokens.to(model_device(model))
    argmax: list[torch.Tensor] = []
    finite = True

    def feed(logits: torch.Tensor, i: int) -> torch.Tensor:
        nonlocal finite
        argmax.append(logits.argmax(-1).cpu())  # [B]
        finite = finite and not bool((torch.isnan(logits) | torch.isposinf(logits)).any())
        return tokens[:, i]

    decode(model, prompts, tokens.shape[1], feed)
    return torch.stack(argmax, 1), finite


def prompts_from(inputs: list, *, n_prompts: int, length: int) -> torch.Tensor:
    """[n_prompts, length] prompts cut from held-out token ids (autoao.evaluators.heldout): windows
    of `length` consecutive tokens, not overlapping, row after row, on the CPU. ValueError saying
    how many windows the inputs hold when they hold fewer."""
    if length < 1 or n_prompts < 1:
        raise ValueError(f"prompts need n_prompts >= 1 and length >= 1, got {n_prompts} and {length}")
    windows = []
    for ex in inputs:
        ids = token_ids(ex)
        if ids is None:
            raise ValueError(f"prompts are cut from token ids [B, T]; an input is a {type(ex).__name__}")
        for row in ids.cpu():
            windows.extend(row[i:i + length] for i in range(0, row.numel() - length + 1, length))
    if len(windows) < n_prompts:
        raise ValueError(f"asked for {n_prompts} prompts of {length} tokens; the inputs hold {len(windows)} "
                         "such windows")
    return torch.stack(windows[:n_prompts]).long()


##### the judge #################################################################################

ENTRY_FORMAT = 2  # of a cached reference side: {tokens, noise, seconds, pass_seconds}


def _reference_key(reference: nn.Module, prompts: torch.Tensor, new_tokens: int) -> str:
    """A judge's key in the reference cache: its prompts [P, L], new tokens, decode path and the
    entry's format (an entry of another format is never read)."""
    path = "kv-cache" if uses_kv_cache(reference) else "recomputed"
    return f"generation:{digest(prompts.long().cpu())}:new_tokens={new_tokens}:decode={path}:format={ENTRY_FORMAT}"


class GenerationJudge:
    """Tier 1 for causal LMs: greedy-continuation agreement with the unmodified model, on the
    decode path users run, against the model's own float32-vs-bf16 noise (see the module
    docstring). Built once from the reference; `evidence(model)` scores any model of the same
    vocabulary on the same prompts."""

    def __init__(self, reference: nn.Module, prompts: torch.Tensor, new_tokens: int, *,
                 references: TensorCache | None = None) -> None:
        """reference: the unmodified model (upcast and put back bit-exact for the noise; otherwise
        unchanged). prompts: [P, L] integer token ids, P >= 1 prompts of one length L >= 1.
        new_tokens: greedy steps per prompt, >= 1. references: where the reference's side is kept
        on disk (module docstring); None computes it. ValueError naming the bad argument.
        `seconds`: what computing the reference's side took (when it was computed); `pass_seconds`:
        its greedy continuation's share (a plan's look runs as many decode steps, teacher-forced
        along it: its price at the unchanged model's speed)."""
        if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2 or prompts.dtype.is_floating_point \
                or prompts.dtype == torch.bool or prompts.numel() == 0:
            got = (f"a {prompts.dtype} tensor of shape {tuple(prompts.shape)}" if isinstance(prompts, torch.Tensor)
                   else type(prompts).__name__)
            raise ValueError(f"prompts must be a [P, L] integer tensor of token ids with P, L >= 1; got {got}")
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
            raise ValueError(f"new_tokens must be an int >= 1, got {new_tokens!r}")
        self.prompts = prompts.long().cpu()  # [P, L]
        self.new_tokens = new_tokens
        key = _reference_key(reference, self.prompts, new_tokens) if references is not None else ""
        hit = references.get(key) if references is not None else None
        if hit is not None:
            self.tokens, self.noise = hit["tokens"], hit["noise"]
            self.seconds, self.pass_seconds = float(hit["seconds"]), float(hit["pass_seconds"])
        else:
            t0 = time.perf_counter()
            self.tokens, self.noise, self.pass_seconds = self._reference_side(reference)
            self.seconds = time.perf_counter() - t0
            if references is not None:
                references.put(key, {"tokens": self.tokens, "noise": self.noise, "seconds": scalar(self.seconds),
                                     "pass_seconds": scalar(self.pass_seconds)})
        self.noise_floor = self.noise.float().mean().item()

    def _reference_side(self, reference: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(the reference's greedy continuation [P, N], its float32 twin's agreement along it
        [P, N] bool, all True for a model without a lower precision, both on the CPU; the
        continuation's seconds)."""
        t0 = time.perf_counter()
        tokens = greedy(reference, self.prompts, self.new_tokens).cpu()  # [P, N]
        greedy_s = time.perf_counter() - t0
        with upcast(reference) as changed:
            if not changed:
                return tokens, torch.ones_like(tokens, dtype=torch.bool), greedy_s
            argmax, finite = forced_argmax(reference, self.prompts, tokens)
        return tokens, (argmax == tokens) & finite, greedy_s  # [P, N] float32 agrees with bf16

    def agreement(self, model: nn.Module) -> torch.Tensor:
        """[P, N] bool: at each step of the reference's continuation, teacher-forced, whether
        `model`'s argmax is the reference's next token; all False where any of its logits were NaN
        or +inf (such a plan is useless, whatever its argmax)."""
        argmax, finite = forced_argmax(model, self.prompts, self.tokens)
        return (argmax == self.tokens) & finite

    def evidence(self, model: nn.Module) -> Evidence:
        """Paired per-prompt evidence: one unit per prompt, its diff the sum over its new_tokens
        steps of (noise agreement - plan agreement), `changed` the steps where the two differ."""
        plan = self.agreement(model).float()  # [P, N]
        noise = self.noise.float()
        diffs = (noise - plan).sum(1)  # [P]
        stratum = Stratum(tuple(diffs.tolist()), (self.new_tokens,) * len(diffs),
                          changed=int((noise != plan).sum()))
        return Evidence("generation", 1, "greedy-continuation agreement", "generated tokens", (stratum,),
                        baseline=self.noise_floor, score=plan.mean().item(), discrete=True)

    def free_run(self, model: nn.Module) -> list[int]:
        """Per prompt, how many leading tokens of `model`'s own greedy continuation (its tokens fed
        back, not the reference's) equal the reference's: 'matched 1 of 16 tokens'."""
        own = greedy(model, self.prompts, self.new_tokens).cpu()  # [P, N]
        same = (own == self.tokens).long()
        return same.cumprod(1).sum(1).tolist()

    def describe(self) -> str:
        """What the evidence measures, in words."""
        p, n = self.tokens.shape
        return (f"greedy-continuation agreement with the unmodified model on {p} prompts x {n} new tokens "
                f"(teacher-forced, decode path); noise floor {self.noise_floor:.4f} (float32 vs its own dtype)")


class GenerationLooks(Judge):
    """The generation check taken look by look: the prompts in chunks, each chunk's judge (the
    reference's continuation and its float32 noise) built from the unmodified model the first time
    a look needs it, so a plan that resolves on the first chunk costs only that chunk."""

    def __init__(self, chunks: list[torch.Tensor], new_tokens: int, *,
                 references: TensorCache | None = None) -> None:
        """chunks: [P_i, L] prompt tensors, one per look (GenerationJudge's prompts). references:
        where each look's reference side is kept on disk (GenerationJudge)."""
        if not chunks:
            raise ValueError("the generation check needs at least one chunk of prompts")
        self.chunks, self.new_tokens, self.references = chunks, new_tokens, references
        self.judges: dict[int, GenerationJudge] = {}
        self.merged = Merged()

    @property
    def looks(self) -> int:
        return len(self.chunks)

    def prepare(self, reference: nn.Module, look: int) -> None:
        """Build look `look`'s judge from the unmodified model (once)."""
        if look not in self.judges:
            self.judges[look] = GenerationJudge(reference, self.chunks[look], self.new_tokens,
                                                references=self.references)

    def on_disk(self, reference: nn.Module, look: int) -> bool:
        """Whether look `look`'s judge is built or its reference side is in the reference cache:
        what preparing it still costs is (nearly) nothing."""
        return look in self.judges or (self.references is not None and self.references.has(
            _reference_key(reference, self.chunks[look], self.new_tokens)))

    def evidence(self, model: nn.Module, look: int) -> Evidence:
        """Look `look`'s evidence alone (prepare it first)."""
        return self.judges[look].evidence(model)

    def evidence_through(self, model: nn.Module, key: str, look: int) -> tuple[Evidence, dict[str, float]]:
        return self.merged.add(key, look, self.evidence(model, look)), {}

    def price(self, reference: nn.Module, key: str, say: Say) -> None:
        """The first look prepared (its reference and noise), and from its seconds per prompt: a
        check's plan side at every look (as many decode steps as the reference's greedy
        continuation: GenerationJudge.pass_seconds), and the unmodified model's side of the looks
        not on disk before (the greedy continuation, then the float32 twin teacher-forced along it,
        the upcast included: GenerationJudge.seconds)."""
        fresh = [not self.on_disk(reference, look) for look in range(self.looks)]  # before look 0 is built
        self.prepare(reference, 0)
        first, prompts = self.judges[0], len(self.chunks[0])
        self.check_s = first.pass_seconds / prompts * sum(len(c) for c in self.chunks)
        self.once_s = first.seconds / prompts * sum(len(c) for c, new in zip(self.chunks, fresh) if new)

    def describe(self) -> str:
        prompts = sum(len(c) for c in self.chunks)
        return f"generation: greedy continuations of {prompts} prompts x {self.new_tokens} new tokens"

    @property
    def noise_floor(self) -> float:
        """The first look's float32-vs-bf16 agreement (the one measured before any plan)."""
        return self.judges[0].noise_floor if 0 in self.judges else math.nan
