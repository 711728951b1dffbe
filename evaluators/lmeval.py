"""lm-eval on a model already in memory, offline, with autoao's own bundled tasks.

    from autoao.evaluators import lmeval
    result = lmeval.evaluate(model, tokenizer, ["autoao_facts", "autoao_text"], limit=100)
    result.metrics["autoao_facts"]["acc"], result.metrics["autoao_text"]["word_perplexity"]
    result.seconds

Two ways in, one set of numbers:
- a transformers `PreTrainedModel` goes through lm-eval's own `HFLM`, handed the model object (not a
  name), so nothing is reloaded or copied and an autoao-quantized model is scored as it stands;
- any other causal LM -- an `nn.Module` mapping input_ids [B, T] to logits [B, T, V], or to an
  object with `.logits` -- goes through `CausalLM` (evaluators/lm_adapter.py). It is a `TemplateLM` that tokenizes and
  windows exactly as HFLM does, so the two give the same log-likelihoods on the same model (tested).
Both take the log-softmax in float32: HFLM would otherwise take it in the model's dtype, and a bf16
log-softmax blurs the small differences between quantization plans that we are trying to measure.

Tasks: `task_names()` are bundled with autoao (tasks/*.yaml + JSONL written for it, no network):
`autoao_facts` (372 four-choice questions, acc; chance is 25%) and `autoao_text` (21 documents,
about 6,000 words of original prose; word/byte perplexity, bits per byte). They are registered
through `TaskManager(include_path=...)` from a temporary folder, where each YAML's `data_files` is
made absolute and its HF datasets cache points into that folder. Any other lm-eval task name passes
through for users whose HF datasets cache already holds its data.

The environment is offline for the run (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE).
huggingface_hub and datasets read those variables when first imported, so they bind only if this is
the first import in the process; the bundled tasks need no network either way (local JSON files).
The datasets cache is moved per task (`cache_dir`) rather than through HF_DATASETS_CACHE for the
same reason, and so that other lm-eval tasks still find the data in the user's own cache.

Importing this module imports `lm_eval.api.model` (and with it jinja2), which `CausalLM` subclasses;
lm_eval's evaluator, datasets and transformers are imported only by `evaluate`. Modules on the
`import autoao` path must import this one inside functions.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from autoao.common import offline_env
from autoao.evaluators.lm_adapter import CausalLM, PerDocument, wrap  # noqa: F401  (CausalLM: re-exported)

TASKS_DIR = Path(__file__).with_name("tasks")


def task_names() -> list[str]:
    """The tasks bundled with autoao; they run offline."""
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


_NAME_LINE = re.compile(r"^\s*(?:(?:task|group|tag)\s*:\s*|-\s*)[\"']?([A-Za-z0-9_\-.]+)[\"']?\s*$", re.M)


def check_tasks(names: list[str]) -> None:
    """Raise ValueError naming every task lm-eval cannot find, with "did you mean" suggestions,
    before any model is measured. Bundled tasks are known; others are looked up in lm-eval's task
    folder by the names its YAML files declare (about 1 s), and only a name with no close match
    there goes through lm-eval's own (slower) task index."""
    import lm_eval

    unknown = [n for n in names if n not in task_names()]
    if not unknown:
        return
    declared = set(task_names())
    for path in (Path(lm_eval.__file__).parent / "tasks").rglob("*.yaml"):
        declared.update(_NAME_LINE.findall(path.read_text(errors="ignore")))
    problems = []
    for name in unknown:
        if name in declared:
            continue
        close = difflib.get_close_matches(name, sorted(declared), n=3, cutoff=0.75)
        if not close:
            from lm_eval.tasks import TaskManager

            if name in TaskManager(include_defaults=True).all_tasks:
                continue
        problems.append(f"'{name}'" + (f" (did you mean: {', '.join(close)}?)" if close else ""))
    if problems:
        raise ValueError(f"unknown lm-eval task {', '.join(problems)}; bundled tasks: {', '.join(task_names())}")


@dataclass
class EvalResult:
    """What one `evaluate` run measured."""

    metrics: dict[str, dict[str, float]]  # task -> metric -> value, e.g. {"autoao_facts": {"acc": 0.7, ...}}
    samples: dict[str, int]  # task -> documents actually scored (fewer than the task has under `limit`)
    seconds: float  # wall clock of the whole run, task loading included
    limit: int | float | None = None
    config: dict[str, Any] = field(default_factory=dict)  # model wrapper, batch size, lm-eval version
    documents: dict[str, int] = field(default_factory=dict)  # task -> documents it has (all, whatever `limit`)
    # task -> doc id -> {"score": its headline metric, "margin": its gold answer's log-likelihood lead}
    per_doc: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)


def evaluate(
    model: nn.Module,
    tokenizer: Any,
    tasks: list[str] | str,
    *,
    limit: int | float | None = None,
    samples: dict[str, list[int]] | None = None,
    batch_size: int = 8,
    per_document: bool = False,
    device: torch.device | str | None = None,
    max_length: int | None = None,
) -> EvalResult:
    """Score `model` on lm-eval `tasks` (zero-shot) and return the metrics, each document's score
    and how long it took.

    Args:
        model: a transformers `PreTrainedModel` (scored through lm-eval's HFLM), or any causal LM
            `nn.Module` whose forward maps input_ids [B, T] to logits [B, T, V] (or to an object
            with `.logits`). It is put in eval mode for the run and restored; never moved or copied.
        tokenizer: the model's Hugging Face tokenizer (`encode`, `decode`, `eos_token_id`).
        tasks: task names, as a list or comma-separated; `task_names()` lists the bundled ones.
        limit: score only the first `limit` documents of each task (a fraction if < 1), for a fast
            run. The bundled facts are stored in a shuffled order, so a prefix mixes every category.
        samples: task -> the indices of the documents to score (instead of `limit`), passed sorted
            (lm-eval scores them in index order but labels its logged samples in the order given).
        batch_size: sequences per forward pass.
        per_document: one forward pass per document, over all of its requests (batch_size ignored):
            its scores then depend on it alone, not on its batch-mates (padding, activation scales).
        device: where inputs go; default the device of the model's parameters. The model must
            already be there.
        max_length: context window in tokens; default the HF config's, or 2048 for other models.
    """
    names = _check_args(model, tokenizer, tasks, batch_size)
    start = time.perf_counter()
    with offline_env(), _quiet_harness(), tempfile.TemporaryDirectory(prefix="autoao-lmeval-") as tmp:
        import lm_eval

        manager = _task_manager(Path(tmp), names)
        lm = wrap(model, tokenizer, batch_size=batch_size, device=device, max_length=max_length)
        if per_document:
            lm = PerDocument(lm)
        was_training = model.training
        model.eval()
        try:
            out = _harness(lm_eval, lm, names, manager, limit, samples)
        finally:
            model.train(was_training)
    config = {"lm": type(lm).__name__, "batch_size": "per document" if per_document else batch_size,
              "max_length": lm.max_length, "lm_eval": lm_eval.__version__}
    return _result(out, names, time.perf_counter() - start, limit, config)


def _harness(lm_eval: Any, lm: Any, names: list[str], manager: Any, limit: int | float | None,
             samples: dict[str, list[int]] | None) -> dict[str, Any]:
    """lm-eval's simple_evaluate of `lm` on the tasks, as evaluate asks it."""
    return lm_eval.simple_evaluate(
        model=lm, tasks=names, task_manager=manager, limit=None if samples else limit,
        samples={t: sorted(ids) for t, ids in samples.items()} if samples else None,
        log_samples=True, bootstrap_iters=0,  # stderrs: the judges compute their own, paired
        # leave the caller's RNG state alone (nothing here samples)
        random_seed=None, numpy_random_seed=None, torch_random_seed=None,
    )


def _result(out: dict[str, Any], names: list[str], seconds: float, limit: int | float | None,
            config: dict[str, Any]) -> EvalResult:
    """lm-eval's output dict -> EvalResult."""
    counts = out["n-samples"]
    return EvalResult(
        metrics={name: _metrics(out["results"][name]) for name in names},
        samples={name: int(counts[name]["effective"]) for name in names if name in counts},
        documents={name: int(counts[name]["original"]) for name in names if name in counts},
        seconds=seconds, limit=limit, config=config,
        per_doc={name: _per_doc(out.get("samples", {}).get(name, [])) for name in names},
    )


def _check_args(model: nn.Module, tokenizer: Any, tasks: list[str] | str, batch_size: int) -> list[str]:
    """The task names; ValueError naming the bad argument."""
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    if not names:
        raise ValueError(f"tasks is empty; give at least one task name, e.g. {task_names()}")
    if tokenizer is None:
        raise ValueError("tokenizer is None: lm-eval tasks are text, so they need the model's tokenizer "
                         "(e.g. transformers.AutoTokenizer.from_pretrained(...) for the same checkpoint).")
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch nn.Module (a causal LM), got {type(model).__qualname__}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return names


def _task_manager(tmp: Path, names: list[str]) -> Any:
    """lm-eval's TaskManager with the bundled tasks; lm-eval's own ~15k task YAMLs are indexed
    (seconds) only when a task is not bundled."""
    from lm_eval.tasks import TaskManager

    include = _write_bundled_tasks(tmp)
    manager = TaskManager(include_path=str(include), include_defaults=any(n not in task_names() for n in names))
    _check_task_names(names, manager.all_tasks)
    return manager


def task_sizes(tasks: list[str]) -> dict[str, int]:
    """Task -> how many documents lm-eval scores on it (its evaluation split)."""
    from lm_eval.tasks import get_task_dict

    with offline_env(), tempfile.TemporaryDirectory(prefix="autoao-lmeval-") as tmp:
        loaded = get_task_dict(tasks, _task_manager(Path(tmp), tasks))
        return {name: len(list(task.eval_docs)) for name, task in loaded.items()}


def _per_doc(logged: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """lm-eval's logged samples -> doc id -> {"score": the headline metric (acc, else the first
    number), "margin": multiple choice: the gold answer's log-likelihood above the best other}."""
    out: dict[int, dict[str, float]] = {}
    for row in logged:
        metric = next((row[m] for m in ("acc", "acc_norm", "exact_match") if isinstance(row.get(m), (int, float))), None)
        if metric is None:
            continue
        entry = {"score": float(metric)}
        lls = [r[0] for r in row.get("filtered_resps", []) if isinstance(r, (tuple, list)) and r]
        gold = row.get("target")
        if isinstance(gold, int) and 0 <= gold < len(lls) and len(lls) > 1:
            entry["margin"] = float(lls[gold] - max(v for i, v in enumerate(lls) if i != gold))
        out[int(row["doc_id"])] = entry
    return out


##### tasks #####################################################################################

@contextlib.contextmanager
def _quiet_harness() -> Iterator[None]:
    """lm-eval's own console output held back for a run: its warnings about a model passed in memory
    (HFLM: "`pretrained` model kwarg is not of type `str`"), which are what autoao means to do, and
    its record of its own git commit, whose `git describe` prints "fatal: not a git repository"
    outside a checkout (a model in memory has no harness commit worth recording), and the progress
    bars of its request building and of datasets' loading (the caller reports progress)."""
    import datasets
    import lm_eval.api.task
    import lm_eval.evaluator

    logger = logging.getLogger("lm_eval")
    level, git_hash, bar = logger.level, lm_eval.evaluator.get_git_commit_hash, lm_eval.api.task.tqdm
    bars = datasets.is_progress_bar_enabled()
    logger.setLevel(logging.ERROR)
    lm_eval.evaluator.get_git_commit_hash = lambda: None
    lm_eval.api.task.tqdm = functools.partial(bar, disable=True)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        lm_eval.evaluator.get_git_commit_hash, lm_eval.api.task.tqdm = git_hash, bar
        if bars:
            datasets.enable_progress_bars()


def _write_bundled_tasks(tmp: Path) -> Path:
    """Copy the bundled task YAMLs into tmp/tasks with absolute data paths; return that folder.

    lm-eval hands `dataset_kwargs` to `datasets.load_dataset`, which resolves relative data files
    against the working directory, not the YAML; hence the rewrite. The arrow cache that datasets
    builds from the JSON goes to tmp/datasets, which is deleted after the run."""
    import yaml

    include, cache = tmp / "tasks", tmp / "datasets"
    include.mkdir()
    for src in sorted(TASKS_DIR.glob("*.yaml")):
        cfg = yaml.safe_load(src.read_text(encoding="utf-8"))
        kwargs = cfg["dataset_kwargs"]
        kwargs["data_files"] = {split: str(TASKS_DIR / f) for split, f in kwargs["data_files"].items()}
        kwargs["cache_dir"] = str(cache)
        (include / src.name).write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return include


def _check_task_names(names: list[str], known: list[str]) -> None:
    unknown = [n for n in names if n not in known]
    if not unknown:
        return
    bundled = task_names()
    lines = []
    for n in unknown:
        close = difflib.get_close_matches(n, bundled + known, n=3)
        lines.append(f"Unknown lm-eval task '{n}'." + (f" Did you mean: {', '.join(close)}?" if close else ""))
    lines.append(f"Bundled with autoao (run offline): {', '.join(bundled)}. Other lm-eval task names "
                 "(e.g. hellaswag) work only when their datasets are already in the local HF datasets "
                 "cache, since evaluation runs offline.")
    raise ValueError("\n".join(lines))


def _metrics(task_results: dict[str, Any]) -> dict[str, float]:
    """lm-eval's {"acc,none": 0.7, "acc_stderr,none": 0.02, "alias": ...} -> {"acc": 0.7, "acc_stderr": 0.02}.

    The ",none" filter suffix is dropped; a metric under another filter keeps "metric,filter"."""
    out = {}
    for key, value in task_results.items():
        if "," not in key or not isinstance(value, (int, float)):
            continue  # "alias", and stderrs lm-eval could not compute ("N/A")
        metric, filt = key.split(",", 1)
        out[metric if filt == "none" else key] = float(value)
    return out
