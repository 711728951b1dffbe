"""cuSPARSELt dispatch (kernels/sparse24.py): which (algorithm, output layout) `cslt_mm` keeps.

The CPU has no cuSPARSELt, so torch._cslt_sparse_mm is replaced by a dense emulation with the same
contract (compressed W [N, K] @ dense B [K, M] -> [N, M], or [M, N] with transpose_result) and
the tuners' timer (autoao.clock.tuning_us) by a table of times: what is tested is the
choice, not the library.
"""

from __future__ import annotations

import pytest
import torch

from autoao.kernels import sparse24


@pytest.fixture
def fake_cslt(monkeypatch):
    """Three algorithms; alg 1 writes garbage when asked for a row-major result, alg 2 is slowest.
    Returns the list of (alg, transposed) calls the picker timed."""
    timed: list[tuple[int, bool]] = []
    times = {(0, False): 3.0, (0, True): 2.0, (1, False): 4.0, (1, True): 0.5, (2, False): 9.0, (2, True): 8.0}

    last: list[tuple[int, bool]] = []

    def cslt(w, xt, alpha=None, out_dtype=None, transpose_result=False, alg_id=0):
        last[:] = [(alg_id, transpose_result)]
        y = w.float() @ xt.float()  # [N, Mp]
        if alpha is not None:
            y = y * alpha[:, None]
        if transpose_result:
            y = y.t().contiguous() + (100.0 if alg_id == 1 else 0.0)  # alg 1: fast and wrong
        return y.to(out_dtype or xt.dtype)

    def tuning_us(fn):  # the way fn launches, and its made-up time
        fn()
        timed.append(last[0])
        return times[last[0]]

    from autoao import clock

    monkeypatch.setattr(torch, "_cslt_sparse_mm", cslt)
    monkeypatch.setattr(clock, "tuning_us", tuning_us)
    monkeypatch.setattr(sparse24, "_alg_count", lambda: 3)
    monkeypatch.setattr(sparse24, "_ALG", {})
    return timed


def test_cslt_mm_keeps_the_fastest_way_that_gives_the_same_numbers_row_major(fake_cslt):
    torch.manual_seed(0)
    w = torch.randn(24, 64)  # stands in for the compressed weight
    x = torch.randn(16, 64)  # [Mp, K]
    y = torch.ops.autoao.cslt_mm(w, x, None, torch.float32, 24)
    # alg 1 transposed is the fastest but wrong: rejected; alg 0 transposed is next
    assert sparse24._ALG[next(iter(sparse24._ALG))] == (0, True)
    assert set(fake_cslt) == {(0, True), (0, False), (1, False), (2, True), (2, False)}
    assert y.shape == (16, 24) and y.is_contiguous()  # [Mp, N] row-major, as the fake says
    torch.testing.assert_close(y, x @ w.t())
    # the choice is cached per problem: a second call times nothing
    fake_cslt.clear()
    torch.ops.autoao.cslt_mm(w, x, None, torch.float32, 24)
    assert fake_cslt == []


def test_cslt_linear_slices_the_padded_rows_and_takes_strided_inputs(fake_cslt):
    torch.manual_seed(0)
    w, alpha = torch.randn(24, 64), torch.rand(24) + 0.5
    x = torch.randn(64, 5).t()  # [5, 64], column-major: the op fixes the layout itself
    y = sparse24._cslt_linear(w, x, alpha, torch.float32, 24)
    assert y.shape == (5, 24) and y.is_contiguous()
    torch.testing.assert_close(y, (x @ w.t()) * alpha)


def test_cslt_mm_fake_gives_the_row_major_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w_c = torch.empty(24 * 64 * 9 // 16, dtype=torch.int8)  # a compressed buffer: 1-D, any length
        y = torch.ops.autoao.cslt_mm(w_c, torch.empty(32, 64, dtype=torch.int8), None, torch.bfloat16, 24)
    assert y.shape == (32, 24) and y.dtype == torch.bfloat16
