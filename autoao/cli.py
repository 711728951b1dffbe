"""The `autoao` command line. Argument parsing and printing only: the work lives in the library.

    autoao search [--model NAME|module:factory] [--tasks T] [--budget 10m] [--max-accuracy-drop 1%] ...
    autoao apply --model ... --plan plan.json --save DIR
    autoao kernels --shapes 4096x4096,14336x4096 --tokens 1,128,2048 [--device cuda]
    autoao export RUN_DIR --format compressed-tensors|gguf --out DIR
    autoao worker --storage postgresql://... --study NAME [--model ...] [--device cuda:1]

Bad input prints one line `autoao: error: ...` and exits with status 2 (no traceback).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import autoao.models
from autoao import search_space, workers
from autoao.api import _run, speed_line
from autoao.common import BASELINE, process_age
from autoao.evaluators.cache import TimingCache, cache_dir
from autoao.evaluators.kernel_table import format_kernel_table, write_kernel_csv
from autoao.evaluators.timing import measure_latencies
from autoao.export import command as export_command
from autoao.ledger import Interrupted
from autoao.options import OptionError, Options, RunHooks, check_storage
from autoao.plan import Plan, PlanError, apply, save
from autoao.profile import profile
from autoao.types import Budget


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


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"4096x4096,14336x4096" -> [(N, K), ...] (weight shapes, out x in)."""
    shapes = []
    for item in split_list(text):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise CLIError(f"bad --shapes entry {item!r}: expected NxK (out_features x in_features), "
                           "e.g. 4096x4096 or 14336x4096")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in split_list(text)]
    except ValueError:
        raise CLIError(f"bad {flag} {text!r}: expected comma-separated positive integers, e.g. 1,128,2048") from None
    if not values or min(values) < 1:
        raise CLIError(f"bad {flag} {text!r}: expected comma-separated positive integers, e.g. 1,128,2048")
    return values


def parse_candidates(text: str | None):

    if text is None:
        return search_space.all_candidates()
    try:
        return [search_space.get(name) for name in split_list(text)]
    except ValueError as e:
        raise CLIError(str(e).replace("\n", " ")) from None


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


def parse_device(text: str | None):
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


DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


##### autoao kernels ############################################################################

def cmd_kernels(args: argparse.Namespace) -> int:
    import torch


    shapes = parse_shapes(args.shapes)
    tokens = parse_ints(args.tokens, "--tokens")
    candidates = parse_candidates(args.candidates)
    device = parse_device(args.device)
    if args.dtype not in DTYPES:
        raise CLIError(f"bad --dtype {args.dtype!r}: choose from {', '.join(DTYPES)}")
    dtype = getattr(torch, DTYPES[args.dtype])
    if not any(c.family == BASELINE for c in candidates):
    
        candidates = [search_space.get("bf16"), *candidates]  # the speed-up needs the baseline
    try:
        cache = TimingCache(cache_dir(args.cache_dir) / "timings.sqlite")
        table = measure_latencies(shapes, tokens, candidates, device=device, dtype=dtype, mode=args.mode,
                                  cache=cache, progress=not args.quiet)
    except ValueError as e:
        raise CLIError(str(e)) from None
    print(format_kernel_table(table, shapes, tokens, candidates, all_kernels=args.all_kernels))
    # measured counts every kernel timed (several per row for multi-kernel candidates); a row is
    # cached when none of its kernels had to be timed
    print(f"\n{table.measured} kernel timings measured, {sum(r.cached for r in table.rows)} of "
          f"{len(table.rows)} results from the cache ({cache.path}), {table.seconds:.1f} s.")
    if args.csv:
        write_kernel_csv(table, args.csv, all_kernels=args.all_kernels)
        print(f"wrote {args.csv}")
    return 0


##### autoao search / apply #####################################################################

# optimize's arguments -> the search flags that set them (for errors that name the flag)
FLAGS = {"out_dir": "--out", "storage": "--storage", "candidates": "--candidates", "budget": "--budget",
         "max_accuracy_drop": "--max-accuracy-drop", "accuracy": "--tasks", "seed": "--seed", "target": "--target"}
DEMO_MODEL = "smollm2-135m"
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


def load_model(spec: str, device):
    """autoao.models.load_spec, its ValueError as a one-line CLI error; a built-in model's
    one-off conversion is announced first (it is most of a first run's silent start)."""
    try:
        once = autoao.models.first_load(spec) if spec in autoao.models.available() else None
        if once:
            print(f"autoao: {once}", file=sys.stderr)
        return autoao.models.load_spec(spec, device)
    except (ImportError, ValueError) as e:
        raise CLIError(str(e).replace("\n", " ")) from None


def checked(flag: str, check: Any, value: Any) -> None:
    """check(value), its ValueError as this flag's one-line error."""
    try:
        check(value)
    except ValueError as e:
        raise CLIError(f"{flag}: {e}") from None


def cmd_search(args: argparse.Namespace) -> int:
    # every argument is checked before the model is loaded or anything is measured
    if args.resume and not (Path(args.out) / "study.db").is_file() and not args.storage:
        raise CLIError(f"--resume: no study to continue in {args.out}/ (study.db not found)")
    if args.workers < 0:
        raise CLIError(f"bad --workers {args.workers}: expected 0 or more worker processes")
    if args.heartbeat < 1:
        raise CLIError(f"bad --heartbeat {args.heartbeat}: expected whole seconds >= 1")
    if args.generate < 0:
        raise CLIError(f"bad --generate {args.generate}: expected a number of new tokens >= 1, or 0 for none")
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
        result = _run(loaded["model"], examples, opts, hooks)
    except ValueError as e:
        stop_workers(started, grace=0.0)
        raise CLIError(str(e)) from None
    except BaseException:  # interrupted or failed: the local workers go too
        stop_workers(started, grace=0.0)
        raise
    stop_workers(started)
    print_result(result, opts)
    return 0


def search_options(args: argparse.Namespace, tasks: str | None, candidates: list) -> Options:
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


def opts_device(args: argparse.Namespace):
    """--device, parsed once per command."""
    if not hasattr(args, "_device"):
        args._device = parse_device(args.device)
    return args._device


def print_result(result, opts: Options) -> None:
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


def workload_inputs(args: argparse.Namespace, loaded: dict, device) -> tuple[Any, Any]:
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


def start_workers(args: argparse.Namespace, storage: str, study: str, device, out) -> list:
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


def parse_seconds(text: str, flag: str) -> float:
    """"0", "30", "30s", "10m" -> seconds."""
    t = text.strip()
    try:
        return float(t) if t.replace(".", "", 1).isdigit() else float(Budget.parse(t).seconds or "x")
    except ValueError:
        raise CLIError(f"bad {flag} {text!r}: expected seconds (30) or a time (90s, 10m)") from None


def cmd_worker(args: argparse.Namespace) -> int:
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


def cmd_apply(args: argparse.Namespace) -> int:

    device = parse_device(args.device)
    loaded = load_model(args.model, device)
    model = loaded["model"]
    try:
        plan = Plan.load(args.plan)
        calibration = None
        if any(c.calibration_uses for c in plan.layers.values()) and loaded.get("tokenizer"):
        
            calib = [t.to(device) for t in autoao.models.text_inputs(loaded["tokenizer"], seq_len=256)]
            calibration = profile(model, calib).calibration
        apply(model, plan, calibration=calibration)
        save(model, args.save)
    except PlanError as e:
        raise CLIError(str(e).replace("\n", " ")) from None
    print(f"applied {len(plan.layers)} layers ({plan.summary()}); saved to {args.save}/ (plan.json, model.safetensors)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autoao.reports import ReportError, render  # lazy: jinja2 and matplotlib are heavy

    try:
        path = render(args.dir, args.out)
    except ReportError as e:
        raise CLIError(str(e)) from None
    print(f"wrote {path} (tables: {path.stem}_*.csv beside it)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """autoao.export.command.run, its ValueError as a one-line CLI error."""
    try:
        return export_command.run(args)
    except ValueError as e:
        raise CLIError(str(e).replace("\n", " ")) from None


def cmd_cache(args: argparse.Namespace) -> int:
    import datetime

    path = cache_dir(args.cache_dir) / "timings.sqlite"
    if not path.is_file():
        print(f"no timing cache at {path}")
        return 0
    cache = TimingCache(path)
    if args.action == "clear":
        n = cache.clear(args.device)
        which = f" of devices matching {args.device!r}" if args.device else ""
        print(f"cleared {n} cached timings{which} from {path} (layer errors and accuracy results kept)")
        return 0
    devices = cache.devices()
    print(f"{path}: {len(cache)} cached timings")
    for d in devices:
        if args.device and args.device.lower() not in d.name.lower():
            continue
        newest = datetime.datetime.fromtimestamp(d.newest).isoformat(sep=" ", timespec="seconds")
        print(f"  {d.name}: {d.cells} cells, {d.unreliable} unreliable (measured while the CPU was taken; "
              f"re-measured on next use), {d.failed} failed, {d.discarded_samples} disturbed samples dropped; "
              f"newest {newest}")
    return 0


##### entry point ###############################################################################

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoao", description="Accuracy-aware per-layer quantization "
                                "and 2:4 sparsity search for PyTorch.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    k = sub.add_parser("kernels", help="what each candidate costs on this device, per layer shape",
                       description="Time every candidate kernel on the given layer shapes and token "
                       "counts; print median time, speed-up vs bf16, and why a candidate is unsupported "
                       "or only emulated here. Timings are cached on disk.")
    k.add_argument("--shapes", default="4096x4096,14336x4096",
                   help="comma-separated weight shapes NxK (out x in features), default %(default)s")
    k.add_argument("--tokens", default="1,128,2048",
                   help="comma-separated token counts M (rows of the activation), default %(default)s")
    k.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available, else cpu)")
    k.add_argument("--dtype", default="bf16", help="activation/weight dtype of the layers: bf16, fp16 or fp32")
    k.add_argument("--candidates", default=None,
                   help="comma-separated candidate names, e.g. 'int8_dyn,int4_wo(group_size=64)' (default: all)")
    k.add_argument("--mode", default=None, choices=["eager", "graph", "compile"],
                   help="how kernels run while timed: compile = torch.compile(fullgraph) replayed in a "
                        "CUDA graph (CUDA default: how a plan runs; a layer whose forward is one kernel, "
                        "e.g. a GEMV, runs uncompiled), graph = eager modules in a CUDA graph, eager (CPU "
                        "default)")
    k.add_argument("--cache-dir", default=None, help="timing cache directory (default: $AUTOAO_CACHE_DIR "
                   "or ~/.cache/autoao)")
    k.add_argument("--csv", default=None, help="also write every timing to this CSV file")
    k.add_argument("--all-kernels", action="store_true",
                   help="for candidates with several kernels on the device, show (and write to --csv) every kernel "
                        "timed, not only the one timing chose")
    k.add_argument("--quiet", action="store_true", help="no progress bar")
    k.set_defaults(func=cmd_kernels)

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

    a = sub.add_parser("apply", help="apply a plan.json to a model and save it",
                       description="Apply a saved plan to a model (validated first: every mismatched layer is "
                       "listed) and save plan + quantized weights with autoao.save.")
    a.add_argument("--model", default=DEMO_MODEL, help="built-in model name or module:factory (as for search)")
    a.add_argument("--plan", required=True, help="the plan.json to apply")
    a.add_argument("--save", required=True, help="output directory (plan.json + model.safetensors)")
    a.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    a.set_defaults(func=cmd_apply)

    r = sub.add_parser("report", help="re-render the HTML report of a search directory",
                       description="Render report.html (and its tables as CSV beside it) from a search's "
                       "output directory, finished, interrupted or still running. Reads context.json, the "
                       "Optuna study and summary.json; runs nothing.")
    r.add_argument("dir", help="the search's output directory (--out of autoao search)")
    r.add_argument("--out", default=None, help="HTML file to write (default: DIR/report.html)")
    r.set_defaults(func=cmd_report)

    c = sub.add_parser("cache", help="what the timing cache holds, or clear it",
                       description="The on-disk timing cache ($AUTOAO_CACHE_DIR/timings.sqlite, default "
                       "~/.cache/autoao): `info` lists cached timings per device (with how many were measured "
                       "on a busy machine), `clear` deletes them so the next run measures again.")
    c.add_argument("action", choices=["info", "clear"], help="info: what is cached; clear: delete timings")
    c.add_argument("--device", default=None, help="only the devices whose name contains this text, "
                   "e.g. 'NVIDIA' or 'AMD' (default: all)")
    c.add_argument("--cache-dir", default=None, help="cache directory (default: $AUTOAO_CACHE_DIR or "
                   "~/.cache/autoao)")
    c.set_defaults(func=cmd_cache)
    export_command.add_parser(sub).set_defaults(func=cmd_export)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CLIError as e:
        print(f"autoao: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # a run stopped by SIGINT / SIGTERM: it wrote its best verified plan
        print(f"autoao: interrupted by {e.name}: kept {e.kept or 'nothing (stopped before any plan could be judged)'}",
              file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("autoao: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
