"""The roofline the benchmarks compare kernels against: a device's measured peak copy bandwidth.

    from bandwidth import copy_bandwidth     # from a script in benchmarks/ (benchmarks/lib/ on sys.path)
"""

from __future__ import annotations

import torch

from autoao.evaluators.timing import time_cpu, time_cuda


def copy_bandwidth(device: torch.device | str, nbytes: int | None = None) -> float:
    """Measured peak memory bandwidth of `device` in bytes/s: (bytes read + written) by one large
    copy_ over its median time (default 1 GiB on CUDA, timed with events and no L2 flush; 64 MiB
    with wall clocks on the CPU)."""
    device = torch.device(device)
    n = nbytes or (2**30 if device.type == "cuda" else 2**26)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        med, *_ = time_cuda(lambda: dst.copy_(src), reps=20, graph=False, flush_l2=False)
    else:
        med, *_ = time_cpu(lambda: dst.copy_(src), reps=10)
    return 2 * n / (med * 1e-6)
