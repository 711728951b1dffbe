"""`autoao.optimize`: profile -> candidates -> measure -> search -> plan -> apply -> (report).

    result = autoao.optimize(model, example_inputs, budget="10m", max_accuracy_drop=0.01)
    result.model, result.plan, result.pareto, result.study, result.out_dir

The model is quantized in place (like torchao's quantize_): afterwards it carries the chosen plan.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from autoao import search_space
from autoao.cost import BASELINE, CostModel, fused_shape, layer_calls, token_counts
from autoao.evaluators.cache import ResultCache, TimingCache, cache_dir, digest
from autoao.evaluators.sensitivity import (Accuracy, CallableEvaluator, LmEvalEvaluator, ProxyEvaluator,
                                           layer_errors)
from autoao.evaluators.timing import LatencyTable, default_mode, measure_latencies, measure_model, workload_us
from autoao.kernels._base import canonical_on_device
from autoao.plan import Plan, apply, atomic_write, save, set_module
from autoao.profile import ModelProfile, profile
from autoao.search import (Budget, Group, SearchConfig, SearchOutcome, TrialResult, make_groups,
                           plan_from_params, run_search)
from autoao.search_space import Candidate

TIER2_CHECKS = 4  # plans checked with lm-eval / the user metric, fastest first (see _choose)
TIER2_MARGIN = 0.8  # after a rejection, check only plans predicted to drop <= this x the budget
RERANK_BAND = 0.05  # without tier 2, plans predicted within 5% of the chosen one are measured (_rerank)
RERANK_PLANS = 3  # at most this many, the chosen one included
RERANK_MARGIN = 0.03  # another plan replaces the chosen one only if measured > 3% faster


@dataclass
class OptimizeResult:
    """What `optimize` returns; everything is also on disk in `out_dir`."""

    model: nn.Module  # the same object that was passed in, now quantized by `plan`
    plan: Plan
    pareto: list[dict[str, Any]]  # the Pareto plans: trial, predicted ms, drop, tier, layer summary
    study: Any  # the optuna.Study
    out_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)  # latencies, accuracies, budget, notes
    report_path: Path | None = None


def optimize(
    model: nn.Module,
    example_inputs: Any,
    *,
    budget: str | int | Budget = "5m",
    accuracy: None | str | list[str] | Callable[[nn.Module], float] = None,
    tokenizer: Any = None,
    max_accuracy_drop: float = 0.01,
    candidates: list[str | Candidate] | None = None,
    eval_inputs: Any = None,
    storage: str | None = None,
    out_dir: str | Path = "autoao-report",
    seed: int = 0,
    fuse_groups: bool = True,
    allow_emulated: bool = False,
    lm_eval_limit: int | float | None = None,
    progress: bool = True,
    command: str | None = None,
) -> OptimizeResult:
    """Find the fastest per-layer plan whose accuracy drop stays within `max_accuracy_drop`, apply
    it to `model` in place, and write plan.json, pareto.json, the study and the saved model.

    The search ranks plans by a cost model (per-layer timings summed); where the proxy decides
    accuracy, the few plans it predicts within 5% of the fastest are then applied and measured end
    to end, and the fastest measured one is returned (summary.json's measured_plans). A plan that
    measures no faster end to end than the model as it came is not applied: the model stays in
    bf16, and summary.json's notes say so. End-to-end measurements run the model as per-layer
    timing ran its layers: torch.compile'd on CUDA (one compile per plan and input shape, counted
    in the budget), eagerly on the CPU.

    Args:
        model: any nn.Module with nn.Linear layers, on the device it will run on.
        example_inputs: what the model runs on (autoao.profile's convention: tensor, tuple of args,
            dict of kwargs, or a list of those). Layer shapes, token counts and activation statistics
            come from these, and latencies are measured at these token counts.
        budget: wall time ("90s", "10m", "1h") or a number of trials (200). Covers the whole run.
        accuracy: None: the tier-1 proxy decides (next-token accuracy / output error on
            `eval_inputs`). lm-eval task names (str or list; needs `tokenizer`) or a
            callable(model) -> float (higher is better): tier 2, checked on the Pareto plans, and
            the returned plan holds on it.
        tokenizer: the model's tokenizer, for lm-eval tasks.
        max_accuracy_drop: allowed drop in [0, 1], absolute in the accuracy's units (0.01 = 1 point).
        candidates: names or Candidates to consider (default: every registered one). bf16 is
            always included (it is the baseline).
        eval_inputs: held-out inputs for the tier-1 proxy (default: example_inputs).
        storage: Optuna RDB URL (default: SQLite in out_dir). Same storage + same model continues
            the earlier study.
        out_dir: where everything is written.
        seed: sampler seed; the same seed on the same measurements gives the same plan.
        fuse_groups: sibling layers that read the same input (found by the profile: q/k/v and
            gate/up projections) share one choice, and run as one kernel on their concatenated
            weights where timing of the fused shape says that is faster.
        allow_emulated: time the candidates that are only emulated on this device and let the search
            pick them (their timings are real, but not those of a fast kernel); off by default, when
            they are neither timed nor picked (`autoao kernels` still times them).
        lm_eval_limit: documents per lm-eval task (fast mode), None = all.
        progress: progress bars and stage messages on stderr.
        command: the command line that started this run, recorded for the report's "reproduce".
    """
    start = time.perf_counter()
    budget = Budget.parse(budget)
    config = SearchConfig(budget=budget, max_accuracy_drop=max_accuracy_drop, seed=seed)  # validates the drop
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = _Say(progress)
    cands = _resolve_candidates(candidates)
    device = _model_device(model)
    rcache = ResultCache(cache_dir() / "timings.sqlite")

    say("profiling")
    prof = profile(model, example_inputs)
    say(f"{len(prof.layers)} linear layers, token counts {token_counts(prof)}; timing candidates on {device}")
    siblings = prof.siblings if fuse_groups else []
    calls, timing_cache = _shape_calls(prof, siblings), TimingCache(rcache.path)
    # Emulated candidates can never be picked unless allowed, and their reference paths are the
    # slowest to time (fp8 on the CPU: ~40x int8): they are not timed (`autoao kernels` times them).
    pickable = [c for c in cands if allow_emulated or not c.emulated(device)]
    table = measure_latencies(_unique_shapes(prof), token_counts(prof), pickable, device=device,
                              dtype=_dtype(prof), cache=timing_cache, progress=progress, calls=calls)
    # sibling groups as one module: only for the candidates that fuse
    fusable = [c for c in pickable if c.fusable]
    fused_shapes = sorted({fused_shape(prof, g)[::-1] for g in siblings})
    if fused_shapes and fusable:
        table = table.merged(measure_latencies(fused_shapes, token_counts(prof), fusable, device=device,
                                               dtype=_dtype(prof), cache=timing_cache, progress=progress,
                                               calls=calls))
    stages = {"profile and kernel timing": time.perf_counter() - start}  # wall seconds per stage, in order
    examples = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    # End-to-end measurements run the model as per-layer timing ran its layers: compiled on CUDA
    # (kernels whose speed comes from inductor's fusion measure 2x slower eagerly; benchmarks/README.md)
    e2e_compile = default_mode(device) == "compile"

    def measure_examples() -> float:
        return _measure_examples(model, examples, compile=e2e_compile)

    t_e2e = time.perf_counter()
    bf16_e2e = measure_examples()
    e2e_seconds = time.perf_counter() - t_e2e  # one end-to-end measurement, its compiles included
    cost = CostModel.build(prof, table).with_rest_from(bf16_e2e)
    choices, excluded = layer_choices(prof, cands, table, device, allow_emulated)
    used = [c for c in cands if any(c.name in ch for ch in choices.values())]
    say("measuring layer errors (tier 0)")
    sqnr = layer_errors(model, prof, used, cache=rcache, progress=progress)
    say("reference outputs for the proxy (tier 1)")
    proxy = ProxyEvaluator(model, eval_inputs if eval_inputs is not None else example_inputs, cache=rcache)
    weights_key = digest("model", *[t for t in model.state_dict().values()])
    tier2 = _tier2(accuracy, tokenizer, lm_eval_limit, rcache)
    if tier2 is not None:
        say("baseline accuracy (tier 2)")
        t0 = time.perf_counter()
        tier2.set_baseline(model, key=f"{weights_key}:{_plan_key(Plan())}")
        tier2_seconds = time.perf_counter() - t0
    groups = make_groups(choices, siblings)

    # ---- search -----------------------------------------------------------------------------
    swapper = _Swapper(model, prof)

    def evaluate(plan: Plan) -> Accuracy:
        try:
            swapper.set(plan)
        except Exception as e:  # noqa: BLE001 - a candidate failing on a layer fails this trial only
            return Accuracy(1, -math.inf, math.inf, {}, f"plan failed to apply: {type(e).__name__}: {e}")
        return proxy(model, key=f"{weights_key}:{_plan_key(plan)}")

    spent = time.perf_counter() - start
    config.storage = storage or f"sqlite:///{(out_dir / 'study.db').resolve()}"
    # one study per (model weights, search space, budget constraint): the same run continues it,
    # a different model or constraint in the same storage starts its own
    config.study_name = "autoao-" + digest([(g.name, g.choices) for g in groups], max_accuracy_drop, weights_key)[:12]
    if budget.seconds is not None:
        # what runs after the trials: usually one or two tier-2 checks, the final apply and measurement
        # (without tier 2: up to RERANK_PLANS plans applied and measured end to end instead)
        checks = 2 * tier2_seconds if tier2 is not None else RERANK_PLANS * max(12 * bf16_e2e / 1e6, e2e_seconds)
        final = checks + max(24 * bf16_e2e / 1e6, 2 * e2e_seconds) + 5
        config.budget = Budget(seconds=max(budget.seconds - spent, 1.0))
        config.reserve_seconds = min(final, 0.5 * config.budget.seconds)
    context = _context(model, prof, cands, table, sqnr, choices, excluded, groups, cost, device, proxy, tier2,
                       bf16_e2e, budget, max_accuracy_drop, accuracy, seed, config, command)
    atomic_write(out_dir / "context.json", lambda f: f.write(json.dumps(context, indent=1, default=str).encode()))
    say(f"searching: {len(groups)} choices over {len(used)} candidates, budget {budget} "
        f"({spent:.0f} s spent on measurements)")
    best_path = out_dir / "best_plan.json"

    def on_trial(r: TrialResult, outcome: SearchOutcome) -> None:
        if outcome.best is r:
            plan_from_params(groups, r.params, cost.fusion_pays, trial=r.number, predicted_ms=r.predicted_us / 1e3,
                             drop=r.drop, tier=r.tier).save(best_path)

    stages["layer errors, proxy and baselines"] = spent - sum(stages.values())
    outcome = run_search(groups, cost, evaluate, config, layer_sqnr=sqnr, on_trial=on_trial, progress=progress)
    stages["search trials"] = time.perf_counter() - start - sum(stages.values())

    # ---- final answer: fastest Pareto plan that holds on the tier the user asked for --------------
    notes: list[str] = []
    chosen, chosen_acc = _choose(outcome, groups, tier2, swapper, model, weights_key, max_accuracy_drop, notes, say)

    def shipped(params: dict[str, str], **metadata: Any) -> Plan:
        """The plan these search params make, as it ships: fused groups, the timed kernel per layer."""
        searched = plan_from_params(groups, params, cost.fusion_pays)
        return Plan.for_model(model, searched.layers, _kernels(searched, prof, table), searched.fusions, **metadata)

    def measure_plan(params: dict[str, str]) -> float:
        """End-to-end us of the plan these params make, applied as it would ship (fused, kernels);
        inf if it cannot be applied or run (it is then not chosen; the search's pick still is)."""
        swapper.restore()
        try:
            with canonical_on_device():  # measured and undone: no host copy of its weights
                apply(model, shipped(params), act_norms=prof.act_norms())
            return measure_examples()
        except Exception as e:  # noqa: BLE001 - one plan failing must not lose the search's result
            notes.append(f"a plan predicted as fast could not be measured: {type(e).__name__}: {e}")
            return math.inf
        finally:
            swapper.restore()

    measured_plans: list[dict[str, Any]] = []
    if chosen is not None and tier2 is None:
        chosen, measured_plans = _rerank(outcome, chosen, measure_plan, notes, say)
        chosen_acc = Accuracy(chosen.tier, chosen.accuracy, chosen.drop, {}, "proxy (tier 1)")
    swapper.restore()  # originals back, then apply for real (fresh modules, validated)
    # bf16 again, right before the plan: the two end-to-end times then share the machine's state
    # (measured on the 2-core CI VM: the same bf16 workload took 939-1112 ms in different runs)
    bf16_end = measure_examples()
    plan = shipped(chosen.params if chosen else {}, trial=chosen.number if chosen else None)
    apply(model, plan, act_norms=prof.act_norms())
    measured = measure_examples()
    if plan.layers and measured >= bf16_end:
        # Per-layer timings summed can promise a speed-up the whole model does not deliver (SmolLM2
        # at M=2048 on the H200: 2:4 everywhere predicted 1.03x, measured 0.87x; benchmarks/README.md).
        # A plan that is not faster than the model as it came only costs accuracy: keep bf16.
        notes.append(f"the chosen plan (trial {plan.metadata.get('trial')}) measured {measured / 1e3:.3f} ms "
                     f"end to end, bf16 {bf16_end / 1e3:.3f} ms: not faster, so the model stays in bf16")
        say(notes[-1])
        swapper.restore()
        chosen, chosen_acc = None, None
        plan, measured = shipped({}), bf16_end
        for row in measured_plans:  # none of the re-ranked plans ships
            row["chosen"] = False
    predicted = cost.predict(plan)
    pareto = [_pareto_entry(r, groups) for r in outcome.pareto]
    summary = {
        "device": table.device, "budget": str(budget), "seconds": time.perf_counter() - start,
        "trials": len([r for r in outcome.trials if r.state == "COMPLETE"]), "stopped": outcome.stopped_because,
        "baseline_ms": {"predicted": cost.predict(Plan()) / 1e3, "measured": bf16_end / 1e3,
                        "measured_at_start": bf16_e2e / 1e3},
        "plan_ms": {"predicted": predicted / 1e3, "measured": measured / 1e3},
        "speedup": {"predicted": cost.predict(Plan()) / predicted, "measured": bf16_end / measured},
        "accuracy": _acc_dict(chosen_acc), "baseline_accuracy": _baseline_dict(proxy, tier2),
        "max_accuracy_drop": max_accuracy_drop, "notes": notes,
        "storage": config.storage, "study_name": config.study_name, "seed": seed, "command": command,
    }
    summary["weight_bytes"] = {"before": context["model"]["weight_bytes"], "after": weight_bytes(model)}
    summary["uniform"] = _uniform_rows(outcome, groups)
    summary["measured_plans"] = measured_plans
    summary["plan"] = {fqn: c.name for fqn, c in plan.layers.items()}
    summary["kernels"] = plan.kernels
    stages["choice, re-rank and final measurement"] = summary["seconds"] - sum(stages.values())
    summary["stage_seconds"] = stages
    # the timing stage by candidate (and kernel), largest first: cache misses only (0 when warm)
    summary["timing_seconds"] = {label: round(sec, 2) for label, sec in
                                 sorted(table.seconds_by_kernel.items(), key=lambda kv: -kv[1])}
    summary["fusions"] = [list(g) for g in plan.fusions]
    plan.metadata.update({k: summary[k] for k in ("plan_ms", "speedup", "accuracy", "device")})
    plan.save(out_dir / "plan.json")
    atomic_write(out_dir / "pareto.json", lambda f: f.write(json.dumps(pareto, indent=2).encode()))
    atomic_write(out_dir / "summary.json", lambda f: f.write(json.dumps(summary, indent=2, default=str).encode()))
    save(model, out_dir / "model")
    say(f"plan: {plan.summary() or 'all bf16'}; predicted {summary['speedup']['predicted']:.2f}x, measured "
        f"{summary['speedup']['measured']:.2f}x; accuracy drop {chosen_acc.drop if chosen_acc else 0:+.4f} "
        f"(tier {chosen_acc.tier if chosen_acc else '-'}); written to {out_dir}/")
    from autoao.reports import render as render_report  # jinja2 / matplotlib load only here

    return OptimizeResult(model, plan, pareto, outcome.study, out_dir, summary, report_path=render_report(out_dir))


##### stages ####################################################################################

def _measure_examples(model: nn.Module, examples: list[Any], compile: bool = False) -> float:
    """Sum of end-to-end medians (us) over the examples; examples of the same shapes are timed once
    (a workload like "prefill 256 tokens, then 32 decode steps" repeats one decode shape).
    compile: torch.compile the model for each shape, from a reset dynamo (static shapes; dynamo's
    recompile limit never reached however many plans are measured on one model object)."""
    seen: dict[str, float] = {}
    total = 0.0
    for ex in examples:
        key = _describe_shapes(ex)
        if key not in seen:
            if compile:
                torch._dynamo.reset()
            seen[key] = measure_model(model, ex, compile=compile).median_us
        total += seen[key]
    return total


def _describe_shapes(example: Any) -> str:
    if isinstance(example, torch.Tensor):
        return f"T{tuple(example.shape)}{example.dtype}"
    if isinstance(example, (tuple, list)):
        return "(" + ",".join(_describe_shapes(e) for e in example) + ")"
    if isinstance(example, dict):
        return "{" + ",".join(f"{k}:{_describe_shapes(v)}" for k, v in example.items()) + "}"
    return repr(example)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's state (parameters and persistent buffers; quantized layers count their
    quantized tensors), each shared tensor once."""
    seen, total = set(), 0
    for t in model.state_dict().values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _context(model, prof, cands, table, sqnr, choices, excluded, groups, cost, device, proxy, tier2, bf16_e2e,
             budget, max_drop, accuracy, seed, config, command) -> dict[str, Any]:
    """Everything the report needs that is known before the first trial (written to context.json,
    so an interrupted search can still be reported)."""
    import datetime

    import optuna

    import autoao

    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    layers = []
    all_calls = layer_calls(prof)
    for lay in prof.layers:
        calls = all_calls[lay.fqn]
        times, errors, emulated = {}, {}, []
        for c in cands:
            if c.name not in cost.layer_us[lay.fqn]:  # not timed (emulated and not allowed)
                errors[c.name] = f"not timed: {c.emulated(device)} (allow_emulated=True times and allows it)"
                emulated.append(c.name)
                continue
            ts = [table.get(c.name, m, lay.in_features, lay.out_features) for m in calls]
            if all(t.ok for t in ts):
                times[c.name] = cost.layer_us[lay.fqn][c.name]
                if any(t.emulated for t in ts):
                    emulated.append(c.name)
            else:
                errors[c.name] = next(t.error for t in ts if not t.ok)
        kernels = {}  # candidate -> {"chosen": kernel, "us": {kernel: time over this layer's calls}}
        for c in cands:
            by_kernel = table.kernel_timings.get((c.name, lay.in_features, lay.out_features))
            if by_kernel:
                kernels[c.name] = {"chosen": table.kernel_for(c.name, lay.in_features, lay.out_features),
                                   "us": {kern: workload_us(ts, calls) for kern, ts in by_kernel.items()}}
        layers.append({"fqn": lay.fqn, "in_features": lay.in_features, "out_features": lay.out_features,
                       "tokens": lay.tokens, "calls": calls, "time_us": times, "timing_error": errors,
                       "kernels": kernels,
                       "emulated": emulated, "sqnr_db": sqnr.get(lay.fqn, {}), "choices": choices[lay.fqn],
                       "excluded": excluded[lay.fqn], "tied": lay.tied})
    cand_rows = []
    for c in cands:
        reasons = {lay["excluded"].get(c.name) for lay in layers} - {None}
        n_ok = sum(c.name in lay["choices"] for lay in layers)
        emu = c.emulated(device)
        status = ("available" if n_ok == len(layers) else "partly available" if n_ok else
                  "emulated" if emu else "unsupported")
        cand_rows.append({"name": c.name, "summary": c.summary, "status": status, "layers": n_ok,
                          "emulated": emu, "reasons": sorted(r for r in reasons if r)[:5]})
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"class": type(model).__name__, "parameters": n_params, "weight_bytes": weight_bytes(model),
                  "dtype": str(_dtype(prof)).removeprefix("torch."), "num_linears": len(prof.layers),
                  "skipped": prof.skipped},
        "device": {"type": device.type, "name": table.device, "timing_mode": table.mode},
        "versions": {"autoao": autoao.__version__, "torch": torch.__version__, "triton": triton_v,
                     "optuna": optuna.__version__, "python": sys.version.split()[0]},
        "budget": str(budget), "max_accuracy_drop": max_drop, "seed": seed, "command": command,
        "accuracy": {"tier": 2 if tier2 is not None else 1,
                     "tasks": accuracy if isinstance(accuracy, (str, list)) else None,
                     "metric": getattr(accuracy, "__name__", None) if callable(accuracy) else None,
                     "baseline": {"tier1": proxy.baseline, "tier2": getattr(tier2, "baseline", None)}},
        "storage": config.storage, "study_name": config.study_name,
        "baseline_ms": {"predicted": cost.predict(Plan()) / 1e3, "measured": bf16_e2e / 1e3},
        "rest_ms": cost.rest_us / 1e3,
        "candidates": cand_rows,
        "groups": [[g.name, list(g.fqns), list(g.choices)] for g in groups],
        # sibling groups' time as one fused module, per candidate (us over the workload)
        "fused": [{"fqns": list(g), "time_us": {c: t for c, t in per.items() if math.isfinite(t)}}
                  for g, per in cost.fused_us.items()],
        "layers": layers,
    }

def layer_choices(prof: ModelProfile, cands: list[Candidate], table: LatencyTable, device: torch.device,
                  allow_emulated: bool) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """FQN -> candidate names the search may pick; and FQN -> candidate -> why it may not."""
    choices: dict[str, list[str]] = {}
    excluded: dict[str, dict[str, str]] = {}
    calls = layer_calls(prof)
    for lay in prof.layers:
        ok, why = [BASELINE], {}
        for c in cands:
            if c.name == BASELINE:
                continue
            reason = c.supports(lay.spec, device)
            if reason is None and c.emulated(device) and not allow_emulated:
                reason = f"emulated on {device.type}: {c.emulated(device)}"
            if reason is None:
                for m in calls[lay.fqn]:
                    t = table.get(c.name, m, lay.in_features, lay.out_features)
                    if not t.ok:
                        reason = f"timing failed at M={m}: {t.error}"
                        break
            if reason:
                why[c.name] = reason
            else:
                ok.append(c.name)
        choices[lay.fqn] = ok
        excluded[lay.fqn] = why
    return choices, excluded


def _choose(outcome: SearchOutcome, groups: list[Group], tier2, swapper: _Swapper, model: nn.Module,
            weights_key: str, max_drop: float, notes: list[str], say) -> tuple[TrialResult | None, Accuracy | None]:
    """The fastest plan that holds the accuracy budget on the tier the user asked for.

    Without tier 2: the fastest feasible Pareto plan (the proxy decides). With tier 2 (seconds per
    plan), at most TIER2_CHECKS feasible plans are checked, fastest first. The proxy's accuracy can
    miss what tier 2 sees (the CPU demo: int8_dyn everywhere, proxy drop +0.006, autoao_facts drop
    +0.032), so each rejection calibrates a prediction: tier-2 drop per unit of the proxy's
    continuous error (KL), the largest ratio seen; plans whose predicted drop exceeds
    TIER2_MARGIN x the budget are skipped unchecked."""
    front = sorted((r for r in outcome.pareto if r.feasible), key=lambda r: r.predicted_us)
    if not front:
        notes.append("no trial met the accuracy budget on the proxy: keeping the model in bf16")
        return None, None
    if tier2 is None:
        best = front[0]
        return best, Accuracy(best.tier, best.accuracy, best.drop, {}, "proxy (tier 1)")
    order = _distinct_feasible(outcome)
    per_error, checked, skipped = 0.0, 0, 0
    for r in order:
        err = r.proxy_error
        if per_error and err is not None and err * per_error > TIER2_MARGIN * max_drop:
            skipped += 1
            continue
        if checked == TIER2_CHECKS:
            break
        checked += 1
        plan = plan_from_params(groups, r.params)
        say(f"checking trial {r.number} on tier 2")
        swapper.set(plan)
        acc = tier2(model, key=f"{weights_key}:{_plan_key(plan)}")
        if acc.drop <= max_drop:
            if r is not order[0]:
                notes.append(f"chose trial {r.number}: faster plans broke the budget on tier 2"
                             + (f" or were predicted to ({skipped} skipped unchecked)" if skipped else ""))
            return r, acc
        notes.append(f"trial {r.number} (predicted {r.predicted_us / 1e3:.3f} ms) passed the proxy but "
                     f"dropped {acc.drop:+.4f} on tier 2 ({acc.source}): rejected")
        if err is not None:
            per_error = max(per_error, acc.drop / max(err, 1e-12))
    notes.append(f"none of the {checked} plans checked on tier 2 held ({skipped} more predicted not to): "
                 "keeping the model in bf16")
    return None, None


def _distinct_feasible(outcome: SearchOutcome) -> list[TrialResult]:
    """The feasible trials, fastest predicted first (then least drop), each plan once (its first
    trial: samplers revisit plans)."""
    seen: set[tuple] = set()
    out = []
    for r in sorted((r for r in outcome.trials if r.feasible), key=lambda r: (r.predicted_us, r.drop)):
        key = tuple(sorted(r.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _rerank(outcome: SearchOutcome, chosen: TrialResult, measure: Callable[[dict[str, str]], float],
            notes: list[str], say) -> tuple[TrialResult, list[dict[str, Any]]]:
    """The chosen plan, or a feasible plan predicted nearly as fast that runs faster end to end.

    The cost model sums per-layer times measured one layer at a time; between plans a few % apart it
    ranks only as well as that sum predicts the whole model (llama8 at M=1 on the H200: the
    searched plan, predicted 0.843 ms, ran 0.820; uniform fp8_wo, predicted 0.863, ran 0.780). So
    the distinct feasible plans predicted within RERANK_BAND of the chosen one (at most
    RERANK_PLANS, fastest predicted first, the chosen one among them) are applied and measured
    (`measure(params)` -> us), and the fastest replaces the chosen one if it is more than
    RERANK_MARGIN faster. Only where the proxy decides accuracy: every plan here is feasible on it,
    as the chosen one is (with tier 2, only the chosen plan was checked there). Returns the plan and
    the measurements (summary.json's measured_plans)."""
    near = [r for r in _distinct_feasible(outcome)
            if r.params != chosen.params and r.predicted_us <= (1 + RERANK_BAND) * chosen.predicted_us]
    plans = [chosen, *near[:RERANK_PLANS - 1]]
    if len(plans) == 1:
        return chosen, []
    say(f"measuring the {len(plans)} plans predicted within {RERANK_BAND:.0%} of the fastest end to end")
    times = [measure(r.params) for r in plans]
    rows = [{"trial": r.number, "predicted_ms": r.predicted_us / 1e3, "measured_ms": t / 1e3, "chosen": False}
            for r, t in zip(plans, times)]
    best = min(range(len(plans)), key=lambda i: times[i])
    pick = best if times[best] * (1 + RERANK_MARGIN) < times[0] else 0
    rows[pick]["chosen"] = True
    if pick:
        notes.append(f"chose trial {plans[pick].number}: measured end to end at {times[pick] / 1e3:.3f} ms, "
                     f"{times[0] / times[pick]:.2f}x faster than trial {chosen.number}, the cost model's "
                     f"pick ({times[0] / 1e3:.3f} ms measured, {chosen.predicted_us / 1e3:.3f} ms predicted)")
    else:
        others = ", ".join(f"trial {r.number} {t / 1e3:.3f} ms" for r, t in zip(plans[1:], times[1:]))
        notes.append(f"kept trial {chosen.number} ({times[0] / 1e3:.3f} ms measured end to end); the plans "
                     f"predicted within {RERANK_BAND:.0%} of it were not more than {RERANK_MARGIN:.0%} "
                     f"faster: {others}")
    return plans[pick], rows


class _Swapper:
    """Switches the model between plans by swapping modules, building each (layer, candidate)
    module once (trials revisit the same choices; rebuilding would dominate a CPU search)."""

    def __init__(self, model: nn.Module, prof: ModelProfile) -> None:
        self.model = model
        self.original = {lay.fqn: model.get_submodule(lay.fqn) for lay in prof.layers}
        self.norms = prof.act_norms()
        self.bank: dict[tuple[str, str], nn.Module] = {}
        self.current: dict[str, str] = {}

    def set(self, plan: Plan) -> None:
        for fqn, orig in self.original.items():
            cand = plan.layers.get(fqn)
            name = cand.name if cand is not None else BASELINE
            if self.current.get(fqn, BASELINE) == name:
                continue
            if name == BASELINE:
                module = orig
            else:
                if (fqn, name) not in self.bank:
                    with torch.no_grad(), canonical_on_device():  # trial modules are never saved
                        norm = self.norms.get(fqn)
                        self.bank[(fqn, name)] = cand.build(orig, act_norm=norm, fqn=fqn)  # type: ignore[union-attr]
                module = self.bank[(fqn, name)]
            set_module(self.model, fqn, module)
            self.current[fqn] = name

    def restore(self) -> None:
        """The original modules back in every profiled layer, whatever put others there (set, or
        plan.apply)."""
        for fqn, orig in self.original.items():
            set_module(self.model, fqn, orig)
        self.current = {}


def _kernels(plan: Plan, prof: ModelProfile, table: LatencyTable) -> dict[str, str]:
    """FQN -> the CUDA kernel timing chose for the layer's candidate and shape (where it had a
    choice); the members of a fusion get the one chosen for the fused shape."""
    shapes = {lay.fqn: (lay.in_features, lay.out_features) for lay in prof.layers}
    for group in plan.fusions:
        shape = fused_shape(prof, group)
        shapes.update({f: shape for f in group})
    chosen = {fqn: table.kernel_for(c.name, *shapes[fqn]) for fqn, c in plan.layers.items() if fqn in shapes}
    return {fqn: kern for fqn, kern in chosen.items() if kern is not None}


def _tier2(accuracy, tokenizer, limit, cache):
    if accuracy is None:
        return None
    if callable(accuracy):
        return CallableEvaluator(accuracy)
    tasks = [t.strip() for t in (accuracy.split(",") if isinstance(accuracy, str) else accuracy) if t.strip()]
    if tokenizer is None:
        raise ValueError(f"accuracy={tasks} are lm-eval tasks, which need the model's tokenizer: pass tokenizer=...")
    from autoao.evaluators import lmeval

    unknown = [t for t in tasks if t not in lmeval.task_names()]
    if unknown:
        import warnings

        warnings.warn(f"tasks {unknown} are not bundled with autoao; lm-eval must find their data offline",
                      stacklevel=3)
    return LmEvalEvaluator(tokenizer, tasks, limit=limit, cache=cache)


def _resolve_candidates(candidates) -> list[Candidate]:
    if candidates is None:
        return search_space.all_candidates()
    out = [search_space.get(c) if isinstance(c, str) else c for c in candidates]
    if not any(c.name == BASELINE for c in out):
        out.insert(0, search_space.get(BASELINE))
    return out


def _plan_key(plan: Plan) -> str:
    return digest(sorted((f, c.name) for f, c in plan.layers.items()))


def _shape_calls(prof: ModelProfile, siblings: list[tuple[str, ...]]) -> dict[tuple[int, int], dict[int, int]]:
    """(N, K) -> {M: calls per forward, summed over the layers (and fused sibling groups) of that
    shape}: how the workload weighs each token count when timing chooses among a candidate's kernels."""
    out: dict[tuple[int, int], dict[int, int]] = {}
    calls = layer_calls(prof)
    shaped = [((lay.out_features, lay.in_features), lay.fqn) for lay in prof.layers]
    shaped += [(fused_shape(prof, g)[::-1], g[0]) for g in siblings]
    for shape_nk, fqn in shaped:
        shape = out.setdefault(shape_nk, {})
        for m, n in calls[fqn].items():
            shape[m] = shape.get(m, 0) + n
    return out


def _unique_shapes(prof: ModelProfile) -> list[tuple[int, int]]:
    """(N, K) of every profiled layer, each once (fused groups' shapes are timed separately)."""
    return sorted({(lay.out_features, lay.in_features) for lay in prof.layers})


def _dtype(prof: ModelProfile) -> torch.dtype:
    dtypes = {lay.dtype for lay in prof.layers}
    return torch.bfloat16 if torch.bfloat16 in dtypes or not dtypes else next(iter(dtypes))


def _model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def _uniform_rows(outcome: SearchOutcome, groups: list[Group]) -> list[dict[str, Any]]:
    """The warm-start uniform plans (one candidate wherever it applies) as the search scored them:
    what the searched plan must beat."""
    rows = []
    for r in outcome.trials:
        names = set(r.params.values()) - {BASELINE}
        if r.state == "COMPLETE" and len(names) <= 1:
            name = next(iter(names), BASELINE)
            if not any(x["candidate"] == name for x in rows):
                rows.append({"candidate": name, "trial": r.number, "predicted_ms": r.predicted_us / 1e3,
                             "drop": r.drop, "tier": r.tier, "feasible": r.feasible,
                             "groups": sum(v == name for v in r.params.values())})
    return rows


def _pareto_entry(r: TrialResult, groups: list[Group]) -> dict[str, Any]:
    return {"trial": r.number, "predicted_ms": r.predicted_us / 1e3, "drop": r.drop, "accuracy": r.accuracy,
            "tier": r.tier, "feasible": r.feasible, "plan": plan_from_params(groups, r.params).summary()}


def _acc_dict(a: Accuracy | None) -> dict[str, Any] | None:
    return None if a is None else dataclasses.asdict(a)


def _baseline_dict(proxy: ProxyEvaluator, tier2) -> dict[str, Any]:
    out: dict[str, Any] = {"tier1": proxy.baseline}
    if tier2 is not None:
        out["tier2"] = tier2.baseline
    return out


class _Say:
    def __init__(self, enabled: bool) -> None:
        self.enabled, self.start = enabled, time.perf_counter()

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[autoao {time.perf_counter() - self.start:6.1f}s] {msg}", file=sys.stderr, flush=True)
