"""The compute: quantize/pack primitives and the modules that replace nn.Linear.

Each module is a `QuantizedLinear`: canonical (portable) tensors in its state_dict, runtime tensors
packed for its device, a plain-torch `reference()` for tests, and `emulated` where the device has
no fast kernel for it. A family's alternative kernels are data (`KernelInfo`, kernels/routes.py).
Nothing here knows about search or reports.
"""

from __future__ import annotations

if __name__ != "autoao.kernels":  # the bare name from the checkout's root: the installed package's
    from autoao.common import step_aside

    step_aside(__name__, __file__)

from autoao.kernels import cpu_isa
from autoao.kernels._base import QuantizedLinear, as_linear, is_conv1d
from autoao.kernels.routes import KernelInfo, describe_route, parse_route, route_text
from autoao.kernels.dense import Bf16Linear, Fp32ComputeLinear
from autoao.kernels.fused import FusedRows, fuse_problem
from autoao.kernels.fp8 import Fp8DynLinear, Fp8WeightOnlyLinear
from autoao.kernels.int4 import Int4WeightOnlyLinear, link_prefetch
from autoao.kernels.int8 import Int8DynLinear, Int8WeightOnlyLinear
from autoao.kernels.sparse24 import Sparse24Fp8DynLinear, Sparse24Int8DynLinear, Sparse24Linear

__all__ = [
    "as_linear",
    "is_conv1d",
    "QuantizedLinear",
    "KernelInfo",
    "Bf16Linear",
    "Fp32ComputeLinear",
    "cpu_isa",
    "describe_route",
    "parse_route",
    "route_text",
    "Int8DynLinear",
    "Int8WeightOnlyLinear",
    "Int4WeightOnlyLinear",
    "Fp8DynLinear",
    "Fp8WeightOnlyLinear",
    "Sparse24Linear",
    "Sparse24Int8DynLinear",
    "Sparse24Fp8DynLinear",
    "FusedRows",
    "fuse_problem",
    "link_prefetch",
]
