"""Stage 3: the model under test. `ModelBench` switches the model between plans by swapping modules,
scores a plan on the judges and measures it end to end; `interleaved` measures two versions of the
model in alternation, round by round, so both see the same machine.

    bench = ModelBench(model, work.prof, work.examples, compile=base.compile, groups=groups,
                       cost=meas.cost, table=meas.table)
    bench.set(plan); judges.screen(model, plan)       # a trial (the search's modules, unfused)
    with bench.applied(bench.shipped(params)): ...    # the plan as it would ship, undone after
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import torch
from torch import nn

from autoao.calibration import Calibration
from autoao.clock import L2_FLUSH_BYTES
from autoao.common import BASELINE, call_model
from autoao.cost import CostModel, fused_shape
from autoao.evaluators.timing import LatencyTable
from autoao.kernels._base import canonical_on_device
from autoao.plan import Plan, apply, set_module
from autoao.profile import ModelProfile
from autoao.stages.measure import captured, forward_timing, run_seconds
from autoao.stages.search import Group, plan_from_params
from autoao.types import Accuracy, Pricing, Timed

Sample = tuple[float, float, float]  # one side's (median, p20, p80) us of the workload in a round


class ModelBench:
    """The model, with every (layer, candidate) trial module built once (trials revisit the same
    choices; rebuilding would dominate a CPU search). `restore()` puts the original modules back."""

    def __init__(self, model: nn.Module, prof: ModelProfile, examples: list[Any], *, compile: bool,
                 groups: list[Group], cost: CostModel, table: LatencyTable | None = None, pricing: Pricing = Timed(),
                 workload: Callable[[nn.Module], Any] | None = None,
                 base_replays: tuple[Callable[[], None], ...] = ()) -> None:
        """table: the timed kernels a shipped plan records (None: this bench only scores trials);
        pricing: Timed(), or FromBytes(why) where the cost model is an estimate that end-to-end times
        here cannot check (the target runs its layers elsewhere: Target.pricing); workload: what the user runs
        (model -> anything), timed by the final comparison next to the examples' forward pass;
        base_replays: the unchanged model's workload captured (Baselines.replays), replayed as the
        baseline side of every compiled measurement instead of compiling it again."""
        self.model, self.prof, self.examples, self.compile, self.pricing = model, prof, examples, compile, pricing
        self.workload, self.base_replays = workload, base_replays
        self.groups, self.cost, self.table = groups, cost, table
        self.original = {lay.fqn: model.get_submodule(lay.fqn) for lay in prof.layers}
        self.calibration: Calibration = prof.calibration
        self.bank: dict[tuple[str, str], nn.Module] = {}
        self.current: dict[str, str] = {}

    def set(self, plan: Plan) -> None:
        """Swap in the plan's trial modules (unfused, default kernels: as the search scores them)."""
        for fqn, orig in self.original.items():
            cand = plan.layers.get(fqn)
            name = cand.name if cand is not None else BASELINE
            if self.current.get(fqn, BASELINE) == name:
                continue
            if cand is None:
                module = orig
            else:
                if (fqn, name) not in self.bank:
                    with torch.no_grad(), canonical_on_device():  # trial modules are never saved
                        self.bank[(fqn, name)] = cand.build(orig, self.calibration[fqn], fqn=fqn)
                module = self.bank[(fqn, name)]
            set_module(self.model, fqn, module)
            self.current[fqn] = name

    def restore(self) -> None:
        """The original modules back in every profiled layer, whatever put others there."""
        for fqn, orig in self.original.items():
            set_module(self.model, fqn, orig)
        self.current = {}

    def install(self, modules: dict[str, nn.Module]) -> None:
        """The original modules, then `modules` (FQN -> module, e.g. an applied plan's) in place."""
        self.restore()
        for fqn, module in modules.items():
            set_module(self.model, fqn, module)

    def scorer(self, score: Callable[[nn.Module, Plan], Accuracy]) -> Callable[[Plan], Accuracy]:
        """`plan -> score(model, plan)` with the plan's trial modules in place; a plan that fails
        to apply scores -inf (that trial fails, not the search)."""
        def run(plan: Plan) -> Accuracy:
            try:
                self.set(plan)
            except Exception as e:  # noqa: BLE001 - a candidate failing on a layer fails this trial only
                return Accuracy(1, -math.inf, math.inf, {}, f"plan failed to apply: {type(e).__name__}: {e}")
            return score(self.model, plan)
        return run

    def shipped(self, params: dict[str, str], **metadata: Any) -> Plan:
        """The plan these search params make, as it ships: fused groups, the timed kernel per layer."""
        searched = plan_from_params(self.groups, params, self.cost.fusion_pays)
        kernels = kernels_for(searched, self.prof, self.table) if self.table is not None else {}
        return Plan.for_model(self.model, searched.layers, kernels, searched.fusions, **metadata)

    @contextlib.contextmanager
    def applied(self, plan: Plan) -> Iterator[nn.Module]:
        """The model with `plan` applied afresh as it ships (measured or scored, then undone: no
        host copy of its weights is kept); the original modules are back afterwards, also on error."""
        self.restore()
        try:
            with canonical_on_device():
                apply(self.model, plan, calibration=self.calibration)
            yield self.model
        finally:
            self.restore()

    def modules(self, plan: Plan) -> dict[str, nn.Module]:
        """FQN -> the module in place for each of the plan's layers (after `applied` or `apply`)."""
        return {fqn: self.model.get_submodule(fqn) for fqn in plan.layers}


def kernels_for(plan: Plan, prof: ModelProfile, table: LatencyTable) -> dict[str, str]:
    """FQN -> the kernel timing chose for the layer's candidate and shape (where it had a choice);
    the members of a fusion get the one chosen for the fused shape."""
    shapes = {lay.fqn: (lay.in_features, lay.out_features) for lay in prof.layers}
    for group in plan.fusions:
        shape = fused_shape(prof, group)
        shapes.update({f: shape for f in group})
    chosen = {fqn: table.kernel_for(c.name, *shapes[fqn]) for fqn, c in plan.layers.items() if fqn in shapes}
    return {fqn: kern for fqn, kern in chosen.items() if kern is not None}


def interleaved(bench: ModelBench, applied: dict[str, nn.Module], rounds: int,
                settled: Callable[[list[Sample], list[Sample]], bool] | None = None,
                ) -> tuple[list[Sample], list[Sample]]:
    """End-to-end (median, p20, p80) us of the unchanged model and of the model with `applied`
    modules, measured A, B, A, B, ...: both see the same machine state, round by round; at most
    `rounds` rounds, fewer once `settled(base, planned)` says the rounds so far decide. Leaves
    `applied` in place. Compiled (CUDA): `graph_rounds`."""
    if bench.compile:
        return graph_rounds(bench, applied, rounds)
    model, examples = bench.model, bench.examples
    # the plan's fresh modules warmed once (the unchanged model ran the examples already); then
    # every round takes one clean run of the workload per side, so A and B alternate run by run
    bench.install(applied)
    with torch.no_grad():
        for ex in examples:
            call_model(model, ex)
    # one sample a side, disturbed or not (max_seconds=0): a busy neighbour disturbs both sides of a
    # round alike
    return _alternate(bench, applied, rounds, settled,
                      lambda: forward_timing(model, examples, reps=1, warmup=0, max_seconds=0.0))


def _alternate(bench: ModelBench, applied: dict[str, nn.Module], rounds: int,
               settled: Callable[[list[Sample], list[Sample]], bool] | None, sample: Callable[[], Sample]
               ) -> tuple[list[Sample], list[Sample]]:
    """`sample()` with the unchanged modules, then with `applied`, round by round: at most `rounds`
    rounds, fewer once `settled(base, planned)` says they decide. Leaves `applied` in place."""
    base: list[Sample] = []
    planned: list[Sample] = []
    for _ in range(rounds):
        for modules, out in (({}, base), (applied, planned)):
            bench.install(modules)
            out.append(sample())
        if settled is not None and settled(base, planned):
            break
    return base, planned


def workload_rounds(bench: ModelBench, applied: dict[str, nn.Module], rounds: int,
                    settled: Callable[[list[Sample], list[Sample]], bool] | None = None,
                    ) -> tuple[list[Sample], list[Sample]]:
    """The user's workload (bench.workload) with the unchanged modules and with `applied`, called
    A, B, A, B, ... as the user calls it (their mode: eager, or compiled by their own code), after
    one warm-up call a side; each call one sample (us, as its median, p20 and p80). At most
    `rounds` rounds, fewer once `settled` says they decide. Leaves `applied` in place."""
    workload = bench.workload
    assert workload is not None, "workload_rounds needs the bench's workload"
    for modules in ({}, applied):  # first calls pay compiles and cache allocations: not timed
        bench.install(modules)
        run_seconds(bench.model, workload)

    def one_call() -> Sample:
        us = run_seconds(bench.model, workload) * 1e6
        return us, us, us

    return _alternate(bench, applied, rounds, settled, one_call)


GRAPH_ROUNDS = 20  # compiled: rounds of (unchanged, plan) workload replays


def graph_rounds(bench: ModelBench, applied: dict[str, nn.Module], rounds: int) -> tuple[list[Sample], list[Sample]]:
    """CUDA, as the model will run: the plan's side torch.compile'd once and its workload captured as
    CUDA graphs (one per distinct example shape), the unchanged model's likewise unless the bench
    holds its capture (base_replays), then max(rounds, GRAPH_ROUNDS) rounds each replaying the
    unchanged model's workload and the plan's in turn, timed with events after an L2 flush (a read
    of L2_FLUSH_BYTES, as per-layer timing does). Leaves `applied` in place."""
    sides = []
    for modules in ({}, applied):
        if not modules and bench.base_replays:
            sides.append(list(bench.base_replays))
            continue
        bench.install(modules)
        torch._dynamo.reset()
        sides.append(captured(torch.compile(bench.model), bench.examples))
    flush = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    times: list[list[float]] = [[], []]
    for _ in range(max(rounds, GRAPH_ROUNDS)):
        for side, replays in enumerate(sides):
            flush.sum()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for replay in replays:
                replay()
            end.record()
            torch.cuda.synchronize()
            times[side].append(start.elapsed_time(end) * 1e3)
    bench.install(applied)
    return [(t, t, t) for t in times[0]], [(t, t, t) for t in times[1]]
