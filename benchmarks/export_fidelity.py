"""Per scheme: how far transformers' reload of a compressed-tensors export computes from autoao's
applied model, on this CPU.

    python benchmarks/export_fidelity.py --out benchmarks/results/<date>-cpu/export-fidelity [--demo]

A random-init 2-layer Llama (tests/test_export.py's tiny_llama), one scheme at a time on the
gate/up projections (int4 on down_proj: gate/up's K=256 takes group 128 too, but down_proj is
where int4 plans put it), in float32 and bfloat16: the export's stored weights are autoao's codes
(tests/test_export.py checks that), so what differs is how each side quantizes activations and
sums. Per row: the logits' relative difference (||ours - theirs|| / ||ours||) on 2 x 24 tokens,
and, for int8 activations, the scale each side takes for one token: autoao's amax / 127 (vLLM's
dynamic int8 kernel's) against compressed-tensors' amax / 127.5 (its symmetric range [-128, 127]),
which is what transformers runs. --demo adds the same on the demo model (SmolLM2-135M, real weights,
bf16, the scheme on every gate/up projection, 8 x 16 tokens of held-out text), with each side's
distance from the unquantized model: two quantized models equally far from it but far from each
other quantize differently. Writes fidelity.json and fidelity.md.
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


def demo_rows() -> list[dict[str, float | str]]:
    """Per scheme on SmolLM2's gate/up in bf16: logits' relative distances between transformers'
    reload, autoao's applied model and the unquantized model."""
    import copy

    import autoao.models

    base, tok = autoao.models.load()
    x = torch.cat(autoao.models.text_inputs(tok, seq_len=16, n_seqs=8, held_out=True))
    rows = []
    for name in ("int8_dyn", "fp8_dyn(granularity=row)", "fp8_dyn(granularity=tensor)", "int8_wo", "fp8_wo"):
        model = copy.deepcopy(base)
        layers = {f: search_space.get(name) for f, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and f.endswith(("gate_proj", "up_proj"))}
        model = autoao.apply(model, autoao.Plan(layers=layers, metadata={"target": "transformers"}))
        out = export(model, "compressed-tensors", Path(tempfile.mkdtemp()) / "e", target="transformers", check=False)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            ours, theirs, unq = (m(x).logits.float() for m in (model, reloaded, base))
        rows.append({"scheme": name, "reload_vs_autoao": float((ours - theirs).norm() / ours.norm()),
                     "reload_vs_bf16": float((theirs - unq).norm() / unq.norm()),
                     "autoao_vs_bf16": float((ours - unq).norm() / unq.norm())})
    with torch.no_grad():  # the model's own noise: its float32 twin against it
        unq, twin = base(x).logits.float(), copy.deepcopy(base).float()(x).logits
    rows.append({"scheme": "none (float32 twin)", "reload_vs_autoao": float("nan"), "reload_vs_bf16": float("nan"),
                 "autoao_vs_bf16": float((twin - unq).norm() / unq.norm())})
    return rows


def bf16_activations() -> list[dict[str, object]]:
    """One bf16 activation [128, 576] (random, one outlier channel as real ones have) quantized per
    token by autoao (scales in float32, as vLLM's kernels) and by compressed-tensors' fake quant
    (what transformers runs): the scales' dtype, the relative difference of the dequantized
    activations and the share of values that differ."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    from autoao.kernels.quant import quantize_fp8, quantize_int8_per_token

    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 576, generator=g) * torch.rand(576, generator=g) * 4
    x[:, 7] *= 50
    x = x.to(torch.bfloat16)
    rows = []
    for kind in ("float", "int"):
        args = QuantizationArgs(num_bits=8, type=kind, symmetric=True, strategy="token", dynamic=True)
        scale, zero = calculate_qparams(x.amin(1, keepdim=True), x.amax(1, keepdim=True), args)
        theirs = fake_quantize(x, scale, zero, args).float()
        q, s = quantize_fp8(x, "row") if kind == "float" else quantize_int8_per_token(x)
        ours = q.float() * s
        rows.append({"type": kind, "their_scale_dtype": str(scale.dtype), "our_scale_dtype": str(s.dtype),
                     "rel_diff": float((ours - theirs).norm() / ours.norm()),
                     "share_differing": float(((ours - theirs).abs() > 1e-6 * ours.abs().max()).float().mean())})
    return rows


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
    ap.add_argument("--demo", action="store_true", help="also the demo model, SmolLM2-135M (real weights)")
    args = ap.parse_args()
    rows = [{"scheme": n, "layers": SCHEMES[n], **{str(d).removeprefix("torch."): rel_diff(n, d)
                                                   for d in (torch.float32, torch.bfloat16)}} for n in SCHEMES]
    import compressed_tensors

    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
              "transformers": transformers.__version__, "compressed_tensors": compressed_tensors.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "rows": rows, "int8_activation_scale": int8_scales(),
              "bf16_activations": bf16_activations(), "demo": demo_rows() if args.demo else []}
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
    lines += ["", "One bf16 activation [128, 576] quantized per token (8 bits) by autoao and by compressed-tensors:", ""]
    lines += [f"- {r['type']}: scales {r['our_scale_dtype']} (autoao) vs {r['their_scale_dtype']} (compressed-tensors); "
              f"dequantized values differ by {r['rel_diff']:.2e} relative, {r['share_differing']:.0%} of them"
              for r in result["bf16_activations"]]
    if result["demo"]:
        lines += ["", "SmolLM2-135M, bf16, the scheme on every gate/up projection (logits' relative distance):", "",
                  "| scheme | reload vs autoao | reload vs unquantized | autoao vs unquantized |", "|---|---|---|---|"]
        lines += [f"| {r['scheme']} | {r['reload_vs_autoao']:.4f} | {r['reload_vs_bf16']:.4f} | "
                  f"{r['autoao_vs_bf16']:.4f} |" for r in result["demo"]]
    (args.out / "fidelity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
