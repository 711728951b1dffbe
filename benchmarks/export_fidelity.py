"""Per scheme: how far transformers' reload of a compressed-tensors export computes from autoao's
applied model, on this CPU.

    python benchmarks/export_fidelity.py --out benchmarks/results/<date>-cpu/export-fidelity

A random-init 2-layer Llama (tests/test_export.py's tiny_llama), one scheme at a time on the
gate/up projections (int4 on down_proj: gate/up's K=256 takes group 128 too, but down_proj is
where int4 plans put it), in float32 and bfloat16: the export's stored weights are autoao's codes
(tests/test_export.py checks that), so what differs is how each side quantizes activations and
sums. Per row: the logits' relative difference (||ours - theirs|| / ||ours||) on 2 x 24 tokens,
and, for int8 activations, the scale each side takes for one token: autoao's amax / 127 (vLLM's
dynamic int8 kernel's) against compressed-tensors' amax / 127.5 (its symmetric range [-128, 127]),
which is what transformers runs. Writes fidelity.json and fidelity.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers

import autoao
from autoao import search_space
from autoao.export import export

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_export import ids, tiny_llama  # noqa: E402

SCHEMES = {"int8_dyn": "gate/up", "fp8_dyn(granularity=row)": "gate/up", "fp8_dyn(granularity=tensor)": "gate/up",
           "int8_wo": "gate/up", "fp8_wo": "gate/up", "int4_sym(group_size=128)": "down"}


def rel_diff(name: str, dtype: torch.dtype) -> float:
    model = tiny_llama(dtype)
    roles = ("mlp.down_proj",) if SCHEMES[name] == "down" else ("mlp.gate_proj", "mlp.up_proj")
    layers = {f"model.layers.{i}.{r}": search_space.get(name) for i in range(2) for r in roles}
    model = autoao.apply(model, autoao.Plan.for_model(model, layers, target="transformers"))
    out = export(model, "compressed-tensors", Path(tempfile.mkdtemp()) / "e", target="transformers", check=False)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=dtype).eval()
    with torch.no_grad():
        ours, theirs = model(ids()).logits.float(), reloaded(ids()).logits.float()
    return float((ours - theirs).norm() / ours.norm())


def int8_scales() -> dict[str, float]:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    from autoao.kernels.quant import quantize_int8_per_token

    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    theirs, _ = calculate_qparams(x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True), args)
    return {"amax": float(x.abs().max()), "autoao_scale": float(quantize_int8_per_token(x)[1]),
            "compressed_tensors_scale": float(theirs.flatten()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    rows = [{"scheme": n, "layers": SCHEMES[n], **{str(d).removeprefix("torch."): rel_diff(n, d)
                                                   for d in (torch.float32, torch.bfloat16)}} for n in SCHEMES]
    import compressed_tensors

    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
              "transformers": transformers.__version__, "compressed_tensors": compressed_tensors.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "rows": rows, "int8_activation_scale": int8_scales()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity.json").write_text(json.dumps(result, indent=1))
    s = result["int8_activation_scale"]
    lines = ["# compressed-tensors export: transformers' reload against autoao's applied model", "",
             f"`{result['command']}`; {result['date']}; torch {result['torch']}, transformers "
             f"{result['transformers']}, compressed-tensors {result['compressed_tensors']}", "",
             "| scheme | layers | logits rel. diff, float32 | bfloat16 |", "|---|---|---|---|"]
    lines += [f"| {r['scheme']} | {r['layers']} | {r['float32']:.2e} | {r['bfloat16']:.2e} |" for r in rows]
    lines += ["", f"int8 per-token activation scale of one token (amax {s['amax']:.6f}): autoao "
              f"{s['autoao_scale']:.8f} (amax / 127), compressed-tensors {s['compressed_tensors_scale']:.8f}."]
    (args.out / "fidelity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
