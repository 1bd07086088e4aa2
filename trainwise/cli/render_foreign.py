"""What `--from-training-args` read: each setting, the knob it became and how faithfully."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainwise.plan.foreign_config import ForeignConfig


def render_foreign(config: ForeignConfig, console: Console) -> None:
    """One line of the settings mapped exactly, then a table of those mapped approximately
    or ignored, with why: the lines to read before trusting the figures."""
    exact = [s for s in config.settings if s.how == "exact"]
    if exact:
        console.print("Read from " + escape(", ".join(config.files)) + " (typed flags win): " +
                      escape(", ".join(f"{s.key} -> {_flag(s)}" for s in exact)))
    rest = [s for s in config.settings if s.how != "exact"]
    if rest:
        table = Table(title="Settings mapped approximately or ignored", title_justify="left")
        for column in ("setting", "value", "trainwise", "why"):
            table.add_column(column, overflow="fold")
        for setting in rest:
            table.add_row(escape(setting.key), escape(_short(setting.value)),
                          escape(_flag(setting) if setting.knob else "ignored"), escape(setting.note))
        console.print(table)
    for note in config.notes:
        console.print(f"note: {escape(note)}")


def _flag(setting) -> str:
    value = setting.knob_value
    flag = f"--{setting.knob.replace('_', '-')}"
    if value is True:
        return flag
    return f"{flag} {_short(value)}"


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
