"""Quickstart: search a per-layer plan for a small model on the CPU, save it, apply it again.

    python examples/quickstart.py [OUT_DIR]      # default: a new temporary directory

The model is a 2-layer Llama built here from a `LlamaConfig` (random weights, bf16), so nothing is
downloaded; swap in your own model and inputs. The accuracy budget is a plain callable: the share
of next tokens the quantized model predicts as the original does. The search is 20 trials; on a
2-core CPU with an empty timing cache the script took 23-49 s, most of it timing kernels
(benchmarks/results/2026-12-01-cpu/quickstart/). Re-running with the same OUT_DIR continues the
study stored there.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import autoao


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    original = copy.deepcopy(model)  # optimize quantizes `model` in place; keep a copy to apply the plan to

    prompt = torch.randint(0, config.vocab_size, (1, 8))  # [B, T] token ids
    example_inputs = [prompt] + [prompt[:, -1:]] * 8  # the workload: an 8-token prefill, 8 one-token steps
    with torch.no_grad():
        reference = model(prompt).logits.argmax(-1)  # [B, T] the original model's next tokens

    def agreement(m: torch.nn.Module) -> float:  # higher is better
        with torch.no_grad():
            return (m(prompt).logits.argmax(-1) == reference).float().mean().item()

    result = autoao.optimize(model, example_inputs, budget=20, accuracy=agreement, max_accuracy_drop=0.05,
                             out_dir=out_dir)
    s = result.summary  # the speed-up end to end vs the model as it came, and the verdicts it shipped on
    print(f"plan: {result.plan.summary() or 'unchanged'}, measured {s.speedup.measured:.2f}x (at least "
          f"{s.speedup_bound:.2f}x); accuracy: {s.verdict.describe() if s.verdict else 'unchanged'}")
    result.plan.save(out_dir / "my_plan.json")  # JSON: layer name -> candidate (optimize also wrote plan.json)

    autoao.apply(original, autoao.Plan.load(out_dir / "my_plan.json"))  # the same plan on the other copy
    with torch.no_grad():
        if not torch.equal(model(prompt).logits, original(prompt).logits):
            raise SystemExit("the plan applied from plan.json gives other outputs than the searched model")
    print(f"same outputs; report: {result.report_path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="autoao-quickstart-")))
