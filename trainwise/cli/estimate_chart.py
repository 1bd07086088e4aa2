"""`estimate --chart FILE`: the memory anatomy of one step as a stacked bar (one per
pipeline rank under a layout) against the device's capacity, every byte predicted.

`anatomy_chart` is the data drawn (tested against the estimate's own numbers); `draw`
turns it into the PNG."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainwise.api.estimate import EstimateResult
from trainwise.cli.chart_file import pyplot, save_png
from trainwise.cli.render_estimate import PARTS
from trainwise.common.units import GIB, MIB

# Above the parts allocated at the peak: what the caching allocator holds unused, then
# device memory outside the allocator (CUDA context and kernels).
UNSPLIT = "rest of peak allocated (not split by part)"
CACHE = "allocator cache (reserved, unused)"
CONTEXT = "CUDA context"
REST_OF_RANK = "peak allocated (parts traced on rank 0 only)"
PART_COLOURS = ("tab:blue", "tab:cyan", "tab:orange", "tab:red", "tab:green", "tab:olive", "tab:purple", "goldenrod",
                "tab:pink", "tab:brown", "lightgrey", "dimgrey", "steelblue", "khaki")


@dataclass(frozen=True)
class Segment:
    """One part of a bar, in bytes (predicted)."""

    label: str
    nbytes: int


@dataclass(frozen=True)
class Bar:
    """One device's (or pipeline rank's) predicted memory at the step's peak, bottom to top."""

    label: str
    segments: tuple[Segment, ...]

    @property
    def total(self) -> int:
        return sum(s.nbytes for s in self.segments)


@dataclass(frozen=True)
class AnatomyChart:
    """The bars, and the device capacity in bytes (catalog; None when unknown, e.g. a CPU)."""

    title: str
    bars: tuple[Bar, ...]
    capacity_bytes: int | None
    device: str


def anatomy_chart(result: EstimateResult) -> AnatomyChart:
    """The estimate as bars: its parts live at the peak, the allocator's cache and the
    context; each bar sums to the predicted device total."""
    memory = result.memory
    parts = [Segment(label, memory.at_peak.get(key, 0)) for key, label, _ in PARTS if memory.at_peak.get(key, 0)]
    # Block extrapolation fits the peak and its parts apart, so they can differ by a little.
    unsplit = memory.peak_allocated - sum(s.nbytes for s in parts)
    above = [Segment(UNSPLIT, max(0, unsplit)),
             Segment(CACHE, memory.peak_reserved - memory.peak_allocated),
             Segment(CONTEXT, memory.device_total - memory.peak_reserved)]
    first = Bar("rank 0" if result.layout else result.device.name, tuple(parts + [s for s in above if s.nbytes]))
    bars = [first] + _other_pipeline_ranks(result)
    plan = result.plan
    title = (f"{result.model}: batch {plan.batch_size} x seq {plan.seq_len}, {plan.precision}, "
             f"{plan.optim}\non {result.device.name} (predicted)")
    if result.layout:
        title += f", layout {result.layout['description']}"
    return AnatomyChart(title, tuple(bars), result.device.memory_bytes, result.device.name)


def _other_pipeline_ranks(result: EstimateResult) -> list[Bar]:
    """Pipeline ranks after rank 0: their predicted peak allocated and, above it, the rest
    of their device total (their parts are not broken down)."""
    if not result.layout:
        return []
    bars = []
    for rank in result.layout["pipeline_ranks"][1:]:
        segments = (Segment(REST_OF_RANK, rank["peak_allocated"]),
                    Segment(f"{CACHE} + {CONTEXT}", rank["device_total"] - rank["peak_allocated"]))
        bars.append(Bar(f"pipeline rank {rank['pipeline_rank']}", segments))
    return bars


def draw(chart: AnatomyChart, path: str | Path) -> Path:
    plt = pyplot()
    highest = max([b.total for b in chart.bars] + [chart.capacity_bytes or 0])
    unit, scale = ("GiB", GIB) if highest >= GIB else ("MiB", MIB)
    figure, axis = plt.subplots(figsize=(max(8.5, 2.0 * len(chart.bars) + 6.5), 5.5))
    colours = dict(zip(dict.fromkeys(s.label for b in chart.bars for s in b.segments), PART_COLOURS * 2))
    for x, bar in enumerate(chart.bars):
        bottom = 0.0
        for segment in bar.segments:
            axis.bar(x, segment.nbytes / scale, 0.6, bottom=bottom, color=colours[segment.label], label=segment.label)
            bottom += segment.nbytes / scale
        axis.annotate(f"{bar.total / scale:,.2f} {unit}", (x, bar.total / scale), ha="center", va="bottom", fontsize=9)
    if chart.capacity_bytes:
        axis.axhline(chart.capacity_bytes / scale, color="black", linestyle="--",
                     label=f"{chart.device} capacity ({chart.capacity_bytes / scale:,.2f} {unit}, catalog)")
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    axis.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axis.set_xticks(range(len(chart.bars)), [b.label for b in chart.bars])
    axis.set_xlim(-0.7, len(chart.bars) - 0.3)
    axis.set_ylabel(f"device memory at the step's peak ({unit}, predicted)")
    axis.set_title(chart.title, fontsize=10)
    return save_png(figure, path)
