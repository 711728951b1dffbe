"""A search made for a serving target holds only what the target loads: vLLM's search space has no
candidate a compressed-tensors checkpoint cannot hold, q/k/v and gate/up (which vLLM fuses) take one
choice, and the plan, the summary and the report say which target it was made for and how to export
it. A search for llama.cpp, whose GGUF types autoao only emulates, prices layers from weight bytes
and ships on its verdicts with the speed-up said to be an estimate. A target name that does not
exist is refused before anything is measured."""

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
                          candidates=["int8_wo", "int4_sym(group_size=64)", "int8_dyn"],
                          out_dir=tmp_path / "out", progress=False)
    ctx = load_context(tmp_path / "out" / "context.json")
    assert ctx.target == "vllm"
    vllm = targets.get("vllm")
    for lay in ctx.layers:  # what vLLM cannot load is never a choice (naming it is refused: test_target_types.py)
        assert not any(c.startswith(("int4_wo", "sparse24")) for c in lay.choices)
    groups = {tuple(g.fqns) for g in ctx.groups}
    layer = "model.layers.0"
    assert tuple(f"{layer}.self_attn.{p}_proj" for p in "qkv") in groups  # vLLM's qkv_proj: one choice
    assert (f"{layer}.mlp.gate_proj", f"{layer}.mlp.up_proj") in groups  # gate_up_proj
    assert targets.check_plan(res.plan, model, vllm) == []  # the shipped plan loads there as planned
    summary = load_summary(tmp_path / "out" / "summary.json")
    assert summary.deploy is not None and summary.deploy.target == "vllm"
    assert summary.deploy.command.startswith("autoao export") and "--format compressed-tensors" in summary.deploy.command
    assert 'id="deploy"' in res.report_path.read_text()


@pytest.mark.slow
def test_a_search_for_llama_cpp_ships_gguf_types_on_an_estimate_and_says_so(tmp_path, capsys):
    model = _llama()
    examples = [(torch.randint(0, 256, (1, 16)),), (torch.randint(0, 256, (1, 1)),)]  # a prefill, a one-token call
    res = autoao.optimize(model, examples, budget=6, max_accuracy_drop=1.0, target="llama.cpp",
                          out_dir=tmp_path / "out", progress=False)
    ctx = load_context(tmp_path / "out" / "context.json")
    summary = load_summary(tmp_path / "out" / "summary.json")
    assert ctx.target == "llama.cpp" and "weight bytes" in ctx.estimate
    assert ctx.pricing == targets.get("llama.cpp").pricing  # the sentence reads back as the target's typed pricing
    for lay in ctx.layers:  # only GGUF types and the unchanged layer: nothing llama.cpp cannot run
        assert all(c == "bf16" or c.startswith("gguf(") for c in lay.choices), lay.choices
    assert res.plan.layers and all(c.family == "gguf" for c in res.plan.layers.values())
    assert not res.plan.fusions and targets.check_plan(res.plan, model, "llama.cpp") == []
    # nothing was measured: the speed-up is the estimate, and every place says so
    assert summary.speedup.measured is None and summary.plan_ms.measured is None and summary.rounds == 0
    assert summary.speedup.predicted > 1.0
    assert [d.kind for d in summary.decisions][-1] == "shipped_on_estimate"
    page = res.report_path.read_text()
    assert "Estimated speed-up (weight bytes)" in page and "its speed-up was not measured" in page
    assert ">not measured<" in page  # the measured card
    from autoao.export import export

    assert (export(res.model, "gguf", tmp_path / "gguf") / "model.gguf").is_file()  # it exports as planned


@pytest.mark.slow
def test_a_timed_search_for_llama_cpp_runs_nothing_end_to_end_and_finishes_in_time(tmp_path):
    model = _llama()
    examples = [(torch.randint(0, 256, (1, 16)),), (torch.randint(0, 256, (1, 1)),)]
    autoao.optimize(model, examples, budget="40s", max_accuracy_drop=1.0, target="llama.cpp",
                          out_dir=tmp_path / "out", progress=False)
    summary = load_summary(tmp_path / "out" / "summary.json")
    assert summary.seconds < 40 * 1.1 + 15
    # priced from weight bytes: no plan is timed end to end, so nothing anchors the cells
    assert summary.speedup.measured is None and summary.rounds == 0
    assert summary.stage_seconds["final measurement"] < 0.5


def test_estimated_cells_scale_the_unchanged_cell_by_weight_bytes():
    from types import SimpleNamespace

    from autoao import search_space
    from autoao.evaluators.cache import Timing
    from autoao.evaluators.timing import LatencyRow, LatencyTable
    from autoao.stages.measure import estimated_cells
    from autoao.types import FromBytes, LayerSpec

    spec = LayerSpec("l", 64, 48, False, torch.bfloat16)
    odd = LayerSpec("odd", 40, 48, False, torch.bfloat16)  # K % 32 != 0: no GGUF type fits
    work = SimpleNamespace(prof=SimpleNamespace(layers=[SimpleNamespace(in_features=s.in_features, out_features=48,
                                                                        spec=s) for s in (spec, odd)]),
                           device=torch.device("cpu"), tokens=[1, 7])
    rows = [LatencyRow("bf16", m, k, 48, Timing(10.0 * m, 9.0 * m, 11.0 * m, 5), False) for m in (1, 7) for k in (64, 40)]
    table = LatencyTable("cpu", "bfloat16", "eager", rows, 4, 1.0)
    q8, q4 = search_space.get("gguf", type="q8_0"), search_space.get("gguf", type="q4_0")
    out = estimated_cells(table, work, [search_space.get("bf16"), q8, q4], targets.get("llama.cpp").weight_bytes,
                          FromBytes("why"))
    assert out.get(q8.name, 1, 64, 48).median_us == pytest.approx(10.0 * 34 / 64)  # 34 bytes per 32 weights vs 64
    assert out.get(q4.name, 1, 64, 48).p80_us == pytest.approx(11.0 * 18 / 64)
    assert out.get(q4.name, 7, 64, 48).median_us == 70.0  # seven tokens a call: compute-bound, no gain claimed
    assert out.get(q4.name, 1, 64, 48).emulated == "why"  # never reported as a measured speed-up
    assert not out.get(q4.name, 1, 40, 48).ok and "multiple of" in out.get(q4.name, 1, 40, 48).error


@pytest.mark.parametrize("target, message", [
    ("vlm", "Did you mean: vllm"),
    ("llama-cpp", "Did you mean: llama.cpp"),
])
def test_a_target_that_does_not_exist_is_one_line_exit_2(target, message, tmp_path, capsys):
    assert main(["search", "--target", target, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoao: error: --target:") and message in err and err.count("\n") == 1, err
    with pytest.raises(ValueError, match=message):
        autoao.optimize(_llama(), torch.zeros(1, 4, dtype=torch.long), target=target, out_dir=tmp_path / "p")


def test_export_of_a_folder_that_is_no_run_is_one_line_exit_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--format", "compressed-tensors", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoao: error:") and "RUN_DIR" in err and err.count("\n") == 1, err
