"""Medians (min-max) per side and the paired after-before difference per round, from raw.jsonl."""
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
before = [r for r in rows if r["side"] == "before"]
after = [r for r in rows if r["side"] == "after"]
variants = [k for k in rows[0] if isinstance(rows[0][k], dict) and all("error" not in r[k] for r in rows)]
for k in rows[0]:
    errs = {r[k]["error"] for r in rows if isinstance(r.get(k), dict) and "error" in r[k]}
    if errs: print(f"{k}: {errs}")
print(f"rounds: {len(before)} before, {len(after)} after (alternating, before first)\n")
print("| variant | metric | before: median (min-max) | after: median (min-max) | after - before, paired: median (min-max) |")
print("|---|---|---|---|---|")
for v in variants:
    for m, fmt in (("guards", "{:.0f}"), ("warm_us", "{:.1f}"), ("comp_us", "{:.0f}"), ("eager_us", "{:.0f}")):
        b = [r[v][m] for r in before]; a = [r[v][m] for r in after]
        d = [y - x for x, y in zip(b, a)]
        f = lambda xs: f"{fmt.format(st.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"
        print(f"| {v} | {m} | {f(b)} | {f(a)} | {'+' if st.median(d) >= 0 else ''}{f(d)} |")
