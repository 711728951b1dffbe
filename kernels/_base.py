"""The contract every quantized replacement of nn.Linear follows.

A `QuantizedLinear` holds its weights twice-named but once-stored where it can:

- *canonical* tensors (host memory, device-independent, e.g. int4 values nibble-packed [N, K/2]):
  they are what `state_dict()` holds, so save/load is bit-exact and a model saved on a GPU loads
  on a CPU;
- *runtime* tensors (non-persistent buffers on the module's device, in the kernel's layout, e.g.
  tinygemm's tiled int4 or cuSPARSELt's compressed 2:4; the weight-only formats' packed tensor is a
  parameter left out of state_dict: weight_only.py): what `forward` reads. Where the layout is
  the canonical one and the canonical tensors are on the module's device, the runtime buffers
  alias them.

Modules built inside `canonical_on_device()` keep their canonical tensors on their own device
instead: the search's short-lived modules (timing, layer errors, trials), which are never saved,
skip a device->host copy of every weight they quantize (on a datacenter GPU, pageable copies of
freshly allocated host memory took ~50 s of a 290 s llama8 search:
docs/measuring.md#where-a-searchs-time-goes).

Moving the module (`.to(device)`, `.cuda()`) re-packs the runtime tensors from the canonical ones
for the new device, so a layout never ends up on a device whose kernel cannot read it. Dtype casts
(`.half()`) do not change quantized numbers: forward returns the dtype of its input.
"""

from __future__ import annotations

import contextlib
import contextvars
from abc import abstractmethod
from typing import Any, Iterator

import torch
from torch import nn

from autoao.calibration import LayerStats
from autoao.common import is_conv1d  # noqa: F401  (re-exported)
from autoao.kernels.algorithms import INPUT_SCALED, USES, check_algorithm
from autoao.kernels.routes import (
    KernelInfo,
    Route,
    kernel_names,
    kernels_on,
    parse_route,
    route_kernel,
    route_problem,
    route_text,
)
from autoao.kernels.forwards import fused_slot, install, own, own_path
from autoao.kernels.layouts import Dense, Layout, PerChannel, layout_of
from autoao.kernels.weight_only import PACKED, packed_call_key

CanonicalSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]

_CANONICAL_ON_DEVICE = contextvars.ContextVar("autoao_canonical_on_device", default=False)


def as_linear(module: nn.Module) -> nn.Linear:
    """`module` itself when it is an nn.Linear; a Conv1D as the nn.Linear computing the same (its
    weight [K, N] transposed into [N, K], its bias shared), for candidates to quantize."""
    if not is_conv1d(module):
        return module  # type: ignore[return-value]
    k, n = module.weight.shape
    linear = nn.Linear(k, n, bias=module.bias is not None, device="meta")
    linear.weight = nn.Parameter(module.weight.detach().t().contiguous(), requires_grad=False)
    if module.bias is not None:
        linear.bias = module.bias
    return linear


@contextlib.contextmanager
def canonical_on_device() -> Iterator[None]:
    """Within this block, QuantizedLinear modules constructed or given canonical tensors
    (from_linear, set_canonical, load_state_dict) keep those tensors on the module's device, not
    in host memory (module docstring): for modules that only live to be measured. They still run,
    move and save correctly; their state_dict then holds device tensors. The cost is device
    memory where the runtime layout is not the canonical one (int4's tiled layouts, cuSPARSELt's
    compressed 2:4): both are held there."""
    token = _CANONICAL_ON_DEVICE.set(True)
    try:
        yield
    finally:
        _CANONICAL_ON_DEVICE.reset(token)


class QuantizedLinear(nn.Module):
    """Base class of the modules that replace nn.Linear.

    Subclasses set their parameters after `super().__init__` and then call `_init_canonical()`.
    They implement:
      - `canonical_spec()`: name -> (shape, dtype) of every canonical tensor;
      - `_pack(device)`: build runtime buffers on `device` from `self._canon`;
      - `_forward(x)`: x [..., K] -> [..., N] in x.dtype, bias added. They do not write `forward`:
        each module's class is the variant of its format whose forward is the path installed when
        it is packed or fused (kernels/forwards.py): `_forward` (on x / act_scale for input-scaled
        algorithms), the packed parameter's reader when traced off the host, or a fused member's
        columns of its group's output (kernels/fused.py); an input that requires grad through
        inference_only where the module is not `differentiable`;
      - `reference(x)`: the same function with plain float32 torch ops (for tests);
      - `params()`: the constructor keyword arguments beyond the common ones.
    Class attribute `emulated_on` lists device types with no fast kernel (forward then runs a
    reference path that computes the same numbers, and is never reported as a speed-up).
    Class attribute `calibration_uses` names the calibration statistics (autoao.calibration)
    `quantize` reads when they are given (an instance adds its algorithm's).

    Class attribute `algorithms` lists the quantization algorithms (kernels/algorithms.py) the
    class takes as its `algorithm` parameter (first: "rtn", round-to-nearest). An algorithm changes
    the stored numbers, not the kernels; those in algorithms.INPUT_SCALED also store an `act_scale`
    [K] float32 canonical tensor and `forward` divides its input by it before the kernels run.

    A family with several implementations of the same numbers (other code, other speed) declares
    them as data: `declared_kernels(**params)` returns their `KernelInfo` records (kernels/routes.py;
    default: none, one kernel "default" everywhere). `self.kernel` is what forward uses: one kernel,
    or a route (`parse_route`: "int8pack<=16,dequant", a kernel per range of rows, all reading one
    runtime layout); `set_kernel()` switches it (re-packing the runtime layout), `_pack` lays out
    what `self.uses(kernel)` needs and `_forward` runs `self.kernel_at(rows)` (read as
    `route_kernel(self._route, rows)`: docs/kernels.md#guards-on-a-compiled-caller). The timing
    harness times each kernel at each token count and the plan records the winner per layer (it is
    not part of the candidate: same numbers, other speed). A kernel of another device type is not
    an error: on a device it does not run on, the module runs that device's default kernel (a plan
    made on a GPU applies on a CPU).
    """

    emulated_on: frozenset[str] = frozenset()
    # runtime tensors held as plain attributes (views of a runtime buffer): drop_runtime drops them
    runtime_views: tuple[str, ...] = ()
    calibration_uses: frozenset[str] = frozenset()
    algorithms: tuple[str, ...] = ("rtn",)
    # True where each output row's canonical numbers depend on that row of the float weight alone
    # (per-channel / group-wise scales, 2:4 within a row): sibling layers can then run as one module
    # on their row-concatenated canonical tensors with the same numbers (kernels/fused.py).
    rows_independent: bool = False
    # True where an input that requires grad gets its true gradient (the weight dequantized into
    # F.linear, whose backward autograd knows). False where the kernels quantize the activations
    # or have no backward: the module then runs its kernels without recording, and a backward
    # through it raises (inference_only) rather than hand back a gradient that is silently wrong.
    differentiable: bool = False
    layout_type: type[Layout] = Dense  # the typed record of its canonical tensors (kernels/layouts.py)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype  # the dtype of the nn.Linear this replaced (its input/output dtype)
        device = torch.device(device or "cpu")
        # Tracks the device the runtime tensors live on, also for bias-free layers.
        self.register_buffer("_device_anchor", torch.empty(0, device=device), persistent=False)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._canon: dict[str, torch.Tensor] = {}
        self.kernel = ""  # one kernel or a route (parse_route); _init_canonical sets the default
        self._route: Route = ()  # the route forward follows on this device (_route_on)
        self.algorithm = "rtn"  # subclasses taking an algorithm set it with _set_algorithm
        # Set by kernels.fused.FusedRows when this layer runs as part of one module with its
        # siblings: (the group, this layer's index in it), not a submodule (no state_dict entry).
        self.fused: tuple[Any, int] | None = None
        # Set by pack_weight_only off the host: the key of PACKED_CALLS' entry holding what
        # packed_forward needs beside the packed parameter (that entry is also `_packed_call`, from
        # which a module unpickled in another process gets its key there); None elsewhere.
        self._traced: int | None = None
        install(self, own)  # forward's path (kernels/forwards.py): _repack and FusedRows set it

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickled (and deep-copied) as its format class, which pickle finds by name, not as the
        # variant made at run time (kernels/forwards.py); __setstate__ installs the path again
        _, _, *rest = super().__reduce_ex__(protocol)  # (copyreg.__newobj__, (variant,), state, ...)
        return (object.__new__, (self.format_class(),), *rest)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.__dict__.get("_traced") is not None:  # PACKED_CALLS' keys are per process: re-key
            self._traced = packed_call_key(self._packed_call)
        if self.fused is not None:  # and FUSED_UNITS' (this copy's group, not the original's)
            self.__dict__["_fused_slot"] = fused_slot(self._fused_unit, *self.fused)
        install(self, self._path)

    @classmethod
    def format_class(cls) -> type[QuantizedLinear]:
        """The format class this class is: itself, or the one a forward variant was made from
        (kernels/forwards.py)."""
        return cls.__dict__.get("_format", cls)

    def _set_algorithm(self, algorithm: str) -> None:
        """Subclasses taking an `algorithm` parameter call this in __init__ (before
        _init_canonical); raises ValueError naming the choices for one the class does not take."""
        check_algorithm(algorithm, self.algorithms, type(self).__name__)
        self.algorithm = algorithm
        self.calibration_uses = type(self).calibration_uses | USES[algorithm]

    @property
    def input_scaled(self) -> bool:
        """Whether forward divides its input by the canonical per-channel `act_scale` (AWQ, SmoothQuant)."""
        return self.algorithm in INPUT_SCALED

    def _input_scale_spec(self) -> CanonicalSpec:
        """The `act_scale` entry of canonical_spec() for input-scaled algorithms, else nothing."""
        return {"act_scale": ((self.in_features,), torch.float32)} if self.input_scaled else {}

    def _scale_input_reference(self, x: torch.Tensor) -> torch.Tensor:
        """x / act_scale in float32 for `reference`, else x.float()."""
        if "act_scale" not in self._canon:
            return x.float()
        return x.float() / self._canon["act_scale"].to(x.device)

    def _init_canonical(self) -> None:
        """Subclasses call this at the end of __init__, once their parameters are set: zero
        canonical tensors of the right shapes (overwritten by quantize or load_state_dict)."""
        self.kernel = self.kernel or self._kernels_on(self.device.type)[0].name
        home = self._canonical_home()
        self._canon = {name: torch.zeros(shape, dtype=dt, device=home)
                       for name, (shape, dt) in self.canonical_spec().items()}
        if "act_scale" in self._canon:
            self._canon["act_scale"].fill_(1.0)  # an unloaded module must not divide by zeros
        self._repack(self.device)

    def _canonical_home(self) -> torch.device:
        """Where new canonical tensors go: the host, or the module's device inside canonical_on_device()."""
        return self.device if _CANONICAL_ON_DEVICE.get() else torch.device("cpu")

    # ---- contract ------------------------------------------------------------------------------
    @abstractmethod
    def canonical_spec(self) -> CanonicalSpec: ...

    @abstractmethod
    def _pack(self, device: torch.device) -> None: ...

    @abstractmethod
    def reference(self, x: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def quantize(self, weight: torch.Tensor, stats: LayerStats | None = None) -> dict[str, torch.Tensor]:
        """weight [N, K] (the float weight) -> canonical tensors. stats: the layer's calibration
        statistics; a module reads only those in `calibration_uses`, and quantizes without
        calibration when they are absent."""

    def params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def fusable(cls, **params: Any) -> bool:
        """Whether modules of this class built with `params` can be fused with siblings (every
        canonical tensor one row per output channel, each row independent of the others; an input
        scale [K] is not)."""
        return cls.rows_independent and params.get("algorithm", "rtn") not in INPUT_SCALED

    @abstractmethod
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x.dtype, bias added: this layer's own kernels."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, stats: LayerStats | None = None, **params: Any):
        """Quantize an nn.Linear into a new module of this class on the linear's device, using the
        layer's calibration statistics where the class uses them."""
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, w.dtype, w.device, **params)
        m.set_canonical(m.quantize(w, stats))
        if linear.bias is not None:
            m.bias.data.copy_(linear.bias.detach())
        return m

    @classmethod
    def declared_kernels(cls, **params: Any) -> tuple[KernelInfo, ...]:
        """The kernels that compute this format's numbers for modules built with `params`, as data
        (kernels/routes.py: name, device type, layout, launch options, timing hints), each device
        type's in order of preference. Default: none (one kernel, "default", on every device)."""
        return ()

    # ---- shared machinery ----------------------------------------------------------------------
    def _kernels_on(self, device_type: str) -> tuple[KernelInfo, ...]:
        """This module's kernels on `device_type`, its default first (kernels_on)."""
        return kernels_on(self.declared_kernels(**self.params()), device_type)

    def _route_on(self, device_type: str) -> Route:
        """The route forward follows on `device_type`: `self.kernel`'s, or the device's default
        kernel where one of its kernels does not run there."""
        route = parse_route(self.kernel)
        here = [info.name for info in self._kernels_on(device_type)]
        if all(k in here for k, _ in route):
            return route
        return ((here[0], None),)

    def kernel_at(self, rows: int) -> str:
        """The kernel this module runs for a call with `rows` rows (tokens)."""
        return route_kernel(self._route, rows)

    def uses(self, kernel: str) -> bool:
        """Whether any row count runs `kernel` on this device (what _pack must lay out)."""
        return any(k == kernel for k, _ in self._route)

    def _repack(self, device: torch.device) -> None:
        """The route this device follows, _pack, then the input scale's runtime copy (act_scale_rt
        [K] in the layer dtype: bf16 values, exact in it) where there is one."""
        self._route = self._route_on(device.type)
        self._pack(device)
        if "act_scale" in self._canon:
            self.register_buffer("act_scale_rt", self._canon["act_scale"].to(device, self.dtype), persistent=False)
        install(self, own_path(self))

    def set_kernel(self, kernel: str) -> QuantizedLinear:
        """Use `kernel` (one of the declared kernels of any device type, or a route of them:
        parse_route); re-packs the runtime tensors. Raises ValueError naming the choices (and the
        closest one) for an unknown name, a bad route, or a route over kernels that read different
        layouts (route_problem)."""
        problem = route_problem(kernel, self.declared_kernels(**self.params()))
        if problem:
            raise ValueError(f"{type(self).__name__} has {problem}")
        kernel = route_text(parse_route(kernel))
        if self.fused is not None:
            self.fused[0].set_kernel(kernel)
        elif kernel != self.kernel:
            self.kernel = kernel
            self._repack(self.device)
        return self

    @property
    def device(self) -> torch.device:
        return self._device_anchor.device

    @property
    def emulated(self) -> bool:
        """True when this module runs a reference path on its device (no fast kernel there)."""
        return self.device.type in self.emulated_on

    def canonical(self) -> dict[str, torch.Tensor]:
        """The canonical tensors (on the host; on the module's device if it was built inside
        canonical_on_device()). Do not modify them in place."""
        return dict(self._canon)

    def layout(self) -> Layout:
        """The canonical tensors as their typed record (`layout_type`), for writers."""
        return layout_of(self.layout_type, self._canon)

    def set_canonical(self, tensors: dict[str, torch.Tensor]) -> None:
        """Replace the canonical tensors (checked against canonical_spec) and re-pack."""
        problems = []
        for name, (shape, dt) in self.canonical_spec().items():
            t = tensors.get(name)
            if t is None:
                problems.append(f"missing tensor {name!r}")
            elif tuple(t.shape) != shape or t.dtype != dt:
                problems.append(f"{name!r}: expected {shape} {dt}, got {tuple(t.shape)} {t.dtype}")
        if problems:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(problems))
        if self.fused is not None:  # our canonical tensors are rows of the group's: write through
            for name in self.canonical_spec():
                self._canon[name].copy_(tensors[name].detach())
            self.fused[0].repack()
            return
        # Own, freshly allocated copies: tensors loaded from safetensors may be unaligned views of
        # a memory-mapped file, which some CPU kernels (torch._weight_int8pack_mm) crash on.
        home = self._canonical_home()
        self._canon = {name: tensors[name].detach().to(home, copy=True).contiguous()
                       for name in self.canonical_spec()}
        self._repack(self.device)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        super()._apply(fn, recurse)
        if not self._canon:  # still inside __init__
            return self
        if self.fused is not None:  # the group's module holds the runtime tensors; the first moves it
            group, index = self.fused
            if index == 0:
                group.module._apply(fn, recurse)
            return self
        # Runtime layouts are device-specific (tinygemm, cuSPARSELt): rebuild them where we landed.
        self._repack(self._device_anchor.device)
        return self

    def drop_runtime(self) -> None:
        """Free the runtime tensors (before packing another kernel's layout; a fused layer's
        kernels run on the group's module): the non-persistent buffers, the packed parameter
        (PACKED) and the views of them held as plain attributes (`runtime_views`)."""
        for name in list(self._buffers):
            if name != "_device_anchor" and name in self._non_persistent_buffers_set:
                del self._buffers[name]
                self._non_persistent_buffers_set.discard(name)
        for name in self.runtime_views:
            self.__dict__.pop(name, None)
        self._parameters.pop(PACKED, None)
        self.__dict__.pop("_packed_call", None)
        self._traced = None

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[override]
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + PACKED, None)  # runtime, rebuilt from the canonical tensors
        for name, t in self._canon.items():
            destination[prefix + name] = t

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):  # type: ignore[override]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        missing_keys[:] = [k for k in missing_keys if k != prefix + PACKED]
        ours = {prefix + name for name in self.canonical_spec()}
        unexpected_keys[:] = [k for k in unexpected_keys if k not in ours]
        found = {}
        for name, (shape, dt) in self.canonical_spec().items():
            t = state_dict.get(prefix + name)
            if t is None:
                missing_keys.append(prefix + name)
            elif tuple(t.shape) != shape or t.dtype != dt:
                error_msgs.append(f"{prefix + name}: expected {shape} {dt}, got {tuple(t.shape)} {t.dtype}")
            else:
                found[name] = t
        if len(found) == len(ours):
            self.set_canonical(found)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params().items())
        several = len(kernel_names(self.declared_kernels(**self.params()))) > 1
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, dtype={self.dtype}{extra}, emulated={self.emulated}"
                + (f", kernel={self.kernel}" if several else "")
                + (f", fused={self.fused[1]}/{len(self.fused[0].splits)}" if self.fused is not None else ""))


class PerChannelWeights(QuantizedLinear):
    """Base of the formats whose canonical tensors are qweight [N, K] in `qdtype` and scale [N]
    float32 (w ~ qweight * scale[:, None], symmetric per output channel: int8, fp8 weight-only),
    plus act_scale [K] float32 for input-scaled algorithms. Subclasses set `qdtype` and implement
    quantize, _pack and _forward."""

    rows_independent = True
    layout_type = PerChannel
    qdtype: torch.dtype

    def __init__(self, in_features, out_features, bias, dtype, device=None, algorithm: str = "rtn"):
        super().__init__(in_features, out_features, bias, dtype, device)
        self._set_algorithm(algorithm)
        self._init_canonical()

    def params(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm} if self.algorithm != "rtn" else {}

    def canonical_spec(self) -> CanonicalSpec:
        n, k = self.out_features, self.in_features
        return {"qweight": ((n, k), self.qdtype), "scale": ((n,), torch.float32), **self._input_scale_spec()}
