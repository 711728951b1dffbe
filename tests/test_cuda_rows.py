"""The one-launch weight-only kernel for a few rows (kernels/cuda_rows.py): where eager calls take
it, what they do without it, and (on a GPU) that it computes the dequantized product."""

from __future__ import annotations

import warnings

import pytest
import torch

from autoao import search_space
from autoao.kernels import cuda_rows, weight_only
from autoao.kernels.quant import FP8_DTYPE

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def dequantized(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The fp32 product the kernel rounds once to bf16: x @ (w_q * w_scale[:, None])^T."""
    return x.float() @ (w_q.float() * w_scale.float()[:, None]).t()


def int8_weights(n: int, k: int, device: str = "cpu", scale_dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(n * k)
    w_q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    return w_q.to(device), (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(device, scale_dtype)


def test_eager_calls_of_up_to_64_rows_take_the_rows_kernel_where_it_runs(monkeypatch):
    """Eagerly, the "triton" kernel's calls of up to 64 rows go to the rows kernel; where it
    declines (None) the GEMV answers up to 8 rows and the dequantizing path above; the dequantizing
    path takes the rest, the "dequant" kernel and every compiled call (compiled, the GEMV keeps 1-8
    rows)."""
    calls: list[tuple[str, int]] = []

    def fake_rows(x, w_q, w_scale):
        rows = x.numel() // x.shape[-1]
        calls.append(("rows", rows))
        return None if rows in (5, 33) else dequantized(x, w_q, w_scale).to(x.dtype)

    def fake_op(name, x, w_q, w_scale):
        calls.append((name, x.shape[0]))
        return dequantized(x, w_q, w_scale).to(x.dtype)

    monkeypatch.setattr(cuda_rows, "rows_linear", fake_rows)
    monkeypatch.setattr(weight_only, "call_op", fake_op)
    w_q, w_scale = int8_weights(48, 128)
    triton, split = (("triton", None),), (("triton", 16), ("dequant", None))

    def run(rows, route=triton, gemv=True):
        calls.clear()
        x = torch.randn(1, rows, 128).to(torch.bfloat16)
        y = weight_only.weight_only_forward(x, w_q, w_scale, None, route, gemv)
        ref = dequantized(x, w_q, w_scale)
        assert y.shape == (1, rows, 48) and ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
        return list(calls)

    assert run(1) == [("rows", 1)] and run(8) == [("rows", 8)]
    assert run(5) == [("rows", 5), ("per_channel_gemv", 5)]  # declined: the GEMV
    assert run(9) == [("rows", 9)]
    assert run(64) == [("rows", 64)]
    assert run(33) == [("rows", 33)]  # declined: the dequantizing path, no further call
    assert run(65) == []
    assert run(16, gemv=False) == []  # no Triton, or int8_wo's "dequant" kernel
    assert run(16, route=split) == [("rows", 16)] and run(17, route=split) == []
    for rows in (1, 16):  # autoao's kernels have no backward: x's gradient comes through the dequantized weight
        calls.clear()
        x = torch.randn(rows, 128).to(torch.bfloat16).requires_grad_()
        weight_only.weight_only_forward(x, w_q, w_scale, None, triton, True).float().sum().backward()
        want = (w_q.float() * w_scale.float()[:, None]).sum(0).expand(rows, -1)  # d(sum y)/dx: W's rows summed
        assert calls == [] and ((x.grad.float() - want).norm() / want.norm()).item() < 1e-2
    with torch.no_grad():  # nothing recorded: such an x takes the kernels
        calls.clear()
        weight_only.weight_only_forward(torch.randn(16, 128).to(torch.bfloat16).requires_grad_(), w_q, w_scale,
                                        None, triton, True)
        assert calls == [("rows", 16)]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert run(16) == []  # traced: the dequantizing path, which the compiler fuses
    assert run(8) == [("per_channel_gemv", 8)]  # and the GEMV, an op it keeps whole


def test_a_compiled_caller_over_prompt_lengths_is_not_recompiled_at_the_rows_kernels_bound():
    """Traced, the forward asks whether it is compiling before it compares the rows with the rows
    kernel's bound: with dynamic shapes, calls on both sides of 64 rows share one graph."""
    from torch._dynamo.testing import CompileCounter

    w_q, w_scale = int8_weights(48, 128)
    counter = CompileCounter()
    torch._dynamo.reset()
    f = torch.compile(lambda x: weight_only.weight_only_forward(x, w_q, w_scale, None, (("triton", None),), True),
                      backend=counter, dynamic=True)
    for rows in (16, 40, 70, 100):
        x = torch.randn(rows, 128).to(torch.bfloat16)
        ref = dequantized(x, w_q, w_scale)
        assert ((f(x).float() - ref).norm() / ref.norm()).item() < 1e-2
    assert counter.frame_count == 1


def test_a_gpu_without_the_kernel_keeps_the_dequantizing_path_and_says_why_once(monkeypatch):
    monkeypatch.setattr(cuda_rows, "_MISSING", {})
    monkeypatch.setattr(cuda_rows, "_LIBS", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    with pytest.warns(UserWarning, match="needs sm_80 or newer.*sm_75.*dequantizing path"):
        why = cuda_rows.prepare(torch.device("cuda", 0))
    assert "sm_75" in why
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cuda_rows.prepare(torch.device("cuda", 0)) == why  # said once
    x = torch.randn(16, 128).to(torch.bfloat16)
    assert cuda_rows.rows_linear(x, *int8_weights(48, 128)) is None  # no library for the device


@GPU
@pytest.mark.parametrize("qdtype,scale_dtype", [(torch.int8, torch.float32), (torch.int8, torch.bfloat16),
                                                (FP8_DTYPE, torch.float32)])
@pytest.mark.parametrize("n,k", [(16, 64), (192, 576), (576, 1536), (960, 576)])
def test_kernel_computes_the_dequantized_product_on_every_row_and_column(qdtype, scale_dtype, n, k):
    assert cuda_rows.prepare(torch.device("cuda")) is None
    w_q, w_scale = int8_weights(n, k, "cuda", scale_dtype)
    if qdtype == FP8_DTYPE:
        w_q = (torch.randn(n, k, device="cuda") * 100).clamp(-448, 448).to(FP8_DTYPE)
    for rows in (1, 8, 9, 31, 64):
        x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
        out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        assert cuda_rows.rows_linear(x, w_q, w_scale, out=out) is out
        ref = dequantized(x, w_q, w_scale)
        # one rounding of an fp32 sum: within bf16's half-ulp of the reference, plus the sum's order
        assert not out.isnan().any(), rows
        torch.testing.assert_close(out.float(), ref, rtol=8e-3, atol=1e-3 * ref.abs().max().item())


@GPU
def test_kernel_declines_what_it_cannot_run():
    assert cuda_rows.prepare(torch.device("cuda")) is None
    w_q, w_scale = int8_weights(48, 128, "cuda")
    x = torch.randn(16, 128, device="cuda").to(torch.bfloat16)
    assert cuda_rows.rows_linear(x, w_q, w_scale) is not None
    assert cuda_rows.rows_linear(x.half(), w_q, w_scale) is None  # fp16 activations
    assert cuda_rows.rows_linear(torch.randn(128, 16, device="cuda").to(torch.bfloat16).t(), w_q, w_scale) is None
    assert cuda_rows.rows_linear(x[:, :96], *int8_weights(48, 96, "cuda")) is None  # K % 64
    assert cuda_rows.rows_linear(x, w_q.float(), w_scale) is None
    assert cuda_rows.rows_linear(x.cpu(), w_q.cpu(), w_scale.cpu()) is None


@GPU
@pytest.mark.parametrize("name", ["int8_wo", "fp8_wo"])
def test_a_module_on_the_rows_kernel_is_captured_by_cuda_graphs(name):
    """Launched on torch's current stream, the kernel is recorded into a CUDA graph; a replay on new
    input gives the eager result."""
    lin = torch.nn.Linear(576, 192, bias=True).to("cuda", torch.bfloat16)
    m = search_space.get(name).build(lin)
    x = torch.randn(1, 32, 576, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        m(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = m(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y, m(x), rtol=0, atol=0)
        ref = m.reference(x)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
