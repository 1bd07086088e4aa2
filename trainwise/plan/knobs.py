"""Knob declarations: a knob is a Plan field whose metadata says how to parse and check it.

The CLI flags, the plan-file keys and validation are all derived from these declarations,
so adding a knob is one line in `plan.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The sections of `--help`, in the order they are shown; every knob names one.
GROUPS = ("batch shape", "optimizer", "precision and memory", "kernels and compile", "parallel layout", "data",
          "run and output")


@dataclass(frozen=True)
class KnobSpec:
    """How one knob is presented and checked. `choices` and `minimum` are the allowed values."""

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: int | float | None = None
    optional: bool = False  # None is allowed and means "derive it"
    group: str = "run and output"  # the section of --help (GROUPS)
    flag_name: str | None = None  # the flag when it is not the field's name ("out" for `output`)
    aliases: tuple[str, ...] = ()  # older flags still accepted ("--output")

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name).replace("_", "-")

    def allowed(self) -> str:
        """Human description of the allowed values, for error messages."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is bool:
            return "true or false"
        if self.minimum is not None:
            return f"an {self.kind.__name__} >= {self.minimum}" if self.kind is int else f"a number >= {self.minimum}"
        return f"a {self.kind.__name__}"


def knob(default: Any, help: str, *, group: str, choices=None, minimum=None, optional=False, kind=None,
         flag: str | None = None, aliases: tuple[str, ...] = ()):
    """Declare a dataclass field as a knob. `kind` defaults to the type of `default`; `group`
    is its section of --help (one of GROUPS); `flag` overrides the flag's name."""
    if group not in GROUPS:
        raise ValueError(f"knob group {group!r} is not one of {GROUPS}")
    meta = {"knob": dict(help=help, choices=tuple(choices) if choices else None, minimum=minimum,
                         optional=optional, kind=kind, group=group, flag_name=flag, aliases=tuple(aliases))}
    return dataclasses.field(default=default, metadata=meta)


def knob_specs(plan_cls) -> tuple[KnobSpec, ...]:
    """All knob declarations of a Plan class, in declaration order."""
    specs = []
    for f in dataclasses.fields(plan_cls):
        meta = f.metadata.get("knob")
        if meta is None:
            continue
        kind = meta["kind"] or type(f.default)
        specs.append(KnobSpec(name=f.name, kind=kind, default=f.default, help=meta["help"],
                              choices=meta["choices"], minimum=meta["minimum"],
                              optional=meta["optional"], group=meta["group"], flag_name=meta["flag_name"],
                              aliases=meta["aliases"]))
    return tuple(specs)
