"""Stage 1: what the model runs and what its linear layers see.

    work = build_inputs(model, example_inputs, eval_inputs=..., tokenizer=..., fuse_groups=True)
    work.prof (layers, shapes, calibration), work.examples, work.held_out (the judges' inputs),
    work.confirm, work.prompt_inputs (more held-out inputs), work.tokens (every M), work.notes

The judges never judge on a handful of positions: when the inputs they would score (eval_inputs,
else the examples) hold fewer than evaluators.heldout's minimum, held-out inputs are built (the
tokenizer's bundled text, else the model's own samples, else inputs like the examples).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from autoao.common import call_model, input_numel, model_device
from autoao.cost import fused_shape, layer_calls, token_counts
from autoao.decisions import BusyCpu, Decision, HeldOutInputs
from autoao.evaluators import heldout
from autoao.evaluators.sensitivity import token_ids
from autoao.profile import GRID_CANDIDATE, ModelProfile, int4_grid_layers, profile
from autoao.search_space import Candidate


@dataclass(frozen=True)
class Inputs:
    """What the model runs and what its linear layers see."""

    prof: ModelProfile
    examples: list[Any]  # the example inputs, one forward each
    held_out: heldout.HeldOut  # the label-free judges' inputs: the screen every trial is scored on
    confirm: tuple[list[Any], ...]  # further held-out chunks for verdicts where the proxy decides
    siblings: list[tuple[str, ...]]  # layers reading one input, fused where timing says so
    device: torch.device
    dtype: torch.dtype  # the layers' dtype (bf16 if any layer is)
    tokens: list[int]  # every M (rows per call) any layer saw
    notes: tuple[Decision, ...] = ()  # said about the inputs and the machine, shown with the decisions
    # layers whose weights sit on a 4-bit grid of groups of 32 (a GGUF Q4 source): int4 with group
    # size 32 measures near lossless on them
    grid_layers: int = 0
    # a causal LM's further held-out inputs, disjoint from the screen and the confirmation chunks,
    # where those two hold fewer than GENERATION_PROMPTS windows for the generation check's prompts
    prompt_inputs: tuple[Any, ...] = ()

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(N, K) of every profiled layer, each once (fused groups' shapes are timed separately)."""
        return sorted({(lay.out_features, lay.in_features) for lay in self.prof.layers})

    @property
    def fused_shapes(self) -> list[tuple[int, int]]:
        """(N, K) of every sibling group run as one module."""
        return sorted({fused_shape(self.prof, g)[::-1] for g in self.siblings})

    def shape_calls(self) -> dict[tuple[int, int], dict[int, int]]:
        """(N, K) -> {M: calls per forward, summed over the layers (and fused sibling groups) of
        that shape}: how the workload weighs each token count when timing chooses among kernels."""
        out: dict[tuple[int, int], dict[int, int]] = {}
        calls = layer_calls(self.prof)
        shaped = [((lay.out_features, lay.in_features), lay.fqn) for lay in self.prof.layers]
        shaped += [(fused_shape(self.prof, g)[::-1], g[0]) for g in self.siblings]
        for shape_nk, fqn in shaped:
            shape = out.setdefault(shape_nk, {})
            for m, n in calls[fqn].items():
                shape[m] = shape.get(m, 0) + n
        return out


# On a CPU shared with other work, each of torch's parallel regions waits at its barrier for a
# thread that lost its core: a bf16 576x1536 layer at M=256 took 18.8 ms on 2 threads and 0.55 ms
# on 1 next to other jobs (docs/measuring.md#a-busy-cpu). A run whose smallest example is this much faster
# on one thread than on torch's threads runs on one ...
BUSY_CPU_FACTOR = 1.5
# ... and at least this many seconds slower: a stalled barrier costs whole scheduler slices
# (milliseconds), while a tiny model's call takes tens of microseconds and a microsecond's hiccup
# makes either side 1.5x the other.
BUSY_CPU_STALL_S = 1e-3


def settle_cpu_threads(model: nn.Module, example_inputs: Any) -> BusyCpu | None:
    """On the CPU with more than one torch thread: the smallest example, and a product the size of
    one of the model's layers at PROBE_ROWS rows (a decode step's example runs too little in
    parallel to stall), each called at torch's thread count and at one thread in turn (after one
    warm-up call, 3 calls each, the median of each). When one thread is more than BUSY_CPU_FACTOR x
    and BUSY_CPU_STALL_S faster on either, torch is set to one thread (the caller restores its count
    when the run ends) and the decision says so; else None. Inputs that cannot be called are left
    for the profiler to report."""
    threads = torch.get_num_threads()
    if threads == 1 or model_device(model).type != "cpu":
        return None
    examples = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    try:
        ex = min(examples, key=input_numel)
        probes = [lambda: call_model(model, ex), _layer_probe(model)]
        with torch.no_grad():
            best = [_threads_vs_one(fn, threads) for fn in probes if fn is not None]
    except Exception:  # noqa: BLE001 - bad inputs are the profiler's to report, with its message
        torch.set_num_threads(threads)
        return None
    for many, one in best:
        if one * BUSY_CPU_FACTOR < many and many - one > BUSY_CPU_STALL_S:
            torch.set_num_threads(1)
            return BusyCpu(threads, many * 1e3, one * 1e3)
    torch.set_num_threads(threads)
    return None


PROBE_ROWS = 256  # rows of the layer-sized product settle_cpu_threads times (a prefill's)


def _layer_probe(model: nn.Module) -> Callable[[], object] | None:
    """x [PROBE_ROWS, K] @ W.T for the model's median-sized linear weight W [N, K], in its dtype."""
    weights = sorted((m.weight for m in model.modules() if isinstance(m, nn.Linear)), key=lambda w: w.numel())
    if not weights:
        return None
    w = weights[len(weights) // 2].detach()
    x = torch.randn(PROBE_ROWS, w.shape[1], dtype=w.dtype, device=w.device)
    return lambda: torch.nn.functional.linear(x, w)


def _threads_vs_one(fn: Callable[[], object], threads: int) -> tuple[float, float]:
    """(median seconds of fn() at `threads` threads, at one), 3 calls each in turn after a warm-up."""
    fn()
    took: dict[int, list[float]] = {threads: [], 1: []}
    for _ in range(3):
        for n in (threads, 1):
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            fn()
            took[n].append(time.perf_counter() - t0)
    torch.set_num_threads(threads)
    return statistics.median(took[threads]), statistics.median(took[1])


# Where the proxy decides, the positions of each look a verdict may take beyond the screen's (fresh
# held-out inputs, disjoint from the screen's): a plan inside the model's own noise is resolved
# within a 1-point budget on about 4000 positions (95% interval, paired with the float32 floor).
CONFIRM_POSITIONS = (1024, 1024, 2048)
# The generation check of a causal LM (autoao.stages.judges.GENERATION) takes up to GENERATION_PROMPTS
# prompts, each a window of PROMPT_TOKENS consecutive held-out tokens: the workload holds that many.
PROMPT_TOKENS, GENERATION_PROMPTS = 32, 64


def build_inputs(model: nn.Module, example_inputs: Any, *, eval_inputs: Any = None, tokenizer: Any = None,
                   fuse_groups: bool = True, busy: BusyCpu | None = None, seed: int = 0,
                   screen_positions: int = heldout.MIN_LM_POSITIONS, confirm: bool = True) -> Inputs:
    """Profile the model on its examples and settle the judges' held-out inputs (module docstring):
    the screen's, of at least `screen_positions` positions, where `confirm` (the proxy decides)
    the confirmation chunks of CONFIRM_POSITIONS, and for a causal LM enough further inputs for the
    generation check's prompts (`_prompt_inputs`). `busy`: settle_cpu_threads' decision, kept with
    the workload's notes."""
    prof = profile(model, example_inputs)
    examples = example_inputs if isinstance(example_inputs, list) else [example_inputs]
    held = heldout.held_out_inputs(model, examples, eval_inputs=eval_inputs, tokenizer=tokenizer, seed=seed,
                                   positions=max(screen_positions, heldout.MIN_LM_POSITIONS))
    chunks, last = _confirmation(model, examples, held, tokenizer) if confirm else ([], held)
    prompt_inputs = _prompt_inputs(model, examples, [*held.inputs, *(x for c in chunks for x in c)], last, tokenizer)
    notes: list[Decision] = [busy] if busy is not None else []
    if held.source != heldout.EVAL:
        lm = held.unit == "token positions"
        given = None if eval_inputs is None else _positions(eval_inputs, lm)
        minimum = max(screen_positions, heldout.MIN_LM_POSITIONS) if lm else heldout.MIN_ROWS  # what was asked
        notes.append(HeldOutInputs(given, minimum, held.positions, f"{held.unit} of {held.source}",
                                   "positions" if lm else "rows"))
    dtypes = {lay.dtype for lay in prof.layers}
    dtype = torch.bfloat16 if torch.bfloat16 in dtypes or not dtypes else next(iter(dtypes))
    return Inputs(prof, examples, held, tuple(chunks), prof.siblings if fuse_groups else [], model_device(model),
                    dtype, token_counts(prof), tuple(notes), len(int4_grid_layers(model, prof)), tuple(prompt_inputs))


def _confirmation(model: nn.Module, examples: list[Any], held: heldout.HeldOut,
                  tokenizer: Any) -> tuple[list[list[Any]], heldout.HeldOut]:
    """Held-out input chunks of CONFIRM_POSITIONS positions (rows for other modules), each the next
    parts of the screen's source, disjoint from the screen and from each other; and the last part
    taken (the next disjoint part follows it)."""
    chunks, part = [], held
    for size in CONFIRM_POSITIONS:
        chunk: list[Any] = []
        have = 0
        while have < size:
            part = heldout.more(model, examples, part, tokenizer=tokenizer)
            chunk += part.inputs
            have += part.positions
        chunks.append(chunk)
    return chunks, part


def _prompt_inputs(model: nn.Module, examples: list[Any], taken: list[Any], last: heldout.HeldOut,
                   tokenizer: Any) -> list[Any]:
    """For a causal LM whose held-out inputs so far (`taken`: the screen's and the confirmation
    chunks') hold fewer than GENERATION_PROMPTS windows of PROMPT_TOKENS tokens: the next parts of
    their source after `last`, disjoint from them, until all hold that many (or a part adds none:
    sequences shorter than a window; the check then cuts shorter prompts). Nothing for other modules."""
    if last.unit != "token positions":
        return []
    have, out, part = _windows(taken), [], last
    while have < GENERATION_PROMPTS:
        part = heldout.more(model, examples, part, tokenizer=tokenizer)
        if not _windows(part.inputs):
            break
        out += part.inputs
        have += _windows(part.inputs)
    return out


def _windows(inputs: list[Any]) -> int:
    """Windows of PROMPT_TOKENS consecutive tokens, not overlapping, in the inputs' token ids."""
    return sum(t.shape[0] * (t.shape[1] // PROMPT_TOKENS) for t in map(token_ids, inputs) if t is not None)


def _positions(inputs: Any, lm: bool) -> int:
    """Token positions (a causal LM's ids) or batch rows in `inputs` (one or a list)."""
    items = inputs if isinstance(inputs, list) else [inputs]
    if lm:
        return sum(t.numel() for t in map(token_ids, items) if t is not None)
    return sum(next((v.shape[0] for v in _tensors(ex) if v.dim()), 1) for ex in items)


def _tensors(example: Any) -> list[torch.Tensor]:
    if isinstance(example, torch.Tensor):
        return [example]
    values = example.values() if isinstance(example, dict) else example if isinstance(example, (list, tuple)) else []
    return [v for v in values if isinstance(v, torch.Tensor)]


def grid_warning(work: Inputs, cands: list[Candidate]) -> str | None:
    """The console's warning when the search may pick GRID_CANDIDATE on layers whose weights sit
    on its grid (it would measure near lossless on them)."""
    if not work.grid_layers or not any(c.name == GRID_CANDIDATE for c in cands):
        return None
    return (f"warning: the weights of {work.grid_layers} of {len(work.prof.layers)} layers sit on a 4-bit grid of "
            f"groups of 32 (a GGUF Q4 source?): {GRID_CANDIDATE} re-quantizes that grid and will measure near "
            "lossless on them")
