"""Exports a serving engine loads: compressed-tensors (vLLM, SGLang, transformers) and GGUF (llama.cpp).

On a small random-init LlamaForCausalLM (2 layers, K = 256 / 512: Marlin's K % 128 holds):
- the compressed-tensors export holds autoao's own codes and scales bit for bit, reloads with
  transformers + compressed-tensors, dequantizes to exactly autoao's weights, and its logits match
  autoao's applied model: within 1e-5 relative in fp32 for weight-only plans (the two multiply in
  another order: (x @ q) * s against x @ (q * s)), within 2% relative norm in bf16 for the full mix
  (transformers fake-quantizes int8 activations with amax / 127.5 where autoao and vLLM use amax /
  127, and autoao's CPU fp8 path rounds its output to bf16);
- what the format or an engine cannot hold is refused with every layer named, and nothing written;
- the GGUF export reads back (gguf.GGUFReader) with every tensor's type as planned and bytes equal to
  the module's canonical blocks; where llama.cpp is installed, its greedy tokens on the demo model
  equal autoao's emulated model's (tests/test_gguf_candidates.py checks the emulation against ggml).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

import autoao
from autoao import search_space
from autoao.export import ExportError, export, targets
from autoao.export import compressed_tensors as ct
from autoao.export import gguf as gg
from autoao.kernels import gguf as kg
from autoao.types import LayerSpec

from conftest import requires_demo_model

pytest.importorskip("compressed_tensors", reason="the compressed-tensors export needs `pip install compressed-tensors`")
transformers = pytest.importorskip("transformers")

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def tiny_llama(dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def ids(seed: int = 1, length: int = 24) -> torch.Tensor:
    return torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(seed))


def mixed_layers(weight_only: bool = False) -> dict[str, search_space.Candidate]:
    """Layer 0: q/k/v int8 dynamic, o fp8 weight-only, gate int8_wo RTN and up int8_wo GPTQ (one
    W8A16 scheme: vLLM may fuse them), down fp8 dynamic. Layer 1: q/k/v int8 dynamic, o fp8
    weight-only, gate and up int4 symmetric group 64 by RTN and by GPTQ (one W4A16 scheme), down
    left as it came. weight_only: the activation-quantized layers left as they came."""
    get = search_space.get
    layers = {}
    for i in range(2):
        p = f"model.layers.{i}."
        if not weight_only:
            layers.update({p + f"self_attn.{n}": get("int8_dyn") for n in ("q_proj", "k_proj", "v_proj")})
        layers[p + "self_attn.o_proj"] = get("fp8_wo")
        if i == 0:
            layers[p + "mlp.gate_proj"], layers[p + "mlp.up_proj"] = get("int8_wo"), get("int8_wo(algorithm=gptq)")
        else:
            layers[p + "mlp.gate_proj"] = get("int4_sym(group_size=64)")
            layers[p + "mlp.up_proj"] = get("int4_sym(group_size=64, algorithm=gptq)")
        if i == 0 and not weight_only:
            layers[p + "mlp.down_proj"] = get("fp8_dyn")
    return layers


def applied(dtype: torch.dtype, layers: dict) -> torch.nn.Module:
    from autoao.profile import profile

    model = tiny_llama(dtype)
    calib = profile(model, [ids(2, 64)]).calibration
    return autoao.apply(model, autoao.Plan.for_model(model, layers, target="vllm"), calibration=calib)


def dequantized(module) -> torch.Tensor:
    """The float32 weight [N, K] an applied int8 / fp8 / int4_sym module computes with (exact)."""
    from autoao.kernels.quant import dequantize_int4_groupwise, unpack_int4

    c = module.canonical()
    if "scales" in c:
        return dequantize_int4_groupwise(unpack_int4(c["qweight"]), c["scales"], c["zeros"])
    scale = c["scale"]
    return c["qweight"].float() * (scale[:, None] if scale.dim() else scale)


@pytest.fixture(scope="module")
def ct_export(tmp_path_factory):
    """The full mixed plan in fp32, exported once."""
    model = applied(torch.float32, mixed_layers())
    out = export(model, "compressed-tensors", tmp_path_factory.mktemp("ct") / "export")
    return model, out


def test_config_groups_ignore_and_format_as_planned(ct_export):
    model, out = ct_export
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "mixed-precision"
    assert "sparsity_config" not in q and q["quantization_status"] == "compressed"
    planned = autoao.plan_of(model).layers
    by_layer = {}
    for group in q["config_groups"].values():
        for fqn in group["targets"]:
            by_layer[fqn] = (group["format"], group["weights"]["type"], group["weights"]["strategy"],
                             (group["input_activations"] or {}).get("strategy"))
    assert set(by_layer) == set(planned)
    assert by_layer["model.layers.0.self_attn.q_proj"] == ("int-quantized", "int", "channel", "token")
    assert by_layer["model.layers.0.mlp.up_proj"] == ("pack-quantized", "int", "channel", None)
    assert by_layer["model.layers.1.mlp.up_proj"] == ("pack-quantized", "int", "group", None)
    assert by_layer["model.layers.1.self_attn.o_proj"] == ("float-quantized", "float", "channel", None)
    assert by_layer["model.layers.0.mlp.down_proj"] == ("float-quantized", "float", "channel", "token")
    assert q["ignore"] == ["model.layers.1.mlp.down_proj", "lm_head"]
    text = (out / "SERVING.md").read_text()
    assert "vllm serve" in text and "W8A16" in text and "loads as planned" in text


def test_stored_codes_and_scales_are_autoaos(ct_export):
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors.torch import load_file

    from autoao.kernels.quant import unpack_int4

    model, out = ct_export
    stored = load_file(out / "model.safetensors")
    for fqn, cand in autoao.plan_of(model).layers.items():
        c = model.get_submodule(fqn).canonical()
        if cand.family == "int4_sym":  # signed codes q - 8, eight per int32; scales [N, K/64]
            q = unpack_from_int32(stored[f"{fqn}.weight_packed"], 4, torch.Size([c["qweight"].shape[0], 256]))
            assert torch.equal(q, unpack_int4(c["qweight"]).to(torch.int8) - 8), fqn
            assert torch.equal(stored[f"{fqn}.weight_scale"], c["scales"].float()) and not c["zeros"].any(), fqn
            continue
        if cand.family == "int8_wo":
            q = unpack_from_int32(stored[f"{fqn}.weight_packed"], 8, torch.Size(c["qweight"].shape))
            assert stored[f"{fqn}.weight_shape"].tolist() == list(c["qweight"].shape)
        else:
            q = stored[f"{fqn}.weight"]
        assert q.dtype == c["qweight"].dtype and torch.equal(q.view(torch.uint8), c["qweight"].view(torch.uint8)), fqn
        assert torch.equal(stored[f"{fqn}.weight_scale"].reshape(-1), c["scale"].reshape(-1)), fqn


def test_reload_dequantizes_to_autoaos_weights_and_logits_match(ct_export):
    model, out = ct_export
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():  # (compressed-tensors decompresses the weights on the first forward)
        ours, theirs = model(ids()).logits, reloaded(ids()).logits
    for fqn in autoao.plan_of(model).layers:
        assert torch.equal(reloaded.get_submodule(fqn).weight, dequantized(model.get_submodule(fqn))), fqn
    assert float((ours - theirs).norm() / ours.norm()) < 0.02


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=str)
def test_logits_of_weight_only_plans(tmp_path, dtype, tolerance):
    model = applied(dtype, mixed_layers(weight_only=True))
    out = export(model, "compressed-tensors", tmp_path / "wo", check=False)  # reloaded here, in-process
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=dtype).eval()
    with torch.no_grad():
        ours, theirs = model(ids()).logits.float(), reloaded(ids()).logits.float()
    assert float((ours - theirs).abs().max() / ours.abs().max()) < tolerance


def test_refused_layers_are_named_and_nothing_is_written(tmp_path):
    layers = mixed_layers()
    layers["model.layers.0.self_attn.k_proj"] = search_space.get("int4_wo(group_size=64)")
    layers["model.layers.1.self_attn.k_proj"] = search_space.get("int4_wo(group_size=64, algorithm=gptq)")
    layers["model.layers.1.mlp.down_proj"] = search_space.get("sparse24")
    layers["model.layers.1.self_attn.q_proj"] = search_space.get("int8_dyn(algorithm=smoothquant)")
    model = applied(torch.bfloat16, layers)
    with pytest.raises(ExportError) as e:
        export(model, "compressed-tensors", tmp_path / "x")
    msg = str(e.value)
    for fqn, why in [("model.layers.0.self_attn.k_proj", "float zero points"),
                     ("model.layers.1.self_attn.k_proj", "float zero points"),
                     ("model.layers.1.mlp.down_proj", "2:4"), ("model.layers.1.self_attn.q_proj", "SmoothQuant"),
                     ("model.layers.0.self_attn.qkv_proj", "one scheme")]:
        assert any(fqn in line and why in line for line in msg.splitlines()), (fqn, msg)
    assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())


def test_engine_checks_on_a_written_config():
    vllm, hf = targets.get("vllm"), targets.get("transformers")
    specs = {f"m.layers.0.mlp.{n}": LayerSpec(f"m.layers.0.mlp.{n}", 576, 1536, False, torch.bfloat16)
             for n in ("gate_proj", "up_proj")}
    w8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    config = {"sparsity_config": {"format": "sparse-24-bitmask"}, "config_groups": {
        "a": {"targets": ["m.layers.0.mlp.gate_proj"], "format": "pack-quantized",
              "weights": {**w8, "actorder": "weight"}},
        "b": {"targets": ["m.layers.0.mlp.up_proj"], "format": "int-quantized", "weights": w8,
              "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}}}
    problems = "\n".join(ct.config_problems(config, specs, vllm))
    assert "sparsity_config" in problems and "act-order" in problems
    assert "K=576 is not a multiple of 128" in problems and "gate_up_proj" in problems
    assert "gate_up_proj" not in "\n".join(ct.config_problems(config, specs, hf))  # transformers fuses nothing


def test_reload_check_catches_a_layer_loading_as_another_scheme(ct_export, tmp_path):
    import shutil

    model, out = ct_export
    copy = tmp_path / "tampered"
    shutil.copytree(out, copy)
    config = json.loads((copy / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        if group["format"] == "int-quantized":  # the int8 dynamic layers would run weight-only
            group["input_activations"] = None
    (copy / "config.json").write_text(json.dumps(config))
    specs = autoao.plan.layer_specs(model)
    schemes = {f: ct.scheme_of(search_space.candidate_of(model.get_submodule(f))) for f in specs}
    problems = ct.reload_check(copy, schemes, torch.float32)
    assert len(problems) == 6 and all("planned W8A8-INT8" in p for p in problems)  # (the untouched export passed)


def test_targets_registry_and_search_spaces():
    with pytest.raises(ValueError, match="Did you mean: llama.cpp"):
        targets.get("llama_cpp")
    llama = targets.get("llama.cpp")
    names = {c.name for c in llama.candidates()}
    assert names == {"bf16", "gguf(type=q8_0)", "gguf(type=q4_0)", "gguf(type=q4_1)", "gguf(type=q6_k)"}
    assert not any(c.family == "gguf" for c in search_space.all_candidates())  # the default space is unchanged
    vllm_space = {c.family for c in targets.get("vllm").candidates()}
    assert "int8_wo" in vllm_space and not vllm_space & {"int4_wo", "sparse24", "gguf"}
    assert {c.name for c in targets.get("autoao").candidates()} == {c.name for c in search_space.all_candidates()}
    wide = LayerSpec("x", 576, 1536, False, torch.bfloat16)
    assert "K=576" in targets.get("vllm").supports(search_space.get("int8_wo"), wide)
    assert targets.get("transformers").supports(search_space.get("int8_wo"), wide) is None
    narrow = LayerSpec("x", 48, 64, False, torch.float32)
    assert "multiple of 32" in llama.supports(search_space.get("gguf(type=q4_0)"), narrow)
    assert "GGUF block types only" in llama.supports(search_space.get("int8_wo"), wide)
    assert targets.get("vllm").supports(object(), wide).startswith("vLLM support check failed")  # never raises
    assert "Q8_0" in llama.describe(search_space.get("gguf(type=q4_0)")) and "Marlin" in targets.get("vllm").describe(
        search_space.get("int8_wo"))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_sym_is_int4_wo_with_zero_zeros(group_size):
    """The compressed-tensors targets' int4: int4_wo's kernels and canonical tensors, every zero 0."""
    from autoao.calibration import LayerStats
    from autoao.kernels.algorithms import output_error_energy

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 128, bias=False)
    x = torch.randn(64, 256)
    rtn = search_space.get("int4_sym", group_size=group_size).build(lin, fqn="l")
    gptq = search_space.get("int4_sym", group_size=group_size, algorithm="gptq").build(lin, LayerStats(sample=x),
                                                                                       fqn="l")
    for m in (rtn, gptq):
        assert not m.canonical()["zeros"].any()
        with torch.no_grad():
            y, ref, ideal = m(x), m.reference(x), lin(x)
        assert float(((ref - y).pow(2).sum() / ref.pow(2).sum()).log10()) * -10 > 40  # kernel vs reference
        assert float(((ideal - y).pow(2).sum() / ideal.pow(2).sum()).log10()) * -10 > m_bound(m)
    hessian = x.t() @ x / len(x)
    w = lin.weight.detach()
    assert output_error_energy(w, dequantized(gptq), hessian) <= output_error_energy(w, dequantized(rtn), hessian)
    assert "int4_sym(group_size=64)" in {c.name for c in targets.get("vllm").candidates()}


def m_bound(module) -> float:
    return search_space.candidate_of(module).sqnr_bound_db


def test_check_plan_names_mixed_fused_groups():
    model = tiny_llama(torch.bfloat16)
    plan = autoao.Plan.for_model(model, {"model.layers.0.mlp.gate_proj": search_space.get("int8_wo"),
                                         "model.layers.0.mlp.up_proj": search_space.get("int8_wo(algorithm=gptq)"),
                                         "model.layers.1.mlp.gate_proj": search_space.get("int8_wo")})
    problems = targets.check_plan(plan, model, "vllm")
    assert len(problems) == 1 and "model.layers.1.mlp.gate_up_proj" in problems[0] and "up_proj: bf16" in problems[0]
    assert targets.check_plan(plan, model, "transformers") == []


def test_export_arguments_are_checked(tmp_path):
    model = tiny_llama(torch.bfloat16)
    with pytest.raises(ValueError, match="--format must be one of compressed-tensors, gguf.*Did you mean 'gguf'"):
        export(model, "ggfu", tmp_path / "a")
    with pytest.raises(ValueError, match="does not load compressed-tensors"):
        export(model, "compressed-tensors", tmp_path / "a", target="llama.cpp")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        export(model, "compressed-tensors", tmp_path / "full")
    with pytest.raises(ValueError, match="is not a finished autoao run directory"):
        export(tmp_path / "nothing", "gguf", tmp_path / "b")


##### GGUF ######################################################################################

GGUF_PLAN = {"self_attn.q_proj": "q4_0", "self_attn.k_proj": "q4_1", "self_attn.v_proj": "q8_0",
             "self_attn.o_proj": "q6_k", "mlp.gate_proj": "q8_0", "mlp.up_proj": "q4_1"}  # down: as it came


def test_gguf_export_reads_back_as_planned(tmp_path):
    import gguf

    model = tiny_llama(torch.bfloat16)
    layers = {f"model.layers.{i}.{n}": search_space.get("gguf", type=t) for i in range(2) for n, t in GGUF_PLAN.items()}
    layers["lm_head"] = search_space.get("gguf(type=q8_0)")
    autoao.apply(model, autoao.Plan.for_model(model, layers, target="llama.cpp"))
    out = export(model, "gguf", tmp_path / "g")
    reader = gguf.GGUFReader(out / "model.gguf")
    stored = {t.name: t for t in reader.tensors}
    kinds = {name: t.tensor_type.name for name, t in stored.items()}
    assert kinds["blk.0.attn_q.weight"] == "Q4_0" and kinds["blk.1.attn_k.weight"] == "Q4_1"
    assert kinds["blk.1.attn_output.weight"] == "Q6_K"
    assert kinds["blk.0.ffn_down.weight"] == "BF16" and kinds["output.weight"] == "Q8_0"
    assert kinds["blk.0.attn_norm.weight"] == "F32" and kinds["token_embd.weight"] == "BF16"
    for i in range(2):
        for n, t in GGUF_PLAN.items():
            name = f"blk.{i}.{gg._LAYER_NAMES[n]}.weight"
            module = model.get_submodule(f"model.layers.{i}.{n}")
            ours = kg.dequantize(module.canonical()["blocks"], t)  # [N, K] what autoao computes with
            theirs = torch.from_numpy(gguf.quants.dequantize(np.asarray(stored[name].data), stored[name].tensor_type))
            if n == "self_attn.q_proj":
                ours = gg._permute(ours, 4)
            elif n == "self_attn.k_proj":
                ours = gg._permute(ours, 2)
            assert torch.equal(ours, theirs.reshape(ours.shape)), name
    assert gg.read_check(out / "model.gguf", model) == []
    assert "llama-server" in (out / "SERVING.md").read_text()


def test_gguf_refuses_what_llama_cpp_cannot_run(tmp_path):
    model = tiny_llama(torch.bfloat16)
    autoao.apply(model, autoao.Plan.for_model(model, {"model.layers.0.mlp.up_proj": search_space.get("int8_wo")}))
    with pytest.raises(ExportError, match=r"model.layers.0.mlp.up_proj \(512x256\): int8_wo: llama.cpp runs GGUF"):
        export(model, "gguf", tmp_path / "g")
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=128, vocab_size=64))
    with pytest.raises(ExportError, match="writes the llama architecture only"):
        export(bert, "gguf", tmp_path / "b")


@pytest.mark.slow
@requires_demo_model
@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="needs llama.cpp's Python package (docs/serving.md: pip install "
                                              "llama-cpp-python, a source build)")
def test_llama_cpp_greedy_tokens_equal_the_emulated_models(tmp_path):
    """SmolLM2 with a mix of GGUF types, in fp32 (llama.cpp's activations are fp32): llama.cpp's
    greedy continuation of a short prompt equals autoao's emulated model's, and its logits on
    those tokens are as close to the emulation's as the emulation is to itself summed in ggml's
    order. (Each matmul computes the same numbers up to rounding, but across 30 layers a rounding
    difference flips 8-bit activation codes: logits differ by a few percent at most, so only a
    short continuation is compared token for token.)"""
    import subprocess
    import sys

    from autoao import models
    from autoao.kernels.gguf import GgufLinear

    model, tokenizer = models.load(dtype=torch.float32)
    layers = {}
    for fqn in autoao.plan.layer_specs(model):
        kind = {"mlp.down_proj": "q8_0", "self_attn.v_proj": "q4_1"}.get(fqn.split(".", 3)[-1], "q4_0")
        layers[fqn] = search_space.get("gguf", type=kind if fqn != "lm_head" else "q8_0")
    autoao.apply(model, autoao.Plan.for_model(model, layers))
    out = export(model, "gguf", tmp_path / "g", source_gguf=models.gguf_path())
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=8, do_sample=False)  # [1, T + 8]
        ours = model(tokens).logits[0]  # [T + 8, V]
    script = ("import json, sys, llama_cpp\n"
              "m = llama_cpp.Llama(sys.argv[1], n_ctx=64, n_threads=2, verbose=False, logits_all=True,\n"
              "                    type_k=0, type_v=0)\n"  # an F32 KV cache, as the fp32 model has
              "t = json.loads(sys.argv[2]); m.eval(t); out = []\n"
              "for _ in range(8):\n"
              "    n = int(m.scores[m.n_tokens - 1].argmax()); out.append(n); m.eval([n])\n"
              "m.reset(); m.eval(json.loads(sys.argv[3]))\n"
              "print(json.dumps(out)); print(json.dumps(m.scores[:m.n_tokens].tolist()))\n")
    run = subprocess.run([sys.executable, "-c", script, str(out / "model.gguf"), json.dumps(prompt[0].tolist()),
                          json.dumps(tokens[0].tolist())], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    greedy, logits = run.stdout.strip().splitlines()[-2:]
    assert json.loads(greedy) == tokens[0, prompt.shape[1]:].tolist()
    for m in model.modules():  # the same numbers summed in ggml's order: the spread of rounding
        if isinstance(m, GgufLinear):
            m._forward = m.reference
    with torch.no_grad():
        spread = float((model(tokens).logits[0] - ours).abs().max())
    assert float((torch.tensor(json.loads(logits)) - ours).abs().max()) <= 2 * spread


##### the CLI hook ##############################################################################

def _parse(argv: list[str]):
    import argparse

    from autoao.export import command

    parser = argparse.ArgumentParser(prog="autoao")
    command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_command_names_a_bad_run_dir(tmp_path):
    from autoao.export import command

    args = _parse(["export", str(tmp_path / "missing"), "--format", "gguf", "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="RUN_DIR .*missing is not a directory"):
        command.run(args)
    with pytest.raises(SystemExit):  # argparse: an unknown format is a usage error (exit 2)
        _parse(["export", str(tmp_path), "--format", "onnx", "--out", str(tmp_path / "o")])


@pytest.mark.slow
@requires_demo_model
def test_command_exports_a_run_of_the_demo_model(tmp_path):
    """A run directory holds the saved model (autoao.save); export finds the built-in model by the
    plan's fingerprint, loads the saved codes and writes them."""
    from autoao import models
    from autoao.export import command

    model, _ = models.load()
    layers = {f"model.layers.{i}.mlp.down_proj": search_space.get("gguf(type=q4_0)") for i in range(30)}
    autoao.apply(model, autoao.Plan.for_model(model, layers))
    autoao.save(model, tmp_path / "run" / "model")
    args = _parse(["export", str(tmp_path / "run"), "--format", "gguf", "--out", str(tmp_path / "served")])
    assert command.run(args) == 0
    assert gg.read_check(tmp_path / "served" / "model.gguf", model) == []
    with pytest.raises(ExportError, match="model.layers.0.mlp.down_proj.*gguf\\(type=q4_0\\): a GGUF block type"):
        command.run(_parse(["export", str(tmp_path / "run"), "--format", "compressed-tensors",
                            "--out", str(tmp_path / "ct")]))


def test_deploy_section_data():
    from autoao.export.deploy import deploy

    model = tiny_llama(torch.bfloat16)
    plan = autoao.Plan.for_model(model, {f"model.layers.{i}.mlp.{n}": search_space.get("int8_wo")
                                         for i in range(2) for n in ("gate_proj", "up_proj")})
    d = deploy(plan, model, "vllm", run_dir="out")
    assert d.command == "autoao export out --format compressed-tensors --out out-served --target vllm"
    assert d.problems == () and {r.candidate: r.layers for r in d.rows} == {"bf16": 11, "int8_wo": 4}
    assert "Marlin" in next(r.runs for r in d.rows if r.candidate == "int8_wo")
    assert deploy(plan, model, "autoao").command is None
    assert len(deploy(plan, model, "llama.cpp").problems) == 4


def test_layer_candidates_hold_what_the_target_loads():
    specs = autoao.plan.layer_specs(tiny_llama(torch.bfloat16))
    space = targets.layer_candidates("llama.cpp", specs, "cpu")
    assert {c.name for c in space["model.layers.0.mlp.down_proj"]} == {
        "bf16", "gguf(type=q8_0)", "gguf(type=q4_0)", "gguf(type=q4_1)", "gguf(type=q6_k)"}
    llama = targets.get("llama.cpp")
    down = specs["model.layers.0.mlp.down_proj"]  # 256 x 512: Q6_K's 210 bytes per 256 inputs
    assert llama.weight_bytes(search_space.get("gguf(type=q6_k)"), down) == 256 * 2 * 210
    assert llama.weight_bytes(None, down) == 256 * 512 * 2 and targets.get("vllm").weight_bytes(None, down) is None
    vllm = targets.layer_candidates("vllm", specs, "cpu")["model.layers.0.self_attn.k_proj"]  # N = 128
    assert "int4_sym(group_size=128)" in {c.name for c in vllm} and not any(c.family == "sparse24" for c in vllm)


def test_a_plan_made_for_transformers_exports_with_its_rules_and_serving_says_what_vllm_would_refuse(tmp_path):
    model = tiny_llama(torch.bfloat16)
    plan = autoao.Plan.for_model(model, {"model.layers.0.self_attn.q_proj": search_space.get("int8_wo")},
                                 target="transformers")  # k/v left as they came: vLLM fuses q/k/v
    out = export((model, plan), "compressed-tensors", tmp_path / "hf", check=False)
    text = (out / "SERVING.md").read_text()
    assert "made for `transformers`" in text and "vLLM (**would not run as planned**)" in text
    assert "transformers (loads as planned)" in text and "model.layers.0.self_attn.qkv_proj" in text
    with pytest.raises(ExportError, match="qkv_proj"):  # the same plan, held to vLLM's rules
        export((tiny_llama(torch.bfloat16), plan), "compressed-tensors", tmp_path / "v", target="vllm")


def test_a_quantized_tied_lm_head_is_untied_in_the_config(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    autoao.apply(model, autoao.Plan.for_model(model, {"lm_head": search_space.get("int8_wo")}))
    out = export(model, "compressed-tensors", tmp_path / "tied", target="transformers")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        reloaded(ids(length=4))
    assert torch.equal(reloaded.lm_head.weight, dequantized(model.lm_head))
    assert torch.equal(reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
