"""Number formatting shared by the page, the plots and the tables: one unit style everywhere (µs
below 1 ms, 3 significant digits, "–" for unknown, "exact" for an infinite SQNR)."""

from __future__ import annotations

import math

from autoao.types import CONFIDENCE, Verdict


def fmt_num(v: float | None, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return f"{v:.{digits}g}"


def fmt_ms(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:,.0f} ms" if v >= 100 else f"{v:.3g} ms"


def fmt_us(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return fmt_ms(v / 1e3) if v >= 1e3 else f"{v:.3g} µs"


def fmt_s(v: float | None) -> str:
    """Seconds of wall time: "12.3 s", "154 s"."""
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:,.0f} s" if v >= 100 else f"{v:.1f} s"


def fmt_db(v: float | None) -> str:
    if v is None:
        return "–"
    return "exact" if v == math.inf else f"{v:.1f} dB"


def fmt_db_range(span: tuple[float, float]) -> str:
    """An SQNR range with its unit once: "20.6–32.2 dB", "exact", "44.1 dB–exact"."""
    low, high = span
    if low == high:
        return fmt_db(low)
    if high == math.inf:
        return f"{fmt_db(low)}–exact"
    return f"{low:.1f}–{high:.1f} dB"


def fmt_times(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:.2f}×" if v >= 0.1 else f"{v:.2g}×"  # 0.0035×, not 0.00×


def fmt_drop(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "–"
    return "∞ (NaN/Inf output)" if math.isinf(v) else f"{v:+.4f}"


def fmt_interval(v: Verdict) -> str:
    """A verdict's interval on the drop: "95%: −0.0012 to +0.0074", "exact (all 372 scored)"."""
    if not math.isfinite(v.drop):
        return "–"
    if v.low == v.high:
        return f"exact (all {v.n:,} scored)"
    return f"{CONFIDENCE:.0%}: {fmt_drop(v.low)} to {fmt_drop(v.high)}"


def fmt_n(v: Verdict) -> str:
    """How much evidence: "2,048 positions", "136 of 372 documents"."""
    of = f" of {v.population:,}" if v.population is not None and v.population != v.n else ""
    return f"{v.n:,}{of} {v.unit}"


def fmt_bytes(v: int | None) -> str:
    if v is None:
        return "–"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v} B"
