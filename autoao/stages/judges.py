"""The accuracy judges, their references computed from the unmodified model (its side cached on
disk), and what each costs: the proxy (tier 1: every trial's screen and, where it decides, fresh
confirmation positions), the generation check (causal LMs, greedy continuations with the KV cache),
tier 2 (the user's lm-eval tasks or metric).

    judges = build_judges(model, work, tier2, max_drop, cache=..., weights_key=..., ledger=...)
    judges.screen(model, plan)     -> Accuracy with the screen's verdict (a trial's score)
    judges.checks                  -> the deciding judge, then the generation check (evaluators.judge.Judge)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from autoao.budget import AccuracyBudget
from autoao.evaluators.cache import REFERENCES, ResultCache, TensorCache, digest
from autoao.evaluators.generation import GenerationLooks, prompts_from
from autoao.evaluators.heldout import max_positions
from autoao.evaluators.judge import Judge, Merged, Say
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import token_ids
from autoao.evaluators.timing import device_name
from autoao.ledger import RunLedger
from autoao.plan import Plan
from autoao.stages.inputs import PROMPT_TOKENS, Inputs
from autoao.types import Accuracy, Evidence


def plan_key(plan: Plan) -> str:
    """A plan's result-cache key: its candidates, and where it names them its kernels and fusions
    (a kernel's rounding moves a task's score: docs/measuring.md#accuracy-verdicts)."""
    layers = sorted((f, c.name) for f, c in plan.layers.items())
    if not plan.kernels and not plan.fusions:
        return digest(layers)
    return digest(layers, sorted(plan.kernels.items()), sorted(plan.fusions))



class ProxyConfirmation(Judge):
    """The proxy as the deciding judge: its confirmation chunks (positions the search never
    scored, so the fastest of many plans is not judged on the positions that made it look best),
    one a look; with none, the screen itself, in one look."""

    def __init__(self, proxy: ProxyEvaluator) -> None:
        self.proxy, self.merged = proxy, Merged()

    @property
    def looks(self) -> int:
        return max(len(self.proxy.confirm_inputs), 1)

    def prepare(self, reference: nn.Module, look: int) -> None:
        self.proxy.prepare(reference, look)

    def evidence_through(self, model: nn.Module, key: str, look: int) -> tuple[Evidence, dict[str, float]] | None:
        if not self.proxy.confirm_inputs:  # the screen is all there is
            if look:
                return None
            acc, evidence = self.proxy.score(model, key)
            return evidence, dict(acc.metrics)
        acc, evidence = self.proxy.score(model, key, chunk=look)
        return self.merged.add(key, look, evidence), dict(acc.metrics)

    def price(self, reference: nn.Module, key: str, say: Say) -> None:
        """Each confirmation chunk costs its share of a screen pass; its reference and noise twice
        that, once (or nothing, on disk)."""
        proxy = self.proxy
        screen = max(len(proxy.screen.inputs), 1)
        chunks = proxy.confirm_inputs
        confirm = sum(len(c) for c in chunks) / screen
        fresh = sum(len(c) for i, c in enumerate(chunks) if not proxy.on_disk(i)) / screen
        self.check_s, self.once_s = proxy.pass_seconds * confirm, 2 * proxy.pass_seconds * fresh

    def describe(self) -> str:
        return f"proxy: {self.proxy.describe()}"


def screened(proxy: ProxyEvaluator, budget: AccuracyBudget, model: nn.Module, key: str) -> Accuracy:
    """The proxy's accuracy of `model` on the screen (`key` names its plan), with the budget's
    verdict: a trial's score, the coordinator's and every worker's alike."""
    acc, evidence = proxy.score(model, key)
    return acc.with_verdict(budget.judge(evidence))


@dataclass(frozen=True)
class Judges:
    """The accuracy judges, their references computed, and the budget they judge against."""

    budget: AccuracyBudget
    proxy: ProxyEvaluator  # tier 1: scores every trial (the screen)
    checks: tuple[Judge, ...]  # the deciding judge first; for causal LMs then the generation check
    weights_key: str
    proxy_s: float  # one screen pass

    @property
    def deciding(self) -> Judge:
        """The user's tasks or metric, or the proxy's confirmation (autoao.evaluators.judge)."""
        return self.checks[0]

    @property
    def check_s(self) -> float:
        """Judging one plan, at worst: every look of every judge."""
        return sum(j.check_s for j in self.checks)

    @property
    def once_s(self) -> float:
        """The unmodified model's share of the first check not on disk yet, at worst."""
        return sum(j.once_s for j in self.checks)

    @property
    def first_s(self) -> float:
        """Every judge's first look, at worst (a check starts only when those fit)."""
        return sum(j.look_s for j in self.checks)

    def key(self, plan: Plan) -> str:
        return f"{self.weights_key}:{plan_key(plan)}"

    def screen(self, model: nn.Module, plan: Plan) -> Accuracy:
        """The proxy's accuracy of `model` (carrying `plan`) on the screen, with its verdict."""
        return screened(self.proxy, self.budget, model, self.key(plan))

    def describe(self) -> str:
        return self.deciding.describe()


# The generation check: prompts of PROMPT_TOKENS held-out tokens (at most the workload's
# GENERATION_PROMPTS), each continued greedily, in looks of so many prompts, judged two-sided. Where
# the proxy decides it is judged against the budget itself and needs up to about 4000 positions to
# resolve one point (as the proxy's confirmation); where a task decides, against the screen
# (TIER1_SCREEN x wider), and a plan 3 points inside that limit needs about 2000 to resolve.
GENERATION = {"proxy": ((16, 16, 32), 64), "tier2": ((16, 16, 32), 32)}  # who decides -> (prompts per look, new tokens)


def build_judges(model: nn.Module, work: Inputs, tier2: Judge | None, max_drop: float, *,
                 cache: ResultCache, weights_key: str, ledger: RunLedger, light: bool = False) -> Judges:
    """The proxy's reference outputs and noise floor, then the checks, each priced on the
    unmodified model (Judge.price: its first look): the deciding judge (`tier2`, the user's, or
    the proxy's confirmation) and, for causal LMs, the generation check. The unmodified model's
    side of the proxy and the generation check is kept on disk (`reference_cache`): a later run of
    the same model on this machine loads it, prices trials and checks at the seconds measured when
    it was computed, and counts as one-off only what is not on disk yet. `light`: the time budget
    has no room left to judge a plan: only the proxy's screen is built (what a trial reads), and a
    check is priced out of reach."""
    ledger.say("reference outputs for the accuracy judges")
    base_key = f"{weights_key}:{plan_key(Plan())}"
    references = reference_cache(cache, weights_key, work.device)
    proxy = ProxyEvaluator(model, work.held_out.inputs, cache=cache, reference_key=base_key,
                           confirm=list(work.confirm), references=references)
    proxy.calibrate(model)
    if proxy.noise:
        ledger.say(f"the proxy's floor: {proxy.floor:.4f} top-1 agreement ({proxy.noise} of the unchanged model)")
    deciding = tier2 if tier2 is not None else ProxyConfirmation(proxy)
    checks: tuple[Judge, ...] = (deciding,)
    if light:
        ledger.say("too little of the time budget is left to judge a plan: the other judges are not built")
        deciding.check_s = math.inf
    else:
        if proxy.lm:
            checks += (generation_looks(model, work, tier2 is not None, references),)
        for judge in checks:
            judge.price(model, base_key, ledger.say)
    noise = 0.0 if light else 1.0 - proxy.baseline.get("noise_agreement", 1.0)
    budget = AccuracyBudget.create(max_drop, tier2=tier2 is not None, proxy_noise=noise,
                                   unit=tier2.describe() if tier2 is not None else proxy.describe())
    return Judges(budget, proxy, checks, weights_key, proxy.pass_seconds)


def reference_cache(cache: ResultCache, weights_key: str, device: torch.device) -> TensorCache:
    """Where the unmodified model's side of the label-free judges is kept: `references/` next to the
    result cache, every key scoped to the model's weights, the device's name (as timings name it:
    the GPU model, or the CPU model and thread count) and torch's version."""
    return TensorCache(cache.path.parent / REFERENCES, f"{weights_key}:{device_name(device)}:{torch.__version__}")


def generation_looks(model: nn.Module, work: Inputs, task_decides: bool,
                     references: TensorCache) -> GenerationLooks:
    """The generation check (GENERATION) on prompts of the held-out tokens, in looks (priced by
    GenerationLooks.price)."""
    counts, new_tokens = GENERATION["tier2" if task_decides else "proxy"]
    limit = max_positions(model)  # a prompt and its continuation fit the model's positions
    length = PROMPT_TOKENS if limit is None else max(1, min(PROMPT_TOKENS, limit // 2))
    new_tokens = new_tokens if limit is None else max(1, min(new_tokens, limit - length))
    rows = prompts(work, sum(counts), length)  # as many as the held-out inputs hold, up to sum(counts)
    ends = [min(sum(counts[:i + 1]), len(rows)) for i in range(len(counts))]
    chunks = [rows[a:b] for a, b in zip([0, *ends], ends) if b > a]
    return GenerationLooks(chunks, new_tokens, references=references)


def prompts(work: Inputs, count: int, length: int = PROMPT_TOKENS) -> torch.Tensor:
    """[P <= count, length] prompts for the generation check: windows of the held-out token ids
    (the screen's, the confirmation chunks', then the workload's further prompt inputs); shorter
    where the sequences are."""
    inputs = [*work.held_out.inputs, *(x for chunk in work.confirm for x in chunk), *work.prompt_inputs]
    ids = [token_ids(x) for x in inputs]
    windows = sum(t.shape[0] * (t.shape[1] // length) for t in ids if t is not None)
    length = length if windows else min(t.shape[1] for t in ids if t is not None)
    return prompts_from(inputs, n_prompts=max(1, min(count, windows or len(inputs))), length=length)
