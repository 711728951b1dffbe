"""Where int8_dyn(act=tensor) loses to quantize_dynamic on a biased layer: torch's dynamic int8
linear (fbgemm) at one layer shape, per-channel vs per-tensor weights, the bias inside the op vs
added after it (into a new tensor, or in place), next to quantize_dynamic's and autoao's modules.
Every variant is called in turn in each of --rounds rounds; medians in us.

    python benchmarks/int8_tensor_bias.py --out benchmarks/results/2026-12-02-epyc/minilm/int8_tensor_bias.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import time
import warnings

import torch

import autoao


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=1824, help="tokens a call (MiniLM's 32-sentence batch: 1824)")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.manual_seed(0)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": args.rows, "shapes": {}}
    for n, k in [(1536, 384), (384, 1536), (384, 384)]:  # MiniLM's FFN up, down and attention
        lin = torch.nn.Sequential(torch.nn.Linear(k, n))
        x = torch.randn(args.rows, k)
        qd = torch.ao.quantization.quantize_dynamic(copy.deepcopy(lin), {torch.nn.Linear}, dtype=torch.qint8)
        ours = autoao.apply(copy.deepcopy(lin), autoao.Plan.uniform(lin, "int8_dyn(act=tensor)"))
        w, b = lin[0].weight.detach(), lin[0].bias.detach()
        scale = w.abs().amax(1) / 127  # [N]
        qch = torch._make_per_channel_quantized_tensor(torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8),
                                                       scale.double(), torch.zeros(n, dtype=torch.long), 0)
        qten = torch.quantize_per_tensor(w, float(w.abs().max() / 127), 0, torch.qint8)
        ch_b, ch, ten_b = (torch.ops.quantized.linear_prepack(qch, b), torch.ops.quantized.linear_prepack(qch, None),
                           torch.ops.quantized.linear_prepack(qten, b))
        op = torch.ops.quantized.linear_dynamic
        calls = {"quantize_dynamic module": lambda: qd(x), "autoao module": lambda: ours(x),
                 "per-channel, bias in the op": lambda: op(x, ch_b, False),
                 "per-channel, bias into a new tensor": lambda: op(x, ch, False) + b,
                 "per-channel, bias in place": lambda: op(x, ch, False).add_(b),
                 "per-tensor, bias in the op": lambda: op(x, ten_b, False)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        with torch.no_grad():
            for f in calls.values():
                f(), f()
            for _ in range(args.rounds):
                for name, f in calls.items():
                    t = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t)
        out["shapes"][f"{n}x{k}"] = {name: round(statistics.median(v) * 1e6, 1) for name, v in times.items()}
        print(f"{n}x{k}", out["shapes"][f"{n}x{k}"], flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
