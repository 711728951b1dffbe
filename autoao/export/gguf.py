"""GGUF files for llama.cpp: a llama-architecture model with each linear layer's GGUF type as planned.

Tensors and names are llama.cpp's (convert_hf_to_gguf.py's for LlamaForCausalLM):

    token_embd.weight                 the embedding, in the model's dtype (BF16 / F16 / F32)
    blk.{i}.attn_{q,k,v,output}       q and k rows permuted to llama.cpp's rotary layout
    blk.{i}.ffn_{gate,up,down}
    blk.{i}.attn_norm / ffn_norm      F32
    output_norm.weight                F32
    output.weight                     lm_head, unless it is the embedding itself (tied, unplanned)

A layer with a `gguf(type=...)` candidate is written as its module's canonical blocks, the very
bytes autoao computed with (q / k rows permuted, which moves whole rows of blocks); an unplanned
layer as its weight in the model's dtype. Metadata: the `llama.*` hyperparameters from the model's
config, and the tokenizer (`tokenizer.*`) and descriptive `general.*` keys copied from a source
GGUF where one is known (the built-in demo model's own file), so llama.cpp can tokenize; without
one the file says `tokenizer.ggml.model = "no_vocab"` and takes token ids only.

`read_check` reads the file back with gguf.GGUFReader and compares every tensor's type and bytes
with what the model holds; `llama_cpp_check` loads it with llama.cpp in a fresh process where the
`llama_cpp` package is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from autoao.kernels.gguf import TYPES, GgufLinear

FORMAT = "gguf"
FILE = "model.gguf"
_LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down"}
_COPIED_PREFIXES = ("tokenizer.", "general.name", "general.basename", "general.organization", "general.finetune",
                    "general.size_label", "general.license", "general.languages", "general.type")
_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def architecture_problems(model: nn.Module) -> list[str]:
    """Why `model` cannot be written as a llama.cpp "llama" GGUF, one line each; [] if it can."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "llama":
        kind = getattr(config, "model_type", type(model).__name__)
        return [f"  the model is {kind!r}; the GGUF export writes the llama architecture only"]
    problems = []
    scaling = getattr(config, "rope_scaling", None) or {}
    if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
        problems.append(f"  rope scaling {scaling.get('rope_type', scaling.get('type'))!r} is not written (llama.cpp "
                        "would need its rope_freqs tensor)")
    for fqn, m in model.named_modules():
        if isinstance(m, (nn.Linear, GgufLinear)) and getattr(m, "bias", None) is not None:
            problems.append(f"  {fqn}: has a bias, which the llama GGUF layout does not carry")
    if next(model.parameters()).dtype not in _DTYPES:
        problems.append(f"  model dtype {next(model.parameters()).dtype} has no GGUF tensor type")
    return problems


def _permute(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf's q / k permutation of the rows of `rows` [N, ...]: HF's rotate-half
    layout -> llama.cpp's interleaved pairs, per head."""
    n = rows.shape[0]
    return rows.reshape(n_head, 2, n // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def gguf_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor, str]]:
    """(name, tensor, GGUF type name) of every tensor the file holds, in llama.cpp's order: a
    quantized layer's tensor is its canonical blocks [N, row bytes] uint8; others are float."""
    config = model.config  # type: ignore[union-attr]
    dtype = next(model.parameters()).dtype
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    base = model.model  # type: ignore[union-attr]

    def linear(module: nn.Module, name: str) -> tuple[str, torch.Tensor, str]:
        if isinstance(module, GgufLinear):
            data, kind = module.layout().blocks.cpu(), TYPES[module.type].name
        else:
            data, kind = module.weight.detach().cpu(), _DTYPES[dtype]
        if name.endswith("attn_q"):
            data = _permute(data, heads)
        elif name.endswith("attn_k"):
            data = _permute(data, kv_heads)
        return f"{name}.weight", data, kind

    out = [("token_embd.weight", base.embed_tokens.weight.detach().cpu(), _DTYPES[dtype])]
    for i, layer in enumerate(base.layers):
        out.append((f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight.detach().float().cpu(), "F32"))
        for path, short in _LAYER_NAMES.items():
            out.append(linear(layer.get_submodule(path), f"blk.{i}.{short}"))
        out.append((f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight.detach().float().cpu(), "F32"))
    out.append(("output_norm.weight", base.norm.weight.detach().float().cpu(), "F32"))
    head = model.lm_head  # type: ignore[union-attr]
    tied = isinstance(head, nn.Linear) and head.weight.data_ptr() == base.embed_tokens.weight.data_ptr()
    if not tied:
        out.append(linear(head, "output"))
    return out


def _metadata(writer: Any, model: nn.Module, source: Path | None, file_type: int) -> None:
    """llama.* from the config; tokenizer.* and general.* from `source` (a GGUF file) if given."""
    import gguf

    config = model.config  # type: ignore[union-attr]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if source is None:
        writer.add_tokenizer_model("no_vocab")
        return
    reader = gguf.GGUFReader(source)
    for key, field in reader.fields.items():
        if key.startswith(_COPIED_PREFIXES):
            main = field.types[0]
            sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), main, sub)


def write(model: nn.Module, path: Path, source: Path | None = None) -> list[tuple[str, str]]:
    """Write the applied llama `model` as a GGUF file at `path` (the caller checked the plan and
    architecture_problems). source: a GGUF file whose tokenizer and descriptive metadata to copy.
    Returns (tensor name, GGUF type) in file order."""
    import gguf

    tensors = gguf_tensors(model)
    kinds = [k for _, _, k in tensors if k not in _DTYPES.values() and k != "F32"]
    common = max(set(kinds), key=kinds.count) if kinds else _DTYPES[next(model.parameters()).dtype]
    # gguf.LlamaFileType of the most common type (llama.cpp shows it; each tensor has its own type)
    file_type = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q6_K": 18, "BF16": 32}[common]
    writer = gguf.GGUFWriter(str(path), "llama")
    _metadata(writer, model, source, file_type)
    for name, data, kind in tensors:
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "BF16":  # numpy has no bfloat16: the raw 2-byte words
            writer.add_tensor(name, data.contiguous().view(torch.int16).numpy(), raw_shape=tuple(data.shape),
                              raw_dtype=qtype)
        elif kind in ("F32", "F16"):
            writer.add_tensor(name, data.numpy())
        else:  # blocks [N, row bytes] uint8: gguf derives the [N, K] shape from the type
            writer.add_tensor(name, data.numpy(), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [(n, k) for n, _, k in tensors]


def read_check(path: Path, model: nn.Module) -> list[str]:
    """Read `path` back (gguf.GGUFReader) and compare every tensor's type and bytes with what
    `model` holds; one line per difference, [] when the file is exactly the model."""
    import gguf

    reader = gguf.GGUFReader(path)
    stored = {t.name: t for t in reader.tensors}
    problems = []
    for name, data, kind in gguf_tensors(model):
        t = stored.pop(name, None)
        if t is None:
            problems.append(f"  {name}: missing from the file")
            continue
        if t.tensor_type.name != kind:
            problems.append(f"  {name}: planned {kind}, stored {t.tensor_type.name}")
            continue
        want = data.contiguous().view(torch.uint8).numpy().reshape(-1) if data.dtype != torch.uint8 \
            else data.numpy().reshape(-1)
        got = np.asarray(t.data).view(np.uint8).reshape(-1)
        if got.shape != want.shape or not np.array_equal(got, want):
            problems.append(f"  {name}: stored bytes differ from the model's ({kind})")
    problems += [f"  {name}: in the file but not in the model" for name in stored]
    return problems


_LLAMA_SCRIPT = r"""
import json, sys, llama_cpp
model = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False, vocab_only=False)
print("AUTOAO_LLAMA " + json.dumps({"n_vocab": model.n_vocab(), "n_embd": model.n_embd()}))
"""


def llama_cpp_check(path: Path, model: nn.Module, timeout: float = 300) -> list[str] | None:
    """Load `path` with llama.cpp (the `llama_cpp` package) in a fresh process and compare its
    vocabulary and width with `model`'s; None where llama.cpp is not installed, else problems."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    # cwd: as in compressed_tensors.reload_check, the working directory must not shadow packages
    run = subprocess.run([sys.executable, "-c", _LLAMA_SCRIPT, str(path)], capture_output=True, text=True,
                         timeout=timeout, cwd=path.parent)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("AUTOAO_LLAMA ")), None)
    if run.returncode != 0 or line is None:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return [f"llama.cpp could not load {path}: {' | '.join(tail)}"]
    got = json.loads(line.removeprefix("AUTOAO_LLAMA "))
    config = model.config  # type: ignore[union-attr]
    want = {"n_vocab": config.vocab_size, "n_embd": config.hidden_size}
    return [f"llama.cpp loaded {k}={got[k]}, the model has {v}" for k, v in want.items() if got[k] != v]
