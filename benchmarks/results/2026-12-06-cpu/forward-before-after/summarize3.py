"""Three sides, order balanced: per side median (min-max) and paired differences by round."""
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
sides = ["before", "head", "new"]
by = {(r["round"], r["side"]): r for r in rows}
rounds = sorted({r["round"] for r in rows})
variants = [k for k in rows[0] if isinstance(rows[0][k], dict)]
f = lambda xs, fmt: f"{fmt.format(st.median(xs))} ({fmt.format(min(xs))} to {fmt.format(max(xs))})"
print(f"rounds: {len(rounds)}; each side first, second and third in two rounds each\n")
print("| variant | metric | before | head | new | new - before, paired | new - head, paired |")
print("|---|---|---|---|---|---|---|")
for v in variants:
    for m, fmt in (("guards", "{:.0f}"), ("warm_us", "{:.1f}"), ("comp_us", "{:.0f}"), ("eager_us", "{:.0f}")):
        val = {s: [by[(r, s)][v][m] for r in rounds] for s in sides}
        d1 = [by[(r, "new")][v][m] - by[(r, "before")][v][m] for r in rounds]
        d2 = [by[(r, "new")][v][m] - by[(r, "head")][v][m] for r in rounds]
        print(f"| {v} | {m} | {f(val['before'], fmt)} | {f(val['head'], fmt)} | {f(val['new'], fmt)} | {f(d1, '{:+.1f}')} | {f(d2, '{:+.1f}')} |")
