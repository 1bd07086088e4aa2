"""Command-line flags generated from the Plan's knob declarations."""

from __future__ import annotations

import argparse
from typing import Any

from trainwise.plan import Plan, plan_from_sources


def add_knob_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per knob. Defaults are suppressed so only flags the user typed override
    the plan file; validation happens once, in Plan.from_dict."""
    group = parser.add_argument_group("plan knobs (override --plan FILE)")
    group.add_argument("--plan", metavar="FILE", default=None, help="YAML or JSON file of knob values")
    for spec in Plan.specs():
        default_text = f" (default: {spec.default})" if spec.default is not None else ""
        if spec.kind is bool:
            group.add_argument(spec.flag, dest=spec.name, action="store_const", const=True,
                               default=argparse.SUPPRESS, help=spec.help + default_text)
        else:
            metavar = "{" + ",".join(spec.choices) + "}" if spec.choices else spec.kind.__name__.upper()
            group.add_argument(spec.flag, dest=spec.name, metavar=metavar, default=argparse.SUPPRESS,
                               help=spec.help + default_text)


def plan_from_args(args: argparse.Namespace) -> Plan:
    names = {spec.name for spec in Plan.specs()}
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k in names}
    return plan_from_sources(args.plan, overrides)
