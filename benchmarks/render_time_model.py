"""The body of docs/results/time-model-<device>.md (benchmarks/time_model.py measures)."""

from __future__ import annotations

from trainwise.cli.render_calibrate import rate_rows


def _seconds(value) -> str:
    return f"{value:.4f}" if value is not None else "-"


def _percent(value) -> str:
    return f"{100 * value:.0f} %" if value is not None else "-"


def _error(row: dict) -> str:
    if not row.get("predicted_s") or not row.get("measured_s"):
        return "-"
    return f"{100 * (row['predicted_s'] - row['measured_s']) / row['measured_s']:+.1f} %"


def _metrics(name: str, found: dict) -> str:
    mape = f"{found['mape_pct']:.1f} %" if found["mape_pct"] is not None else "-"
    rho = f"{found['spearman']:.3f}" if found["spearman"] is not None else "-"
    return f"| {name} | {found['n']} | {mape} | {rho} |"


def render(rows: list[dict], summary: dict, verdict: str, warnings: list[str], args, profile, seconds: float) -> str:
    lines = [f"Seconds per optimizer step on {args.device}: predicted by `trainwise.api.estimate(model, plan, "
             "profile=...).time.step_s`, measured by `trainwise train` in a fresh process "
             f"({args.steps} steps, the first {args.warmup} and, on a CPU, the memory-profiled last one untimed; "
             f"the median of the timed steps), {args.repeat} runs per plan: measured = the median over the runs, "
             "spread = (max - min) / median over the runs. Error = (predicted - measured) / measured. "
             f"Calibration rows: the {summary['calibration_model']} plans (a time model may be tuned on them); "
             "held out: the other model's. "
             f"CPU threads: {args.threads or 'torch default'}. Whole benchmark: {seconds / 60:.1f} min.", ""]
    lines += [f"**{verdict}**", ""]
    if warnings:
        lines += ["Warnings (the figures below may be off):", ""] + [f"- {w}" for w in warnings] + [""]
    lines += ["| plan | split | predicted s (predicted) | measured s (median, measured) | spread | error |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['name']} | {row['split']} | {_seconds(row.get('predicted_s'))} | "
                     f"{_seconds(row.get('measured_s'))} | {_percent(row.get('spread'))} | {_error(row)} |")
    lines += ["", "| rows | plans | MAPE | Spearman |", "| --- | ---: | ---: | ---: |",
              _metrics("all (no correction)", summary["all"]), _metrics("calibration", summary["calibration"]),
              _metrics("held out", summary["held_out"])]
    if summary.get("correction"):
        lines.append(_metrics(f"held out x {summary['correction']:.3f} (the calibration rows' median "
                              "measured/predicted)", summary["held_out_corrected"]))
    if profile is not None:
        lines += ["", f"Device profile ({profile.source}, measured {profile.measured.get('date', '?')} in "
                      f"{profile.measured.get('seconds', '?')} s):", "",
                  "| rate | throughput (measured) | fixed cost per op (measured) |", "| --- | ---: | ---: |"]
        lines += [f"| {what} | {rate} | {fixed} |" for what, rate, fixed in rate_rows(profile)]
    return "\n".join(lines) + "\n"
