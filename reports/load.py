"""Read a search directory into plain dataclasses: what the report shows, nothing about HTML.

    data = load("autoao-report/")      # context.json + the Optuna study + (if finished) summary.json
    data.finished, data.plan, data.layers[0].candidates, data.trials, data.pareto

Sources, in the order the search writes them:
  context.json     before the first trial: model, device, candidates, per-layer timings and SQNR
  study (storage)  every finished trial, committed as it ends (also while the search still runs)
  best_plan.json   the best feasible plan so far (used only when the study cannot be read)
  summary.json     only when the search finished: measured latencies, final accuracy, notes
  plan.json        only when the search finished: the applied plan (its metadata names the trial)

A directory without summary.json is an interrupted or still-running search: `finished` is False and
the plan is the fastest feasible trial so far (the same rule the search uses for `best`).
Everything here is a pure function of those files, so loading twice gives identical data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoao.common import BASELINE
from autoao.kernels import describe_route
from autoao.plan import Plan, PlanError
from autoao.profile import GRID_CANDIDATE
from autoao.reports.fmt import fmt_db, fmt_us
from autoao.runfiles import (CandidateRecord, FusedRecord, KernelTimes, LayerRecord, RunContext, RunFileError, RunSummary,
                             describe, load_context, load_summary)
from autoao.runfiles import pareto_front as search_front


# Tier-1 proxy metrics: label ({base}: the unchanged model, ReportData.baseline_name).
PROXY_METRICS = {
    "accuracy": "proxy accuracy",  # relabelled by mode in _accuracy_rows
    "agreement": "top-1 agreement with {base}",
    "kl": "KL divergence from {base} (nats/token)",
    "next_token": "next-token accuracy on held-out tokens",
    "loss": "loss on held-out tokens (nats/token)",
    "cosine_min": "least cosine similarity to {base}'s embedding",
    "nn_agreement": "nearest-neighbour agreement with {base}",
    "rel_error": "relative output error vs {base}",
}
# Above this a speed-up says more about the measurement than the plan: int4 weights are 4x fewer
# bytes than bf16, and 2:4 sparsity with int8 at most about 8x fewer operations.
PLAUSIBLE_SPEEDUP = 10.0
TIER_LABEL = {0: "tier 0 · layer SQNR", 1: "tier 1 · proxy", 2: "tier 2"}


class ReportError(ValueError):
    """The directory is not (or no longer) a readable autoao search directory."""


@dataclass
class Trial:
    """One trial of the study, in the report's units."""

    number: int
    state: str  # COMPLETE / FAIL / RUNNING / WAITING / PRUNED
    predicted_ms: float  # predicted plan latency; nan unless COMPLETE
    drop: float  # accuracy drop (absolute); inf if the plan produced NaN/Inf; nan unless COMPLETE
    accuracy: float | None
    tier: int | None
    feasible: bool  # COMPLETE and drop <= max_accuracy_drop (the search's constraint)
    finished_s: float | None  # seconds of search (trial durations summed) until this trial ended
    warm_start: bool  # enqueued by the search's warm start (uniform / greedy plans), not sampled
    params: dict[str, str]  # group name -> candidate name
    metrics: dict[str, float]  # tier-1 metrics of this plan (accuracy, kl, loss, ...)
    error: str = ""  # why a FAIL trial failed, when Optuna recorded it
    worker: str = ""  # the process that ran it, when several shared the study ("worker@host:pid")


@dataclass
class Choice:
    """One candidate for one layer: its cost, its error, and why it is or is not the plan's."""

    candidate: str
    status: str  # "chosen", "allowed" (the search could pick it) or "excluded"
    time_us: float | None  # predicted time of this layer over the whole workload; None: no timing
    emulated: bool  # no fast kernel here: the time is real but never a speed-up
    sqnr_db: float | None  # tier 0: output SQNR of the layer alone (higher is better; inf = exact)
    reason: str  # one short sentence
    kernel: str | None = None  # the CUDA kernel timing chose, where the candidate has several
    kernel_note: str = ""  # e.g. "tinygemm; triton 1.52x slower here"


@dataclass
class Layer:
    fqn: str
    group: str  # the search parameter this layer's choice belongs to (fused q/k/v share one)
    group_size: int  # layers in that group
    in_features: int
    out_features: int
    tokens: int  # rows seen over the workload (sum of M over calls)
    calls: dict[int, int]  # M -> how many calls of that size
    tied: list[str]
    chosen: str
    why: str  # why `chosen`, one sentence
    choices: list[Choice]  # chosen first, then allowed, then excluded


@dataclass
class CandidateInfo(CandidateRecord):
    """A candidate as context.json records it, and how many layers the shown plan gives it."""

    in_plan: int = 0


@dataclass
class AccuracyRow:
    metric: str
    tier: int
    source: str
    baseline: float | None
    plan: float | None  # None: not measured (yet)
    higher_is_better: bool | None


@dataclass
class ReportData:
    out_dir: Path
    finished: bool
    context: RunContext  # context.json (model, device, versions, budget, ...)
    summary: RunSummary | None  # summary.json, None while unfinished
    trials: list[Trial]
    pareto: list[int]  # trial numbers on the (latency, drop) front, fastest first
    chosen_trial: int | None  # the trial whose plan is shown; None: all bf16 / unknown
    plan_source: str  # where the shown plan comes from, for the reader
    plan: dict[str, str]  # every layer's FQN -> candidate (bf16 included)
    layers: list[Layer]
    candidates: list[CandidateInfo]
    accuracy: list[AccuracyRow]
    warnings: list[str] = field(default_factory=list)  # things the reader must know before trusting

    @property
    def max_drop(self) -> float:
        return self.context.max_accuracy_drop

    @property
    def baseline_name(self) -> str:
        """The unchanged model's name on the page: its dtype ("bf16" for bfloat16, else e.g. float32)."""
        dtype = self.context.model.dtype
        return "bf16" if dtype == "bfloat16" else dtype

    @property
    def completed(self) -> list[Trial]:
        return [t for t in self.trials if t.state == "COMPLETE"]

    def trial(self, number: int | None) -> Trial | None:
        return next((t for t in self.trials if t.number == number), None)

    @property
    def groups(self) -> list[tuple[str, list[str], list[str]]]:
        """The search's choices: (parameter name, FQNs, candidate names) per group."""
        return _groups(self.context)

    @property
    def status(self) -> str:
        """What happened, for the status box: "running" (no summary: interrupted or still running),
        "no_trials" (the budget ran out before the first trial), "interrupted" (stopped during the
        trials; the plan comes from those that finished), "unchanged" (finished, the model kept as it
        came: `unchanged_reason` says why) or "finished" (a plan applied and measured)."""
        s = self.summary
        if s is None:
            return "running"
        if s.trials == 0:
            return "no_trials"
        if s.stopped.startswith("interrupted"):
            return "interrupted"
        return "unchanged" if not s.plan else "finished"

    @property
    def unchanged_reason(self) -> str:
        """Why a finished run kept the model as it came (the decision that ended it)."""
        if self.summary is None:
            return ""
        ending = [d for d in self.summary.decisions if d.kind in ("kept_unchanged", "no_feasible_plan",
                                                                  "tier2_none_held", "best_is_unchanged",
                                                                  "nothing_to_try")]
        if ending:
            return describe(ending[-1])
        return "no trial finished" if not self.summary.trials else "no quantized plan was chosen"

    def rejected_on_tier2(self) -> set[int]:
        """Trials checked on tier 2 that broke the budget there (their final verdict)."""
        return self._tier2("tier2_rejected")

    def held_on_tier2(self) -> set[int]:
        """Trials checked on tier 2 that kept the budget there (their final verdict)."""
        return self._tier2("tier2_held")

    def _tier2(self, kind: str) -> set[int]:
        if self.summary is None:
            return set()
        return {d.trial for d in self.summary.decisions if d.kind == kind and d.trial is not None}

    def emulated_in_plan(self) -> list[str]:
        """Candidates of the shown plan that are only emulated here: no speed-up may be claimed."""
        return sorted({c.candidate for lay in self.layers for c in lay.choices if c.status == "chosen" and c.emulated})

    def state_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.trials:
            counts[t.state] = counts.get(t.state, 0) + 1
        return counts

    def worker_counts(self) -> dict[str, int]:
        """Process label -> finished trials it ran; empty when one process ran the study alone."""
        counts: dict[str, int] = {}
        for t in self.completed:
            if t.worker:
                counts[t.worker] = counts.get(t.worker, 0) + 1
        return counts


##### loading ###################################################################################

def load(out_dir: str | Path) -> ReportData:
    """Everything the report shows, read from a search directory (finished or not).

    Raises ReportError if `out_dir` has no readable context.json. A study that cannot be read (e.g.
    a database server that is down) is not an error: the report says so and shows the rest.
    """
    out_dir = Path(out_dir).resolve()  # the report shows it in commands to copy
    ctx_path = out_dir / "context.json"
    if not ctx_path.is_file():
        raise ReportError(f"{out_dir} is not an autoao search directory (no context.json): give the --out "
                          "directory of `autoao search` or the out_dir of optimize()")
    try:
        context = load_context(ctx_path)
        summary = load_summary(out_dir / "summary.json") if (out_dir / "summary.json").is_file() else None
    except RunFileError as e:
        raise ReportError(str(e)) from None
    warnings: list[str] = []
    trials, study_error = _load_trials(context, out_dir)
    if study_error:
        warnings.append(f"The study could not be read ({study_error}): no trials, Pareto front or history")
    pareto = pareto_front(trials)
    groups = _groups(context)
    if summary is not None:
        plan = dict(summary.plan)
        chosen_trial = _final_trial(out_dir, plan, trials, groups)
        plan_source = "plan.json: the plan the search chose and applied"
    else:
        best = best_trial(trials)
        if best is not None:
            plan, chosen_trial = plan_of(groups, best.params), best.number
            plan_source = f"trial {best.number}, the fastest feasible plan so far (also in best_plan.json)"
        elif (out_dir / "best_plan.json").is_file() and study_error:
            plan, chosen_trial = _plan_file(out_dir / "best_plan.json")
            plan_source = "best_plan.json: the best feasible plan so far (the study could not be read)"
        else:
            plan, chosen_trial = {}, None
            plan_source = "no feasible plan yet: every layer stays as it came"
    plan = {lay.fqn: plan.get(lay.fqn, BASELINE) for lay in context.layers}
    fusions = _fusion_notes(context.layers, context.fused, plan)
    layers = [_layer(lay, plan[lay.fqn], groups, fusions.get(lay.fqn, "")) for lay in context.layers]
    candidates = [CandidateInfo(c.name, c.summary, c.status, c.layers, c.emulated, list(c.reasons),
                                in_plan=sum(p == c.name for p in plan.values()))
                  for c in context.candidates]
    data = ReportData(out_dir, summary is not None, context, summary, trials, [t.number for t in pareto],
                      chosen_trial, plan_source, plan, layers, candidates, [], warnings)
    data.accuracy = _accuracy_rows(data)
    data.warnings += _trust_warnings(data)
    if data.status in ("unchanged", "no_trials"):  # no layer was weighed against others: say what happened
        why = ("kept as it came: the budget ran out before the first trial" if data.status == "no_trials" else
               f"kept as it came with the whole model: {data.unchanged_reason}")
        for lay in data.layers:
            lay.why = lay.choices[0].reason = why
    return data


def _groups(context: RunContext) -> list[tuple[str, list[str], list[str]]]:
    return [(g.name, list(g.fqns), list(g.choices)) for g in context.groups]


def _storage_url(context: RunContext, out_dir: Path) -> str | None:
    """The study's storage. The default one (study.db in the output directory) is read from the
    directory itself, so a directory that was moved or copied reports its own study."""
    url = context.storage
    local = out_dir / "study.db"
    if url and url.startswith("sqlite:///"):
        if url.endswith("/study.db") and local.is_file():
            return f"sqlite:///{local}"
        return url if Path(url.removeprefix("sqlite:///")).is_file() else None
    return url


def _load_trials(context: RunContext, out_dir: Path) -> tuple[list[Trial], str | None]:
    url = _storage_url(context, out_dir)
    if url is None:
        return [], f"{out_dir / 'study.db'} not found"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=context.study_name, storage=url)
        frozen = study.get_trials(deepcopy=False)
    except Exception as e:  # noqa: BLE001 - any storage failure: report what else is known
        return [], f"{type(e).__name__}: {e}"
    search_seconds = _search_seconds(frozen)
    return [_trial(t, search_seconds.get(t.number), context.max_accuracy_drop) for t in frozen], None


def _search_seconds(frozen: list[Any]) -> dict[int, float]:
    """Trial number -> seconds of search until it ended: the durations of every trial that ended
    by then, summed, so an idle gap between two runs of the same study does not count."""
    ended = sorted((t for t in frozen if t.datetime_start and t.datetime_complete), key=lambda t: t.datetime_complete)
    out, total = {}, 0.0
    for t in ended:
        total += (t.datetime_complete - t.datetime_start).total_seconds()
        out[t.number] = total
    return out


def _trial(t: Any, finished: float | None, max_drop: float) -> Trial:
    done = t.state.name == "COMPLETE" and t.values is not None
    pred_us, drop = (t.values if done else (math.nan, math.nan))
    if done and drop >= 1e9:  # the search stores a NaN/Inf plan's drop as 1e9 (Optuna needs a number)
        drop = math.inf
    attrs = t.user_attrs
    return Trial(
        number=t.number, state=t.state.name, predicted_ms=pred_us / 1e3, drop=drop,
        accuracy=attrs.get("accuracy"), tier=attrs.get("tier"),
        feasible=done and attrs.get("constraint", drop - max_drop) <= 0,
        finished_s=finished, warm_start=attrs.get("seed") == "warm start", params=dict(t.params),
        metrics={k: float(v) for k, v in (attrs.get("metrics") or {}).items()},
        error=str(t.system_attrs.get("fail_reason", "")), worker=str(attrs.get("worker", "")),
    )


def pareto_front(trials: list[Trial]) -> list[Trial]:
    """Non-dominated COMPLETE trials on (predicted latency, drop), fastest first, each plan once:
    the search's own rule (autoao.runfiles.pareto_front), so the report's front is the search's."""
    return search_front([t for t in trials if t.state == "COMPLETE"], latency=lambda t: t.predicted_ms)


def best_trial(trials: list[Trial]) -> Trial | None:
    """Fastest feasible trial (ties: smaller drop, then earlier), the search's `best`."""
    feasible = [t for t in trials if t.feasible]
    return min(feasible, key=lambda t: (t.predicted_ms, t.drop, t.number)) if feasible else None


def plan_of(groups: list[tuple[str, list[str], list[str]]], params: dict[str, str]) -> dict[str, str]:
    """Group choices -> FQN -> candidate name (the mapping of autoao.search.plan_from_params, kept
    by name: the report never builds modules)."""
    return {fqn: params.get(name, BASELINE) for name, fqns, _ in groups for fqn in fqns}


def _final_trial(out_dir: Path, plan: dict[str, str], trials: list[Trial],
                 groups: list[tuple[str, list[str], list[str]]]) -> int | None:
    """The trial the final plan came from: plan.json's metadata, else the earliest trial with the
    same choices; None when the plan changes nothing (the model was kept as it came)."""
    if all(c == BASELINE for c in plan.values()):
        return None
    if (out_dir / "plan.json").is_file():
        _, trial = _plan_file(out_dir / "plan.json")
        if trial is not None:
            return trial
    wanted = {f: c for f, c in plan.items() if c != BASELINE}
    for t in sorted(trials, key=lambda t: t.number):
        if t.state == "COMPLETE" and {f: c for f, c in plan_of(groups, t.params).items() if c != BASELINE} == wanted:
            return t.number
    return None


def _plan_file(path: Path) -> tuple[dict[str, str], int | None]:
    try:
        plan = Plan.load(path)
    except (PlanError, OSError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    return {f: c.name for f, c in plan.layers.items()}, plan.metadata.get("trial")


##### per-layer explanations ####################################################################

def _fusion_notes(layers: list[LayerRecord], fused: list[FusedRecord], plan: dict[str, str]) -> dict[str, str]:
    """FQN -> "; runs as one kernel with k_proj, v_proj: 30 µs for the group instead of 41 µs" for
    the layers of sibling groups that the plan runs fused (same rule as the search: one candidate
    that fuses, and a fused time below the members' sum)."""
    times = {lay.fqn: lay.time_us for lay in layers}
    notes = {}
    for group in fused:
        fqns, fused_us = group.fqns, group.time_us
        chosen = {plan.get(f, BASELINE) for f in fqns}
        name = next(iter(chosen))
        if len(chosen) != 1 or name == BASELINE or name not in fused_us:
            continue
        apart = sum(times[f].get(name, math.inf) for f in fqns)
        if fused_us[name] < apart:
            for f in fqns:
                others = ", ".join(o.rpartition(".")[2] for o in fqns if o != f)
                notes[f] = (f"; runs as one kernel with {others}: {fmt_us(fused_us[name])} for the group "
                            f"instead of {fmt_us(apart)}")
    return notes


def _layer(lay: LayerRecord, chosen: str, groups: list[tuple[str, list[str], list[str]]],
           fusion: str = "") -> Layer:
    group, members = next(((n, f) for n, f, _ in groups if lay.fqn in f), (lay.fqn, [lay.fqn]))
    times, sqnr = lay.time_us, lay.sqnr_db
    emulated = set(lay.emulated)
    names = list(dict.fromkeys([*times, *lay.timing_error, *lay.excluded, *lay.choices]))
    t_chosen = times.get(chosen)
    choices = []
    for c in names:
        if c == chosen:
            status, reason = "chosen", _why_chosen(chosen, lay, members, fusion)
        elif c in lay.excluded:
            status, reason = "excluded", f"excluded: {lay.excluded[c]}"
        elif c not in lay.choices:
            status, reason = "excluded", f"excluded: {lay.timing_error.get(c, 'not offered to the search')}"
        else:
            status = "allowed"
            t, s, s_chosen = times.get(c), sqnr.get(c), sqnr.get(chosen)
            if t is not None and t_chosen is not None and t >= t_chosen:
                reason = f"slower: {fmt_us(t)} vs {fmt_us(t_chosen)}"
            elif s is not None and s_chosen is not None and s < s_chosen:
                reason = f"less accurate: SQNR {fmt_db(s)} vs {fmt_db(s_chosen)}"
            else:
                reason = "not picked by the search (Pareto trade-off)"
        kern, note = _kernel(lay.kernels.get(c))
        choices.append(Choice(c, status, times.get(c), c in emulated, sqnr.get(c), reason, kern, note))
    order = {"chosen": 0, "allowed": 1, "excluded": 2}
    choices.sort(key=lambda ch: order[ch.status])  # stable: the candidates' registry order within
    return Layer(lay.fqn, group, len(members), lay.in_features, lay.out_features, lay.tokens,
                 dict(lay.calls), list(lay.tied), chosen,
                 choices[0].reason if choices and choices[0].status == "chosen" else "", choices)


def _kernel(info: KernelTimes | None) -> tuple[str | None, str]:
    """A layer's per-kernel timings of one candidate -> (chosen kernel, "kernel; other 1.52x slower")."""
    if info is None or info.chosen is None:
        return None, ""
    chosen, us = info.chosen, info.us
    others = []
    for kern, t in us.items():
        if kern != chosen:
            ratio = t / us[chosen] if us.get(chosen) and math.isfinite(t) else math.inf
            others.append(f"{kern} {'failed' if not math.isfinite(ratio) else f'{ratio:.2f}x slower'}")
    return chosen, "; ".join([describe_route(chosen), *others])  # a route: "a up to 16 rows, b above"


def _why_chosen(chosen: str, lay: LayerRecord, members: list[str], fusion: str = "") -> str:
    group_size = len(members)
    times, sqnr = lay.time_us, lay.sqnr_db
    faster = [c for c in lay.choices if c in times and times[c] < times.get(chosen, math.inf)]
    noisier = all(sqnr.get(c, -math.inf) < sqnr.get(chosen, math.inf) for c in faster)
    shared = fusion
    if group_size > 1 and not fusion:  # siblings (q/k/v, gate/up) take one choice together
        siblings = [f.rpartition(".")[2] for f in members if f != lay.fqn]
        shared = f"; shared with {', '.join(siblings)}"
    if chosen == BASELINE:
        if not faster:
            return "kept as it came: no allowed candidate is faster on this layer" + shared
        best = max(sqnr.get(c, -math.inf) for c in faster)
        lead = (f"kept as it came: {_faster(len(faster))} less accurate (SQNR at best {fmt_db(best)}); the search "
                "spent the accuracy budget on other layers" if noisier else
                "kept as it came: not picked by the search (Pareto trade-off)")
        return lead + shared
    if not faster:
        lead = "chosen: fastest allowed candidate"
    elif noisier:
        lead = f"chosen: {_faster(len(faster))} less accurate"
    else:
        lead = "chosen by the search over faster candidates (Pareto trade-off)"
    if chosen in lay.emulated:
        lead += " (emulated here: its time is not a speed-up)"
    return lead + shared


def _faster(n: int) -> str:
    return "the faster candidate is" if n == 1 else f"the {n} faster candidates are"


##### accuracy and trust ########################################################################

def _accuracy_rows(data: ReportData) -> list[AccuracyRow]:
    """Every accuracy number of the shown plan next to bf16's, each with the tier that made it."""
    acc = data.context.accuracy
    rows: list[AccuracyRow] = []
    chosen = data.trial(data.chosen_trial)
    all_bf16 = all(c == BASELINE for c in data.plan.values())
    base1 = acc.baseline_tier1
    # the proxy's mode, from its metrics: LM (agreement, KL), embedding (cosine), or output error
    mode = "lm" if "kl" in base1 else "embedding" if "cosine" in base1 else "output"
    proxy_source = acc.proxy or {"lm": "top-1 agreement with the unmodified model",
                                 "embedding": "mean cosine similarity to the unmodified model's embeddings",
                                 "output": "1 - relative output error on held-out inputs"}[mode]
    for key, label in PROXY_METRICS.items():
        if key not in base1 or (key == "agreement" and mode == "lm"):  # the LM's accuracy is its agreement
            continue
        if key == "accuracy":
            label = {"lm": "top-1 agreement with {base}", "embedding": "mean cosine similarity to {base}'s embedding",
                     "output": "1 − relative output error"}[mode]
        label = label.format(base=data.baseline_name)
        plan_value = base1[key] if all_bf16 else (chosen.metrics.get(key) if chosen else None)
        higher = key not in ("kl", "loss", "rel_error")
        rows.append(AccuracyRow(label, 1, f"proxy: {proxy_source}", base1[key], plan_value, higher))
    if acc.tier == 2:
        rows += _tier2_rows(data.context, data.summary, all_bf16)
    return rows


def _tier2_rows(context: RunContext, summary: RunSummary | None, all_bf16: bool) -> list[AccuracyRow]:
    acc = context.accuracy
    final = summary.accuracy if summary is not None else None
    measured = final is not None and final.tier == 2
    if acc.tasks:
        source = f"lm-eval: {', '.join(acc.tasks)}"
        rows = [AccuracyRow("mean headline accuracy of the tasks", 2, source, acc.baseline_tier2,
                            acc.baseline_tier2 if all_bf16 else final.accuracy if measured else None,  # type: ignore[union-attr]
                            True)]
        for key, value in acc.baseline_tier2_metrics.items():
            plan_value = value if all_bf16 else final.metrics.get(key) if measured else None  # type: ignore[union-attr]
            rows.append(AccuracyRow(key, 2, source, value, plan_value, "perplexity" not in key and "bits" not in key))
        return rows
    name = acc.metric or "metric"
    plan_value = acc.baseline_tier2 if all_bf16 else final.accuracy if measured else None  # type: ignore[union-attr]
    return [AccuracyRow(name, 2, f"user metric: {name}", acc.baseline_tier2, plan_value, True)]


def decision_notes(data: ReportData) -> list[str]:
    """The finished run's decisions as sentences (autoao.runfiles.describe)."""
    return [describe(d) for d in data.summary.decisions] if data.summary is not None else []


def _trust_warnings(data: ReportData) -> list[str]:
    """What makes a number on the page less trustworthy than it looks, said up front."""
    out = []
    health = data.context.timing
    if health.spot_check:
        out.append(f"At start, {health.spot_check}")
    if health.unreliable:
        out.append(f"{health.unreliable} of {health.cells} timing cells could not be measured without the process "
                   f"losing the CPU ({health.discarded_samples} disturbed samples dropped): the cost model used "
                   "the pessimistic end of their spread; measure on a quieter machine for sharper predictions")
    if health.not_timed:
        out.append(f"{health.not_timed} of {health.cells} timing cells were not measured within the time budget: "
                   "the candidates they belong to were not offered on those layers (a larger budget times them)")
    grid = data.context.int4_grid_layers
    if grid:
        g32 = next((c for c in data.candidates if c.name == GRID_CANDIDATE), None)
        out.append(f"The weights of {grid} of {len(data.layers)} layers sit on a 4-bit grid of groups of 32, as a "
                   "GGUF Q4_0 / Q4_1 file leaves them: int4 with group size 32 re-quantizes that grid and measures "
                   "near lossless on them, as it would not on a model trained in bf16"
                   + (" (it was left out of this search)" if g32 is not None and g32.status == "left out" else ""))
    base = data.context.baseline_ms
    pred, meas = base.predicted, base.measured
    if pred and meas and not 0.5 <= pred / meas <= 2.0:
        out.append(f"The cost model predicts {pred:,.3f} ms for the {data.baseline_name} model but it measured {meas:,.3f} ms end "
                   f"to end ({max(pred / meas, meas / pred):,.1f}x apart): per-layer timings on this device are "
                   "unreliable, so predicted latencies and speed-ups are too; trust the measured numbers")
    emulated = data.emulated_in_plan()
    if emulated:
        out.append(f"The plan uses candidates that are only emulated on this device ({', '.join(emulated)}): "
                   "their latency is not that of a fast kernel, so no speed-up is reported for them")
    s = data.summary
    chosen = data.trial(data.chosen_trial)
    speedups: dict[str, float | None] = {"predicted": s.speedup.predicted, "measured": s.speedup.measured} if s else (
        {"predicted": pred / chosen.predicted_ms} if pred and chosen and chosen.predicted_ms > 0 else {})
    for kind, value in speedups.items():
        if value and value > PLAUSIBLE_SPEEDUP and not emulated:
            out.append(f"The {kind} speed-up, {value:,.1f}x, is beyond what these candidates can give (4-bit "
                       "weights move 4x fewer bytes, 2:4 sparsity halves the work): the timings were likely "
                       "disturbed, e.g. by other processes on the machine; measure again on an idle one")
    p_up, m_up = speedups.get("predicted"), speedups.get("measured")
    if p_up and m_up and not 2 / 3 <= p_up / m_up <= 1.5 and not emulated:
        out.append(f"The cost model predicted a {p_up:.2f}x speed-up but the plan measured {m_up:.2f}x end to end: "
                   "trust the measured number; latencies in the Pareto front and the layer table are predictions")
    if s and s.speedup.measured and s.speedup.measured < 1.0 and s.plan:
        out.append(f"The chosen plan measured slower than {data.baseline_name} end to end (speed-up {s.speedup.measured:.2g}x)")
    return out
