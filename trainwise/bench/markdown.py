"""results.md: the bench table as Markdown with the command and versions, ready to commit
under docs/results/ (the figures are the measured and predicted ones from results.json)."""

from __future__ import annotations

import platform

from trainwise.plan.units import human_bytes

HEADER = ("row", "engine", "status", "time (s)", "samples/s", "tokens/s", "MFU",
          "peak alloc measured", "peak alloc predicted", "error",
          "peak reserved measured", "peak reserved predicted",
          "device total measured", "device total predicted", "error", "samples/s vs HF Trainer")


def results_markdown(rows: list[dict], command: str, device: str) -> str:
    import torch
    import transformers

    lines = [f"# bench on {device}", "",
             f"Command: `{command}`", "",
             f"Versions: Python {platform.python_version()}, torch {torch.__version__}, "
             f"transformers {transformers.__version__}; {platform.platform()}", "",
             "Times and rates are measured with the warm-up step left out. Memory is measured and "
             "predicted (`trainwise estimate` for the same plan); error = (predicted - measured) / measured. "
             "n/a: the device reports no such figure.", "",
             "| " + " | ".join(HEADER) + " |",
             "|" + "|".join("---" if i < 3 else "---:" for i in range(len(HEADER))) + "|"]
    baseline = {r["name"]: r for r in rows if r["engine"] == "hf-trainer"}
    lines += [_line(row, baseline.get(row["name"])) for row in rows]
    methods = sorted({r["memory_method"] for r in rows if r.get("memory_method")})
    notes = sorted({n for r in rows for n in r.get("notes") or []})
    lines += [""] + [f"Memory measured by: {m}" for m in methods] + [f"Note: {n}" for n in notes] + [""]
    return "\n".join(lines)


def _line(row: dict, baseline: dict | None) -> str:
    measured, predicted, error = row["measured"], row["predicted"], row["error_pct"]
    ratio = ""
    if row["engine"] == "trainwise" and baseline and row.get("samples_per_s") and baseline.get("samples_per_s"):
        ratio = f"{row['samples_per_s'] / baseline['samples_per_s']:.2f}x"
    status = row["status"] + (f": {row['reason']}" if row["status"] != "ok" and row.get("reason") else "")
    cells = [row["name"], row["engine"], status.replace("|", "/"), _num(row.get("time_s"), ".1f"),
             _num(row.get("samples_per_s"), ",.1f"), _num(row.get("tokens_per_s"), ",.0f"),
             f"{100 * row['mfu']:.1f} %" if row.get("mfu") is not None else "n/a",
             _bytes(measured.get("peak_allocated")), _bytes(predicted.get("peak_allocated")),
             _pct(error.get("peak_allocated")),
             _bytes(measured.get("peak_reserved")), _bytes(predicted.get("peak_reserved")),
             _bytes(measured.get("device_total")), _bytes(predicted.get("device_total")),
             _pct(error.get("device_total")), ratio]
    return "| " + " | ".join(cells) + " |"


def _bytes(value) -> str:
    return "n/a" if value is None else human_bytes(value)


def _pct(value) -> str:
    if value is None:
        return "n/a"
    return "0.0 %" if abs(value) < 0.05 else f"{value:+.1f} %"


def _num(value, spec: str) -> str:
    return format(value, spec) if value is not None else "n/a"
