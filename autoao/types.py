"""The values every stage passes on: a leaf module (it imports only autoao.common).

    LayerSpec     what a candidate needs to know about one linear layer
    Budget        a time or trial budget, parsed from "90s", "10m", 200
    Evidence      paired per-unit differences between the unmodified model and a plan
    Verdict       holds / breaks / unresolved, with the evidence's n and interval
    Accuracy      one accuracy measurement of a plan, with the tier that made it and its verdict
    Pricing       how a target's layer costs are known: Timed() here, or FromBytes(reason), an estimate

A claim about accuracy is a `Verdict`, never a bare number: the drop is a paired mean over the same
positions, documents or items for the unmodified model and the plan, and its interval says how far
that many of them can be trusted (`Evidence.interval`). A plan ships only on HOLDS.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoao.common import is_conv1d

##### layers and budgets ########################################################################


@dataclass(frozen=True)
class LayerSpec:
    """What a candidate needs to know about a linear layer (no weights)."""

    fqn: str  # fully qualified module name, e.g. "model.layers.0.mlp.up_proj"
    in_features: int  # K
    out_features: int  # N
    bias: bool
    dtype: torch.dtype  # the layer's weight dtype (= its activation dtype)

    @classmethod
    def from_linear(cls, fqn: str, linear: nn.Module) -> LayerSpec:
        """An nn.Linear's spec; or a GPT-2 Conv1D's (weight [K, N])."""
        k, n = linear.weight.shape if is_conv1d(linear) else (linear.in_features, linear.out_features)
        return cls(fqn, k, n, linear.bias is not None, linear.weight.dtype)

    @property
    def shape(self) -> str:
        return f"{self.out_features}x{self.in_features}"


@dataclass(frozen=True)
class Budget:
    """A wall-time budget (seconds) or a trial-count budget."""

    seconds: float | None = None
    trials: int | None = None

    @classmethod
    def parse(cls, text: str | int | float | Budget) -> Budget:
        """"10m", "90s", "1.5h", "2h30m" -> seconds; "200" or 200 -> trials. ValueError otherwise."""
        if isinstance(text, Budget):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            if text < 1:
                raise ValueError(f"budget must be at least 1 trial, got {text}")
            return cls(trials=text)
        s = str(text).strip().lower().replace(" ", "")
        if s.isdigit():
            return cls.parse(int(s))
        if not re.fullmatch(r"((?:\d+(?:\.\d+)?[hms])+)", s):
            raise ValueError(f"budget {text!r} is neither a time (e.g. 90s, 10m, 1.5h, 1h30m) nor a number "
                             "of trials (e.g. 200)")
        seconds = sum(float(v) * {"h": 3600, "m": 60, "s": 1}[u] for v, u in re.findall(r"(\d+(?:\.\d+)?)([hms])", s))
        if seconds <= 0:
            raise ValueError(f"budget {text!r} is zero")
        return cls(seconds=seconds)

    def __str__(self) -> str:
        return f"{self.trials} trials" if self.trials is not None else f"{self.seconds:g} s"


##### evidence and verdicts #####################################################################

HOLDS, BREAKS, UNRESOLVED = "holds", "breaks", "unresolved"
CONFIDENCE = 0.95  # every interval: two-sided, over all the looks a judge took (Bonferroni)
# tier 2 on lm-eval: the unmodified model's first-look documents are scored both as the judges score
# (one document a forward) and as lm-eval usually batches (LMEVAL_BATCH requests a forward); the
# documents whose outcome differs, and how many were compared, are baseline metrics "task/<name>"
LMEVAL_BATCH = 8
BATCH_FLIPS, BATCH_COMPARED = f"flips at batch {LMEVAL_BATCH}", f"documents at batch {LMEVAL_BATCH}"
# a plan's tier-2 metrics also carry, per task, the unmodified model's acc on the same documents
# ("task/<name>") and how many ("task/documents"): the baseline metrics are the first look's only
UNMODIFIED_ACC = "acc, unmodified model"


@dataclass(frozen=True)
class Stratum:
    """One population the evidence samples: per unit (a document, a prompt, a block of positions),
    the summed difference `baseline - plan` over its items and how many items it holds."""

    diffs: tuple[float, ...]
    sizes: tuple[int, ...]
    weight: float = 1.0  # its share of the metric (1/T for one of T tasks averaged)
    population: int | None = None  # units in the finite population (a task's documents); None: unbounded
    changed: int = 0  # items whose paired 0/1 outcomes differ (either way): the discordant pairs

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def exhaustive(self) -> bool:
        """Every unit of a finite population scored: the mean is the population's, exactly."""
        return self.population is not None and len(self.diffs) >= self.population

    def estimate(self, discrete: bool) -> tuple[float, float]:
        """(mean difference per item, its variance): a ratio estimator over units, cluster-robust
        (positions of one sequence are not independent), with the finite-population correction;
        `discrete` (Evidence) adds one pseudo-changed item to the variance."""
        m, n = len(self.diffs), self.n
        if m == 0 or n == 0:
            return math.nan, math.inf
        mean = sum(self.diffs) / n
        if self.exhaustive:
            return mean, 0.0
        var = (m / (m - 1) * sum((d - mean * s) ** 2 for d, s in zip(self.diffs, self.sizes)) / n ** 2
               if m > 1 else math.inf)
        if discrete:
            var = max(var, (self.changed + 1) / n ** 2)
        if self.population is not None:
            var *= (self.population - m) / max(self.population - 1, 1)
        return mean, var


@dataclass(frozen=True)
class Evidence:
    """Paired differences between the unmodified model (or its noise floor) and a plan on the same
    units. `discrete`: the items are 0/1 outcomes (top-1 agreement, a question answered right), whose
    variance a sample with few or no changed items understates: one pseudo-changed item is added to
    it (the Agresti-Min adjustment of a paired 2x2 table), so no flips in 100 documents is not
    read as no flips anywhere."""

    judge: str  # "proxy", "generation", "lm-eval", "metric"
    tier: int  # 1: label-free (proxy, generation); 2: the user's tasks or metric
    metric: str  # what is compared, in words: "top-1 agreement", "autoao_facts acc"
    unit: str  # what n counts: "positions", "documents", "items"
    strata: tuple[Stratum, ...]
    baseline: float  # the unmodified model's score (the proxy: its noise floor)
    score: float  # the plan's
    discrete: bool = True

    @property
    def n(self) -> int:
        return sum(s.n for s in self.strata)

    @property
    def population(self) -> int | None:
        pops = [s.population for s in self.strata]
        return None if any(p is None for p in pops) else sum(pops)  # type: ignore[misc]

    def interval(self, looks: int = 1) -> tuple[float, float, float]:
        """(drop, low, high): the weighted paired mean and its two-sided CONFIDENCE interval,
        Bonferroni-adjusted over `looks` (a judge that adds evidence until it resolves looks again
        each time). Exact (low == high) where every unit of a finite population was scored."""
        drop, var = 0.0, 0.0
        for s in self.strata:
            mean, v = s.estimate(self.discrete)
            drop += s.weight * mean
            var += s.weight ** 2 * v
        if not math.isfinite(drop):
            return drop, drop, drop
        if var == 0.0:
            return drop, drop, drop
        if not math.isfinite(var):
            return drop, -math.inf, math.inf
        df = max(1, min(len(s.diffs) for s in self.strata) - 1)
        half = t_quantile(1 - (1 - CONFIDENCE) / 2 / max(looks, 1), df) * math.sqrt(var)
        return drop, drop - half, drop + half

    def merged(self, other: Evidence) -> Evidence:
        """This evidence and more units of the same strata (a judge's next look)."""
        strata = tuple(Stratum(a.diffs + b.diffs, a.sizes + b.sizes, a.weight, a.population, a.changed + b.changed)
                       for a, b in zip(self.strata, other.strata))
        n_old, n_new = self.n, other.n
        score = (self.score * n_old + other.score * n_new) / max(n_old + n_new, 1)
        base = (self.baseline * n_old + other.baseline * n_new) / max(n_old + n_new, 1)
        return Evidence(self.judge, self.tier, self.metric, self.unit, strata, base, score, self.discrete)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (exact for 1 and 2 degrees of freedom; Cornish-Fisher beyond, within
    1% from 3 on)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


@dataclass(frozen=True)
class Verdict:
    """A judgement of a plan's accuracy against a budget, with its evidence: HOLDS when the
    interval's upper bound on the drop is within `max_drop`, BREAKS when its lower bound is above
    it, UNRESOLVED otherwise (too few positions or documents to tell)."""

    status: str
    judge: str
    tier: int
    metric: str
    unit: str
    n: int  # items the evidence holds (positions, documents, ...)
    drop: float  # paired mean: baseline - plan, in the metric's units
    low: float
    high: float
    max_drop: float  # the limit it was judged against
    baseline: float = math.nan
    score: float = math.nan
    population: int | None = None  # items in the whole finite population, where there is one
    looks: int = 1

    @property
    def holds(self) -> bool:
        return self.status == HOLDS

    def describe(self) -> str:
        """"holds: drop +0.0031 (95% interval -0.0012 to +0.0074, limit 0.0100) on 2048 positions, proxy: top-1 agreement"."""
        if not math.isfinite(self.drop):
            what = "the plan's outputs are not finite"
        elif self.low == self.high:
            what = f"drop {self.drop:+.4f} (exact: every one of them scored, limit {self.max_drop:.4f})"
        else:
            what = (f"drop {self.drop:+.4f} ({CONFIDENCE:.0%} interval {self.low:+.4f} to {self.high:+.4f}, "
                    f"limit {self.max_drop:.4f})")
        of = f" of {self.population}" if self.population is not None and self.population != self.n else ""
        return f"{self.status}: {what} on {self.n}{of} {self.unit}, {self.judge}: {self.metric}"


def judge(evidence: Evidence, max_drop: float, looks: int = 1) -> Verdict:
    """The verdict of `evidence` against `max_drop` (see Verdict)."""
    drop, low, high = evidence.interval(looks)
    if not math.isfinite(drop):
        status = BREAKS
    elif high <= max_drop:
        status = HOLDS
    elif low > max_drop:
        status = BREAKS
    else:
        status = UNRESOLVED
    return Verdict(status, evidence.judge, evidence.tier, evidence.metric, evidence.unit, evidence.n, drop, low, high,
                   max_drop, evidence.baseline, evidence.score, evidence.population, looks)


def combine(verdicts: list[Verdict]) -> str:
    """A plan judged by several judges: BREAKS if any breaks, HOLDS if all hold, else UNRESOLVED."""
    if any(v.status == BREAKS for v in verdicts):
        return BREAKS
    return HOLDS if verdicts and all(v.holds for v in verdicts) else UNRESOLVED


##### accuracy ##################################################################################

@dataclass(frozen=True)
class Accuracy:
    """One accuracy measurement of a plan, with its provenance."""

    tier: int  # 1: proxy, 2: lm-eval / user metric
    accuracy: float  # higher is better (tier 1 LM: top-1 agreement; tier 2: the task metric)
    drop: float  # baseline accuracy minus this (what max_accuracy_drop bounds)
    metrics: dict[str, float] = field(default_factory=dict)  # everything measured, e.g. {"kl": ..., "loss": ...}
    source: str = ""  # "proxy: top-1 agreement on 1024 held-out tokens", "lm-eval: autoao_facts", ...
    verdict: Verdict | None = None  # where a budget judged it

    def with_verdict(self, verdict: Verdict) -> Accuracy:
        return Accuracy(self.tier, self.accuracy, self.drop, dict(self.metrics), self.source, verdict)


def finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite float entries of a metrics dict (what JSON and Optuna can store)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


##### pricing ###################################################################################


@dataclass(frozen=True)
class Timed:
    """A target whose layers autoao runs as the engine does: their costs are timed here, and a plan's
    speed-up is measured end to end."""


@dataclass(frozen=True)
class FromBytes:
    """A target whose layers run outside autoao (llama.cpp's GGUF types, which autoao only emulates):
    their costs are estimated from weight bytes, nothing is measured end to end, and every place
    that shows the speed-up says it is an estimate, in `reason`'s words."""

    reason: str  # how the estimate is made and why, one sentence for the report


Pricing = Timed | FromBytes


def pricing_of(reason: str) -> Pricing:
    """The pricing a run file records as its `estimate` sentence (empty: timed)."""
    return FromBytes(reason) if reason else Timed()


def pricing_words(pricing: Pricing) -> str:
    """The sentence a run file records for `pricing` (empty: timed); pricing_of's inverse."""
    return pricing.reason if isinstance(pricing, FromBytes) else ""
