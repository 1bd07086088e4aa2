"""Reading a run's metrics file (JSON lines) in the tests."""

from __future__ import annotations

import json


def step_losses(metrics) -> list[float]:
    """The loss of every step line of the metrics file at `metrics` (a Path), in order."""
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [line["loss"] for line in lines if "step" in line]
