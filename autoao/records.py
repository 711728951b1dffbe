"""What a run writes and the report reads: typed, versioned records. A leaf module (it imports only
autoao.common, autoao.types and autoao.decisions), so the writer (the stages) and the reader
(autoao.reports) share these classes and no one indexes raw JSON by string.

    context.json   RunContext: everything known before the first trial (so an interrupted run can
                   still be reported): model, device, versions, candidates, per-layer timings/SQNR
    summary.json   RunSummary: only when the run finished: measured latencies, the shipped plan's
                   verdicts, the plan, where the time went (planned and spent per stage), and the
                   decisions that led to the plan
    pareto.json    ParetoRow per plan of the front
    anytime.json   AnytimeState: the incumbent (the best plan verified so far, with its verdicts and
                   its measured rounds), the anytime curve and the plans already judged, rewritten
                   after each verification: what the same command continues from
    the study      one TrialRecord per trial, written by the search's objective (`TrialRecord.attrs`)
                   and read back by the search, the workers and the report (`TrialRecord.read`)

Files carry `version` (RUN_FILES_VERSION). `load_context` / `load_summary` read a file written by
this or an earlier autoao (upgraded in memory: autoao.upgrades); a newer or
unreadable file raises RunFileError naming the file and what to do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, TypeVar

from autoao.common import atomic_write
from autoao.decisions import Decision, decision_fields, decision_type
from autoao.types import Accuracy, Verdict
from autoao.upgrades import RUN_FILES_VERSION, upgrade_context, upgrade_summary



class RunFileError(ValueError):
    """A run file that cannot be read: missing, corrupt, or written by a newer autoao."""


##### shared pieces #############################################################################

@dataclass
class Latency:
    """One latency, predicted by the cost model and/or measured end to end (ms; None: not known)."""

    predicted: float | None = None
    measured: float | None = None


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
    held_out: str = ""  # the inputs the label-free judges score (HeldOut.describe)
    unit: str = ""  # the deciding metric, in words


@dataclass
class KernelTimes:
    """A candidate with several kernels on one layer: the one timing chose, and each one's time."""

    chosen: str | None
    us: dict[str, float]  # kernel -> time over the layer's calls (inf: failed)
    words: str = ""  # the chosen kernel or route in words ("int8pack up to 16 rows, dequant above")


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
    baseline_ms: Latency  # the unchanged model: the cost model's prediction (measured: in the summary)
    rest_ms: float  # what is not a linear layer, measured (the cost model's constant)
    candidates: list[CandidateRecord]
    groups: list[GroupRecord]
    fused: list[FusedRecord]
    layers: list[LayerRecord]
    timing: TimingHealth = field(default_factory=TimingHealth)
    # layers whose weights sit on a 4-bit grid of groups of 32 (a GGUF Q4 source): int4 g32 is near lossless on them
    int4_grid_layers: int = 0
    # where tier 2 decides: the tier-1 drop up to which trials count as feasible (SearchConfig)
    screen_drop: float | None = None
    # uniform plans measured end to end that scaled their candidates' cells (CPU; empty: none)
    anchors: list[AnchorRecord] = field(default_factory=list)
    target: str = "autoao"  # the serving target the search space was made for
    # how the costs were estimated where the target runs layers outside autoao (Target.estimate; empty: timed)
    estimate: str = ""
    version: int = RUN_FILES_VERSION


##### anytime.json ##############################################################################

@dataclass
class CurvePoint:
    """A better plan verified: the anytime curve's step (the first point is the model as it came)."""

    seconds: float  # since the run began (the command's start, for the command line)
    speedup: float  # measured end to end against the model as it came: the paired estimate
    bound: float  # its 95% lower bound
    plan: str  # the plan in words ("int8_wo x211"), "the model as it came"
    trial: int | None = None  # the study's trial (None: the model as it came)
    source: str = ""  # what proposed it: "uniform", "fallback", "search", "resumed"


@dataclass
class IncumbentRecord:
    """The best plan verified so far: its search params, verdicts and the rounds that measured it."""

    params: dict[str, str]  # group name -> candidate name
    trial: int | None
    accuracy: Accuracy | None  # the deciding judge's, with its verdict
    verdicts: list[Verdict]
    base_rounds: list[list[float]]  # per round: the model as it came, (median, p20, p80) us
    plan_rounds: list[list[float]]  # per round: the plan
    found_s: float  # when it was verified, seconds since the run began
    source: str = ""
    workload: WorkloadTiming | None = None  # the user's workload, where given


@dataclass
class AnytimeState:
    """What a run verified (anytime.json), for the same command to continue from."""

    study_name: str  # the study it belongs to: another search space, model or budget starts afresh
    incumbent: IncumbentRecord | None  # None: the model as it came
    curve: list[CurvePoint]
    tried: dict[str, str]  # plan key -> why it is not judged again ("breaks", "not faster", ...)
    version: int = RUN_FILES_VERSION


##### summary.json ##############################################################################

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


@dataclass(frozen=True)
class DeployRow:
    """One candidate of a plan, as its serving engine runs it."""

    candidate: str  # the plan's candidate name, "bf16" for layers left as they came
    layers: int  # how many layers have it
    example: str  # one of them, e.g. "model.layers.0.mlp.up_proj"
    runs: str  # what the engine runs for it (autoao.export.targets.Target.describe)


@dataclass(frozen=True)
class Deploy:
    """The target a plan was made for, what each layer becomes there, and how to export it."""

    target: str  # the target name, e.g. "vllm"
    engine: str  # e.g. "vLLM"
    format: str | None  # the export format; None: autoao's own save (no export needed)
    command: str | None  # the export command, None for the autoao target
    problems: tuple[str, ...]  # what the engine would refuse; empty: loads as planned
    rows: tuple[DeployRow, ...]


@dataclass
class StageTime:
    """One stage of the run: the seconds the time plan gave it and the seconds it took."""

    name: str
    spent_s: float
    planned_s: float | None = None  # None: measured before the plan existed, or no time budget


@dataclass
class WorkloadTiming:
    """optimize's `workload` timed as the model came and with the plan, call by call in alternation."""

    baseline_ms: float  # median call
    plan_ms: float
    speedup: float  # the rounds' paired estimate
    bound: float  # its 95% lower bound
    low: float  # lowest and highest per-round ratio
    high: float
    rounds: int


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
    accuracy: Accuracy | None  # the shipped plan's, on the tier that decides; None: the model is unchanged
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
    # lowest and highest per-round speed-up over `rounds` interleaved rounds ([1, 1], 0: an unchanged model)
    speedup_range: list[float] = field(default_factory=lambda: [1.0, 1.0])
    rounds: int = 0
    # what the plan was shown to be at least: the rounds' paired speed-up's 95% lower bound (1.0: unchanged)
    speedup_bound: float = 1.0
    # wall seconds the calibrated algorithms spent fitting (GPTQ, AWQ, ...), within the stages above
    algorithm_seconds: dict[str, float] = field(default_factory=dict)
    # every judge's verdict on the shipped plan (empty: the model is unchanged)
    verdicts: list[Verdict] = field(default_factory=list)
    stages: list[StageTime] = field(default_factory=list)  # planned and spent per stage
    trial: int | None = None  # the trial whose plan shipped (None: the model is unchanged)
    deploy: Deploy | None = None  # where the plan runs: its target, what each layer becomes, the export command
    workload: WorkloadTiming | None = None  # the user's workload, where one was given and the plan was measured
    curve: list[CurvePoint] = field(default_factory=list)  # each better plan verified, and when
    interrupted: str = ""  # the signal that ended the run early ("SIGINT", "SIGTERM"; "": it ran to its end)
    version: int = RUN_FILES_VERSION

    @property
    def notes(self) -> list[str]:
        """The decisions as sentences."""
        return [d.describe() for d in self.decisions]

    @property
    def verdict(self) -> Verdict | None:
        """The verdict the plan shipped on: the deciding tier's (None: the model is unchanged)."""
        deciding = [v for v in self.verdicts if self.accuracy is None or v.tier == self.accuracy.tier]
        return deciding[0] if deciding else None


@dataclass
class ParetoRow:
    """A plan of the search's Pareto front (pareto.json)."""

    trial: int
    predicted_ms: float
    drop: float
    accuracy: float
    tier: int
    feasible: bool
    plan: dict[str, int]  # candidate -> layers


##### trial records ############################################################################

@dataclass(frozen=True)
class TrialRecord:
    """One trial of the study, as the search wrote it: its plan, predicted latency, the proxy's
    accuracy with the screen verdict, and whether it was feasible (decided once, when it ran)."""

    ATTR: ClassVar[str] = "autoao.trial"  # the user attribute that holds it

    number: int
    state: str  # COMPLETE / FAIL / RUNNING / WAITING / PRUNED
    params: dict[str, str]  # group name -> candidate name
    predicted_us: float  # inf unless COMPLETE
    accuracy: Accuracy | None  # tier 1, with its screen verdict; None unless COMPLETE
    feasible: bool
    elapsed_s: float = math.nan  # seconds since its process's search started, when it ended
    duration_s: float | None = None
    error: str = ""
    worker: str = ""  # the process that ran it, when several share the study
    warm_start: bool = False  # enqueued by the warm start, not sampled

    @property
    def drop(self) -> float:
        return self.accuracy.drop if self.accuracy is not None else math.inf

    @property
    def tier(self) -> int:
        return self.accuracy.tier if self.accuracy is not None else 1

    @property
    def predicted_ms(self) -> float:
        return self.predicted_us / 1e3

    @staticmethod
    def attrs(accuracy: Accuracy, feasible: bool, elapsed_s: float) -> dict[str, Any]:
        """What the objective stores under ATTR (JSON data)."""
        return {"accuracy": to_dict(accuracy), "feasible": feasible, "elapsed_s": elapsed_s}

    @classmethod
    def read(cls, t: Any) -> TrialRecord:
        """The record of an Optuna FrozenTrial (any object with its fields); trials of an earlier
        autoao, which stored loose attributes, read too."""
        done = t.state.name == "COMPLETE" and t.values is not None
        stored = t.user_attrs.get(cls.ATTR)
        if stored is not None:
            acc = from_dict(Accuracy, stored["accuracy"]) if done else None
            feasible, elapsed = done and bool(stored["feasible"]), stored.get("elapsed_s", math.nan)
        else:  # loose attributes: accuracy, tier, metrics, constraint, elapsed
            value = t.user_attrs.get("accuracy")
            acc = Accuracy(int(t.user_attrs.get("tier", 1)), value if value is not None else -math.inf,
                           t.values[1] if t.values[1] < 1e9 else math.inf,
                           dict(t.user_attrs.get("metrics") or {})) if done else None
            feasible, elapsed = done and t.user_attrs.get("constraint", math.inf) <= 0, t.user_attrs.get("elapsed", math.nan)
        duration = ((t.datetime_complete - t.datetime_start).total_seconds()
                    if t.datetime_start and t.datetime_complete else None)
        return cls(t.number, t.state.name, dict(t.params), t.values[0] if done else math.inf, acc, feasible,
                   elapsed, duration, "" if done else str(t.system_attrs.get("fail_reason", "")),
                   str(t.user_attrs.get("worker", "")), t.user_attrs.get("seed") == "warm start")


##### reading and writing #######################################################################

def to_dict(record: Any) -> Any:
    """A record as plain JSON data: dataclasses as objects (decisions with their kind), tuples as lists."""
    if isinstance(record, Decision):
        return {k: to_dict(v) for k, v in decision_fields(record).items()}
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    if isinstance(record, dict):
        return {k: to_dict(v) for k, v in record.items()}
    return record


def write(path: Path, record: Any) -> None:
    """Write `record` as JSON, atomically."""
    text = json.dumps(to_dict(record), indent=1, default=str, allow_nan=True)
    atomic_write(path, lambda f: f.write(text.encode()))


def load_context(path: Path) -> RunContext:
    return from_dict(RunContext, upgrade_context(_read(path)), path)


def load_summary(path: Path) -> RunSummary:
    return from_dict(RunSummary, upgrade_summary(_read(path)), path)


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
    if tp is Decision:
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
            raise TypeError(f"{where} should be a decision object with a kind")
        return _build(decision_type(value["kind"]), {k: v for k, v in value.items() if k != "kind"}, where)
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
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, list):
            raise TypeError(f"{where} should be a list, got {type(value).__name__}")
        return tuple(_build(item, v, f"{where}[{i}]") for i, v in enumerate(value))
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
    return _scalar(tp, value, where)


def _scalar(tp: Any, value: Any, where: str) -> Any:
    """A JSON scalar as `tp` (float, int, str, bool, None or Any); TypeError naming `where` otherwise."""
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
