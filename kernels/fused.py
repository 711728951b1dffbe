"""Sibling layers run as one: q/k/v (or gate/up) projections that read the same input tensor.

`FusedRows(members)` builds one module of the members' class on their row-concatenated canonical
tensors ([N_1 + N_2 + ..., ...]) and attaches it to every member. The first member called on an
input runs the one kernel for all of them and each member returns its columns of that output, a
view [..., N_i] of the fused [..., sum N] (last-dim stride 1, so attention's fused kernels still
accept it). Why: at decode (M = 1) each GEMV pays ~5 us of fixed cost on a datacenter GPU (launch,
ramp, tail: 5.3 us per kernel fitted to llama8's int8 profile, benchmarks/e2e.py --profile;
docs/kernels.md#the-gpus-ceilings), and one larger GEMV or GEMM also uses the GPU better than three small
(docs/kernels.md#sibling-fusion).

Numbers: the members' formats keep each output row independent of the others (per-channel /
group-wise scales, 2:4 within a row: `QuantizedLinear.rows_independent`), and the fused module is
built from the members' own canonical tensors, not re-quantized, so every weight is bit-identical.
Dynamic activation quantization is per token, so it is the same too.

Memory: members keep their canonical tensors (state_dict, save/load unchanged) as row views of the
fused module's (one host copy) and drop their runtime tensors (one device copy).

Contract with the caller: the members are called, each once, on the same input tensor object,
not written in place in between, between two uses of the group (what autoao.profile's sibling
detection checks on the example inputs). A member called on another tensor, or again, or in eager
mode on the tensor written in place since, recomputes the group's output: still right, only slower.
Compiled callers and inference tensors have no write count to read: there a write in place between
siblings goes unseen.

State: what the member called first owes its siblings lives on the group's module (`owed`: the
input, its write count, the columns not yet taken), and only there: each sibling takes its own,
the last one taken clears it, and a group called again overwrites what an interrupted call left,
so no activation outlives the next call. Members reach the group's module by its key in
forwards.FUSED_UNITS (a table of modules, never of activations), not by an attribute each: two
paths to one object cost a compiled caller an aliasing check per sibling and call. A copy of a
model registers its own groups (QuantizedLinear.__setstate__), so copies never mix.
Works under torch.compile(fullgraph=True): dynamo traces the writes to `owed` as side effects, and
a whole forward leaves it empty, so nothing is held between forwards. `owed` is one attribute,
None or a tuple, written by object.__setattr__ (nn.Module's bookkeeping has nothing to do for it):
a compiled caller checks one None a group (a list holding it would add a type and a length check).
"""

from __future__ import annotations

from typing import Any

import torch
# the function, not torch.compiler.is_compiling(): a compiled caller reaching the torch module from
# this module's globals too would pay an aliasing check on it a call
from torch.compiler import is_compiling

from autoao.kernels._base import QuantizedLinear
from autoao.kernels.forwards import FUSED_UNITS, GROUP_SLOTS, fused_slot, install


class FusedRows:
    """One module computing several sibling layers' outputs; see the module docstring."""

    def __init__(self, members: list[QuantizedLinear]) -> None:
        problem = fuse_problem(members)
        if problem:
            raise ValueError(f"cannot fuse these layers: {problem}")
        first = members[0]
        cls = first.format_class()
        # tuples: a compiled caller guards each as one value (a list, element by element)
        splits = tuple(m.out_features for m in members)
        n = sum(splits)
        bias = any(m.bias is not None for m in members)
        fused = cls(first.in_features, n, bias, first.dtype, first.device, **first.params())
        fused.kernel = first.kernel  # before the canonical tensors arrive: pack once, for this kernel
        fused.set_canonical({name: torch.cat([m._canon[name] for m in members])
                             for name in first.canonical_spec()})
        if bias:
            with torch.no_grad():
                fused.bias.copy_(torch.cat([m.bias.detach() if m.bias is not None else
                                            torch.zeros(m.out_features, dtype=first.dtype, device=first.device)
                                            for m in members]))
        self.module = fused
        self.members = list(members)
        # the members' output sizes (a tuple: a compiled caller guards it as one value) and what the
        # member called first owes the others (module docstring); plain attributes of the module
        fused.__dict__.update(fused_splits=splits, owed=None)
        start = 0
        for i, m in enumerate(members):
            stop = start + m.out_features
            m._canon = {name: t[start:stop] for name, t in fused._canon.items()}  # [N_i, ...] row views
            m.drop_runtime()
            m.fused = (self, i)
            # not a submodule (nn.Module.__setattr__ would register it): state_dict, modules() and
            # .to() see the members only; forward reaches it by its key (forwards.FUSED_UNITS).
            # `_fused_unit` is self.module again, kept on the member for a copy's __setstate__,
            # which runs before the copied FusedRows (a cycle with its members) has its state
            m.__dict__.update(_fused_unit=fused, _fused_slot=fused_slot(fused, self, i))
            install(m, member)  # no twin: the group's module refuses for it
            start = stop

    @property
    def splits(self) -> tuple[int, ...]:
        return self.module.fused_splits

    def set_kernel(self, kernel: str) -> None:
        """Switch the group's CUDA kernel (every member reports it)."""
        self.module.set_kernel(kernel)
        for m in self.members:
            m.kernel = kernel

    def repack(self) -> None:
        """Rebuild the runtime tensors after a member wrote new canonical rows (load_state_dict)."""
        self.module._repack(self.module.device)


def member(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """Fused member m's path (kernels/forwards.py) for x [..., K]: [..., N_m], its view of the
    group's output, which the first member called on x computes for all. A member takes its output
    only if owed for the input it was given, unwritten since; otherwise it runs the group and owes
    its siblings theirs, replacing whatever was owed before."""
    slot = m._fused_slot  # the group's key + m's index (forwards.FUSED_UNITS)
    index = slot % GROUP_SLOTS
    unit = FUSED_UNITS[slot - index]
    owed = unit.owed  # None or (the input, its write count, index -> output): one a group
    if owed is not None and owed[0] is x and (owed[1] is None or owed[1] == x._version):
        mine = owed[2].pop(index, None)
        if mine is not None:
            if not owed[2]:  # the last sibling took its own: nothing held
                object.__setattr__(unit, "owed", None)
            return mine
    splits = unit.fused_splits
    # [..., sum(splits)]: the module's own forward, not its __call__ (no hooks: it is no submodule)
    y = unit.forward(x)
    parts = dict(enumerate(y.split(splits, dim=-1) if not y.requires_grad else narrows(y, splits)))
    mine = parts.pop(index)
    object.__setattr__(unit, "owed", (x, writes(x), parts))
    return mine


def writes(x: torch.Tensor) -> int | None:
    """x's in-place write count (its version), or None where none can be read: inference tensors
    keep none, and dynamo traces it as a data-dependent integer no branch may read. There, a
    caller writing the input in place between two siblings breaks the contract (module docstring)."""
    if is_compiling() or x.is_inference():
        return None
    return x._version


def narrows(y: torch.Tensor, splits: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """What y.split(splits, dim=-1) gives, as one narrow each: autograd forbids in-place ops on the
    views one split makes (a caller's `q *= scale` while it records) and allows them on a narrow's.
    Only where autograd records: three narrows cost a fused q/k/v's eager call about 1-2 us more
    than one split on the CPU (docs/kernels.md#sibling-fusion)."""
    starts = [sum(splits[:i]) for i in range(len(splits))]
    return tuple(y.narrow(-1, at, n) for at, n in zip(starts, splits))


def fuse_problem(members: list[Any]) -> str | None:
    """None if `members` can run as one FusedRows, else why not (names no layer: callers do)."""
    if len(members) < 2:
        return "a group needs at least two layers"
    if len(members) > GROUP_SLOTS:
        return f"a group has at most {GROUP_SLOTS} layers, not {len(members)}"
    if not all(isinstance(m, QuantizedLinear) for m in members):
        kinds = sorted({type(m).__name__ for m in members if not isinstance(m, QuantizedLinear)})
        return f"only autoao's quantized layers fuse, not {', '.join(kinds)}"
    first = members[0]
    if any(m.fused is not None for m in members):
        return "a layer is already fused"
    if not type(first).fusable(**first.params()):
        return f"{type(first).__name__}{first.params() or ''} is not row-wise (its numbers span rows)"
    for what, key in (("class", lambda m: m.format_class()), ("parameters", lambda m: m.params()),
                      ("kernel", lambda m: m.kernel), ("in_features", lambda m: m.in_features),
                      ("dtype", lambda m: m.dtype), ("device", lambda m: m.device)):
        values = [key(m) for m in members]
        if any(v != values[0] for v in values):
            return f"the layers differ in {what}: {', '.join(map(str, values))}"
    return None
