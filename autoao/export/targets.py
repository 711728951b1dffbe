"""Serving targets: what each engine loads and runs, per layer, so a plan is made for one.

    autoao        autoao's own modules (autoao.apply / autoao.save): every candidate, 2:4 included
    vllm          compressed-tensors checkpoint; fuses q/k/v -> qkv_proj and gate/up -> gate_up_proj
    sglang        compressed-tensors checkpoint; the same fusions
    transformers  compressed-tensors checkpoint, decompressed at load; no fusion
    llama.cpp     GGUF file: the GGUF block types (search_space/gguf.py) and unquantized layers

A target is a type (`Target`, its contract in its docstring): one class per family of engines
(AutoaoTarget, CompressedTensorsTarget, GgufTarget), an instance per engine in the registry
`TARGETS`. Adding a target is one new class (or instance) and one registry line; every caller asks
the target object, never its format's name. `check_plan(plan, layers, target)` lists every
problem a plan would meet there (empty: it loads and runs as planned). The rules are data, taken
from the engines' loaders (vLLM's compressed_tensors.py and Marlin's shape checks, llama.cpp's
block sizes); the writers are the format modules' (compressed_tensors.py, gguf.py).
"""

from __future__ import annotations

import difflib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from autoao import search_space
from autoao.export import compressed_tensors as ct
from autoao.export import gguf as gg
from autoao.export.rules import fused_groups, marlin_reason
from autoao.kernels.gguf import TYPES as GGUF_TYPES
from autoao.plan import layer_specs, plan_of
from autoao.search_space import Candidate
from autoao.search_space.schemes import CtScheme, Refused, scheme_of
from autoao.types import FromBytes, LayerSpec, Pricing, Timed

INT4_GROUPS = (32, 64, 128)  # int4_sym's group sizes in the compressed-tensors targets' search space


class Target(ABC):
    """One serving engine: which candidates it loads, on which layers, at what price, and how a
    plan is written for it.

    A subclass sets `name` (the registry key, "vllm"), `engine` (its name in sentences, "vLLM") and
    implements `candidates()` (its default search space), `candidate_rule(candidate)` (None, or why
    it loads that candidate on no layer at all) and `describe(candidate)`. It may set `format` (the
    checkpoint format its export writes; None: it loads autoao.save directories, no export),
    `pricing` (Timed(), or FromBytes(reason) where its layers run outside autoao, with
    `weight_bytes` then), `serve_command` and `format_note` (SERVING.md), and override
    `layer_rule` (shape rules), `shared_groups` / `scheme_key` (siblings it runs as one module),
    `choice_groups`, `model_problems` and `write` (its writer, with its reload check). The hooks
    may raise; the public `supports` and `refuses` never do (a reason is a sentence for the report).
    """

    name: str
    engine: str
    serve_command: str  # how to serve an export ("{dir}": its directory); only a target with a format has one
    format: ClassVar[str | None] = None
    pricing: ClassVar[Pricing] = Timed()
    format_note: ClassVar[str] = ""  # what an export of `format` is, for SERVING.md

    # ---- the search space ---------------------------------------------------------------------
    @abstractmethod
    def candidates(self) -> list[Candidate]:
        """The candidates a search for this target holds by default (shape rules are `supports`')."""

    @abstractmethod
    def candidate_rule(self, candidate: Candidate) -> str | None:
        """None if this engine loads `candidate` on some layer, else why it loads it on none."""

    def layer_rule(self, candidate: Candidate, layer: LayerSpec) -> str | None:
        """None if this engine runs `candidate` on `layer`'s shape as planned, else why not (called
        only for a candidate `candidate_rule` accepts)."""
        return None

    def refuses(self, candidate: Candidate) -> str | None:
        """Why this engine loads `candidate` on no layer at all, or None. Never raises."""
        try:
            return self.candidate_rule(candidate)
        except Exception as e:  # noqa: BLE001 - a broken rule must not break a search or a report
            return f"{self.engine} support check failed: {type(e).__name__}: {e}"

    def supports(self, candidate: Candidate, layer: LayerSpec) -> str | None:
        """None if this engine loads `candidate` on `layer` and runs it as planned, else why not.
        Never raises."""
        try:
            return self.candidate_rule(candidate) or self.layer_rule(candidate, layer)
        except Exception as e:  # noqa: BLE001 - a broken rule must not break a search or a report
            return f"{self.engine} support check failed: {type(e).__name__}: {e}"

    # ---- pricing ------------------------------------------------------------------------------
    def weight_bytes(self, candidate: Candidate | None, layer: LayerSpec) -> int | None:
        """Bytes of the layer's weight as this engine stores it, where its pricing is FromBytes,
        else None. A cost from bytes is an estimate, never a measured speed-up."""
        return None

    # ---- fused siblings -----------------------------------------------------------------------
    def shared_groups(self, names: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        """(fused module name, its shard layers) for every group of `names` this engine runs as
        one module; empty where it fuses nothing."""
        return []

    def scheme_key(self, candidate: Candidate | None) -> Any:
        """What must be equal across a fused group: here the candidate's name (None: as it came)."""
        return None if candidate is None else candidate.name

    def choice_groups(self, names: list[str], siblings: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """The layer groups that take one choice in a search: the groups this engine fuses (they
        must share one scheme there), then the workload's `siblings` (same input, fusable in
        autoao's runtime) that overlap none of them."""
        shared = [g for _, g in self.shared_groups(names)]
        taken = {f for g in shared for f in g}
        return shared + [g for g in siblings if not taken & set(g)]

    # ---- export -------------------------------------------------------------------------------
    def export_command(self, run_dir: str) -> str | None:
        """The `autoao export` command that writes a run's model for this engine; None: no export."""
        if self.format is None:
            return None
        return f"autoao export {run_dir} --format {self.format} --out {run_dir.rstrip('/')}-served --target {self.name}"

    def model_problems(self, model: nn.Module) -> list[str]:
        """What the format cannot hold of `model` as a whole (one line each; [] for none)."""
        return []

    def write(self, model: nn.Module, directory: Path, specs: dict[str, LayerSpec], *, tokenizer: Any = None,
              source: Path | None = None, check: bool = True) -> dict[str, list[str]]:
        """Write the applied `model` into `directory` in this target's format and, where `check`,
        check what was written (its reload check); returns, per target of the format, what that
        engine would refuse in it ([]: loads as planned). ValueError where the target has no export."""
        raise ValueError(f"{self.engine} loads autoao's own directories: write them with autoao.save(model, dir)")

    # ---- for people ---------------------------------------------------------------------------
    @abstractmethod
    def describe(self, candidate: Candidate | None) -> str:
        """What a layer with `candidate` (None: left as it came) becomes in this engine, one line."""


class AutoaoTarget(Target):
    """autoao's own runtime: every candidate but the GGUF types (emulated, for llama.cpp)."""

    name, engine = "autoao", "autoao"

    def candidates(self) -> list[Candidate]:
        return search_space.all_candidates()

    def candidate_rule(self, candidate: Candidate) -> str | None:
        if candidate.family == "gguf":
            return "a GGUF type is emulated by autoao (no fast kernel); serve it with llama.cpp"
        return None

    def describe(self, candidate: Candidate | None) -> str:
        if candidate is None or candidate.family == "bf16":
            return "the layer as it came"
        return f"{candidate.name}: {candidate.summary}"


@dataclass(frozen=True)
class CompressedTensorsTarget(Target):
    """An engine that loads compressed-tensors checkpoints: a layer is what its candidate's scheme
    (search_space/schemes.py) says, or refused with the scheme's reason."""

    name: str
    engine: str
    serve_command: str
    runs: tuple[tuple[str, str], ...]  # scheme label prefix -> the kernel the engine runs it with
    fuses: bool = False  # runs FUSED siblings as one module, so they must share one scheme
    marlin: bool = False  # weight-only int layers run Marlin: its shape and group-size rules apply

    format: ClassVar[str | None] = ct.FORMAT
    format_note: ClassVar[str] = (
        "A compressed-tensors checkpoint (config.json's `quantization_config`, one config group per scheme "
        "with exact layer names, unquantized layers in `ignore`) holding autoao's own codes and scales, "
        "bit for bit. After writing, autoao loaded it in a fresh process with transformers and compared "
        "every layer's scheme with the plan.")

    def candidates(self) -> list[Candidate]:
        """autoao's default space less what a checkpoint cannot hold, with int4_sym for int4
        (int4_wo's float zeros do not fit)."""
        every = search_space.all_candidates()
        int4 = [search_space.get("int4_sym", group_size=g) for g in INT4_GROUPS]
        return [c for c in every if not isinstance(scheme_of(c), Refused)] + int4

    def candidate_rule(self, candidate: Candidate) -> str | None:
        scheme = scheme_of(candidate)
        return scheme.reason if isinstance(scheme, Refused) else None

    def layer_rule(self, candidate: Candidate, layer: LayerSpec) -> str | None:
        scheme = scheme_of(candidate)
        if self.marlin and isinstance(scheme, CtScheme) and scheme.format == "pack-quantized":
            return marlin_reason(layer.in_features, layer.out_features, dict(scheme.weights).get("group_size"))
        return None

    def shared_groups(self, names: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        return fused_groups(names) if self.fuses else []

    def scheme_key(self, candidate: Candidate | None) -> Any:
        """The checkpoint scheme (int8_wo by RTN and by GPTQ are one scheme); a refused
        candidate's name."""
        scheme = scheme_of(candidate)
        return candidate.name if isinstance(scheme, Refused) and candidate is not None else scheme

    def model_problems(self, model: nn.Module) -> list[str]:
        if getattr(model, "config", None) is None:
            return ["  the model has no transformers config: a compressed-tensors checkpoint needs one"]
        return []

    def write(self, model: nn.Module, directory: Path, specs: dict[str, LayerSpec], *, tokenizer: Any = None,
              source: Path | None = None, check: bool = True) -> dict[str, list[str]]:
        """The checkpoint (compressed_tensors.write); per compressed-tensors target, the plan
        checks and the written config's checks, and where `check` the fresh-process reload."""
        schemes = ct.write(model, directory, specs, tokenizer)
        qconfig = json.loads((directory / "config.json").read_text())["quantization_config"]
        plan = plan_of(model)
        problems = {t.name: check_plan(plan, specs, t) + ct.config_problems(qconfig, specs, t)
                    for t in targets_of(self.format)}
        if check:
            reload = ct.reload_check(directory, schemes, next(model.parameters()).dtype)
            for t in problems:  # every engine reads the same config: a layer that reloads wrong is wrong everywhere
                problems[t] = reload + problems[t]
        return problems

    def describe(self, candidate: Candidate | None) -> str:
        scheme = scheme_of(candidate)
        if scheme is None:
            return "unquantized (in `ignore`): the engine's dense matmul in the model dtype"
        if isinstance(scheme, Refused):
            return f"not exportable: {scheme.reason}"
        runs = next((v for k, v in self.runs if scheme.label.startswith(k)), "")
        return f"{scheme.label}, {scheme.format}: {runs}"


class GgufTarget(Target):
    """llama.cpp: a GGUF file of GGUF block types and unquantized layers. autoao only emulates the
    GGUF types, so their time here says nothing about llama.cpp's: layers are priced from bytes."""

    name, engine, format = "llama.cpp", "llama.cpp", gg.FORMAT
    serve_command = "llama-server -m {dir}/model.gguf      # or: llama-cli -m {dir}/model.gguf -p 'Hello'"
    pricing = FromBytes(
        "estimated from weight bytes, not measured: autoao emulates GGUF types, so a one-token (decode) call of a "
        "layer is taken to cost the unchanged layer's time here scaled by its weight bytes, and a call of more tokens "
        "its unchanged time; time the export in llama.cpp for a measured speed-up")
    format_note = (
        "A GGUF file whose quantized tensors are the very blocks autoao computed with (read back and "
        "compared byte for byte after writing). llama.cpp quantizes activations to 8 bits per block of 32 "
        "in every quantized matmul; autoao's accuracy numbers for this plan were measured with that "
        "emulated. autoao never timed the GGUF types (it only emulates them): the plan's speed-up is an "
        "estimate from weight bytes; time this file in llama.cpp for a measured one.")

    def candidates(self) -> list[Candidate]:
        return [search_space.get("bf16")] + [search_space.get("gguf", type=t) for t in GGUF_TYPES]

    def candidate_rule(self, candidate: Candidate) -> str | None:
        if candidate.family in ("bf16", "gguf"):
            return None
        return f"llama.cpp runs GGUF block types only; {candidate.name} has no GGUF type"

    def layer_rule(self, candidate: Candidate, layer: LayerSpec) -> str | None:
        return None if candidate.family == "bf16" else candidate.supports(layer, "cpu")

    def weight_bytes(self, candidate: Candidate | None, layer: LayerSpec) -> int | None:
        if candidate is None or candidate.family != "gguf":
            return layer.out_features * layer.in_features * layer.dtype.itemsize
        t = GGUF_TYPES[candidate.params()["type"]]
        return layer.out_features * (layer.in_features // t.block) * t.block_bytes

    def choice_groups(self, names: list[str], siblings: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """None: llama.cpp fuses no siblings, and autoao's fusion of them does not run there, so
        every layer takes its own choice."""
        return []

    def model_problems(self, model: nn.Module) -> list[str]:
        return gg.architecture_problems(model)

    def write(self, model: nn.Module, directory: Path, specs: dict[str, LayerSpec], *, tokenizer: Any = None,
              source: Path | None = None, check: bool = True) -> dict[str, list[str]]:
        """model.gguf (its tokenizer from the GGUF file `source`, where given); where `check`, the
        file read back byte for byte and loaded by llama.cpp where installed."""
        path = directory / gg.FILE
        gg.write(model, path, source)
        problems: list[str] = []
        if check:
            problems += gg.read_check(path, model)
            if source is not None:  # without a tokenizer llama.cpp loads token ids only; still a load test
                problems += gg.llama_cpp_check(path, model) or []
        return {self.name: problems}

    def describe(self, candidate: Candidate | None) -> str:
        if candidate is None or candidate.family == "bf16":
            return "unquantized tensor (the model's dtype); llama.cpp converts activations to it per matmul"
        if candidate.family != "gguf":
            return f"not loadable: llama.cpp runs GGUF block types only; {candidate.name} has none"
        t = GGUF_TYPES[candidate.params()["type"]]
        return (f"GGUF {t.name} ({t.bits_per_weight:g} bits per weight, blocks of 32), activations "
                f"quantized to {t.activation} per block in every matmul")


_VLLM_RUNS = (
    ("W4A16", "Marlin / Machete int4 GEMM (GPU)"),
    ("W8A16", "Marlin / Machete int8 weight-only GEMM (GPU; vLLM's CPU backend has no int8 weight-only kernel)"),
    ("W8A8-INT8", "CUTLASS int8 scaled_mm, activations quantized per token at runtime"),
    ("FP8 dynamic", "CUTLASS / torch fp8 scaled_mm (sm89+; Marlin fp8 weight-only on older GPUs)"),
    ("FP8 weight-only", "Marlin fp8 weight-only GEMM"),
)
_SGLANG_RUNS = (
    ("W4A16", "its compressed-tensors WNA16 (Marlin) int4 GEMM"),
    ("W8A16", "its compressed-tensors WNA16 (Marlin) int8 weight-only GEMM"),
    ("W8A8-INT8", "int8 scaled_mm, activations quantized per token at runtime"),
    ("FP8 dynamic", "fp8 scaled_mm (sm89+)"),
    ("FP8 weight-only", "Marlin fp8 weight-only GEMM"),
)
_TRANSFORMERS_RUNS = (
    ("W4A16", "weights decompressed to the model dtype at load, then a dense matmul"),
    ("W8A16", "weights decompressed to the model dtype at load, then a dense matmul"),
    # its scales are computed in the activations' dtype, autoao's and vLLM's in float32: in bf16 a
    # reload computes measurably apart (docs/serving.md)
    ("W8A8-INT8", "weights decompressed at load; activations fake-quantized per token (scale amax/127.5 in "
                  "the model dtype; autoao's amax/127 in float32), then a dense matmul"),
    ("FP8 dynamic", "weights decompressed at load; activations fake-quantized to fp8 per token (scales in the "
                    "model dtype; autoao's in float32), dense matmul"),
    ("FP8 weight-only", "weights decompressed to the model dtype at load, then a dense matmul"),
)

TARGETS: dict[str, Target] = {t.name: t for t in (
    AutoaoTarget(),
    CompressedTensorsTarget("vllm", "vLLM", "vllm serve {dir}", _VLLM_RUNS, fuses=True, marlin=True),
    CompressedTensorsTarget("sglang", "SGLang", "python -m sglang.launch_server --model-path {dir}", _SGLANG_RUNS,
                            fuses=True, marlin=True),
    CompressedTensorsTarget("transformers", "transformers",
                            "python -c \"from transformers import AutoModelForCausalLM; "
                            "m = AutoModelForCausalLM.from_pretrained('{dir}')\"   # pip install compressed-tensors",
                            _TRANSFORMERS_RUNS),
    GgufTarget(),
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


def targets_of(format: str | None) -> list[Target]:
    """The targets that load checkpoints of `format`, in registry order (the first: its default)."""
    return [t for t in TARGETS.values() if t.format == format]


def formats() -> dict[str, str]:
    """Every export format -> the name of its default target (the first registered that loads it)."""
    out: dict[str, str] = {}
    for t in TARGETS.values():
        if t.format is not None:
            out.setdefault(t.format, t.name)
    return out


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
