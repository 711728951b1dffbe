"""SERVING.md, written into every export: how to serve the directory with each engine of its format,
whether that engine loads it as planned, and what each layer runs there."""

from __future__ import annotations

from pathlib import Path

from autoao.export.targets import Target
from autoao.search_space import Candidate

_COMMANDS = {
    "vllm": "vllm serve {dir}",
    "sglang": "python -m sglang.launch_server --model-path {dir}",
    "transformers": ("python -c \"from transformers import AutoModelForCausalLM; "
                     "m = AutoModelForCausalLM.from_pretrained('{dir}')\"   # pip install compressed-tensors"),
    "llama.cpp": "llama-server -m {dir}/model.gguf      # or: llama-cli -m {dir}/model.gguf -p 'Hello'",
}

_FORMAT_NOTES = {
    "compressed-tensors": (
        "A compressed-tensors checkpoint (config.json's `quantization_config`, one config group per scheme "
        "with exact layer names, unquantized layers in `ignore`) holding autoao's own codes and scales, "
        "bit for bit. After writing, autoao loaded it in a fresh process with transformers and compared "
        "every layer's scheme with the plan."),
    "gguf": (
        "A GGUF file whose quantized tensors are the very blocks autoao computed with (read back and "
        "compared byte for byte after writing). llama.cpp quantizes activations to 8 bits per block of 32 "
        "in every quantized matmul; autoao's accuracy numbers for this plan were measured with that "
        "emulated. Speeds measured by autoao for GGUF types come from llama.cpp itself, never from the "
        "emulation."),
}


def _layers_table(rows: dict[str, Candidate | None], targets: list[Target]) -> list[str]:
    """One line per candidate: how many layers have it, a few of their names, and what each
    engine runs for it."""
    by_cand: dict[str, list[str]] = {}
    first: dict[str, Candidate | None] = {}
    for fqn, cand in rows.items():
        key = "as it came (bf16)" if cand is None or cand.family == "bf16" else cand.name
        by_cand.setdefault(key, []).append(fqn)
        first.setdefault(key, cand)
    head = "| plan | layers | " + " | ".join(t.engine for t in targets) + " |"
    lines = [head, "|" + "---|" * (2 + len(targets))]
    for key, fqns in by_cand.items():
        shown = ", ".join(f"`{f}`" for f in fqns[:3]) + (f" and {len(fqns) - 3} more" if len(fqns) > 3 else "")
        cells = " | ".join(t.describe(first[key]) for t in targets)
        lines.append(f"| `{key}` | {len(fqns)}: {shown} | {cells} |")
    return lines


def serving_md(directory: Path, fmt: str, rows: dict[str, Candidate | None], targets: list[Target],
               problems: dict[str, list[str]], made_for: str | None) -> str:
    """The text of SERVING.md. rows: every linear layer -> its candidate (None: unchanged);
    problems: target name -> what it would refuse ([]: loads as planned); made_for: the target the
    plan was searched for, if it says."""
    lines = [f"# Serving {directory.name}", "", _FORMAT_NOTES[fmt], ""]
    if made_for:
        lines += [f"The plan was made for `{made_for}`.", ""]
    lines += ["## Commands", ""]
    for t in targets:
        state = "loads as planned" if not problems.get(t.name) else "**would not run as planned**"
        lines += [f"- {t.engine} ({state}):", "", f"      {_COMMANDS[t.name].format(dir=directory)}", ""]
        lines += [f"  {p.strip()}" for p in problems.get(t.name, [])[:20]]
        if len(problems.get(t.name, [])) > 20:
            lines.append(f"  ... and {len(problems[t.name]) - 20} more")
        if problems.get(t.name):
            lines.append("")
    lines += ["## What each layer runs", ""] + _layers_table(rows, targets) + [""]
    return "\n".join(lines)
