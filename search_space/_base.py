"""The Candidate contract: what one per-layer choice is, where it applies, and how it is built.

A candidate is a frozen dataclass (its fields are its parameters, e.g. `group_size`), registered
by family name. It answers three questions:

- `supports(layer, device) -> None | reason`: can this layer run it on this device? Never raises;
  the reason string ("K=4100 not a multiple of group size 128") goes to the report as-is.
- `emulated(device) -> None | reason`: does it run only as a reference path here (same numbers, no
  fast kernel)? Emulated candidates are never reported as a speed-up.
- `build(linear, stats) -> nn.Module`: the replacement module (quantized weights; `stats`: the
  layer's calibration statistics, read where `calibration_uses` says so).

and says which kernels run it: `kernels(device)`, each a `kernels.KernelInfo` record (its module
family's declaration: name, layout, launch options, timing hints), and `kernel_problem(kernel)`,
whether a plan's kernel name or route is one its module runs.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from autoao.calibration import LayerStats
from autoao.types import LayerSpec  # noqa: F401  (re-exported)
from autoao.kernels import KernelInfo, QuantizedLinear, as_linear, cpu_isa
from autoao.kernels.algorithms import INPUT_SCALED, USES, check_algorithm
from autoao.kernels.routes import kernels_on, route_problem

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEVICE_TYPES = ("cpu", "cuda")


def cuda_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def capability_reason(device: torch.device, min_capability: tuple[int, int], what: str) -> str | None:
    """None on the CPU or a GPU of at least `min_capability`, else "<what> needs compute capability
    >= 9.0, this GPU has 8.0"."""
    if device.type != "cuda":
        return None
    cap = cuda_capability(device)
    if cap < min_capability:
        return (f"{what} needs compute capability >= {min_capability[0]}.{min_capability[1]}, "
                f"this GPU has {cap[0]}.{cap[1]}")
    return None


@dataclass(frozen=True)
class Candidate(ABC):
    """Base of every candidate family. Subclasses are frozen dataclasses whose fields are the
    family's parameters; they set `family`, `module_cls` and implement `_supports`."""

    family: ClassVar[str]
    module_cls: ClassVar[type[QuantizedLinear] | None]
    summary: ClassVar[str]  # one line for tables: weights / activations
    kernel_summary: ClassVar[dict[str, str]] = {}  # device type -> the kernels that run it there
    # Lowest SQNR (dB) of the output against the ideal float32 product that a correct kernel reaches
    # on N(0, 1/K) or nn.Linear-initialised weights and Gaussian inputs (tests and
    # the CUDA tests check every family against it; 2:4 families: same pruned weight).
    sqnr_bound_db: ClassVar[float]
    # How many times the layer dtype's multiply-accumulate rate the format's products run at on
    # matrix units (8-bit x 8-bit: 2; 2:4-sparse operands: 2x more). Only orders which candidates
    # are timed first on workloads of many tokens (evaluators.timing); every choice is measured.
    product_rate: ClassVar[float] = 1.0

    # ---- identity --------------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        """Field -> value; an `algorithm` field (algorithm_field) only when it is not "rtn", so
        round-to-nearest keeps the names, timing keys and plan entries it had before algorithms."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not (f.metadata.get("omit_default") and getattr(self, f.name) == f.default)}

    @property
    def algorithm(self) -> str:
        """The quantization algorithm (kernels/algorithms.py); "rtn" for families without one."""
        return self.__dict__.get("algorithm", "rtn")

    @property
    def timing_name(self) -> str:
        """The name under which this candidate's timings are cached: its own, or round-to-nearest's
        where its algorithm runs the very same kernels on other numbers (GPTQ, HQQ)."""
        if self.algorithm == "rtn" or self.algorithm in INPUT_SCALED:
            return self.name
        return dataclasses.replace(self, algorithm="rtn").name  # type: ignore[call-arg]

    def _check_algorithm(self) -> None:
        """For __post_init__ of families with an algorithm field: ValueError naming the choices."""
        assert self.module_cls is not None
        check_algorithm(self.algorithm, self.module_cls.algorithms, self.family)

    @property
    def name(self) -> str:
        """`family` or `family(key=value, ...)`; `search_space.parse(name)` gives this back."""
        p = self.params()
        return self.family if not p else f"{self.family}(" + ", ".join(f"{k}={v}" for k, v in p.items()) + ")"

    @property
    def fusable(self) -> bool:
        """Whether sibling layers with this candidate can run as one module (kernels.FusedRows):
        its format keeps each output row's numbers independent of the other rows."""
        return self.module_cls is not None and self.module_cls.fusable(**self._module_params())

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "params": self.params()}

    def __str__(self) -> str:
        return self.name

    # ---- applicability ---------------------------------------------------------------------
    def supports(self, layer: LayerSpec, device: torch.device | str) -> str | None:
        """None if this candidate can run `layer` on `device`, else the reason it cannot.

        Never raises: a failing check becomes a reason."""
        try:
            device = torch.device(device)
            if device.type not in DEVICE_TYPES:
                return f"autoao has no kernels for device type {device.type!r} (has: {', '.join(DEVICE_TYPES)})"
            if layer.dtype not in FLOAT_DTYPES:
                return f"layer dtype {layer.dtype} is not one of float32, bfloat16, float16"
            return self._supports(layer, device)
        except Exception as e:  # noqa: BLE001 - a broken check must not break the search
            return f"support check failed: {type(e).__name__}: {e}"

    @abstractmethod
    def _supports(self, layer: LayerSpec, device: torch.device) -> str | None: ...

    def describe(self, device: torch.device | str) -> str:
        """One line for tables: what the candidate stores and computes, and its kernels on `device`."""
        kind = torch.device(device).type
        kern = self.kernel_summary.get(kind)
        if kern and kind == "cpu":  # name the instructions the kernels use on this CPU
            kern = cpu_isa.annotate(kern)
        return f"{self.summary}; {kern}" if kern else self.summary

    def stored_bits(self, layer: LayerSpec) -> float:
        """Bits stored per weight of `layer`: its module's parameters and buffers (scales included),
        built on the meta device (nothing allocated); the layer's own where the module cannot be
        built there. Only orders which candidates are timed first on workloads of few tokens."""
        own = 8.0 * layer.dtype.itemsize
        try:
            module = self.empty(layer, "meta")
        except Exception:  # noqa: BLE001 - an ordering hint, never an error
            return own
        tensors = [*module.parameters(), *module.buffers()]
        return 8.0 * sum(t.numel() * t.element_size() for t in tensors) / (layer.in_features * layer.out_features)

    def emulated(self, device: torch.device | str) -> str | None:
        """None if a fast kernel runs this on `device`, else why it is only emulated there."""
        device = torch.device(device)
        if self.module_cls is not None and device.type in self.module_cls.emulated_on:
            return self._emulation_reason(device)
        return None

    def _emulation_reason(self, device: torch.device) -> str:
        return f"no {self.family} kernel on {device.type}: emulated"

    # ---- kernels ---------------------------------------------------------------------------
    def kernels(self, device: torch.device | str) -> tuple[KernelInfo, ...]:
        """The kernels that run this candidate on `device`'s type, the default first (flagged
        `default`); one where it has a single implementation there (the baseline's: the layer's own
        F.linear). Made afresh on each call: a record's launch options are the process's now."""
        return kernels_on(self._declared_kernels(), torch.device(device).type)

    def kernel_problem(self, kernel: str) -> str | None:
        """None if this candidate's module runs `kernel` (one of its kernels on some device type, or
        a route of them: kernels.parse_route), else what is wrong, e.g. "no kernel 'x' (has: ...);
        did you mean ...?"."""
        return route_problem(kernel, self._declared_kernels())

    def _declared_kernels(self) -> tuple[KernelInfo, ...]:
        if self.module_cls is None:
            return ()
        return self.module_cls.declared_kernels(**self._module_params())

    # ---- construction ----------------------------------------------------------------------
    @property
    def calibration_uses(self) -> frozenset[str]:
        """The calibration statistics (autoao.calibration.STATISTICS) this candidate's quantization
        reads when they are given; empty for plain round-to-nearest."""
        if self.module_cls is None:
            return frozenset()
        return self.module_cls.calibration_uses | USES[self.algorithm]

    def fit_uses(self) -> frozenset[str]:
        """The statistics without which this candidate's algorithm is not itself (it would fall back
        to round-to-nearest); empty for algorithms that fit on nothing (RTN, HQQ). 2:4's activation
        norms are not among them: pruning by magnitude without them is its documented rule."""
        return frozenset(USES[self.algorithm])

    def build(self, linear: nn.Linear, stats: LayerStats | None = None, fqn: str = "") -> nn.Module:
        """The module replacing `linear` (an nn.Linear, or a GPT-2 Conv1D: kernels.as_linear; on
        linear's device), quantized with the layer's calibration statistics where the candidate
        uses them.

        Raises ValueError naming the layer if the candidate does not support it."""
        linear = as_linear(linear)
        layer = LayerSpec.from_linear(fqn, linear)
        reason = self.supports(layer, linear.weight.device)
        if reason:
            raise ValueError(f"candidate {self.name} cannot be applied to layer {fqn or '<unnamed>'} "
                             f"({layer.shape}, {layer.dtype}): {reason}")
        assert self.module_cls is not None
        return self.module_cls.from_linear(linear, stats, **self._module_params())

    def empty(self, layer: LayerSpec, device: torch.device | str) -> nn.Module:
        """A module of the right shapes with zero weights, to be filled by load_state_dict."""
        assert self.module_cls is not None
        return self.module_cls(layer.in_features, layer.out_features, layer.bias, layer.dtype,
                               torch.device(device), **self._module_params())

    def _module_params(self) -> dict[str, Any]:
        return self.params()


def algorithm_field() -> Any:
    """The `algorithm` field of a candidate family: "rtn" (round-to-nearest) by default, and left
    out of its name and plan entry then (Candidate.params)."""
    return dataclasses.field(default="rtn", metadata={"omit_default": True})


def multiple_reason(what: str, value: int, multiple: int, why: str) -> str | None:
    """'K=4100 not a multiple of 128 (why)' or None."""
    return None if value % multiple == 0 else f"{what}={value} not a multiple of {multiple} ({why})"
