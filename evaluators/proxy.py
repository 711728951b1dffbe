"""Tier 1: the label-free proxy. A plan's outputs against the unmodified model's on held-out inputs,
as paired per-position evidence (autoao.types.Evidence) that a budget judges into a verdict.

    proxy = ProxyEvaluator(model, screen_inputs, confirm=[chunk, chunk, ...])
    proxy.calibrate(model)                       # the model's own numerical noise (bf16 vs float32)
    acc, evidence = proxy.score(plan_model)      # the screen: what every trial is scored on
    proxy.prepare(model, chunk=0)                # reference and noise of a confirmation chunk
    acc, evidence = proxy.score(plan_model, chunk=0)   # fresh positions for a verdict

How it compares depends on the outputs (evaluators.sensitivity.output_mode):

- causal LM: top-1 agreement with the reference per position; paired with the agreement the
  model's own float32 twin reaches at the same position (its noise), so the drop is the plan's
  agreement below that floor: "drops by at most 1 point" = 1% more positions change their argmax
  than bf16 rounding alone changes. Positions are grouped in units of BLOCK (a sequence's
  positions are not independent). Also KL(reference || plan) per position, and where T >= 2
  next-token accuracy and loss on the text itself.
- embedding model: per row, 1 - the cosine similarity of the row's embedding to the reference's;
  also nearest-neighbour agreement and the relative L2 error.
- anything else: per output row, its relative L2 error.

The screen inputs score every trial of the search; the confirmation chunks are disjoint from them
and scored only for verdicts, so the plan the search found best on the screen (the fastest of many
whose screen drops were lucky) is judged on positions it was not chosen on.

Reference outputs are kept on the CPU (log-probabilities in float32 for LMs: B*T*V*4 bytes; 1024
tokens of a 49k vocabulary are 200 MB). Results are cached on disk by `key` (the plan's digest).
With `references` (a TensorCache scoped to the model's weights, the device and torch's version),
the unmodified model's side is cached on disk too, by the inputs' digest: the screen's outputs as
the model returned them (an LM's bf16 logits, from which the log-probabilities are computed as
they would be) with the seconds that pass took (`pass_seconds` prices a trial), the float32 twin's
agreement and metrics, and per confirmation chunk an LM's top-1 tokens and noise (other modes: its
outputs). What comes from there is bit-identical to computing it, and the model is not run.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from autoao.common import model_device
from autoao.evaluators.cache import ResultCache, TensorCache, digest, inputs_digest, listed, numbered, scalar
from autoao.evaluators.sensitivity import nearest_rows, pooled_embeddings, output_mode, run_model, token_ids, upcast
from autoao.types import Accuracy, Evidence, Stratum, finite

BLOCK = 32  # positions of one sequence per evidence unit


class _Part:
    """One set of inputs with its reference outputs and per-item noise. `light` (an LM's
    confirmation chunk): only the reference's top-1 tokens are kept, enough for agreement, not the
    [B, T, V] log-probabilities KL and loss need; a light part may be given those tokens (`top`,
    [B, T] each) instead of the outputs."""

    def __init__(self, inputs: list[Any], outs: list[torch.Tensor] | None, mode: str, light: bool = False,
                 top: list[torch.Tensor] | None = None) -> None:
        self.inputs, self.mode = inputs, mode
        if mode == "lm":
            tokens = [token_ids(ex) for ex in inputs]
            # next tokens [B, T-1] where there is text to score (T >= 2)
            self.labels = [t[:, 1:].cpu() if t.shape[1] >= 2 and not light else None for t in tokens]  # type: ignore[union-attr]
            self.ref = None if light else [torch.log_softmax(o.float(), -1).cpu() for o in outs]  # [B, T, V]
            self.top = top if top is not None else [o.float().argmax(-1).cpu() for o in outs]  # [B, T]
        elif mode == "embedding":
            self.ref = [pooled_embeddings(o, ex) for o, ex in zip(outs, inputs)]  # [B, D] each
            self.ref_nn = nearest_rows(torch.cat(self.ref))
        else:
            self.ref = [o.float().cpu() for o in outs]
        self.noise: list[torch.Tensor] | None = None  # LM: [B, T] 1 where the float32 twin agrees
        self.digest = digest("tier1", *(self.ref if self.ref is not None else self.top))

    @property
    def items(self) -> int:
        if self.mode == "lm":
            return sum(t.numel() for t in self.top)
        return sum(r.shape[0] if self.mode == "embedding" else r.reshape(-1, r.shape[-1]).shape[0] for r in self.ref)


class ProxyEvaluator:
    """Tier 1 of a plan (module docstring). `floor` is the unmodified model's score (1.0) unless
    `calibrate` found its own float32 twin agreeing less: then a plan whose outputs differ from the
    reference less than the model's own numerics do is never rejected."""

    def __init__(self, reference: nn.Module, inputs: Any, *, cache: ResultCache | None = None,
                 reference_key: str | None = None, confirm: list[list[Any]] | None = None,
                 references: TensorCache | None = None) -> None:
        """reference_key: the `key` that names the reference model itself (a plan that changes no
        layer): scored as the baseline without running the model again. confirm: further input
        chunks for verdicts (their references computed by `prepare`). references: where the
        unmodified model's side is kept on disk (module docstring); None computes it every time."""
        examples = inputs if isinstance(inputs, list) else [inputs]
        if not examples:
            raise ValueError("the proxy needs at least one held-out input")
        self.cache, self.reference_key, self.references = cache, reference_key, references
        # one pass over the screen: what a trial's scoring costs (measured when the outputs were)
        outs, self.pass_seconds = self._outputs(reference, examples, "proxy-screen")
        self.mode = output_mode(outs, examples)
        self.lm = self.mode == "lm"
        self.screen = _Part(examples, outs, self.mode)
        self.confirm_inputs = list(confirm or [])
        self.confirm: dict[int, _Part] = {}
        self.ntokens = self.screen.items if self.lm else 0
        self.baseline = self._metrics(self.screen, None)[0]
        self.floor = self.baseline["accuracy"]
        self.noise = ""  # what calibrated the floor, for `source`

    @property
    def data_digest(self) -> str:
        return self.screen.digest

    def calibrate(self, reference: nn.Module) -> None:
        """Lower the floor to the agreement the reference reaches with itself run in float32 (a
        bf16 / fp16 LM only; its weights are put back bit-exact): the noise of its own numerics.
        An fp32 model has no lower precision to compare with: its floor stays 1."""
        if self.mode != "lm":
            return
        key = self._key("proxy-noise", self.screen.inputs)
        hit = self.references.get(key) if key is not None else None
        if hit is not None:  # stored only for a model that has a lower precision
            noise, accuracy, kl = listed(hit, "noise"), float(hit["accuracy"]), float(hit["kl"])
        else:
            with upcast(reference) as changed:
                if not changed:
                    return
                metrics, noise = self._metrics(self.screen, run_model(reference, self.screen.inputs))
            accuracy, kl = metrics["accuracy"], metrics["kl"]
            if key is not None:
                stored = {**numbered("noise", noise), "accuracy": scalar(accuracy), "kl": scalar(kl)}
                self.references.put(key, stored)
        self.screen.noise = noise  # [B, T] each: 1 where the float32 twin agrees
        self.floor = min(self.floor, accuracy)
        self.baseline["noise_agreement"] = accuracy
        self.baseline["noise_kl"] = kl
        self.noise = "float32-vs-bf16"

    def prepare(self, reference: nn.Module, chunk: int) -> bool:
        """The reference outputs (and noise) of confirmation chunk `chunk`, from the unmodified
        model; False when there is no such chunk."""
        if chunk in self.confirm:
            return True
        if chunk >= len(self.confirm_inputs):
            return False
        inputs = self.confirm_inputs[chunk]
        if self.lm:
            self.confirm[chunk] = self._light_part(reference, inputs)
        else:
            self.confirm[chunk] = _Part(inputs, self._outputs(reference, inputs, "proxy-confirm")[0], self.mode)
        return True

    def on_disk(self, chunk: int) -> bool:
        """Whether confirmation chunk `chunk`'s reference side is prepared or in the reference
        cache: what preparing it still costs is (nearly) nothing."""
        if chunk in self.confirm:
            return True
        if self.references is None or chunk >= len(self.confirm_inputs):
            return False
        return self.references.has(self._key("proxy-confirm", self.confirm_inputs[chunk]))

    def score(self, model: nn.Module, key: str | None = None, chunk: int | None = None) -> tuple[Accuracy, Evidence]:
        """Tier-1 accuracy of `model` and its evidence, on the screen (chunk None) or a prepared
        confirmation chunk; `key` (e.g. the plan's digest) enables the on-disk cache. A model that
        fails or gives non-finite outputs scores -inf (a drop of inf: it breaks)."""
        part = self.screen if chunk is None else self.confirm[chunk]
        full_key = f"{part.digest}:{key}" if key is not None and self.cache is not None else None
        if key is not None and key == self.reference_key and chunk is None:
            metrics, units = dict(self.baseline), self._units(part, None)
        else:
            hit = self.cache.get(full_key) if full_key else None
            if hit is not None and "units" in hit:
                metrics, units = hit["metrics"], [tuple(u) for u in hit["units"]]
            else:
                metrics, units = self._measure(part, model)
                if full_key:
                    self.cache.put(full_key, {"metrics": metrics, "units": units})
        acc = metrics["accuracy"]
        accuracy = Accuracy(1, acc, self.floor - acc if math.isfinite(acc) else math.inf, finite(metrics),
                            f"proxy: {self.describe()}")
        return accuracy, self._evidence(units, acc)

    def __call__(self, model: nn.Module, key: str | None = None) -> Accuracy:
        """The screen's tier-1 accuracy of `model` (`score` without its evidence)."""
        return self.score(model, key)[0]

    def describe(self) -> str:
        """What `accuracy` and `drop` mean here, in words (the budget's unit)."""
        if self.lm:
            what = f"top-1 agreement with the unmodified model on {self.ntokens} tokens"
            if self.noise:
                what += (f"; drop = points below {self.floor:.4f}, the agreement its own {self.noise} "
                         "difference reaches")
            return what
        if self.mode == "embedding":
            return f"mean cosine similarity to the unmodified model's embeddings of {self.screen.items} held-out rows"
        return "1 - the mean relative L2 error of the output rows on held-out inputs"

    ##### the reference side ####################################################################

    def _key(self, kind: str, inputs: list[Any]) -> str | None:
        """The reference cache's key of what `kind` stores about `inputs` (None: no cache). An LM's
        confirmation chunk holds its noise once calibrated."""
        if self.references is None:
            return None
        noise = f":noise={self.noise}" if kind == "proxy-confirm" and self.lm else ""
        return f"{kind}:{inputs_digest(inputs)}{noise}"

    def _outputs(self, reference: nn.Module, inputs: list[Any], kind: str) -> tuple[list[torch.Tensor], float]:
        """The reference's outputs on `inputs` and the seconds that pass took: from the reference
        cache where it holds them (put on the model's device, where they were computed; the
        seconds measured then), else run and stored."""
        key = self._key(kind, inputs)
        hit = self.references.get(key) if key is not None else None
        if hit is not None:
            device = model_device(reference)
            return [o.to(device) for o in listed(hit, "out")], float(hit["seconds"])
        t0 = time.perf_counter()
        outs = run_model(reference, inputs)
        seconds = time.perf_counter() - t0
        if key is not None:
            self.references.put(key, {**numbered("out", outs), "seconds": scalar(seconds)})
        return outs, seconds

    def _light_part(self, reference: nn.Module, inputs: list[Any]) -> _Part:
        """An LM's confirmation chunk: the reference's top-1 tokens [B, T] and, once calibrated,
        the float32 twin's agreement with them [B, T]; from the reference cache where it holds them."""
        key = self._key("proxy-confirm", inputs)
        hit = self.references.get(key) if key is not None else None
        if hit is not None:
            part = _Part(inputs, None, self.mode, light=True, top=listed(hit, "top"))
            part.noise = listed(hit, "noise") if self.noise else None
            return part
        part = _Part(inputs, run_model(reference, inputs), self.mode, light=True)
        if self.noise:
            with upcast(reference):
                part.noise = self._metrics(part, run_model(reference, part.inputs))[1]
        if key is not None:
            self.references.put(key, {**numbered("top", part.top), **numbered("noise", part.noise or [])})
        return part

    ##### per item ##############################################################################

    def _measure(self, part: _Part, model: nn.Module) -> tuple[dict[str, float], list[tuple[float, int, int]]]:
        try:
            outs = run_model(model, part.inputs)
            metrics, items = self._metrics(part, outs)
        except Exception as e:  # noqa: BLE001 - a plan that cannot run scores as useless
            return {"accuracy": -math.inf, "error": f"{type(e).__name__}: {e}"}, []  # type: ignore[dict-item]
        if not all(math.isfinite(v) for v in metrics.values()):
            return {**metrics, "accuracy": -math.inf}, []
        return metrics, self._units(part, items)

    def _units(self, part: _Part, items: list[torch.Tensor] | None) -> list[tuple[float, int, int]]:
        """(summed difference, items, changed items) per unit: LM positions in blocks of BLOCK per
        sequence, paired with the noise floor; rows elsewhere. items None: the reference itself."""
        units: list[tuple[float, int, int]] = []
        if self.mode == "lm":
            for b, top in enumerate(part.top):
                agree = items[b] if items is not None else torch.ones_like(top, dtype=torch.float32)
                floor = part.noise[b].float() if part.noise is not None else torch.ones_like(agree)
                for row in range(agree.shape[0]):
                    for s in range(0, agree.shape[1], BLOCK):
                        a, f = agree[row, s:s + BLOCK], floor[row, s:s + BLOCK]
                        units.append((float((f - a).sum()), int(a.numel()), int((f != a).sum())))
            return units
        per = torch.cat(items) if items is not None else torch.zeros(part.items)
        return [(float(v), 1, 0) for v in per]

    def _evidence(self, units: list[tuple[float, int, int]], acc: float) -> Evidence:
        if not units:  # nothing finite to compare: a plan that broke
            units = [(math.inf, 1, 1)]
        metric = {"lm": "top-1 agreement", "embedding": "cosine similarity"}.get(self.mode, "output relative error")
        stratum = Stratum(tuple(u[0] for u in units), tuple(u[1] for u in units), changed=sum(u[2] for u in units))
        unit = "positions" if self.lm else "rows"
        return Evidence("proxy", 1, metric, unit, (stratum,), self.floor, acc, discrete=self.lm)

    def _metrics(self, part: _Part, outs: list[torch.Tensor] | None) -> tuple[dict[str, float], list[torch.Tensor]]:
        """The metrics of `outs` against the part's reference (None: the reference itself) and the
        per-item values the evidence pairs: LM agreement [B, T] (1 = same argmax); elsewhere the
        per-row drop (1 - cosine, or the relative error)."""
        if self.mode == "lm":
            return self._lm_metrics(part, outs)
        if self.mode == "embedding":
            emb = part.ref if outs is None else [pooled_embeddings(o, ex) for o, ex in zip(outs, part.inputs)]
            e, r = torch.cat(emb), torch.cat(part.ref)  # [R, D]
            if not torch.isfinite(e).all():
                return {"accuracy": -math.inf, "cosine": -math.inf}, []
            cos = (e * r).sum(-1)  # [R]
            return ({"accuracy": cos.mean().item(), "cosine": cos.mean().item(), "cosine_min": cos.min().item(),
                     "nn_agreement": (nearest_rows(e) == part.ref_nn).float().mean().item(),
                     "rel_error": math.sqrt((e - r).pow(2).sum().item() / max(r.pow(2).sum().item(), 1e-30))},
                    [1.0 - cos])
        rows = [(o.float().cpu() if outs is not None else r).reshape(-1, r.shape[-1]) for o, r in
                zip(outs if outs is not None else part.ref, part.ref)]
        refs = [r.reshape(-1, r.shape[-1]) for r in part.ref]
        errs = [(o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-12) for o, r in zip(rows, refs)]  # [R] each
        num = sum((o - r).pow(2).sum().item() for o, r in zip(rows, refs))
        den = sum(r.pow(2).sum().item() for r in refs)
        rel = math.sqrt(num / max(den, 1e-30)) if math.isfinite(num) else math.inf
        mean = torch.cat(errs).mean().item()
        return {"accuracy": 1.0 - mean, "rel_error": rel, "row_error": mean}, errs

    def _lm_metrics(self, part: _Part, outs: list[torch.Tensor] | None) -> tuple[dict[str, float], list[torch.Tensor]]:
        if part.ref is None:  # a light part: agreement only
            agree = [(o.float().argmax(-1).cpu() == top).float() if outs is not None else torch.ones_like(top, dtype=torch.float32)
                     for o, top in zip(outs if outs is not None else part.top, part.top)]
            share = sum(a.sum().item() for a in agree) / part.items
            return {"accuracy": share, "agreement": share}, agree
        correct = kl = nll = 0.0
        agree: list[torch.Tensor] = []
        for i, (ref, lab) in enumerate(zip(part.ref, part.labels)):
            logp = ref if outs is None else torch.log_softmax(outs[i].float(), -1).cpu()  # [B, T, V]
            agree.append((logp.argmax(-1) == part.top[i]).float())  # [B, T]
            kl += (ref.exp() * (ref - logp)).sum().item()  # KL(ref || plan), summed over positions
            if lab is not None:
                correct += (logp[:, :-1].argmax(-1) == lab).sum().item()
                nll -= logp[:, :-1].gather(-1, lab[..., None]).sum().item()
        n = part.items
        share = sum(a.sum().item() for a in agree) / n
        out = {"accuracy": share, "agreement": share, "kl": kl / n}
        labels = sum(lab.numel() for lab in part.labels if lab is not None)
        if labels:
            out.update(next_token=correct / labels, loss=nll / labels)
        return out, agree
