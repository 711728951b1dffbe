"""The report's Deploy section as data: the target a plan was made for, what each layer becomes in
that engine, whether it loads there, and the command that exports it.

    d = deploy(plan, model, "vllm", run_dir="autoao-report")
    d.command      # "autoao export autoao-report --format compressed-tensors --out autoao-report-served"
    d.rows         # one row per candidate: how many layers, an example, what the engine runs
    d.problems     # [] when the plan loads there as planned

The records (Deploy, DeployRow) live with the run files (autoao.records), so a summary carries
them and the report renders them without importing this package.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from autoao.export import targets as tg
from autoao.plan import layer_specs
from autoao.records import Deploy, DeployRow
from autoao.types import LayerSpec


def deploy(plan: Any, layers: nn.Module | dict[str, LayerSpec], target: str, run_dir: str = "RUN_DIR") -> Deploy:
    """The Deploy section for `plan` (an autoao.Plan) on `target`; `layers`: the model or its
    fqn -> LayerSpec; run_dir: the run directory the command names."""
    chosen = tg.get(target)
    specs = layers if isinstance(layers, dict) else layer_specs(layers)
    counts: dict[str, list[str]] = {}
    cands: dict[str, Any] = {}
    for fqn in specs:
        cand = plan.layers.get(fqn)
        name = "bf16" if cand is None else cand.name
        counts.setdefault(name, []).append(fqn)
        cands.setdefault(name, cand)
    rows = tuple(DeployRow(name, len(fqns), fqns[0], chosen.describe(cands[name])) for name, fqns in counts.items())
    return Deploy(chosen.name, chosen.engine, chosen.format, chosen.export_command(run_dir),
                  tuple(tg.check_plan(plan, specs, chosen)), rows)
