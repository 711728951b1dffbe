"""Read a run directory into what the report shows, nothing about HTML.

    data = load("autoao-report/")
    data.status, data.shown, data.trials, data.front, data.patterns, data.warnings

Sources, read through autoao.records' types (the report never indexes raw JSON by key):
  context.json   RunContext: written before the first trial (model, device, candidates, layers)
  the study      one TrialRecord per trial (TrialRecord.read), also while the run goes on
  summary.json   RunSummary: only when the run ended, at its end or by a signal (the shipped plan,
                 its verdicts, the decisions, planned and spent seconds per stage, when each
                 better plan was verified)
  pareto.json    ParetoRow per plan of the front, where the study cannot be read

The report derives nothing the run did not decide: a trial's feasibility is TrialRecord.feasible,
the front is autoao.records.pareto_front (the search's own), "within budget" is a recorded
Verdict. A run that a signal (SIGINT, SIGTERM) ended writes summary.json with the best plan
verified by then (RunSummary.interrupted); a directory without summary.json is a killed or
still-running run: the plan shown is then the fastest feasible plan of the front so far, the one
the search keeps in best_plan.json.
Everything here is a pure function of those files: loading twice gives equal data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autoao.common import BASELINE
from autoao.decisions import Judged, RunInterrupted
from autoao.records import (CandidateRecord, ParetoRow, RunContext, RunFileError, RunSummary, TrialRecord, from_dict,
                            load_context, load_summary, pareto_front)
from autoao.reports import accuracy, trust
from autoao.reports.layers import Layer, Pattern, explain, group
from autoao.types import FromBytes

class ReportError(ValueError):
    """The directory is not (or no longer) a readable autoao run directory."""


@dataclass(frozen=True)
class FrontRow:
    """A plan of the Pareto front (predicted latency against the screen's drop), fastest first."""

    trial: int
    predicted_ms: float
    drop: float  # tier 1, on the search's screen
    feasible: bool  # as the search decided when the trial ran
    plan: dict[str, int]  # candidate -> layers (the baseline left out)
    screen: TrialRecord | None  # the trial's record (None: read from pareto.json alone)
    judged: Judged | None  # the accuracy judges' verdicts on it, where it was judged


@dataclass(frozen=True)
class Shown:
    """The plan the page explains: the shipped one, or the best so far."""

    trial: int | None  # None: the model as it came, or not recorded
    source: str  # where it comes from, for the reader
    plan: dict[str, str]  # every layer's FQN -> candidate (the baseline included)

    @property
    def unchanged(self) -> bool:
        return all(c == BASELINE for c in self.plan.values())


@dataclass(frozen=True)
class ReportData:
    out_dir: Path
    context: RunContext
    summary: RunSummary | None  # None while unfinished
    trials: tuple[TrialRecord, ...]  # by number
    front: tuple[FrontRow, ...]
    shown: Shown
    layers: tuple[Layer, ...]
    patterns: tuple[Pattern, ...]
    candidates: tuple[tuple[CandidateRecord, int], ...]  # each candidate and the layers of the shown plan on it
    metrics: tuple[accuracy.MetricRow, ...]
    warnings: tuple[str, ...]
    stages: tuple[trust.StageRow, ...]

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def max_drop(self) -> float:
        return self.context.max_accuracy_drop

    @property
    def baseline_name(self) -> str:
        return baseline_name(self.context)

    @property
    def completed(self) -> tuple[TrialRecord, ...]:
        return tuple(t for t in self.trials if t.state == "COMPLETE")

    @property
    def shown_trial(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.number == self.shown.trial), None)

    @property
    def judged(self) -> tuple[Judged, ...]:
        return accuracy.judged(self.summary)

    @property
    def status(self) -> str:
        """"running" (no summary: killed, or still running), "interrupted" (SIGINT / SIGTERM ended
        it early, with the best plan verified by then written, whenever the signal came),
        "no_trials" (the budget ran out before the first trial), "unchanged" (finished, the model
        kept as it came: `unchanged_reason`) or "finished" (a plan applied and measured)."""
        s = self.summary
        if s is None:
            return "running"
        if s.interrupted:
            return "interrupted"
        if s.trials == 0:
            return "no_trials"
        return "unchanged" if not s.plan else "finished"

    @property
    def interrupted_at(self) -> float | None:
        """Seconds into the run when the signal came: its RunInterrupted decision's, or the run's
        whole time where it recorded none; None when no signal ended the run."""
        s = self.summary
        if s is None or not s.interrupted:
            return None
        return next((d.at_s for d in reversed(s.decisions) if isinstance(d, RunInterrupted)), s.seconds)

    @property
    def unchanged_reason(self) -> str:
        return unchanged_reason(self.summary) if self.summary is not None else ""

    def emulated_in_plan(self) -> list[str]:
        """The shown plan's candidates only emulated here, whose speed-up is not one; none where the
        run's costs are an estimate for another engine (context.pricing: FromBytes), which the page says."""
        return [] if isinstance(self.context.pricing, FromBytes) else emulated(self.layers)

    def uses_emulated(self, row: FrontRow) -> bool:
        """Whether a plan of the front uses a candidate only emulated here (its speed-up is not one;
        an estimated run's are estimates, said at the top)."""
        return not isinstance(self.context.pricing, FromBytes) and any(c in lay.emulated for lay in self.context.layers for c in row.plan)

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
    """Everything the report shows, read from a run directory (finished or not).

    Raises ReportError if `out_dir` has no readable context.json. A study that cannot be read (e.g.
    a database server that is down) is not an error: the report says so and shows the rest.
    """
    out_dir = Path(out_dir).resolve()  # the report shows it in commands to copy
    context, summary = _run_files(out_dir)
    trials, study_error = _load_trials(context, out_dir)
    front = _front(context, summary, trials, out_dir)
    shown = _shown(context, summary, trials, front)
    kept = _kept(summary)
    rows = explain(context, shown.plan, summary.fusions if summary else [], summary.kernels if summary else {}, kept)
    base = baseline_name(context)
    trial = next((t for t in trials if t.number == shown.trial), None)
    warnings = trust.warnings(context, summary, emulated(rows), _predicted_speedup(context, summary, trial), base)
    if study_error:
        warnings = (f"The study could not be read ({study_error}): no trials, history or live Pareto front",
                    *warnings)
    return ReportData(
        out_dir, context, summary, trials, front, shown, rows, group(rows),
        tuple((c, sum(p == c.name for p in shown.plan.values())) for c in context.candidates),
        accuracy.metric_rows(context, summary, trial, shown.unchanged, base), warnings, trust.stages(summary))


def baseline_name(ctx: RunContext) -> str:
    """The unchanged model's name on the page: its dtype ("bf16" for bfloat16, else e.g. float32)."""
    return "bf16" if ctx.model.dtype == "bfloat16" else ctx.model.dtype


def emulated(rows: tuple[Layer, ...]) -> list[str]:
    """Candidates of a plan that are only emulated here: no speed-up may be claimed for them."""
    return sorted({lay.chosen for lay in rows if lay.pick.emulated})


def _run_files(out_dir: Path) -> tuple[RunContext, RunSummary | None]:
    if not (out_dir / "context.json").is_file():
        raise ReportError(f"{out_dir} is not an autoao search directory (no context.json): give the --out "
                          "directory of `autoao search` or the out_dir of optimize()")
    try:
        context = load_context(out_dir / "context.json")
        summary = load_summary(out_dir / "summary.json") if (out_dir / "summary.json").is_file() else None
    except RunFileError as e:
        raise ReportError(str(e)) from None
    return context, summary


def unchanged_reason(summary: RunSummary) -> str:
    """Why a finished run kept the model as it came: its last decision that ends a run so."""
    ending = [d for d in summary.decisions if d.ends_unchanged]
    if ending:
        return ending[-1].describe()
    return "no trial finished" if not summary.trials else "no quantized plan was chosen"


def _kept(summary: RunSummary | None) -> str | None:
    """Why no layer was weighed against another: the finished run kept the whole model (None: it
    did not). Short: the status box above the layers gives the run's reason in full."""
    if summary is None or summary.plan:
        return None
    if summary.interrupted:
        return f"kept as it came: {summary.interrupted} ended the run before a plan was verified"
    if summary.trials == 0:
        return "kept as it came: the budget ran out before the first trial"
    return "kept as it came with the whole model, for the reason the status box gives"


def _predicted_speedup(ctx: RunContext, summary: RunSummary | None, trial: TrialRecord | None) -> float | None:
    if summary is not None:
        return summary.speedup.predicted
    base = ctx.baseline_ms.predicted
    return base / trial.predicted_ms if base and trial is not None and trial.predicted_ms > 0 else None


##### the study #################################################################################

def _storage_url(context: RunContext, out_dir: Path) -> str | None:
    """The study's storage. The default one (study.db in the output directory) is read from the
    directory itself, so a directory that was moved or copied reports its own study."""
    url = context.storage
    local = out_dir / "study.db"
    if url and url.startswith("sqlite:///"):
        if url.endswith("/study.db") and local.is_file():
            return f"sqlite:///{local}"
        return url if Path(url.removeprefix("sqlite:///")).is_file() else None
    return url or None


def _load_trials(context: RunContext, out_dir: Path) -> tuple[tuple[TrialRecord, ...], str | None]:
    """Every trial's record, by number; or none and why the study could not be read."""
    url = _storage_url(context, out_dir)
    if url is None:
        return (), f"{out_dir / 'study.db'} not found"
    import optuna  # lazy: optuna is only needed when a report is rendered

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        frozen = optuna.load_study(study_name=context.study_name, storage=url).get_trials(deepcopy=False)
    except Exception as e:  # noqa: BLE001 - any storage failure: report what else is known
        return (), f"{type(e).__name__}: {e}"
    return tuple(sorted((TrialRecord.read(t) for t in frozen), key=lambda r: r.number)), None


def layer_plan(context: RunContext, params: dict[str, str]) -> dict[str, str]:
    """A trial's choices (search parameter -> candidate) as FQN -> candidate: each GroupRecord
    names the layers its parameter sets."""
    return {f: params.get(g.name, BASELINE) for g in context.groups for f in g.fqns}


def layer_counts(context: RunContext, params: dict[str, str]) -> dict[str, int]:
    """Candidate -> layers of a trial's plan (the baseline left out), most first."""
    counts: dict[str, int] = {}
    for c in layer_plan(context, params).values():
        if c != BASELINE:
            counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def plan_text(counts: dict[str, int]) -> str:
    """"int8_dyn x4, int4_wo(group_size=64) x2" (layers per candidate, the baseline left out; "unchanged")."""
    return ", ".join(f"{c} x{n}" for c, n in counts.items() if c != BASELINE) or "unchanged"


def _front(context: RunContext, summary: RunSummary | None, trials: tuple[TrialRecord, ...],
           out_dir: Path) -> tuple[FrontRow, ...]:
    """The search's Pareto front from the trial records; pareto.json where the study is gone."""
    judged = {d.trial: d for d in accuracy.judged(summary)}  # the last verdicts on each judged trial
    done = [t for t in trials if t.state == "COMPLETE"]
    if done:
        return tuple(FrontRow(t.number, t.predicted_ms, t.drop, t.feasible, layer_counts(context, t.params),
                              t, judged.get(t.number)) for t in pareto_front(done))
    return tuple(FrontRow(r.trial, r.predicted_ms, r.drop, r.feasible, r.plan, None, judged.get(r.trial))
                 for r in _pareto_file(out_dir / "pareto.json"))


def _pareto_file(path: Path) -> list[ParetoRow]:
    """pareto.json's plans ([] without one); ReportError naming the file when it cannot be read."""
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    if not isinstance(rows, list):
        raise ReportError(f"{path} is not an autoao pareto.json (a list of plans was expected)")
    try:
        return [from_dict(ParetoRow, r, path) for r in rows]
    except RunFileError as e:
        raise ReportError(str(e)) from None


def _shown(context: RunContext, summary: RunSummary | None, trials: tuple[TrialRecord, ...],
           front: tuple[FrontRow, ...]) -> Shown:
    every = {lay.fqn: BASELINE for lay in context.layers}
    if summary is not None:
        shipped = {**every, **summary.plan}
        trial = _trial_of(context, shipped, trials) if summary.plan else None
        return Shown(trial, "plan.json: the plan the run chose, applied and measured" if summary.plan else
                     "the model as it came: no plan shipped", shipped)
    best = next((r.screen for r in front if r.feasible and r.screen is not None), None)
    if best is None:
        return Shown(None, "no feasible plan yet: every layer stays as it came", every)
    return Shown(best.number, f"trial {best.number}, the fastest feasible plan of the front so far (best_plan.json)",
                 {**every, **layer_plan(context, best.params)})


def _trial_of(context: RunContext, plan: dict[str, str], trials: tuple[TrialRecord, ...]) -> int | None:
    """The earliest finished trial whose choices are the shipped plan's layers (None: not in the study)."""
    return next((t.number for t in trials if t.state == "COMPLETE"
                 and {**{f: BASELINE for f in plan}, **layer_plan(context, t.params)} == plan), None)
