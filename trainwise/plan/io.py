"""Reading plans from YAML/JSON files and merging them with command-line values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwise.common.errors import InputError
from trainwise.plan.plan import Plan


def load_plan_file(path: str | Path) -> dict[str, Any]:
    """Knob values from a YAML or JSON file (a mapping of knob name to value)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("--plan", f"file not found: {path}")
    text = path.read_text()
    import yaml  # here, not at the top: every command imports this module, few read a plan file

    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        first_line = str(err).splitlines()[0]
        raise InputError("--plan", f"{path} is not valid YAML/JSON ({first_line})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError("--plan", f"{path} must hold a mapping of knob names to values")
    # A file written by `plan --json` or `estimate --json` nests the knobs under "plan".
    if "plan" in data and isinstance(data["plan"], dict):
        data = data["plan"]
    return data


def plan_from_sources(file: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Plan:
    """Defaults, then the plan file, then explicit overrides (command-line flags win)."""
    values: dict[str, Any] = {}
    if file is not None:
        values.update(load_plan_file(file))
    values.update(overrides or {})
    source = f"--plan {file}" if file else "plan"
    return Plan.from_dict(values, source=source)
