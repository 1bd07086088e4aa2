"""Command-line flags generated from knob declarations (the Plan's, and the RunConfig's)."""

from __future__ import annotations

import argparse
from typing import Any, Iterable

from trainwise.plan import KnobSpec, Plan, plan_from_sources
from trainwise.plan.knobs import GROUPS


def add_knob_flags(parser: argparse.ArgumentParser, more: Iterable[KnobSpec] = ()) -> None:
    """One flag per Plan knob (and per setting in `more`: the RunConfig's on `train`), each in
    the --help section its declaration names, plus --plan FILE. Defaults are suppressed so
    only flags the user typed override the plan file; validation happens once, in
    Plan.from_dict."""
    names = [(a.metavar or a.dest, a.nargs) for a in parser._positionals._group_actions]
    positionals = " ".join(f"[{name}]" if nargs == "?" else name for name, nargs in names)
    parser.usage = f"%(prog)s {positionals} [FLAGS]"  # not every flag: the sections below list them
    parser.add_argument("--plan", metavar="FILE", default=None,
                        help="YAML or JSON file of knob values (the flags below override it)")
    add_spec_flags(parser, (*Plan.specs(), *more))
    # --help shows the sections in the declared order, after the command's own options,
    # whichever was created first (a command may put its own flags in a section).
    own = [g for g in parser._action_groups if g.title not in GROUPS]
    parser._action_groups[:] = own[:2] + sorted((g for g in parser._action_groups if g.title in GROUPS),
                                                key=lambda g: GROUPS.index(g.title)) + own[2:]


def section(parser: argparse.ArgumentParser, title: str):
    """The argument group called `title` of `parser`, created when it has none yet."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def add_spec_flags(parser: argparse.ArgumentParser, specs: Iterable[KnobSpec]) -> None:
    """One flag per declared setting, in its section; values stay strings until the owner
    class validates them."""
    for spec in specs:
        group = section(parser, spec.group)
        default_text = f" (default: {spec.default})" if spec.default is not None else ""
        if spec.kind is bool:
            group.add_argument(spec.flag, *spec.aliases, dest=spec.name, action="store_const", const=True,
                               default=argparse.SUPPRESS, help=spec.help + default_text)
        else:
            metavar = "{" + ",".join(spec.choices) + "}" if spec.choices else spec.kind.__name__.upper()
            group.add_argument(spec.flag, *spec.aliases, dest=spec.name, metavar=metavar,
                               default=argparse.SUPPRESS, help=spec.help + default_text)


def typed_values(args: argparse.Namespace, specs: Iterable[KnobSpec]) -> dict[str, Any]:
    """The settings among `specs` that the user typed."""
    names = {spec.name for spec in specs}
    return {k: v for k, v in vars(args).items() if k in names}


def plan_from_args(args: argparse.Namespace, underneath: dict[str, Any] | None = None) -> Plan:
    """The Plan of the typed flags over the plan file; `underneath`: knob values between the
    two (read from another tool's configuration), which the typed flags override."""
    return plan_from_sources(args.plan, {**(underneath or {}), **typed_values(args, Plan.specs())})


def check_device_name(device: str | None) -> None:
    """Refuse an unknown --device now, before the seconds torch and transformers take to
    import (InputError naming the closest GPU). "cuda" names the GPU present: the command
    detects it once, later. None: the command takes no --device."""
    if device is not None and not device.strip().lower().startswith("cuda"):
        from trainwise.hardware.resolve import resolve_device

        resolve_device(device)


def add_auto_batch_flags(parser: argparse.ArgumentParser) -> None:
    """--global-batch and --memory-margin, the settings of `--batch-size auto`."""
    group = section(parser, "batch shape")
    group.add_argument("--global-batch", default=None, metavar="B",
                       help="samples per optimizer step over all replicas, kept by accumulation "
                            "(with --batch-size auto: the largest micro-batch predicted to fit)")
    group.add_argument("--memory-margin", default="0.05", metavar="FRACTION",
                       help="with --batch-size auto: share of device memory left free when checking a fit "
                            "(default: 0.05)")


def add_installed_only_flag(parser: argparse.ArgumentParser) -> None:
    """--installed-only / --no-installed-only for the plan search (`plan`, `train --plan auto`)."""
    parser.add_argument("--installed-only", default=None, action=argparse.BooleanOptionalAction,
                        help="search only techniques whose packages (liger-kernel, torchao, bitsandbytes, flash-attn, "
                             "triton) are installed here (default: on when planning for this machine: the CPU, a GPU "
                             "present, train --plan auto; off for a GPU named from the catalog, whose plans say "
                             "what they need that is not installed here)")


def take_auto_batch(args: argparse.Namespace) -> bool:
    """True when the user typed `--batch-size auto`; the value is removed from `args` so the
    Plan (whose batch_size is an int) is built without it."""
    if getattr(args, "batch_size", None) == "auto":
        del args.batch_size
        return True
    return False


def explicit_knobs(args: argparse.Namespace) -> frozenset[str]:
    """The knobs the user gave: typed flags and plan-file keys (held fixed by the search)."""
    from trainwise.plan import load_plan_file

    from_file = load_plan_file(args.plan) if getattr(args, "plan", None) not in (None, "auto") else {}
    return frozenset({*typed_values(args, Plan.specs()), *(k.replace("-", "_") for k in from_file)})


def number_option(args: argparse.Namespace, name: str, kind: type = int, minimum: float = 1):
    """The value of an option that is not a knob, checked: InputError naming its flag."""
    from trainwise.common.errors import InputError

    text = getattr(args, name, None)
    if text is None:
        return None
    flag = "--" + name.replace("_", "-")
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        noun = "an int" if kind is int else "a number"
        raise InputError(flag, f"must be {noun} >= {minimum} (got {text!r})")
    return value
