"""The run ledger: one object owns a run's clock, its progress messages and its time budget.

    ledger = RunLedger(Budget.parse("5m"), progress=True)
    with ledger.stage("profile and baselines"):
        ...
    ledger.say("searching ...")
    ledger.remaining()          # seconds of the budget left (None for a trial-count budget)
    ledger.clock()              # the one clock deadlines are on (autoao.budget.TimePlan sets them)
    ledger.stage_seconds()      # wall seconds per stage, in the order the stages ran
    with ledger.interruptible(): ...   # SIGINT / SIGTERM raise Interrupted (a KeyboardInterrupt)

The budget covers the whole run, from the ledger's creation to the report written. The stages
tile the run: each starts where the previous one ended (the first at the ledger's creation), so
their seconds add up to the run's, and the stage still open counts up to now.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any, Iterator

from autoao.types import Budget


class Interrupted(KeyboardInterrupt):
    """The run was stopped by SIGINT (Ctrl-C) or SIGTERM. Raised where the run was; the run writes
    the best plan verified by then and raises it again with `result` set (optimize's result) and
    `kept` (what was written, in words). `exit_code`: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.result: Any = None
        self.kept = ""

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class TooSlow(TimeoutError):
    """A step ran past the seconds a time_limit gave it (raised where it was)."""


class RunLedger:
    def __init__(self, budget: Budget, progress: bool = True, spent: float = 0.0) -> None:
        """spent: seconds of the budget already used before this ledger existed (the command line
        passes the process's age: interpreter start, imports and model loading count too)."""
        self.budget = budget
        self.progress = progress
        self.start = time.perf_counter() - spent
        self._closed: dict[str, float] = {}
        self._open: str | None = None
        self._mark = self.start  # where the next stage starts

    @staticmethod
    def clock() -> float:
        """The run's one clock (time.perf_counter): every deadline is on it."""
        return time.perf_counter()

    @staticmethod
    def wall_time(seconds: float) -> float:
        """time.time() `seconds` from now: a deadline other processes read (a shared study's)."""
        return time.time() + seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float | None:
        """Seconds of a time budget not yet spent (may be negative); None for a trial budget."""
        return None if self.budget.seconds is None else self.budget.seconds - self.elapsed()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """The block, and whatever ran since the previous stage ended, as stage `name`."""
        self._open = name
        try:
            yield
        finally:
            now = time.perf_counter()
            self._closed[name] = self._closed.get(name, 0.0) + now - self._mark
            self._mark, self._open = now, None

    def stage_seconds(self) -> dict[str, float]:
        """Wall seconds per stage so far, in order; the open stage up to now."""
        out = dict(self._closed)
        if self._open is not None:
            out[self._open] = out.get(self._open, 0.0) + time.perf_counter() - self._mark
        return out

    def say(self, msg: str) -> None:
        """One progress line on stderr, stamped with the run's elapsed seconds."""
        if self.progress:
            print(f"[autoao {self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    @staticmethod
    def interruptible() -> contextlib.AbstractContextManager[None]:
        """SIGINT and SIGTERM raise Interrupted inside the block."""
        def stop(signum: int, frame: Any) -> None:
            raise Interrupted(signum)
        return _signals(stop)

    @staticmethod
    @contextlib.contextmanager
    def time_limit(seconds: float | None, what: str = "the step") -> Iterator[None]:
        """TooSlow raised inside the block once it has run `seconds` (None: no limit; the main
        thread only, where Python delivers signals: elsewhere no limit either)."""
        if seconds is None or threading.current_thread() is not threading.main_thread():
            yield
            return

        def late(signum: int, frame: Any) -> None:
            raise TooSlow(f"{what} took longer than the {seconds:.0f} s it had")

        previous = signal.signal(signal.SIGALRM, late)
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    @staticmethod
    def shielded() -> contextlib.AbstractContextManager[None]:
        """SIGINT and SIGTERM ignored inside the block: writing what an interrupted run keeps takes
        seconds and is not itself interrupted."""
        return _signals(signal.SIG_IGN)


@contextlib.contextmanager
def _signals(handler: Any) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM inside the block, the previous handlers back afterwards (the
    main thread only: Python delivers signals to no other)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
