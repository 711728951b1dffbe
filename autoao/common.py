"""Small helpers every stage shares; this module imports nothing from autoao, so any layer may use it.

    BASELINE                 the candidate name of the unchanged layer ("bf16": the model as it came)
    cache_dir()              where timings, layer errors, built kernels and models are cached
    call_model(model, x)     run one example input by autoao's input convention
    offline_env()            Hugging Face libraries read only local files inside this block
    atomic_write(path, fn)   readers see the old file or the new one, never a partial one
    process_age()            seconds since this process started
    model_device(model), triton_version(), is_conv1d(module)
    step_aside(name, path)   a top-level folder imported by its bare name yields to the package of that name
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

# The candidate that leaves a layer as it is. Every plan's unlisted layers run it; the search's
# warm start and the cost model's baseline are measured with it.
BASELINE = "bf16"

__version__ = "0.1.0"  # autoao's; part of every cache key (pyproject.toml holds the same)

# the Hugging Face libraries offline: models, tokenizers and lm-eval's datasets come from disk
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The autoao cache directory: `override`, else $AUTOAO_CACHE_DIR, else ~/.cache/autoao."""
    if override is not None:
        return Path(override)
    env = os.environ.get("AUTOAO_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "autoao"


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included), from /proc;
    0.0 where it cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            start_ticks = int(f.read().rpartition(b")")[2].split()[19])  # field 22: starttime
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def is_conv1d(module: nn.Module) -> bool:
    """transformers.pytorch_utils.Conv1D (GPT-2 family: y = x @ W + b, W stored [in, out]), without
    importing transformers."""
    weight = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and isinstance(weight, torch.Tensor) \
        and weight.dim() == 2


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def triton_version() -> str | None:
    """triton's version, or None where it is not installed (imported here only to read it)."""
    try:
        import triton  # lazy: triton is heavy and optional
    except ImportError:
        return None
    return triton.__version__


def call_model(model: nn.Module, example: Any) -> Any:
    """Run one example input through `model`: a tuple is positional arguments, a mapping keyword
    arguments, anything else the single argument."""
    if isinstance(example, tuple):
        return model(*example)
    if isinstance(example, Mapping):
        return model(**example)
    return model(example)


def input_numel(example: Any) -> int:
    """Elements in the tensors of one example input (nested in tuples, lists and mappings, as
    call_model takes them); other values count 0."""
    if isinstance(example, torch.Tensor):
        return example.numel()
    if isinstance(example, Mapping):
        return sum(input_numel(v) for v in example.values())
    if isinstance(example, (tuple, list)):
        return sum(input_numel(v) for v in example)
    return 0


@contextlib.contextmanager
def offline_env(env: dict[str, str] | None = None) -> Iterator[None]:
    """Set `env` (default OFFLINE_ENV) for the duration, then restore whatever was there.

    huggingface_hub reads these when first imported, so they bind if transformers is first imported
    inside; either way code inside only reads local files."""
    env = OFFLINE_ENV if env is None else env
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def atomic_write(path: Path, write: Callable[[Any], Any]) -> None:
    """Write `path` through a temporary file in the same directory, fsync, then rename over it:
    readers see the old file or the new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the mode open() would
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def step_aside(name: str, path: str) -> None:
    """Called by a top-level folder's __init__.py (kernels/, ...) when it is imported by its bare
    `name`, not as `autoao.<name>`: Python puts the working directory first on the path, so from the
    checkout's root `import kernels` finds this folder, not the distribution of that name (Hugging
    Face's `kernels`, which transformers imports). The distribution found on the rest of the path
    takes the name (sys.modules[name], which the import statement returns); without one, ImportError
    says where autoao's folder lives."""
    import importlib.machinery
    import importlib.util
    import sys

    here = Path(path).resolve().parent.parent  # the checkout's root
    rest = [p for p in sys.path if Path(p or ".").resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec(name, rest)
    if spec is None or spec.loader is None:
        raise ImportError(f"no package {name!r} is installed: {here / name} is autoao's folder, imported as "
                          f"autoao.{name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
