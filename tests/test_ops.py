"""autoao's custom ops are called through `call_op`: the custom op while torch.compile traces (one
opaque node), the function it wraps in eager mode (no custom-op dispatch per call); every op a
kernel module registers has its eager function."""

from __future__ import annotations

import pytest
import torch

from autoao.kernels.ops import EAGER, call_op

CALLS: list[str] = []


def _plus_one(x: torch.Tensor) -> torch.Tensor:
    CALLS.append("function")
    return x + 1


@torch.library.custom_op("autoao::_test_plus_one", mutates_args=())
def _plus_one_op(x: torch.Tensor) -> torch.Tensor:
    CALLS.append("op")
    return _plus_one(x)


@_plus_one_op.register_fake
def _(x):
    return torch.empty_like(x)


EAGER["_test_plus_one"] = _plus_one


def test_eager_calls_the_function_and_compile_keeps_the_op():
    x = torch.arange(4.0)
    CALLS.clear()
    assert torch.equal(call_op("_test_plus_one", x), x + 1)
    assert CALLS == ["function"]  # no custom-op dispatch in eager mode
    CALLS.clear()
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: call_op("_test_plus_one", t) * 2, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), (x + 1) * 2)
    assert CALLS == ["op", "function"]  # traced as the op


def test_every_registered_op_has_its_eager_function():
    pytest.importorskip("triton")
    from autoao.kernels import cuda_int4, quant, sparse24  # noqa: F401  (register their ops)

    assert quant.load_triton_ops()
    for name in ("int4_gemv", "per_channel_gemv", "per_token_quant", "scaled_epilogue", "int4_gemv_cuda",
                 "int4_dequant_cuda", "cslt_mm"):
        assert hasattr(torch.ops.autoao, name) and callable(EAGER[name]), name


def test_the_host_geometry_helpers_agree_with_tritons():
    """kernels.ops.cdiv / next_pow2 replace triton.cdiv / next_power_of_2 (slow ConstexprFunctions
    when called from Python) in the eager launch paths: the same numbers for every size used."""
    triton = pytest.importorskip("triton")
    from autoao.kernels.ops import cdiv, next_pow2

    for n in range(1, 9000):
        assert next_pow2(n) == triton.next_power_of_2(n), n
    for a in range(1, 5000, 3):
        for b in (1, 3, 16, 64, 128, 1024):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
