"""autoao's custom ops, called the cheap way in eager mode.

    y = call_op("int4_gemv", x, qweight, scales, zeros, group_size)

Each kernel autoao launches itself is a torch custom op (torch.ops.autoao.<name>, registered in
the module that defines it, with EAGER[name] = the function it wraps), so torch.compile keeps it
one opaque node and CUDA graphs capture it. A leaf module: kernels import it, it imports none.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# Custom op name (torch.ops.autoao.<name>) -> the function it wraps, registered beside each op. A
# custom op keeps a kernel one opaque node for torch.compile, but in eager mode its Python dispatch
# costs 10-35 us a call (measured for kernels/cpu_int8.py's op), as much as a decode step's whole
# GEMV: a 1B-shaped Llama decoding eagerly calls 113 of them a token (its plan ran 0.81x bf16 in
# eager generate() where the compiled forward ran 1.88x: docs/kernels.md#eager-calls-the-hosts-share).
EAGER: dict[str, Callable[..., Any]] = {}


# Launch geometry on the host, in plain int arithmetic: triton.cdiv and triton.next_power_of_2 are
# ConstexprFunctions, 1.8 us a call from Python (docs/kernels.md#eager-calls-the-hosts-share), and an eager GEMV made three
# of them a call, on each of a decoding model's 211 layers a token.
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def call_op(name: str, *args: Any) -> Any:
    """torch.ops.autoao.<name>(*args) while torch.compile traces; otherwise the function the op
    wraps (EAGER[name]): the same kernel, without the custom op's dispatch."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.autoao, name)(*args)
    return EAGER[name](*args)
