"""The search: an Optuna study over per-layer (or per fused group) candidate choices.

Each trial picks one candidate per group (sibling layers that read the same input, found by the
profile, e.g. q/k/v and gate/up, share one choice by default, and run as one fused kernel where
the cost model says that is faster: CostModel.fusion_pays). Two objectives, both
minimized: the predicted latency (autoao.cost.CostModel: cached per-layer timings + the measured
rest) and the accuracy drop (tier 1 proxy per trial). Feasibility is the accuracy budget's
(autoao.budget.AccuracyBudget.feasible), decided once per trial and recorded with it
(autoao.records.TrialRecord); it is also an Optuna constraint (`Trial.set_constraint`), so
infeasible trials still teach the sampler without ever being returned.

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
import time
from dataclasses import dataclass
from typing import Any, Callable

import optuna

from autoao import search_space
from autoao.budget import AccuracyBudget
from autoao.common import BASELINE
from autoao.cost import CostModel
from autoao.plan import Plan
from autoao.records import TrialRecord, pareto_front
from autoao.types import Accuracy

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


def predicted_us(groups: list[Group], cost: CostModel, params: dict[str, str]) -> float:
    """The cost model's time for the plan of `params`, fused where fusion pays (as trials are priced)."""
    return cost.predict(plan_from_params(groups, params, fuse=cost.fusion_pays))


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


FALLBACK_SHARES = (0.1, 0.25, 0.5)  # the most sensitive groups a fallback seed keeps off the fastest candidate


def fallback_params(groups: list[Group], cost: CostModel, layer_sqnr: dict[str, dict[str, float]],
                    share: float) -> dict[str, str]:
    """The fastest candidate on every group but the `share` most sensitive ones (Intel Neural
    Compressor's fallback order, ranked by the measured layer error: the lowest tier-0 SQNR of the
    group's layers under its fastest candidate, unmeasured first), which take their most accurate
    candidate that is still faster than the unchanged layers, else stay unchanged."""
    def us(g: Group, c: str) -> float:
        return sum(cost.layer_us[f].get(c, math.inf) for f in g.fqns)

    def sqnr(g: Group, c: str) -> float:
        return min((layer_sqnr.get(f, {}).get(c, -math.inf) for f in g.fqns), default=-math.inf)

    fastest = {g.name: min(g.choices, key=lambda c: us(g, c)) for g in groups}
    changed = [g for g in groups if fastest[g.name] != BASELINE]
    ranked = sorted(changed, key=lambda g: sqnr(g, fastest[g.name]))
    out = dict(fastest)
    for g in ranked[:math.ceil(share * len(ranked))]:
        safer = [c for c in g.choices if c not in (BASELINE, fastest[g.name]) and us(g, c) < us(g, BASELINE)]
        out[g.name] = max(safer, key=lambda c: sqnr(g, c)) if safer else BASELINE
    return out


def uniform_names(groups: list[Group]) -> list[str]:
    """Every candidate some group may take, the unchanged one first: the warm start's uniform plans."""
    return list(dict.fromkeys(c for g in groups for c in g.choices))


def warm_start(groups: list[Group], cost: CostModel, layer_sqnr: dict[str, dict[str, float]] | None) -> list[dict[str, str]]:
    """All-bf16, then each uniform plan, predicted fastest first (a budget that ends after a few
    trials has scored the plans most worth verifying), the fastest candidates but on the most
    sensitive groups (fallback_params, at FALLBACK_SHARES), and greedy plans at noise budgets 1e-4 ..
    0.3 (deduplicated)."""
    names = uniform_names(groups)  # the unchanged one first
    seeds = [uniform_params(groups, n) for n in names[:1]]
    uniform = (uniform_params(groups, n) for n in names[1:])
    seeds += sorted(uniform, key=lambda params: predicted_us(groups, cost, params))
    if layer_sqnr:
        seeds += [fallback_params(groups, cost, layer_sqnr, share) for share in FALLBACK_SHARES]
        seeds += [greedy_params(groups, cost, layer_sqnr, b) for b in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3)]
    out, seen = [], set()
    for s in seeds:
        key = tuple(sorted(s.items()))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


##### the study #################################################################################

@dataclass(frozen=True)
class SearchConfig:
    """How the search runs, built once by the caller. Every field but the accuracy budget has a
    default that suits one process."""

    accuracy: AccuracyBudget
    trials: int | None = None  # a trial budget (None: until `seconds`, `stop` or the study's budget)
    seconds: float | None = None  # the time the trials may take (None: no time limit)
    seed: int = 0
    storage: str | None = None  # Optuna RDB URL; None = in memory (the API passes SQLite in out_dir)
    study_name: str = "autoao"
    # Several processes on one study (autoao.workers): None = this process alone (the default);
    # "coordinator" or "worker": the trial budget and `deadline` are the study's, every trial
    # records `worker` (this process's label).
    role: str | None = None
    worker: str = ""
    deadline: float | None = None  # time.time() after which no process starts a trial (a shared time budget)
    heartbeat: int | None = None  # seconds between a running trial's heartbeats (RDB storage only)
    fresh_seed: bool = False  # sample unseeded (a worker: its draws must not repeat the coordinator's)

    def __post_init__(self) -> None:
        if self.role not in (None, "coordinator", "worker"):
            raise ValueError(f"role must be None, 'coordinator' or 'worker', got {self.role!r}")


@dataclass
class SearchOutcome:
    study: optuna.Study
    groups: list[Group]
    trials: list[TrialRecord]
    pareto: list[TrialRecord]  # feasible or not, non-dominated on (latency, drop)
    best: TrialRecord | None  # fastest feasible
    seconds: float
    stopped_because: str


def run_search(
    groups: list[Group],
    cost: CostModel,
    evaluate: Callable[[Plan], Accuracy],
    config: SearchConfig,
    *,
    layer_sqnr: dict[str, dict[str, float]] | None = None,
    on_trial: Callable[[TrialRecord, SearchOutcome], None] | None = None,
    stop: Callable[[], bool] | None = None,
    progress: bool = True,
    queued_only: int | None = None,
) -> SearchOutcome:
    """Run (or continue) the study until the budget is spent; return every trial and the Pareto set.

    evaluate(plan) -> Accuracy (the proxy's, with its screen verdict) must not raise for a bad plan
    (score it inf/-inf instead); if it does raise, the trial fails and the search goes on (Optuna's
    `catch`). `stop()`, asked after every trial, ends the search early (the time plan's re-planned
    deadline). `queued_only`: run at most that many of the trials queued in the study (the warm
    start's seeds, in their order: the plans a first verification picks from), none sampled. A KeyboardInterrupt (Ctrl-C, the run's
    Interrupted) fails the running trial and propagates: every finished trial is in the storage.
    """
    study = open_study(config)
    if config.role != "worker":  # a worker scores the coordinator's search space; it never redefines it
        study.set_user_attr("groups", [[g.name, list(g.fqns), list(g.choices)] for g in groups])
        study.set_user_attr("max_accuracy_drop", config.accuracy.max_drop)
        seed_study(study, groups, cost, layer_sqnr)
    done_before = [TrialRecord.read(t) for t in study.trials if t.state.is_finished()]
    start = time.perf_counter()
    from tqdm.auto import tqdm  # lazy: tqdm.auto looks for notebooks at import

    bar = tqdm(total=config.trials, desc="search", disable=not progress, unit="trial")
    outcome = SearchOutcome(study, groups, done_before, [], None, 0.0, "")
    callback = _after_trial(outcome, bar, config, on_trial, stop)
    n_trials, timeout, stopped = _limits(study, groups, config, len(done_before), queued_only)
    try:
        if n_trials != 0 and (timeout is None or timeout > 0):
            study.optimize(make_objective(groups, cost, evaluate, config, start), n_trials=n_trials, timeout=timeout,
                           callbacks=[callback], catch=(Exception,), gc_after_trial=False)
    finally:
        bar.close()
    outcome.seconds = time.perf_counter() - start
    outcome.stopped_because = stopped
    refresh(outcome)
    return outcome


def _after_trial(outcome: SearchOutcome, bar: Any, config: SearchConfig,
                 on_trial: Callable[[TrialRecord, SearchOutcome], None] | None,
                 stop: Callable[[], bool] | None) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Optuna's callback after each trial: the record added to `outcome`, its best and front
    refreshed, the progress bar, `on_trial`, then the study stopped when its budget is spent or
    `stop()` says so."""
    def callback(st: optuna.Study, ft: optuna.trial.FrozenTrial) -> None:
        r = TrialRecord.read(ft)
        outcome.trials.append(r)
        refresh(outcome)
        b = outcome.best
        bar.set_postfix_str(f"best {b.predicted_ms:.2f} ms, drop {b.drop:+.4f}" if b else "no feasible plan yet")
        bar.update(1)
        if on_trial:
            on_trial(r, outcome)
        if budget_spent(st, config) or (stop is not None and stop()):
            st.stop()
    return callback


def _limits(study: optuna.Study, groups: list[Group], config: SearchConfig, done: int,
            queued_only: int | None = None) -> tuple[int | None, float | None, str]:
    """(trials to run, seconds, why they stop). Alone: the config's trials less those done before
    and its seconds; in a shared study: the study's budget, whoever runs the trials (a worker also
    stops at its own trial count), and the shared deadline; `queued_only`: at most that many of the
    trials queued in the study."""
    if queued_only is not None:
        n_trials, timeout, _ = _limits(study, groups, config, done)
        waiting = min(queued_only, len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))))
        return min(n_trials if n_trials is not None else waiting, waiting), timeout, "the warm start's seeds scored"
    if config.seconds is not None and config.seconds <= 0:
        return 0, 0.0, "no time was left for trials"
    timeout = max(config.seconds, 1.0) if config.seconds is not None else None
    n_trials = None if config.trials is None else max(config.trials - done, 0)
    if config.role is not None:
        n_trials = None if config.role == "coordinator" else config.trials
        if config.deadline is not None:
            timeout = min(timeout or math.inf, max(config.deadline - time.time(), 0.0))
        if budget_spent(study, config):
            n_trials = 0
    if all(len(g.choices) == 1 for g in groups):  # one plan in the space: scored once
        return (0 if done else 1), timeout, "the search space has one plan"
    return n_trials, timeout, "budget spent"


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
    """The trial: params -> plan -> (predicted us, accuracy drop); the accuracy budget decides its
    feasibility, recorded with it (TrialRecord.attrs) and given to the sampler as the constraint.
    A plan predicted slower than the model as it came is not scored: it can never ship (the
    unchanged model is faster and drops nothing), and its proxy pass can cost many times the
    unchanged model's (MiniLM on the CPU: uniform int4 g32 38 s, int8_wo 19 s, bf16 under 1 s)."""
    unchanged = predicted_us(groups, cost, {g.name: BASELINE for g in groups})

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        if config.worker:  # first: a trial whose process dies mid-way still says whose it was
            trial.set_user_attr("worker", config.worker)
        params = {g.name: trial.suggest_categorical(g.name, list(g.choices)) for g in groups}
        plan = plan_from_params(groups, params, fuse=cost.fusion_pays)
        predicted = cost.predict(plan)
        acc = (evaluate(plan) if predicted <= unchanged else
               Accuracy(1, -math.inf, math.inf, {}, f"not scored: predicted {predicted / 1e3:.3f} ms, slower than "
                                                   f"the model as it came ({unchanged / 1e3:.3f} ms)"))
        feasible = config.accuracy.feasible(acc)
        drop = acc.drop if math.isfinite(acc.drop) else math.inf
        # <= 0 is feasible for the sampler; an infeasible trial's distance past the screen (1 if not finite)
        trial.set_constraint("max_accuracy_drop", 0.0 if feasible else min(drop - config.accuracy.limit(acc.tier), 1.0))
        trial.set_user_attr(TrialRecord.ATTR, TrialRecord.attrs(acc, feasible, time.perf_counter() - start))
        return predicted, drop

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
    if config.role is None:
        return False
    if study.user_attrs.get(CLOSED):
        return True
    if config.deadline is not None and time.time() >= config.deadline:
        return True
    trials = config.trials if config.role == "coordinator" else study.user_attrs.get(TRIALS)
    return trials is not None and trials_toward_budget(study.get_trials(deepcopy=False)) >= trials


def refresh(outcome: SearchOutcome) -> None:
    """The outcome's best (fastest feasible) trial and Pareto front, from its trials."""
    done = [r for r in outcome.trials if r.state == "COMPLETE"]
    feasible = [r for r in done if r.feasible]
    outcome.best = min(feasible, key=lambda r: (r.predicted_us, r.drop)) if feasible else None
    outcome.pareto = pareto_front(done)
