"""Held-out inputs for the label-free judges, so a plan is never judged on a handful of positions.

    held = held_out_inputs(model, examples, eval_inputs=None, tokenizer=tok)  # -> HeldOut
    held.inputs, held.source, held.positions, held.describe()
    further = more(model, examples, held, tokenizer=tok)   # a further, disjoint batch: more evidence

The caller's `eval_inputs` are used when they hold enough: MIN_LM_POSITIONS token positions for a
causal LM, MIN_ROWS rows (batch rows, dim 0) for any other module. Otherwise, by the kind of model:

- a causal LM (token-id inputs, `token_ids`; [B, T, V] logits out, `output_mode` "lm") with a
  known tokenizer: the bundled prose's held-out half (`bundled_text`), which the calibration
  inputs never come from: 16,939 bytes, 3,539 tokens of SmolLM2's tokenizer (27 sequences of
  TEXT_LEN, 13 disjoint parts of MIN_LM_POSITIONS; `bundled_tokens` counts them for any tokenizer);
- a causal LM without one: sequences the unmodified model samples itself (`model_samples`:
  temperature 1 from the model's own logits, so they follow its own distribution) from distinct
  starting tokens, none of them an example's first token, so no held-out position shares its
  context with an example's;
- any other module: inputs like the examples (`like_examples`: drawn from their statistics).

Every source is deterministic for a seed, and `more` gives the next part of it (the next text, the
next starting tokens and sampling seed, the next draw), disjoint from the parts before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from autoao.common import call_model, model_device
from autoao.evaluators.generation import decode, uses_kv_cache
from autoao.evaluators.sensitivity import output_logits, output_mode, token_ids

MIN_LM_POSITIONS = 256  # a causal LM is judged on at least "a few hundred token positions"
MIN_ROWS = 128  # other modules: at least this many batch rows (the built-in encoder's 4 batches of 32)
TEXT_LEN = 128  # tokens per held-out text sequence
SAMPLE_LEN = 64  # tokens per sampled sequence (start token included)
SAMPLE_BATCH = 8  # sequences sampled together, one tensor each
LIKE_BATCH = 32  # rows per drawn input, unless an example's own batch is larger

EVAL, TEXT, SAMPLES, LIKE = "eval_inputs", "tokenizer text", "the model's own samples", "inputs like the examples"
TEXT_PATH = Path(__file__).parent / "tasks" / "autoao_text.jsonl"


@dataclass(frozen=True)
class HeldOut:
    """Held-out inputs (autoao.profile's convention: a list, one forward each) and where they came
    from. `positions` counts token positions for a causal LM, batch rows for other modules
    (`unit` says which); `part` is which disjoint batch of its source this is (`more` takes the
    next), `seed` what drew it."""

    inputs: list
    source: str  # EVAL, TEXT, SAMPLES or LIKE
    positions: int
    unit: str = "token positions"
    part: int = 0
    seed: int = 0

    def describe(self) -> str:
        """'256 token positions of the model's own samples (seed 0, part 0)'."""
        drawn = "" if self.source == EVAL else f" (seed {self.seed}, part {self.part})"
        if self.source == TEXT:
            drawn = f" (the bundled prose's held-out half, part {self.part})"
        return f"{self.positions} {self.unit} of {self.source}{drawn}"


##### sources ###################################################################################

def bundled_tokens(tokenizer: Any, *, held_out: bool) -> torch.Tensor:
    """The bundled original prose (autoao_text) in `tokenizer`'s ids [n]: its second half of the
    documents for held_out, else the first half (calibration)."""
    docs = [json.loads(line)["text"] for line in TEXT_PATH.read_text().splitlines() if line.strip()]
    half = len(docs) // 2
    text = "\n\n".join(docs[half:] if held_out else docs[:half])
    return tokenizer(text, return_tensors="pt")["input_ids"][0]


def bundled_text(tokenizer: Any, *, seq_len: int, n_seqs: int, held_out: bool, first: int = 0) -> list[torch.Tensor]:
    """Token-id batches [1, seq_len] cut from the bundled prose: sequences first .. first+n_seqs-1
    of it (consecutive, not overlapping). Calibration inputs (held_out=False) come from the first
    half of the documents, held-out inputs from the second, so a proxy never scores the text a
    profile calibrated on. ValueError saying how many tokens the text has when it has too few."""
    ids = bundled_tokens(tokenizer, held_out=held_out)
    if ids.numel() < (first + n_seqs) * seq_len:
        which = "held-out" if held_out else "calibration"
        raise ValueError(f"the bundled {which} text has {ids.numel()} tokens in this tokenizer "
                         f"({ids.numel() // seq_len} sequences of {seq_len}); asked for sequences {first} to "
                         f"{first + n_seqs - 1}")
    return _cut(ids, seq_len, n_seqs, first)


def _cut(ids: torch.Tensor, seq_len: int, n_seqs: int, first: int) -> list[torch.Tensor]:
    """Sequences first .. first+n_seqs-1 of `ids` [n], each [1, seq_len]."""
    return [ids[i * seq_len:(i + 1) * seq_len][None, :] for i in range(first, first + n_seqs)]


def model_samples(model: nn.Module, *, n_seqs: int, seq_len: int, seed: int, vocab_size: int | None = None,
                  part: int = 0, exclude: Sequence[int] = ()) -> list[torch.Tensor]:
    """Sequences the unmodified `model` samples itself: n_seqs x seq_len token ids (start included),
    as [b, seq_len] int64 tensors of at most SAMPLE_BATCH rows on the model's device.

    Each starts at a distinct token: the seed's permutation of the vocabulary less `exclude`,
    taken n_seqs at a time (`part` 0, 1, ... take disjoint slices while the vocabulary lasts, then
    wrap). Each next token is drawn from softmax(logits) at temperature 1 (multinomial, no top-k or
    top-p), so the text follows the model's own distribution, through the decode path of
    autoao.evaluators.generation (the KV cache for a transformers model). Deterministic for
    (seed, part) on a device (a torch.Generator of its own; the global RNG is untouched). No grad;
    the model's training flag is restored. ValueError if the logits are not finite.
    vocab_size: the ids to start from (default: the model's, from its config or its logits)."""
    if n_seqs < 1 or seq_len < 1:
        raise ValueError(f"model_samples needs n_seqs >= 1 and seq_len >= 1, got {n_seqs} and {seq_len}")
    device = model_device(model)
    vocab = vocab_size or _vocab_size(model)
    allowed = torch.ones(vocab, dtype=torch.bool)
    allowed[[t for t in exclude if 0 <= t < vocab]] = False
    pool = torch.nonzero(allowed)[:, 0]  # [S] the ids a sample may start at
    if len(pool) == 0:
        raise ValueError(f"every one of the {vocab} token ids is excluded as a start")
    pool = pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))]
    starts = pool[torch.arange(part * n_seqs, (part + 1) * n_seqs) % len(pool)]  # [n_seqs]
    g = torch.Generator(device=device).manual_seed(_mix(seed, part))

    def sample(logits: torch.Tensor, i: int) -> torch.Tensor:
        if not torch.isfinite(logits).all():
            raise ValueError(f"the model's logits are not finite at sampling step {i}: it cannot be sampled")
        probs = torch.softmax(logits.float(), -1)  # [b, V]
        return torch.multinomial(probs, 1, generator=g)[:, 0]

    out = []
    for b in range(0, n_seqs, SAMPLE_BATCH):
        first = starts[b:b + SAMPLE_BATCH, None].to(device)  # [b, 1]
        rest = decode(model, first, seq_len - 1, sample)  # [b, seq_len - 1]
        out.append(torch.cat([first, rest], 1).long())
    return out


def like_examples(examples: Any, *, rows: int, seed: int, part: int = 0) -> list:
    """Inputs of the examples' structure (autoao.profile's convention: a tensor, a tuple of
    positional args, a dict of keyword args, or a list of those), holding `rows` batch rows in all.

    Input j follows example j mod E. Its batch (dim 0 of its first tensor of at least one dim, b)
    becomes max(b, LIKE_BATCH) rows, the last input fewer so the total is exactly `rows`; every
    tensor of the example whose dim 0 is b takes that batch, the others keep their shape. Per tensor,
    pooled over the examples at the same place in the structure:
    - floating tensors of >= 1 dim: N(mean, std) of the examples' finite values, per feature (the
      last dim of a tensor of >= 2 dims; a 1-D tensor is one feature); where a feature has one value,
      the std of all the tensor's values;
    - integer tensors of >= 1 dim: uniform over the examples' [min, max], inclusive (token ids stay
      in the seen range; an all-ones attention mask stays all ones);
    - booleans, 0-dim tensors and anything not a tensor: copied (a batch-scaled boolean repeats its
      rows).
    A float tensor that is not data (an additive -inf mask) is drawn like data: pass eval_inputs for
    such models. Deterministic for (seed, part)."""
    exs = examples if isinstance(examples, list) else [examples]
    if not exs or rows < 1:
        raise ValueError(f"like_examples needs at least one example and rows >= 1, got {len(exs)} and {rows}")
    stats: dict[tuple, list[torch.Tensor]] = {}  # place in the structure -> the examples' tensors there
    for ex in exs:
        for path, t in _leaves(ex):
            if _drawn(t):
                stats.setdefault(path, []).append(t)
    g = torch.Generator().manual_seed(_mix(seed, part))
    out, have, j = [], 0, 0
    while have < rows:
        ex = exs[j % len(exs)]
        b = _batch(ex)
        nb = min(max(b, LIKE_BATCH), rows - have)
        out.append(_draw(ex, (), b, nb, stats, g))
        have, j = have + nb, j + 1
    return out


##### choosing ##################################################################################

def is_causal_lm(model: nn.Module, examples: Any) -> bool:
    """Whether `model` is a causal LM by its inputs and outputs: every example's token ids
    (`token_ids`) and [B, T, V] logits over a vocabulary above every id for the first example (one
    forward, no grad; its training flag restored)."""
    exs = examples if isinstance(examples, list) else [examples]
    if not exs or any(token_ids(ex) is None for ex in exs):
        return False
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = output_logits(call_model(model, exs[0]))
    finally:
        model.train(was)
    return output_mode([out], exs[:1]) == "lm"


def held_out_inputs(model: nn.Module, examples: Any, *, eval_inputs: Any = None, tokenizer: Any = None,
                    positions: int = MIN_LM_POSITIONS, rows: int = MIN_ROWS, seed: int = 0) -> HeldOut:
    """Held-out inputs holding at least `positions` token positions (a causal LM) or `rows` batch
    rows (another module): `eval_inputs` where they hold that many; else built, as the module
    docstring says (tokenizer text, the model's own samples, or inputs like the examples)."""
    exs = examples if isinstance(examples, list) else [examples]
    if not exs:
        raise ValueError("held_out_inputs needs the example inputs (at least one)")
    lm = is_causal_lm(model, exs)
    if eval_inputs is not None:
        evals = eval_inputs if isinstance(eval_inputs, list) else [eval_inputs]
        have = _count(evals, lm)
        if have >= (positions if lm else rows):
            return HeldOut(evals, EVAL, have, _unit(lm), part=0, seed=seed)
    return _build(_default_source(lm, tokenizer), model, exs, tokenizer, positions if lm else rows, seed, part=0)


def more(model: nn.Module, examples: Any, previous: HeldOut, *, tokenizer: Any = None) -> HeldOut:
    """A further batch of held-out inputs as large as `previous`, disjoint from it and every part
    before it of the same seed: the next part of its source. After the caller's eval_inputs, the
    first part of the source held_out_inputs would build; after the bundled text runs out, the
    model's own samples (part 0). Give the same tokenizer as to held_out_inputs."""
    exs = examples if isinstance(examples, list) else [examples]
    if previous.source == EVAL:
        source = _default_source(is_causal_lm(model, exs), tokenizer)
        return _build(source, model, exs, tokenizer, previous.positions, previous.seed, part=0)
    if previous.source == TEXT and tokenizer is None:
        raise ValueError("more() after tokenizer text needs that tokenizer (tokenizer=None was given)")
    return _build(previous.source, model, exs, tokenizer, previous.positions, previous.seed, previous.part + 1)


def _default_source(lm: bool, tokenizer: Any) -> str:
    """What held_out_inputs builds when the caller's inputs are too few."""
    if not lm:
        return LIKE
    return TEXT if tokenizer is not None else SAMPLES


def _build(source: str, model: nn.Module, exs: list, tokenizer: Any, size: int, seed: int, part: int) -> HeldOut:
    """Part `part` of `source`, holding at least `size` positions (rows for LIKE)."""
    if source == LIKE:
        return HeldOut(like_examples(exs, rows=size, seed=seed, part=part), LIKE, size, "rows", part, seed)
    if source == TEXT:
        n = math.ceil(size / TEXT_LEN)
        ids = bundled_tokens(tokenizer, held_out=True)
        if ids.numel() >= (part + 1) * n * TEXT_LEN:
            _check_vocab(model, ids)
            inputs = [_like_lm_input(exs[0], t.to(model_device(model))) for t in _cut(ids, TEXT_LEN, n, part * n)]
            return HeldOut(inputs, TEXT, n * TEXT_LEN, part=part, seed=seed)
        source, part = SAMPLES, 0  # the text is spent: the model's own samples take over
    seq_len = min(SAMPLE_LEN, max_positions(model) or SAMPLE_LEN)
    n = math.ceil(size / seq_len)
    seqs = model_samples(model, n_seqs=n, seq_len=seq_len, seed=seed, part=part, exclude=_first_tokens(exs))
    return HeldOut([_like_lm_input(exs[0], t) for t in seqs], SAMPLES, n * seq_len, part=part, seed=seed)


##### internals #################################################################################

def _unit(lm: bool) -> str:
    return "token positions" if lm else "rows"


def _count(inputs: list, lm: bool) -> int:
    """Token positions (a causal LM's token ids) or batch rows in `inputs`."""
    if lm:
        return sum(t.numel() for t in (token_ids(ex) for ex in inputs) if t is not None)
    return sum(_batch(ex) for ex in inputs)


def _mix(seed: int, part: int) -> int:
    """One generator seed per (seed, part); parts below 2**20 never collide."""
    return seed * (1 << 20) + part


def _vocab_size(model: nn.Module) -> int:
    """The width of the model's logits: its transformers config's vocab_size, else one forward."""
    config = getattr(model, "config", None)
    if uses_kv_cache(model) and isinstance(getattr(config, "vocab_size", None), int):
        return config.vocab_size
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return output_logits(call_model(model, torch.zeros(1, 1, dtype=torch.long, device=model_device(model)))).shape[-1]
    finally:
        model.train(was)


def max_positions(model: nn.Module) -> int | None:
    """A transformers model's longest sequence (config.max_position_embeddings), where it says."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def _check_vocab(model: nn.Module, ids: torch.Tensor) -> None:
    """ValueError if the tokenizer's ids [n] reach beyond the model's vocabulary."""
    vocab = _vocab_size(model)
    if int(ids.max()) >= vocab:
        raise ValueError(f"the tokenizer's ids reach {int(ids.max())}, beyond the model's vocabulary of {vocab}: "
                         "pass the model's own tokenizer")


def _first_tokens(exs: list) -> list[int]:
    """Every example row's first token id: no sampled sequence starts there, so no held-out
    position has the context of an example's position."""
    firsts: set[int] = set()
    for ex in exs:
        ids = token_ids(ex)
        if ids is not None and ids.shape[1] > 0:
            firsts.update(ids[:, 0].tolist())
    return sorted(firsts)


def _like_lm_input(example: Any, ids: torch.Tensor) -> Any:
    """Token ids [B, T] in the example's form: a tensor, a 1-tuple, or a dict with input_ids (and
    an all-ones attention_mask where the example has one)."""
    if isinstance(example, tuple) and len(example) == 1:
        return (ids,)
    if isinstance(example, Mapping):
        out: dict[str, Any] = {"input_ids": ids}
        if "attention_mask" in example:
            out["attention_mask"] = torch.ones_like(ids)
        return out
    return ids


def _leaves(x: Any, path: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(place in the structure, tensor) for every tensor nested in tuples, lists and mappings."""
    if isinstance(x, torch.Tensor):
        yield path, x
    elif isinstance(x, Mapping):
        for k, v in x.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            yield from _leaves(v, (*path, i))


def _drawn(t: torch.Tensor) -> bool:
    """Whether like_examples draws this tensor (a float or integer one of >= 1 dim), else copies it."""
    return t.dim() >= 1 and t.dtype != torch.bool and not t.is_complex()


def _batch(example: Any) -> int:
    """dim 0 of the example's first tensor of at least one dim (ValueError if it has none)."""
    for _, t in _leaves(example):
        if t.dim() >= 1:
            return t.shape[0]
    raise ValueError(f"an example input of type {type(example).__name__} holds no tensor with a batch dim")


def _draw(x: Any, path: tuple, b: int, nb: int, stats: dict[tuple, list[torch.Tensor]], g: torch.Generator) -> Any:
    """`x` with every tensor drawn or copied as like_examples says; batch b -> nb."""
    if isinstance(x, Mapping):
        return {k: _draw(v, (*path, k), b, nb, stats, g) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_draw(v, (*path, i), b, nb, stats, g) for i, v in enumerate(x))
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return x
    shape = (nb, *x.shape[1:]) if x.shape[0] == b else tuple(x.shape)
    if not _drawn(x):
        return x.repeat(math.ceil(nb / b), *[1] * (x.dim() - 1))[:nb] if x.shape[0] == b else x
    pooled = [t for t in stats[path] if (t.shape[-1] if t.dim() >= 2 else 1) == (x.shape[-1] if x.dim() >= 2 else 1)]
    if x.is_floating_point():
        mean, std = _feature_stats(pooled)
        return (torch.randn(shape, generator=g, dtype=torch.float64) * std + mean).to(x.dtype).to(x.device)
    lo, hi = min(int(t.min()) for t in pooled), max(int(t.max()) for t in pooled)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64).to(x.dtype).to(x.device)


def _feature_stats(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean [K], std [K]) of the finite values per feature over every row of `tensors` (float64,
    CPU); a feature with fewer than two finite values takes the std of all finite values."""
    rows = torch.cat([t.detach().double().cpu().reshape(-1, t.shape[-1] if t.dim() >= 2 else 1) for t in tensors])
    ok = torch.isfinite(rows)  # [R, K]
    n = ok.sum(0).clamp_min(1)  # [K]
    vals = torch.where(ok, rows, 0.0)
    mean = vals.sum(0) / n
    var = (torch.where(ok, rows - mean, 0.0) ** 2).sum(0) / (n - 1).clamp_min(1)
    finite = rows[ok]
    overall = finite.std() if finite.numel() >= 2 else torch.tensor(0.0, dtype=torch.float64)
    std = torch.where(ok.sum(0) >= 2, var.sqrt(), overall)
    return mean, std
