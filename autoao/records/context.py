"""context.json: everything known before the first trial (so an interrupted run can still be
reported): model, device, versions, candidates, per-layer timings and layer errors. A leaf module
of autoao.records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoao.records.codec import from_dict, read_json
from autoao.types import Pricing, pricing_of
from autoao.upgrades import RUN_FILES_VERSION, upgrade_context


@dataclass
class Latency:
    """One latency, predicted by the cost model and/or measured end to end (ms; None: not known)."""

    predicted: float | None = None
    measured: float | None = None



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
    # how the costs were estimated where the target runs layers outside autoao (Target.pricing's
    # FromBytes reason; empty: timed): a sentence in the JSON, as every version wrote it; `pricing` types it
    estimate: str = ""
    version: int = RUN_FILES_VERSION

    @property
    def pricing(self) -> Pricing:
        """How the run's layer costs were known: Timed(), or FromBytes(the `estimate` sentence)."""
        return pricing_of(self.estimate)


def load_context(path: Path) -> RunContext:
    return from_dict(RunContext, upgrade_context(read_json(path)), path)
