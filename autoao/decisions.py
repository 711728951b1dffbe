"""The decisions a run records: one frozen dataclass per kind, each with its own `describe()`, in a
registry keyed by kind (as the candidates are). A leaf module: the stages write decisions, the report
reads them, and neither parses the other's prose.

    BusyCpu(threads=2, threads_ms=18.8, one_ms=0.55).describe()
    decision_from_dict({"kind": "busy_cpu", ...}) -> BusyCpu(...)

`ends_unchanged`: a decision that, when it is the run's last word, is why the model stayed as it came.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autoao.types import Verdict


@dataclass(frozen=True)
class Decision:
    """One step of a run's choice, as data."""

    kind: ClassVar[str] = ""
    ends_unchanged: ClassVar[bool] = False

    def describe(self) -> str:
        raise NotImplementedError

    @property
    def trial_number(self) -> int | None:
        """The trial the decision is about, if any."""
        return getattr(self, "trial", None)


DECISIONS: dict[str, type[Decision]] = {}


def decision(cls: type[Decision]) -> type[Decision]:
    """Register a decision class by its `kind`."""
    if not cls.kind or cls.kind in DECISIONS:
        raise ValueError(f"decision kind {cls.kind!r} is empty or taken")
    DECISIONS[cls.kind] = cls
    return cls


def decision_type(kind: str) -> type[Decision]:
    """The class of `kind`; ValueError with the close names otherwise."""
    if kind in DECISIONS:
        return DECISIONS[kind]
    close = difflib.get_close_matches(kind, DECISIONS, n=3)
    raise ValueError(f"unknown decision kind {kind!r}." + (f" Did you mean: {', '.join(close)}?" if close else "")
                     + f" Known: {', '.join(DECISIONS)}")


def decision_fields(d: Decision) -> dict[str, Any]:
    """The decision's fields with its kind, for JSON."""
    return {"kind": d.kind, **{f.name: getattr(d, f.name) for f in dataclasses.fields(d)}}


def _s(n: float) -> str:
    return "" if n == 1 else "s"


##### the inputs ###############################################################################

@decision
@dataclass(frozen=True)
class Note(Decision):
    """Free text (run files of an earlier autoao, whose decisions were not typed)."""

    kind: ClassVar[str] = "note"
    reason: str = ""

    def describe(self) -> str:
        return self.reason


@decision
@dataclass(frozen=True)
class BusyCpu(Decision):
    """Another process had the CPU: the smallest example ran faster on one thread, so the run did."""

    kind: ClassVar[str] = "busy_cpu"
    threads: int = 0
    threads_ms: float = 0.0
    one_ms: float = 0.0

    def describe(self) -> str:
        return (f"the CPU is busy with other work: a probe call (the smallest example, or one layer's product at 256 "
                f"rows) took {self.threads_ms:.1f} ms on "
                f"{self.threads} threads and {self.one_ms:.1f} ms on one, so this run timed and measured everything on "
                f"one thread (its speed-ups are one thread's; run again on an idle machine to measure {self.threads})")


@decision
@dataclass(frozen=True)
class HeldOutInputs(Decision):
    """The judges' inputs, built by autoao: none were given (eval_inputs), or too few."""

    kind: ClassVar[str] = "held_out_inputs"
    given: int | None = None  # positions (or rows) in the eval_inputs given; None: none given
    minimum: int = 0  # what a verdict needs at least
    positions: int = 0  # what the proxy's screen scores
    source: str = ""  # "token positions of the model's own samples", "rows of inputs like the examples", ...
    unit: str = "positions"  # what `given` and `minimum` count: token positions, or rows

    def describe(self) -> str:
        lead = ("no held-out inputs were given (eval_inputs)" if self.given is None else
                f"the held-out inputs given hold {self.given} {self.unit}, fewer than the {self.minimum} a verdict needs")
        return f"{lead}: the accuracy judges score {self.positions} held-out {self.source}"


##### the search and the judges ################################################################

@decision
@dataclass(frozen=True)
class NoFeasiblePlan(Decision):
    kind: ClassVar[str] = "no_feasible_plan"
    ends_unchanged: ClassVar[bool] = True

    def describe(self) -> str:
        return "no trial met the accuracy budget on the proxy: keeping the model as it came"


@decision
@dataclass(frozen=True)
class Judged(Decision):
    """A plan of the Pareto front judged by the accuracy judges before it could ship."""

    kind: ClassVar[str] = "judged"
    trial: int = -1
    predicted_ms: float = 0.0
    proxy_drop: float = 0.0  # on the search's screen
    status: str = ""  # holds / breaks / unresolved: every judge's verdict combined
    verdicts: tuple[Verdict, ...] = ()
    seconds: float = 0.0  # what judging it took
    metrics: dict[str, float] = field(default_factory=dict)  # the deciding judge's, on the evidence it took

    def describe(self) -> str:
        said = "; ".join(v.describe() for v in self.verdicts) or "no judge ran"
        return (f"trial {self.trial} (predicted {self.predicted_ms:.3f} ms, screen drop {self.proxy_drop:+.4f}) "
                f"{self.status}, {self.seconds:.0f} s: {said}")


@decision
@dataclass(frozen=True)
class NoneHeld(Decision):
    kind: ClassVar[str] = "none_held"
    ends_unchanged: ClassVar[bool] = True
    checked: int = 0
    unresolved: int = 0  # of them, plans the evidence the budget allowed could not settle

    def describe(self) -> str:
        why = (f" ({self.unresolved} unresolved: too few positions or documents within the time budget to show "
               "them within it; a larger budget judges on more)" if self.unresolved else "")
        return (f"none of the {self.checked} plans tried was verified (held on every judge and measured faster){why}: "
                "keeping the model as it came")


##### the anytime run ###########################################################################

@decision
@dataclass(frozen=True)
class Verified(Decision):
    """A plan held on every judge and was measured faster than the incumbent: the new incumbent."""

    kind: ClassVar[str] = "verified"
    trial: int = -1
    plan: str = ""  # the plan in words
    speedup: float = 1.0  # measured against the model as it came: the paired estimate
    bound: float = 1.0  # its 95% lower bound
    rounds: int = 0
    at_s: float = 0.0  # seconds since the run began
    source: str = ""  # what proposed it: uniform, fallback, search

    def describe(self) -> str:
        return (f"verified at {self.at_s:.0f} s: trial {self.trial} ({self.source} plan: {self.plan}) holds and runs "
                f"{self.speedup:.2f}x (at least {self.bound:.2f}x, {self.rounds} interleaved rounds): the best plan so far")


@decision
@dataclass(frozen=True)
class NotFaster(Decision):
    """A plan predicted faster than the incumbent was not measured faster end to end."""

    kind: ClassVar[str] = "not_faster"
    trial: int = -1
    speedup: float = 1.0  # the plan's paired estimate against the model as it came
    bound: float = 1.0
    rounds: int = 0
    incumbent: float = 1.0  # the incumbent's measured speed-up (1.0: the model as it came)
    workload: bool = False  # True: faster on the forward pass, not in the user's workload

    def describe(self) -> str:
        where = "in your workload" if self.workload else "end to end"
        than = "the model as it came" if self.incumbent <= 1.0 else f"the best plan so far ({self.incumbent:.2f}x)"
        why = " (no measurable change)" if self.speedup > max(self.incumbent, 1.0) else ""
        return (f"trial {self.trial} measured {self.speedup:.2f}x {where} (at least {self.bound:.2f}x, {self.rounds} "
                f"rounds): not shown faster than {than}{why}, so it is not verified")


@decision
@dataclass(frozen=True)
class CheckDidNotFit(Decision):
    """The run ended before a plan worth verifying could be: what it needed, and a budget that holds it."""

    kind: ClassVar[str] = "check_did_not_fit"
    ends_unchanged: ClassVar[bool] = True
    trial: int = -1
    plan: str = ""
    needed_s: float = 0.0  # verifying it: its judges' first looks and its measurement, at this run's rates
    left_s: float = 0.0  # what the budget had left
    suggest_s: float = 0.0  # a time budget that would have held the check

    def describe(self) -> str:
        return (f"the first plan worth verifying, trial {self.trial} ({self.plan}), needed about {self.needed_s:.0f} s "
                f"to judge and measure and {self.left_s:.0f} s were left; a budget of about {self.suggest_s:.0f} s "
                "would have held its check")


@decision
@dataclass(frozen=True)
class RunInterrupted(Decision):
    """The run was stopped by a signal; it wrote the best plan verified by then."""

    kind: ClassVar[str] = "interrupted"
    signal: str = ""  # SIGINT / SIGTERM
    at_s: float = 0.0
    kept: str = ""  # what was written, in words

    def describe(self) -> str:
        return (f"interrupted by {self.signal} at {self.at_s:.0f} s: kept {self.kept}; the same command with the same "
                "output folder continues from it")


@decision
@dataclass(frozen=True)
class Resumed(Decision):
    """The run continued from what an earlier run of the same command verified (anytime.json)."""

    kind: ClassVar[str] = "resumed"
    plan: str = ""
    speedup: float = 1.0
    tried: int = 0  # plans already judged, not judged again

    def describe(self) -> str:
        return (f"continued from the earlier run's best plan ({self.plan}, {self.speedup:.2f}x measured then) and its "
                f"{self.tried} plans already tried")


##### end to end ################################################################################

@decision
@dataclass(frozen=True)
class KeptUnchanged(Decision):
    """The chosen plan was not shown faster than the model as it came."""

    kind: ClassVar[str] = "kept_unchanged"
    ends_unchanged: ClassVar[bool] = True
    trial: int | None = None
    plan_ms: float = 0.0
    baseline_ms: float = 0.0
    low: float = 0.0  # lowest per-round ratio
    high: float = 0.0
    rounds: int = 0
    estimate: float | None = None  # the paired speed-up (where rounds give one)
    bound: float | None = None  # its 95% lower bound

    def describe(self) -> str:
        paired = (f"; paired {self.estimate:.2f}x, at least {self.bound:.2f}x with 95% confidence"
                  if self.estimate is not None and self.bound is not None else "")
        faster = self.estimate > 1.0 if self.estimate is not None else self.high > 1.0
        return (f"the chosen plan (trial {self.trial}) measured {self.plan_ms:.3f} ms end to end, the model as it came "
                f"{self.baseline_ms:.3f} ms (per round {self.low:.2f}x to {self.high:.2f}x over {self.rounds} interleaved "
                f"rounds{paired}): {'no measurable change' if faster else 'not faster'}, so the model stays as it came")


@decision
@dataclass(frozen=True)
class ShippedOnEstimate(Decision):
    """The plan shipped on its verdicts with an estimated speed-up: its target runs layers autoao
    only emulates, so timing it here would measure the emulation."""

    kind: ClassVar[str] = "shipped_on_estimate"
    trial: int | None = None
    estimate: float = 1.0  # the cost model's speed-up
    why: str = ""  # how the estimate was made (Target.pricing: its FromBytes reason)

    def describe(self) -> str:
        return f"the chosen plan (trial {self.trial}) ships on its verdicts; its speed-up, {self.estimate:.2f}x, is {self.why}"


@decision
@dataclass(frozen=True)
class BestIsUnchanged(Decision):
    kind: ClassVar[str] = "best_is_unchanged"
    ends_unchanged: ClassVar[bool] = True
    trial: int = -1

    def describe(self) -> str:
        return (f"the fastest plan found within the accuracy budget on the screen (trial {self.trial}) changes no layer "
                "or is predicted too little faster to verify; a larger budget lets the search try more plans")


@decision
@dataclass(frozen=True)
class NothingToTry(Decision):
    """No plan could be tried: no candidate runs here, or the time budget ran out first."""

    kind: ClassVar[str] = "nothing_to_try"
    ends_unchanged: ClassVar[bool] = True
    not_timed: int = 0  # cells the time budget left untimed
    stage: str = ""  # the stage that spent the budget (a RunSummary.stages name)
    stage_s: float = 0.0
    suggest_s: float = 0.0  # a time budget that would let the search try plans
    reserve_s: float = 0.0  # what the time plan kept for judging a plan and the final measurement

    def describe(self) -> str:
        if not self.stage:
            if self.not_timed:
                return (f"the time budget ran out before any candidate but the unchanged one was timed ({self.not_timed} "
                        "cells not timed), so no plan could be tried; a larger budget lets the search try plans")
            return "no layer has a candidate other than the unchanged one that runs here, so no plan could be tried"
        # said when the time plan is built, before timing; the run's record adds the cells left untimed
        untimed = f" ({self.not_timed} timing cells never timed)" if self.not_timed else ""
        return (f"the time budget is too short to try plans: '{self.stage}' took {self.stage_s:.0f} s of it and "
                f"verifying a first plan (its accuracy checked and its speed measured) needs about "
                f"{self.reserve_s:.0f} s{untimed}; a budget of about {self.suggest_s:.0f} s lets the search try plans")

    def warning(self) -> str:
        """The same said ahead, when the time plan is made: the run goes on with what fits."""
        return (f"the time budget leaves the search little room: '{self.stage}' took {self.stage_s:.0f} s of it and "
                f"verifying a first plan needs about {self.reserve_s:.0f} s; the run goes on with what fits (a "
                f"budget of about {self.suggest_s:.0f} s lets the search try plans)")


@decision
@dataclass(frozen=True)
class StudyClosed(Decision):
    """Several processes ran the trials; what the coordinator did at the close."""

    kind: ClassVar[str] = "study_closed"
    processes: int = 0
    waited_s: float = 0.0
    running: int = 0
    retried: int = 0
    per_process: str = ""  # "coordinator@h:1 12, worker@h:2 9"

    def describe(self) -> str:
        text = (f"{self.processes} processes ran the trials ({self.per_process}); at the close the coordinator waited "
                f"{self.waited_s:.1f} s for running trials")
        if self.retried:
            text += f" and ran {self.retried} retried trial(s) of a lost process itself"
        if self.running:
            text += f"; {self.running} trial(s) still running were left out of the choice"
        return text
