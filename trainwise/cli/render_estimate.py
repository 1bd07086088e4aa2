"""The estimate as a table: the memory anatomy of one step, and whether it fits."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainwise.api.estimate import EstimateResult
from trainwise.cli.output import FROM_CACHE
from trainwise.cli.render_step_time import render_step_time
from trainwise.common.units import human_bytes, human_count
from trainwise.plan.technique_names import describe_checkpointing

# (key in MemoryEstimate, label, where the number comes from)
PARTS = (
    ("weights", "weights", "predicted"),
    ("buffers", "buffers", "predicted"),
    ("gradients", "gradients", "predicted"),
    ("optimizer", "optimizer states", "predicted"),
    ("activations", "activations (saved)", "predicted"),
    ("temporary", "temporaries (at peak)", "predicted"),
    ("workspace", "cuBLAS workspace", "catalog"),
    ("communication", "communication buffers", "predicted (layout rule)"),
)


def render_estimate(result: EstimateResult, console: Console, by_module: bool = False) -> None:
    memory = result.memory
    console.print(_headline(result))
    if result.from_cache:
        console.print(FROM_CACHE, highlight=False)
    where = "rank 0" if result.layout else "one device"
    table = Table(title=f"Memory of one training step on {where} (bytes, predicted unless marked)",
                  title_justify="left")
    # At 80 columns: labels wrap between words (never cut inside one), numbers stay whole,
    # the source column takes what is left.
    table.add_column("part", min_width=max(len(word) for _, label, _ in PARTS for word in label.split()))
    for column in ("size", "B/param", "% of peak", "at peak"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("source", min_width=9)
    peak = memory.peak_allocated or 1
    for key, label, source in PARTS:
        value = getattr(memory, key)
        if key in ("buffers", "workspace", "communication") and value == 0:
            continue
        live = memory.at_peak.get(key, 0)
        table.add_row(label, human_bytes(value), f"{value / max(result.params, 1):.2f}",
                      f"{100 * live / peak:.1f} %", human_bytes(live), source)
    table.add_section()
    reserved_note = "caching allocator model" if result.device.kind == "cuda" else "cpu: no cache"
    # Compiled plans are traced eager: an upper bound (docs/estimate.md, "Compiled steps").
    bound = ", eager step: an upper bound under --compile" if result.plan.compile else ""
    table.add_row("[bold]peak allocated[/]", human_bytes(memory.peak_allocated),
                  f"{memory.peak_allocated / max(result.params, 1):.2f}", "100.0 %", "",
                  f"predicted, peak in {memory.peak_phase}{bound}")
    table.add_row("peak reserved", human_bytes(memory.peak_reserved), "", "", "", f"predicted ({reserved_note})")
    if result.device.kind == "cuda":
        table.add_row("CUDA context", human_bytes(memory.context), "", "", "", result.device.context_source)
    table.add_row("[bold]device total[/]", human_bytes(memory.device_total), "", "", "",
                  "predicted (what nvidia-smi shows)" if result.device.kind == "cuda" else "predicted (tensor memory)")
    if memory.host:
        table.add_row("host memory (offloaded)", human_bytes(memory.host), "", "", "",
                      "predicted, not on the device")
    console.print(table)
    if result.layout and len(result.layout["pipeline_ranks"]) > 1:
        console.print(_pipeline_table(result))
    console.print(_fit_line(result))
    render_step_time(result, console)
    for note in result.notes:
        console.print(f"note: {note}")
    if by_module:
        console.print(_module_table(result))


def _headline(result: EstimateResult) -> str:
    plan = result.plan
    knobs = [f"batch {plan.batch_size} x accum {plan.grad_accum}", f"seq {plan.seq_len}", plan.precision, plan.optim,
             f"attention {plan.attention}"]
    if plan.grad_ckpt:
        knobs.append(describe_checkpointing(plan))
    if plan.lora:
        knobs.append(f"LoRA r={plan.lora_rank}")
    traced = f"; traced {result.traced_text} blocks, extrapolated" if result.traced_blocks else ""
    layout = f"\nlayout: {result.layout['description']}, shown for rank 0" if result.layout else ""
    return (f"[bold]{result.model}[/] ({result.task}): {result.params:,} parameters "
            f"({human_count(result.trainable_params)} trainable){traced}\n"
            f"plan: {', '.join(knobs)}{layout}\n"
            f"device: {result.device.name} ({result.device.source})")


def _pipeline_table(result: EstimateResult) -> Table:
    most = result.layout["most_loaded_pipeline_rank"]
    table = Table(title="Each pipeline rank (its data-parallel and tensor-parallel rank 0; bytes, predicted)",
                  title_justify="left")
    for column in ("pipeline rank", "blocks", "holds", "chunks in flight", "peak allocated", "device total"):
        table.add_column(column, justify="left" if column == "holds" else "right")
    for rank in result.layout["pipeline_ranks"]:
        holds = ", ".join(name for name, on in (("embedding", rank["embedding"]), ("head", rank["head"])) if on)
        label = str(rank["pipeline_rank"]) + (" (most loaded)" if rank["pipeline_rank"] == most else "")
        table.add_row(label, str(rank["blocks"]), holds or "-", str(rank["chunks_in_flight"]),
                      human_bytes(rank["peak_allocated"]), human_bytes(rank["device_total"]))
    return table


def _fit_line(result: EstimateResult) -> str:
    capacity = result.device.memory_bytes
    total = result.memory.device_total
    if capacity is None:
        if result.device.kind == "cpu":
            return "fit: not judged on cpu (host memory); name a GPU with --device to check a fit"
        return "fit: unknown GPU capacity; name one with --device (e.g. --device A100-80GB)"
    if total <= capacity:
        return (f"[green]fits[/] {result.device.name}: {human_bytes(total)} of {human_bytes(capacity)} "
                f"({100 * total / capacity:.0f} %, catalog capacity), {human_bytes(capacity - total)} to spare")
    return (f"[red]does not fit[/] {result.device.name}: needs {human_bytes(total)}, has {human_bytes(capacity)} "
            f"(catalog); misses by {human_bytes(total - capacity)}")


def _module_table(result: EstimateResult) -> Table:
    title = "Activations saved for backward, by the module that produced them (bytes, predicted)"
    if result.traced_blocks:
        title += f"; blocks of the {result.traced_blocks[1]}-block trace shown, " + (
            f"each of the {result.total_blocks} holds the same" if len(result.traced_blocks) == 2
            else f"the {result.total_blocks} differ by layer kind")
    table = Table(title=title, title_justify="left")
    table.add_column("module")
    table.add_column("saved", justify="right")
    # Of the whole model's activations (every block), not of the traced ones: a head's share
    # of a 2-block trace would read several times its share of a 16-block model.
    table.add_column("share of all activations", justify="right")
    total = result.memory.activations or sum(result.activations_by_module.values()) or 1
    for module, nbytes in sorted(result.activations_by_module.items(), key=lambda kv: -kv[1])[:40]:
        table.add_row(module, human_bytes(nbytes), f"{100 * nbytes / total:.1f} %")
    return table
