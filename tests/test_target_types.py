"""Serving targets are types: a new target is one class and one registry line, and every caller
finds it (get, layer_candidates, check_plan); no module outside the registry dispatches on a
target's format or class, and no one tests a scheme for being a string (a refusal is a typed
`Refused`). A candidate the target loads on no layer is refused before anything is measured, by the
command line (exit 2, one line) and by optimize alike, with the candidate and the reason named."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import autoao
from autoao import search_space
from autoao.cli import build_parser, main
from autoao.cli.args import parse_candidates
from autoao.cli.search import search_options
from autoao.export import targets
from autoao.export.targets import TARGETS, Target
from autoao.options import OptionError, Options
from autoao.plan import Plan
from autoao.search_space.schemes import W8A16, CtScheme, Refused, scheme_of
from autoao.types import FromBytes, LayerSpec, Timed

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "autoao" / "export" / "targets.py"
PACKAGE = ("autoao", "search_space", "kernels", "evaluators", "reports")


class EightBitOnly(Target):
    """A toy engine: loads int8 weight-only layers whose K is a multiple of 128, nothing else."""

    name, engine = "eightbit", "EightBit"

    def candidates(self):
        return [search_space.get("bf16"), search_space.get("int8_wo")]

    def candidate_rule(self, candidate):
        return None if candidate.family in ("bf16", "int8_wo") else f"EightBit loads int8_wo only, not {candidate.name}"

    def layer_rule(self, candidate, layer):
        if candidate.family == "bf16" or layer.in_features % 128 == 0:
            return None
        return f"K={layer.in_features} is not a multiple of 128"

    def describe(self, candidate):
        return "int8 weight-only" if candidate is not None and candidate.family == "int8_wo" else "as it came"


@pytest.fixture
def eightbit():
    target = EightBitOnly()
    TARGETS[target.name] = target  # the one registry line
    yield target
    del TARGETS[target.name]


def _specs() -> dict[str, LayerSpec]:
    return {"a": LayerSpec("a", 256, 64, False, torch.bfloat16), "b": LayerSpec("b", 96, 64, False, torch.bfloat16)}


def test_a_new_target_is_one_class_and_one_registry_line(eightbit):
    assert targets.get("eightbit") is eightbit
    with pytest.raises(ValueError, match="Did you mean: eightbit"):
        targets.get("eightbt")
    per_layer = targets.layer_candidates("eightbit", _specs(), torch.device("cpu"))
    assert [c.name for c in per_layer["a"]] == ["bf16", "int8_wo"]  # K=256: its rule holds
    assert [c.name for c in per_layer["b"]] == ["bf16"]  # K=96: refused by its shape rule
    int8_wo, int8_dyn = search_space.get("int8_wo"), search_space.get("int8_dyn")
    assert targets.check_plan(Plan({"a": int8_wo}), _specs(), "eightbit") == []
    problems = targets.check_plan(Plan({"a": int8_dyn, "b": int8_wo}), _specs(), "eightbit")
    assert len(problems) == 2 and "loads int8_wo only, not int8_dyn" in problems[0] and "K=96" in problems[1]
    assert eightbit.pricing == Timed() and eightbit.export_command("run") is None  # the contract's defaults


def test_a_removed_target_is_gone():
    assert "eightbit" not in TARGETS
    with pytest.raises(ValueError, match="Unknown target 'eightbit'"):
        targets.get("eightbit")


def test_a_broken_rule_is_a_reason_never_an_exception(eightbit, monkeypatch):
    monkeypatch.setattr(EightBitOnly, "candidate_rule", lambda self, c: 1 / 0)
    reason = eightbit.supports(search_space.get("int8_wo"), _specs()["a"])
    assert "support check failed: ZeroDivisionError" in reason
    assert "ZeroDivisionError" in eightbit.refuses(search_space.get("int8_wo"))


def test_pricing_is_typed_per_target():
    assert isinstance(targets.get("llama.cpp").pricing, FromBytes) and "weight bytes" in targets.get("llama.cpp").pricing.reason
    assert all(t.pricing == Timed() for n, t in TARGETS.items() if n != "llama.cpp")


def test_schemes_are_registered_by_the_families_and_refusals_are_typed():
    assert scheme_of(None) is None and scheme_of(search_space.get("bf16")) is None
    assert scheme_of(search_space.get("int8_wo", algorithm="gptq")) == W8A16
    assert isinstance(scheme_of(search_space.get("int4_sym", group_size=64)), CtScheme)
    tensor = scheme_of(search_space.get("int8_dyn", act="tensor"))
    assert isinstance(tensor, Refused) and "asymmetrically" in tensor.reason
    assert isinstance(scheme_of(search_space.get("sparse24")), Refused)
    assert isinstance(scheme_of(search_space.get("gguf", type="q8_0")), Refused)
    every = search_space.all_candidates() + targets.get("llama.cpp").candidates() + targets.get("vllm").candidates()
    assert all(isinstance(scheme_of(c), (CtScheme, Refused, type(None))) for c in every)


# ---- no dispatch on a target's format or class outside the registry -----------------------------

def _violations(tree: ast.AST, names: set[str], formats: set[str]) -> list[str]:
    """Comparisons of anything with a target format's name, isinstance on a Target class, and
    isinstance(<a scheme>, str), each as 'line: source'."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            consts = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            if any(v in formats for v in consts if isinstance(v, str)):
                out.append(f"{node.lineno}: compares with a target format: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            kinds = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
                     if isinstance(n, (ast.Name, ast.Attribute))}
            if kinds & names:
                out.append(f"{node.lineno}: isinstance on a Target class: {ast.unparse(node)}")
            if "str" in kinds and "scheme" in ast.unparse(node.args[0]).lower():
                out.append(f"{node.lineno}: a scheme tested for being a str: {ast.unparse(node)}")
    return out


def _target_classes() -> set[str]:
    out, todo = set(), [Target]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo += cls.__subclasses__()
    return out


def test_no_module_outside_the_registry_dispatches_on_a_target():
    names, formats = _target_classes(), {t.format for t in TARGETS.values() if t.format is not None}
    assert {"Target", "AutoaoTarget", "CompressedTensorsTarget", "GgufTarget"} <= names
    assert formats == {"compressed-tensors", "gguf"}
    found = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != REGISTRY:
                found += [f"{path.relative_to(ROOT)}:{v}" for v in _violations(ast.parse(path.read_text()), names, formats)]
    assert not found, "dispatch on targets outside autoao/export/targets.py:\n" + "\n".join(found)


def test_the_dispatch_check_catches_each_kind():
    """The check above can fail: each forbidden form is caught."""
    bad = ('if target.format == "gguf": pass\n'
           'if fmt != "compressed-tensors": pass\n'
           'ok = isinstance(t, tg.GgufTarget)\n'
           'refused = isinstance(scheme_of(c), str)\n'
           'fine = scheme.format == "pack-quantized" or isinstance(reason, str)\n')
    found = _violations(ast.parse(bad), _target_classes(), {"gguf", "compressed-tensors"})
    assert [v.split(":")[0] for v in found] == ["1", "2", "3", "4"]


# ---- a candidate the target cannot load: refused before anything runs ----------------------------

def test_the_cli_refuses_a_candidate_vllm_cannot_load_in_one_line(tmp_path, capsys):
    code = main(["search", "--target", "vllm", "--candidates", "int8_dyn(act=tensor)", "--out", str(tmp_path / "o"),
                 "--budget", "10"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("autoao: error: --candidates:") and "int8_dyn(act=tensor)" in err and "asymmetrically" in err
    assert not (tmp_path / "o" / "context.json").exists()


def test_the_cli_accepts_a_candidate_vllm_loads(tmp_path):
    args = build_parser().parse_args(["search", "--target", "vllm", "--candidates", "int8_dyn,int8_wo",
                                      "--out", str(tmp_path / "o"), "--budget", "10"])
    opts = search_options(args, None, parse_candidates(args.candidates))
    assert opts.target == "vllm" and [c.name for c in opts.candidates] == ["bf16", "int8_dyn", "int8_wo"]


def _check(candidates, target, tmp_path):
    return Options.check(budget=10, accuracy=None, tokenizer=None, max_accuracy_drop=0.01, candidates=candidates,
                         eval_inputs=None, storage=None, out_dir=tmp_path / "o", seed=0, progress=False, target=target)


def test_options_refuse_what_the_target_cannot_load_and_accept_what_it_can(tmp_path):
    with pytest.raises(OptionError, match=r"int4_wo\(group_size=128\): int4_wo stores float zero points") as e:
        _check(["int8_wo", "int4_wo", "sparse24"], "vllm", tmp_path)
    assert e.value.argument == "candidates" and "sparse24: 2:4 sparsity" in str(e.value)
    with pytest.raises(OptionError, match=r"int8_wo: llama.cpp runs GGUF block types only"):
        _check(["int8_wo"], "llama.cpp", tmp_path)
    assert [c.name for c in _check(["int8_wo", "fp8_wo"], "vllm", tmp_path).candidates] == ["bf16", "int8_wo", "fp8_wo"]
    assert _check(["sparse24"], "autoao", tmp_path).candidates[-1].name == "sparse24"  # autoao runs 2:4


def test_optimize_refuses_before_it_profiles(tmp_path, monkeypatch):
    import autoao.api as api

    monkeypatch.setattr(api, "build_inputs", lambda *a, **k: pytest.fail("profiled a refused search"))
    model = torch.nn.Sequential(torch.nn.Linear(256, 128)).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"int8_dyn\(act=tensor\).*symmetrically per token"):
        autoao.optimize(model, (torch.randn(1, 256, dtype=torch.bfloat16),), budget=10, target="vllm",
                        candidates=["int8_dyn(act=tensor)"], out_dir=tmp_path / "o", progress=False)
