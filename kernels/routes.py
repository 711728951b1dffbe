"""Kernels as data, and routes through them.

A module family (kernels/<family>.py) may compute its numbers with several kernels: other code,
other speed, the same numbers (int4 on CUDA: tinygemm, autoao's CUDA and Triton GEMVs, ...). It
declares them as `KernelInfo` records (`QuantizedLinear.declared_kernels`), and everything else
reads the records: timing, to know what to time, under which cache key and what it may skip; plans,
to check a kernel name; the module, to dispatch. A family that declares none has one kernel,
"default", on every device type.

A *route* runs a kernel per range of rows (tokens) of a call, e.g. "int8pack<=16,dequant": int8pack
for calls of up to 16 rows, dequant above. Its kernels read one runtime layout, so one packed weight
serves decode and prefill.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

# The device types kernels are declared for, in the order kernel names are listed.
DEVICE_TYPES = ("cuda", "cpu")
# The one kernel of a family that declares none.
DEFAULT = "default"
# A kernel per range of rows (tokens), in order: ((kernel, up to rows), ..., (last kernel, None)).
Route = tuple[tuple[str, "int | None"], ...]
# (M rows of a call, N, K of the layer) -> the name of another kernel of the same device type, or None.
KernelHint = Callable[[int, int, int], "str | None"]


def _no_kernel(m: int, n: int, k: int) -> str | None:
    return None


def _not_single(m: int, n: int, k: int) -> bool:
    return False


@dataclass(frozen=True)
class KernelInfo:
    """One kernel of a module family on one device type: what timing and plans need to know about
    it, no code that runs it (the module's `_forward` does, for `kernel_at(rows)`).

    The timing hints are functions of a call's rows M and the layer's N x K (the family's
    parameters bound in by its declaration); they may depend on what this process can load (the
    Triton ops), never on measurements. Two records are equal when their facts are.
    """

    name: str  # e.g. "tinygemm"; what plans, set_kernel and timing cache labels ("cand@name") say
    device_type: str  # "cuda" or "cpu"
    # The runtime layout it reads ("" -> one of its own, named after the kernel): kernels of one
    # layout can share a route (one packed weight serves every row count).
    layout: str = ""
    # The device type's first kernel: what a module runs there unless set_kernel says otherwise
    # (kernels_on sets it).
    default: bool = False
    # The process-wide launch options it runs with, as a short stable string, e.g.
    # "pdl=1,prefetch_mb=8,early=1"; "" for none. Options change a kernel's speed, never its
    # numbers: timing puts this into the cache key (TimingKey.options), so a timing taken under one
    # setting is never reused under another. Read when the record is made: records are made afresh
    # for each use (Candidate.kernels).
    options: str = ""
    # A kernel listed before this one that was measured faster than it at (M, N, K) wherever both
    # run, or None. Timing does not time this kernel on a shape when at every M of the workload such
    # a kernel timed without error: it could not be chosen.
    outrun_by: KernelHint = dataclasses.field(default=_no_kernel, compare=False, repr=False)
    # A kernel listed before this one that runs exactly this one's code at (M, N, K), or None:
    # timing reuses its numbers instead of compiling and timing the same code again.
    same_code: KernelHint = dataclasses.field(default=_no_kernel, compare=False, repr=False)
    # Whether its forward at (M, N, K) (bf16 input, no bias: how timing builds layers) is one opaque
    # op (a custom op or an extern aten kernel) that torch.compile can only call as it is. Timing in
    # "compile" mode on CUDA replays such cells eagerly in a CUDA graph instead of compiling them
    # (the same kernels: 0-3% apart on a datacenter GPU: docs/measuring.md#gpu-timing).
    single_op: Callable[[int, int, int], bool] = dataclasses.field(default=_not_single, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.layout:
            object.__setattr__(self, "layout", self.name)


def kernels_on(declared: Sequence[KernelInfo], device_type: str) -> tuple[KernelInfo, ...]:
    """The kernels of a family's declaration that run on `device_type`, in their declared order, the
    first marked `default`. A device type the declaration names no kernel for gets one: the family's
    single implementation there, named after its first kernel (kernel_names: CUDA's first; DEFAULT
    for a family that declares none), so that a plan made on a GPU names a kernel the module
    accepts on a CPU."""
    here = [info for info in declared if info.device_type == device_type]
    if not here:
        return (KernelInfo(kernel_names(declared)[0], device_type, default=True),)
    return (dataclasses.replace(here[0], default=True), *here[1:])


def kernel_names(declared: Sequence[KernelInfo]) -> tuple[str, ...]:
    """The kernel names a family declares, CUDA's first (DEFAULT for a family that declares none):
    the names set_kernel and plan entries may use."""
    names = [info.name for dev in DEVICE_TYPES for info in declared if info.device_type == dev]
    return tuple(dict.fromkeys(names)) or (DEFAULT,)


def route_problem(text: str, declared: Sequence[KernelInfo]) -> str | None:
    """None if `text` is a kernel of the family (kernel_names) or a route of them (parse_route)
    that one device type runs over one runtime layout, else what is wrong: the route's syntax,
    "no kernel 'x' (has: ...); did you mean ...?", or a route mixing device types or layouts."""
    try:
        route = parse_route(text)
    except ValueError as e:
        return str(e)
    names = kernel_names(declared)
    for kern, _ in route:
        if kern not in names:
            close = difflib.get_close_matches(kern, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"no kernel {kern!r} (has: {', '.join(names)}){hint}"
    if len(route) == 1:
        return None
    for dev in DEVICE_TYPES:
        here = {info.name: info for info in kernels_on(declared, dev)}
        if all(kern in here for kern, _ in route):
            layouts = list(dict.fromkeys(here[kern].layout for kern, _ in route))
            if len(layouts) > 1:
                return (f"route {route_text(route)!r} mixes runtime layouts ({', '.join(layouts)}); "
                        "a route's kernels must read one packed weight")
            return None
    return f"route {route_text(route)!r} mixes kernels of different devices"


##### routes: a kernel per range of rows ########################################################

def parse_route(text: str) -> Route:
    """ "int8pack<=16,dequant" -> (("int8pack", 16), ("dequant", None)): int8pack for calls of up to
    16 rows, dequant above. One kernel name is a route of one step. Cuts are positive integers in
    increasing order, every step but the last has one and the last has none, and no kernel repeats.
    Raises ValueError saying what is wrong (which kernels exist is the family's: route_problem)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a kernel route must be a kernel name or 'kernel<=rows,...,kernel', got {text!r}")
    steps: list[tuple[str, int | None]] = []
    parts = [p.strip() for p in text.split(",")]
    for i, part in enumerate(parts):
        name, sep, cut = (p.strip() for p in part.partition("<="))
        last = i == len(parts) - 1
        if not name:
            raise ValueError(f"kernel route {text!r}: step {i + 1} has no kernel name")
        if last and sep:
            raise ValueError(f"kernel route {text!r}: the last kernel ({name!r}) takes every row count "
                             "above the cuts, so it has no '<=rows'")
        if not last and not sep:
            raise ValueError(f"kernel route {text!r}: {name!r} needs '<=rows' (only the last kernel has none)")
        upto = None
        if sep:
            if not cut.isdigit() or int(cut) < 1:
                raise ValueError(f"kernel route {text!r}: cut {cut!r} after {name!r} is not a positive row count")
            upto = int(cut)
            if steps and upto <= steps[-1][1]:  # type: ignore[operator]
                raise ValueError(f"kernel route {text!r}: cuts must increase ({steps[-1][1]} then {upto})")
        if any(name == k for k, _ in steps):
            raise ValueError(f"kernel route {text!r}: {name!r} appears twice")
        steps.append((name, upto))
    return tuple(steps)


def route_kernel(route: Route, rows: int) -> str:
    """The kernel a route runs for a call with `rows` rows: the first step whose bound holds."""
    return next((kern for kern, upto in route if upto is None or rows <= upto), route[-1][0])


def route_text(route: Route) -> str:
    """The inverse of parse_route: (("int8pack", 16), ("dequant", None)) -> "int8pack<=16,dequant"."""
    return ",".join(k if upto is None else f"{k}<={upto}" for k, upto in route)


def describe_route(text: str) -> str:
    """ "int8pack<=16,dequant" -> "int8pack up to 16 rows, dequant above"; one kernel -> its name."""
    route = parse_route(text)
    if len(route) == 1:
        return route[0][0]
    parts = []
    for i, (kern, upto) in enumerate(route):
        if upto is None:
            parts.append(f"{kern} above")
        elif i == 0:
            parts.append(f"{kern} up to {upto} rows")
        else:
            parts.append(f"{kern} up to {upto}")
    return ", ".join(parts)


def route_from_timings(winners: dict[int, str]) -> str:
    """The route that runs, at each timed token count M, the kernel that won there: {1: "int8pack",
    256: "dequant"} -> "int8pack<=16,dequant". Neighbouring counts with one winner share a step; the
    cut between two timed counts is their geometric mean (rounded down), halfway on the log scale
    that kernel costs change on."""
    ms = sorted(winners)
    if not ms:
        raise ValueError("route_from_timings needs at least one timed token count")
    steps: list[tuple[str, int | None]] = []
    for a, b in zip(ms, ms[1:] + [None]):
        if b is not None and winners[a] == winners[b]:
            continue
        kern = winners[a]
        if any(kern == k for k, _ in steps):  # a kernel winning two separate ranges: keep its first
            continue
        steps.append((kern, None if b is None else max(int(math.isqrt(a * b)), a)))
    if steps[-1][1] is not None:  # the last winner repeated an earlier one: the earlier takes the rest
        steps[-1] = (steps[-1][0], None)
    return route_text(tuple(steps))
