"""How far llama.cpp's greedy tokens follow autoao's GGUF emulation, per summation route.

    python benchmarks/gguf_route.py --out DIR      # needs llama-cpp-python (docs/serving.md)

SmolLM2-135M in float32 with GGUF on every layer (Q8_0 down_proj and lm_head, Q4_1 v_proj, Q4_0
elsewhere), exported to GGUF; for six prompts, llama.cpp's greedy continuation (24 tokens, F32 KV
cache) against the emulated model's, with the emulation's forward (`block_matmul`: one float64
matmul) and with its reference (`block_sums`: ggml's order, each block's term rounded to float32).
Per route: the first position where the tokens differ (24: none), and the seconds of one 256-token
forward next to bf16's. Writes DIR/route.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import autoao
from autoao import models, search_space
from autoao.export import export
from autoao.kernels.gguf import GgufLinear

PROMPTS = ["The capital of France is", "Once upon a time, there was", "def fibonacci(n):",
           "The three primary colors are", "Water boils at", "My favourite book is"]
NEW = 24
LLAMA = ("import json, sys, llama_cpp\n"
         "m = llama_cpp.Llama(sys.argv[1], n_ctx=128, n_threads=2, verbose=False, logits_all=True, type_k=0, type_v=0)\n"
         "res = []\n"
         "for p in json.loads(sys.argv[2]):\n"
         "    m.reset(); m.eval(p); out = []\n"
         f"    for _ in range({NEW}):\n"
         "        n = int(m.scores[m.n_tokens - 1].argmax()); out.append(n); m.eval([n])\n"
         "    res.append(out)\n"
         "print(json.dumps(res))\n")


def forward_seconds(model: torch.nn.Module) -> float:
    ids = torch.randint(0, 1000, (1, 256))
    with torch.no_grad():
        model(ids)
        t0 = time.perf_counter()
        model(ids)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model, tok = models.load(dtype=torch.float32)
    bf16_s = forward_seconds(models.load()[0])
    layers = {}
    for fqn in autoao.plan.layer_specs(model):
        kind = {"mlp.down_proj": "q8_0", "self_attn.v_proj": "q4_1"}.get(fqn.split(".", 3)[-1], "q4_0")
        layers[fqn] = search_space.get("gguf", type=kind if fqn != "lm_head" else "q8_0")
    autoao.apply(model, autoao.Plan.for_model(model, layers))
    gguf = export(model, "gguf", Path(tempfile.mkdtemp()) / "g", source_gguf=models.gguf_path()) / "model.gguf"
    ids = [tok(p, return_tensors="pt").input_ids for p in PROMPTS]
    run = subprocess.run([sys.executable, "-c", LLAMA, str(gguf), json.dumps([i[0].tolist() for i in ids])],
                         capture_output=True, text=True, cwd=tempfile.gettempdir(), check=True)
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    rows = {}
    for route in ("block_matmul", "block_sums"):
        for m in model.modules():
            if isinstance(m, GgufLinear):
                m._forward = m.reference if route == "block_sums" else type(m)._forward.__get__(m)
        first = []
        with torch.no_grad():
            for i, t in zip(ids, theirs):
                ours = model.generate(i, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0, i.shape[1]:]
                first.append(next((j for j, (a, b) in enumerate(zip(ours.tolist(), t)) if a != b), NEW))
        rows[route] = {"first_difference": first, "forward_s": forward_seconds(model)}
        print(route, rows[route], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "route.json").write_text(json.dumps({"new_tokens": NEW, "prompts": PROMPTS, "bf16_forward_s": bf16_s,
                                                "torch": torch.__version__, "routes": rows}, indent=1))


if __name__ == "__main__":
    main()
