"""`plan --chart FILE`: every plan the search screened as predicted memory against
predicted tokens/s, the capacity and the fit limit (capacity less the margin), the pick and
the alternatives labelled.

`plan_chart` is the data drawn (tested against the search's own numbers); `draw` turns it
into the PNG."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from trainwise.cli.chart_file import pyplot, save_png
from trainwise.common.units import GIB, MIB


@dataclass(frozen=True)
class Point:
    """One plan: predicted device total (bytes) and predicted speed (tokens/s, or the
    micro-batch where the device has no time prediction); label empty for a plain dot."""

    memory_bytes: int
    speed: float
    fits: bool
    label: str = ""


@dataclass(frozen=True)
class PlanChart:
    title: str
    speed_axis: str
    screened: tuple[Point, ...]  # composed from traced neighbours (the screen)
    ranked: tuple[Point, ...]  # confirmed by an exact estimate, best first: the pick is the first
    alternatives: tuple[Point, ...]  # the best plan of each technique the pick does not use
    capacity_bytes: int | None
    usable_bytes: int | None


def plan_chart(report) -> PlanChart:
    """The search's numbers as points (a PlanReport of trainwise.api.search)."""
    result = report.result
    usable = result.usable_bytes

    def point(candidate, label: str = "") -> Point:
        speed = candidate.tokens_per_s if result.timed else float(candidate.plan.batch_size)
        fits = usable is None or candidate.memory_bytes <= usable
        return Point(candidate.memory_bytes, speed, fits, label)

    ranked = tuple(point(c, "#1 (pick)" if rank == 1 else f"#{rank}") for rank, c in enumerate(result.ranked, 1))
    alternatives = tuple(point(c, f"why not {knob}") for knob, c, _ in report.why_lost
                         if not (result.timed and math.isnan(c.tokens_per_s)))
    screened = tuple(point(c) for c in result.screened if not (result.timed and math.isnan(c.tokens_per_s)))
    axis = ("tokens/s (predicted)" if result.timed
            else "micro-batch (no step-time prediction for this device: ranked by micro-batch)")
    title = (f"{report.model} on {report.device.name}: {len(result.screened)} plans screened, "
             f"global batch {report.space.global_batch} (predicted)")
    return PlanChart(title, axis, screened, ranked, alternatives, report.capacity_bytes, usable)


def draw(chart: PlanChart, path: str | Path) -> Path:
    plt = pyplot()
    points = chart.screened + chart.ranked + chart.alternatives
    highest = max([p.memory_bytes for p in points] + [chart.capacity_bytes or 0])
    unit, scale = ("GiB", GIB) if highest >= GIB else ("MiB", MIB)
    figure, axis = plt.subplots(figsize=(9, 5.5))
    for fits, colour, name in ((True, "tab:blue", "fits"), (False, "lightgrey", "does not fit")):
        chosen = [p for p in chart.screened if p.fits == fits]
        axis.scatter([p.memory_bytes / scale for p in chosen], [p.speed for p in chosen], s=14, color=colour,
                     label=f"screened plan, {name} (composed)")
    if chart.usable_bytes:
        axis.axvspan(0, chart.usable_bytes / scale, color="tab:green", alpha=0.07, label="fitting region")
        axis.axvline(chart.usable_bytes / scale, color="tab:green", linestyle=":", label="fit limit (capacity - margin)")
    if chart.capacity_bytes:
        axis.axvline(chart.capacity_bytes / scale, color="black", linestyle="--",
                     label=f"capacity ({chart.capacity_bytes / scale:,.2f} {unit}, catalog)")
    _labelled(axis, chart.alternatives, scale, "tab:orange", "s", "alternative (best without the pick's choice)")
    _labelled(axis, chart.ranked[1:], scale, "tab:purple", "D", "runner-up (exact estimate)")
    _labelled(axis, chart.ranked[:1], scale, "tab:red", "*", "pick (exact estimate)", size=220)
    axis.set_xlim(left=0)
    axis.set_xlabel(f"device memory of the fullest rank ({unit}, predicted)")
    axis.set_ylabel(chart.speed_axis)
    axis.set_title(chart.title, fontsize=10)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_png(figure, path)


def _labelled(axis, points, scale: float, colour: str, marker: str, name: str, size: float = 60) -> None:
    if not points:
        return
    axis.scatter([p.memory_bytes / scale for p in points], [p.speed for p in points], s=size, color=colour,
                 marker=marker, edgecolors="black", zorder=3, label=name)
    for index, p in enumerate(points):
        # Staggered, so plans predicted alike (the pick and its runners-up often are) stay readable.
        axis.annotate(p.label, (p.memory_bytes / scale, p.speed), textcoords="offset points",
                      xytext=(8, 4 - 10 * index), fontsize=7)
