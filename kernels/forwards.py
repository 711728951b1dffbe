"""How a QuantizedLinear's forward runs: one path a module, chosen when it is packed or fused.

    m._path = own | own_scaled | packed | fused.member   (install sets it, and m's class: the
                                                         variant of its format running the path, or
                                                         its twin refusing an input that requires grad)

`install(m, path)` makes m an instance of its format's variant class for that path (`variant`: a
subclass of the format whose `forward` is the path, made once per format and path, with the
format's name), when the mode is known: `_repack` (a module quantized, loaded, moved or given
another kernel: its own kernels, the input scale divided first for input-scaled algorithms, or off
the host the packed parameter's traced reader) and `FusedRows` (a member takes its columns of the
group's output: kernels/fused.py). A module whose kernels have no backward (`differentiable` False)
runs its path's `*_refusing_grad` twin, which sends an input that requires grad through
`inference_only` (the path, recorded so that a backward raises) and every other input down the
path; a differentiable module runs its path itself. No mode is decided per call.

Why a class, not a function held by each module: a compiled caller checks each module's class on
every call anyway, so the path costs it nothing more, where a function held by each module costs a
check of its code per module and call (docs/kernels.md#guards-on-a-compiled-caller). Paths are
module-level functions, not methods of the format: each method a forward looks up costs a compiled
caller a check. A variant is made at run time, so a module pickles as its format and `__setstate__`
installs its path again (QuantizedLinear.__reduce_ex__).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch

from autoao.kernels.tensors import needs_grad
from autoao.kernels.weight_only import PACKED_CALLS, packed_forward

if TYPE_CHECKING:
    from autoao.kernels._base import QuantizedLinear

Path = Callable[["QuantizedLinear", torch.Tensor], torch.Tensor]


def own(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [..., N]: the module's own kernels."""
    return m._forward(x)


def own_scaled(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """The module's own kernels on x / act_scale (AWQ, SmoothQuant: act_scale_rt [K] in the layer dtype)."""
    return m._forward(x / m.act_scale_rt.to(x.dtype))


def packed(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """A weight-only module packed into one parameter off the host (weight_only.py): traced code
    reads `_traced`, that parameter and the bias only (packed_forward); eager calls read the views
    kept for them (`_forward`). is_compiling() costs a compiled caller no guard."""
    if torch.compiler.is_compiling():
        return packed_forward(m, x, *PACKED_CALLS[m._traced])
    return m._forward(x)


# The forward of a module that is not `differentiable`: its path, or inference_only for an input
# that requires grad. One twin a path, not one function reading `_path`: a variant class per twin
# keeps the path out of what a compiled caller reads per call.
def own_refusing_grad(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    if needs_grad(x):
        return inference_only(m, x)
    return m._forward(x)


def own_scaled_refusing_grad(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    if needs_grad(x):
        return inference_only(m, x)
    return m._forward(x / m.act_scale_rt.to(x.dtype))


def packed_refusing_grad(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    if needs_grad(x):
        return inference_only(m, x)
    return packed(m, x)


# A path with no twin here refuses for itself where it must: fused.member's group module does.
REFUSING_GRAD: dict[Path, Path] = {own: own_refusing_grad, own_scaled: own_scaled_refusing_grad,
                                   packed: packed_refusing_grad}


def install(m: QuantizedLinear, path: Path) -> None:
    """Make `path` the module's forward (see the module docstring): `_path` set, and m's class the
    variant of its format running it (or its REFUSING_GRAD twin). `_path` is a plain attribute, set
    without nn.Module.__setattr__ (no parameter, buffer or submodule is involved)."""
    m.__dict__["_path"] = path
    forward = path if m.differentiable else REFUSING_GRAD.get(path, path)
    m.__class__ = variant(m.format_class(), forward)


# (format, forward) -> the variant class: classes, made once each, never instances or activations
VARIANTS: dict[tuple[type, Path], type] = {}


def variant(fmt: type[QuantizedLinear], forward: Path) -> type[QuantizedLinear]:
    """The subclass of format class `fmt` whose forward is `forward`, with fmt's name, module and
    docstring (repr, messages and reports name the format); `format_class()` gives fmt back."""
    cls = VARIANTS.get((fmt, forward))
    if cls is None:
        cls = VARIANTS[(fmt, forward)] = type(fmt.__name__, (fmt,), {
            "forward": forward, "_format": fmt, "__module__": fmt.__module__,
            "__qualname__": fmt.__qualname__, "__doc__": fmt.__doc__})
    return cls


# Fused groups (kernels/fused.py): group key -> the group's module. A member reaches its group
# through this one table, by the int it holds, not through an attribute of its own: two paths to
# one object cost a compiled caller an aliasing check (`q_proj._fused_unit is k_proj._fused_unit`)
# per sibling and call (docs/kernels.md#guards-on-a-compiled-caller). That int is the member's
# slot, its group's key (a multiple of GROUP_SLOTS) plus its index in the group: one value a
# compiled caller checks a member, not two. The table holds modules, never activations (what a
# member owes its siblings lives on the group's module); an entry leaves with its group (`owner`).
# Keys are per process: a copied or unpickled member registers its own group again
# (QuantizedLinear.__setstate__).
FUSED_UNITS: dict[int, QuantizedLinear] = {}
GROUP_SLOTS = 16  # the most members a group has


def fused_slot(unit: QuantizedLinear, owner: object, index: int) -> int:
    """The slot of the member at `index` of the group whose module is `unit`: the group's key in
    FUSED_UNITS plus `index` (the entry added on first use, removed when `owner`, the object every
    member of the group keeps alive, is collected)."""
    key = id(unit) * GROUP_SLOTS
    if FUSED_UNITS.get(key) is not unit:
        FUSED_UNITS[key] = unit
        weakref.finalize(owner, FUSED_UNITS.pop, key, None)
    return key + index


def own_path(m: QuantizedLinear) -> Path:
    """The path of a module that is not fused, from how it was packed."""
    if m._traced is not None:
        return packed
    return own_scaled if "act_scale_rt" in m._buffers else own


class _InferenceOnly(torch.autograd.Function):
    """y = m.forward(x) by m's own kernels (grad mode is off inside forward); a backward raises."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, m: QuantizedLinear) -> torch.Tensor:
        ctx.module = m
        # not m(x): its hooks ran for the call that brought us here; detached, so that the output is
        # no view made inside this function, which autograd would not let the caller modify in place
        return m._path(m, x).detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        m = ctx.module
        raise RuntimeError(
            f"autoao's {type(m).__name__}({m.extra_repr()}) has no backward: its kernels quantize the "
            "activations, and a gradient through that rounding would be wrong. autoao's modules are for "
            "inference: train the model before optimizing it, or give this layer a candidate that "
            "passes x's gradient (bf16, bf16_compute, the weight-only int8_wo / int4_wo / int4_sym / "
            "fp8_wo, sparse24).")


def inference_only(m: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """m(x) for an x that requires grad, where m is not `differentiable`: the output joins x's
    graph, as a real gradient's would, so that a backward through it raises (naming m) instead of
    skipping the layer or returning the gradient of a rounding; compiled callers too."""
    return _InferenceOnly.apply(x, m)
