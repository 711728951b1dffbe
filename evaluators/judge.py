"""The judge protocol: how a plan's accuracy is judged against the unmodified model, look by look.

    judge = deciding_judge(accuracy, JudgeContext(tokenizer, model, cache, seed))   # the user's, or None
    judge.price(reference, key, say)           # the unmodified model's first look; check_s, once_s set
    judge.prepare(reference, look)             # its side of look `look` (before the plan is installed)
    evidence, metrics = judge.evidence_through(plan_model, key, look)
    AccuracyBudget(...).judge(evidence, looks=judge.looks)

Every judge — the user's lm-eval tasks, the user's metric, the proxy's confirmation positions, the
generation check — implements `Judge`; the chooser runs them alike and never asks which kind it
holds. The judges a user can name with `accuracy=` register here (`register`): the first whose
`accepts(accuracy)` is true builds it, so a new kind of judge is one class and one line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from autoao.types import Evidence

Say = Callable[[str], None]


@dataclass(frozen=True)
class JudgeContext:
    """What building a judge the user named may read: the tokenizer (tasks need it), the model as
    it came (a metric scores it at once), the result cache, the run's seed."""

    tokenizer: Any
    model: nn.Module
    cache: Any  # evaluators.cache.ResultCache or None
    seed: int = 0


@dataclass(frozen=True)
class JudgeRecord:
    """What the run's summary records about the deciding judge: the unmodified model's score and
    metrics on the evidence it took first, and what it scores (task names, or a metric's name)."""

    baseline: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    tasks: list[str] | None = None
    metric: str | None = None


class Judge(ABC):
    """One accuracy judge. Contract:

    - `looks`: at most so many looks (the Bonferroni count of its verdicts); look 0 always exists.
    - `prepare(reference, look)`: the unmodified model's side of look `look`, computed once (or read
      from disk); called with the reference installed, before the plan's side of that look.
    - `evidence_through(model, key, look)`: the plan's paired evidence over looks 0..look (each call
      adds one look, in order, per plan `key`) and the plan's metrics; None when the judge has no
      evidence for that look (it ran out). Never modifies the model.
    - `price(reference, key, say)`: measures what judging costs, on the unmodified model (its first
      look), and sets `check_s` (every look of one plan, at worst) and `once_s` (the unmodified
      model's share not on disk yet).
    - `describe()`: one line, what it judges; `record()`: the summary's account of it.
    """

    check_s: float = 0.0
    once_s: float = 0.0

    @property
    @abstractmethod
    def looks(self) -> int:
        """At most so many looks."""

    def prepare(self, reference: nn.Module, look: int) -> None:
        """The unmodified model's side of look `look` (default: nothing to compute)."""

    @abstractmethod
    def evidence_through(self, model: nn.Module, key: str, look: int) -> tuple[Evidence, dict[str, float]] | None:
        """The plan's evidence over looks 0..look and its metrics; None: no evidence for `look`."""

    @abstractmethod
    def describe(self) -> str:
        """What it judges, one line."""

    def price(self, reference: nn.Module, key: str, say: Say) -> None:
        """Set check_s and once_s from what its first look took (default: free)."""

    def record(self) -> JudgeRecord:
        return JudgeRecord()

    @property
    def look_s(self) -> float:
        """Seconds of one look at worst: a check's share, spread evenly over the looks."""
        return self.check_s / max(self.looks, 1)

    @classmethod
    def accepts(cls, accuracy: Any) -> bool:
        """Whether `accuracy=` (as the user gave it, checked by autoao.options) names this judge."""
        return False

    @classmethod
    def create(cls, accuracy: Any, context: JudgeContext) -> Judge:
        """The judge `accuracy` names; ValueError naming the bad part before any measurement."""
        raise NotImplementedError(f"{cls.__name__} is not a judge a user names")


DECIDING: list[type[Judge]] = []  # the judges `accuracy=` can name, asked in order


def register(cls: type[Judge]) -> type[Judge]:
    """Add a judge `accuracy=` can name (a class decorator)."""
    DECIDING.append(cls)
    return cls


def judge_kind(accuracy: Any) -> type[Judge] | None:
    """The registered judge that takes `accuracy`, or None."""
    from autoao.evaluators import tier2  # noqa: F401  lazy: the built-in judges register on import (it imports this)

    return next((cls for cls in DECIDING if cls.accepts(accuracy)), None)


def deciding_judge(accuracy: Any, context: JudgeContext) -> Judge | None:
    """The judge the user named with `accuracy` (None: the proxy decides). ValueError where no
    registered judge takes it."""
    if accuracy is None:
        return None
    kind = judge_kind(accuracy)
    if kind is None:
        raise ValueError(f"no judge takes accuracy={accuracy!r}; give lm-eval task names, a callable(model) -> "
                         f"float, or None (the proxy decides)")
    return kind.create(accuracy, context)


class Merged:
    """A judge's evidence merged look by look, per plan key (for judges whose looks each add new
    items: the proxy's chunks, the generation check's prompts)."""

    def __init__(self) -> None:
        self.taken: dict[str, Evidence] = {}

    def add(self, key: str, look: int, more: Evidence) -> Evidence:
        self.taken[key] = more if look == 0 or key not in self.taken else self.taken[key].merged(more)
        return self.taken[key]
