"""Command-line flags generated from knob declarations (the Plan's, and the RunConfig's)."""

from __future__ import annotations

import argparse
from typing import Any, Iterable

from trainwise.plan import KnobSpec, Plan, plan_from_sources


def add_knob_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Plan knob, plus --plan FILE. Defaults are suppressed so only flags the
    user typed override the plan file; validation happens once, in Plan.from_dict."""
    group = parser.add_argument_group("plan knobs (override --plan FILE)")
    group.add_argument("--plan", metavar="FILE", default=None, help="YAML or JSON file of knob values")
    add_spec_flags(group, Plan.specs())


def add_spec_flags(group, specs: Iterable[KnobSpec]) -> None:
    """One flag per declared setting; values stay strings until the owner class validates them."""
    for spec in specs:
        default_text = f" (default: {spec.default})" if spec.default is not None else ""
        if spec.kind is bool:
            group.add_argument(spec.flag, dest=spec.name, action="store_const", const=True,
                               default=argparse.SUPPRESS, help=spec.help + default_text)
        else:
            metavar = "{" + ",".join(spec.choices) + "}" if spec.choices else spec.kind.__name__.upper()
            group.add_argument(spec.flag, dest=spec.name, metavar=metavar, default=argparse.SUPPRESS,
                               help=spec.help + default_text)


def typed_values(args: argparse.Namespace, specs: Iterable[KnobSpec]) -> dict[str, Any]:
    """The settings among `specs` that the user typed."""
    names = {spec.name for spec in specs}
    return {k: v for k, v in vars(args).items() if k in names}


def plan_from_args(args: argparse.Namespace) -> Plan:
    return plan_from_sources(args.plan, typed_values(args, Plan.specs()))
