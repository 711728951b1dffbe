"""Stage 6: what a run writes, built from the stages' outputs (the records are autoao.records').

    context = run_context(model, work, cands, meas, groups, judges, ...)   -> RunContext
    summary = run_summary(final, outcome, meas, context, ...)               -> RunSummary
    write_outputs(out_dir, final, summary, outcome, model)                 plan.json, pareto.json,
                                                                            summary.json, model/
    write_state(out_dir, study_name, run) / read_state(out_dir, study_name)   anytime.json
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any

import optuna
import torch
from torch import nn

from autoao import search_space
from autoao.common import BASELINE, __version__, atomic_write, triton_version
from autoao.cost import CostModel, layer_calls
from autoao.evaluators.timing import route_timing, workload_us
from autoao.kernels import cpu_isa, describe_route
from autoao.ledger import RunLedger
from autoao.plan import Plan, save
from autoao.records import (AccuracySpec, AnchorRecord, AnytimeState, CandidateRecord, CurvePoint, Deploy, DeviceInfo,
                            FusedRecord, GroupRecord, KernelTimes, LayerRecord, Latency, ModelInfo, ParetoRow,
                            RunContext, RunFileError, RunSummary, StageTime, UniformRow, WeightBytes, from_dict, to_dict,
                            write)
from autoao.search_space import Candidate
from autoao.stages.anytime import Anytime
from autoao.stages.finalize import Final
from autoao.stages.inputs import Inputs
from autoao.stages.judges import Judges
from autoao.stages.measure import Measurements, weight_bytes
from autoao.stages.search import Group, SearchOutcome, plan_from_params
from autoao.types import FromBytes, Pricing, Timed, pricing_words


def run_context(model: nn.Module, work: Inputs, cands: list[Candidate], meas: Measurements, cost: CostModel,
                groups: list[Group], judges: Judges, *, budget: str, seed: int, storage: str, study_name: str,
                command: str | None, bf16_us: float, started: float, left_out: dict[str, str] | None = None,
                anchors: tuple[AnchorRecord, ...] = (), target: str = "autoao", pricing: Pricing = Timed()) -> RunContext:
    """Everything the report needs that is known before the first trial (context.json). started:
    seconds ago the run began (its command's start, for the command line); left_out: candidates not
    considered -> why (listed as "left out"); pricing: how the costs were known (Target.pricing), recorded
    as the context's `estimate` sentence (empty: timed)."""
    calls = layer_calls(work.prof)
    layers = [_layer_record(lay, calls[lay.fqn], cands, meas, work.device) for lay in work.prof.layers]
    return RunContext(
        started=(datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=started)
                 ).isoformat(timespec="seconds"),
        model=ModelInfo(type(model).__name__, sum(p.numel() for p in model.parameters()), weight_bytes(model),
                        str(work.dtype).removeprefix("torch."), len(work.prof.layers)),
        device=DeviceInfo(work.device.type, meas.table.device, meas.table.mode,
                          cpu_isa.describe_features() if work.device.type == "cpu" else ""),
        versions={"autoao": __version__, "torch": torch.__version__, "triton": triton_version(),
                  "optuna": optuna.__version__, "python": sys.version.split()[0]},
        budget=budget, max_accuracy_drop=judges.budget.max_drop,
        screen_drop=judges.budget.screen if judges.budget.tier == 2 else None, seed=seed, command=command,
        accuracy=_accuracy_spec(judges, work), storage=storage, study_name=study_name,
        baseline_ms=Latency(cost.predict(Plan()) / 1e3, bf16_us / 1e3), rest_ms=cost.rest_us / 1e3,
        candidates=[_candidate_record(c, layers, work.device) for c in cands]
        + [CandidateRecord(name, search_space.get(name).describe(work.device), "left out", 0, None, [why])
           for name, why in (left_out or {}).items()],
        groups=[GroupRecord(g.name, list(g.fqns), list(g.choices)) for g in groups],
        fused=[FusedRecord(list(g), {c: t for c, t in per.items() if math.isfinite(t)})
               for g, per in meas.cost.fused_us.items()],
        layers=layers, timing=meas.health, int4_grid_layers=work.grid_layers, anchors=list(anchors), target=target,
        estimate=pricing_words(pricing),
    )


def _accuracy_spec(judges: Judges, work: Inputs) -> AccuracySpec:
    """Which accuracy decides, and the unchanged model's scores: tier 2's on the documents its
    first look scored (`task/documents` says how many; verdicts pair each plan's with the baseline's
    on the documents they took)."""
    record = judges.deciding.record()
    return AccuracySpec(
        tier=judges.budget.tier, tasks=record.tasks, metric=record.metric,
        baseline_tier1=dict(judges.proxy.baseline), baseline_tier2=record.baseline,
        baseline_tier2_metrics=dict(record.metrics),
        proxy=judges.proxy.describe(), held_out=work.held_out.describe(), unit=judges.budget.unit)


def _layer_record(lay: Any, calls: dict[int, int], cands: list[Candidate], meas: Measurements,
                  device: torch.device) -> LayerRecord:
    times, errors, emulated = {}, {}, []
    for c in cands:
        if c.name not in meas.cost.layer_us[lay.fqn]:  # not timed (emulated and not allowed)
            errors[c.name] = f"not timed: {c.emulated(device)} (allow_emulated=True times and allows it)"
            emulated.append(c.name)
            continue
        ts = [meas.table.get(c.name, m, lay.in_features, lay.out_features) for m in calls]
        if all(t.ok for t in ts):
            times[c.name] = meas.cost.layer_us[lay.fqn][c.name]
            if any(t.emulated for t in ts):
                emulated.append(c.name)
        else:
            errors[c.name] = next(t.error or "" for t in ts if not t.ok)
    kernels = {}
    for c in cands:
        by_kernel = meas.table.kernel_timings.get((c.name, lay.in_features, lay.out_features))
        if by_kernel:
            chosen = meas.table.kernel_for(c.name, lay.in_features, lay.out_features)
            us = {kern: workload_us(ts, calls) for kern, ts in by_kernel.items()}
            if chosen is not None and chosen not in us:  # a route: each M at its own kernel's time
                us[chosen] = workload_us({m: route_timing(by_kernel, chosen, m) for m in next(iter(by_kernel.values()))},
                                         calls)
            kernels[c.name] = KernelTimes(chosen, us, describe_route(chosen) if chosen else "")
    return LayerRecord(lay.fqn, lay.in_features, lay.out_features, lay.tokens, calls, times, errors, kernels,
                       emulated, dict(meas.sqnr.get(lay.fqn, {})), list(meas.choices[lay.fqn]),
                       dict(meas.excluded[lay.fqn]), list(lay.tied))


def _candidate_record(c: Candidate, layers: list[LayerRecord], device: torch.device) -> CandidateRecord:
    reasons = {lay.excluded.get(c.name) for lay in layers} - {None}
    n_ok = sum(c.name in lay.choices for lay in layers)
    emu = c.emulated(device)
    status = ("available" if n_ok == len(layers) else "partly available" if n_ok else
              "emulated" if emu else "unsupported")
    return CandidateRecord(c.name, c.describe(device), status, n_ok, emu, sorted(r for r in reasons if r)[:5])


def run_summary(final: Final, outcome: SearchOutcome, meas: Measurements, context: RunContext, model: nn.Module,
                ledger: RunLedger, planned: dict[str, float], fits: dict[str, float], bf16_at_start_us: float,
                deploy: Deploy | None = None, *, curve: list[CurvePoint] | None = None,
                interrupted: str = "") -> RunSummary:
    """What the run measured and decided (summary.json). planned: the time plan's seconds per stage;
    fits: the calibrated algorithms' fit seconds during the run; deploy: where the plan runs; curve:
    each better plan verified, and when; interrupted: the signal that ended the run early."""
    plan = final.plan
    spent = ledger.stage_seconds()
    estimated = isinstance(final.pricing, FromBytes)
    return RunSummary(
        device=meas.table.device, budget=context.budget, seconds=ledger.elapsed(),
        trials=len([r for r in outcome.trials if r.state == "COMPLETE"]), stopped=outcome.stopped_because,
        baseline_ms=Latency(final.predicted_baseline_us / 1e3, final.baseline_us / 1e3),
        baseline_ms_at_start=bf16_at_start_us / 1e3,
        # an estimated plan (final.pricing: FromBytes) was not measured: its measured fields stay empty
        plan_ms=Latency(final.predicted_us / 1e3, None if estimated else final.plan_us / 1e3),
        speedup=Latency(final.predicted_baseline_us / final.predicted_us, None if estimated else final.speedup.estimate),
        speedup_range=list(final.speedup_range), rounds=final.rounds, speedup_bound=final.speedup.low,
        accuracy=final.accuracy, max_accuracy_drop=context.max_accuracy_drop, decisions=list(final.decisions),
        storage=context.storage, study_name=context.study_name, seed=context.seed, command=context.command,
        weight_bytes=WeightBytes(context.model.weight_bytes, weight_bytes(model)),
        uniform=uniform_rows(outcome), measured_plans=list(final.measured_plans),
        plan={fqn: c.name for fqn, c in plan.layers.items()}, kernels=dict(plan.kernels),
        fusions=[list(g) for g in plan.fusions], stage_seconds=spent,
        # the timing stage by candidate (and kernel), largest first: cache misses only (0 when warm)
        timing_seconds={label: round(sec, 2) for label, sec in
                        sorted(meas.table.seconds_by_kernel.items(), key=lambda kv: -kv[1])},
        algorithm_seconds={alg: sec for alg, sec in fits.items() if sec > 0},
        verdicts=list(final.verdicts), trial=plan.metadata.get("trial") if plan.layers else None, deploy=deploy,
        workload=final.workload, curve=list(curve or []), interrupted=interrupted,
        stages=[StageTime(name, round(sec, 2), None if planned.get(name) is None else round(planned[name], 2))
                for name, sec in spent.items()],
    )


def uniform_rows(outcome: SearchOutcome) -> list[UniformRow]:
    """The warm-start uniform plans (one candidate wherever it applies) as the search scored them:
    what the searched plan must beat."""
    rows: list[UniformRow] = []
    for r in outcome.trials:
        names = set(r.params.values()) - {BASELINE}
        if r.state == "COMPLETE" and len(names) <= 1:
            name = next(iter(names), BASELINE)
            if not any(x.candidate == name for x in rows):
                rows.append(UniformRow(name, r.number, r.predicted_ms, r.drop, r.tier, r.feasible,
                                       sum(v == name for v in r.params.values())))
    return rows


def pareto_rows(outcome: SearchOutcome) -> list[ParetoRow]:
    """pareto.json: the Pareto plans with their predicted time, drop, tier and layer summary."""
    return [ParetoRow(r.number, r.predicted_ms, r.drop, r.accuracy.accuracy if r.accuracy else -math.inf, r.tier,
                      r.feasible, plan_from_params(outcome.groups, r.params).summary()) for r in outcome.pareto]


def write_outputs(out_dir: Path, final: Final, summary: RunSummary, outcome: SearchOutcome, model: nn.Module) -> Plan:
    """plan.json (its metadata: the measured speed-up and the verdicts), pareto.json, summary.json
    and the saved model, each written atomically."""
    plan = final.plan
    plan.metadata.update({"plan_ms": to_dict(summary.plan_ms), "speedup": to_dict(summary.speedup),
                          "speedup_interval": [final.speedup.low, final.speedup.high], "rounds": final.rounds,
                          "accuracy": to_dict(summary.accuracy) if summary.accuracy else None,
                          "verdicts": to_dict(list(final.verdicts)), "device": summary.device,
                          "target": summary.deploy.target if summary.deploy else "autoao"})
    plan.save(out_dir / "plan.json")
    rows = [to_dict(r) for r in pareto_rows(outcome)]
    atomic_write(out_dir / "pareto.json", lambda f: f.write(json.dumps(rows, indent=2).encode()))
    write(out_dir / "summary.json", summary)
    save(model, out_dir / "model")
    return plan


STATE_FILE = "anytime.json"


def write_state(out_dir: Path, study_name: str, run: Anytime) -> None:
    """anytime.json: the incumbent, the curve and the plans tried, for the same command to continue
    from (written after every new incumbent and at the end)."""
    inc = run.incumbent
    write(out_dir / STATE_FILE, AnytimeState(study_name, inc.record() if inc.params else None, list(run.curve),
                                             dict(run.tried)))


def read_state(out_dir: Path, study_name: str) -> AnytimeState | None:
    """What an earlier run of the same study verified and tried (None: no such run here, another
    study, or a file this autoao cannot read: the run starts afresh)."""
    path = out_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = from_dict(AnytimeState, json.loads(path.read_text()), path)
    except (OSError, ValueError, RunFileError):
        return None
    return state if state.study_name == study_name else None
