"""The GGUF candidates (kernels/gguf.py) compute what llama.cpp computes.

- weights: bit-exact with gguf-py's quantizer (which mirrors ggml's reference functions for the
  32-wide types) and, where llama.cpp's library is installed, with ggml's own `ggml_quantize_chunk`
  for every type, Q6_K included, ties included;
- activations: where ggml is installed, its `from_float` for Q8_0 / Q8_1 / Q8_K gives the same
  codes, scales and sums as `quantize_activations`, and its `vec_dot` the same dot products up to float32
  rounding and summation order (a relative 1e-5 of the summed magnitudes);
- the module against its reference in ggml's order (block_sums), save / load bit-exact, `supports`, emulation, and the
  default search space unchanged.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os

import numpy as np
import pytest
import torch

import autoao
from autoao import search_space
from autoao.kernels import gguf as kg
from autoao.types import LayerSpec

TYPES = list(kg.TYPES)


def weights(seed: int, n: int = 64, k: int = 512, ties: bool = False) -> torch.Tensor:
    torch.manual_seed(seed)
    w = (torch.randn(n, k) * 0.05).to(torch.bfloat16).float()
    w[0, :32] = 0  # an all-zero block: scale 0, codes 0
    return torch.round(w * 64) / 64 if ties else w


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("ties", [False, True], ids=["gaussian", "ties"])
def test_weights_match_gguf_py(type_name, ties):
    """gguf-py quantizes the 32-wide types as ggml does and dequantizes all of them."""
    gguf = pytest.importorskip("gguf")
    w = weights(0, ties=ties)
    ours = kg.quantize(w, type_name).numpy()
    qtype = gguf.GGMLQuantizationType[type_name.upper()]
    if kg.TYPES[type_name].block == 32:  # gguf-py has no K-quant quantizer (ggml's is checked below)
        assert np.array_equal(ours, gguf.quants.quantize(w.numpy(), qtype))
    back = gguf.quants.dequantize(ours, qtype)
    assert np.array_equal(kg.dequantize(torch.from_numpy(ours), type_name).numpy(), back.reshape(64, 512))


class _Traits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
                ("vec_dot", ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                             ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


@pytest.fixture(scope="module")
def ggml():
    """llama.cpp's ggml libraries (from the llama_cpp package), or a skip."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama.cpp's Python package is not installed (docs/serving.md)")
    lib = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_Traits)
    cpu.ggml_cpu_init()
    return base, cpu


@pytest.mark.parametrize("type_name", TYPES)
def test_weights_and_activations_match_ggml(ggml, type_name):
    base, cpu = ggml
    t = kg.TYPES[type_name]
    traits = cpu.ggml_get_type_traits_cpu(t.ggml_type).contents
    act = cpu.ggml_get_type_traits_cpu(traits.vec_dot_type).contents
    act_bytes = {"Q8_0": 34, "Q8_1": 36, "Q8_K": 292}[t.activation]  # per block of t.block inputs
    blocks_per_row = 512 // t.block
    for seed, ties in [(0, False), (1, True), (2, False)]:
        w = np.ascontiguousarray(weights(seed, ties=ties).numpy())
        blocks = np.zeros(64 * blocks_per_row * t.block_bytes, np.uint8)
        base.ggml_quantize_chunk(t.ggml_type, w.ctypes.data, blocks.ctypes.data, 0, 64, 512, None)
        ours = kg.quantize(torch.from_numpy(w), type_name).numpy().reshape(-1)
        assert np.array_equal(ours, blocks), (seed, ties)
        torch.manual_seed(seed)
        x = torch.randn(4, 512) * (1 + 3 * seed)
        x = torch.round(x * 4) / 4 if ties else x  # exact halves after scaling: the rounding rule shows
        q, d, s = kg.quantize_activations(x, with_sum=t.activation == "Q8_1", kind=t.activation)
        qw, dw, mw = kg.unpack(torch.from_numpy(blocks.reshape(64, -1)), type_name)
        ys = kg.block_matmul(q, d, s, kg.scaled(qw, dw), mw)  # [4, 64]
        for r in range(4):
            xr = np.ascontiguousarray(x[r].numpy())
            qx = np.zeros(blocks_per_row * act_bytes, np.uint8)
            act.from_float(xr.ctypes.data, qx.ctypes.data, 512)
            b = torch.from_numpy(qx).reshape(blocks_per_row, act_bytes)
            if t.activation == "Q8_K":  # float32 d, int8 q[256], int16 sums[16]
                codes, scales = b[:, 4:260], b[:, :4].contiguous().view(torch.float32).reshape(-1)
            else:  # fp16 d (and fp16 s for Q8_1), int8 q[32]
                start = 4 if t.activation == "Q8_1" else 2
                codes, scales = b[:, start:], b[:, :2].contiguous().view(torch.float16).float().reshape(-1)
            assert torch.equal(codes.contiguous().view(torch.int8).float(), q[r])
            assert torch.equal(scales, d[r])
            if s is not None:
                assert torch.equal(b[:, 2:4].contiguous().view(torch.float16).float().reshape(-1), s[r])
            for n in (0, 5, 63):
                row = np.ascontiguousarray(blocks.reshape(64, -1)[n])
                out = np.zeros(1, np.float32)
                traits.vec_dot(512, out.ctypes.data, 0, row.ctypes.data, 0, qx.ctypes.data, 0, 1)
                magnitude = float(((qw[n] * dw[n][:, None]) * (q[r] * d[r][:, None])).abs().sum()) + (
                    0.0 if mw is None else float((mw[n] * s[r]).abs().sum()))  # type: ignore[index]
                assert abs(float(ys[r, n]) - float(out[0])) <= 1e-5 * magnitude, (r, n)


def sqnr(ref: torch.Tensor, y: torch.Tensor) -> float:
    noise = (ref.double() - y.double()).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(ref.double().pow(2).sum() / noise))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_module_against_reference_float_and_bound(type_name, dtype):
    cand = search_space.get("gguf", type=type_name)
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=True).to(dtype)
    module = cand.build(lin, fqn="x")
    x = torch.randn(3, 5, 256, dtype=dtype)
    with torch.no_grad():
        y, ref, ideal = module(x), module.reference(x), lin(x).float()
    assert y.shape == (3, 5, 96) and y.dtype == dtype
    floor = 40 if dtype == torch.bfloat16 else 100  # the forward and ggml's order differ by rounding
    assert sqnr(ref, y.float()) > floor
    assert sqnr(ideal, y.float()) > cand.sqnr_bound_db
    assert cand.emulated("cpu") and cand.emulated("cuda") and "emulated" in cand.emulated("cpu")


def test_save_load_is_bit_exact_and_the_plan_names_the_type(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    plan = autoao.Plan.for_model(model, {"0": search_space.get("gguf(type=q4_1)"),
                                         "2": search_space.get("gguf(type=q4_0)")})
    autoao.apply(model, plan)
    autoao.save(model, tmp_path)
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    autoao.load(fresh, tmp_path)
    for i in ("0", "2"):
        assert torch.equal(fresh.get_submodule(i).canonical()["blocks"], model.get_submodule(i).canonical()["blocks"])
    x = torch.randn(2, 64)
    assert torch.equal(fresh(x), model(x))
    assert autoao.plan_of(fresh).layers["0"].name == "gguf(type=q4_1)"


def test_supports_names_and_default_space():
    q4 = search_space.get("gguf(type=q4_0)")
    assert q4.supports(LayerSpec("a", 576, 1536, False, torch.bfloat16), "cpu") is None
    assert "K=48 not a multiple of 32" in q4.supports(LayerSpec("a", 48, 64, False, torch.bfloat16), "cpu")
    assert q4.ggml_name == "Q4_0" and search_space.get(q4.name) == q4
    with pytest.raises(ValueError, match="type must be one of q8_0, q4_0, q4_1, q6_k"):
        search_space.get("gguf(type=q5_k)")
    q6 = search_space.get("gguf(type=q6_k)")
    assert "K=576 not a multiple of 256" in q6.supports(LayerSpec("a", 576, 1536, False, torch.bfloat16), "cpu")
    assert q6.supports(LayerSpec("a", 1536, 576, False, torch.bfloat16), "cpu") is None
    assert not q4.fusable
    assert all(c.family != "gguf" for c in search_space.all_candidates())
