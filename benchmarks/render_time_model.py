"""The body of docs/results/time-model-<device>.md (benchmarks/time_model.py measures)."""

from __future__ import annotations

from steady_calibration import tries_lines
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


def _reference_steps() -> str:
    from trainwise.calibration.host_time import COMPUTE_BOUND, HOST_BOUND, REFERENCE_MODEL

    return (f"{REFERENCE_MODEL} trained at {HOST_BOUND[0]} x {HOST_BOUND[1]} and {COMPUTE_BOUND[0]} x "
            f"{COMPUTE_BOUND[1]} tokens")


def _clock(clock: str) -> str:
    if clock == "cpu":
        return ("the train process's CPU seconds per step (`step_cpu_s` in its metrics; one thread, so the "
                "step's time with a core to itself: other processes on this shared machine stretch wall time, "
                "not this; wall seconds are shown alongside)")
    return "wall seconds per step (`step_time_s`)"


def _steps_text(args) -> str:
    """How many steps a run takes: --steps, or more to fill --timed-seconds of timed steps."""
    seconds = getattr(args, "timed_seconds", 0.0)
    if not seconds:
        return f"{args.steps} steps"
    return (f"at least {args.steps} steps, more where the plan's predicted step time leaves under {seconds:g} s of "
            "timed steps (the steps per run column)")


def render(rows: list[dict], summary: dict, verdict: str, warnings: list[str], args, profile, seconds: float,
           tries: list[dict] = ()) -> str:
    lines = [f"## {args.case.what[0].upper()}{args.case.what[1:]}", "",
             f"Seconds per optimizer step on {args.device}: predicted by `trainwise.api.estimate(model, plan, "
             "profile=...).time.step_s`, measured by `trainwise train` in a fresh process "
             f"({_steps_text(args)}, the first {args.warmup} and, on a CPU, the memory-profiled last one untimed; "
             f"the median of the timed steps), {args.repeat} runs per plan: measured = the median over the runs, "
             "spread = (max - min) / median over the runs. Error = (predicted - measured) / measured. "
             f"Calibration rows: the {summary['calibration_model']} plans (a time model may be tuned on them); "
             "held out: the other models' (\"seen during the fix\": looked at while the time model was last "
             "changed; \"never seen while fixing\": first run once that change was final). "
             f"CPU threads: {args.threads or f'torch default ({args.default_threads})'} (calibration and runs). "
             f"Clock: {_clock(args.clock)}. This case's runs: {seconds / 60:.1f} min.", ""]
    lines += [f"**{verdict}**", ""]
    if warnings:
        lines += ["Warnings (the figures below may be off):", ""] + [f"- {w}" for w in warnings] + [""]
    lines += tries_lines(list(tries))
    lines += [f"| plan | split | predicted s (predicted) | measured {args.clock} s (median, measured) | spread | error "
              "| wall s (median, measured) | steps per run |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['name']} | {row['split']} | {_seconds(row.get('predicted_s'))} | "
                     f"{_seconds(row.get('measured_s'))} | {_percent(row.get('spread'))} | {_error(row)} "
                     f"| {_seconds(row.get('wall_s'))} | {row.get('steps', args.steps)} |")
    lines += ["", "| rows | plans | MAPE | Spearman |", "| --- | ---: | ---: | ---: |",
              _metrics("all (no correction)", summary["all"]), _metrics("calibration", summary["calibration"]),
              _metrics("held out (all)", summary["held_out"])]
    lines += [_metrics(split, found) for split, found in summary.get("groups", {}).items()]
    if summary.get("correction"):
        lines.append(_metrics(f"held out x {summary['correction']:.3f} (the calibration rows' median "
                              "measured/predicted)", summary["held_out_corrected"]))
    machine = summary.get("drift")
    if machine:
        lines.append(_metrics(f"all, predictions x {machine['ratio']:.3f} (the machine's drift since calibration, "
                              "measured below; not fitted on these rows)", summary["drift_scaled"]))
    if summary.get("wall") and args.clock != "wall":
        lines.append(_metrics("all, against wall seconds (what a busy machine adds: not modelled)", summary["wall"]))
    if machine:
        lines += ["", f"The machine's drift (measured): calibrate's reference steps ({_reference_steps()}), timed again "
                      "in a fresh process before each round of runs and after the last, took "
                      f"{machine['ratio']:.3f} x the calibration's seconds (median; {machine['low']:.3f} to "
                      f"{machine['high']:.3f} over {len(machine['probes'])} timings; > 1: the machine ran slower than "
                      "while it was calibrated).", "",
                  "| timing | " + " | ".join(f"{size} s (measured)" for size in machine["probes"][0]["now_s"])
                  + " | x calibration |", "| --- |" + " ---: |" * (len(machine["probes"][0]["now_s"]) + 1),
                  "| calibration | " + " | ".join(_seconds(s) for s in machine["probes"][0]["calibrated_s"].values())
                  + " | 1 |"]
        lines += [f"| {index + 1} | " + " | ".join(_seconds(s) for s in probe["now_s"].values())
                  + f" | {probe['ratio']:.3f} |" for index, probe in enumerate(machine["probes"])]
    if profile is not None:
        lines += ["", f"Device profile ({profile.source}, measured {profile.measured.get('date', '?')} in "
                      f"{profile.measured.get('seconds', '?')} s):", "",
                  "| rate | throughput (measured) | fixed cost per op (measured) |", "| --- | ---: | ---: |"]
        lines += [f"| {what} | {rate} | {fixed} |" for what, rate, fixed in rate_rows(profile)]
        recomputed = profile.host_s_per_recomputed_op
        lines += ["", f"A training step vs the rates above (measured): matmuls and attention x "
                      f"{profile.step_compute_factor * profile.step_contraction_factor:.2f}, other work but the "
                      f"optimizer (its own measured rate) x {profile.step_compute_factor * profile.step_non_matmul_factor:.2f}; "
                      + (f"host time of an op recomputed by checkpointing: {1e6 * recomputed:.1f} µs; "
                         if recomputed is not None else "")
                      + f"host time per op in a training step (measured): {1e6 * profile.host_s_per_op:.1f} µs "
                      f"(a bare dispatch: {1e6 * profile.measured.get('host_dispatch_s_per_op', 0):.1f} µs)."]
    return "\n".join(lines) + "\n"
