"""The report's plots: matplotlib figures as inline SVG text (no files, no network, no JavaScript).

    pareto_svg(data)    every finished trial on (predicted latency, the screen's drop), coloured by
                        its recorded feasibility; the front; the line the trials were judged
                        against (where tier 2 decides: the proxy's screen, and the budget apart);
                        the shown plan as a star; the unchanged model's predicted latency
    history_svg(data)   best feasible predicted latency so far, by trial and by time
    curve_svg(data)     the verified speed-up against seconds since the run began: a step at each
                        better plan verified, its 95% lower bound shaded, the budget's end marked

Figures use matplotlib's object API (`Figure`, no pyplot: no global state, no GUI backend). SVG text
stays text (svg.fonttype none: searchable, small) and ids are salted per plot with a fixed salt and
no date, so the same data gives byte-identical SVG and two plots on one page never share an id.
The marks a reader checks carry fixed ids (`set_gid`: pareto-feasible, pareto-screen, pareto-star,
...), so a browser test can find them.
"""

from __future__ import annotations

import io
import math
from typing import Any, Callable

from autoao.reports.fmt import fmt_ms, fmt_s
from autoao.records import TrialRecord
from autoao.types import FromBytes
from autoao.reports.load import ReportData
from autoao.reports.trust import budget_seconds

# Colours that stay apart for colour-blind readers (Okabe-Ito) and in greyscale print.
FEASIBLE, INFEASIBLE, FRONT, CHOSEN, LIMIT, BUDGET, BF16 = ("#0072B2", "#999999", "#009E73", "#D55E00", "#CC3311",
                                                     "#AA3377", "#555555")


STYLE = {"font.size": 9, "font.family": "sans-serif", "axes.titlesize": 9, "legend.fontsize": 8.5,
         "svg.fonttype": "none"}


def pareto_svg(data: ReportData) -> str | None:
    """Latency vs accuracy drop of every COMPLETE trial with a finite drop; None if there is none."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return _pareto(data)


def history_svg(data: ReportData) -> str | None:
    """Best feasible predicted latency so far against trial number and against time; None if no
    trial finished."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return _history_plot(data)


def curve_svg(data: ReportData) -> str | None:
    """The verified speed-up against seconds since the run began: a step at each better plan
    verified, shaded down to its 95% lower bound, the budget's end and the run's end (or the
    signal that ended it) marked; None
    where no plan was verified, or where the speed-ups are estimates (context.pricing: FromBytes)."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return _curve_plot(data)


def plotted(data: ReportData) -> list[TrialRecord]:
    """The trials the Pareto plot draws: finished, with a finite latency and drop."""
    return [t for t in data.completed if math.isfinite(t.drop) and math.isfinite(t.predicted_ms)]


def star(data: ReportData) -> TrialRecord | None:
    """The shown plan's trial where the Pareto plot draws it (the caption promises a star only then)."""
    trial = data.shown_trial
    return trial if trial is not None and trial in plotted(data) else None


def feasibility_line(data: ReportData) -> tuple[float, str] | None:
    """(drop, name) of the line the trials' feasibility was decided against: the budget where the
    proxy decides, the proxy's screen where tier 2 does (None: the run did not record its screen)."""
    ctx = data.context
    if ctx.accuracy.tier == 1:
        return data.max_drop, f"the max accuracy drop ({data.max_drop:.4g})"
    if ctx.screen_drop is None:
        return None
    return ctx.screen_drop, f"the proxy's screen ({ctx.screen_drop:.4g}, tier 1)"


def _pareto(data: ReportData) -> str | None:
    shown = plotted(data)
    if not shown:
        return None
    fig, ax = _figure(8.4, 4.6)
    feas = [t for t in shown if t.feasible]
    infeas = [t for t in shown if not t.feasible]
    if infeas:
        ax.scatter([t.predicted_ms for t in infeas], [t.drop for t in infeas], marker="x", s=22, color=INFEASIBLE,
                   linewidths=1, label=f"infeasible trial ({len(infeas)})", zorder=2).set_gid("pareto-infeasible")
    if feas:
        ax.scatter([t.predicted_ms for t in feas], [t.drop for t in feas], s=16, color=FEASIBLE, alpha=0.75,
                   label=f"feasible trial ({len(feas)})", zorder=3).set_gid("pareto-feasible")
    front = [r.screen for r in data.front if r.screen is not None and r.screen in shown]
    if front:
        ax.step([t.predicted_ms for t in front], [t.drop for t in front], where="post", color=FRONT, lw=1.5,
                label="Pareto front", zorder=4)[0].set_gid("pareto-front")
        ax.scatter([t.predicted_ms for t in front], [t.drop for t in front], s=46, facecolors="none",
                   edgecolors=FRONT, linewidths=1.3, zorder=4)
    _limits(ax, data)
    base = data.context.baseline_ms.predicted
    if base:
        ax.axvline(base, color=BF16, ls=":", lw=1.2, label=f"{data.baseline_name}, predicted ({fmt_ms(base)})",
                   zorder=1)
    chosen = star(data)
    if chosen is not None:
        ax.scatter([chosen.predicted_ms], [chosen.drop], marker="*", s=260, color=CHOSEN, edgecolors="black",
                   linewidths=0.6, label=f"{'shipped plan' if data.finished else 'best so far'}: trial {chosen.number}",
                   zorder=5).set_gid("pareto-star")
    xs = [t.predicted_ms for t in shown] + ([base] if base else [])
    if max(xs) / max(min(xs), 1e-12) > 30:
        ax.set_xscale("log")  # CPU timings and emulated kernels spread over decades
    ax.set_xlabel("predicted latency (ms)")
    ax.set_ylabel("accuracy drop on the screen (tier 1)" if data.context.accuracy.tier == 2 else
                  "accuracy drop (absolute)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, frameon=False)
    return _svg(fig, "pareto")


def _limits(ax: Any, data: ReportData) -> None:
    """The feasibility line; where tier 2 decides, its budget too, labelled as not on this axis."""
    line = feasibility_line(data)
    if line is not None:
        ax.axhline(line[0], color=LIMIT, ls="--", lw=1.2, label=f"{line[1]}: feasible at or below",
                   zorder=1).set_gid("pareto-screen")
    if data.context.accuracy.tier == 2:
        ax.axhline(data.max_drop, color=BUDGET, ls="-.", lw=1.0, zorder=1,
                   label=f"max accuracy drop ({data.max_drop:.4g}): judged on tier 2, not on this axis").set_gid(
                       "pareto-budget")


def _history_plot(data: ReportData) -> str | None:
    from matplotlib.ticker import MaxNLocator

    done = sorted(data.completed, key=lambda t: t.number)
    if not done:
        return None
    fig, (by_trial, by_time) = _figure(9.6, 3.3, ncols=2, sharey=True)
    _history(by_trial, done, lambda t: t.number)
    by_trial.set_xlabel("trial")
    by_trial.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_trial.set_ylabel("best predicted latency (ms)")
    timed = sorted((t for t in done if math.isfinite(t.elapsed_s)), key=lambda t: t.elapsed_s)
    _history(by_time, timed, lambda t: t.elapsed_s)
    by_time.set_xlabel("seconds since the trials began")
    lats = [t.predicted_ms for t in done if math.isfinite(t.predicted_ms)]
    if lats and max(lats) / max(min(lats), 1e-12) > 30:
        by_trial.set_yscale("log")
    fig.legend(*by_trial.get_legend_handles_labels(), loc="outside upper center", ncols=3, frameon=False)
    return _svg(fig, "history")


def _history(ax: Any, trials: list[TrialRecord], x_of: Callable[[TrialRecord], float]) -> None:
    best, xs, ys = math.inf, [], []
    for t in trials:
        if t.feasible and t.predicted_ms < best:
            best = t.predicted_ms
        if math.isfinite(best):
            xs.append(x_of(t))
            ys.append(best)
    feas = [t for t in trials if t.feasible]
    infeas = [t for t in trials if not t.feasible and math.isfinite(t.predicted_ms)]
    ax.scatter([x_of(t) for t in infeas], [t.predicted_ms for t in infeas], marker="x", s=16, color=INFEASIBLE,
               linewidths=0.9, label="infeasible trial")
    ax.scatter([x_of(t) for t in feas], [t.predicted_ms for t in feas], s=10, color=FEASIBLE, alpha=0.6,
               label="feasible trial")
    if xs:
        ax.step(xs, ys, where="post", color=CHOSEN, lw=1.8, label="best feasible so far")


def _curve_plot(data: ReportData) -> str | None:
    s = data.summary
    if s is None or len(s.curve) < 2 or isinstance(data.context.pricing, FromBytes):
        return None
    points, end = s.curve, max(s.seconds, s.curve[-1].seconds)
    # The first point is what the run held from its start (the model as it came, or the earlier
    # run's plan it continued from); each later one holds from its verification to the next.
    xs = [0.0, *(p.seconds for p in points[1:]), end]
    ys = [p.speedup for p in points] + [points[-1].speedup]
    lows = [p.bound for p in points] + [points[-1].bound]
    fig, ax = _figure(8.4, 3.4)
    ax.fill_between(xs, lows, ys, step="post", color=FEASIBLE, alpha=0.2, lw=0,
                    label="95% lower bound of the measured speed-up").set_gid("curve-bound")
    ax.step(xs, ys, where="post", color=FEASIBLE, lw=1.8,
            label="verified speed-up (paired estimate)")[0].set_gid("curve-step")
    ax.scatter([p.seconds for p in points[1:]], [p.speedup for p in points[1:]], s=28, color=CHOSEN, zorder=3,
               label=f"plan verified ({len(points) - 1})").set_gid("curve-verified")
    budget = budget_seconds(data.context)
    if budget is not None:
        ax.axvline(budget, color=LIMIT, ls="--", lw=1.2, label=f"the budget's end ({fmt_s(budget)})").set_gid(
            "curve-budget")
    at = data.interrupted_at
    ended = (f"interrupted by {s.interrupted} ({fmt_s(at)})" if at is not None else
             f"the run's end ({fmt_s(s.seconds)})")
    ax.axvline(s.seconds if at is None else at, color=BF16, ls=":", lw=1.2, label=ended).set_gid("curve-end")
    ax.set_xlim(0, max(end, budget or 0.0) * 1.02)
    ax.set_xlabel("seconds since the run began")
    ax.set_ylabel(f"speed-up vs {data.baseline_name}, measured")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3, frameon=False)
    return _svg(fig, "curve")


def _figure(width: float, height: float, **subplots: Any):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(**subplots)
    for ax in (axes if isinstance(axes, (list, tuple)) or hasattr(axes, "flat") else [axes]):
        ax.grid(True, color="#e5e5e5", lw=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    return fig, axes


def _svg(fig: Any, salt: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": f"autoao-{salt}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    # Inline SVG in HTML: drop the XML declaration and DOCTYPE, keep from the <svg> element on.
    return text[text.index("<svg"):]
