"""results.md: the bench table as Markdown with the command and versions, ready to commit
under docs/results/ (the figures are the measured and predicted ones from results.json)."""

from __future__ import annotations

import platform

from trainwise.plan.units import human_bytes


def results_markdown(rows: list[dict], command: str, device: str) -> str:
    import torch
    import transformers

    baseline = {r["name"]: r for r in rows if r["engine"] == "hf-trainer"}
    lines = [f"# bench on {device}", "",
             f"Command: `{command}`", "",
             f"Versions: Python {platform.python_version()}, torch {torch.__version__}, "
             f"transformers {transformers.__version__}; {platform.platform()}", "",
             "Times and rates measured (warm-up step excluded); memory measured (m) and predicted (p).", "",
             "| row | engine | status | samples/s | tokens/s | MFU | peak alloc m | peak alloc p | error | "
             "device total m | vs HF Trainer |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        other = baseline.get(row["name"])
        ratio = ""
        if row["engine"] == "trainwise" and other and row.get("samples_per_s") and other.get("samples_per_s"):
            ratio = f"{row['samples_per_s'] / other['samples_per_s']:.2f}x"
        error = row["error_pct"].get("peak_allocated")
        status = row["status"] + (f": {row['reason']}" if row["status"] != "ok" and row.get("reason") else "")
        lines.append("| " + " | ".join([
            row["name"], row["engine"], status.replace("|", "/"), _num(row.get("samples_per_s"), ",.1f"),
            _num(row.get("tokens_per_s"), ",.0f"), f"{100 * row['mfu']:.1f} %" if row.get("mfu") is not None else "n/a",
            human_bytes(row["measured"].get("peak_allocated")), human_bytes(row["predicted"].get("peak_allocated")),
            f"{error:+.1f} %" if error is not None else "", human_bytes(row["measured"].get("device_total")), ratio,
        ]) + " |")
    methods = sorted({r["memory_method"] for r in rows if r.get("memory_method")})
    lines += [""] + [f"Memory measured by: {m}" for m in methods] + [""]
    return "\n".join(lines)


def _num(value, spec: str) -> str:
    return format(value, spec) if value is not None else "n/a"
