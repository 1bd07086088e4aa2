"""The estimate's predicted step time as a short table, or one line on why there is none."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.api.estimate import EstimateResult
from trainwise.hardware.profile import CATALOG_RATES

# Categories shown when they take time; communication_overlapped is not part of the step.
_LABELS = {"matmul": "matmul", "attention": "attention", "normalization": "normalization",
           "elementwise": "element-wise", "optimizer": "optimizer step", "recompute": "recomputation (checkpointing)",
           "host_overhead": "host/launch overhead", "data": "data (batch copy)",
           "communication_exposed": "communication (exposed)", "pipeline_bubble": "pipeline bubble",
           "offload": "offload transfers", "communication_overlapped": "communication (overlapped, not in step)"}


def render_step_time(result: EstimateResult, console: Console) -> None:
    time = result.time
    if time is None:
        how = "run trainwise calibrate on it, or pass --profile FILE"
        if result.device.kind == "cuda" and result.device.gpu is None:
            how = "name a catalog GPU with --device, or " + how
        console.print(f"predicted step time: none, no device profile for {result.device.name}: {how}")
        return
    source = CATALOG_RATES if time.source == "catalog" else f"profile {time.source}"
    table = Table(title=f"Predicted step time on {result.device.name} (seconds, predicted from the traced ops "
                        f"and the {source})", title_justify="left")
    for column, justify in (("part", "left"), ("seconds", "right"), ("share of step", "right")):
        table.add_column(column, justify=justify)
    step = time.step_s or 1.0
    for key, label in _LABELS.items():
        seconds = time.breakdown.get(key, 0.0)
        if seconds > 0:
            share = "" if key == "communication_overlapped" else f"{100 * seconds / step:.1f} %"
            table.add_row(label, f"{seconds:.4f}", share)
    table.add_section()
    table.add_row("[bold]one optimizer step[/]", f"{time.step_s:.4f}", "100.0 %")
    console.print(table)
    mfu = f"MFU {100 * time.mfu:.0f} % (of the catalog peak, predicted)" if time.mfu is not None else \
        "MFU not shown (no catalog peak)"
    console.print(f"predicted throughput: {_rates(time)}; {mfu}")
    _render_collectives(getattr(time, "collectives", ()), console)
    for note in time.notes:
        console.print(f"time note: {note}")


def _rates(time) -> str:
    """Tokens and samples per second, the job's and per GPU where the job has several."""
    job = f"{time.tokens_per_s:,.0f} tokens/s, {time.samples_per_s:,.2f} samples/s"
    if time.gpus == 1:
        return job + " (job of one device)"
    return (f"{job} (job, {time.gpus} GPUs); {time.tokens_per_s_per_gpu:,.0f} tokens/s, "
            f"{time.samples_per_s_per_gpu:,.2f} samples/s per GPU")


def _render_collectives(collectives, console: Console) -> None:
    """The layout's collectives of the slowest rank (predicted), one row each."""
    if not collectives:
        return
    table = Table(title="Collectives of the slowest rank per optimizer step (predicted)", title_justify="left")
    for column, justify in (("collective", "left"), ("purpose", "left"), ("MiB sent per rank", "right"),
                            ("link", "left"), ("exposed s", "right"), ("overlapped s", "right")):
        table.add_column(column, justify=justify)
    for c in collectives:
        table.add_row(c["name"], c["purpose"], f"{c['bytes'] / 2**20:,.2f}", c["link"], f"{c['exposed_s']:.4f}",
                      f"{c['overlapped_s']:.4f}")
    console.print(table)
