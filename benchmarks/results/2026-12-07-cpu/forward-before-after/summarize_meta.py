"""Three sides, order balanced: per side median (min-max) and, paired by round, the median
difference with its distribution-free 95% interval (order statistics k and n+1-k of the n
differences, the widest k whose coverage is >= 95%: min-max for 6 rounds, 3rd-10th for 12)."""
import json, math, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
sides = ["before", "head", "final"]
by = {(r["round"], r["side"]): r for r in rows}
rounds = sorted({r["round"] for r in rows})
variants = [k for k in rows[0] if isinstance(rows[0][k], dict)]


def interval(xs):
    xs, n = sorted(xs), len(xs)
    cover = lambda k: 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = max(k for k in range(1, n // 2 + 1) if cover(k) >= 0.95)
    return xs[k - 1], xs[n - k]


side = lambda xs, fmt: f"{fmt.format(st.median(xs))} ({fmt.format(min(xs))} to {fmt.format(max(xs))})"
diff = lambda xs: "{:+.1f} ({:+.1f} to {:+.1f})".format(st.median(xs), *interval(xs))
print(f"rounds: {len(rounds)}; each side first, second and third equally often\n")
print("| variant | metric | before | head | final | final - before, paired | final - head, paired |")
print("|---|---|---|---|---|---|---|")
for v in variants:
    for m, fmt in (("guards", "{:.0f}"), ("warm_us", "{:.1f}")):
        val = {s: [by[(r, s)][v][m] for r in rounds] for s in sides}
        d1 = [by[(r, "final")][v][m] - by[(r, "before")][v][m] for r in rounds]
        d2 = [by[(r, "final")][v][m] - by[(r, "head")][v][m] for r in rounds]
        print(f"| {v} | {m} | {side(val['before'], fmt)} | {side(val['head'], fmt)} | {side(val['final'], fmt)} | {diff(d1)} | {diff(d2)} |")
