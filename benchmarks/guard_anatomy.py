"""What a plan adds to dynamo's guard evaluation on a compiled decode step, by kind of guard: a
random-init Llama-3.2-1B-shaped model (vocabulary cut to 4096: guards do not depend on it) as it
came and with a saved plan, on the CPU. Int4 layers are put on their CUDA layout (the `cuda`
kernel's buffers and forward branch, which a GPU run takes) with the kernel replaced by a CPU
stand-in, so the guards are the ones a GPU's compiled generate() evaluates once a token.

    python benchmarks/guard_anatomy.py --plan benchmarks/results/2026-12-03-h200/generate-1b/search/plan.json \
        --out benchmarks/results/2026-12-04-cpu/guard-anatomy
With --device meta (standing in for a GPU: the layout and forward branch a GPU's modules take, no
numbers; int4 layers are not put on a stand-in) and --synthetic smollm2-135m, SmolLM2's plans; run it
from two checkouts to compare two layouts on one machine.

Each side's decode step (a static cache of 64 slots holding a 32-token prompt) is compiled by dynamo
alone (backend "eager"); warm_us is guard_latency.py's (the best of 5 means of 200 evaluations of
the guard tree, warm caches). Sides in turn, --repeats times: as it came, the plan, and the plan
with the int4 modules' next-layer prefetch links cut. Counts: the tree's guard managers (one per
Python value reached) and its leaf guards by kind.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generate_bench import SYNTHETIC  # noqa: E402
from guard_latency import on_each_compile, warm_us  # noqa: E402

import autoao  # noqa: E402
from autoao.kernels import cuda_int4  # noqa: E402
from autoao.kernels.int4 import Int4WeightOnlyLinear  # noqa: E402
from autoao.kernels.ops import EAGER  # noqa: E402
from autoao.plan import Plan  # noqa: E402


def anatomy(manager, kinds: collections.Counter) -> int:
    """Guard managers in the tree under `manager` (itself included, a dict's key and value managers
    too); its leaf guards by kind into `kinds`."""
    kinds.update(type(g).__name__ for g in manager.get_leaf_guards())
    children = list(manager.get_child_managers())
    if hasattr(manager, "get_key_value_managers"):  # a DictGuardManager: {index: (key manager, value manager)}
        children += [m for pair in manager.get_key_value_managers().values() for m in pair if m is not None]
    return 1 + sum(anatomy(c, kinds) for c in children)


def cpu_stand_in() -> None:
    """The int4 CUDA kernels as CPU matmuls on the same layout (numbers are not the point here)."""
    def gemv(x, qw, sz, group_size, next_qw=None, next_sz=None):
        return x.to(torch.bfloat16) @ cuda_int4.dequantize_mma(qw, sz, group_size).t()

    def dequant(qw, sz, group_size):
        return cuda_int4.dequantize_mma(qw, sz, group_size).to(torch.bfloat16)

    cuda_int4.library = lambda group_size, device=None: None
    cuda_int4.int4_gemv_cuda_impl, cuda_int4.int4_dequant_cuda_impl = gemv, dequant
    EAGER["int4_gemv_cuda"], EAGER["int4_dequant_cuda"] = gemv, dequant


def int4_on_cuda_branch(planned: torch.nn.Module) -> dict[int, Int4WeightOnlyLinear]:
    """The plan's int4 layers on their CUDA layout and kernel, computed by cpu_stand_in; returns the
    modules that hold the runtime tensors (a fused group's module, or the layer), by id."""
    cpu_stand_in()
    units = {id(u): u for u in (m.fused[0].module if m.fused else m for m in planned.modules()
                                 if isinstance(m, Int4WeightOnlyLinear))}
    for m in [*units.values(), *(m for m in planned.modules() if isinstance(m, Int4WeightOnlyLinear))]:
        m.kernel = "cuda"
    for u in units.values():
        u._pack_mma(torch.device("cpu"))
    return units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, required=True, help="a plan.json of the Llama-1B-shaped model")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", choices=sorted(SYNTHETIC), default="llama-1b", help="the model --plan was made on")
    ap.add_argument("--device", choices=("cpu", "meta"), default="cpu")
    args = ap.parse_args()
    import transformers

    measured: list[tuple[float, int, collections.Counter]] = []

    def measure(root, scope) -> None:
        kinds: collections.Counter = collections.Counter()
        managers = anatomy(root, kinds)
        measured.append((warm_us(root, scope), managers, kinds))

    on_each_compile(measure)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**SYNTHETIC[args.synthetic], "vocab_size": 4096})
    base = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval().requires_grad_(False)
    planned = autoao.apply(copy.deepcopy(base), Plan.load(args.plan))
    if args.device == "meta":
        base, planned, units = base.to("meta"), planned.to("meta"), {}
    else:
        units = int4_on_cuda_branch(planned)
    links = {k: u.prefetch_next for k, u in units.items()}
    prompt = torch.randint(0, config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1)).to(args.device)

    def set_links(on: bool) -> None:
        for k, u in units.items():
            object.__setattr__(u, "prefetch_next", links[k] if on else None)

    sides = {"as it came": (base, True), "plan": (planned, True)}
    if units:
        sides["plan, prefetch links cut"] = (planned, False)
    rows: dict[str, dict] = {name: {"warm_us": [], "managers": None, "leaf_guards": None} for name in sides}
    for name, (model, linked) in [s for _ in range(args.repeats) for s in sides.items()]:
        set_links(linked)
        torch._dynamo.reset()
        cache = transformers.StaticCache(config=model.config, max_cache_len=64)
        with torch.no_grad():
            token = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            torch.compile(model, backend="eager", dynamic=False)(input_ids=token, past_key_values=cache,
                                                                  use_cache=True,
                                                                  cache_position=torch.tensor([32], device=args.device))
        us, managers, kinds = measured[-1]
        rows[name]["warm_us"].append(us)
        rows[name]["managers"], rows[name]["leaf_guards"] = managers, dict(kinds.most_common())
        print(f"{name}: {us:.1f} us warm, {managers} managers, {sum(kinds.values())} leaf guards", flush=True)
    set_links(True)
    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
              "transformers": transformers.__version__, "machine": platform.processor() or platform.machine(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "int4_units": len(units),
              "model": args.synthetic, "device": args.device, "autoao": str(Path(autoao.__file__).parent),
              "plan": autoao.plan_of(planned).summary(), "sides": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "guard_anatomy.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'guard_anatomy.json'}")


if __name__ == "__main__":
    main()
