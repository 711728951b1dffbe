"""`autoao report`, `autoao cache` and `autoao export`: the small subcommands that read what
others wrote, running no search.

    autoao report DIR [--out report.html]
    autoao cache info|clear [--device TEXT]
    autoao export RUN_DIR --format compressed-tensors|gguf --out DIR

report renders a search directory (autoao.reports.render), cache lists or clears the timing cache
(evaluators/cache.py), export writes a serving checkpoint (autoao.export.command: its parser and run).
"""

from __future__ import annotations

import argparse

from autoao.cli.args import CLIError
from autoao.evaluators.cache import TimingCache, cache_dir
from autoao.export import command as export_command


def cmd_report(args: argparse.Namespace) -> int:
    """Render DIR's report.html (and its CSV tables); print where."""
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
    """info: the cached timings per device (those matching --device); clear: delete them."""
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the `report`, `cache` and `export` subcommands to the CLI's subparsers, in that order
    (funcs: cmd_report, cmd_cache, cmd_export)."""
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
