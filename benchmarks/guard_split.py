"""Where a weight-only module's extra guard time comes from, on a compiled stack (CPU, warm): a stack
of 64 nn.Linear(256, 256) layers as it came and with uniform int8_wo, the int8_wo modules as shipped,
with their forward cut to reading their two tensors only, and to one tensor only (subclasses whose
forward reads nothing else; numbers are not the point, guards are). The differences split the
plan's extra guard time a layer into the modules' Python state, their second tensor and the rest.

    python benchmarks/guard_split.py --out benchmarks/results/2026-12-04-cpu/guard-split

With --device meta (standing in for a GPU: the layout and forward branch a GPU's modules take, no
numbers) the sides are nn.Linear and int8_wo / fp8_wo as shipped; run it from two checkouts to
compare two layouts on one machine.

Each side is compiled by dynamo alone (backend "eager") --repeats times, sides in turn; each compile's
guard tree is evaluated with warm caches (guard_latency.warm_us, best of three), divided by the layers.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from guard_latency import on_each_compile, warm_us  # noqa: E402

import autoao  # noqa: E402
from autoao.kernels.int8 import Int8WeightOnlyLinear  # noqa: E402
from autoao.plan import Plan  # noqa: E402

LAYERS = 64


class TwoTensors(Int8WeightOnlyLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.w_q.to(x.dtype)) * self.w_scale.to(x.dtype)


class OneTensor(Int8WeightOnlyLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.w_q.to(x.dtype))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", choices=("cpu", "meta"), default="cpu")
    args = ap.parse_args()
    evaluated: list[float] = []
    on_each_compile(lambda root, scope: evaluated.append(min(warm_us(root, scope) for _ in range(3))))
    torch.manual_seed(0)
    base = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(LAYERS)])
    base = base.to(torch.bfloat16).eval().requires_grad_(False)
    planned = autoao.apply(copy.deepcopy(base), Plan.uniform(base, "int8_wo"))

    def cut(cls: type) -> nn.Module:
        m = copy.deepcopy(planned)
        for mod in m.modules():
            if type(mod) is Int8WeightOnlyLinear:
                mod.__class__ = cls
        return m

    if args.device == "cpu":
        sides = {"nn.Linear": base, "int8_wo as shipped": planned, "int8_wo, two tensors only": cut(TwoTensors),
                 "int8_wo, one tensor only": cut(OneTensor)}
    else:
        fp8 = autoao.apply(copy.deepcopy(base), Plan.uniform(base, "fp8_wo"))
        sides = {name: m.to(args.device) for name, m in
                 (("nn.Linear", base), ("int8_wo as shipped", planned), ("fp8_wo as shipped", fp8))}
    x = torch.randn(1, 256, dtype=torch.bfloat16, device=args.device)
    rows: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, model in sides.items():
            torch._dynamo.reset()
            with torch.no_grad():
                torch.compile(model, backend="eager")(x)
            rows[name].append(evaluated[-1] / LAYERS * 1000)
    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "layers": LAYERS, "device": args.device,
              "autoao": str(Path(autoao.__file__).parent),
              "ns_a_layer": {name: {"median": round(statistics.median(v), 1), "compiles": [round(t, 1) for t in v]}
                             for name, v in rows.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "guard_split.json").write_text(json.dumps(result, indent=1))
    for name, row in result["ns_a_layer"].items():
        print(f"{name}: {row['median']:.0f} ns a layer ({min(row['compiles']):.0f}-{max(row['compiles']):.0f})")


if __name__ == "__main__":
    main()
