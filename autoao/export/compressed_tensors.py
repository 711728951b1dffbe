"""compressed-tensors checkpoints: what vLLM, SGLang and transformers load, with autoao's own codes.

One config group per scheme, its `targets` the exact layer names, its `format` the scheme's own;
with several formats the top-level format is "mixed-precision". Layers a plan leaves as they came
are listed in `ignore` and stored in the model's dtype. Each scheme holds autoao's canonical
tensors unchanged (never re-quantized from float weights: compressed-tensors' own quantizer would
flip codes at rounding ties and pick other scales):

    candidate                   scheme              format           tensors per layer
    int4_sym (g 32/64/128;      W4A16, symmetric    pack-quantized   weight_packed int32 [N, K/8],
      rtn, gptq)                                                     weight_scale [N, K/g], weight_shape
    int8_wo (rtn, gptq)         W8A16, per channel  pack-quantized   weight_packed int32 [N, K/4],
                                                                     weight_scale [N, 1], weight_shape
    int8_dyn (per token; rtn)   W8A8 int8, dynamic  int-quantized    weight int8 [N, K], weight_scale [N, 1]
    fp8_dyn (row / tensor)      FP8 dynamic         float-quantized  weight e4m3 [N, K], weight_scale [N, 1] / [1]
    fp8_wo                      FP8 weight-only     float-quantized  weight e4m3 [N, K], weight_scale [N, 1]

(scales float32, exactly autoao's). What the format cannot hold is refused, layer by layer, with
the reason (`scheme_of` returns it, a Refused; each candidate family registers its scheme or its
refusal next to its definition: search_space/schemes.py): int4_wo's zero points are floats (w = (q - 8) * scale + zero,
tinygemm's convention) where compressed-tensors stores integer ones (int4_sym, w = (q - 8) *
scale, is the int4 these targets search; transformers cannot load asymmetric int4 checkpoints
anyway, llm-compressor #1618); SmoothQuant's and AWQ's input
scales [K] have no tensor there; int8_dyn(act=tensor) quantizes activations asymmetrically with
one scale per call; 2:4 sparsity is loaded by no engine any more; bf16_compute / fp32_compute
change a layer's compute dtype, which a checkpoint of one dtype cannot say; GGUF types belong in
a GGUF file.

After writing, `reload_check` loads the directory in a fresh Python process with transformers and
compares every linear layer's scheme with the plan, so a layer that would silently run another
scheme (or none) is caught before anyone serves it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoao.export.rules import fused_groups, marlin_reason
from autoao.kernels import QuantizedLinear
from autoao.kernels.layouts import GroupedInt4, PerChannel
from autoao.kernels.quant import unpack_int4
from autoao.search_space import candidate_of
from autoao.search_space.schemes import CtScheme, Refused, scheme_of

FORMAT = "compressed-tensors"
WEIGHTS_FILE = "model.safetensors"


##### tensors ###################################################################################

def layer_tensors(fqn: str, module: QuantizedLinear, scheme: CtScheme) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of one applied layer, from its canonical tensors (bit-exact)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    layout = module.layout()
    if isinstance(layout, GroupedInt4):  # int4_sym: signed codes q - 8, eight per int32
        return _int4_tensors(fqn, module, layout)
    if not isinstance(layout, PerChannel):
        raise ValueError(f"{fqn}: {type(module).__name__} stores {type(layout).__name__} tensors, which "
                         f"{scheme.label} does not hold")
    q, scale = layout.qweight.cpu(), layout.scale.cpu().float()
    out: dict[str, torch.Tensor] = {}
    if scheme.format == "pack-quantized":  # [N, K] int8 -> 4 codes (offset by 128) per int32
        out[f"{fqn}.weight_packed"] = pack_to_int32(q, 8)
        out[f"{fqn}.weight_shape"] = torch.tensor(list(q.shape), dtype=torch.int64)
    else:
        out[f"{fqn}.weight"] = q
    out[f"{fqn}.weight_scale"] = scale.reshape(1) if scale.dim() == 0 else scale.reshape(-1, 1)
    if module.bias is not None:
        out[f"{fqn}.bias"] = module.bias.detach().cpu()
    return out


def _int4_tensors(fqn: str, module: QuantizedLinear, c: GroupedInt4) -> dict[str, torch.Tensor]:
    """int4_sym's tensors: weight_packed [N, K/8] int32 (signed codes q - 8: compressed-tensors
    dequantizes (q - 8) * scale), weight_scale [N, K/g] float32 (bf16 values), weight_shape."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    if bool(c.zeros.any()):  # int4_sym's zeros are 0 by construction; anything else would be changed
        raise ValueError(f"{fqn}: int4 layer with non-zero zero points cannot be written as symmetric W4A16")
    q = unpack_int4(c.qweight.cpu()).to(torch.int8) - 8  # [N, K] in [-8, 7]
    out = {f"{fqn}.weight_packed": pack_to_int32(q, 4), f"{fqn}.weight_scale": c.scales.cpu().float(),
           f"{fqn}.weight_shape": torch.tensor(list(q.shape))}
    if module.bias is not None:
        out[f"{fqn}.bias"] = module.bias.detach().cpu()
    return out


def checkpoint_tensors(model: nn.Module, schemes: dict[str, CtScheme]) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: the quantized layers' (layer_tensors) and the rest of the
    state dict as it is (embeddings, norms, unplanned layers). A tensor stored under two names (tied
    embeddings) is kept under its first name only; transformers re-ties it from the config."""
    out: dict[str, torch.Tensor] = {}
    quantized = {f"{fqn}." for fqn in schemes}
    seen: set[tuple] = set()
    for name, t in model.state_dict().items():
        if any(name.startswith(p) for p in quantized):
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().cpu().contiguous()
    modules = dict(model.named_modules())
    for fqn, scheme in schemes.items():
        out.update(layer_tensors(fqn, modules[fqn], scheme))  # type: ignore[arg-type]
    return out


##### config ####################################################################################

def quantization_config(schemes: dict[str, CtScheme], ignore: list[str]) -> dict[str, Any]:
    """config.json's `quantization_config`: one group per scheme (targets: exact layer names, in
    model order), `ignore` the layers left as they came; no sparsity_config."""
    from compressed_tensors import __version__ as ct_version
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

    by_scheme: dict[CtScheme, list[str]] = {}
    for fqn, scheme in schemes.items():
        by_scheme.setdefault(scheme, []).append(fqn)
    groups = {}
    for i, (scheme, targets) in enumerate(by_scheme.items()):
        args = scheme.args()
        inputs = args["input_activations"]
        groups[f"group_{i}"] = QuantizationScheme(
            targets=targets, weights=QuantizationArgs(**args["weights"]),
            input_activations=None if inputs is None else QuantizationArgs(**inputs), format=scheme.format)
    formats = sorted({s.format for s in by_scheme})
    config = QuantizationConfig(config_groups=groups, format=formats[0] if len(formats) == 1 else "mixed-precision",
                                quantization_status="compressed", ignore=ignore)
    return {"version": ct_version, **config.model_dump(), "quant_method": "compressed-tensors"}


def write_config(model: nn.Module, directory: Path, qconfig: dict[str, Any]) -> None:
    """config.json (the model's transformers config plus `quantization_config`) and
    generation_config.json where the model has one. A quantized output layer of a model whose
    config ties it to the embedding is untied in the written config: an engine that ties would
    otherwise drop the quantized lm_head for the embedding (vLLM's Llama does), silently."""
    config = model.config.to_dict()  # type: ignore[union-attr]
    config["quantization_config"] = qconfig
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if config.get("tie_word_embeddings") and isinstance(head, QuantizedLinear):
        config["tie_word_embeddings"] = False
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(directory)


##### the fresh-process reload check ##############################################################

_RELOAD_SCRIPT = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
out = {}
for name, m in model.named_modules():
    if isinstance(m, torch.nn.Linear):
        s = getattr(m, "quantization_scheme", None)
        out[name] = None if s is None else {
            "weights": None if s.weights is None else s.weights.model_dump(mode="json"),
            "input_activations": None if s.input_activations is None else s.input_activations.model_dump(mode="json")}
print("AUTOAO_RELOAD " + json.dumps(out))
"""

_COMPARED = ("num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder")


def _same_args(loaded: dict[str, Any] | None, planned: dict[str, Any] | None) -> bool:
    if loaded is None or planned is None:
        return loaded is None and planned is None
    return all(loaded.get(k) == planned.get(k) for k in _COMPARED if k in planned or loaded.get(k))


def reload_check(directory: Path, schemes: dict[str, CtScheme | None], dtype: torch.dtype,
                 timeout: float = 600) -> list[str]:
    """Load `directory` with transformers in a fresh Python process and compare every linear
    layer's scheme with `schemes` (fqn -> planned scheme, None: unquantized). Returns one line per
    layer that loads as something else, or why the load failed; [] when all match."""
    cmd = [sys.executable, "-c", _RELOAD_SCRIPT, str(directory), str(dtype).removeprefix("torch.")]
    # cwd: `python -c` puts the working directory first on sys.path, and a source checkout's
    # autoao/ folder there (without its mapped sub-packages) would shadow the installed package
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=directory)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("AUTOAO_RELOAD ")), None)
    if run.returncode != 0 or line is None:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return [f"transformers could not load {directory} in a fresh process: {' | '.join(tail)}"]
    loaded: dict[str, Any] = json.loads(line.removeprefix("AUTOAO_RELOAD "))
    problems = []
    for fqn, scheme in schemes.items():
        if fqn not in loaded:
            problems.append(f"  {fqn}: not a linear layer of the reloaded model")
            continue
        got, want = loaded[fqn], None if scheme is None else scheme.args()
        if (got is None) != (want is None) or (want is not None and not (
                _same_args(got["weights"], want["weights"])
                and _same_args(got["input_activations"], want["input_activations"]))):
            planned = "unquantized" if scheme is None else scheme.label
            problems.append(f"  {fqn}: planned {planned}, reloaded as {json.dumps(got)}")
    return problems


##### what an engine will see: static checks on the written config ################################

def config_problems(qconfig: dict[str, Any], specs: dict[str, Any], target: Any) -> list[str]:
    """What `target` (an autoao.export.targets.Target) would refuse or silently mis-run in a
    written `quantization_config`, read from the config itself (not the plan): a fused group whose
    shards differ in scheme, a weight-only int layer outside Marlin's shapes and group sizes,
    GPTQ act-order, a `sparsity_config`. One line per problem; [] for none."""
    problems = []
    if qconfig.get("sparsity_config"):
        problems.append("  quantization_config: has a sparsity_config, which no engine loads any more")
    scheme_at: dict[str, str] = {}
    for name, group in qconfig.get("config_groups", {}).items():
        weights = group.get("weights") or {}
        key = json.dumps({"format": group.get("format"), "weights": weights,
                          "input_activations": group.get("input_activations")}, sort_keys=True)
        for fqn in group.get("targets", []):
            scheme_at[fqn] = key
            if weights.get("actorder"):
                problems.append(f"  {fqn}: {name} uses GPTQ act-order ({weights['actorder']}), which is refused")
            spec = specs.get(fqn)
            if target.marlin and group.get("format") == "pack-quantized" and spec is not None:
                reason = marlin_reason(spec.in_features, spec.out_features, weights.get("group_size"))
                if reason:
                    problems.append(f"  {fqn} ({spec.shape}): {reason}")
    if target.fuses:
        for fused, shards in fused_groups(list(specs)):
            if len({scheme_at.get(s, "unquantized") for s in shards}) > 1:
                problems.append(f"  {fused}: {target.engine} fuses {', '.join(shards)} but their config groups "
                                "differ (a mixed fused layer fails to load or loads with the wrong scheme)")
    return problems


##### writing ###################################################################################

def write(model: nn.Module, directory: Path, specs: dict[str, Any],
          tokenizer: Any = None) -> dict[str, CtScheme | None]:
    """Write the checkpoint of the applied `model` into `directory` (which exists): weights,
    config.json with `quantization_config`, generation and tokenizer files where known. The
    caller has checked the plan (targets.check_plan). Returns fqn -> scheme (None: ignored) for
    every linear layer, for the reload check and SERVING.md."""
    from safetensors.torch import save_file

    modules = dict(model.named_modules())
    layer_schemes: dict[str, CtScheme | None] = {}
    for fqn in specs:
        scheme = scheme_of(candidate_of(modules[fqn]))
        assert not isinstance(scheme, Refused), f"{fqn}: the plan was not checked before writing ({scheme.reason})"
        layer_schemes[fqn] = scheme
    schemes = {f: s for f, s in layer_schemes.items() if s is not None}
    qconfig = quantization_config(schemes, [f for f, s in layer_schemes.items() if s is None])
    save_file(checkpoint_tensors(model, schemes), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    write_config(model, directory, qconfig)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return layer_schemes
