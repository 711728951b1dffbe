"""Where a long Python call spends its wall time: a sampling profiler for one thread.

    with StackSampler() as s:
        autoao.optimize(...)
    s.write(Path("stacks.md"), title="optimize")  # and stacks.folded: one line per distinct stack

A daemon thread reads the target thread's stack (sys._current_frames) every `interval` seconds
and credits the wall time since its previous sample to every function on that stack (inclusive
time) and to the innermost one (self time). Unlike cProfile it costs ~nothing per Python call, so
torch.compile's Python-heavy stages and the subprocess-bound ones (ptxas, nvcc) keep their real
proportions; a C call that holds the GIL delays the next sample, and the delay is credited to the
stack seen after it (so sums stay wall time, the attribution of such gaps is approximate).
`write` also saves every distinct stack with its seconds ("folded" format: frames outermost first,
joined by ';', then the seconds), for questions the summary table does not answer.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from pathlib import Path
from types import FrameType


def _label(frame: FrameType) -> str:
    """'package/module.py:function' (the path from the last site-packages or repo folder down)."""
    path = frame.f_code.co_filename
    for marker in ("site-packages/", "/autoao/", "/benchmarks/"):
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            break
    return f"{path}:{frame.f_code.co_name}"


class StackSampler:
    """Samples the thread that creates it (or `thread_id`) while active (see the module docstring)."""

    def __init__(self, interval: float = 0.005, thread_id: int | None = None) -> None:
        self.interval = interval
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.self_time: collections.Counter[str] = collections.Counter()
        self.folded: collections.Counter[str] = collections.Counter()
        self.total = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            now = time.perf_counter()
            dt, last = now - last, now
            if frame is None:
                continue
            self.total += dt
            self.self_time[_label(frame)] += dt
            stack = []
            while frame is not None:
                stack.append(_label(frame))
                frame = frame.f_back
            self.folded[";".join(reversed(stack))] += dt
            for name in set(stack):  # each function once per sample, however deep its recursion
                self.inclusive[name] += dt

    def write(self, path: Path, title: str, top: int = 80) -> None:
        """Markdown: the `top` functions by inclusive wall seconds, with their self seconds; and
        path with suffix .folded: every distinct stack and its seconds."""
        lines = [f"# Sampled wall time: {title}", "",
                 f"{self.total:.1f} s sampled every {self.interval * 1e3:g} ms (benchmarks/lib/stack_sampler.py); "
                 "inclusive = on the stack, self = innermost Python frame (time in C code it called included)",
                 "", "| inclusive s | % | self s | function |", "|---|---|---|---|"]
        for name, sec in self.inclusive.most_common(top):
            lines.append(f"| {sec:.1f} | {100 * sec / max(self.total, 1e-9):.1f} | {self.self_time[name]:.1f} "
                         f"| `{name}` |")
        lines += ["", "## Top self time", "", "| self s | function |", "|---|---|"]
        lines += [f"| {sec:.1f} | `{name}` |" for name, sec in self.self_time.most_common(40)]
        path.write_text("\n".join(lines) + "\n")
        path.with_suffix(".folded").write_text("".join(f"{st} {sec:.4f}\n" for st, sec in self.folded.most_common()))
