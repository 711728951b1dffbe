"""lm-eval's view of a model in memory (evaluators.lmeval runs the tasks): `wrap` hands a
transformers `PreTrainedModel` to lm-eval's own HFLM and any other causal LM to `CausalLM`, which
tokenizes and windows exactly as HFLM does, log-softmax in float32; `PerDocument` gives each
document's requests a forward of their own.

Importing this module imports `lm_eval.api.model` (and with it jinja2): modules on the
`import autoao` path import it inside functions.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM, TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn

from autoao.common import model_device

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

DEFAULT_MAX_LENGTH = 2048  # context for models with no config to read it from (lm-eval's default too)


def wrap(model: nn.Module, tokenizer: Any, *, batch_size: int, device: torch.device | str | None,
          max_length: int | None) -> LM:
    # A model can only be a PreTrainedModel if transformers is already imported; checking
    # sys.modules keeps the generic path from importing transformers for nothing.
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        if device is not None and torch.device(device) != model.device:
            raise ValueError(f"device={device!r} but the model is on {model.device}; move the model "
                             "first (evaluate never moves or copies it), or leave device=None.")
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
                    softmax_dtype=torch.float32)
    return CausalLM(model, tokenizer, batch_size=batch_size, device=device,
                    max_length=max_length or DEFAULT_MAX_LENGTH)


class PerDocument(LM):
    """An lm-eval `LM` that hands the wrapped one each document's log-likelihood requests (a
    multiple-choice question's choices) as one batch of their own; everything else is the wrapped
    LM's. HFLM reads its batch size from `batch_size_per_gpu`, CausalLM from `batch_size`."""

    def __init__(self, lm: LM) -> None:
        super().__init__()
        self.lm = lm

    def __getattr__(self, name: str) -> Any:  # only reached for what PerDocument does not define
        if "lm" not in self.__dict__:  # during __init__: nothing to delegate to yet
            raise AttributeError(name)
        return getattr(self.__dict__["lm"], name)

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        docs: dict[tuple[str, int], list[int]] = {}
        for i, req in enumerate(requests):
            docs.setdefault((req.task_name, req.doc_id), []).append(i)
        size_attr = "batch_size_per_gpu" if hasattr(self.lm, "batch_size_per_gpu") else "batch_size"
        results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for members in docs.values():
            setattr(self.lm, size_attr, len(members))
            for i, res in zip(members, self.lm.loglikelihood([requests[i] for i in members], disable_tqdm=True)):
                results[i] = res
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        return self.lm.loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        return self.lm.generate_until(requests, disable_tqdm=disable_tqdm)


class CausalLM(TemplateLM):
    """lm-eval `LM` over any causal LM module: input_ids [B, T] -> logits [B, T, V] (or `.logits`).

    Tokenization, the empty-context prefix token and the rolling windows are HFLM's (inherited from
    `TemplateLM`, or mirrored below), so scores match HFLM's on a transformers model. Batches are
    right-padded: in a causal model no real position attends to the padding after it, so no
    attention mask is needed and any token id can pad. Generation is greedy, without a KV cache
    (each new token runs the whole prefix again): slow on long outputs, but it needs nothing from the
    model beyond its forward.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, *, batch_size: int = 8,
                 device: torch.device | str | None = None, max_length: int = DEFAULT_MAX_LENGTH,
                 max_gen_toks: int = 256) -> None:
        super().__init__()
        if tokenizer is None or getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError("CausalLM needs a Hugging Face-style tokenizer with an eos_token_id (lm-eval "
                             f"ends generations and pads with it); got {type(tokenizer).__qualname__}.")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.max_gen_toks = max_gen_toks
        self._device = torch.device(device) if device is not None else model_device(model)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        # What an empty context is scored after; HFLM's choice (BOS, else EOS), so the scores agree.
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        if add_special_tokens is None:
            # HFLM: a string that already starts with the BOS text gets no second BOS
            bos_text = self.tokenizer.decode([self.prefix_token_id])
            if bos_text and string.startswith(bos_text):
                add_special_tokens = False
        special = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        return self.tokenizer.encode(string, **special)

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [B, T] -> [B, T, V] float32
        with torch.no_grad():
            out = self.model(input_ids.to(self._device))
        logits = getattr(out, "logits", out)
        if not isinstance(logits, torch.Tensor) or logits.shape[:2] != input_ids.shape:
            raise ValueError(f"the model must map input_ids {tuple(input_ids.shape)} to logits [B, T, V] "
                             f"(or an object with .logits); it returned {type(out).__qualname__} "
                             f"{tuple(getattr(logits, 'shape', ()))}")
        return logits.float()

    # ---- scoring ---------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """(key, context tokens, continuation tokens) -> (sum of continuation log-probs, is greedy)."""
        # Longest first, as HFLM does: rows in a batch have similar lengths, so less padding.
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            inputs = []
            for i in batch:
                _, context, continuation = requests[i]
                if not context or not continuation or len(continuation) > self.max_length:
                    raise ValueError(f"request {i}: needs a non-empty context and a continuation of 1.."
                                     f"{self.max_length} tokens, got {len(context)} and {len(continuation)}")
                # Position t predicts token t+1, so the last token is never an input; keep at most
                # max_length inputs, dropping context from the left.
                inputs.append((context + continuation)[-(self.max_length + 1):-1])
            width = max(len(x) for x in inputs)
            input_ids = torch.zeros(len(inputs), width, dtype=torch.long)  # [B, T], right-padded with 0
            for row, x in enumerate(inputs):
                input_ids[row, :len(x)] = torch.tensor(x)
            logprobs = F.log_softmax(self._logits(input_ids), dim=-1)  # [B, T, V]
            for row, i in enumerate(batch):
                continuation = torch.tensor(requests[i][2], device=logprobs.device)
                end = len(inputs[row])
                lp = logprobs[row, end - len(continuation):end]  # [len(cont), V]
                score = lp.gather(-1, continuation[:, None]).sum().item()
                results[i] = (score, bool((lp.argmax(-1) == continuation).all()))
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole string, in disjoint windows of max_length (HFLM's windows)."""
        windows, owner = [], []
        for n, req in enumerate(requests):
            (text,) = req.args
            pairs = get_rolling_token_windows(token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                                              max_seq_len=self.max_length, context_len=1)
            for context, continuation in map(make_disjoint_window, pairs):
                windows.append((None, context, continuation))
                owner.append(n)
        totals = [0.0] * len(requests)
        for n, (score, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[n] += score
        return totals

    # ---- generation ------------------------------------------------------------------------
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each context, cut at the first `until` string (or EOS) and
        after `max_gen_toks` tokens."""
        results: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}  # same generation settings -> one batch stream
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        for members in groups.values():
            kwargs = dict(requests[members[0]].args[1])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            until.append(self.tokenizer.decode([self.eot_token_id]))
            max_gen = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
                raise ValueError(f"CausalLM generates greedily only; the task asked for sampling ({kwargs}). "
                                 "Use a transformers model (scored through lm-eval's HFLM) for sampling tasks.")
            if max_gen >= self.max_length:
                raise ValueError(f"max_gen_toks={max_gen} leaves no room for context in max_length={self.max_length}")
            for start in range(0, len(members), self.batch_size):
                batch = members[start:start + self.batch_size]
                contexts = [self.tok_encode(requests[i].args[0])[-(self.max_length - max_gen):] for i in batch]
                for i, text in zip(batch, self._greedy(contexts, max_gen, until)):
                    results[i] = text
        return results

    def _greedy(self, contexts: list[list[int]], max_gen: int, until: list[str]) -> list[str]:
        lengths = torch.tensor([len(c) for c in contexts])  # [B] tokens so far per row
        buf = torch.zeros(len(contexts), int(lengths.max()) + max_gen, dtype=torch.long)  # right-padded
        for row, c in enumerate(contexts):
            buf[row, :len(c)] = torch.tensor(c)
        texts = [""] * len(contexts)
        active = list(range(len(contexts)))
        for _ in range(max_gen):
            rows = torch.tensor(active)
            logits = self._logits(buf[rows, :int(lengths[rows].max())])  # [b, T, V]
            # Each row's next token comes from its own last real position; padding is to its right.
            nxt = logits[torch.arange(len(active)), lengths[rows] - 1].argmax(-1).cpu()  # [b]
            buf[rows, lengths[rows]] = nxt
            lengths[rows] += 1
            still = []
            for row in active:
                texts[row] = self.tokenizer.decode(buf[row, len(contexts[row]):int(lengths[row])].tolist())
                if not any(stop in texts[row] for stop in until):
                    still.append(row)
            active = still
            if not active:
                break
        return [_cut(t, until) for t in texts]


def _cut(text: str, until: list[str]) -> str:
    """text up to the first occurrence of any stop string."""
    for stop in until:
        if stop:
            text = text.split(stop, 1)[0]
    return text
