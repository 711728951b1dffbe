"""`autoao apply`: apply a plan.json to a model and save it.

    autoao apply --model ... --plan plan.json --save DIR

The plan is validated against the model first (autoao.plan.apply: every mismatched layer listed,
nothing changed on failure); a plan with calibrated candidates is calibrated on the model's
tokenizer's bundled text.
"""

from __future__ import annotations

import argparse

import autoao.models
from autoao.cli.args import DEMO_MODEL, CLIError, load_model, parse_device
from autoao.plan import Plan, PlanError, apply, save
from autoao.profile import profile


def cmd_apply(args: argparse.Namespace) -> int:
    """Load the model and the plan, apply it, save plan + weights to --save."""
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the `apply` subcommand to the CLI's subparsers (func: cmd_apply)."""
    a = sub.add_parser("apply", help="apply a plan.json to a model and save it",
                       description="Apply a saved plan to a model (validated first: every mismatched layer is "
                       "listed) and save plan + quantized weights with autoao.save.")
    a.add_argument("--model", default=DEMO_MODEL, help="built-in model name or module:factory (as for search)")
    a.add_argument("--plan", required=True, help="the plan.json to apply")
    a.add_argument("--save", required=True, help="output directory (plan.json + model.safetensors)")
    a.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    a.set_defaults(func=cmd_apply)
