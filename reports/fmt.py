"""Number formatting shared by the page, the plots and the per-layer reasons: one unit style
everywhere (µs below 1 ms, 3 significant digits, "–" for unknown, "exact" for an infinite SQNR)."""

from __future__ import annotations

import math


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


def fmt_db(v: float | None) -> str:
    if v is None:
        return "–"
    return "exact" if v == math.inf else f"{v:.1f} dB"


def fmt_times(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:.2f}×" if v >= 0.1 else f"{v:.2g}×"  # 0.0035×, not 0.00×


def fmt_drop(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "–"
    return "∞ (NaN/Inf output)" if math.isinf(v) else f"{v:+.4f}"


def fmt_bytes(v: int | None) -> str:
    if v is None:
        return "–"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v} B"
