"""docs/results/bench-<device>.md and .png: `trainwise bench` run several times, each row's
median and spread over the repeats, with the page's provenance.

    python benchmarks/bench_page.py                 # CPU: quick ladder, 20 steps, 3 repeats
    python benchmarks/bench_page.py --repeats 5 --page /tmp/bench.md

Each repeat is a whole `trainwise bench` ladder (every row a fresh process, trainwise and
the Trainer one after the other), so a slow spell of a shared machine hits both engines
of a rung alike. The table shows the median run of each row (by samples/s) with the
spread of samples/s over the repeats; "vs HF Trainer" is the ratio of the medians where
both engines' spreads are within 10 % and no run of either started on a busy machine
(trainwise.common.noise), else the reason that kept it out. The page says how busy the
machine was.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import provenance

provenance.add_repo_to_path()

from trainwise.common.atomic import atomic_write_text  # noqa: E402
from trainwise.common.noise import SPREAD_LIMIT, Spread, confident_ratio, spread_text  # noqa: E402
from trainwise.common.units import bytes_or_na, signed_percent  # noqa: E402

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ladder", default="quick")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="whole ladders run (median and spread over them)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--page", type=Path, default=None, help="default: docs/results/bench-<device>.md")
    args = parser.parse_args(argv)
    from trainwise.api.benchmark import bench
    from trainwise.bench.chart import save_chart

    page = args.page or provenance.REPO / "docs" / "results" / f"bench-{args.device}.md"
    prov = provenance.collect(provenance.script_command("bench_page.py", argv))
    runs: list[list[dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-page-") as scratch:
        for index in range(args.repeats):
            runs.append(bench(None, args.ladder, steps=args.steps, out=Path(scratch) / f"run-{index}",
                              device=args.device, repeat=1))
            print(f"repeat {index + 1} of {args.repeats} done", flush=True)
    prov = provenance.finish(prov)
    rows = median_rows(runs)
    chart = page.with_suffix(".png")
    save_chart(rows, chart, f"{rows[0].get('model')}: {args.ladder} ladder, {args.steps} steps per row, "
                            f"median of {args.repeats} repeats on {args.device}")
    atomic_write_text(page, provenance.page(f"bench on {args.device}", prov, render(rows, args, chart.name)))
    print(f"wrote {page} and {chart}")
    return 0


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per (row, engine): the run with the median samples/s, with every repeat's samples/s
    under "repeats_samples_per_s" (failed runs count as missing figures) and "busy", the
    first busy machine any repeat of it started on (None: quiet)."""
    order = list(dict.fromkeys((r["name"], r["engine"]) for run in runs for r in run))
    rows = []
    for key in order:
        same = [r for run in runs for r in run if (r["name"], r["engine"]) == key]
        timed = sorted((r for r in same if r.get("samples_per_s")), key=lambda r: r["samples_per_s"])
        chosen = timed[(len(timed) - 1) // 2] if timed else same[0]
        rows.append({**chosen, "repeats_samples_per_s": [r.get("samples_per_s") for r in same],
                     "busy": next((r["busy"] for r in same if r.get("busy")), None)})
    return rows


def render(rows: list[dict], args, chart: str) -> str:
    baseline = {r["name"]: r for r in rows if r["engine"] == "hf-trainer"}
    lines = [f"`trainwise bench --ladder {args.ladder} --steps {args.steps} --device {args.device}` run "
             f"{args.repeats} times. samples/s: the median over the repeats (warm-up step and, on a CPU, the "
             "memory-profiled step left out), spread = (max - min) / median over the repeats. Memory: measured "
             "(the median run's) and predicted (`trainwise estimate` for the same plan); "
             "error = (predicted - measured) / measured. vs HF Trainer: ratio of the medians, shown only where "
             f"both engines' spreads are within {spread_text(SPREAD_LIMIT)} and the machine was not busy when "
             "their runs started (other processes' load beyond half a CPU).", "",
             "| row | engine | status | samples/s (median) | spread | repeats | tokens/s (job of one device, median run) | peak alloc measured "
             "| predicted | error | vs HF Trainer |",
             "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        speeds = [s for s in r["repeats_samples_per_s"] if s]
        median, spread = Spread.of(speeds).median, spread_text(Spread.of(speeds).spread)
        status = r["status"] + (f": {r['reason']}" if r["status"] != "ok" and r.get("reason") else "")
        other = baseline.get(r["name"])
        ratio = ""
        if r["engine"] == "trainwise" and other and median:
            busy = r.get("busy") or other.get("busy")
            ratio = _ratio(speeds, [s for s in other["repeats_samples_per_s"] if s], busy)
        lines.append("| " + " | ".join([
            r["name"], r["engine"], status.replace("|", "/"), _num(median, ",.1f"), spread,
            ", ".join(_num(s, ".1f") for s in r["repeats_samples_per_s"]), _num(r.get("tokens_per_s"), ",.0f"),
            bytes_or_na(r["measured"].get("peak_allocated")), bytes_or_na(r["predicted"].get("peak_allocated")),
            signed_percent(r["error_pct"].get("peak_allocated")), ratio]) + " |")
    methods = sorted({r["memory_method"] for r in rows if r.get("memory_method")})
    lines += [""] + [f"Memory measured by: {m}." for m in methods]
    lines += ["", busy_line(rows)]
    lines += ["", f"![chart]({chart})", "",
              "The chart (written by the same command) shows the median run of each row."]
    return "\n".join(lines) + "\n"


def busy_line(rows: list[dict]) -> str:
    """How busy the machine was when the rows' runs started."""
    busy = [r for r in rows if r.get("busy")]
    if not busy:
        return "Machine: quiet when every run started (no other processes' load beyond half a CPU)."
    return (f"Machine: busy when {len(busy)} of {len(rows)} rows ran ({busy[0]['busy']}); their ratios are "
            "not shown and their times are slower and noisier than on a quiet machine.")


def _ratio(speeds: list[float], baseline: list[float], busy: str | None = None) -> str:
    """The ratio of the medians, or why none is shown: a ratio of two figures that moved by
    more than 10 % between repeats, or taken beside other work, says more about the machine
    than the engines."""
    if not speeds or not baseline:
        return ""
    return confident_ratio(Spread.of(speeds), Spread.of(baseline), busy=busy).text().replace("|", "/")


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
