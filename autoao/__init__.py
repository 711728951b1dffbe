"""autoao: accuracy-aware automatic per-layer quantization and 2:4 sparsity for PyTorch.

    import autoao
    result = autoao.optimize(model, example_inputs, budget="10m", max_accuracy_drop=0.01)

    plan = autoao.Plan.uniform(model, "int8_dyn")   # or a searched plan
    autoao.apply(model, plan)                       # swaps nn.Linear modules in place
    autoao.save(model, "out/")                      # plan.json + model.safetensors
    autoao.load(fresh_model, "out/")                # bit-exact

`import autoao` stays light: lm-eval, triton, matplotlib and jinja2 are imported only when used.
"""

from __future__ import annotations

from autoao import search_space
from autoao.common import __version__  # noqa: F401  (autoao.__version__)
from autoao.plan import Plan, PlanError, apply, fingerprint, load, plan_of, save, validate

__all__ = ["OptimizeResult", "Plan", "PlanError", "apply", "fingerprint", "load", "optimize", "plan_of", "save",
           "search_space", "validate"]

_LAZY = {"optimize": "autoao.api", "OptimizeResult": "autoao.api"}
_LAZY_MODULES = ("models",)  # autoao.models: the built-in models (autoao.models.load("smollm2-135m"))


def __getattr__(name: str):
    # optimize pulls in optuna and the evaluators; load them on first use, not on `import autoao`.
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"autoao.{name}")
    raise AttributeError(f"module 'autoao' has no attribute {name!r}")
