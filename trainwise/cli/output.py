"""Machine-readable output shared by the commands (`--json`)."""

from __future__ import annotations

import json
import sys

# Said when an estimate's figures were read from the trace cache (estimator/trace_cache.py),
# in the table and, on stderr, beside the JSON; here, not with the table, so `--json` imports no rich.
FROM_CACHE = "traces: reused from the cache (same model, plan and versions)"


def print_json(data) -> None:
    """Write `data` to stdout as indented JSON, one trailing newline."""
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_json_line(data) -> None:
    """Write `data` to stdout as one line of JSON (what a script reads as the last line)."""
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def summary_object(model: str, result, run) -> dict:
    """`train --json`: the run's summary keys (docs/train.md: measured, seconds, bytes,
    tokens/s) with the model, device, plan and output folder they belong to."""
    return {"model": model, "device": str(result.device), "plan": result.plan.to_dict(), "output": run.output,
            "summary": result.summary}
