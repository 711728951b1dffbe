"""optimize's arguments, checked once, for the Python API and the command line alike.

    opts = Options.check(budget="5m", accuracy="autoao_facts", tokenizer=tok, ...)   # ValueError naming the argument

Every argument is checked before anything is measured: a bad one costs nothing and loses nothing.
`RunHooks` carries what only the command line passes (its command, the process's age, candidates a
built-in model leaves out, a study's name and heartbeat, the hook that starts local workers).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autoao import search_space
from autoao.common import BASELINE
from autoao.evaluators.judge import judge_kind
from autoao.export import targets
from autoao.export.targets import Target
from autoao.search_space import Candidate
from autoao.types import Budget
from autoao.workers import DEFAULT_HEARTBEAT, driver_url, is_server

Accuracy = None | tuple[str, ...] | Callable[[Any], Any]


class OptionError(ValueError):
    """A bad argument of optimize: `argument` names it (the command line maps it to its flag)."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def _checked(argument: str, check: Callable[..., Any], *args: Any) -> Any:
    """check(*args), its ValueError as an OptionError naming `argument`."""
    try:
        return check(*args)
    except OptionError:
        raise
    except ValueError as e:
        raise OptionError(argument, str(e)) from None


@dataclass(frozen=True)
class Options:
    """What `autoao.optimize` was asked, each value checked (`check`)."""

    budget: Budget
    accuracy: Accuracy  # None: the proxy decides; lm-eval task names; or the user's metric
    tokenizer: Any
    max_accuracy_drop: float
    candidates: tuple[Candidate, ...]  # bf16 (the model as it came) always among them
    eval_inputs: Any
    storage: str  # an Optuna RDB URL
    out_dir: Path
    seed: int
    progress: bool
    fuse_groups: bool = True
    allow_emulated: bool = False  # the command line's --allow-emulated
    target: str = "autoao"  # the serving engine the plan is made for (autoao.export.targets)
    # a causal LM's screen: the held-out positions every trial is scored on, where autoao builds them
    screen_positions: int = 512
    workload: Callable[[Any], Any] | None = None  # what the user runs (model -> anything): timed next to the forward pass

    @classmethod
    def check(cls, *, budget: Any, accuracy: Any, tokenizer: Any, max_accuracy_drop: Any, candidates: Any,
              eval_inputs: Any, storage: str | None, out_dir: Any, seed: Any, progress: bool,
              fuse_groups: bool = True, allow_emulated: bool = False, target: str = "autoao",
              workload: Any = None) -> Options:
        """Every argument checked; an OptionError (a ValueError) naming the first bad one, what was
        expected and how to fix it."""
        out = Path(out_dir)
        _checked("out_dir", check_out_dir, out)
        url = driver_url(storage) if storage else f"sqlite:///{(out / 'study.db').resolve()}"
        _checked("storage", check_storage, url)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise OptionError("seed", f"seed must be an integer, got {seed!r}")
        engine = _checked("target", targets.get, target)
        if workload is not None and not callable(workload):
            raise OptionError("workload", f"workload must be a callable(model) that runs what you serve, e.g. "
                              f"lambda m: m.generate(ids, max_new_tokens=64); got {type(workload).__name__}")
        return cls(_checked("budget", Budget.parse, budget), _checked("accuracy", _accuracy, accuracy, tokenizer),
                   tokenizer, _checked("max_accuracy_drop", _drop, max_accuracy_drop),
                   _checked("candidates", _candidates, candidates, engine), eval_inputs, url, out, seed,
                   bool(progress), fuse_groups, allow_emulated, engine.name, workload=workload)

    @property
    def shared(self) -> bool:
        """The study lives on a database server: `autoao worker` processes may join it."""
        return is_server(self.storage)


@dataclass(frozen=True)
class RunHooks:
    """What the command line adds to a run (autoao.cli): nothing a Python caller needs."""

    command: str | None = None  # the command line, for the report's "reproduce"
    spent: float = 0.0  # seconds of the time budget used before the run (the process's age)
    left_out: dict[str, str] = field(default_factory=dict)  # candidates a built-in model leaves out -> why
    study_name: str | None = None  # default: derived from the model, the search space and the budget
    heartbeat: int = DEFAULT_HEARTBEAT  # a shared study: seconds between a running trial's heartbeats
    on_study: Callable[[str], Any] | None = None  # called with the study's name once it is published


def _drop(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"max_accuracy_drop must be a number in [0, 1] (0.01 = 1 point of accuracy), got {value!r}")
    return float(value)


def _accuracy(accuracy: Any, tokenizer: Any) -> Accuracy:
    """None, lm-eval task names (a str "a,b" or a list), which need a tokenizer and must exist, or
    anything else a registered judge takes (evaluators.judge: the user's callable, ...)."""
    if accuracy is None or (not isinstance(accuracy, (str, list, tuple)) and judge_kind(accuracy) is not None):
        return accuracy
    if isinstance(accuracy, str):
        accuracy = accuracy.split(",")
    if not isinstance(accuracy, (list, tuple)) or not all(isinstance(t, str) for t in accuracy):
        raise ValueError(f"accuracy must be None (the proxy decides), lm-eval task names (a string or a list of "
                         f"strings, e.g. 'autoao_facts') or a callable(model) -> float; got {type(accuracy).__name__} "
                         f"{accuracy!r}")
    tasks = tuple(t.strip() for t in accuracy if t.strip())
    if not tasks:
        raise ValueError("accuracy names no lm-eval task; give task names, e.g. 'autoao_facts', or None for the proxy")
    if tokenizer is None:
        raise ValueError(f"accuracy={list(tasks)} are lm-eval tasks, which need the model's tokenizer: pass tokenizer=...")
    from autoao.evaluators import lmeval  # lazy: lm-eval is heavy

    lmeval.check_tasks(list(tasks))
    unknown = [t for t in tasks if t not in lmeval.task_names()]
    if unknown:
        warnings.warn(f"tasks {unknown} are not bundled with autoao; lm-eval must find their data offline", stacklevel=4)
    return tasks


def _candidates(candidates: Any, target: Target) -> tuple[Candidate, ...]:
    """Names or Candidates (default: the target's search space), bf16 always included; an empty
    list is an error (a search over the unchanged model alone would measure for nothing), and so is
    a candidate the target loads on no layer (Target.refuses), named with the reason."""
    if candidates is None:
        return tuple(target.candidates())
    if isinstance(candidates, str) or not hasattr(candidates, "__iter__"):
        raise ValueError(f"candidates must be a list of candidate names or Candidates, got {candidates!r}")
    out = [search_space.get(c) if isinstance(c, str) else c for c in candidates]
    if not out:
        raise ValueError("candidates is empty: name at least one candidate (e.g. int8_wo), or leave it out for all of them")
    bad = [c for c in out if not isinstance(c, Candidate)]
    if bad:
        raise ValueError(f"candidates must be names or Candidates, got {bad[0]!r}")
    refused = [f"{c.name}: {reason}" for c in out if (reason := target.refuses(c))]
    if refused:
        raise ValueError(f"target {target.name!r} cannot load {len(refused)} of the candidates on any layer; "
                         f"{'; '.join(refused)}. Leave them out of the candidates, or make the plan for another "
                         f"target (autoao's own runtime runs every candidate but the GGUF types)")
    if not any(c.name == BASELINE for c in out):
        out.insert(0, search_space.get(BASELINE))
    return tuple(out)


def check_storage(url: str) -> None:
    """ValueError naming the URL unless an Optuna RDB storage can be reached there (a few seconds at
    most)."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception as e:  # noqa: BLE001 - sqlalchemy's ArgumentError and friends
        raise ValueError(f"storage {url!r} is not a database URL ({e}); e.g. sqlite:///study.db or "
                         "postgresql://user@host/db") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not Path(db).expanduser().resolve().parent.is_dir():
            raise ValueError(f"storage {url!r}: folder {Path(db).expanduser().resolve().parent} does not exist")
        return
    connect_args = {"connect_timeout": 5} if parsed.get_backend_name().startswith("postgres") else {}
    try:
        engine = sqlalchemy.create_engine(parsed, connect_args=connect_args)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as e:  # noqa: BLE001 - driver missing, refused, auth: all one message
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"storage {url!r} cannot be reached: {first}") from None


def check_out_dir(out_dir: Path) -> None:
    """ValueError unless `out_dir` can be created and written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".autoao-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"output directory {out_dir} cannot be written: {e.strerror or e}") from None
