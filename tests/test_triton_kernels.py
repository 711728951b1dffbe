"""Triton kernels against their plain-torch definitions, on CPU under TRITON_INTERPRET=1.

The interpreter is chosen when triton.jit decorates a function, so each check runs in a fresh
subprocess with the variable set before anything imports triton.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")


def run_interpreted(code: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_per_token_quant_int8_matches_torch():
    run_interpreted("""
        import torch
        from autoao.kernels.quant import quantize_int8_per_token
        from autoao.kernels.triton_quant import per_token_quant_triton
        torch.manual_seed(0)
        # K below, at and above one block (4096), odd K, a zero row, bf16 and fp32 inputs
        for m, k, dtype in [(3, 100, torch.float32), (2, 4096, torch.bfloat16), (2, 5000, torch.bfloat16)]:
            x = torch.randn(m, k, dtype=dtype) * 3
            x[0] = 0
            q, s = per_token_quant_triton(x, torch.int8)
            q_ref, s_ref = quantize_int8_per_token(x)
            assert q.dtype == torch.int8 and s.shape == (m, 1)
            assert torch.allclose(s, s_ref, rtol=1e-6, atol=0), (s, s_ref)
            # identical up to the rare value that sits on a rounding tie after x / s in fp32
            assert (q.int() - q_ref.int()).abs().max() <= 1
            assert (q != q_ref).float().mean() < 1e-3
            assert (q[0] == 0).all()
    """)


def test_per_token_quant_fp8_matches_torch():
    run_interpreted("""
        import torch
        from autoao.kernels.quant import FP8_DTYPE, quantize_fp8
        from autoao.kernels.triton_quant import per_token_quant_triton
        torch.manual_seed(0)
        x = torch.randn(4, 300, dtype=torch.bfloat16) * 5
        q, s = per_token_quant_triton(x, FP8_DTYPE)
        q_ref, s_ref = quantize_fp8(x, "row")
        assert q.dtype == FP8_DTYPE
        assert torch.allclose(s, s_ref, rtol=1e-6, atol=0)
        # Triton 3.x's *interpreter* converts fp32 -> e4m3 in software, dropping the carry when
        # rounding crosses a binade (124.35 -> 64 instead of 128) and breaking ties upwards; the GPU
        # converts in hardware (the CUDA tests check it there). So: equal everywhere
        # except those values, which are half the reference or one e4m3 step (3 mantissa bits) off.
        a, b = q.float(), q_ref.float()
        diff = a != b
        assert diff.float().mean() < 0.05
        step = 2.0 ** (torch.floor(torch.log2(b[diff].abs())) - 3)
        ok = (b[diff] == 2 * a[diff]) | ((a[diff] - b[diff]).abs() <= step)
        assert ok.all(), (a[diff][~ok], b[diff][~ok])
    """)


def test_scaled_epilogue_matches_torch():
    run_interpreted("""
        import torch
        from autoao.kernels.triton_quant import scaled_epilogue_triton
        torch.manual_seed(0)
        m, n = 37, 70
        xs = torch.rand(m, 1) + 0.01
        ws = torch.rand(n) + 0.01
        bias = torch.randn(n).to(torch.bfloat16)
        acc_int = torch.randint(-2**20, 2**20, (m, n), dtype=torch.int32)
        acc_t = torch.randn(n, m).to(torch.bfloat16).t()  # transposed view, as cuSPARSELt returns
        for acc, w, b in [(acc_int, ws, None), (acc_int, ws, bias), (acc_t, None, bias), (acc_t, ws, None)]:
            y = scaled_epilogue_triton(acc, xs, w, b, torch.bfloat16)
            ref = acc.float() * xs * (w if w is not None else 1) + (b.float() if b is not None else 0)
            assert y.dtype == torch.bfloat16 and y.shape == (m, n) and y.is_contiguous()
            assert torch.allclose(y.float(), ref.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)
    """)


def test_weight_only_gemv_kernels_match_dequantized_reference():
    # Every kernel on shapes no block divides (masks on N and K), M = 1 and a padded M = 3, in the
    # default configuration and in a split-K one (partials summed), against fp64 x @ w_dq^T.
    run_interpreted("""
        import torch
        from autoao.kernels.quant import (dequantize_int4_groupwise, pack_int4, quantize_int4_groupwise,
                                          quantize_int8_per_channel, quantize_fp8)
        from autoao.kernels import triton_gemv as tg
        torch.manual_seed(0)
        split = tg.Config(block_n=8, block_k=128, split_k=2, num_warps=4)
        def check(name, y, ref):
            assert y.shape == ref.shape and y.dtype == torch.bfloat16, (name, y.shape, y.dtype)
            err = ((y.double() - ref).norm() / ref.norm()).item()
            assert err < 6e-3, (name, err)  # bf16 output rounding is ~3e-3
        for n, k, g in [(24, 384, 128), (40, 320, 32), (8, 512, 64)]:
            w = torch.randn(n, k)
            for m in (1, 3):
                x = torch.randn(m, k).to(torch.bfloat16)
                q, s, z = quantize_int4_groupwise(w, g)
                ref = x.double() @ dequantize_int4_groupwise(q, s, z).double().t()
                check("int4", tg.int4_gemv_triton(x, pack_int4(q), s, z, g), ref)
                t4 = (pack_int4(q), s, z)
                check("int4 split", tg._finish(tg._launch("int4", x, t4, n, k, split, g), x.dtype), ref)
                # the words kernel needs K % BLOCK_K == 0 (no K masks); 384, 320 and 512 all take 64
                for words in (tg.Config(8, 64 if g <= 64 else 128, 1, 4, "words"),
                              tg.Config(8, 64 if g <= 64 else 128, 2, 4, "words")):
                    if tg.fits(words, k, g):
                        check(f"int4 {words}", tg._finish(tg._launch("int4", x, t4, n, k, words, g), x.dtype), ref)
                assert not tg.fits(tg.Config(8, 256, 1, 4, "words"), 320, 32)
                # the tensor-core kernel: K % BLOCK_K == 0 and groups >= 64 (384 and 512 take 128-wide
                # steps: one group of 128 or two of 64); 64-row tiles overhang N = 24 and 8, split 3 leaves
                # one split of 512 with two steps
                for mma in (tg.Config(64, 128, 1, 4, "mma"), tg.Config(16, 128, 3, 4, "mma")):
                    if tg.fits(mma, k, g):
                        check(f"int4 {mma}", tg._finish(tg._launch("int4", x, t4, n, k, mma, g), x.dtype), ref)
                assert not tg.fits(tg.Config(64, 128, 1, 4, "mma"), 512, 32)
                q8, s8 = quantize_int8_per_channel(w)
                s8 = s8.to(torch.bfloat16)
                ref = x.double() @ (q8.double() * s8.double()[:, None]).t()
                check("int8", tg.per_channel_gemv_triton(x, q8, s8), ref)
                t8 = (q8, s8)
                check("int8 split", tg._finish(tg._launch("int8", x, t8, n, k, split, 0), x.dtype), ref)
                wf, sf = quantize_fp8(w, "row")  # [N, K] e4m3, [N, 1] fp32
                sf = sf.reshape(-1)
                ref = x.double() @ (wf.double() * sf.double()[:, None]).t()
                check("fp8", tg.per_channel_gemv_triton(x, wf, sf), ref)
                check("fp8 split", tg._finish(tg._launch("fp8", x, (wf, sf), n, k, split, 0), x.dtype), ref)
        # the tensor-core kernel pads x to 16 rows, so it takes up to 16 (the other kernels: MAX_ROWS)
        x = torch.randn(16, 384).to(torch.bfloat16)
        q, s, z = quantize_int4_groupwise(torch.randn(24, 384), 128)
        ref = x.double() @ dequantize_int4_groupwise(q, s, z).double().t()
        y = tg._launch("int4", x, (pack_int4(q), s, z), 24, 384, tg.Config(64, 128, 1, 4, "mma"), 128)
        check("int4 mma M=16", y, ref)
        # the custom ops (what the modules call) give the same numbers, also under torch.compile
        x = torch.randn(2, 512).to(torch.bfloat16)
        w = torch.randn(8, 512)
        q, s, z = quantize_int4_groupwise(w, 64)
        direct = tg.int4_gemv_triton(x, pack_int4(q), s, z, 64)
        assert torch.equal(torch.ops.autoao.int4_gemv(x, pack_int4(q), s, z, 64), direct)
        q8, s8 = quantize_int8_per_channel(w)
        f = torch.compile(lambda x: torch.ops.autoao.per_channel_gemv(x, q8, s8), fullgraph=True)
        assert torch.equal(f(x), tg.per_channel_gemv_triton(x, q8, s8))
        # the weight-only modules' layout off the host: views of one packed buffer, made in the graph
        from autoao.kernels.weight_only import packed_buffer, packed_views
        for wq, sc in [(q8, s8.to(torch.bfloat16)), quantize_fp8(w, "row")]:
            sc = sc.reshape(-1)
            buf = packed_buffer(wq, sc, "cpu")
            dtypes = (wq.dtype, sc.dtype)
            g = torch.compile(lambda x, buf: torch.ops.autoao.per_channel_gemv(x, *packed_views(buf, 8, 512, *dtypes)),
                              fullgraph=True)
            assert torch.equal(g(x, buf), tg.per_channel_gemv_triton(x, wq, sc)), dtypes
        # what the kernels refuse, with the reason
        for bad, msg in [(lambda: tg.per_channel_gemv_triton(torch.randn(9, 64), torch.zeros(8, 64, dtype=torch.int8),
                                                      torch.ones(8)), "at most 8 rows"),
                         (lambda: tg.per_channel_gemv_triton(torch.randn(1, 60), torch.zeros(8, 64, dtype=torch.int8),
                                                      torch.ones(8)), "x must be [M, 64]"),
                         (lambda: tg.int4_gemv_triton(torch.randn(17, 256), torch.zeros(8, 128, dtype=torch.uint8),
                                                      torch.ones(8, 4), torch.ones(8, 4), 64), "at most 16 rows"),
                         (lambda: tg.int4_gemv_triton(torch.randn(9, 256), torch.zeros(8, 128, dtype=torch.uint8),
                                                      torch.ones(8, 8), torch.ones(8, 8), 32), "at most 8 rows")]:
            try:
                bad()
            except ValueError as e:
                assert msg in str(e), e
            else:
                raise AssertionError("no error for " + msg)
    """)


def test_weight_only_modules_take_their_triton_paths_correctly():
    # The modules' CUDA "triton" branches (GEMV for <= 8 rows, int4 <= 16; dequantize + matmul above), run on the
    # CPU through the interpreter by packing the Triton layout / enabling the GEMV by hand.
    run_interpreted("""
        import torch
        from autoao import search_space
        from autoao.kernels.quant import load_triton_ops
        assert load_triton_ops()
        torch.manual_seed(0)
        lin = torch.nn.Linear(256, 48, bias=True).to(torch.bfloat16)
        torch.nn.init.normal_(lin.bias, std=0.5)
        int4 = search_space.get("int4_wo", group_size=64).build(lin)
        int4._pack_canonical(torch.device("cpu"))  # what set_kernel("triton") packs on CUDA
        from autoao.kernels import triton_gemv as tg
        int4._gemv_rows = tg.int4_max_rows(256, 64)  # ditto: 16, the tensor-core kernel fits K=256, g64
        assert int4._gemv_rows == 16 and tg.int4_max_rows(256, 32) == 8 and tg.int4_max_rows(320, 64) == 8
        int8 = search_space.get("int8_wo").build(lin)
        fp8 = search_space.get("fp8_wo").build(lin)
        int8._gemv = fp8._gemv = True  # what _pack sets on CUDA
        # "tinygemm_dequant": the tiled kernel (here the CPU's) up to 8 rows, the dequantizing path above
        both = search_space.get("int4_wo", group_size=64).build(lin).set_kernel("tinygemm_dequant")
        both._pack_canonical(torch.device("cpu"))
        assert "w_packed" in both._buffers and "qweight_rt" in both._buffers
        tiled = []  # calls of the tiled int4 kernel, to see which path each module takes
        orig = torch._weight_int4pack_mm_for_cpu
        torch._weight_int4pack_mm_for_cpu = lambda *a: (tiled.append(a[0].shape[0]), orig(*a))[1]
        for mod in (int4, int8, fp8, both):
            # GEMV (1 and 6 rows); 12 rows: int4's tensor-core GEMV, the others' dequantizing path;
            # 20 rows: every module's dequantizing path
            for shape in [(1, 256), (2, 3, 256), (12, 256), (20, 256)]:
                x = torch.randn(*shape).to(torch.bfloat16)
                y, ref = mod(x), mod.reference(x)
                assert y.shape == ref.shape and y.dtype == torch.bfloat16, (type(mod).__name__, y.shape)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (type(mod).__name__, shape, err)
        assert tiled == [1, 6], tiled  # only "tinygemm_dequant" at <= 8 rows took the tiled kernel
    """)
