"""Machine-readable output shared by the commands (`--json`)."""

from __future__ import annotations

import json
import sys


def print_json(data) -> None:
    """Write `data` to stdout as indented JSON, one trailing newline."""
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")
