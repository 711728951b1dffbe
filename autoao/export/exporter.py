"""export(): a searched model as a directory a serving engine loads, or a refusal naming every layer.

    export(run_dir, "compressed-tensors", "out/")      # a run of `autoao search` (its saved model)
    export(model, "gguf", "out/")                       # a model autoao.apply / autoao.load quantized
    export((model, plan), "compressed-tensors", "out/", calibration=...)   # applies the plan first

Steps: find the applied model and its plan; check the plan against the target (targets.check_plan:
a candidate the engine cannot load or run on that shape, fused siblings that differ) and the
format (what it cannot hold); write into a temporary sibling of `out`; check what was written
(compressed-tensors: the engine-side config checks and a fresh-process transformers reload;
GGUF: the file read back byte for byte, and a llama.cpp load where installed); write SERVING.md;
rename the directory to `out`. Any problem raises ExportError listing every one, and `out` is not
created: an export is complete and checked, or absent.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoao import models
from autoao.export import targets as tg
from autoao.export.serving import serving_md
from autoao.plan import PLAN_FILE, Plan, apply, fingerprint, layer_specs, load, plan_of
from autoao.records import RunFileError, load_context

FORMATS = tg.formats()  # format -> its default target: vllm for compressed-tensors, llama.cpp for gguf
SERVING_FILE = "SERVING.md"


class ExportError(ValueError):
    """A model that the format or the target cannot hold as planned; the message lists every layer."""


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        import difflib

        close = difflib.get_close_matches(str(fmt), list(FORMATS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}.{hint}")


def _target_for(fmt: str, target: str | None, made_for: str | None) -> tg.Target:
    """The named target (it must load `fmt`), else the one the plan was made for when it loads
    `fmt`, else the format's default (the strictest engine of the format)."""
    if target is not None:
        chosen = tg.get(target)
        if chosen not in tg.targets_of(fmt):
            raise ValueError(f"target {chosen.name!r} does not load {fmt} (it loads "
                             f"{chosen.format or 'autoao.save directories'}); choose one of "
                             f"{', '.join(t.name for t in tg.targets_of(fmt))}")
        return chosen
    if made_for in tg.TARGETS and tg.TARGETS[made_for] in tg.targets_of(fmt):
        return tg.TARGETS[made_for]
    return tg.targets_of(fmt)[0]


def applied_model(source: Any, calibration: Any = None) -> nn.Module:
    """An nn.Module carrying autoao's modules (returned as is), or (model, plan): the plan applied
    to the unquantized model (calibration: for GPTQ / AWQ / SmoothQuant plans)."""
    if isinstance(source, nn.Module):
        return source
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], nn.Module):
        model, plan = source
        carried = plan_of(model)
        if not carried.layers:
            return apply(model, plan, calibration=calibration)
        if {f: c.name for f, c in carried.layers.items()} != {f: c.name for f, c in plan.layers.items()}:
            raise ValueError("the model is already quantized with another plan than the one given; pass the "
                             "unquantized model with the plan, or the quantized model alone")
        return model
    raise ValueError(f"export's source must be a run directory, a quantized model, or (model, plan); got "
                     f"{type(source).__name__}")


def model_from_run(run_dir: Path) -> tuple[nn.Module, Any, Path | None, Plan]:
    """(the run's saved model, loaded bit-exactly; its tokenizer; the GGUF file it came from or None;
    the saved plan) for a run of a built-in model, found by the saved plan's model fingerprint."""
    saved = run_dir / "model"
    if not (saved / PLAN_FILE).is_file():
        raise ValueError(f"{run_dir} is not a finished autoao run directory: {saved / PLAN_FILE} does not exist "
                         "(autoao search writes it when it ends)")
    plan = Plan.load(saved / PLAN_FILE)
    dtype = _run_dtype(run_dir)
    for name, spec in models.MODELS.items():
        if spec.kind != "causal-lm":
            continue
        try:
            model, tokenizer = models.load(name, dtype=dtype)
        except ImportError:
            continue
        if fingerprint(model) == plan.model_fingerprint:
            source = models.gguf_path(name) if spec.gguf_file.endswith(".gguf") else None
            return load(model, saved), tokenizer, source, plan
    raise ValueError(f"{run_dir}: the run's model ({plan.model_class}, {plan.num_linears} linear layers) is not a "
                     "built-in model; export it from Python: autoao.export.export((model, plan), ...) with the "
                     "model rebuilt, or autoao.load(model, run_dir / 'model') first")


def _run_dtype(run_dir: Path) -> torch.dtype:
    """The model dtype the run recorded (context.json), bf16 where it did not."""
    try:
        name = load_context(run_dir / "context.json").model.dtype
    except (RunFileError, OSError, ValueError):
        return torch.bfloat16
    value = getattr(torch, str(name).removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) else torch.bfloat16


def _new_dir(out: Path) -> Path:
    """A temporary sibling of `out` to write into; ValueError if `out` exists and is not empty."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty directory; choose a new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))


def _raise(problems: list[str], what: str) -> None:
    if problems:
        raise ExportError(f"{what}: {len(problems)} problem(s):\n" + "\n".join(problems))


def export(source: Any, format: str, out: str | os.PathLike, *, tokenizer: Any = None, target: str | None = None,
           calibration: Any = None, source_gguf: str | os.PathLike | None = None, check: bool = True) -> Path:
    """Write `source` as a checkpoint of `format` ("compressed-tensors" or "gguf") into the new
    directory `out`, with SERVING.md; return `out`.

    source: a run directory of `autoao search` (a built-in model's), a model quantized by
    autoao.apply / autoao.load, or (unquantized model, Plan). tokenizer: saved with a
    compressed-tensors export (a run directory brings its own). target: the engine whose rules the
    export must meet (default: the plan's `metadata["target"]` when it loads `format`, else vllm
    for compressed-tensors and llama.cpp for gguf). source_gguf: a GGUF file whose tokenizer the GGUF
    export copies (a run directory of the demo model brings its own). check: run the checks of
    what was written (the reload in a fresh process takes a few seconds).

    Raises ValueError for bad arguments and ExportError (a ValueError) naming every layer the
    format or target cannot hold as planned; nothing is written then."""
    _check_format(format)
    out = Path(out)
    gguf_src = Path(source_gguf) if source_gguf is not None else None
    given = source[1] if isinstance(source, tuple) and len(source) == 2 else None
    if isinstance(source, (str, os.PathLike)):
        model, run_tokenizer, run_gguf, given = model_from_run(Path(source))
        tokenizer, gguf_src = tokenizer or run_tokenizer, gguf_src or run_gguf
    else:
        model = applied_model(source, calibration)
    # the model carries its plan (plan_of); the target it was made for is in the plan file's metadata
    plan, specs = plan_of(model), layer_specs(model)
    made_for = getattr(given, "metadata", {}).get("target")
    chosen = _target_for(format, target, made_for)
    problems = chosen.model_problems(model) + tg.check_plan(plan, specs, chosen)
    _raise(problems, f"cannot export to {format} for {chosen.engine}")
    tmp = _new_dir(out)
    try:
        engine_problems = chosen.write(model, tmp, specs, tokenizer=tokenizer, source=gguf_src, check=check)
        _raise(engine_problems.get(chosen.name, []), f"the {format} export would not run as planned in {chosen.engine}")
        rows = {fqn: plan.layers.get(fqn) for fqn in specs}
        text = serving_md(out, chosen, rows, tg.targets_of(format), engine_problems, made_for)
        (tmp / SERVING_FILE).write_text(text)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
