"""The study's trial records: one TrialRecord per trial, written by the search's objective
(`TrialRecord.attrs`) and read back by the search, the workers and the report (`TrialRecord.read`);
the Pareto front both compute. A leaf module of autoao.records."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, TypeVar

from autoao.records.codec import from_dict, to_dict
from autoao.types import Accuracy


@dataclass(frozen=True)
class TrialRecord:
    """One trial of the study, as the search wrote it: its plan, predicted latency, the proxy's
    accuracy with the screen verdict, and whether it was feasible (decided once, when it ran)."""

    ATTR: ClassVar[str] = "autoao.trial"  # the user attribute that holds it

    number: int
    state: str  # COMPLETE / FAIL / RUNNING / WAITING / PRUNED
    params: dict[str, str]  # group name -> candidate name
    predicted_us: float  # inf unless COMPLETE
    accuracy: Accuracy | None  # tier 1, with its screen verdict; None unless COMPLETE
    feasible: bool
    elapsed_s: float = math.nan  # seconds since its process's search started, when it ended
    duration_s: float | None = None
    error: str = ""
    worker: str = ""  # the process that ran it, when several share the study
    warm_start: bool = False  # enqueued by the warm start, not sampled

    @property
    def drop(self) -> float:
        return self.accuracy.drop if self.accuracy is not None else math.inf

    @property
    def tier(self) -> int:
        return self.accuracy.tier if self.accuracy is not None else 1

    @property
    def predicted_ms(self) -> float:
        return self.predicted_us / 1e3

    @staticmethod
    def attrs(accuracy: Accuracy, feasible: bool, elapsed_s: float) -> dict[str, Any]:
        """What the objective stores under ATTR (JSON data)."""
        return {"accuracy": to_dict(accuracy), "feasible": feasible, "elapsed_s": elapsed_s}

    @classmethod
    def read(cls, t: Any) -> TrialRecord:
        """The record of an Optuna FrozenTrial (any object with its fields); trials of an earlier
        autoao, which stored loose attributes, read too."""
        done = t.state.name == "COMPLETE" and t.values is not None
        stored = t.user_attrs.get(cls.ATTR)
        if stored is not None:
            acc = from_dict(Accuracy, stored["accuracy"]) if done else None
            feasible, elapsed = done and bool(stored["feasible"]), stored.get("elapsed_s", math.nan)
        else:  # loose attributes: accuracy, tier, metrics, constraint, elapsed
            value = t.user_attrs.get("accuracy")
            acc = Accuracy(int(t.user_attrs.get("tier", 1)), value if value is not None else -math.inf,
                           t.values[1] if t.values[1] < 1e9 else math.inf,
                           dict(t.user_attrs.get("metrics") or {})) if done else None
            feasible, elapsed = done and t.user_attrs.get("constraint", math.inf) <= 0, t.user_attrs.get("elapsed", math.nan)
        duration = ((t.datetime_complete - t.datetime_start).total_seconds()
                    if t.datetime_start and t.datetime_complete else None)
        return cls(t.number, t.state.name, dict(t.params), t.values[0] if done else math.inf, acc, feasible,
                   elapsed, duration, "" if done else str(t.system_attrs.get("fail_reason", "")),
                   str(t.user_attrs.get("worker", "")), t.user_attrs.get("seed") == "warm start")


P = TypeVar("P")


def pareto_front(trials: list[P], latency: Callable[[P], float] = lambda r: r.predicted_us) -> list[P]:  # type: ignore[attr-defined]
    """Non-dominated trials on (latency, drop), fastest first; duplicates of a plan once.

    Works on anything with `.drop` and `.params` (the search's TrialResult; the report's trial
    records, with `latency` reading their milliseconds), so the report's front is the search's."""
    front: list[P] = []
    seen: set[tuple] = set()
    for r in sorted(trials, key=lambda r: (latency(r), r.drop)):  # type: ignore[attr-defined]
        key = tuple(sorted(r.params.items()))  # type: ignore[attr-defined]
        if key in seen:
            continue
        if not any(f.drop <= r.drop and latency(f) <= latency(r) for f in front):  # type: ignore[attr-defined]
            front.append(r)
            seen.add(key)
    return front
