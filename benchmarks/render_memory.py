"""docs/results/memory-<gpu>.md from the rows files of one or more launches of
benchmarks/validate_memory.py (each launch writes its rows, with its provenance, to a
JSON file as it goes, so a launch cut short keeps what it measured).

    python benchmarks/render_memory.py docs/results/rows/memory-H100-1.json \
        docs/results/rows/memory-H100-2.json --out docs/results/memory-H100.md

Rows are merged by configuration name in file order: a later launch's row replaces an
earlier one's (a re-run after a fix wins), so the page shows one row per configuration,
each from the newest launch that measured it, and names the launch of every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import provenance

GiB = 1024**3
TARGET_MEDIAN_PCT = 3.0
TARGET_MAX_PCT = 8.0
FIGURES = ("peak_allocated", "peak_reserved", "device_total")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", type=Path, help="rows files, oldest launch first")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown page to write")
    args = parser.parse_args(argv)
    try:
        launches = [load_launch(path) for path in args.rows]
    except ValueError as error:  # the page is left as it was
        print(f"render_memory.py: error: {error}", file=sys.stderr)
        return 2
    text = render_page(launches, provenance.script_command("render_memory.py", argv))
    provenance.add_repo_to_path()
    from trainwise.common.atomic import atomic_write_text

    atomic_write_text(args.out, text)
    print(f"wrote {args.out} from {len(launches)} launch(es)")
    return 0


def load_launch(path: Path) -> dict:
    """A rows file: {"provenance": {...}, "meta": {...}, "rows": [...]}, with its path."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot be read as JSON ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "provenance" not in data:
        raise ValueError(f"{path}: not a rows file of benchmarks/validate_memory.py (needs provenance and rows)")
    return {**data, "path": str(path)}


def merge(launches: list[dict]) -> list[dict]:
    """One row per configuration name, from the last launch that has it; each row gets
    "launch" (1-based). Order: first appearance."""
    merged: dict[str, dict] = {}
    for number, launch in enumerate(launches, 1):
        for row in launch["rows"]:
            merged[row["name"]] = {**row, "launch": number}
    return list(merged.values())


def render_page(launches: list[dict], command: str) -> str:
    rows = merge(launches)
    first = launches[0]["provenance"]
    prov = provenance.of_launches(launches, command,
                                  lambda l: f"`{l['provenance']['command']}` ({len(l['rows'])} rows, {l['path']})")
    gpu = launches[0].get("meta", {}).get("gpu", first["device"])
    return provenance.page(f"Memory estimates vs measurements on {gpu}", prov, render_body(rows, launches[-1]))


def render_body(rows: list[dict], launch: dict) -> str:
    meta = launch.get("meta", {})
    lines = [f"- trainwise device: {meta.get('trainwise_device', 'n/a')}; driver {meta.get('driver', 'n/a')}, "
             f"CUDA {meta.get('cuda', 'n/a')}, peft {meta.get('peft', 'n/a')}, "
             f"bitsandbytes {meta.get('bitsandbytes', 'n/a')}",
             "- Each row: a fresh process builds the model (random weights), creates the optimizer state, resets the "
             "peak statistics and runs 2 optimizer steps. Measured: `torch.cuda.max_memory_allocated()`, "
             "`torch.cuda.max_memory_reserved()`, and the process's GPU memory from NVML (what nvidia-smi shows). "
             "Predicted: `trainwise.api.estimate(..., device=\"cuda\")`. Sizes in GiB; "
             "error = (predicted - measured) / measured.", "",
             "| config | launch | plan | status | predicted peak alloc | measured | error | predicted reserved "
             "| measured | error | predicted device total | NVML | error |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        p, m, e = row["predicted"], row["measured"], row["error_pct"]
        status = m.get("status", "?") if p.get("status") == "ok" else f"estimate {p.get('status')}"
        if status != "ok" and (m.get("reason") or p.get("reason")):
            status += f": {(m.get('reason') or p.get('reason'))[:80]}"
        knobs = ", ".join(f"{k}={v}" for k, v in row["knobs"].items())
        cells = [row["name"], str(row.get("launch", 1)), f"{row['model']} {knobs}", status.replace("|", "/")]
        for key in FIGURES:
            cells += [_gib(p.get(key)), _gib(m.get(key)), _pct(e.get(key))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "## Summary", "", *summary_lines(rows)]) + "\n"


def error_pct(predicted: int | None, measured: int | None) -> float | None:
    if not predicted or not measured:
        return None
    return (predicted - measured) / measured * 100.0


def summarize(rows: list[dict]) -> dict:
    """Median and max |error| per figure over the rows where both sides are known."""
    summary = {}
    for key in FIGURES:
        errors = [abs(row["error_pct"][key]) for row in rows if row["error_pct"].get(key) is not None]
        summary[key] = {"n": len(errors), "median": statistics.median(errors) if errors else None,
                        "max": max(errors) if errors else None}
    alloc = summary["peak_allocated"]
    summary["meets_target"] = (alloc["n"] > 0 and alloc["median"] <= TARGET_MEDIAN_PCT
                               and alloc["max"] <= TARGET_MAX_PCT)
    return summary


def summary_lines(rows: list[dict]) -> list[str]:
    summary = summarize(rows)
    alloc = summary["peak_allocated"]
    measured = sum(1 for row in rows if row["measured"].get("status") == "ok")
    lines = [f"{measured} of {len(rows)} configurations measured."]
    if alloc["n"]:
        verdict = "meets" if summary["meets_target"] else "MISSES"
        lines.append(f"Peak allocated, |error| over {alloc['n']} measured rows: median {alloc['median']:.1f} %, "
                     f"max {alloc['max']:.1f} % ({verdict} the target: median <= {TARGET_MEDIAN_PCT:g} %, "
                     f"max <= {TARGET_MAX_PCT:g} %).")
    for key, label in (("peak_reserved", "Peak reserved"), ("device_total", "Device total (NVML)")):
        if summary[key]["n"]:
            s = summary[key]
            lines.append(f"{label}, |error| over {s['n']} rows: median {s['median']:.1f} %, max {s['max']:.1f} %.")
    sources = sorted({row["measured"].get("nvml_source") for row in rows if row["measured"].get("nvml_source")})
    if sources:
        lines.append(f"NVML figures from: {'; '.join(sources)}.")
    return lines


def _gib(value) -> str:
    return "-" if value is None else f"{value / GiB:.2f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1f} %"


if __name__ == "__main__":
    sys.exit(main())
