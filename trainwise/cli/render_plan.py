"""How `trainwise plan` shows its result: a table of the best plans, the alternatives' lines,
the plan files, and the same as one JSON object."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from trainwise.common.atomic import atomic_write_text
from trainwise.common.units import human_bytes

if TYPE_CHECKING:  # api/ is imported on use: its package imports the estimate (torch)
    from trainwise.api.emit import Launch
from trainwise.hardware.installation import missing_here
from trainwise.hardware.measured import legend, never_measured
from trainwise.plan.technique_names import techniques_of


def write_outputs(report, out_dir: str | None) -> list[str | None]:
    """Each shown plan as OUT/plan-N.yaml (atomically); the paths (None when not written)."""
    ranked = report.result.ranked
    if out_dir is None:
        return [None] * len(ranked)
    paths = []
    for rank, candidate in enumerate(ranked, 1):
        path = Path(out_dir) / f"plan-{rank}.yaml"
        header = (f"# trainwise plan {rank} for {report.model} on {report.device.name}: predicted "
                  f"{human_bytes(candidate.memory_bytes)} device total" + _time_phrase(candidate) + "\n")
        atomic_write_text(path, header + yaml.safe_dump(candidate.plan.to_dict(), sort_keys=False))
        paths.append(str(path))
    return paths


def _time_phrase(candidate) -> str:
    if math.isnan(candidate.step_s):
        return ""
    return f", {candidate.step_s:.3g} s per step, {candidate.tokens_per_s:,.0f} tokens/s (job)"


def _number(value, digits: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, digits)


def render_plan(report, paths: list[str | None], console, launch: Launch | None = None) -> None:
    """The table, then each plan's `trainwise train` line (per node for a plan of several nodes)."""
    from rich.table import Table

    result = report.result
    usable = human_bytes(result.usable_bytes) if result.usable_bytes is not None else "unknown"
    console.print(f"[bold]{report.model}[/bold] on {report.device.name}: {len(result.screened)} plans screened, "
                  f"{result.evaluations} estimates, {report.seconds:.1f} s; fit: predicted device total <= {usable} "
                  f"({report.margin * 100:.0f} % margin)")
    table = Table(show_header=True, header_style="bold")
    for column in ("#", "device memory (predicted)", "step (s, predicted)", "tokens/s (job, predicted)",
                   "tokens/s per GPU (predicted)", "MFU (predicted)", "techniques", "changes math"):
        # A narrow terminal folds the techniques rather than cut them (a cut would hide a †).
        table.add_column(column, overflow="fold" if column == "techniques" else "ellipsis")
    marked = False
    for rank, candidate in enumerate(result.ranked, 1):
        techniques, marks = _techniques(candidate, report.device)
        marked = marked or marks
        table.add_row(str(rank), human_bytes(candidate.memory_bytes), _number(candidate.step_s, ".3g"),
                      _number(candidate.tokens_per_s, ",.0f"), _number(candidate.tokens_per_s_per_gpu, ",.0f"),
                      "-" if candidate.mfu is None else f"{candidate.mfu * 100:.0f} %", techniques,
                      ", ".join(candidate.changes_math) or "no")
    console.print(table)
    if marked:
        console.print(legend(report.device))
    for rank, (candidate, path) in enumerate(zip(result.ranked, paths), 1):
        exact = "exact estimate" if candidate.exact else "composed"
        console.print(f"{rank}: {_train_flags(candidate.plan, launch or report.model)}  ({exact}"
                      + (f"; plan file {path})" if path else ")"), soft_wrap=True)
        for package in missing_here(candidate.plan, report.device.kind):
            console.print(f"   {package.flag} {package.need}", soft_wrap=True)
        for note in candidate.notes:  # a confirmed plan's notes: why it is ranked where it is (a tie)
            console.print(f"{rank}: {note}", soft_wrap=True)
    if not result.timed:
        console.print("ranked without a time prediction (no step-time model or device profile for this device): "
                      "largest micro-batch first, then without recomputation, not eager attention, least memory")
    for _, _, line in report.why_lost:
        console.print(f"why not {line}", soft_wrap=True)
    for note in (*report.space.notes, *result.notes):
        console.print(f"note: {note}")


def _techniques(candidate, device) -> tuple[str, bool]:
    """The plan's techniques for the table, each never measured on the device's class with
    a †; whether any was marked."""
    names = techniques_of(candidate.plan)
    unmeasured = never_measured(names, device) or ()
    return ", ".join(n + ("†" if n in unmeasured else "") for n in names) or "-", bool(unmeasured)


def candidate_json(candidate, model: str | Launch, path: str | None, device_kind: str) -> dict:
    nan_free = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in (("step_s", candidate.step_s), ("tokens_per_s", candidate.tokens_per_s),
                             ("samples_per_s", candidate.samples_per_s),
                             ("tokens_per_s_per_gpu", candidate.tokens_per_s_per_gpu),
                             ("samples_per_s_per_gpu", candidate.samples_per_s_per_gpu))}
    return {"plan": candidate.plan.to_dict(), "memory_bytes": candidate.memory_bytes, **nan_free,
            "gpus": candidate.gpus, "mfu": candidate.mfu, "breakdown": candidate.breakdown, "exact": candidate.exact,
            "source": "predicted", "changes_math": list(candidate.changes_math), "notes": list(candidate.notes),
            "flags": _train_flags(candidate.plan, model), "plan_file": path,
            "not_installed_here": [{"flag": p.flag, "module": p.module, "pip": p.pip}
                                   for p in missing_here(candidate.plan, device_kind)],
            "techniques": list(techniques_of(candidate.plan))}


def plan_json(report, paths: list[str | None], emitted, launch: Launch | None = None) -> dict:
    result = report.result
    data = {"model": report.model, "device": report.device.name, "capacity_bytes": report.capacity_bytes,
            "usable_bytes": result.usable_bytes, "memory_margin": report.margin,
            "global_batch": report.space.global_batch, "allow": sorted(report.space.allow),
            "fixed": sorted(report.space.fixed), "installed_only": report.space.installed_only,
            "ranked_by": "tokens_per_s" if result.timed else "micro_batch",
            "screened": len(result.screened), "estimates": result.evaluations, "search_s": report.seconds,
            "plans": [candidate_json(c, launch or report.model, p, report.device.kind)
                      for c, p in zip(result.ranked, paths)],
            "alternatives": [{"technique": knob, "line": line,
                              **candidate_json(c, launch or report.model, None, report.device.kind)}
                             for knob, c, line in report.why_lost],
            "notes": [*report.space.notes, *result.notes]}
    for plan in (*data["plans"], *data["alternatives"]):
        unmeasured = never_measured(tuple(plan["techniques"]), report.device)
        plan["never_measured_on_device_class"] = None if unmeasured is None else list(unmeasured)
    if emitted:
        data["emit"] = {"text": emitted[0], "cannot_express": emitted[1]}
    return data


def _train_flags(plan, model) -> str:
    """The plan's `trainwise train` line (api/ imported here, on use)."""
    from trainwise.api.emit import train_flags

    return train_flags(plan, model)
