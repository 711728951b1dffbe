"""Profiler: one forward pass per example input, with hooks on every linear layer.

`profile(model, example_inputs)` returns a `ModelProfile`. Its `.layers` is the list of
`LayerProfile` (one per linear weight, in module order: nn.Linear, and transformers' GPT-2
`Conv1D`, a linear whose weight is stored [K, N], recognised by name without importing
transformers): name, (K, N), dtype, device, every input shape seen with its call count, token
counts, per-input-channel activation norms and absmax and a bounded sample of real input rows
(`LayerProfile.stats`; all layers: `.calibration`).

example_inputs: a Tensor runs `model(t)`; a tuple runs `model(*args)`; a dict (any Mapping, e.g. a
tokenizer's BatchEncoding) runs `model(**kwargs)`; a list runs one forward per element, each element
following those rules (anything else is passed as the one positional argument). The forwards run
under torch.no_grad() in eval mode; every module's training flag is restored and every hook
removed afterwards, also when an input fails.

Tied weights: Linears sharing one weight Parameter are reported once (the first in module order),
the others listed in its `tied`, so a plan never quantizes one weight twice. A Linear sharing its
weight with an nn.Embedding (tied lm_head) is still reported, with the embedding's name in `tied`:
quantizing it unties them (the embedding keeps the float weight). Statistics are those of the
reported module's own inputs, since that is the module a plan entry replaces.

Siblings: layers that read the very same input tensor in a forward (a transformer's q/k/v and
gate/up projections) are listed in `.siblings`, a group per input, in call order: they can run as
one kernel on their row-concatenated weights (autoao.kernels.FusedRows). A group is listed only
if, over every example input, each member was called exactly once per such input, always with the
same co-members, and the input was not modified in place between their calls.

Calibration rows: the statistics leave out rows of one-position sequences ([..., 1, K]: decode
steps run without their KV cache, first-position rows) wherever the layer also saw inputs with
context; the token counts keep every row.

Memory: per layer at most 2 x `max_sample_rows` rows of K values are kept while profiling (rows
with context and one-position rows apart), on CPU in the layer dtype: 2 x 256 rows of K=4096 in
bf16 is 4 MiB a layer, half of it kept afterwards; plus six [K] float32 vectors (sum of squares,
abs max, sum of |x| per pool) a layer. GPTQ's Hessian is computed from the sample when a layer is
quantized (LayerStats.hessian), never kept.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from autoao.calibration import Calibration, LayerStats
from autoao.common import call_model
from autoao.kernels import is_conv1d
from autoao.types import LayerSpec


@dataclass
class LayerProfile:
    """What the example inputs showed about one nn.Linear."""

    fqn: str
    in_features: int  # K
    out_features: int  # N
    bias: bool
    dtype: torch.dtype  # weight dtype
    device: torch.device  # weight device
    shapes: dict[tuple[int, ...], int]  # each distinct input shape [..., K] -> number of calls with it
    tokens: int  # rows seen (product of the leading dims), summed over calls; 0 if never called
    # act_norm [K] float32 CPU: per-input-channel L2 norm over the rows seen; act_absmax [K]
    # float32 CPU: per-input-channel max |x|; act_mean [K] float32 CPU: mean |x|; sample [S, K] layer
    # dtype CPU, S <= max_sample_rows: real input rows. Rows of one-position sequences count only
    # where the layer saw no others (_Recorder).
    stats: LayerStats
    tied: list[str]  # other Linear / Embedding FQNs holding the same weight Parameter

    @property
    def spec(self) -> LayerSpec:
        return LayerSpec(self.fqn, self.in_features, self.out_features, self.bias, self.dtype)


@dataclass
class ModelProfile:
    """Every linear layer of a model, as seen on the example inputs."""

    layers: list[LayerProfile]  # one per nn.Linear / Conv1D weight, module order
    num_forward: int  # forwards run (one per example input)
    seconds: float  # wall time of those forwards, hooks included
    siblings: list[tuple[str, ...]] = field(default_factory=list)  # layers reading one input, call order

    def by_fqn(self) -> dict[str, LayerProfile]:
        return {p.fqn: p for p in self.layers}

    @property
    def calibration(self) -> Calibration:
        """Every layer's input statistics as one object: the `calibration` argument of
        `autoao.apply` (Wanda 2:4 pruning reads the activation norms)."""
        return Calibration({p.fqn: p.stats for p in self.layers})


class _Pool:
    """Input statistics of one kind of row: sums over the rows seen and a bounded reservoir sample
    of them (kept on the layer's device until `stats`, except the sample, on CPU)."""

    def __init__(self, k: int, device: torch.device, dtype: torch.dtype, max_rows: int) -> None:
        self.rows = 0
        self.sumsq = torch.zeros(k, dtype=torch.float32, device=device)  # [K]
        self.absmax = torch.zeros(k, dtype=torch.float32, device=device)  # [K]
        self.sumabs = torch.zeros(k, dtype=torch.float32, device=device)  # [K]: mean |x| once divided
        self.sample = torch.empty(max_rows, k, dtype=dtype)  # [cap, K] CPU, reservoir
        self.generator = torch.Generator().manual_seed(0)  # per layer: deterministic sample

    def add(self, rows: torch.Tensor) -> None:  # rows [M, K]
        # Sum of squares, not a running norm: exact over calls; float32 so fp16 squares do not overflow
        # and bf16 sums keep their precision.
        f = rows.float()
        self.sumsq += f.square().sum(0)
        torch.maximum(self.absmax, f.abs().amax(0), out=self.absmax)
        self.sumabs += f.abs().sum(0)
        self._keep(rows)
        self.rows += rows.shape[0]

    def _keep(self, rows: torch.Tensor) -> None:
        """Reservoir sampling (Algorithm R), vectorized over the rows of one call: the i-th row seen
        takes slot i while i < cap, else slot r ~ U{0..i} if r < cap. Every row seen so far is then
        kept with the same probability, whatever the number and lengths of the calls."""
        cap, m = self.sample.shape[0], rows.shape[0]
        if cap == 0:
            return
        i = torch.arange(self.rows, self.rows + m)  # [M] global row index
        r = (torch.rand(m, generator=self.generator, dtype=torch.float64) * (i + 1)).long()
        slot = torch.where(i < cap, i, r)
        keep = slot < cap
        # Rows of one call drawing the same slot: the last one wins, as in the sequential algorithm.
        winner = torch.full((cap,), -1, dtype=torch.long)
        winner.scatter_reduce_(0, slot[keep], torch.arange(m)[keep], "amax")
        filled = winner >= 0
        self.sample[filled] = rows[winner[filled].to(rows.device)].to("cpu", self.sample.dtype)

    def stats(self) -> LayerStats:
        s = min(self.rows, self.sample.shape[0])
        return LayerStats(self.sumsq.sqrt().cpu(), self.absmax.cpu(), self.sample[:s].clone(),
                          (self.sumabs / max(self.rows, 1)).cpu())


class _Recorder:
    """Forward hook accumulating one layer's input statistics. A post-forward hook, so an input
    the layer rejects fails with the layer's own error, not one of ours.

    Rows of one-position sequences (inputs [..., 1, K] of rank 3 or more: a decode step run without
    its KV cache) are pooled apart from the others: such a step sees no context, so its rows are
    first-position rows, whose activations are outliers in transformers. On the demo's workload
    (a 256-token prefill, 32 such steps) the 33 largest of a 256-row sample held 88-100% of the
    energy in six of SmolLM2's down_proj layers (36-100% among the prefill's rows alone), and GPTQ
    int4 g128 fitted on all rows reached KL 0.196 from bf16 against 0.063 fitted on the prefill's
    (benchmarks/ACCURACY.md, "Calibrated quantization end to end").
    The statistics come from the other rows whenever there are any; the token counts and shapes,
    which timing reads, count every row."""

    def __init__(self, fqn: str, linear: nn.Module, max_rows: int, siblings: _Siblings) -> None:
        self.spec = LayerSpec.from_linear(fqn, linear)
        k, device, dtype = self.spec.in_features, linear.weight.device, linear.weight.dtype
        self.fqn, self.siblings = fqn, siblings
        self.shapes: dict[tuple[int, ...], int] = {}
        self.tokens = 0
        self.context = _Pool(k, device, dtype, max_rows)  # rows of inputs with context (or no positions)
        self.lone = _Pool(k, device, dtype, max_rows)  # rows of one-position sequences

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        x = args[0] if args else kwargs["input"]  # [..., K]
        self.siblings.record(self.fqn, x)
        self.shapes[tuple(x.shape)] = self.shapes.get(tuple(x.shape), 0) + 1
        rows = x.detach().reshape(-1, x.shape[-1])  # [M, K]
        if rows.shape[0] == 0:
            return
        (self.lone if x.dim() >= 3 and x.shape[-2] == 1 else self.context).add(rows)
        self.tokens += rows.shape[0]

    def result(self, fqn: str, linear: nn.Module, tied: list[str]) -> LayerProfile:
        spec = self.spec
        pool = self.context if self.context.rows else self.lone
        return LayerProfile(fqn, spec.in_features, spec.out_features, spec.bias,
                            linear.weight.dtype, linear.weight.device, self.shapes, self.tokens, pool.stats(), tied)


class _Siblings:
    """Records which layers read the identical input tensor within one forward (module docstring)."""

    def __init__(self) -> None:
        # (id, version) of an input -> (the tensor, kept so its id is not reused within the forward;
        # the FQNs that read it, in call order)
        self.inputs: dict[tuple[int, int], tuple[torch.Tensor, list[str]]] = {}
        self.seen: dict[str, set[tuple[str, ...]]] = {}  # FQN -> every call group it was in

    def record(self, fqn: str, x: torch.Tensor) -> None:
        try:
            version = x._version  # bumped by in-place writes: a modified input is another input
        except RuntimeError:  # inference-mode tensors have no version counter and cannot be modified
            version = 0
        self.inputs.setdefault((id(x), version), (x, []))[1].append(fqn)

    def end_forward(self) -> None:
        for _, fqns in self.inputs.values():
            for f in fqns:
                self.seen.setdefault(f, set()).add(tuple(fqns))
        self.inputs.clear()

    def groups(self) -> list[tuple[str, ...]]:
        out: dict[tuple[str, ...], None] = {}
        for calls in self.seen.values():
            group = next(iter(calls))
            if (len(calls) == 1 and len(group) > 1 and len(set(group)) == len(group)
                    and all(self.seen.get(f) == calls for f in group)):
                out[group] = None
        return list(out)


def _describe(example: Any) -> str:
    """'a tuple of 2 values: tensor [1, 5] int64, int' and the like, for error messages."""
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"tensor {list(v.shape)} {str(v.dtype).removeprefix('torch.')} on {v.device.type}"
        return type(v).__name__

    if isinstance(example, tuple):
        return f"a tuple of {len(example)} values: " + ", ".join(one(v) for v in example)
    if isinstance(example, Mapping):
        return "a dict: " + ", ".join(f"{k}={one(v)}" for k, v in example.items())
    return "a " + one(example)


def profile(model: nn.Module, example_inputs: Any, *, max_sample_rows: int = 256) -> ModelProfile:
    """Run the example inputs through `model` with hooks; return every linear layer's profile.

    See the module docstring for the example_inputs convention, tied weights and the memory bound.
    Raises ValueError if the model has no nn.Linear (nor Conv1D), if example_inputs is an empty
    list, or if an example input fails to run (naming its index; the original error is chained).
    """
    if max_sample_rows < 0:
        raise ValueError(f"max_sample_rows must be >= 0 (0 keeps no sample), got {max_sample_rows}")
    examples = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    if not examples:
        raise ValueError("example_inputs is an empty list; give at least one input the model runs on "
                         "(a tensor, a tuple of positional arguments, or a dict of keyword arguments)")

    sharers, linears = _linears(model)
    siblings = _Siblings()
    recorders = {key: _Recorder(fqn, m, max_sample_rows, siblings) for key, (fqn, m) in linears.items()}
    training = {m: m.training for m in model.modules()}
    handles = [m.register_forward_hook(recorders[key], with_kwargs=True) for key, (_, m) in linears.items()]
    start = time.perf_counter()
    try:
        model.eval()
        with torch.no_grad():
            for i, example in enumerate(examples):
                try:
                    call_model(model, example)
                except Exception as e:
                    raise ValueError(f"example input #{i} ({_describe(example)}) failed to run: "
                                     f"{type(e).__name__}: {e}") from e
                siblings.end_forward()
    finally:
        for h in handles:
            h.remove()
        for m, flag in training.items():
            m.training = flag
    seconds = time.perf_counter() - start

    layers = [recorders[key].result(fqn, m, [f for f in sharers[key] if f != fqn])
              for key, (fqn, m) in linears.items()]
    conv = {fqn for fqn, m in linears.values() if is_conv1d(m)}
    # fused groups concatenate [N, K] weights: Conv1D layers (weights [K, N]) run alone
    return ModelProfile(layers, len(examples), seconds, [g for g in siblings.groups() if not conv & set(g)])


def _linears(model: nn.Module) -> tuple[dict[int, list[str]], dict[int, tuple[str, nn.Module]]]:
    """(id(weight) -> every Linear / Embedding FQN holding it, in module order; id(weight) -> the
    first Linear, or GPT-2 Conv1D (a linear with its weight stored [K, N]), holding it). ValueError
    when the model has none."""
    sharers: dict[int, list[str]] = {}
    linears: dict[int, tuple[str, nn.Module]] = {}
    for fqn, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)) or is_conv1d(m):
            sharers.setdefault(id(m.weight), []).append(fqn)
            if not isinstance(m, nn.Embedding):
                linears.setdefault(id(m.weight), (fqn, m))
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers; autoao only quantizes linear "
                         "layers, so there is nothing to profile")
    return sharers, linears


def on_int4_grid(weight: torch.Tensor, group: int = 32, rows: int = 16) -> bool:
    """True when the first `rows` rows of `weight` [N, K] sit on an affine 4-bit grid per `group`
    input columns (what GGUF Q4_0 / Q4_1 leave behind once dequantized): in every group, every
    value is within a tenth of a step of min + q * (max - min) / 15 for an integer q in [0, 15].
    bf16 rounding moves a dequantized value by at most ~2^-8 of it, under 0.06 of a step."""
    n, k = weight.shape
    if k % group:
        return False
    w = weight[:rows].detach().float().reshape(-1, group)  # [rows * K / group, group]
    lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    step = (hi - lo).clamp_min(1e-12) / 15
    off = (w - lo) / step  # in steps above the group's minimum
    return bool(((off - off.round()).abs() <= 0.1).all())


GRID_CANDIDATE = "int4_wo(group_size=32)"  # the candidate a 4-bit group-32 weight grid flatters


def int4_grid_layers(model: nn.Module, prof: ModelProfile, group: int = 32) -> list[str]:
    """FQNs of the profiled layers whose weights sit on a 4-bit grid of `group` input columns
    (on_int4_grid; a Conv1D's [K, N] weight read as [N, K]): int4 with that group size
    re-quantizes their own grid, and measures near lossless on them."""
    out = []
    for lay in prof.layers:
        module = model.get_submodule(lay.fqn)
        if on_int4_grid(module.weight.t() if is_conv1d(module) else module.weight, group):
            out.append(lay.fqn)
    return out
