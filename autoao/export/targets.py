"""Serving targets: what each engine loads and runs, per layer, so a plan is made for one.

    autoao        autoao's own modules (autoao.apply / autoao.save): every candidate, 2:4 included
    vllm          compressed-tensors checkpoint; fuses q/k/v -> qkv_proj and gate/up -> gate_up_proj
    sglang        compressed-tensors checkpoint; the same fusions
    transformers  compressed-tensors checkpoint, decompressed at load; no fusion
    llama.cpp     GGUF file: the GGUF block types (search_space/gguf.py) and unquantized layers

A `Target` answers, for a candidate on a layer, `supports(candidate, layer) -> None | reason`
(never raises: a reason is a sentence for the report), which sibling layers must share one scheme
(`shared_groups`), what the layer becomes in that engine (`describe`), and which candidates its
search space holds (`candidates`). `check_plan(plan, layers, target)` lists every problem a plan
would meet there (empty: it loads and runs as planned). This module knows no model and runs
nothing: the rules are data, taken from the engines' loaders (vLLM's compressed_tensors.py and
Marlin's shape checks, llama.cpp's block sizes).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from torch import nn

from autoao import search_space
from autoao.export.compressed_tensors import scheme_of
from autoao.export.rules import fused_groups, marlin_reason
from autoao.kernels.gguf import TYPES as GGUF_TYPES
from autoao.plan import layer_specs
from autoao.search_space import Candidate
from autoao.types import LayerSpec

INT4_GROUPS = (32, 64, 128)  # int4_sym's group sizes in the compressed-tensors targets' search space

_CT_ENGINE_RUNS = {
    "vllm": {
        "W4A16": "Marlin / Machete int4 GEMM (GPU)",
        "W8A16": "Marlin / Machete int8 weight-only GEMM (GPU; vLLM's CPU backend has no int8 weight-only kernel)",
        "W8A8-INT8": "CUTLASS int8 scaled_mm, activations quantized per token at runtime",
        "FP8 dynamic": "CUTLASS / torch fp8 scaled_mm (sm89+; Marlin fp8 weight-only on older GPUs)",
        "FP8 weight-only": "Marlin fp8 weight-only GEMM",
    },
    "sglang": {
        "W4A16": "its compressed-tensors WNA16 (Marlin) int4 GEMM",
        "W8A16": "its compressed-tensors WNA16 (Marlin) int8 weight-only GEMM",
        "W8A8-INT8": "int8 scaled_mm, activations quantized per token at runtime",
        "FP8 dynamic": "fp8 scaled_mm (sm89+)",
        "FP8 weight-only": "Marlin fp8 weight-only GEMM",
    },
    "transformers": {
        "W4A16": "weights decompressed to the model dtype at load, then a dense matmul",
        "W8A16": "weights decompressed to the model dtype at load, then a dense matmul",
        # its scales are computed in the activations' dtype, autoao's and vLLM's in float32: in bf16 a
        # reload computes measurably apart (docs/serving.md)
        "W8A8-INT8": "weights decompressed at load; activations fake-quantized per token (scale amax/127.5 in "
                     "the model dtype; autoao's amax/127 in float32), then a dense matmul",
        "FP8 dynamic": "weights decompressed at load; activations fake-quantized to fp8 per token (scales in the "
                       "model dtype; autoao's in float32), dense matmul",
        "FP8 weight-only": "weights decompressed to the model dtype at load, then a dense matmul",
    },
}


@dataclass(frozen=True)
class Target:
    """One serving engine: the checkpoint format it loads and the rules its loader and kernels have."""

    name: str  # "vllm"
    engine: str  # "vLLM", for sentences
    format: str | None  # the export format it loads (None: autoao's own save)
    fuses: bool = False  # runs FUSED siblings as one module, so they must share one scheme
    marlin: bool = False  # weight-only int layers run Marlin: its shape and group-size rules apply

    # ---- the search space ---------------------------------------------------------------------
    def candidates(self) -> list[Candidate]:
        """The candidates a search for this target holds (shape rules are `supports`'): autoao's
        default space; for compressed-tensors engines the part of it a checkpoint can hold, with
        int4_sym for int4; for llama.cpp the GGUF types and the unchanged layer."""
        if self.format == "gguf":
            return [search_space.get("bf16")] + [search_space.get("gguf", type=t) for t in GGUF_TYPES]
        every = search_space.all_candidates()
        if self.format is None:
            return every
        int4 = [search_space.get("int4_sym", group_size=g) for g in INT4_GROUPS]  # int4_wo's float zeros do not fit
        return [c for c in every if not isinstance(scheme_of(c), str)] + int4

    def supports(self, candidate: Candidate, layer: LayerSpec) -> str | None:
        """None if this engine loads `candidate` on `layer` and runs it as planned, else why not.
        Never raises."""
        try:
            return self._supports(candidate, layer)
        except Exception as e:  # noqa: BLE001 - a broken rule must not break a search or a report
            return f"{self.engine} support check failed: {type(e).__name__}: {e}"

    def _supports(self, candidate: Candidate, layer: LayerSpec) -> str | None:
        if self.format is None:
            return None if candidate.family != "gguf" else (
                "a GGUF type is emulated by autoao (no fast kernel); serve it with llama.cpp")
        if self.format == "gguf":
            if candidate.family == "bf16":
                return None
            if candidate.family != "gguf":
                return f"llama.cpp runs GGUF block types only; {candidate.name} has no GGUF type"
            return candidate.supports(layer, "cpu")
        scheme = scheme_of(candidate)
        if isinstance(scheme, str):
            return scheme
        if scheme is not None and self.marlin and scheme.format == "pack-quantized":
            return marlin_reason(layer.in_features, layer.out_features, dict(scheme.weights).get("group_size"))
        return None

    def weight_bytes(self, candidate: Candidate | None, layer: LayerSpec) -> int | None:
        """Bytes of the layer's weight as this engine stores it, where the target's costs are
        estimated from bytes (`estimate`: llama.cpp), else None. A cost from bytes is an estimate,
        never a measured speed-up: the report labels it so."""
        if self.format != "gguf":
            return None
        if candidate is None or candidate.family != "gguf":
            return layer.out_features * layer.in_features * layer.dtype.itemsize
        t = GGUF_TYPES[candidate.params()["type"]]
        return layer.out_features * (layer.in_features // t.block) * t.block_bytes

    @property
    def estimate(self) -> str:
        """Why a search for this target prices layers from weight bytes instead of timing them
        (empty: it times them). llama.cpp's GGUF types run in llama.cpp alone; autoao emulates them,
        so their time here says nothing about llama.cpp's."""
        if self.format != "gguf":
            return ""
        return ("estimated from weight bytes, not measured: autoao emulates GGUF types, so a one-token (decode) "
                "call of a layer is taken to cost the unchanged layer's time here scaled by its weight bytes, and a "
                "call of more tokens its unchanged time; time the export in llama.cpp for a measured speed-up")

    # ---- fused siblings -----------------------------------------------------------------------
    def shared_groups(self, names: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        """(fused module name, its shard layers) for every group of `names` this engine runs as
        one module; empty where it fuses nothing."""
        return fused_groups(names) if self.fuses else []

    def scheme_key(self, candidate: Candidate | None) -> Any:
        """What must be equal across a fused group: the checkpoint scheme (int8_wo by RTN and by
        GPTQ are one scheme), or the candidate's name where the format has no schemes."""
        if self.format == "compressed-tensors":
            scheme = scheme_of(candidate)
            return scheme if not isinstance(scheme, str) else candidate.name  # type: ignore[union-attr]
        return None if candidate is None else candidate.name

    # ---- for people -------------------------------------------------------------------------
    def describe(self, candidate: Candidate | None) -> str:
        """What a layer with `candidate` (None: left as it came) becomes in this engine, one line."""
        if self.format is None:
            return "the layer as it came" if candidate is None or candidate.family == "bf16" \
                else f"{candidate.name}: {candidate.summary}"
        if self.format == "gguf":
            if candidate is None or candidate.family == "bf16":
                return "unquantized tensor (the model's dtype); llama.cpp converts activations to it per matmul"
            if candidate.family != "gguf":
                return f"not loadable: llama.cpp runs GGUF block types only; {candidate.name} has none"
            t = GGUF_TYPES[candidate.params()["type"]]
            return (f"GGUF {t.name} ({t.bits_per_weight:g} bits per weight, blocks of 32), activations "
                    f"quantized to {t.activation} per block in every matmul")
        scheme = scheme_of(candidate)
        if scheme is None:
            return "unquantized (in `ignore`): the engine's dense matmul in the model dtype"
        if isinstance(scheme, str):
            return f"not exportable: {scheme}"
        runs = next((v for k, v in _CT_ENGINE_RUNS[self.name].items() if scheme.label.startswith(k)), "")
        return f"{scheme.label}, {scheme.format}: {runs}"


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("autoao", "autoao", None),
    Target("vllm", "vLLM", "compressed-tensors", fuses=True, marlin=True),
    Target("sglang", "SGLang", "compressed-tensors", fuses=True, marlin=True),
    Target("transformers", "transformers", "compressed-tensors"),
    Target("llama.cpp", "llama.cpp", "gguf"),
)}


def get(name: str | Target) -> Target:
    """The target called `name`; ValueError with the closest names and every choice otherwise."""
    if isinstance(name, Target):
        return name
    if name in TARGETS:
        return TARGETS[name]
    msg = f"Unknown target {name!r}."
    close = difflib.get_close_matches(str(name), list(TARGETS), n=2, cutoff=0.5)
    if close:
        msg += f" Did you mean: {', '.join(close)}?"
    raise ValueError(msg + f" Available: {', '.join(TARGETS)}")


def targets_of(format: str) -> list[Target]:
    """The targets that load checkpoints of `format`."""
    return [t for t in TARGETS.values() if t.format == format]


def layer_candidates(target: str | Target, specs: dict[str, LayerSpec], device: Any,
                     candidates: list[Candidate] | None = None) -> dict[str, list[Candidate]]:
    """The search space of a run made for `target`: per layer, the candidates (default: the
    target's `candidates()`) that both run on `device` in autoao (Candidate.supports: the search
    measures them there) and load on the target (Target.supports). A search keeps the layers of
    each `shared_groups` group on one candidate where the target fuses them."""
    chosen = get(target)
    pool = chosen.candidates() if candidates is None else candidates
    return {fqn: [c for c in pool if c.supports(spec, device) is None and chosen.supports(c, spec) is None]
            for fqn, spec in specs.items()}


def check_plan(plan: Any, layers: nn.Module | dict[str, LayerSpec], target: str | Target) -> list[str]:
    """Every problem `plan` (an autoao.Plan) meets on `target`, one line each, naming the layer:
    a candidate the engine cannot load or run as planned on that layer's shape, and fused sibling
    groups whose schemes differ. `layers`: the model, or its fqn -> LayerSpec. [] = loads there."""
    target = get(target)
    specs = layers if isinstance(layers, dict) else layer_specs(layers)
    problems = []
    for fqn, cand in plan.layers.items():
        spec = specs.get(fqn)
        if spec is None:
            problems.append(f"  {fqn}: not a linear layer of the model")
            continue
        reason = target.supports(cand, spec)
        if reason:
            problems.append(f"  {fqn} ({spec.shape}): {cand.name}: {reason}")
    for fused, shards in target.shared_groups(list(specs)):
        keys = [target.scheme_key(plan.layers.get(s)) for s in shards]
        if len(set(map(repr, keys))) > 1:
            given = ", ".join(f"{s.rpartition('.')[2]}: {plan.layers[s].name if s in plan.layers else 'bf16'}"
                              for s in shards)
            problems.append(f"  {fused}: {target.engine} runs {', '.join(shards)} as one module with one "
                            f"scheme; the plan gives {given}")
    return problems
