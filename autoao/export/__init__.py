"""Serving a plan: export to the checkpoint an engine loads, and the targets' rules.

    from autoao.export import export
    export("autoao-report/", "compressed-tensors", "served/")   # vLLM, SGLang, transformers
    export(quantized_model, "gguf", "served-gguf/")             # llama.cpp

    from autoao.export import targets
    targets.get("vllm").supports(candidate, layer)              # None, or why vLLM cannot run it
    targets.check_plan(plan, model, "llama.cpp")                # [] when the plan loads there

`autoao.export.command` holds the `autoao export` subcommand (add_parser, run). Importing this
package imports neither compressed-tensors, gguf nor llama.cpp; each is imported when used.
"""

from __future__ import annotations

from autoao.export import targets
from autoao.export.exporter import FORMATS, ExportError, export
from autoao.export.targets import TARGETS, Target, check_plan

__all__ = ["FORMATS", "TARGETS", "ExportError", "Target", "check_plan", "export", "targets"]
