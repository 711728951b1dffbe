"""A search made for a serving target holds only what the target loads: vLLM's search space has no
candidate a compressed-tensors checkpoint cannot hold, q/k/v and gate/up (which vLLM fuses) take one
choice, and the plan, the summary and the report say which target it was made for and how to export
it. A target a search cannot serve is refused before anything is measured."""

from __future__ import annotations

import pytest
import torch

import autoao
from autoao.cli import main
from autoao.export import targets
from autoao.records import load_context, load_summary

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path / "cache"))


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


@pytest.mark.slow
def test_a_search_for_vllm_holds_what_vllm_loads_and_says_so(tmp_path):
    model = _llama()
    res = autoao.optimize(model, (torch.randint(0, 256, (1, 16)),), budget=8, max_accuracy_drop=1.0, target="vllm",
                          candidates=["int8_wo", "int4_wo", "int4_sym(group_size=64)", "int8_dyn", "sparse24"],
                          out_dir=tmp_path / "out", progress=False)
    ctx = load_context(tmp_path / "out" / "context.json")
    assert ctx.target == "vllm"
    vllm = targets.get("vllm")
    for lay in ctx.layers:  # what vLLM cannot load is never a choice, and the reason says why
        assert "int4_wo(group_size=128)" not in lay.choices and "sparse24" not in lay.choices
        assert "sparse24" in lay.excluded and lay.excluded["sparse24"]
    groups = {tuple(g.fqns) for g in ctx.groups}
    layer = "model.layers.0"
    assert tuple(f"{layer}.self_attn.{p}_proj" for p in "qkv") in groups  # vLLM's qkv_proj: one choice
    assert (f"{layer}.mlp.gate_proj", f"{layer}.mlp.up_proj") in groups  # gate_up_proj
    assert targets.check_plan(res.plan, model, vllm) == []  # the shipped plan loads there as planned
    summary = load_summary(tmp_path / "out" / "summary.json")
    assert summary.deploy is not None and summary.deploy.target == "vllm"
    assert summary.deploy.command.startswith("autoao export") and "--format compressed-tensors" in summary.deploy.command
    assert 'id="deploy"' in res.report_path.read_text()


@pytest.mark.parametrize("target, message", [
    ("llama.cpp", "a search for llama.cpp is not supported"),
    ("vlm", "Did you mean: vllm"),
])
def test_a_target_a_search_cannot_serve_is_one_line_exit_2(target, message, tmp_path, capsys):
    assert main(["search", "--target", target, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoao: error: --target:") and message in err and err.count("\n") == 1, err
    with pytest.raises(ValueError, match=message):
        autoao.optimize(_llama(), torch.zeros(1, 4, dtype=torch.long), target=target, out_dir=tmp_path / "p")


def test_export_of_a_folder_that_is_no_run_is_one_line_exit_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--format", "compressed-tensors", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoao: error:") and "RUN_DIR" in err and err.count("\n") == 1, err
