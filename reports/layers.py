"""Per-layer explanations, said once per pattern: what each layer got, and why, from the recorded
timings (`LayerRecord.time_us`), tier-0 SQNRs and exclusions.

    layers = explain(context, plan, fusions, kernels, kept)   # one Layer per linear layer
    patterns = group(layers)                                  # layers whose decision and reasons match
    everywhere(layers)                                        # candidates excluded on every layer alike

A model has many layers of a few kinds (q/k/v/o, gate/up/down per block) that end with the same
decision for the same reasons, so the page states a reason once per pattern and keeps each layer's
own row to its numbers. The words of a reason carry no per-layer number (those are in the rows),
so equal reasons group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoao.common import BASELINE
from autoao.records import KernelTimes, LayerRecord, RunContext

ORDER = {"chosen": 0, "allowed": 1, "excluded": 2}


@dataclass(frozen=True)
class LayerOption:
    """One candidate on one layer: its cost, its error, and why it is or is not the plan's."""

    candidate: str
    status: str  # "chosen", "allowed" (the search could pick it) or "excluded"
    time_us: float | None  # predicted time of this layer over the whole workload; None: no timing
    emulated: bool  # no fast kernel here: the time is real but never a speed-up
    sqnr_db: float | None  # tier 0: output SQNR of the layer alone (higher is better; inf = exact)
    reason: str  # the same words on every layer where it holds (no per-layer numbers)
    kernel: str | None = None  # the kernel timing chose, where the candidate has several
    kernel_note: str = ""  # "triton; tinygemm 1.50x slower"


@dataclass(frozen=True)
class Layer:
    fqn: str
    group: str  # the search parameter this layer's choice belongs to (fused q/k/v share one)
    siblings: tuple[str, ...]  # the other layers of that parameter
    fused: bool  # the shipped plan runs its group as one kernel (RunSummary.fusions)
    in_features: int
    out_features: int
    tokens: int  # rows seen over the workload (sum of M over calls)
    calls: dict[int, int]  # M -> how many calls of that size
    tied: tuple[str, ...]
    chosen: str
    why: str  # why `chosen`, in a pattern's words
    choices: tuple[LayerOption, ...]  # chosen first, then allowed, then excluded

    @property
    def pick(self) -> LayerOption:
        return self.choices[0]

    @property
    def baseline(self) -> LayerOption | None:
        return next((c for c in self.choices if c.candidate == BASELINE), None)

    @property
    def speedup(self) -> float | None:
        """The layer's predicted speed-up over the baseline (None for an emulated candidate)."""
        base, pick = self.baseline, self.pick
        if pick.emulated or base is None or not base.time_us or not pick.time_us:
            return None
        return base.time_us / pick.time_us

    @property
    def key(self) -> tuple:
        """What makes two layers one pattern: the decision and every candidate's reason."""
        return (self.chosen, self.why, tuple((c.candidate, c.status, c.emulated, c.reason) for c in self.choices[1:]))


@dataclass(frozen=True)
class Pattern:
    """Layers with the same decision for the same reasons, said once."""

    layers: tuple[Layer, ...]
    common: frozenset[str] = frozenset()  # candidates excluded on every layer alike: said once for all

    @property
    def chosen(self) -> str:
        return self.layers[0].chosen

    @property
    def why(self) -> str:
        return self.layers[0].why

    @property
    def others(self) -> tuple[tuple[LayerOption, tuple[float, float] | None, tuple[float, float] | None], ...]:
        """Every other candidate with its reason, and its time and SQNR ranges over the layers (those
        excluded everywhere alike left out)."""
        out = []
        for i, c in enumerate(self.layers[0].choices[1:], start=1):
            if c.candidate in self.common:
                continue
            times = [t for lay in self.layers if (t := lay.choices[i].time_us) is not None]
            sqnr = [s for lay in self.layers if (s := lay.choices[i].sqnr_db) is not None]
            out.append((c, (min(times), max(times)) if times else None, (min(sqnr), max(sqnr)) if sqnr else None))
        return tuple(out)

    @property
    def names(self) -> tuple[str, ...]:
        return compress([lay.fqn for lay in self.layers])

    @property
    def time_saved_us(self) -> float:
        """Predicted time the pattern's layers save over the baseline (0 for emulated ones)."""
        return sum(b.time_us - lay.pick.time_us for lay in self.layers
                   if (b := lay.baseline) is not None and b.time_us is not None and lay.pick.time_us is not None
                   and not lay.pick.emulated)


def explain(ctx: RunContext, plan: dict[str, str], fusions: list[list[str]], kernels: dict[str, str],
            kept: str | None = None) -> tuple[Layer, ...]:
    """Every layer of the context with its choice (`plan`: FQN -> candidate), why, and the other
    candidates' reasons; `kept`: the run kept the whole model as it came, and why (no layer was
    weighed against another)."""
    groups = {f: (g.name, tuple(x for x in g.fqns if x != f)) for g in ctx.groups for f in g.fqns}
    fused = {f for g in fusions for f in g}
    out = []
    for lay in ctx.layers:
        chosen = plan.get(lay.fqn, BASELINE)
        group, siblings = groups.get(lay.fqn, (lay.fqn, ()))
        choices = tuple(sorted((_choice(lay, c, chosen, kept is not None, kernels) for c in _names(lay)),
                               key=lambda ch: ORDER[ch.status]))  # stable: registry order within a status
        why = kept if kept is not None else _why_chosen(chosen, lay)
        out.append(Layer(lay.fqn, group, siblings, lay.fqn in fused, lay.in_features, lay.out_features, lay.tokens,
                         dict(lay.calls), tuple(lay.tied), chosen, why, choices))
    return tuple(out)


def group(layers: tuple[Layer, ...]) -> tuple[Pattern, ...]:
    """Layers with equal decisions and reasons, in the order their first layer appears."""
    by_key: dict[tuple, list[Layer]] = {}
    for lay in layers:
        by_key.setdefault(lay.key, []).append(lay)
    common = frozenset(everywhere(layers))
    return tuple(Pattern(tuple(members), common) for members in by_key.values())


def everywhere(layers: tuple[Layer, ...]) -> dict[str, str]:
    """Candidate -> reason, for the candidates excluded on every layer for the same reason (e.g.
    emulated on this device): one sentence for the whole model."""
    if not layers:
        return {}
    reasons = [{c.candidate: c.reason for c in lay.choices if c.status == "excluded"} for lay in layers]
    return {c: r for c, r in reasons[0].items() if all(other.get(c) == r for other in reasons[1:])}


def _names(lay: LayerRecord) -> list[str]:
    return list(dict.fromkeys([*lay.time_us, *lay.timing_error, *lay.excluded, *lay.choices]))


def _choice(lay: LayerRecord, c: str, chosen: str, kept: bool, kernels: dict[str, str]) -> LayerOption:
    times, sqnr = lay.time_us, lay.sqnr_db
    if c == chosen:
        status, reason = "chosen", "chosen"
    elif c in lay.excluded:
        status, reason = "excluded", f"excluded: {lay.excluded[c]}"
    elif c not in lay.choices:
        status, reason = "excluded", f"excluded: {lay.timing_error.get(c, 'not offered to the search')}"
    elif kept:
        status, reason = "allowed", "not used: the model was kept as it came"
    else:
        status = "allowed"
        t, t_chosen, s, s_chosen = times.get(c), times.get(chosen), sqnr.get(c), _sqnr(lay, chosen)
        if t is not None and t_chosen is not None and t >= t_chosen:
            reason = "slower"
        elif s is not None and s_chosen is not None and s < s_chosen:
            reason = "faster, less accurate"
        else:
            reason = "faster, not shown less accurate: the search's trade-off across layers"
    shipped = kernels.get(lay.fqn) if c == chosen else None
    kern, note = _kernel(lay.kernels.get(c), shipped)
    return LayerOption(c, status, times.get(c), c in lay.emulated, sqnr.get(c), reason, kern, note)


def _kernel(info: KernelTimes | None, shipped: str | None) -> tuple[str | None, str]:
    """(the kernel, "kernel; other 1.52x slower") from a layer's per-kernel timings of one candidate;
    `shipped`: the kernel the shipped plan records for the layer (RunSummary.kernels), which wins."""
    chosen = shipped or (info.chosen if info is not None else None)
    said = info.words if info is not None and info.words and chosen == info.chosen else chosen
    if chosen is None or info is None or chosen not in info.us:
        return chosen, said or ""  # no timing of it to compare the others with
    others = []
    for kern, t in info.us.items():
        if kern != chosen:
            ratio = t / info.us[chosen] if info.us[chosen] and math.isfinite(t) else math.inf
            others.append(f"{kern} {'failed' if not math.isfinite(ratio) else f'{ratio:.2f}x slower'}")
    return chosen, "; ".join([said, *others])


def _sqnr(lay: LayerRecord, c: str) -> float | None:
    """A candidate's recorded tier-0 SQNR on the layer; the baseline is exact where not recorded."""
    return lay.sqnr_db.get(c, math.inf if c == BASELINE else None)


def _why_chosen(chosen: str, lay: LayerRecord) -> str:
    times, mine = lay.time_us, _sqnr(lay, chosen)
    faster = [c for c in lay.choices if c in times and times[c] < times.get(chosen, math.inf)]
    noisier = mine is not None and all((s := _sqnr(lay, c)) is not None and s < mine for c in faster)
    if chosen == BASELINE:
        if not faster:
            return "kept as it came: no allowed candidate is faster on these layers"
        if noisier:
            return ("kept as it came: every faster candidate is less accurate here (tier-0 SQNR), and the search "
                    "spent the accuracy budget on other layers")
        return "kept as it came: the search's trade-off across layers"
    if not faster:
        lead = "the fastest allowed candidate"
    elif noisier:
        lead = "every faster candidate is less accurate here (tier-0 SQNR)"
    else:
        lead = "the search's trade-off across layers (a faster candidate was not shown less accurate here)"
    if chosen in lay.emulated:
        lead += "; emulated here: its time is not a speed-up"
    return lead


def compress(fqns: list[str]) -> tuple[str, ...]:
    """Layer names with their numbered parts folded: ["model.layers.{0-3,7}.mlp.up_proj", "lm_head"].
    Names with several numbered parts fold to a "*" and the count."""
    by_template: dict[str, list[str]] = {}
    for f in fqns:
        template = ".".join("{}" if p.isdigit() else p for p in f.split("."))
        by_template.setdefault(template, []).append(f)
    out = []
    for template, names in by_template.items():
        holes = template.count("{}")
        if len(names) == 1 or holes == 0:
            out.extend(names)
        elif holes == 1:
            at = template.split(".").index("{}")
            out.append(template.replace("{}", "{" + _ranges(sorted(int(n.split(".")[at]) for n in names)) + "}"))
        else:
            out.append(f"{template.replace('{}', '*')} ({len(names)} layers)")
    return tuple(out)


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
