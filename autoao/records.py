"""What a run writes and the report reads: typed, versioned records, and the sentences of decisions.

    context.json   RunContext: everything known before the first trial (so an interrupted run can
                   still be reported): model, device, versions, candidates, per-layer timings/SQNR
    summary.json   RunSummary: only when the run finished: measured latencies, final accuracy,
                   the plan, where the time went, and the Decisions that led to the plan

Both carry `version` (RUN_FILES_VERSION). `load_context` / `load_summary` read a file written by
this or an earlier autoao (unversioned files, autoao 0.1.0 before the records were typed, are
upgraded in memory); a newer or unreadable file raises RunFileError naming the file and what to do.
The writer (autoao's stages) and the reader (autoao.reports) share these classes, so no one indexes
raw JSON by string. It imports only autoao.common: every layer may use it.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from autoao.common import atomic_write

# 1: the first typed version. Bump it when a field changes meaning or is removed, and teach
# _upgrade the step from the previous version.
RUN_FILES_VERSION = 1


class RunFileError(ValueError):
    """A run file that cannot be read: missing, corrupt, or written by a newer autoao."""


##### shared pieces #############################################################################

@dataclass
class Latency:
    """One latency, predicted by the cost model and/or measured end to end (ms; None: not known)."""

    predicted: float | None = None
    measured: float | None = None


@dataclass
class AccuracyResult:
    """An accuracy measurement of one plan: the tier that made it (1 proxy, 2 lm-eval / user metric)."""

    tier: int
    accuracy: float
    drop: float  # baseline minus plan, in the accuracy's own units (positive = worse)
    metrics: dict[str, float] = field(default_factory=dict)
    source: str = ""


##### context.json ##############################################################################

@dataclass
class ModelInfo:
    class_name: str
    parameters: int
    weight_bytes: int
    dtype: str
    num_linears: int  # nn.Linear and GPT-2 Conv1D layers, each weight once


@dataclass
class DeviceInfo:
    type: str  # "cpu" / "cuda"
    name: str  # the device's model name (part of every timing key)
    timing_mode: str  # eager / graph / compile
    features: str = ""  # the CPU's matrix / vector instruction sets, e.g. "AMX-BF16, AVX512-VNNI, AVX2"


@dataclass
class AccuracySpec:
    """Which accuracy decides, and the unchanged model's scores on each tier."""

    tier: int  # 1: the proxy decides; 2: lm-eval tasks or the user's metric decide
    tasks: list[str] | None = None
    metric: str | None = None  # the user callable's name
    baseline_tier1: dict[str, float] = field(default_factory=dict)  # proxy metrics of the unchanged model
    baseline_tier2: float | None = None  # the unchanged model's tier-2 accuracy (mean headline metric)
    baseline_tier2_metrics: dict[str, float] = field(default_factory=dict)  # "task/metric" -> value (lm-eval)
    proxy: str = ""  # what the proxy's accuracy and drop mean (the budget's unit on tier 1)


@dataclass
class KernelTimes:
    """A candidate with several kernels on one layer: the one timing chose, and each one's time."""

    chosen: str | None
    us: dict[str, float]  # kernel -> time over the layer's calls (inf: failed)


@dataclass
class LayerRecord:
    fqn: str
    in_features: int
    out_features: int
    tokens: int  # rows seen over the workload
    calls: dict[int, int]  # M -> calls of that size per workload
    time_us: dict[str, float]  # candidate -> predicted time of this layer over the workload
    timing_error: dict[str, str]  # candidate -> why it has no timing
    kernels: dict[str, KernelTimes]
    emulated: list[str]  # candidates only emulated on this device
    sqnr_db: dict[str, float]  # tier 0: candidate -> output SQNR of the layer alone
    choices: list[str]  # what the search may pick here (bf16 first)
    excluded: dict[str, str]  # candidate -> why the search may not pick it
    tied: list[str] = field(default_factory=list)  # other names of the same weight


@dataclass
class CandidateRecord:
    name: str
    summary: str
    status: str  # available / partly available / emulated / unsupported / left out
    layers: int  # layers the search may use it on
    emulated: str | None = None  # why it is only emulated here
    reasons: list[str] = field(default_factory=list)  # why it is excluded on some layers


@dataclass
class GroupRecord:
    """One search parameter: layers that take one choice together."""

    name: str
    fqns: list[str]
    choices: list[str]


@dataclass
class FusedRecord:
    fqns: list[str]
    time_us: dict[str, float]  # candidate -> time of the group run as one fused module


@dataclass
class TimingHealth:
    """How far this run's timings can be trusted."""

    spot_check: str = ""  # what the start-up re-timing of cached cells found ("" = agreed or nothing cached)
    cells: int = 0  # (candidate, shape, M) cells in the table
    unreliable: int = 0  # cells without enough undisturbed samples (used conservatively)
    discarded_samples: int = 0  # samples dropped because the process lost the CPU during them
    not_timed: int = 0  # cells left out because the time budget for timing was spent


@dataclass
class AnchorRecord:
    """A uniform plan measured end to end against the unchanged model before the search, to which
    the cost model's cells of its candidate were fitted (stages.anchor_cost)."""

    candidate: str
    layers: int  # layers the uniform plan changes
    rounds: int  # alternating (unchanged, plan) rounds
    measured: float  # speed-up over the unchanged model: geometric mean of the rounds' ratios
    predicted: float  # what the cells alone predicted for the plan
    factor: float  # the candidate's cells are scaled by this (clamped to stages.ANCHOR_FACTORS)


@dataclass
class RunContext:
    started: str  # ISO time, UTC
    model: ModelInfo
    device: DeviceInfo
    versions: dict[str, str | None]
    budget: str
    max_accuracy_drop: float
    seed: int
    command: str | None
    accuracy: AccuracySpec
    storage: str
    study_name: str
    baseline_ms: Latency  # the unchanged model: cost model's prediction, measured at the start
    rest_ms: float  # what is not a linear layer, measured (the cost model's constant)
    candidates: list[CandidateRecord]
    groups: list[GroupRecord]
    fused: list[FusedRecord]
    layers: list[LayerRecord]
    timing: TimingHealth = field(default_factory=TimingHealth)
    # layers whose weights sit on a 4-bit grid of groups of 32 (a GGUF-style Q4 source): int4 with
    # group size 32 measures near lossless on them
    int4_grid_layers: int = 0
    # where tier 2 decides: the tier-1 drop up to which trials count as feasible (SearchConfig)
    screen_drop: float | None = None
    # uniform plans measured end to end that scaled their candidates' cells (CPU; empty: none)
    anchors: list[AnchorRecord] = field(default_factory=list)
    version: int = RUN_FILES_VERSION


##### summary.json ##############################################################################

@dataclass
class Decision:
    """One step of the final choice, as data: `describe` makes the sentence.

    kind:
      no_feasible_plan      no trial met the budget on the proxy; the model stays unchanged
      tier2_held            `trial`, a plan of the Pareto front, held on tier 2: it dropped
                            numbers["drop"] there, numbers["proxy_drop"] on the proxy (reason: source);
                            the check took numbers["seconds"]
      tier2_rejected        `trial` dropped numbers["drop"] on tier 2, past the budget (reason: source;
                            numbers["seconds"] as for tier2_held)
      tier2_chose_slower    `trial` was chosen: the fastest plan that held, numbers["faster"] plans
                            of the front being faster (numbers["broke"] of them broke on tier 2;
                            numbers["unchecked"], between it and the slowest that broke, were not
                            checked in numbers["checked"] bisection steps)
      tier2_none_held       none of numbers["checked"] plans held on tier 2; unchanged model
      rerank_chose          end to end, `trial` measured faster than the cost model's pick
                            (numbers: measured_ms, pick, pick_measured_ms, pick_predicted_ms)
      rerank_kept           the cost model's pick stays; `others` are the other plans' measured ms
      plan_unmeasurable     a plan predicted as fast could not be run (reason: the error)
      kept_unchanged        the chosen plan was not shown faster than the unchanged model over the
                            interleaved rounds (numbers: plan_ms, baseline_ms, low and high per-round
                            ratio, rounds; on the CPU also the paired estimate and its 95% lower
                            bound): the model stays as it came
      best_is_unchanged     the search's fastest feasible plan (`trial`) changes no layer
      busy_cpu              the CPU was busy with other work: the smallest example took
                            numbers["threads_ms"] ms on numbers["threads"] threads and
                            numbers["one_ms"] ms on one, so the run timed and measured on one thread
      nothing_to_try        no layer had a candidate but bf16 to pick (numbers["not_timed"]: cells
                            the time budget left untimed)
      out_of_time           the time budget left no room for `reason` (more tier-2 checks, the re-rank)
      small_inputs          the proxy's inputs held numbers["tokens"] token positions, too few to judge a
                            plan; numbers["held_out"] > 0: it scored that many tokens of held-out text
                            instead
      study_closed          several processes ran the trials (reason: "process count, ..." of finished
                            trials); at the close the coordinator waited numbers["waited_s"], ran
                            numbers["retried"] retried trials itself, and numbers["running"] were
                            still running (left out of the choice)
      note                  free text (reason), from run files written before decisions were typed
    """

    kind: str
    trial: int | None = None
    numbers: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    others: dict[int, float] = field(default_factory=dict)  # trial -> measured ms (rerank_kept)


def _took(numbers: dict[str, float]) -> str:
    """", 12 s" for a check that recorded its seconds (runs written before they did: nothing)."""
    return f", {numbers['seconds']:.0f} s" if "seconds" in numbers else ""


def describe(d: Decision) -> str:
    """The decision as one sentence, for the console and the report."""
    n = d.numbers
    if d.kind == "no_feasible_plan":
        return "no trial met the accuracy budget on the proxy: keeping the model as it came"
    if d.kind == "tier2_held":
        return (f"trial {d.trial} (predicted {n['predicted_ms']:.3f} ms, proxy drop {n['proxy_drop']:+.4f}) "
                f"dropped {n['drop']:+.4f} on tier 2 ({d.reason}{_took(n)}): holds")
    if d.kind == "tier2_rejected":
        return (f"trial {d.trial} (predicted {n['predicted_ms']:.3f} ms) dropped {n['drop']:+.4f} on tier 2 "
                f"({d.reason}{_took(n)}): rejected")
    if d.kind == "tier2_chose_slower":
        if "faster" not in n:  # written before the bisection: "skipped" plans were predicted to break
            skipped = int(n.get("skipped", 0))
            return (f"chose trial {d.trial}: faster plans broke the budget on tier 2"
                    + (f" or were predicted to ({skipped} skipped unchecked)" if skipped else ""))
        checked, faster, unchecked = int(n["checked"]), int(n["faster"]), int(n["unchecked"])
        said = (f"chose trial {d.trial}: the fastest plan of the Pareto front that held on tier 2 in "
                f"{checked} check{'s' if checked > 1 else ''} by bisection; ")
        plans = f"{faster} plan{'s' if faster != 1 else ''} predicted faster"
        if unchecked == faster:
            return said + f"the {plans} {'were' if faster != 1 else 'was'} not checked (no checks or time left)"
        return said + (f"of the {plans}, those checked broke the budget"
                       + (f" ({unchecked} between it and the slowest that broke not checked)" if unchecked else ""))
    if d.kind == "tier2_none_held":
        skipped = int(n.get("skipped", 0))
        return (f"none of the {int(n['checked'])} plans checked on tier 2 held"
                + (f" ({skipped} more predicted not to)" if skipped else "") + ": keeping the model as it came")
    if d.kind == "rerank_chose":
        return (f"chose trial {d.trial}: measured end to end at {n['measured_ms']:.3f} ms, "
                f"{n['pick_measured_ms'] / n['measured_ms']:.2f}x faster than trial {int(n['pick'])}, the cost "
                f"model's pick ({n['pick_measured_ms']:.3f} ms measured, {n['pick_predicted_ms']:.3f} ms predicted)")
    if d.kind == "rerank_kept":
        others = ", ".join(f"trial {t} {ms:.3f} ms" for t, ms in d.others.items())
        return (f"kept trial {d.trial} ({n['measured_ms']:.3f} ms measured end to end); the plans predicted "
                f"within {n['band']:.0%} of it were not more than {n['margin']:.0%} faster: {others}")
    if d.kind == "plan_unmeasurable":
        return f"a plan predicted as fast (trial {d.trial}) could not be measured: {d.reason}"
    if d.kind == "best_is_unchanged":
        return (f"the fastest plan found that holds the accuracy budget changes no layer (trial {d.trial}); "
                "a larger budget lets the search try more plans")
    if d.kind == "nothing_to_try":
        if n.get("not_timed"):
            return (f"the time budget was spent measuring the unchanged model before any candidate but bf16 was "
                    f"timed ({int(n['not_timed'])} cells not timed), so no plan could be tried; a larger budget "
                    "lets the search try plans")
        return "no layer has a candidate other than bf16 that runs here, so no plan could be tried"
    if d.kind == "study_closed":
        text = (f"{int(n['processes'])} processes ran the trials ({d.reason}); at the close the coordinator "
                f"waited {n['waited_s']:.1f} s for running trials")
        if n.get("retried"):
            text += f" and ran {int(n['retried'])} retried trial(s) of a lost process itself"
        if n.get("running"):
            text += f"; {int(n['running'])} trial(s) still running were left out of the choice"
        return text
    if d.kind == "out_of_time":
        return f"the time budget left no room for {d.reason} (after trial {d.trial})"
    if d.kind == "kept_unchanged":
        where = ""
        if "rounds" in n:
            paired = (f"; paired {n['estimate']:.2f}x, at least {n['bound']:.2f}x with 95% confidence"
                      if "bound" in n else "")
            where = (f" (per round {n['low']:.2f}x to {n['high']:.2f}x over {int(n['rounds'])} interleaved "
                     f"rounds{paired})")
        faster = n["estimate"] > 1.0 if "estimate" in n else n.get("high", 0.0) > 1.0
        verdict = "no measurable change" if faster else "not faster"
        return (f"the chosen plan (trial {d.trial}) measured {n['plan_ms']:.3f} ms end to end, bf16 "
                f"{n['baseline_ms']:.3f} ms{where}: {verdict}, so the model stays as it came")
    if d.kind == "busy_cpu":
        return (f"the CPU is busy with other work: one call of the smallest example took {n['threads_ms']:.1f} ms on "
                f"{int(n['threads'])} threads and {n['one_ms']:.1f} ms on one, so this run timed and measured "
                "everything on one thread (its speed-ups are one thread's; run again on an idle machine to "
                f"measure {int(n['threads'])} threads)")
    if d.kind == "small_inputs":
        lead = f"the example inputs hold {int(n['tokens'])} token positions, too few to judge accuracy"
        if n.get("held_out"):
            return lead + f": the proxy scored {int(n['held_out'])} tokens of held-out text in the model's tokenizer"
        return (lead + ": the proxy judged on them (no tokenizer known; pass tokenizer= or eval_inputs= for "
                "held-out text)")
    return d.reason


@dataclass
class UniformRow:
    """A warm-start uniform plan (one candidate wherever it applies), as the search scored it."""

    candidate: str
    trial: int
    predicted_ms: float
    drop: float
    tier: int
    feasible: bool
    groups: int  # search parameters that took the candidate


@dataclass
class MeasuredPlan:
    """A plan measured end to end while choosing (the re-rank)."""

    trial: int
    predicted_ms: float
    measured_ms: float
    chosen: bool


@dataclass
class WeightBytes:
    before: int
    after: int


@dataclass
class RunSummary:
    device: str
    budget: str
    seconds: float  # the whole run, wall time
    trials: int  # completed trials in the study
    stopped: str  # why the trials stopped
    baseline_ms: Latency  # the unchanged model, measured right before the plan
    baseline_ms_at_start: float | None
    plan_ms: Latency
    speedup: Latency  # predicted and measured speed-ups (not ms: same two fields)
    accuracy: AccuracyResult | None  # the shipped plan's; None: the model is unchanged
    max_accuracy_drop: float
    decisions: list[Decision]
    storage: str
    study_name: str
    seed: int
    command: str | None
    weight_bytes: WeightBytes
    uniform: list[UniformRow]
    measured_plans: list[MeasuredPlan]
    plan: dict[str, str]  # FQN -> candidate of every changed layer
    kernels: dict[str, str]  # FQN -> the kernel timing chose, where the candidate has several
    fusions: list[list[str]]
    stage_seconds: dict[str, float]  # wall seconds per stage, in order
    timing_seconds: dict[str, float]  # the timing stage by candidate (and kernel), largest first
    # lowest and highest per-round measured speed-up over `rounds` interleaved (bf16, plan) rounds;
    # [1, 1] and 0 rounds for an unchanged model (nothing to compare)
    speedup_range: list[float] = field(default_factory=lambda: [1.0, 1.0])
    rounds: int = 0
    # what the shipped plan was shown to be at least: on the CPU the 95% lower confidence bound of
    # the rounds' paired speed-up, on CUDA the one round's lowest ratio; 1.0 for an unchanged model
    speedup_bound: float = 1.0
    # wall seconds the calibrated algorithms spent fitting (GPTQ, AWQ, ...), within the stages above
    algorithm_seconds: dict[str, float] = field(default_factory=dict)
    version: int = RUN_FILES_VERSION

    @property
    def notes(self) -> list[str]:
        """The decisions as sentences."""
        return [describe(d) for d in self.decisions]


##### reading and writing #######################################################################

def to_dict(record: Any) -> dict[str, Any]:
    """A record as plain JSON data (dataclasses.asdict)."""
    return dataclasses.asdict(record)


def write(path: Path, record: Any) -> None:
    """Write `record` as JSON, atomically."""
    text = json.dumps(to_dict(record), indent=1, default=str, allow_nan=True)
    atomic_write(path, lambda f: f.write(text.encode()))


def load_context(path: Path) -> RunContext:
    return from_dict(RunContext, _upgrade_context(_read(path)), path)


def load_summary(path: Path) -> RunSummary:
    return from_dict(RunSummary, _upgrade_summary(_read(path)), path)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunFileError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path} is not an autoao run file (a JSON object was expected)")
    version = data.get("version", 0)
    if not isinstance(version, int) or version > RUN_FILES_VERSION:
        raise RunFileError(f"{path} was written by a newer autoao (run-files version {version}; this autoao reads "
                           f"up to {RUN_FILES_VERSION}): upgrade autoao, or re-run the search with this one")
    return data


def _upgrade_context(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("version", 0) == 0:  # untyped context.json of autoao 0.1.0
        d = dict(d, version=RUN_FILES_VERSION)
        model = dict(d["model"])
        model["class_name"] = model.pop("class", "")
        d["model"] = model
        acc = dict(d["accuracy"])
        base = acc.pop("baseline", {}) or {}
        acc["baseline_tier1"], tier2 = base.get("tier1") or {}, base.get("tier2")
        if isinstance(acc.get("tasks"), str):  # accuracy="a,b" was written as given
            acc["tasks"] = [t.strip() for t in acc["tasks"].split(",") if t.strip()]
        if isinstance(tier2, dict):  # lm-eval: {"accuracy", "metrics": {task: {metric: value}}}
            acc["baseline_tier2"] = tier2.get("accuracy")
            acc["baseline_tier2_metrics"] = {f"{t}/{k}": v for t, m in (tier2.get("metrics") or {}).items()
                                             for k, v in m.items() if not k.endswith("_stderr")}
        else:
            acc["baseline_tier2"] = tier2
        d["accuracy"] = acc
        d["groups"] = [{"name": n, "fqns": f, "choices": c} for n, f, c in d["groups"]]
        d.setdefault("fused", [])  # sibling fusion came later in 0.1.0
        d["layers"] = [{"kernels": {}, "tied": [], **lay} for lay in d["layers"]]
    return d


def _upgrade_summary(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("version", 0) == 0:  # untyped summary.json of autoao 0.1.0: notes were prose
        d = dict(d, version=RUN_FILES_VERSION)
        base = dict(d["baseline_ms"])
        d["baseline_ms_at_start"] = base.pop("measured_at_start", None)
        d["baseline_ms"] = base
        d["decisions"] = [{"kind": "note", "reason": n} for n in d.pop("notes", [])]
        d.pop("baseline_accuracy", None)  # also in context.json
        d.setdefault("stage_seconds", {})
        d.setdefault("timing_seconds", {})
        d.setdefault("fusions", [])
        d.setdefault("kernels", {})
        d.setdefault("measured_plans", [])
        d.setdefault("uniform", [])
    return d


T = TypeVar("T")


def from_dict(cls: type[T], data: Any, path: Path | str = "run file") -> T:
    """Build `cls` (a dataclass) from JSON data, nested records and int dict keys included;
    RunFileError naming the file and the field when something is missing or of the wrong kind."""
    try:
        return _build(cls, data, cls.__name__)
    except (KeyError, TypeError, ValueError) as e:
        raise RunFileError(f"{path} does not match this autoao's {cls.__name__}: {e}; re-run the search "
                           "to write it anew") from None


def _build(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _build(option, value, where)
            except (KeyError, TypeError, ValueError) as e:
                errors.append(str(e))
        raise TypeError(f"{where}: {errors[0]}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{where} should be an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _build(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise KeyError(f"{where}.{f.name} is missing")
        return tp(**kwargs)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise TypeError(f"{where} should be a list, got {type(value).__name__}")
        return [_build(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        if not isinstance(value, dict):
            raise TypeError(f"{where} should be an object, got {type(value).__name__}")
        return {_build(key_t, k if key_t is not int else int(k), where): _build(val_t, v, f"{where}[{k!r}]")
                for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str) and value in ("inf", "-inf", "nan", "Infinity", "-Infinity", "NaN"):
            return float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"{where} should be a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(f"{where} should be an integer, got {value!r}")
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise TypeError(f"{where} should be {tp.__name__}, got {value!r}")
        return value
    if tp is type(None):
        if value is not None:
            raise TypeError(f"{where} should be null, got {value!r}")
        return None
    raise TypeError(f"{where}: unsupported field type {tp!r}")


##### shared between the search and the report ##################################################

P = TypeVar("P")


def pareto_front(trials: list[P], latency: Callable[[P], float] = lambda r: r.predicted_us) -> list[P]:  # type: ignore[attr-defined]
    """Non-dominated trials on (latency, drop), fastest first; duplicates of a plan once.

    Works on anything with `.drop` and `.params` (the search's TrialResult; the report's trial
    records, with `latency` reading their milliseconds), so the report's front is the search's."""
    front: list[P] = []
    seen: set[tuple] = set()
    for r in sorted(trials, key=lambda r: (latency(r), r.drop)):  # type: ignore[attr-defined]
        key = tuple(sorted(r.params.items()))  # type: ignore[attr-defined]
        if key in seen:
            continue
        if not any(f.drop <= r.drop and latency(f) <= latency(r) for f in front):  # type: ignore[attr-defined]
            front.append(r)
            seen.add(key)
    return front
