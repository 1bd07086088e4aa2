"""The Plan: every training knob, declared once, with validation and file io."""

from trainwise.common.errors import InputError, NotSupportedYet
from trainwise.plan.knobs import KnobSpec, knob_specs
from trainwise.plan.plan import Plan
from trainwise.plan.io import load_plan_file, plan_from_sources

__all__ = [
    "InputError",
    "NotSupportedYet",
    "KnobSpec",
    "knob_specs",
    "Plan",
    "load_plan_file",
    "plan_from_sources",
]
