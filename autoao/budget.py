"""The two budgets a run keeps, each with one owner.

    AccuracyBudget   the accuracy drop the user allows: created once, it judges evidence into
                     verdicts and decides which trials are feasible; the search, the workers, the
                     chooser and the report read what it decided
    TimePlan         the time budget: built once after the baselines from what they cost, it hands
                     each stage its deadline from one table of shares and re-plans at every stage
                     boundary from the rates measured since, so a machine that slows down shrinks
                     the later stages instead of overrunning them

Both read one clock, the run's ledger (autoao.ledger: time.perf_counter since the run began).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from autoao.clock import cpu_ran_lost_ns
from autoao.ledger import RunLedger
from autoao.types import Accuracy, Evidence, Verdict, judge

##### accuracy ##################################################################################

# Where tier 2 decides (lm-eval tasks, the user's metric), the label-free tier-1 judges (the proxy,
# greedy generation) only screen: a plan is feasible in the search, and passes the generation
# check, up to this x the budget or x the proxy's own noise, whichever is larger. Top-1 agreement
# moves more than a task's accuracy: SmolLM2 with int8_wo everywhere lost 1.6 to 4.1 points of
# agreement below its float32 floor while autoao_facts rose 1.1 points
# (docs/python-api.md#what-max_accuracy_drop-measures).
TIER1_SCREEN = 5.0


@dataclass(frozen=True)
class AccuracyBudget:
    """The largest accuracy drop a shipped plan may have, on the tier that decides, and the screen
    the label-free judges apply where a task or metric decides."""

    max_drop: float  # absolute, in the deciding metric's units (0.01 = 1 point)
    tier: int  # 1: the proxy decides; 2: the user's tasks or metric decide
    screen: float  # the tier-1 drop up to which a trial is feasible (max_drop where tier 1 decides)
    unit: str = ""  # the deciding metric, in words

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_drop <= 1.0:
            raise ValueError(f"max_accuracy_drop must be in [0, 1] (0.01 = 1 point), got {self.max_drop}")

    @classmethod
    def create(cls, max_drop: float, *, tier2: bool, proxy_noise: float = 0.0, unit: str = "") -> AccuracyBudget:
        """`proxy_noise`: 1 - the agreement the unmodified model reaches with its float32 twin: no
        screen is finer than the proxy resolves."""
        screen = min(1.0, TIER1_SCREEN * max(max_drop, proxy_noise)) if tier2 else max_drop
        return cls(max_drop, 2 if tier2 else 1, screen, unit)

    def limit(self, tier: int) -> float:
        """The drop a judge of `tier` may find: the budget on the deciding tier, the screen below it."""
        return self.max_drop if tier >= self.tier else self.screen

    def feasible(self, acc: Accuracy) -> bool:
        """A trial's feasibility in the search: its tier-1 drop within the screen (a point estimate:
        the search ranks; the chooser's verdicts decide what ships)."""
        return math.isfinite(acc.drop) and acc.drop <= self.limit(acc.tier)

    def judge(self, evidence: Evidence, looks: int = 1) -> Verdict:
        """The verdict of `evidence` against this budget (autoao.types.judge)."""
        return judge(evidence, self.limit(evidence.tier), looks)


##### time ######################################################################################

# Of the time a budget leaves once the baselines are measured and the first verification's price is
# set aside (autoao.stages.anytime: its judges' checks and its measurement), each stage's share before
# that verification: timing every candidate (coarse first), the layer errors, and the search's
# first trials (the warm start's seeds, the plans a first verification picks from). A stage that
# ends early leaves its time to the later ones; everything after the first verification is the
# anytime run's, asked of `allows` step by step.
SHARES = {"kernel timing": 0.55, "layer errors": 0.15, "search trials": 0.30}
STAGES = ("profile and baselines", *SHARES, "verifying plans", "final measurement")
WRITE_SECONDS = 5.0  # saving the model and rendering the report
MAX_CHECKS = 4  # without a time budget (a trial budget): plans verified at most
MIN_FLEXIBLE_S = 30.0  # below this for timing, layer errors and trials, a budget is said to be too short
SLICE_SHARE, MIN_SLICE_S = 0.25, 10.0  # a search slice between verifications: this share of what is free
MIN_TRIAL_S = 2.0  # no slice shorter: it would end before its first trial
CHECK_LOOKS = 2  # the first verification's check is reserved this many looks of every judge


@dataclass(frozen=True)
class Costs:
    """What the run's repeated steps cost, measured on the unchanged model before the plan."""

    proxy_s: float  # scoring one trial: a proxy pass over the screen inputs
    check_s: float  # judging one plan to a verdict, at worst (all the evidence the judges can take)
    measure_s: float  # a verification's end-to-end measurement: both sides, the fewest rounds, any compiles
    run_s: float = 0.0  # one end-to-end run of the workload
    once_s: float = 0.0  # judging's one-off part: the unmodified model's side of the first check
    write_s: float = WRITE_SECONDS
    first_s: float = 0.0  # every judge's first look (0: unknown; then a check is priced at worst)


def _contention(ran_ns: int, lost_ns: int) -> float | None:
    """(ran + lost) / ran, at most 10: how much slower CPU-bound work ran for waiting on other
    processes; None where nothing ran."""
    return min((ran_ns + lost_ns) / ran_ns, 10.0) if ran_ns > 0 else None


class TimePlan:
    """Deadlines for the stages of a run with a time budget (a trial budget has none: every
    deadline is None). Built once after the baselines; `observe` feeds it what repeated steps
    really took, and every later deadline and the reserve scale by that slowdown."""

    def __init__(self, ledger: RunLedger, costs: Costs, skip: tuple[str, ...] = ()) -> None:
        self.ledger, self.costs = ledger, costs
        self.shares = {s: v for s, v in SHARES.items() if s not in skip}
        self.planned: dict[str, float] = {}
        self._ratios: list[float] = []
        # CPU contention while the costs were measured (the process so far): they already carry it
        self._at_costs = _contention(*cpu_ran_lost_ns()) or 1.0
        self._machine: tuple[float, int, int] | None = None  # (clock, ran, lost) at the last observe_machine

    @property
    def slowdown(self) -> float:
        """How much slower repeated steps run now than when the baselines measured them (the median
        of the last three observations; 1 before any)."""
        return max(1.0, statistics.median(self._ratios[-3:])) if self._ratios else 1.0

    def observe(self, planned_s: float, took_s: float) -> None:
        """A repeated step priced at `planned_s` took `took_s`."""
        if planned_s > 0 and took_s > 0:
            self._ratios.append(took_s / planned_s)

    def observe_machine(self) -> None:
        """How much slower CPU-bound work runs since the last call than while the costs were
        measured, from the time this process's threads waited for a CPU another process had
        (clock.cpu_ran_lost_ns): a load that was there when the costs were measured is in them
        already. Plan-independent, so the search's trials (each plan runs at its own speed) can
        say the machine slowed down."""
        now, (ran, lost) = self.ledger.clock(), cpu_ran_lost_ns()
        if self._machine is not None and now - self._machine[0] > 0.5:  # long enough for the scheduler's slices to average out
            factor = _contention(ran - self._machine[1], lost - self._machine[2])
            if factor is not None:
                self._ratios.append(factor / self._at_costs)
        if self._machine is None or now - self._machine[0] > 0.5:
            self._machine = (now, ran, lost)

    def final_reserve(self) -> float:
        """Seconds kept for the end: saving the model and writing the report."""
        return self.costs.write_s

    def reserve(self) -> float:
        """Seconds kept, before the first verification, for it: a check of CHECK_LOOKS looks of every
        judge (at worst, a check to its verdict where a look's price is unknown; never more) and its
        measurement, then the end. Not the check at worst: that priced the first check at ten times
        what it took and left a 60 s budget no time to try one; a check that needs more looks asks
        for each while the time lasts."""
        c = self.costs
        check = min(CHECK_LOOKS * c.first_s, c.check_s + c.once_s) if c.first_s > 0 else c.check_s + c.once_s
        return self.slowdown * (check + c.measure_s) + self.final_reserve()

    def deadline(self, stage: str) -> float | None:
        """The ledger.clock() by which `stage` (one of SHARES) ends: its share of what the budget
        leaves after the reserve, among itself and the stages after it (None: no time budget, or the
        stage is skipped). Records what it planned."""
        seconds = self._seconds(stage)
        if seconds is None:
            return None
        self.planned[stage] = seconds
        return self.ledger.clock() + seconds

    def past(self, stage: str) -> bool:
        """Whether `stage` has used its time, re-planned now (at today's slowdown)."""
        seconds = self._seconds(stage)
        return seconds is not None and seconds <= 0.0

    def _seconds(self, stage: str) -> float | None:
        """Seconds `stage` may take now; None without a time budget or for a skipped stage."""
        remaining = self.ledger.remaining()
        if remaining is None or stage not in self.shares:
            return None
        later = list(self.shares)[list(self.shares).index(stage):]
        return max(remaining - self.reserve(), 0.0) * self.shares[stage] / sum(self.shares[s] for s in later)

    def allows(self, seconds: float) -> bool:
        """Whether a step of `seconds` (priced at today's rates: scaled by the slowdown) still leaves
        the end its reserve."""
        remaining = self.ledger.remaining()
        return remaining is None or remaining - self.slowdown * seconds >= self.final_reserve()

    def slice_seconds(self, keep: float) -> float | None:
        """Seconds for the next search slice, keeping `keep` (a verification's price) and the end's
        reserve: SLICE_SHARE of what is free, at least MIN_SLICE_S where that fits, else what is
        free; 0 when not even MIN_TRIAL_S is; None without a time budget (the search runs its trial
        budget)."""
        remaining = self.ledger.remaining()
        if remaining is None:
            return None
        free = remaining - self.slowdown * keep - self.final_reserve()
        if free < MIN_TRIAL_S:
            return 0.0
        return max(SLICE_SHARE * free, min(MIN_SLICE_S, free))

    def shortfall(self) -> tuple[float, float, float] | None:
        """When the budget leaves the flexible stages less than MIN_FLEXIBLE_S after what was spent
        (the first stage, which measured the model as it came) and the reserve: (the seconds spent,
        the reserve's, a budget that would leave them 4 x MIN_FLEXIBLE_S); else None."""
        remaining = self.ledger.remaining()
        if remaining is None or remaining - self.reserve() >= MIN_FLEXIBLE_S:
            return None
        spent, reserve = self.ledger.elapsed(), self.reserve()
        # a reserve never priced (the judges were not built: no time) is guessed at what was spent
        reserve = reserve if math.isfinite(reserve) else spent
        return spent, reserve, spent + reserve + 4 * MIN_FLEXIBLE_S
