"""The bench's files in --out: results.json and results.csv, rewritten atomically after
every row (so an interrupted ladder keeps what finished), and read back for --resume."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from trainwise.bench.rows import MEMORY_KEYS
from trainwise.common.atomic import atomic_write_text
from trainwise.common.errors import InputError

JSON_FILE, CSV_FILE = "results.json", "results.csv"
CSV_COLUMNS = ["name", "engine", "status", "reason", "time_s", "samples_per_s", "tokens_per_s", "samples_per_s_per_gpu",
               "tokens_per_s_per_gpu", "mfu",
               *[f"measured_{k}" for k in MEMORY_KEYS], *[f"predicted_{k}" for k in MEMORY_KEYS],
               "error_pct_peak_allocated", "error_pct_device_total", "memory_method", "model", "plan", "notes",
               "spread_pct", "samples", "busy", "vs_baseline_ratio", "vs_baseline_withheld"]


def save_results(out: Path, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / JSON_FILE, json.dumps(rows, indent=2) + "\n")
    atomic_write_text(out / CSV_FILE, _csv(rows))


def load_results(out: Path) -> list[dict]:
    """Rows of an earlier run in `out` (empty when there is none). A results.json that is
    there but cannot be read as rows is an InputError naming it: resuming would start over
    and overwrite it, losing the rows it may hold."""
    path = out / JSON_FILE
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError("--resume", f"{path} is not readable as bench results ({reason}); it is left as it is: "
                                     "repair or move it, or pick another --out") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InputError("--resume", f"{path} does not hold a list of bench rows; it is left as it is: "
                                     "repair or move it, or pick another --out")
    return rows


def _csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for row in rows:
        flat = {k: row.get(k) for k in CSV_COLUMNS[:8]}
        flat.update({f"measured_{k}": row["measured"].get(k) for k in MEMORY_KEYS})
        flat.update({f"predicted_{k}": row["predicted"].get(k) for k in MEMORY_KEYS})
        flat.update(error_pct_peak_allocated=row["error_pct"].get("peak_allocated"),
                    error_pct_device_total=row["error_pct"].get("device_total"),
                    memory_method=row.get("memory_method"), model=row.get("model"),
                    plan=json.dumps(row.get("plan", {})), notes="; ".join(row.get("notes") or []))
        # The spread and its samples (samples/s, measured), and the ratio or why it was withheld.
        spread, ratio = row.get("spread") or {}, row.get("vs_baseline") or {}
        flat.update(spread_pct=spread.get("spread_pct"), samples=json.dumps(spread.get("samples", [])),
                    busy=row.get("busy"), vs_baseline_ratio=ratio.get("ratio"),
                    vs_baseline_withheld=ratio.get("withheld"))
        writer.writerow(flat)
    return buffer.getvalue()
