"""A coordinator and `autoao worker` processes sharing one study on a real PostgreSQL (a private
cluster: tests/pg_cluster.py), one of them SIGKILLed mid-trial; and the bad inputs of both commands.

One distributed search and one single-process search (the same published inputs, the same number
of trials) run once for the module; the tests read what they left in the study and the run files."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest

import slow_models
from autoao import cli
from autoao.budget import AccuracyBudget
from autoao.cost import CostModel
from autoao.decisions import StudyClosed
from autoao.records import TrialRecord, load_summary, pareto_front
from autoao.stages.search import Group, SearchConfig, run_search, trials_toward_budget
from autoao.workers import SHARED, Fingerprint, SharedInputs, _run_retries, scorer, weights_key
from autoao.stages.inputs import build_inputs
from optuna.storages import RetryHeartbeatStaleTrialCallback
from pg_cluster import PgCluster, why_missing

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "tests" / "slow_models.py") + ":build"
CANDIDATES = "int8_dyn,int4_wo(group_size=32)"
BUDGET = 16  # trials
STUDY = "shared"

@pytest.fixture(scope="module")
def pg():
    if why_missing() is not None:
        pytest.skip(str(why_missing()))
    cluster = PgCluster.start()
    yield cluster
    cluster.stop()


def _search(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "autoao.cli", "search", "--model", MODEL, "--tasks", "none",
           "--candidates", CANDIDATES, "--quiet", *args]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(pg, tmp_path_factory):
    """(the distributed run's out dir, a single-process search's outcome, the killed worker's pid)."""
    tmp = tmp_path_factory.mktemp("workers")
    env = {**os.environ, "AUTOAO_CACHE_DIR": str(tmp / "cache"), "AUTOAO_TEST_TRIAL_SLEEP": "0.2",
           "AUTOAO_TEST_STALL_FILE": str(tmp / "stall")}
    dist = tmp / "dist"
    proc = _search(["--budget", str(BUDGET), "--storage", pg.url, "--study", STUDY, "--workers", "3",
                    "--heartbeat", "1", "--out", str(dist)], env)
    stall = tmp / "stall"
    deadline = time.monotonic() + 150
    while not (stall.is_file() and stall.read_text()):
        assert proc.poll() is None, "the search ended before a worker stalled:\n" + proc.stdout.read()
        assert time.monotonic() < deadline, "no worker stalled mid-trial"
        time.sleep(0.05)
    victim = int(stall.read_text())
    os.kill(victim, signal.SIGKILL)  # mid-trial: it sleeps inside the proxy's forward
    text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, text
    complete = sum(t.state.name == "COMPLETE" for t in _study(pg).trials)
    # the same number of trials in one process, scored and costed as the coordinator's (its published
    # inputs): the search alone, so the comparison is of the searches, not of two measurements
    shared = SharedInputs.from_json(_study(pg).user_attrs[SHARED])
    made = slow_models.build()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOAO_CACHE_DIR", env["AUTOAO_CACHE_DIR"])
        model = made["model"]
        work = build_inputs(model, made["example_inputs"], eval_inputs=made["eval_inputs"], seed=shared.seed,
                              screen_positions=shared.screen_positions, confirm=False)
        bench, score = scorer(model, weights_key(model), work, shared)
        single = run_search(shared.groups, shared.cost, score, SearchConfig(shared.accuracy, trials=complete, seed=0),
                            layer_sqnr=shared.sqnr, progress=False)
        bench.restore()
    return dist, single, victim


def _study(pg) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=pg.url)


def test_every_trial_is_accounted_for_once(pg, runs):
    dist, _, _ = runs
    trials = _study(pg).trials
    states = [t.state.name for t in trials]
    assert "RUNNING" not in states and "WAITING" not in states, states
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    # the study's budget: a failed trial and its retry count once; processes starting a trial at
    # the same moment may each take one past it
    assert BUDGET <= len(complete) <= BUDGET + 3
    per = {}
    for t in complete:
        per[t.user_attrs["worker"]] = per.get(t.user_attrs["worker"], 0) + 1
    assert sum(per.values()) == len(complete)
    roles = {w.split("@")[0] for w in per}
    assert roles == {"coordinator", "worker"} and len(per) >= 3, per  # the coordinator and 2 surviving workers
    summary = load_summary(dist / "summary.json")
    assert summary.trials == len(complete)
    closed = [d for d in summary.decisions if isinstance(d, StudyClosed)]
    assert len(closed) == 1 and closed[0].processes == len(per)
    assert closed[0].per_process == ", ".join(f"{w} {n}" for w, n in sorted(per.items()))
    assert json.loads((dist / "summary.json").read_text())["decisions"]  # typed on disk: each with its kind
    with open(dist / "report_trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(trials)
    by_worker = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            by_worker[r["worker"]] = by_worker.get(r["worker"], 0) + 1
    assert by_worker == per


def test_a_killed_workers_trial_fails_and_its_retry_completes(pg, runs):
    _, _, victim = runs
    trials = _study(pg).trials
    lost = [t for t in trials if t.user_attrs.get("worker") == f"worker@{socket.gethostname()}:{victim}"
            and t.state.name == "FAIL"]
    assert len(lost) == 1, [(t.number, t.state.name, t.user_attrs.get("worker")) for t in trials]
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == lost[0].number]
    assert [t.state.name for t in retries] == ["COMPLETE"]
    assert retries[0].params == lost[0].params
    assert retries[0].user_attrs["worker"] != lost[0].user_attrs["worker"]


def test_the_shared_search_starts_as_one_process_does_and_its_front_holds_every_processs_trials(pg, runs):
    """The shared study begins with one process's warm start, and the coordinator's Pareto front and
    best plan are the study's, whoever ran each trial. (How good a plan 16 trials find is not
    compared: at equal trials three processes sample with fewer finished trials in view, and in
    four runs one shared run's best ranked 17th to 21st of 21 beside 20 one-process seeds' bests;
    workers are for more trials in the same time.)"""
    dist, single, _ = runs
    study = _study(pg)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert single.best is not None and len(single.trials) == len(complete)

    def seeds(trials):
        return sorted(tuple(sorted(t.params.items())) for t in trials if t.user_attrs.get("seed") == "warm start")

    assert seeds(study.trials) and seeds(complete) == seeds(single.study.trials)  # the killed one's retried
    records = [TrialRecord.read(t) for t in complete]
    assert len({r.worker for r in records}) >= 3  # the front below draws on several processes' trials
    front = [(r.number, round(r.predicted_us / 1e3, 9)) for r in pareto_front(records)]
    shown = [(e["trial"], round(e["predicted_ms"], 9)) for e in json.loads((dist / "pareto.json").read_text())]
    assert shown == front
    fastest = min((r for r in records if r.feasible), key=lambda r: (r.predicted_us, r.drop))
    assert fastest.number in {n for n, _ in shown}
    # one process (role None) is the search as it always was: its trials carry no process label
    assert {r.worker for r in single.trials} == {""}


def _error(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoao: error: ") and "\n" not in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(pg, runs, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))
    dead = "postgresql://postgres@127.0.0.1:1/postgres"
    assert "cannot be reached" in _error(["worker", "--storage", dead, "--study", STUDY, "--model", MODEL], capsys)
    err = _error(["worker", "--storage", pg.url, "--study", "nope", "--model", MODEL], capsys)
    assert "'nope' does not exist" in err and STUDY in err
    err = _error(["worker", "--storage", pg.url, "--study", STUDY, "--model", MODEL.replace(":build", ":other"),
                  "--device", "cpu"], capsys)
    assert "not the study's" in err and err.count("SlowTinyLM on cpu (weights") == 2
    err = _error(["worker", "--storage", f"sqlite:///{tmp_path}/s.db", "--study", STUDY, "--model", MODEL], capsys)
    assert "SQLite" in err and "--storage" in err
    err = _error(["search", "--model", MODEL, "--workers", "2", "--out", str(tmp_path / "o")], capsys)
    assert "--workers 2 needs --storage" in err
    err = _error(["search", "--model", MODEL, "--storage", dead, "--out", str(tmp_path / "o")], capsys)
    assert "cannot be reached" in err and "--storage" in err


def test_a_retried_trial_counts_once_toward_the_study_budget():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize", "minimize"])
    for _ in range(3):
        study.enqueue_trial({"x": "a"})
    study.optimize(lambda t: (0.0, float(t.suggest_categorical("x", ["a", "b"]) == "b")), n_trials=1)
    trial = study.ask()
    assert trials_toward_budget(study.trials) == 2  # finished and running count; the seeds still queued do not
    study.tell(trial, state=optuna.trial.TrialState.FAIL)  # as the heartbeat fails a dead process's trial
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(max_retry=1)(study, study.trials[trial.number])
    retry = study.trials[-1]
    assert retry.state.name == "WAITING" and retry.system_attrs["failed_trial"] == trial.number
    assert trials_toward_budget(study.trials) == 2  # the failed trial and its queued retry: one
    study.tell(study.ask(), (0.0, 0.0))  # takes the next seed
    assert trials_toward_budget(study.trials) == 3


def test_the_coordinator_runs_a_lost_trials_retry_and_leaves_unreached_seeds_queued(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    lost = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    study.enqueue_trial({"x": "a"})  # a seed queued before the retry: study.ask() would take it first
    study.tell(lost, state=optuna.trial.TrialState.FAIL)  # as the heartbeat fails a dead process's trial
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(max_retry=1)(study, study.trials[lost.number])
    seen = []

    def objective(trial):
        seen.append(trial.suggest_categorical("x", ["a", "b"]))
        return 1.0, 0.0

    assert _run_retries(study, url, objective) == 1
    by_state = {t.number: t.state.name for t in study.trials}
    retry = next(t for t in study.trials if t.system_attrs.get("failed_trial") == lost.number)
    assert by_state[retry.number] == "COMPLETE" and seen == [lost.params["x"]]
    assert sorted(by_state.values()) == ["COMPLETE", "FAIL", "WAITING"]  # the seed, still queued
    assert _run_retries(study, url, objective) == 0  # nothing left to retry


def test_shared_inputs_survive_json():
    cost = CostModel({"a": {"bf16": 2.0, "int8_dyn": math.inf}}, {"a": {"fp8_wo"}}, 5.0,
                     {("a", "b"): {"int8_dyn": 1.5}})
    budget = AccuracyBudget.create(0.01, tier2=True, proxy_noise=0.006, unit="lm-eval: autoao_facts")
    shared = SharedInputs(Fingerprint("M", "w" * 64, "i" * 64, "cpu"), [Group("a", ("a",), ("bf16", "int8_dyn"))],
                          cost, {"a": {"int8_dyn": 40.0}}, {"accuracy": 0.5}, budget, 24, None, 1, 3)
    back = SharedInputs.from_json(shared.to_json())
    assert back == shared and back.accuracy.screen == pytest.approx(0.05) and back.accuracy.tier == 2
    with pytest.raises(ValueError, match="format"):
        SharedInputs.from_json(shared.to_json().replace('"format": 2', '"format": 99'))
