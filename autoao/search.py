"""The search: an Optuna study over per-layer (or per fused group) candidate choices.

Each trial picks one candidate per group (sibling layers that read the same input, found by the
profile, e.g. q/k/v and gate/up, share one choice by default, and run as one fused kernel where
the cost model says that is faster: CostModel.fusion_pays). Two objectives, both
minimized: the predicted latency (autoao.cost.CostModel: cached per-layer timings + the measured
rest) and the accuracy drop (tier 1 proxy per trial). `max_accuracy_drop` is an Optuna constraint
(`Trial.set_constraint`), so infeasible trials still teach the sampler without ever being returned.

Warm start: the first trials are enqueued: all-bf16, every uniform plan, and greedy plans that
maximize time saved under an additive tier-0 noise budget (a knapsack by savings per unit of
noise), at several budgets. The sampler (multi-objective TPE, seeded) takes over from there.

Storage: any Optuna RDB URL; SQLite in the output directory by default. Every finished trial is
committed by Optuna as it ends, so a crash or kill loses at most the running trial; running again
with the same storage and study name continues the study (enqueued seeds are not repeated). After
every trial the best feasible plan so far is written to disk (`on_best`).

Several processes (`SearchConfig.role`: a coordinator and workers, autoao.workers) can run trials
of one study on a server database. Then the budget is the study's, not the process's
(`budget_spent`: trials started by any process, a shared deadline, or the coordinator's close),
the sampler is TPE with the constant liar (running trials count as taken, so processes do not
sample the same plan), and with `heartbeat` a trial whose process died is failed by the next
process that starts a trial and retried once (Optuna's RetryHeartbeatStaleTrialCallback).

This module knows nothing about models: plans are built from group choices, and the caller passes
the cost model and the accuracy evaluator (so tests drive it with fakes).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna

from autoao import search_space
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.evaluators.sensitivity import Accuracy
from autoao.plan import Plan
from autoao.runfiles import pareto_front  # noqa: F401  (re-exported: the report's front is the search's)

##### budget ####################################################################################

@dataclass(frozen=True)
class Budget:
    """A wall-time budget (seconds) or a trial-count budget."""

    seconds: float | None = None
    trials: int | None = None

    @classmethod
    def parse(cls, text: str | int | float | Budget) -> Budget:
        """"10m", "90s", "1.5h", "2h30m" -> seconds; "200" or 200 -> trials."""
        if isinstance(text, Budget):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            if text < 1:
                raise ValueError(f"budget must be at least 1 trial, got {text}")
            return cls(trials=text)
        s = str(text).strip().lower().replace(" ", "")
        if s.isdigit():
            return cls.parse(int(s))
        parts = re.fullmatch(r"((?:\d+(?:\.\d+)?[hms])+)", s)
        if not parts:
            raise ValueError(f"budget {text!r} is neither a time (e.g. 90s, 10m, 1.5h, 1h30m) nor a number "
                             "of trials (e.g. 200)")
        seconds = sum(float(v) * {"h": 3600, "m": 60, "s": 1}[u] for v, u in re.findall(r"(\d+(?:\.\d+)?)([hms])", s))
        if seconds <= 0:
            raise ValueError(f"budget {text!r} is zero")
        return cls(seconds=seconds)

    def __str__(self) -> str:
        return f"{self.trials} trials" if self.trials is not None else f"{self.seconds:g} s"


##### groups ####################################################################################

@dataclass(frozen=True)
class Group:
    """Layers that take one choice together, and the candidate names all of them support."""

    name: str  # the Optuna parameter name
    fqns: tuple[str, ...]
    choices: tuple[str, ...]  # candidate names; BASELINE first


def make_groups(choices: dict[str, list[str]], siblings: list[tuple[str, ...]] | None = None) -> list[Group]:
    """FQN -> supported candidate names (per layer) -> groups, in layer order. Each sibling group
    (autoao.profile's ModelProfile.siblings: layers reading one input) becomes one group whose
    choices are the intersection (in the first member's order); other layers are groups of one."""
    group_of = {f: g for g in siblings or [] if all(m in choices for m in g) for f in g}
    groups: list[Group] = []
    taken: set[str] = set()
    for fqn in choices:
        if fqn in taken:
            continue
        members = list(group_of.get(fqn, (fqn,)))
        common = [c for c in choices[members[0]] if all(c in choices[m] for m in members)]
        parents = {m.rpartition(".")[0] for m in members}
        if len(members) == 1:
            name = fqn
        elif len(parents) == 1 and "" not in parents:  # "layers.0.attn.{q_proj,k_proj,v_proj}"
            name = f"{parents.pop()}.{{{','.join(m.rpartition('.')[2] for m in members)}}}"
        else:
            name = "{" + ",".join(members) + "}"
        groups.append(Group(name, tuple(members), tuple(dict.fromkeys([BASELINE, *common]))))
        taken.update(members)
    return groups


def plan_from_params(groups: list[Group], params: dict[str, str],
                     fuse: Callable[[tuple[str, ...], str], bool] | None = None, **metadata: Any) -> Plan:
    """Group choices -> Plan (bf16 choices are left out: unlisted layers stay as they are). Groups of
    several layers become fusions (one kernel) where their candidate fuses and `fuse(fqns, name)`
    says so (CostModel.fusion_pays); without `fuse`, nothing is fused."""
    layers, fusions = {}, []
    for g in groups:
        choice = params.get(g.name, BASELINE)
        if choice != BASELINE:
            cand = search_space.get(choice)
            for fqn in g.fqns:
                layers[fqn] = cand
            if len(g.fqns) > 1 and fuse is not None and cand.fusable and fuse(g.fqns, choice):
                fusions.append(g.fqns)
    return Plan(layers=layers, metadata=metadata, fusions=fusions)


##### warm start ################################################################################

def uniform_params(groups: list[Group], name: str) -> dict[str, str]:
    return {g.name: (name if name in g.choices else BASELINE) for g in groups}


def greedy_params(groups: list[Group], cost: CostModel, layer_sqnr: dict[str, dict[str, float]],
                  noise_budget: float) -> dict[str, str]:
    """Knapsack by greed: each group's options ranked by time saved per unit of added noise (tier 0:
    10^(-SQNR/10), the layer's relative output noise power, summed over its layers); take the best
    upgrades while the total noise stays within `noise_budget`."""
    options = []
    for g in groups:
        base = sum(cost.layer_us[f][BASELINE] for f in g.fqns)
        for c in g.choices:
            if c == BASELINE:
                continue
            t = sum(cost.layer_us[f].get(c, math.inf) for f in g.fqns)
            sq = [layer_sqnr.get(f, {}).get(c) for f in g.fqns]
            if not math.isfinite(t) or t >= base or any(s is None for s in sq):
                continue
            noise = sum(10 ** (-s / 10) for s in sq)  # type: ignore[operator]
            options.append(((base - t) / max(noise, 1e-12), g.name, c, noise, base - t))
    chosen: dict[str, tuple[str, float, float]] = {}
    spent = 0.0
    for _, gname, c, noise, saved in sorted(options, reverse=True):
        prev = chosen.get(gname)
        # an upgrade within a group replaces the previous choice if it saves more time
        delta = noise - (prev[1] if prev else 0.0)
        if prev and saved <= prev[2]:
            continue
        if spent + delta <= noise_budget:
            chosen[gname] = (c, noise, saved)
            spent += delta
    return {g.name: chosen.get(g.name, (BASELINE,))[0] for g in groups}


def warm_start(groups: list[Group], cost: CostModel, layer_sqnr: dict[str, dict[str, float]] | None) -> list[dict[str, str]]:
    """All-bf16, each uniform plan, and greedy plans at noise budgets 1e-4 .. 0.3 (deduplicated)."""
    names = list(dict.fromkeys(c for g in groups for c in g.choices))
    seeds = [uniform_params(groups, n) for n in names]
    if layer_sqnr:
        seeds += [greedy_params(groups, cost, layer_sqnr, b) for b in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)]
    out, seen = [], set()
    for s in seeds:
        key = tuple(sorted(s.items()))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


##### the study #################################################################################

@dataclass
class SearchConfig:
    """How the search runs. Every field has a default that suits the demo."""

    budget: Budget = field(default_factory=lambda: Budget(seconds=300))
    max_accuracy_drop: float = 0.01  # absolute, in the accuracy's own units (e.g. 0.01 = 1 point of acc)
    seed: int = 0
    storage: str | None = None  # Optuna RDB URL; None = in memory (the API passes SQLite in out_dir)
    study_name: str = "autoao"
    reserve_seconds: float = 0.0  # of a time budget, kept for what runs after the trials (final checks)
    # Several processes on one study (autoao.workers): None = this process alone (the default);
    # "coordinator" or "worker": the trial budget and `deadline` are the study's, every trial
    # records `worker` (this process's label) as a user attribute.
    role: str | None = None
    worker: str = ""
    deadline: float | None = None  # time.time() after which no process starts a trial (a shared time budget)
    heartbeat: int | None = None  # seconds between a running trial's heartbeats (RDB storage only)
    fresh_seed: bool = False  # sample unseeded (a worker: its draws must not repeat the coordinator's)
    # The tier-1 drop under which a trial is feasible; None: max_accuracy_drop (the proxy decides).
    # Where a tier-2 judge decides (lm-eval, the user's metric), the proxy only screens, wider.
    screen_drop: float | None = None

    @property
    def tier1_limit(self) -> float:
        """The drop a trial's tier-1 score may reach and stay feasible."""
        return self.max_accuracy_drop if self.screen_drop is None else self.screen_drop

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            raise ValueError(f"max_accuracy_drop must be in [0, 1] (0.01 = 1%), got {self.max_accuracy_drop}")
        if self.role not in (None, "coordinator", "worker"):
            raise ValueError(f"role must be None, 'coordinator' or 'worker', got {self.role!r}")


@dataclass
class TrialResult:
    """One finished trial, as the report and the final selection read it."""

    number: int
    params: dict[str, str]
    predicted_us: float
    drop: float
    accuracy: float
    feasible: bool
    tier: int
    seconds: float  # since the search started (this process)
    state: str  # COMPLETE / FAIL
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # the proxy's metrics (kl, loss, ...)
    worker: str = ""  # the process that ran it (several processes on one study), else ""


@dataclass
class SearchOutcome:
    study: optuna.Study
    groups: list[Group]
    trials: list[TrialResult]
    pareto: list[TrialResult]  # feasible or not, non-dominated on (latency, drop)
    best: TrialResult | None  # fastest feasible
    seconds: float
    stopped_because: str


def run_search(
    groups: list[Group],
    cost: CostModel,
    evaluate: Callable[[Plan], Accuracy],
    config: SearchConfig,
    *,
    layer_sqnr: dict[str, dict[str, float]] | None = None,
    on_trial: Callable[[TrialResult, SearchOutcome], None] | None = None,
    progress: bool = True,
) -> SearchOutcome:
    """Run (or continue) the study until the budget is spent; return every trial and the Pareto set.

    evaluate(plan) -> Accuracy must not raise for a bad plan (score it inf/-inf instead); if it does
    raise, the trial fails and the search goes on (Optuna's `catch`).
    """
    study = open_study(config)
    if config.role != "worker":  # a worker scores the coordinator's search space; it never redefines it
        study.set_user_attr("groups", [[g.name, list(g.fqns), list(g.choices)] for g in groups])
        study.set_user_attr("max_accuracy_drop", config.max_accuracy_drop)
    done_before = [t for t in study.trials if t.state.is_finished()]
    if config.role != "worker":
        seed_study(study, groups, cost, layer_sqnr)
    start = time.perf_counter()
    results = [_result(t, start) for t in done_before]
    objective = make_objective(groups, cost, evaluate, config, start)

    from tqdm.auto import tqdm

    total = config.budget.trials
    bar = tqdm(total=total, desc="search", disable=not progress, unit="trial")
    outcome = SearchOutcome(study, groups, results, [], None, 0.0, "")

    def callback(st: optuna.Study, ft: optuna.trial.FrozenTrial) -> None:
        r = _result(ft, start)
        outcome.trials.append(r)
        _refresh(outcome)
        b = outcome.best
        bar.set_postfix_str(f"best {b.predicted_us / 1e3:.2f} ms, drop {b.drop:+.4f}" if b else "no feasible plan yet")
        bar.update(1)
        if on_trial:
            on_trial(r, outcome)

    callbacks: list[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]] = [callback]
    timeout = None
    if config.budget.seconds is not None:
        timeout = max(config.budget.seconds - config.reserve_seconds, 1.0)
    n_trials = None if config.budget.trials is None else max(config.budget.trials - len(done_before), 0)
    stopped = "budget spent"
    if config.role is not None:
        # the study's budget, whoever runs the trials, checked before the first trial and after each;
        # a worker also stops at its own budget (--budget), counted alone
        n_trials = None if config.role == "coordinator" else config.budget.trials
        if config.deadline is not None:
            timeout = min(timeout or math.inf, max(config.deadline - time.time(), 0.0))
        callbacks.append(lambda st, ft: st.stop() if budget_spent(st, config) else None)
        if budget_spent(study, config):
            n_trials = 0
    if all(len(g.choices) == 1 for g in groups):  # one plan in the space: scored once
        n_trials, stopped = (0 if done_before else 1), "the search space has one plan"
    try:
        if n_trials != 0 and (timeout is None or timeout > 0):
            study.optimize(objective, n_trials=n_trials, timeout=timeout, callbacks=callbacks,
                           catch=(Exception,), gc_after_trial=False)
    except KeyboardInterrupt:
        stopped = "interrupted (finished trials are in the storage; run again to continue)"
    finally:
        bar.close()
    outcome.seconds = time.perf_counter() - start
    outcome.stopped_because = stopped
    _refresh(outcome)
    return outcome


def seed_study(study: optuna.Study, groups: list[Group], cost: CostModel,
               layer_sqnr: dict[str, dict[str, float]] | None) -> None:
    """Enqueue the warm start in a study that has no trials yet (a continued study keeps its own)."""
    if not study.trials:
        for params in warm_start(groups, cost, layer_sqnr):
            study.enqueue_trial(params, user_attrs={"seed": "warm start"})


def open_study(config: SearchConfig) -> optuna.Study:
    """The study in `config.storage` (created if missing), with the search's sampler; with
    `config.heartbeat` on an RDB URL, a storage that fails silent trials and retries them once."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shared = config.role is not None
    sampler = optuna.samplers.TPESampler(seed=None if config.fresh_seed else config.seed, multivariate=True, n_startup_trials=10, constant_liar=shared)
    storage: str | optuna.storages.BaseStorage | None = config.storage
    if config.storage and config.heartbeat:
        import warnings

        with warnings.catch_warnings():  # the heartbeat is marked experimental in some Optuna versions
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                config.storage, heartbeat_interval=config.heartbeat, grace_period=3 * config.heartbeat,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
    return optuna.create_study(study_name=config.study_name, storage=storage, sampler=sampler,
                               directions=["minimize", "minimize"], load_if_exists=True)


def make_objective(groups: list[Group], cost: CostModel, evaluate: Callable[[Plan], Accuracy],
                   config: SearchConfig, start: float) -> Callable[[optuna.Trial], tuple[float, float]]:
    """The trial: params -> plan -> (predicted us, accuracy drop), with the constraint and the
    accuracy's details as user attributes (the same in every process of a shared study)."""

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        if config.worker:  # first: a trial whose process dies mid-way still says whose it was
            trial.set_user_attr("worker", config.worker)
        params = {g.name: trial.suggest_categorical(g.name, list(g.choices)) for g in groups}
        plan = plan_from_params(groups, params, fuse=cost.fusion_pays)
        predicted = cost.predict(plan)
        acc = evaluate(plan)
        drop = acc.drop if math.isfinite(acc.drop) else math.inf
        trial.set_constraint("max_accuracy_drop", drop - config.tier1_limit)
        trial.set_user_attr("constraint", drop - config.tier1_limit)
        trial.set_user_attr("accuracy", acc.accuracy if math.isfinite(acc.accuracy) else None)
        trial.set_user_attr("tier", acc.tier)
        trial.set_user_attr("metrics", {k: v for k, v in acc.metrics.items() if math.isfinite(v)})
        trial.set_user_attr("elapsed", time.perf_counter() - start)
        return predicted, drop if math.isfinite(drop) else 1e9

    return objective


##### a study shared by several processes #######################################################

# study user attributes: the coordinator took its final trials (start no more); the study's trial budget
CLOSED, TRIALS = "autoao.closed", "autoao.trials"


def trials_toward_budget(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Trials a shared trial budget has spent: every trial started by any process, a failed trial
    and its retry counting once (the retry, WAITING until a process takes it, stands for both);
    the warm start's enqueued seeds count once taken."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    waiting = optuna.trial.TrialState.WAITING
    return sum(1 for t in trials if t.number not in retried
               and (t.state != waiting or "failed_trial" in t.system_attrs))


def budget_spent(study: optuna.Study, config: SearchConfig) -> bool:
    """The study's budget, as every process of it reads it: closed by the coordinator, past the
    shared deadline, or the trial budget taken (trials_toward_budget). Trials already running
    when it is spent finish; so processes that start a trial together can take one trial each
    past a trial budget."""
    if study.user_attrs.get(CLOSED):
        return True
    if config.deadline is not None and time.time() >= config.deadline:
        return True
    trials = config.budget.trials if config.role == "coordinator" else study.user_attrs.get(TRIALS)
    return trials is not None and trials_toward_budget(study.get_trials(deepcopy=False)) >= trials


def _result(t: optuna.trial.FrozenTrial, start: float) -> TrialResult:
    ok = t.state == optuna.trial.TrialState.COMPLETE and t.values is not None
    pred, drop = (t.values if ok else (math.inf, math.inf))
    drop = math.inf if drop >= 1e9 else drop
    acc = t.user_attrs.get("accuracy")
    return TrialResult(
        number=t.number, params=dict(t.params), predicted_us=pred, drop=drop,
        accuracy=acc if acc is not None else -math.inf,
        feasible=ok and t.user_attrs.get("constraint", math.inf) <= 0, tier=t.user_attrs.get("tier", 1),
        seconds=t.user_attrs.get("elapsed", math.nan), state=t.state.name,
        error=str(t.system_attrs.get("fail_reason", "")) if not ok else "",
        metrics=dict(t.user_attrs.get("metrics") or {}), worker=str(t.user_attrs.get("worker", "")),
    )


def _refresh(outcome: SearchOutcome) -> None:
    done = [r for r in outcome.trials if r.state == "COMPLETE"]
    feasible = [r for r in done if r.feasible]
    outcome.best = min(feasible, key=lambda r: (r.predicted_us, r.drop)) if feasible else None
    outcome.pareto = pareto_front(done)
