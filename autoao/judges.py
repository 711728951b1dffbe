"""The accuracy judges, their references computed from the unmodified model (its side cached on
disk), and what each costs: the proxy (tier 1: every trial's screen and, where it decides, fresh
confirmation positions), the generation check (causal LMs, greedy continuations with the KV cache),
tier 2 (the user's lm-eval tasks or metric).

    judges = build_judges(model, work, tier2, max_drop, cache=..., weights_key=..., ledger=...)
    judges.screen(model, plan)     -> Accuracy with the screen's verdict (a trial's score)
    look_prices(judges)            -> seconds of one look of the deciding judge, of the generation check
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
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import token_ids
from autoao.evaluators.tier2 import LmEvalJudge, MetricJudge
from autoao.evaluators.timing import device_name
from autoao.ledger import RunLedger
from autoao.plan import Plan
from autoao.types import Accuracy
from autoao.workload import PROMPT_TOKENS, Workload


def plan_key(plan: Plan) -> str:
    """A plan's result-cache key: its candidates, and where it names them its kernels and fusions
    (a kernel's rounding moves a task's score: docs/measuring.md#accuracy-verdicts)."""
    layers = sorted((f, c.name) for f, c in plan.layers.items())
    if not plan.kernels and not plan.fusions:
        return digest(layers)
    return digest(layers, sorted(plan.kernels.items()), sorted(plan.fusions))



@dataclass(frozen=True)
class Judges:
    """The accuracy judges, their references computed, and the budget they judge against."""

    budget: AccuracyBudget
    proxy: ProxyEvaluator  # tier 1: scores every trial (the screen) and, where it decides, confirms
    generation: GenerationLooks | None  # causal LMs: greedy continuations with the KV cache, in looks
    tier2: LmEvalJudge | MetricJudge | None  # the user's tasks or metric, where they decide
    weights_key: str
    proxy_s: float  # one screen pass
    check_s: float  # judging one plan, at worst
    once_s: float  # the unmodified model's share of the first check, at worst
    generation_s: float = 0.0  # of check_s, the generation check's share

    def key(self, plan: Plan) -> str:
        return f"{self.weights_key}:{plan_key(plan)}"

    def screen(self, model: nn.Module, plan: Plan) -> Accuracy:
        """The proxy's accuracy of `model` (carrying `plan`) on the screen, with its verdict."""
        acc, evidence = self.proxy.score(model, self.key(plan))
        return acc.with_verdict(self.budget.judge(evidence))

    def describe(self) -> str:
        return self.tier2.describe() if self.tier2 is not None else f"proxy: {self.proxy.describe()}"


def deciding_looks(judges: Judges) -> int:
    """How many looks the deciding judge takes at most: tier 2's, or the proxy's confirmation chunks."""
    return judges.tier2.looks if judges.tier2 is not None else max(len(judges.proxy.confirm_inputs), 1)


def look_prices(judges: Judges) -> tuple[float, float]:
    """Seconds of one look at worst: the deciding judge's, the generation check's (0: none). Each
    judge's share of a check, spread evenly over its looks."""
    deciding = max(judges.check_s - judges.generation_s, 0.0) / deciding_looks(judges)
    generation = judges.generation_s / judges.generation.looks if judges.generation is not None else 0.0
    return deciding, generation


# The generation check: prompts of PROMPT_TOKENS held-out tokens (at most the workload's
# GENERATION_PROMPTS), each continued greedily, in looks of so many prompts, judged two-sided. Where
# the proxy decides it is judged against the budget itself and needs up to about 4000 positions to
# resolve one point (as the proxy's confirmation); where a task decides, against the screen
# (TIER1_SCREEN x wider), and a plan 3 points inside that limit needs about 2000 to resolve.
GENERATION = {"proxy": ((16, 16, 32), 64), "tier2": ((16, 16, 32), 32)}  # who decides -> (prompts per look, new tokens)


def build_judges(model: nn.Module, work: Workload, tier2: LmEvalJudge | MetricJudge | None, max_drop: float, *,
                 cache: ResultCache, weights_key: str, ledger: RunLedger, light: bool = False) -> Judges:
    """The proxy's reference outputs and noise floor, the generation check's reference
    continuations (causal LMs), the tier-2 baseline's first look; each one's cost, for the time plan.
    The unmodified model's side of the proxy and the generation check is kept on disk
    (`reference_cache`): a later run of the same model on this machine loads it, prices trials and
    checks at the seconds measured when it was computed, and counts as one-off only what is not on
    disk yet. `light`: the time budget has no room left to judge a plan: only the proxy's screen is
    built (what a trial reads), and a check is priced out of reach."""
    ledger.say("reference outputs for the accuracy judges")
    base_key = f"{weights_key}:{plan_key(Plan())}"
    references = reference_cache(cache, weights_key, work.device)
    proxy = ProxyEvaluator(model, work.held_out.inputs, cache=cache, reference_key=base_key,
                           confirm=list(work.confirm), references=references)
    proxy.calibrate(model)
    proxy_s = proxy.pass_seconds
    if proxy.noise:
        ledger.say(f"the proxy's floor: {proxy.floor:.4f} top-1 agreement ({proxy.noise} of the unchanged model)")
    if light:
        ledger.say("too little of the time budget is left to judge a plan: the other judges are not built")
        budget = AccuracyBudget.create(max_drop, tier2=tier2 is not None, unit=proxy.describe())
        return Judges(budget, proxy, None, tier2, weights_key, proxy_s, math.inf, 0.0, 0.0)
    generation, gen_s, gen_once = (generation_looks(model, work, tier2 is not None, references) if proxy.lm
                                   else (None, 0.0, 0.0))
    check_s, once_s = gen_s, gen_once
    if isinstance(tier2, LmEvalJudge):
        ledger.say("the unmodified model on the tasks' first documents (tier 2)")
        per_doc = tier2.probe(model, base_key)
        ledger.say("lm-eval's batching changes the answer of " + ", ".join(
            f"{f} of the first {n} documents of {t}" for t, (f, n) in tier2.batching.items())
            + " (the verdicts score one document a forward)")
        # a plan's side at worst scores every document; the unmodified model's only those a
        # previous run left unscored (the cache keeps them)
        check_s = check_s + per_doc * sum(tier2.sizes.values())
        once_s = once_s + per_doc * tier2.unscored(base_key)
    elif isinstance(tier2, MetricJudge):
        check_s += tier2.seconds
    else:  # the proxy decides: its confirmation chunks, each reference and noise computed once (or on disk)
        screen = max(len(work.held_out.inputs), 1)
        confirm = sum(len(c) for c in work.confirm) / screen
        fresh = sum(len(c) for i, c in enumerate(work.confirm) if not proxy.on_disk(i)) / screen
        check_s, once_s = check_s + proxy_s * confirm, once_s + 2 * proxy_s * fresh
    noise = 1.0 - proxy.baseline.get("noise_agreement", 1.0)
    budget = AccuracyBudget.create(max_drop, tier2=tier2 is not None, proxy_noise=noise,
                                   unit=tier2.describe() if tier2 is not None else proxy.describe())
    return Judges(budget, proxy, generation, tier2, weights_key, proxy_s, check_s, once_s, gen_s)


def reference_cache(cache: ResultCache, weights_key: str, device: torch.device) -> TensorCache:
    """Where the unmodified model's side of the label-free judges is kept: `references/` next to the
    result cache, every key scoped to the model's weights, the device's name (as timings name it:
    the GPU model, or the CPU model and thread count) and torch's version."""
    return TensorCache(cache.path.parent / REFERENCES, f"{weights_key}:{device_name(device)}:{torch.__version__}")


def generation_looks(model: nn.Module, work: Workload, task_decides: bool,
                     references: TensorCache) -> tuple[GenerationLooks, float, float]:
    """The generation check (GENERATION) on prompts of the held-out tokens, its first look prepared;
    and its seconds: a check's plan side at every look, and the unmodified model's side of the looks
    not yet on disk. A look's reference side (the greedy continuation, then the float32 twin teacher-
    forced along it) costs about two plan sides (one teacher-forced pass); priced from the first
    look's seconds, measured when it was computed, per prompt."""
    counts, new_tokens = GENERATION["tier2" if task_decides else "proxy"]
    limit = max_positions(model)  # a prompt and its continuation fit the model's positions
    length = PROMPT_TOKENS if limit is None else max(1, min(PROMPT_TOKENS, limit // 2))
    new_tokens = new_tokens if limit is None else max(1, min(new_tokens, limit - length))
    rows = prompts(work, sum(counts), length)  # as many as the held-out inputs hold, up to sum(counts)
    ends = [min(sum(counts[:i + 1]), len(rows)) for i in range(len(counts))]
    chunks = [rows[a:b] for a, b in zip([0, *ends], ends) if b > a]
    generation = GenerationLooks(chunks, new_tokens, references=references)
    fresh = [not generation.on_disk(model, look) for look in range(generation.looks)]  # before look 0 is built
    generation.prepare(model, 0)  # the first look's reference and noise: what a look costs
    per_prompt = generation.judges[0].seconds / len(chunks[0])
    unbuilt = sum(len(c) for c, new in zip(chunks, fresh) if new)
    return generation, per_prompt * len(rows) / 2, per_prompt * unbuilt / 2


def prompts(work: Workload, count: int, length: int = PROMPT_TOKENS) -> torch.Tensor:
    """[P <= count, length] prompts for the generation check: windows of the held-out token ids
    (the screen's, the confirmation chunks', then the workload's further prompt inputs); shorter
    where the sequences are."""
    inputs = [*work.held_out.inputs, *(x for chunk in work.confirm for x in chunk), *work.prompt_inputs]
    ids = [token_ids(x) for x in inputs]
    windows = sum(t.shape[0] * (t.shape[1] // length) for t in ids if t is not None)
    length = length if windows else min(t.shape[1] for t in ids if t is not None)
    return prompts_from(inputs, n_prompts=max(1, min(count, windows or len(inputs))), length=length)
