"""The latency table as `autoao kernels` shows it: text per layer shape, and CSV.

    print(format_kernel_table(table, shapes, tokens, candidates))
    write_kernel_csv(table, "kernels.csv", all_kernels=True)
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from autoao.common import BASELINE, atomic_write
from autoao.evaluators.timing import LatencyTable
from autoao.kernels.routes import describe_route, parse_route
from autoao.search_space import Candidate


def format_kernel_table(table: LatencyTable, shapes: list[tuple[int, int]], tokens: list[int],
                        candidates: list[Candidate], all_kernels: bool = False) -> str:
    """One block per shape: median time per candidate and M, speed-up vs bf16, and a notes column
    with why a candidate is unsupported or emulated (emulated times are never shown as a speed-up)
    and, for candidates with several kernels, which one (or route of them) timing chose. all_kernels: below such a
    candidate, one row per kernel it timed ("  @kernel"; kernels not timed because another one
    outran them, or ran the same code, are absent or repeat its numbers)."""
    lines = []

    def row(label: str, times: list, bases: list, is_bf16: bool, notes: set[str]) -> str:
        cells = []
        for t, base in zip(times, bases):
            if not t.ok:
                cells.append("n/a" if (t.error or "").startswith("unsupported") else "failed")
                notes.add(t.error or "")
            elif t.emulated:
                cells.append(f"{t.median_us:.1f}us emul.")
                notes.add(f"emulated: {t.emulated}")
            elif is_bf16 or not base.ok:
                cells.append(f"{t.median_us:.1f}us")
            else:
                cells.append(f"{t.median_us:.1f}us {base.median_us / t.median_us:.2f}x")
        return f"{label:<28}" + "".join(f"{c:>18}" for c in cells) + "  " + "; ".join(sorted(notes))

    for n, k in shapes:
        lines.append(f"\n{n}x{k} (N x K), {table.dtype} on {table.device}, mode {table.mode}")
        head = f"{'candidate':<28}" + "".join(f"{'M=' + str(m):>18}" for m in tokens) + "  notes"
        lines += [head, "-" * len(head)]
        bases = [table.get(BASELINE, m, k, n) for m in tokens]
        for cand in candidates:
            times = [table.get(cand.name, m, k, n) for m in tokens]
            lines.append(row(cand.name, times, bases, cand.family == BASELINE,
                             {f"kernel {describe_route(t.kernel)}" for t in times if t.kernel is not None}))
            by_kernel = table.kernel_timings.get((cand.name, k, n), {}) if all_kernels else {}
            chosen = table.kernel_for(cand.name, k, n)
            in_route = {kern for kern, _ in parse_route(chosen)} if chosen else set()
            for kern, kern_times in by_kernel.items():
                lines.append(row(f"  @{kern}", [kern_times[m] for m in tokens], bases, False,
                                 {"chosen"} if kern in in_route else set()))
    return "\n".join(lines)


def write_kernel_csv(table: LatencyTable, path: str, all_kernels: bool = False) -> None:
    """Every timing of `table` as CSV (times in us; empty when the kernel failed), atomically: one
    row per (candidate, M, shape) with the kernel timing chose, or with all_kernels one per kernel
    timed for candidates that have several (column chosen: 1 for the rows of the chosen kernel, or of the kernels of the chosen route)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["device", "dtype", "mode", "candidate", "m", "k", "n", "median_us", "p20_us", "p80_us",
                "emulated", "error", "cached", "kernel", "chosen"])
    for r in table.rows:
        by_kernel = table.kernel_timings.get((r.candidate, r.k, r.n), {}) if all_kernels else {}
        options = {kern: times[r.m] for kern, times in by_kernel.items()} or {r.timing.kernel: r.timing}
        route = {kern for kern, _ in parse_route(r.timing.kernel)} if r.timing.kernel else set()
        for kern, t in options.items():
            w.writerow([table.device, table.dtype, table.mode, r.candidate, r.m, r.k, r.n,
                        *(v if math.isfinite(v) else "" for v in (t.median_us, t.p20_us, t.p80_us)),
                        t.emulated or "", t.error or "", int(r.cached), kern or "", int(kern == r.timing.kernel or kern in route)])
    atomic_write(Path(path), lambda f: f.write(buf.getvalue().encode()))
