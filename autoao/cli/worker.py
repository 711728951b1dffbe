"""`autoao worker`: run trials of a study that `autoao search --storage` published.

    autoao worker --storage postgresql://... --study NAME [--model ...] [--device cuda:1]

Everything about the study is checked before the model is loaded; the trials are
autoao.workers.run_worker's, on this process's model and device.
"""

from __future__ import annotations

import argparse

from autoao import workers
from autoao.cli.args import DEMO_MODEL, CLIError, checked, load_model, parse_device, workload_inputs
from autoao.options import check_storage
from autoao.types import Budget


def parse_seconds(text: str, flag: str) -> float:
    """"0", "30", "30s", "10m" -> seconds."""
    t = text.strip()
    try:
        return float(t) if t.replace(".", "", 1).isdigit() else float(Budget.parse(t).seconds or "x")
    except ValueError:
        raise CLIError(f"bad {flag} {text!r}: expected seconds (30) or a time (90s, 10m)") from None


def cmd_worker(args: argparse.Namespace) -> int:
    """Join the study, load the model, run trials until the study's (or --budget's) end; print how many."""
    # everything about the study is checked before the model is loaded
    budget = None
    if args.budget is not None:
        try:
            budget = Budget.parse(args.budget)
        except ValueError as e:
            raise CLIError(f"bad --budget: {e}") from None
    wait = parse_seconds(args.wait, "--wait")
    device = parse_device(args.device)
    storage = workers.driver_url(args.storage)
    if not workers.is_server(storage):
        raise CLIError(f"--storage {args.storage!r} is SQLite, which serves one process: workers share a study on a "
                       "database server (e.g. postgresql://user@host/db) that `autoao search --storage` published")
    checked("--storage", check_storage, storage)
    try:
        shared = workers.join(storage, args.study, wait)
    except ValueError as e:
        raise CLIError(f"--study: {e}") from None
    loaded = load_model(args.model, device)
    examples, held_out = workload_inputs(args, loaded, device)
    try:
        outcome = workers.run_worker(loaded["model"], examples, held_out, shared, storage=storage,
                                     study_name=args.study, tokenizer=loaded.get("tokenizer"), budget=budget,
                                     progress=not args.quiet)
    except ValueError as e:
        raise CLIError(f"--model {args.model}: {e}") from None
    done = sum(r.state == "COMPLETE" for r in outcome.trials if r.worker == workers.label("worker"))
    print(f"{workers.label('worker')}: {done} trials of study {args.study} finished here; {outcome.stopped_because}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the `worker` subcommand to the CLI's subparsers (func: cmd_worker)."""
    w = sub.add_parser("worker", help="run trials of a study that `autoao search --storage` published",
                       description="Join a study on a database server and run its trials (each scored on this "
                       "process's model and device) until the study's budget is spent. The coordinator "
                       "(`autoao search --storage postgresql://...`) measures, publishes and makes the final "
                       "choice; the worker needs the same --model (importable here) and candidates.")
    w.add_argument("--storage", required=True, help="the study's database URL, e.g. postgresql://user@host/db")
    w.add_argument("--study", required=True, help="the study's name (the coordinator prints it)")
    w.add_argument("--model", default=DEMO_MODEL, help="the coordinator's --model (default %(default)s)")
    w.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available); the device "
                   "type must be the coordinator's")
    w.add_argument("--budget", default=None, help="this worker's own limit, a time (10m) or a number of trials "
                   "(default: none; it stops when the study's budget is spent)")
    w.add_argument("--wait", default="0", help="seconds (or 10m) to wait for the study to be published "
                   "(default %(default)s)")
    w.add_argument("--seq-len", type=int, default=256, help="as for search, for built-in models")
    w.add_argument("--decode-steps", type=int, default=32, help="as for search, for built-in models")
    w.add_argument("--eval-seqs", type=int, default=2, help="as for search, for built-in models")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.set_defaults(func=cmd_worker)
