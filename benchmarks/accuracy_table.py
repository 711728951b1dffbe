"""Issue 4's table: SmolLM2-135M accuracy under every uniform plan, by lm-eval and by the proxy.

    python benchmarks/accuracy_table.py --out benchmarks/results/<date>-cpu      # ~6 min on 2 CPU cores

For bf16 and each uniform plan (every layer the candidate supports; the others stay bf16): lm-eval
`autoao_facts` acc (372 questions) and `autoao_text` word perplexity (all 21 documents), the tier-1
proxy (next-token accuracy, KL vs bf16, on 2 x 256 held-out tokens) and the mean tier-0 SQNR, with
the seconds each took. Then the Spearman rank correlation between the proxy's ranking and
lm-eval's. Emulated candidates (fp8, 2:4 on CPU) compute the same numbers as their GPU kernels, so
their accuracy is real here; only their speed is not.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import autoao
import autoao.models
from autoao import search_space
from autoao.evaluators import lmeval
from autoao.evaluators.proxy import ProxyEvaluator
from autoao.evaluators.sensitivity import layer_errors
from autoao.profile import profile

PLANS = ["bf16", "int8_dyn", "int8_wo", "int4_wo(group_size=32)", "int4_wo(group_size=64)",
         "int4_wo(group_size=128)", "fp8_dyn(granularity=row)", "fp8_dyn(granularity=tensor)", "fp8_wo",
         "sparse24", "sparse24_int8_dyn", "sparse24_fp8"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--limit", type=int, default=None, help="lm-eval documents per task (default all)")
    ap.add_argument("--plans", default=None, help="';'-separated candidate names (default: all; bf16 first "
                                                   "is the baseline and is added if missing)")
    args = ap.parse_args()
    plans = args.plans.split(";") if args.plans else PLANS
    plans = plans if plans[0] == "bf16" else ["bf16", *[p for p in plans if p != "bf16"]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = autoao.models.load("smollm2-135m")
    calib = autoao.models.text_inputs(tok, seq_len=256, n_seqs=2)
    held_out = autoao.models.text_inputs(tok, seq_len=256, n_seqs=2, held_out=True)
    prof = profile(model, calib)
    norms = prof.calibration
    proxy = ProxyEvaluator(model, held_out)
    rows = []
    for name in plans:
        cand = search_space.get(name)
        q = copy.deepcopy(model)
        plan = autoao.Plan.uniform(q, cand)
        t0 = time.perf_counter()
        autoao.apply(q, plan, calibration=norms)
        t_apply = time.perf_counter() - t0
        t0 = time.perf_counter()
        p = proxy(q)
        t_proxy = time.perf_counter() - t0
        sq = layer_errors(model, prof, [cand], progress=False) if name != "bf16" else {}
        vals = [v[cand.name] for v in sq.values() if cand.name in v]
        r = lmeval.evaluate(q, tok, ["autoao_facts", "autoao_text"], limit=args.limit, batch_size=8)
        rows.append({
            "plan": name, "layers": len(plan.layers), "of": len(prof.layers),
            "facts_acc": r.metrics["autoao_facts"]["acc"], "facts_stderr": r.metrics["autoao_facts"]["acc_stderr"],
            "text_word_ppl": r.metrics["autoao_text"]["word_perplexity"],
            "proxy_acc": p.accuracy, "proxy_kl": p.metrics["kl"], "proxy_drop": p.drop,
            "tier0_mean_sqnr_db": sum(vals) / len(vals) if vals else float("nan"),
            "emulated_on_cpu": bool(cand.emulated("cpu")),
            "apply_s": round(t_apply, 1), "proxy_s": round(t_proxy, 1), "lmeval_s": round(r.seconds, 1),
        })
        print(rows[-1], flush=True)
        del q
    df = pd.DataFrame(rows)
    base = df.iloc[0]
    df["facts_drop"] = base.facts_acc - df.facts_acc
    df["ppl_increase"] = df.text_word_ppl / base.text_word_ppl - 1
    # Rank agreement: the proxy's KL and accuracy drop vs lm-eval's facts drop and perplexity increase
    corr = {
        "KL vs facts drop": df.proxy_kl.corr(df.facts_drop, method="spearman"),
        "KL vs ppl increase": df.proxy_kl.corr(df.ppl_increase, method="spearman"),
        "proxy drop vs facts drop": df.proxy_drop.corr(df.facts_drop, method="spearman"),
        "proxy drop vs ppl increase": df.proxy_drop.corr(df.ppl_increase, method="spearman"),
    }
    df.to_csv(out / "accuracy_table.csv", index=False)
    lines = [
        "# SmolLM2-135M (bf16, CPU): accuracy of every uniform plan", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: python {' '.join(sys.argv)}",
        f"- machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
        f"torch {torch.__version__}, lm-eval {r.config.get('lm_eval')}",
        "- lm-eval: autoao_facts (acc, 372 questions, zero-shot) and autoao_text (word perplexity, 21 documents); "
        f"limit={args.limit}", "- proxy (tier 1): next-token accuracy and KL vs bf16 on 2 x 256 held-out tokens",
        "- the model's weights were GGUF Q4_1 (groups of 32) before we got them: int4 g32 is flattered", "",
        "| plan | layers | facts acc | drop | text word ppl | proxy acc | proxy KL | tier-0 SQNR dB | lm-eval s | proxy s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, x in df.iterrows():
        lines.append(f"| {x.plan}{' (emulated on CPU)' if x.emulated_on_cpu else ''} | {x.layers}/{x['of']} | "
                     f"{x.facts_acc:.4f} ± {x.facts_stderr:.4f} | {x.facts_drop:+.4f} | {x.text_word_ppl:.2f} | "
                     f"{x.proxy_acc:.4f} | {x.proxy_kl:.4f} | {x.tier0_mean_sqnr_db:.1f} | {x.lmeval_s} | {x.proxy_s} |")
    if len(df) >= 3:
        lines += ["", "Spearman rank correlation, proxy vs lm-eval, over these plans:", ""]
        lines += [f"- {k}: {v:.2f}" for k, v in corr.items()]
    (out / "accuracy_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
