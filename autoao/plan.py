"""Plans: which candidate each linear layer gets, as plain JSON; applying, saving and loading them.

A `Plan` maps layer FQNs to candidates (layers it does not name stay as they are), plus the
fingerprint of the model it was made for. It is data, never pickle:

    {"autoao_plan_version": 1,
     "model": {"fingerprint": "sha256:...", "class": "LlamaForCausalLM", "num_linears": 211},
     "layers": {"model.layers.0.mlp.up_proj": {"family": "int4_wo", "params": {"group_size": 64}}, ...},
     "kernels": {"model.layers.0.mlp.up_proj": "int8pack<=16,dequant", ...},   (optional: kernel or
                route per layer, kernels._base.parse_route)
     "fusions": [["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"], ...],   (optional)
     "metadata": {...}}

A fusion lists sibling layers (same input tensor; autoao.profile finds them) that run as one
kernel on their row-concatenated weights (autoao.kernels.FusedRows): same candidate and kernel,
same numbers, fewer and larger kernels.

`apply(model, plan)` validates the whole plan first and swaps modules only if every layer is fine,
so a bad plan never leaves a model half-quantized. `save(model, dir)` / `load(model, dir)` write
and read `plan.json` + `model.safetensors` (the canonical quantized tensors), each atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoao import search_space
from autoao.calibration import Calibration
from autoao.common import atomic_write  # noqa: F401  (re-exported)
from autoao.kernels import FusedRows, QuantizedLinear, fuse_problem, is_conv1d, link_prefetch
from autoao.search_space import Candidate, LayerSpec

PLAN_VERSION = 1
PLAN_FILE = "plan.json"
WEIGHTS_FILE = "model.safetensors"


class PlanError(ValueError):
    """A plan that cannot be read or does not fit a model; the message lists every problem."""


##### model fingerprint #########################################################################

def _layer_spec(fqn: str, module: nn.Module) -> LayerSpec | None:
    if isinstance(module, nn.Linear) or is_conv1d(module):
        return LayerSpec.from_linear(fqn, module)
    if isinstance(module, QuantizedLinear):
        return LayerSpec(fqn, module.in_features, module.out_features, module.bias is not None, module.dtype)
    return None


def layer_specs(model: nn.Module) -> dict[str, LayerSpec]:
    """FQN -> LayerSpec for every linear layer, plain or already replaced by autoao."""
    out = {}
    for name, m in model.named_modules():
        spec = _layer_spec(name, m)
        if spec is not None:
            out[name] = spec
    return out


def fingerprint(model: nn.Module) -> str:
    """sha256 over the model class and every linear layer's (FQN, K, N, bias, dtype).

    Architecture, not weights: a plan fits any copy of the same architecture."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    for fqn, s in layer_specs(model).items():
        h.update(f"|{fqn}:{s.in_features}:{s.out_features}:{int(s.bias)}:{s.dtype}".encode())
    return "sha256:" + h.hexdigest()


##### the plan ##################################################################################

@dataclass
class Plan:
    """Layer FQN -> candidate. Layers not named are left unchanged."""

    layers: dict[str, Candidate] = field(default_factory=dict)
    model_fingerprint: str | None = None  # fingerprint() of the model it was made for
    model_class: str | None = None
    num_linears: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # free-form, JSON-serializable
    # FQN -> which of the candidate module's kernels to run (Candidate.kernels), or a route
    # of them by rows per call ("int8pack<=16,dequant"), as timing chose it for the layer's shape;
    # layers not named use the module's default kernel for its device
    kernels: dict[str, str] = field(default_factory=dict)
    # groups of sibling layers (same input) run as one module, each group in call order
    fusions: list[tuple[str, ...]] = field(default_factory=list)

    @classmethod
    def for_model(cls, model: nn.Module, layers: dict[str, Candidate], kernels: dict[str, str] | None = None,
                  fusions: list[tuple[str, ...]] | None = None, **metadata: Any) -> Plan:
        return cls(dict(layers), fingerprint(model), type(model).__qualname__, len(layer_specs(model)), metadata,
                   dict(kernels or {}), [tuple(g) for g in fusions or []])

    def fuse(self, siblings: list[tuple[str, ...]]) -> Plan:
        """Add to `fusions` every sibling group (autoao.profile's `ModelProfile.siblings`) whose
        layers all have one candidate that fuses, and one kernel; returns self. Groups the plan
        cannot fuse are skipped, not errors: they run layer by layer."""
        fused = {f for g in self.fusions for f in g}
        for group in siblings:
            alone = Plan(self.layers, kernels=self.kernels, fusions=[tuple(group)])
            if not fused & set(group) and not _fusion_problems(alone, {}):  # the rules validate applies
                self.fusions.append(tuple(group))
                fused.update(group)
        return self

    @classmethod
    def uniform(cls, model: nn.Module, candidate: Candidate | str, device: torch.device | str | None = None) -> Plan:
        """`candidate` on every linear layer that supports it (the others stay unchanged;
        they are listed in metadata["skipped"] with the reason)."""
        cand = search_space.get(candidate) if isinstance(candidate, str) else candidate
        layers, skipped = {}, {}
        owner: dict[int, str] = {}  # id(weight) -> first layer that has it (tied weights)
        for fqn, spec in layer_specs(model).items():
            module = model.get_submodule(fqn)
            dev = device or _module_device(module)
            weight = getattr(module, "weight", None)
            if weight is not None and id(weight) in owner:
                skipped[fqn] = f"shares its weight with {owner[id(weight)]}, which the plan already covers"
                continue
            if weight is not None:
                owner[id(weight)] = fqn
            reason = cand.supports(spec, dev)
            if reason:
                skipped[fqn] = reason
            else:
                layers[fqn] = cand
        return cls.for_model(model, layers, uniform=cand.name, skipped=skipped)

    # ---- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "autoao_plan_version": PLAN_VERSION,
            "model": {"fingerprint": self.model_fingerprint, "class": self.model_class,
                      "num_linears": self.num_linears},
            "layers": {fqn: c.to_dict() for fqn, c in self.layers.items()},
            **({"kernels": self.kernels} if self.kernels else {}),
            **({"fusions": [list(g) for g in self.fusions]} if self.fusions else {}),
            "metadata": self.metadata,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, d: Any, source: str = "plan") -> Plan:
        if not isinstance(d, dict) or "autoao_plan_version" not in d:
            raise PlanError(f"{source}: not an autoao plan (no 'autoao_plan_version' key)")
        version = d["autoao_plan_version"]
        if version != PLAN_VERSION:
            raise PlanError(f"{source}: plan version {version!r} is not supported; this autoao reads "
                            f"version {PLAN_VERSION}. Re-create the plan with this autoao version.")
        if not isinstance(d.get("layers"), dict):
            raise PlanError(f"{source}: 'layers' must be an object of FQN -> candidate spec")
        layers, problems = {}, []
        for fqn, spec in d["layers"].items():
            try:
                layers[fqn] = search_space.from_dict(spec)
            except ValueError as e:
                problems.append(f"  {fqn}: {e}")
        if problems:
            raise PlanError(f"{source}: {len(problems)} layer(s) have bad candidate specs:\n" + "\n".join(problems))
        kernels = d.get("kernels") or {}
        if not isinstance(kernels, dict) or not all(isinstance(v, str) for v in kernels.values()):
            raise PlanError(f"{source}: 'kernels' must be an object of FQN -> kernel name")
        fusions = d.get("fusions") or []
        if not isinstance(fusions, list) or not all(
                isinstance(g, list) and all(isinstance(f, str) for f in g) for g in fusions):
            raise PlanError(f"{source}: 'fusions' must be a list of lists of layer FQNs")
        model = d.get("model") or {}
        return cls(layers, model.get("fingerprint"), model.get("class"), model.get("num_linears"),
                   d.get("metadata") or {}, dict(kernels), [tuple(g) for g in fusions])

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"{source}: not valid JSON ({e})") from None
        return cls.from_dict(d, source)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan as JSON, atomically."""
        path = Path(path)
        atomic_write(path, lambda f: f.write(self.to_json().encode()))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        path = Path(path)
        if not path.is_file():
            raise PlanError(f"plan file {path} does not exist")
        return cls.from_json(path.read_text(), source=str(path))

    def summary(self) -> dict[str, int]:
        """Candidate name -> number of layers."""
        out: dict[str, int] = {}
        for c in self.layers.values():
            out[c.name] = out.get(c.name, 0) + 1
        return out

    def words(self) -> str:
        """The plan in words, most layers first: "int8_wo x184, int8_dyn(act=tensor) x27"; "unchanged"."""
        return ", ".join(f"{n} x{k}" for n, k in sorted(self.summary().items(), key=lambda nk: (-nk[1], nk[0]))) \
            or "unchanged"


##### validate and apply ########################################################################

def _module_device(module: nn.Module) -> torch.device:
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")


def validate(model: nn.Module, plan: Plan, device: torch.device | str | None = None) -> None:
    """Raise PlanError listing *every* planned layer that is missing, not linear, or unsupported.

    device: where the layers will run (default: where each layer's weights are now).
    A fingerprint mismatch alone is not an error (the plan may target a sub-model), but is
    reported along with any other problem.
    """
    specs = layer_specs(model)
    modules = dict(model.named_modules())
    problems = []
    for fqn, cand in plan.layers.items():
        if fqn not in modules:
            close = [n for n in specs if n.endswith(fqn.split(".")[-1])][:3]
            hint = f" (linear layers with that suffix: {', '.join(close)})" if close else ""
            problems.append(f"  {fqn}: no such module in {type(model).__name__}{hint}")
            continue
        if fqn not in specs:
            problems.append(f"  {fqn}: is a {type(modules[fqn]).__name__}, not a linear layer")
            continue
        dev = device or _module_device(modules[fqn])
        reason = cand.supports(specs[fqn], dev)
        if reason:
            problems.append(f"  {fqn} ({specs[fqn].shape}, {specs[fqn].dtype}): {cand.name} unsupported on "
                            f"{torch.device(dev).type}: {reason}")
    for fqn, kernel in plan.kernels.items():
        cand = plan.layers.get(fqn)
        if cand is None or cand.module_cls is None:
            problems.append(f"  {fqn}: has a kernel ({kernel!r}) but no candidate in the plan")
        elif problem := cand.kernel_problem(kernel):
            problems.append(f"  {fqn}: {cand.name} has {problem}")
    problems += _fusion_problems(plan, specs)
    if problems:
        fp = fingerprint(model)
        note = ""
        if plan.model_fingerprint and plan.model_fingerprint != fp:
            note = (f"\nNote: the plan was made for a different model ({plan.model_class}, "
                    f"{plan.num_linears} linear layers); this one is {type(model).__name__} with {len(specs)}.")
        raise PlanError(f"plan does not fit the model: {len(problems)} problem(s):\n" + "\n".join(problems) + note)


def _fusion_problems(plan: Plan, specs: dict[str, LayerSpec]) -> list[str]:
    """What is wrong with the plan's fusions, a line per group (before any module is built).
    specs: the model's layers, for the in_features / dtype check ({} skips it)."""
    problems, owner = [], {}
    for group in plan.fusions:
        name = "fusion [" + ", ".join(group) + "]"
        cands = [c for c in (plan.layers.get(f) for f in group) if c is not None]
        names = list(dict.fromkeys(c.name for c in cands))
        kernels = list(dict.fromkeys(str(plan.kernels.get(f)) for f in group))
        if len(group) < 2:
            problems.append(f"  {name}: a fusion needs at least two layers")
        elif len(cands) < len(group):
            missing = [f for f in group if f not in plan.layers]
            problems.append(f"  {name}: {', '.join(missing)} not in the plan's layers (bf16 layers do not fuse)")
        elif len(names) > 1:
            problems.append(f"  {name}: the layers have different candidates ({', '.join(names)}); a fusion needs one")
        elif not cands[0].fusable:
            problems.append(f"  {name}: {names[0]} does not fuse (its numbers span rows)")
        elif len(kernels) > 1:
            problems.append(f"  {name}: the layers have different kernels ({', '.join(kernels)}); a fusion needs one")
        elif len({(specs[f].in_features, specs[f].dtype) for f in group if f in specs}) > 1:
            problems.append(f"  {name}: the layers differ in in_features or dtype")
        for f in group:
            if f in owner:
                problems.append(f"  {f}: in two fusions ({owner[f]} and {name})")
            owner[f] = name
    return problems


def fuse_layers(model: nn.Module, fusions: list[tuple[str, ...]]) -> None:
    """Run each group of (already replaced) sibling layers as one module (kernels.FusedRows)."""
    for group in fusions:
        members = [model.get_submodule(f) for f in group]
        problem = fuse_problem(members)
        if problem:
            raise PlanError(f"cannot fuse [{', '.join(group)}]: {problem}")
        FusedRows(members)  # type: ignore[arg-type]


def set_module(model: nn.Module, fqn: str, new: nn.Module) -> None:
    """Put `new` where the submodule `fqn` of `model` is."""
    parent_name, _, child = fqn.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def apply(
    model: nn.Module,
    plan: Plan,
    calibration: Calibration | dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """Replace every layer the plan names by its candidate's module, in place; return the model.

    calibration: the layers' input statistics (`profile(...).calibration`; a plain FQN -> [K]
    activation-norm dict also works), read by candidates that use them (2:4 prunes by Wanda with
    the activation norms, by magnitude without; GPTQ, AWQ and SmoothQuant fit on them, and a plan
    naming them without the statistics they need is refused: a saved model keeps the fitted
    numbers, so load needs none). Validates first (PlanError lists every problem), so the
    model is unchanged if any layer cannot take its candidate. Re-applying to an already
    quantized layer is an error: apply plans to the original model.
    """
    validate(model, plan)
    calib = Calibration.of(calibration)
    unfitted = [f"  {fqn}: {cand.name} fits on {', '.join(sorted(need))}"
                for fqn, cand in plan.layers.items() if (need := cand.fit_uses() - calib[fqn].present())]
    if unfitted:
        raise PlanError("these layers' calibrated algorithms need calibration statistics this apply was not "
                        "given (without them the weights would be round-to-nearest, not the plan's): pass "
                        "calibration= (autoao.profile.profile(model, inputs).calibration), or save the "
                        "optimized model and load it (autoao.save / autoao.load keep the fitted weights):\n"
                        + "\n".join(unfitted))
    modules = dict(model.named_modules())
    already = [fqn for fqn in plan.layers if isinstance(modules[fqn], QuantizedLinear)]
    if already:
        raise PlanError("these layers are already quantized by autoao; apply the plan to the original "
                        "model instead:\n" + "\n".join(f"  {f}" for f in already))
    # Two planned layers sharing one weight (tied) would be quantized twice into two copies.
    by_weight: dict[int, str] = {}
    for fqn in plan.layers:
        key = id(modules[fqn].weight)
        if key in by_weight:
            raise PlanError(f"layers {by_weight[key]} and {fqn} share one weight tensor; plan only one of them")
        by_weight[key] = fqn
    with torch.no_grad():
        for fqn, cand in plan.layers.items():
            module = cand.build(modules[fqn], calib[fqn], fqn=fqn)
            if fqn in plan.kernels:
                module.set_kernel(plan.kernels[fqn])
            set_module(model, fqn, module)
        fuse_layers(model, plan.fusions)
    link_prefetch(model)
    return model


def plan_of(model: nn.Module) -> Plan:
    """The plan a model carries: every autoao module's candidate (and kernel, where not the
    default), read back from the modules."""
    layers, kernels, fqn_of, fusions = {}, {}, {}, {}
    for fqn, m in model.named_modules():
        cand = search_space.candidate_of(m)
        if cand is not None:
            layers[fqn] = cand
            if isinstance(m, QuantizedLinear) and m.kernel != cand.kernels(m.device)[0].name:
                # the device's default needs no entry
                kernels[fqn] = m.kernel
        if isinstance(m, QuantizedLinear) and m.fused is not None:
            fqn_of[id(m)] = fqn
            fusions.setdefault(id(m.fused[0]), m.fused[0])
    groups = [tuple(fqn_of[id(m)] for m in g.members) for g in fusions.values()]
    return Plan.for_model(model, layers, kernels, groups)


##### save and load #############################################################################

def save(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write `plan.json` (read back from the model's modules) and `model.safetensors` (the whole
    state dict; quantized layers as canonical, device-independent tensors) into `directory`."""
    from safetensors.torch import save

    directory = Path(directory)
    plan = plan_of(model)
    # Tied weights (one tensor under two names): safetensors refuses shared storage, so keep the
    # first name and record the others as aliases in the file's metadata.
    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict().items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and key in seen:
            metadata[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    atomic_write(directory / WEIGHTS_FILE, lambda f: f.write(save(tensors, metadata=metadata)))
    plan.save(directory / PLAN_FILE)
    return directory


def load(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Load what `save` wrote into `model`, an unquantized model of the same architecture (on the
    device it should run on). Returns the model, quantized, with the saved weights bit-exact."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    directory = Path(directory)
    plan = Plan.load(directory / PLAN_FILE)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise PlanError(f"{weights} does not exist (did autoao.save finish writing {directory}?)")
    validate(model, plan)
    specs = layer_specs(model)
    modules = dict(model.named_modules())
    for fqn, cand in plan.layers.items():
        module = cand.empty(specs[fqn], _module_device(modules[fqn]))
        if fqn in plan.kernels:
            module.set_kernel(plan.kernels[fqn])
        set_module(model, fqn, module)
    try:
        state = load_file(weights)
        with safe_open(weights, framework="pt") as f:
            aliases = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise PlanError(f"{weights}: cannot read ({type(e).__name__}: {e})") from None
    for name, kept in aliases.items():
        if kept in state:
            state[name] = state[kept]
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape / dtype mismatches
        raise PlanError(f"{weights} does not match the model: {e}") from None
    missing = [k for k in result.missing_keys if k not in aliases]
    if missing or result.unexpected_keys:
        raise PlanError(f"{weights} does not match the model: missing {missing[:10]}, "
                        f"unexpected {result.unexpected_keys[:10]}")
    fuse_layers(model, plan.fusions)
    link_prefetch(model)
    return model
