"""summary.json and anytime.json: what a run measured and decided (written when it ends, or is
interrupted), and what it verified (the incumbent, the anytime curve, the plans tried: what the
same command continues from). A leaf module of autoao.records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoao.decisions import Decision
from autoao.records.codec import from_dict, read_json
from autoao.records.context import Latency
from autoao.types import Accuracy, Verdict
from autoao.upgrades import RUN_FILES_VERSION, upgrade_summary


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


def load_summary(path: Path) -> RunSummary:
    return from_dict(RunSummary, upgrade_summary(read_json(path)), path)
