"""`autoao search`: find the fastest per-layer plan within an accuracy budget.

    autoao search [--model NAME|module:factory] [--tasks T] [--budget 10m] [--max-accuracy-drop 1%] ...

Every flag is checked before the model is loaded or anything is measured; then the run is
autoao.api.run_stages with the command line's hooks (options.RunHooks): the command it records, the
candidates a built-in model's provenance leaves out, and with --workers N the local `autoao worker`
processes it starts on the published study and stops when the run ends.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import autoao.models
from autoao import workers
from autoao.api import OptimizeResult, run_stages, speed_line
from autoao.cli.args import (DEMO_MODEL, CLIError, checked, load_model, parse_candidates, parse_device, split_list,
                             workload_inputs)
from autoao.common import process_age
from autoao.options import OptionError, Options, RunHooks
from autoao.types import Budget

if TYPE_CHECKING:
    import torch

# optimize's arguments -> the search flags that set them (for errors that name the flag)
FLAGS = {"out_dir": "--out", "storage": "--storage", "candidates": "--candidates", "budget": "--budget",
         "max_accuracy_drop": "--max-accuracy-drop", "accuracy": "--tasks", "seed": "--seed", "target": "--target"}
DEMO_TASKS = "autoao_facts"


def parse_drop(text: str) -> float:
    """"1%" -> 0.01, "0.01" -> 0.01; must land in [0, 1]."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise CLIError(f"bad --max-accuracy-drop {text!r}: expected a fraction like 0.01 or a percentage like 1%") from None
    if not 0.0 <= value <= 1.0:
        raise CLIError(f"bad --max-accuracy-drop {text!r}: must be between 0 and 1 (or 0% and 100%)")
    return value


def provenance_filter(model: str, candidates: list, by_default: bool) -> tuple[list, dict[str, str]]:
    """A built-in model's candidates minus those its provenance misrepresents, when the user named
    none (each said on stderr; --candidates can force them, with a warning); and the left-out
    candidates -> why, for the report."""
    unrep = autoao.models.unrepresentative(model) if model in autoao.models.available() else {}
    named = {c.name for c in candidates} & set(unrep)
    if not by_default:
        for name in sorted(named):
            print(f"autoao: warning: {name} is forced on {model}, whose accuracy on it is misrepresented: "
                  f"{unrep[name]}", file=sys.stderr)
        return candidates, {}
    for name in sorted(named):
        print(f"autoao: leaving out {name}: {unrep[name]} (--candidates can force it)", file=sys.stderr)
    return [c for c in candidates if c.name not in named], {n: unrep[n] for n in sorted(named)}


def check_flags(args: argparse.Namespace) -> None:
    """The flags checked on their own: --resume (a study to continue), --workers, --heartbeat, --generate."""
    if args.resume and not (Path(args.out) / "study.db").is_file() and not args.storage:
        raise CLIError(f"--resume: no study to continue in {args.out}/ (study.db not found)")
    if args.workers < 0:
        raise CLIError(f"bad --workers {args.workers}: expected 0 or more worker processes")
    if args.heartbeat < 1:
        raise CLIError(f"bad --heartbeat {args.heartbeat}: expected whole seconds >= 1")
    if args.generate < 0:
        raise CLIError(f"bad --generate {args.generate}: expected a number of new tokens >= 1, or 0 for none")


def cmd_search(args: argparse.Namespace) -> int:
    """Check every flag, load the model and its inputs, run the stages; print the result."""
    # every argument is checked before the model is loaded or anything is measured
    check_flags(args)
    tasks = args.tasks if args.tasks is not None else (DEMO_TASKS if args.model == DEMO_MODEL else None)
    tasks = None if tasks in ("", "none", "proxy") else tasks
    # none named: the target's search space (Target.candidates), which Options fills in
    candidates = parse_candidates(args.candidates) if args.candidates is not None else None
    opts_device(args)  # a bad --device before anything is said or loaded
    opts = search_options(args, tasks, candidates)
    if args.workers and not opts.shared:
        raise CLIError(f"--workers {args.workers} needs --storage on a database server (e.g. "
                       "postgresql://user@host/db): SQLite serves one process")
    # every argument checked: what is left out is said now
    candidates, left_out = provenance_filter(args.model, list(opts.candidates), args.candidates is None)
    loaded = load_model(args.model, opts_device(args))
    examples, held_out = workload_inputs(args, loaded, opts_device(args))
    # a built-in encoder (or a factory) brings its own metric; --tasks still overrides it
    accuracy = loaded["accuracy"] if args.tasks is None and loaded.get("accuracy") is not None else opts.accuracy
    workload = loaded.get("workload")  # a factory's dict may bring what the model serves; --generate replaces it
    if args.generate:
        try:
            workload = autoao.models.generate_workload(loaded["model"], loaded.get("tokenizer"), args.generate)
        except ValueError as e:
            raise CLIError(f"--generate {args.generate}: {e}") from None
    opts = replace(opts, candidates=tuple(candidates), accuracy=accuracy, tokenizer=loaded.get("tokenizer"),
                   eval_inputs=held_out, screen_positions=args.eval_seqs * args.seq_len, workload=workload)
    started: list = []
    hooks = RunHooks(command="autoao " + " ".join(args.argv), spent=process_age(), left_out=left_out,
                     study_name=args.study, heartbeat=args.heartbeat,
                     on_study=lambda name: started.extend(start_workers(args, opts.storage, name, opts_device(args),
                                                                        opts.out_dir)))
    try:
        result = run_stages(loaded["model"], examples, opts, hooks)
    except ValueError as e:
        stop_workers(started, grace=0.0)
        raise CLIError(str(e)) from None
    except BaseException:  # interrupted or failed: the local workers go too
        stop_workers(started, grace=0.0)
        raise
    stop_workers(started)
    print_result(result, opts)
    return 0


def search_options(args: argparse.Namespace, tasks: str | None, candidates: list | None) -> Options:
    """The search's options from its flags, checked as optimize checks them (the tasks' tokenizer
    comes with the model, loaded after)."""
    try:
        budget = Budget.parse(args.budget)
    except ValueError as e:
        raise CLIError(f"bad --budget: {e}") from None
    drop = parse_drop(args.max_accuracy_drop)
    if tasks:
        from autoao.evaluators import lmeval  # lazy: lm-eval is heavy

        checked("--tasks", lmeval.check_tasks, split_list(tasks))
    try:
        opts = Options.check(budget=budget, accuracy=None, tokenizer=None, max_accuracy_drop=drop,
                             candidates=candidates, eval_inputs=None, storage=args.storage, out_dir=args.out,
                             seed=args.seed, progress=not args.quiet, fuse_groups=not args.no_fuse,
                             allow_emulated=args.allow_emulated, target=args.target)
    except OptionError as e:
        raise CLIError(f"{FLAGS.get(e.argument, e.argument)}: {e}") from None
    return replace(opts, accuracy=tuple(split_list(tasks))) if tasks else opts


def opts_device(args: argparse.Namespace) -> torch.device:
    """--device, parsed once per command."""
    if not hasattr(args, "_device"):
        args._device = parse_device(args.device)
    return args._device


def print_result(result: OptimizeResult, opts: Options) -> None:
    """The plan, its speed, its verdicts and notes, what more time bought, and the files written."""
    s = result.summary
    print(f"plan: {result.plan.summary() or 'unchanged'}")
    print(f"latency: {speed_line(s)}; on {s.device}")
    for v in s.verdicts:
        print(f"accuracy: {v.describe()}")
    for note in s.notes:
        print(f"note: {note}")
    if len(s.curve) > 1:  # when each better plan was verified: what more time bought
        print("verified: " + " -> ".join(f"{p.speedup:.2f}x at {p.seconds:.0f} s" for p in s.curve)
              + f" (the run took {s.seconds:.0f} s)")
    print(f"wrote {opts.out_dir}/plan.json, pareto.json, summary.json, study.db, model/"
          + (f", {result.report_path}" if result.report_path else ""))


def start_workers(args: argparse.Namespace, storage: str, study: str, device: torch.device, out: Path) -> list:
    """--workers N local `autoao worker` processes on the published study (on CUDA, one per GPU
    after the coordinator's, round robin); each logs to OUT/worker-I.log."""
    import subprocess
    import torch

    procs = []
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    base = device.index or 0
    for i in range(args.workers):
        dev = f"cuda:{(base + 1 + i) % gpus}" if gpus > 1 else str(device)
        cmd = [sys.executable, "-m", "autoao.cli", "worker", "--storage", storage, "--study", study,
               "--model", args.model, "--device", dev, "--seq-len", str(args.seq_len),
               "--decode-steps", str(args.decode_steps), "--eval-seqs", str(args.eval_seqs), "--quiet"]
        log = open(out / f"worker-{i}.log", "wb")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    if procs:
        print(f"autoao: started {len(procs)} local workers (logs: {out}/worker-*.log)", file=sys.stderr)
    return procs


def stop_workers(procs: list, grace: float = 60.0) -> None:
    """The local workers end by themselves once the study is closed (after their running trial);
    any still alive after `grace` seconds is killed."""
    import subprocess

    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the `search` subcommand to the CLI's subparsers (func: cmd_search)."""
    s = sub.add_parser("search", help="find the fastest per-layer plan within an accuracy budget",
                       description="Profile the model, time every candidate on its layer shapes, measure "
                       "accuracy, and search per-layer plans with Optuna. With no arguments: the built-in "
                       "demo model (SmolLM2-135M) against lm-eval task autoao_facts, 1% drop, 5 minutes.")
    s.add_argument("--model", default=DEMO_MODEL, help="built-in model name or module:factory (a .py path or "
                   "importable module; the factory returns a model, (model, tokenizer) or a dict with model, "
                   "tokenizer, example_inputs, eval_inputs, accuracy (a callable(model) -> float); all moved to --device). "
                   "Built-in: smollm2-135m (causal LM, lm-eval autoao_facts) and minilm-l6 (sentence embeddings, "
                   "its autoao_pairs task). Default: %(default)s")
    s.add_argument("--tasks", default=None, help="comma-separated lm-eval tasks for the accuracy budget (tier 2); "
                   "'none' uses the tier-1 proxy only. Default: autoao_facts for the demo model, the model's own "
                   "task for minilm-l6 (autoao_pairs) or a factory's 'accuracy', else none")
    s.add_argument("--budget", default="5m", help="wall time (90s, 10m, 1h) or a number of trials (200); "
                   "default %(default)s")
    s.add_argument("--max-accuracy-drop", default="1%", help="allowed accuracy drop: 0.01 or 1%% (default %(default)s)")
    s.add_argument("--candidates", default=None, help="comma-separated candidate names (default: all, less those "
                   "a built-in model's provenance misrepresents, e.g. int4 group 32 on smollm2-135m, whose weights "
                   "were a GGUF Q4_1 grid; naming them here forces them)")
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    s.add_argument("--target", default="autoao", help="the engine the plan is made for: autoao (its own modules), "
                   "vllm, sglang or transformers (compressed-tensors: the search holds only what the engine loads, "
                   "and layers it fuses share one scheme), or llama.cpp (GGUF types, their speed-up estimated from "
                   "weight bytes); `autoao export` writes the checkpoint. Default %(default)s")
    add_study_flags(s)
    s.add_argument("--seq-len", type=int, default=256, help="tokens per calibration (prefill) / proxy sequence for "
                   "built-in models (default %(default)s)")
    s.add_argument("--decode-steps", type=int, default=32, help="one-token forward passes added to the timed "
                   "workload of built-in models, after the prefill (default %(default)s): decode is where "
                   "weight-only kernels win")
    s.add_argument("--eval-seqs", type=int, default=2, help="held-out sequences for the tier-1 proxy (default %(default)s)")
    s.add_argument("--generate", type=int, default=0, metavar="N", help="also time what users run: greedy generate() of "
                   "N tokens after a 32-token prompt, alternating with the model as it came; the plan ships only if "
                   "faster there too (causal LMs; default: off)")
    s.add_argument("--allow-emulated", action="store_true", help="time candidates only emulated here and let the search pick them (off: they are not timed)")
    s.add_argument("--no-fuse", action="store_true",
                   help="sibling layers (same input: q/k/v, gate/up) choose independently and never run as one fused kernel")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_search)


def add_study_flags(s: argparse.ArgumentParser) -> None:
    """The search's flags for its Optuna study: where it is stored, its name, the worker processes
    that share it, its seed, the output directory and --resume."""
    s.add_argument("--storage", default=None, help="Optuna storage URL, e.g. postgresql://... "
                   "(default: SQLite in the output directory)")
    s.add_argument("--study", default=None, help="the study's name in --storage (default: derived from the model, "
                   "the search space and the accuracy budget)")
    s.add_argument("--workers", type=int, default=0, help="local `autoao worker` processes to start on the study "
                   "(needs --storage on a database server; default %(default)s: workers are started by hand)")
    s.add_argument("--heartbeat", type=int, default=workers.DEFAULT_HEARTBEAT, help="with a database server: "
                   "seconds between a running trial's heartbeats; a trial silent for 3x this is failed and retried "
                   "once (default %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="sampler seed (default %(default)s)")
    s.add_argument("--out", default="autoao-report", help="output directory (default %(default)s)")
    s.add_argument("--resume", action="store_true", help="continue the study in --out (fails if there is none); "
                   "re-running with the same --out continues it anyway")
