"""Several processes, one search: a coordinator and `autoao worker` processes sharing one Optuna
study on a database server (PostgreSQL; any RDB URL but SQLite, which serves one process).

    coordinator (`optimize(..., storage="postgresql://...")`)      worker (`autoao worker`)
      profile, time, layer errors, proxy reference                   load the same model
      publish(): warm start enqueued, SharedInputs as a study        join(): wait for the study and
        user attribute, then workers may start                         its SharedInputs
      trials (run_search, role "coordinator")                        fingerprint checked, profile and
      close(): no new trials, wait for the running ones,               proxy reference recomputed
        run queued retries, every process's trials read back         trials (run_search, role "worker")
      tier-2 checks, re-rank, end-to-end comparison, plan, report      until the study's budget is spent

What a worker needs to score a trial exactly as the coordinator does is published once (JSON):
the search space (groups), the cost model, the tier-0 layer errors, the proxy's baseline, the
budget (trial count and deadline) and a fingerprint of what was measured (the weights' key, the
inputs' digest, the model's class, the device type). A worker recomputes what is too large to
publish (the calibration statistics, the proxy's reference outputs) from the model it loads, and
refuses to run when that model's fingerprint is not the study's.

Faults are Optuna's: every process's storage has a heartbeat, so a trial whose process died stays
RUNNING only until the next process starts a trial (or the coordinator closes the study), then it
is FAIL and enqueued once again (RetryHeartbeatStaleTrialCallback); finished trials are committed
as they end and never lost.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import optuna
import torch
from torch import nn

from autoao.budget import AccuracyBudget
from autoao.common import cache_dir, model_device
from autoao.cost import CostModel
from autoao.decisions import StudyClosed
from autoao.evaluators.cache import ResultCache, digest, weights_key
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.ledger import RunLedger
from autoao.plan import Plan
from autoao.records import TrialRecord
from autoao.stages.bench import ModelBench
from autoao.stages.inputs import Inputs, build_inputs
from autoao.stages.judges import Judges, plan_key, screened
from autoao.stages.search import (CLOSED, TRIALS, Group, SearchConfig, SearchOutcome, make_objective, open_study, refresh,
                           run_search, seed_study)
from autoao.types import Accuracy, Budget

SHARED = "autoao.shared"  # study user attribute: SharedInputs as JSON
FORMAT = 2  # of SharedInputs; a worker refuses another
DEFAULT_HEARTBEAT = 10  # seconds; a silent trial is failed after 3x this


def label(role: str) -> str:
    """This process's name on its trials: "worker@host:pid"."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def driver_url(url: str) -> str:
    """A PostgreSQL URL without a driver names psycopg2 for SQLAlchemy; the driver autoao's test
    extra installs is psycopg (3): use it when psycopg2 is absent. Any other URL as given."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgresql", "postgres") and importlib.util.find_spec("psycopg2") is None \
            and importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg://{rest}"
    return url


def is_server(url: str) -> bool:
    """True for a database server's URL (one study, many processes); False for SQLite."""
    return not url.strip().lower().startswith("sqlite")


def shown(url: str) -> str:
    """The URL for messages, its password hidden."""
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL: shown as given (the caller's error says so)
        return url


##### what a worker checks and reads ############################################################

@dataclass(frozen=True)
class Fingerprint:
    """What the coordinator measured; a worker's model must give the same."""

    model: str  # the model's class
    weights: str  # digest of its state dict (measure.Baselines.weights_key)
    inputs: str  # digest of the example and held-out inputs (inputs_digest)
    device: str  # device type: timings and errors are measured on it

    def text(self) -> str:
        return f"{self.model} on {self.device} (weights {self.weights[:12]}, inputs {self.inputs[:12]})"


def inputs_digest(examples: Any, eval_inputs: Any) -> str:
    """Digest of nested inputs (tensors by content, the nesting and anything else by repr)."""
    tensors: list[torch.Tensor] = []

    def walk(obj: Any) -> str:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
            return "T"
        if isinstance(obj, (list, tuple)):
            return "(" + ",".join(walk(v) for v in obj) + ")"
        if isinstance(obj, dict):
            return "{" + ",".join(f"{k!r}:{walk(v)}" for k, v in obj.items()) + "}"
        return repr(obj)

    structure = walk([examples, eval_inputs])
    return digest("inputs", structure, *tensors)


def fingerprint(model: nn.Module, weights_key: str, examples: Any, eval_inputs: Any,
                device: torch.device) -> Fingerprint:
    return Fingerprint(type(model).__name__, weights_key, inputs_digest(examples, eval_inputs), device.type)


@dataclass
class SharedInputs:
    """Everything a worker scores trials with, as the coordinator measured it."""

    fingerprint: Fingerprint
    groups: list[Group]
    cost: CostModel
    sqnr: dict[str, dict[str, float]]  # tier 0: FQN -> candidate -> SQNR (dB)
    proxy_baseline: dict[str, float]  # tier 1 of the unchanged model: every process's drops are from it
    accuracy: AccuracyBudget  # the budget every process's trials are judged against
    trials: int | None  # the study's trial budget
    deadline: float | None  # time.time() after which no trial starts
    heartbeat: int
    seed: int = 0  # the coordinator's: held-out inputs it drew are drawn alike here
    screen_positions: int = 512  # the coordinator's screen size (options.Options.screen_positions)

    def to_json(self) -> str:
        cost = {"layer_us": self.cost.layer_us, "rest_us": self.cost.rest_us,
                "emulated": {f: sorted(v) for f, v in self.cost.emulated.items()},
                "fused_us": [[list(g), per] for g, per in self.cost.fused_us.items()]}
        # inf (a candidate that failed on a layer) is written as JSON's Infinity, which json reads back
        return json.dumps({"format": FORMAT, "fingerprint": asdict(self.fingerprint),
                           "groups": [[g.name, list(g.fqns), list(g.choices)] for g in self.groups], "cost": cost,
                           "sqnr": self.sqnr, "proxy_baseline": self.proxy_baseline,
                           "accuracy": asdict(self.accuracy), "trials": self.trials, "deadline": self.deadline,
                           "heartbeat": self.heartbeat, "seed": self.seed,
                           "screen_positions": self.screen_positions})

    @classmethod
    def from_json(cls, text: str) -> SharedInputs:
        d = json.loads(text)
        if d.get("format") != FORMAT:
            raise ValueError(f"the study's shared inputs are format {d.get('format')}, this autoao reads {FORMAT}: "
                             "run the same autoao version on the coordinator and the workers")
        c = d["cost"]
        cost = CostModel(c["layer_us"], {f: set(v) for f, v in c["emulated"].items()}, c["rest_us"],
                         {tuple(g): per for g, per in c["fused_us"]})
        return cls(Fingerprint(**d["fingerprint"]), [Group(n, tuple(f), tuple(ch)) for n, f, ch in d["groups"]],
                   cost, d["sqnr"], d["proxy_baseline"], AccuracyBudget(**d["accuracy"]), d["trials"], d["deadline"],
                   d["heartbeat"], d["seed"], d["screen_positions"])


##### the coordinator ###########################################################################

def publish(config: SearchConfig, groups: list[Group], cost: CostModel, sqnr: dict[str, dict[str, float]],
            judges: Judges, model: nn.Module, work: Inputs) -> optuna.Study:
    """Open the study, enqueue the warm start, then publish the shared inputs (workers wait for
    them, so they never see a study without its seeds)."""
    study = open_study(config)
    seed_study(study, groups, cost, sqnr)
    shared = SharedInputs(fingerprint(model, judges.weights_key, work.examples, work.held_out.inputs, work.device),
                          groups, cost, sqnr, dict(judges.proxy.baseline), judges.budget, config.trials,
                          config.deadline, config.heartbeat or 0, config.seed, work.held_out.positions)
    study.set_user_attr(TRIALS, config.trials)
    study.set_user_attr(CLOSED, False)
    study.set_user_attr(SHARED, shared.to_json())
    return study


def close(outcome: SearchOutcome, config: SearchConfig, cost: CostModel, evaluate: Callable[[Plan], Accuracy],
          ledger: RunLedger, keep: float = 0.0) -> StudyClosed:
    """End the study's trials: no process starts another; the running ones are waited for, up to
    3x the median trial (at least the heartbeat's grace period and one beat, so a dead process's
    trial is found and failed) within what a time budget has left after `keep` seconds; queued retries (trials
    of a lost process, failed and enqueued again) run here. Then `outcome` holds every process's
    finished trials. Returns what happened, as a decision."""
    study = outcome.study
    study.set_user_attr(CLOSED, True)
    states = optuna.trial.TrialState
    done = study.get_trials(deepcopy=False, states=(states.COMPLETE,))
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done
                 if t.datetime_start and t.datetime_complete]
    hb = config.heartbeat or 0
    wait = max(3 * statistics.median(durations) if durations else 0.0, 4.0 * hb)
    left = ledger.remaining()
    if left is not None:
        wait = min(wait, max(left - keep, 0.0))
    t0 = time.monotonic()
    while True:
        _fail_stale(study)
        running = study.get_trials(deepcopy=False, states=(states.RUNNING,))
        if not running or time.monotonic() - t0 >= wait:
            break
        time.sleep(0.2)
    waited = time.monotonic() - t0
    objective = make_objective(outcome.groups, cost, evaluate, config, time.perf_counter())
    retried = _run_retries(study, config.storage, objective)
    outcome.trials = [TrialRecord.read(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    refresh(outcome)
    per: dict[str, int] = {}
    for r in outcome.trials:
        if r.state == "COMPLETE":
            per[r.worker or "?"] = per.get(r.worker or "?", 0) + 1
    running_left = len(study.get_trials(deepcopy=False, states=(states.RUNNING,)))
    return StudyClosed(len(per), round(waited, 2), running_left, retried,
                       ", ".join(f"{w} {n}" for w, n in sorted(per.items())))


def _run_retries(study: optuna.Study, storage_url: str | None,
                 objective: Callable[[optuna.Trial], tuple[float, float]]) -> int:
    """Run here the queued retries of lost processes' trials (waiting trials that carry Optuna's
    `failed_trial`); a warm-start seed the budget did not reach stays queued, as in a single
    process. Returns how many ran."""
    states = optuna.trial.TrialState
    queued = [t.number for t in study.get_trials(deepcopy=False, states=(states.WAITING,))
              if "failed_trial" in t.system_attrs]
    if not queued or storage_url is None:
        return 0
    # claimed by id through the storage's interface: study.ask() would pop the oldest waiting
    # trial, which is a seed
    storage = optuna.storages.get_storage(storage_url)
    study_id = storage.get_study_id_from_name(study.study_name)
    retried = 0
    for number in queued:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        if not storage.set_trial_state_values(trial_id, state=states.RUNNING):
            continue  # a worker took it after all
        trial = optuna.Trial(study, trial_id)
        try:
            study.tell(trial, objective(trial))
        except Exception:  # noqa: BLE001 - as Optuna's catch: the trial fails, the choice goes on
            study.tell(trial, state=states.FAIL)
        retried += 1
    return retried


def _fail_stale(study: optuna.Study) -> None:
    import warnings

    with warnings.catch_warnings():  # experimental in some Optuna versions
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


##### the worker ################################################################################

def join(storage: str, study_name: str, wait: float = 0.0) -> SharedInputs:
    """The study's shared inputs, waiting up to `wait` seconds for the coordinator to publish
    them. ValueError (one line) when the study does not exist there, or has none."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    deadline = time.monotonic() + wait
    while True:
        names = optuna.study.get_all_study_names(storage)
        if study_name in names:
            attrs = optuna.load_study(study_name=study_name, storage=storage).user_attrs
            if SHARED in attrs:
                return SharedInputs.from_json(attrs[SHARED])
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
    if study_name in names:
        raise ValueError(f"study {study_name!r} in {shown(storage)} has no shared inputs: it was not started by "
                         "`autoao search --storage` (or its coordinator is still measuring: --wait 10m waits)")
    have = f"the studies there: {', '.join(sorted(names)[:5])}" if names else "it holds no study"
    raise ValueError(f"study {study_name!r} does not exist in {shown(storage)} ({have}); the coordinator "
                     "(`autoao search --storage ...`) prints its name")


def scorer(model: nn.Module, key: str, work: Inputs, shared: SharedInputs) -> tuple[ModelBench, Callable[[Plan], Accuracy]]:
    """A bench and the trial scorer that score as the coordinator's do: the model profiled here
    (calibration), the proxy's reference outputs and noise floor computed here on the same held-out
    inputs, the coordinator's baseline, budget, cost model and layer errors. key: the model's weights_key."""
    proxy = ProxyEvaluator(model, work.held_out.inputs, cache=ResultCache(cache_dir() / "timings.sqlite"),
                           reference_key=f"{key}:{plan_key(Plan())}")
    proxy.calibrate(model)
    proxy.baseline = dict(shared.proxy_baseline)  # drops from the coordinator's baseline, as its trials

    def screen(m: nn.Module, plan: Plan) -> Accuracy:
        return screened(proxy, shared.accuracy, m, f"{key}:{plan_key(plan)}")

    bench = ModelBench(model, work.prof, work.examples, compile=False, groups=shared.groups, cost=shared.cost)
    return bench, bench.scorer(screen)


def run_worker(model: nn.Module, examples: Any, eval_inputs: Any, shared: SharedInputs, *, storage: str,
               study_name: str, tokenizer: Any = None, budget: Budget | None = None,
               progress: bool = True) -> SearchOutcome:
    """Run trials of the study until its budget (or this worker's own `budget`) is spent. The model
    must be the coordinator's (same weights, inputs and device type): ValueError naming both
    sides otherwise, before any trial."""
    device = model_device(model)
    key = weights_key(model)
    work = build_inputs(model, examples, eval_inputs=eval_inputs, tokenizer=tokenizer, seed=shared.seed,
                          screen_positions=shared.screen_positions, confirm=False)
    mine = fingerprint(model, key, work.examples, work.held_out.inputs, device)
    if mine != shared.fingerprint:
        raise ValueError(f"this worker's model is not the study's: here {mine.text()}, study {study_name!r} "
                         f"measured {shared.fingerprint.text()}; start the worker with the coordinator's --model "
                         "and --device type")
    bench, score = scorer(model, key, work, shared)
    budget = budget or Budget()
    config = SearchConfig(shared.accuracy, trials=budget.trials, seconds=budget.seconds, storage=storage,
                          study_name=study_name, role="worker", worker=label("worker"), deadline=shared.deadline,
                          heartbeat=shared.heartbeat or None, fresh_seed=True)
    try:
        return run_search(shared.groups, shared.cost, score, config, progress=progress)
    finally:
        bench.restore()
