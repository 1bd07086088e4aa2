"""Why the main layout alternatives lost to the winner of a search over several GPUs: the
best plain DDP, ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-3 with CPU offload, tensor-parallel and
pipeline plan, each in one line, e.g.

    ZeRO-3: +18 % step time per sample (communication_exposed +0.31 s per step: FSDP2
    parameter all-gather over the inter-node link), predicted

Plans of one global batch do the same work per step, so their step times compare
directly; seconds per sample are used so that any two plans compare."""

from __future__ import annotations

from trainwise.common.units import human_bytes
from trainwise.search.candidate import Candidate
from trainwise.search.layout_screen import EXPOSED_NOTE
from trainwise.search.screen_and_confirm import data_parallel_of, fits
from trainwise.search.why_lost import best_of
from trainwise.plan.layout import resolve_layout

# The parts the layout adds; the others are the rank's compute (the screen does not split it).
LAYOUT_PARTS = ("optimizer", "communication_exposed", "pipeline_bubble", "offload")
FAMILIES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 + CPU offload", "tensor parallel", "pipeline parallel")


def family_of(candidate: Candidate) -> set[str]:
    """The layout families a plan belongs to (a TP plan with ZeRO-3 is in both)."""
    plan = candidate.plan
    layout = resolve_layout(plan)
    names = set()
    if layout.tp > 1:
        names.add("tensor parallel")
    if layout.pp > 1:
        names.add("pipeline parallel")
    if layout.cpu_offload:
        names.add("ZeRO-3 + CPU offload")
    elif layout.data_parallel_kind == "ddp" and layout.tp == layout.pp == 1:
        names.add("DDP")
    elif layout.zero in (1, 2, 3) and layout.data_parallel > 1:
        names.add(f"ZeRO-{layout.zero}")
    return names


def layout_alternatives(winner: Candidate, screened: list[Candidate], usable: int | None,
                        timed: bool) -> list[tuple[str, Candidate, str]]:
    """(family, its best plan, the line) for every family the winner is not in."""
    mine = family_of(winner)
    lines = []
    for family in FAMILIES:
        if family in mine:
            continue
        members = [c for c in screened if family in family_of(c)]
        if not members:
            continue
        best = best_of(members, usable, timed)
        lines.append((family, best, _line(family, winner, best, usable, timed)))
    return lines


def _line(family: str, winner: Candidate, other: Candidate, usable: int | None, timed: bool) -> str:
    if not fits(other, usable):
        return (f"{family}: does not fit: needs {human_bytes(other.memory_bytes)} of {human_bytes(usable)} usable "
                f"(predicted, {resolve_layout(other.plan).describe()})")
    if not timed:
        return f"{family}: fits ({human_bytes(other.memory_bytes)}, predicted); no time prediction to compare"
    slower = _per_sample(other) / _per_sample(winner) - 1
    return f"{family}: {slower * 100:+.0f} % step time per sample{_cause(winner, other)}, predicted"


def _per_sample(candidate: Candidate) -> float:
    return candidate.step_s / (candidate.plan.batch_size * candidate.plan.grad_accum * data_parallel_of(candidate.plan))


def _cause(winner: Candidate, other: Candidate) -> str:
    """' (communication_exposed +0.31 s per step: ... over the inter-node link)': the part
    of the step that grew most per sample, with the most exposed collective when it is
    communication."""
    def scaled(c: Candidate) -> dict[str, float]:
        samples = c.plan.batch_size * c.plan.grad_accum * data_parallel_of(c.plan)
        parts: dict[str, float] = {}
        for k, v in c.breakdown.items():
            if k != "communication_overlapped":  # the screen keeps compute as one part
                name = k if k in LAYOUT_PARTS else "compute"
                parts[name] = parts.get(name, 0.0) + v / samples
        return parts
    mine, theirs = scaled(winner), scaled(other)
    growth = {k: theirs.get(k, 0.0) - mine.get(k, 0.0) for k in set(mine) | set(theirs)}
    name = max(growth, key=growth.get, default=None)
    if name is None or growth[name] <= 0:
        return ""
    samples = other.plan.batch_size * other.plan.grad_accum * data_parallel_of(other.plan)
    what = next((n[len(EXPOSED_NOTE):] for n in other.notes if n.startswith(EXPOSED_NOTE)), None)
    detail = f": {what}" if name == "communication_exposed" and what else ""
    return f" ({name} +{growth[name] * samples:.3g} s per step{detail})"
