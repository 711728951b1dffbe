"""A Llama-3-8B-shaped decoder stack with random weights, for speed benchmarks only.

dim 4096, 32 query / 8 key-value heads (GQA), SwiGLU hidden 14336, vocab 128256, RMSNorm, causal
SDPA; `n_layers` of the real model's 32 (8 by default, to keep memory and transfer small). No
rotary embedding and no KV cache: neither changes the linear layers' shapes, which is what the
benchmarks measure. Linear layers are named as in transformers' LlamaForCausalLM.

Presets: `LlamaShape()` (the above), `LlamaShape.smollm2()` (SmolLM2-135M's architecture, lm_head
tied to the embedding) and `LlamaShape.tiny()` (CPU smoke tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaShape:
    dim: int = 4096
    n_layers: int = 8
    n_heads: int = 32
    n_kv_heads: int = 8
    hidden: int = 14336
    vocab: int = 128256
    tie_embeddings: bool = False  # lm_head.weight *is* embed_tokens.weight (one tensor, as tie_word_embeddings)

    @classmethod
    def smollm2(cls) -> LlamaShape:
        """SmolLM2-135M: dim 576, 30 layers, 9 query / 3 key-value heads (head dim 64), SwiGLU 1536,
        vocab 49152, tied embeddings."""
        return cls(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, hidden=1536, vocab=49152, tie_embeddings=True)

    @classmethod
    def tiny(cls) -> LlamaShape:
        """A ~0.2 MB model for CPU smoke tests (tied, to exercise the tied-lm_head path)."""
        return cls(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden=128, vocab=256, tie_embeddings=True)


class Attention(nn.Module):
    def __init__(self, c: LlamaShape) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c.n_heads, c.n_kv_heads, c.dim // c.n_heads
        self.q_proj = nn.Linear(c.dim, c.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(c.dim, c.n_kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(c.dim, c.n_kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(c.n_heads * self.hd, c.dim, bias=False)

    def forward(self, x):  # x: [B, T, D]
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)  # [B, KV, T, hd]
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, H, T, hd]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: LlamaShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.dim, c.hidden, bias=False)
        self.up_proj = nn.Linear(c.dim, c.hidden, bias=False)
        self.down_proj = nn.Linear(c.hidden, c.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: LlamaShape) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c.dim)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = nn.RMSNorm(c.dim)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaStack(nn.Module):
    def __init__(self, c: LlamaShape = LlamaShape()) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = nn.RMSNorm(c.dim)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # [V, D] either way: one parameter, two users

    def forward(self, tokens):  # tokens: [B, T] int64 -> logits [B, T, V]
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def build(c: LlamaShape = LlamaShape(), device="cuda", dtype=torch.bfloat16, seed: int = 0) -> LlamaStack:
    """Random weights ~ N(0, 1/fan_in), made on the device directly (no CPU round trip).

    Embeddings ~ N(0, 1); a tied embedding ends up ~ N(0, 1/dim), as lm_head (a Linear, initialised
    after it) overwrites the shared tensor."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaStack(c).to(dtype)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0, m.in_features ** -0.5)
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0, 1.0)
    return model.eval()
