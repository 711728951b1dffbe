"""What several subcommands share: CLIError, and their common flags (--candidates, --device,
--model with --seq-len and --decode-steps) turned into checked values.

Every function here raises CLIError, never a traceback, for bad input: `autoao.cli.main` prints
it as one `autoao: error: ...` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import autoao.models
from autoao import search_space

if TYPE_CHECKING:
    import torch

DEMO_MODEL = "smollm2-135m"  # --model's default in search, worker and apply


class CLIError(Exception):
    """A user-input error: printed as one line, exit status 2."""


def split_list(text: str) -> list[str]:
    """Split on commas that are not inside parentheses: "a,int4_wo(group_size=64),b"."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    return [i for i in items if i]


def parse_candidates(text: str | None) -> list:
    """--candidates -> the registry's candidates (None: all of them); an unknown name is a
    CLIError that lists the alternatives."""
    if text is None:
        return search_space.all_candidates()
    try:
        return [search_space.get(name) for name in split_list(text)]
    except ValueError as e:
        raise CLIError(str(e).replace("\n", " ")) from None


def parse_device(text: str | None) -> torch.device:
    """--device -> a torch.device of type cpu or cuda (None: cuda if torch sees a GPU, else cpu)."""
    import torch

    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise CLIError(f"bad --device {text!r}: expected cpu or cuda (or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda given but no CUDA GPU is visible to torch")
    if device.type not in ("cpu", "cuda"):
        raise CLIError(f"bad --device {text!r}: autoao has kernels for cpu and cuda")
    return device


def checked(flag: str, check: Any, value: Any) -> None:
    """check(value), its ValueError as this flag's one-line error."""
    try:
        check(value)
    except ValueError as e:
        raise CLIError(f"{flag}: {e}") from None


def load_model(spec: str, device: torch.device | str) -> dict:
    """autoao.models.load_spec, its ValueError as a one-line CLI error; a built-in model's
    one-off conversion is announced first (it is most of a first run's silent start)."""
    try:
        once = autoao.models.first_load(spec) if spec in autoao.models.available() else None
        if once:
            print(f"autoao: {once}", file=sys.stderr)
        return autoao.models.load_spec(spec, device)
    except (ImportError, ValueError) as e:
        raise CLIError(str(e).replace("\n", " ")) from None


def workload_inputs(args: argparse.Namespace, loaded: dict, device: torch.device) -> tuple[Any, Any]:
    """The factory's example and held-out inputs, or for a model with a tokenizer only: one
    prefill of --seq-len tokens then --decode-steps one-token steps (the same in the coordinator
    and its workers); its held-out inputs are then the tokenizer's bundled text, which the
    workload cuts (--eval-seqs x --seq-len positions for the screen, more for verdicts)."""
    examples, held_out = loaded.get("example_inputs"), loaded.get("eval_inputs")
    if examples is None:
        tok = loaded.get("tokenizer")
        if tok is None:
            raise CLIError(f"--model {args.model}: no tokenizer and no example_inputs; return a dict with "
                           "'example_inputs' from the factory")
        prefill = autoao.models.text_inputs(tok, seq_len=args.seq_len, n_seqs=1)[0].to(device)
        examples = [prefill] + [prefill[:, i:i + 1] for i in range(args.decode_steps)]
    return examples, held_out
