"""The search: screen every plan of a Space cheaply, confirm the best few exactly, rank.

An `Evaluator` (plan -> Measure) is the only way the search learns anything about a plan;
`trainwise/api/search.py` passes one backed by the estimator, the tests pass formulas. The
screen traces a few combinations of the trace knobs (see `variant_points`) and composes every (micro-batch, accumulation) from them (search/compose.py). The best fitting
plans are then evaluated exactly; one that misses memory removes every larger micro-batch of
its kind from the screen, so the search steps down to the next size."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from trainwise.common.errors import InputError
from trainwise.common.progress import Progress, silent
from trainwise.hardware import Device
from trainwise.search import ties
from trainwise.search.candidate import Candidate
from trainwise.search.compose import Measure, composed
from trainwise.search.space import TRACE_KNOBS, Space, math_changes
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan

Evaluator = Callable[[Plan], Measure]
DEFAULT_MARGIN = 0.05
# The larger traced micro-batch; the smaller is about a quarter of it.
TRACED_MICRO_BATCH = 8
# Exact evaluations beyond the K shown (a plan that misses costs one).
SPARE_CONFIRMATIONS = 4
SCREENING = "screening plans (traced estimates)"
CONFIRMING = "confirming the best plans (exact estimates)"


@dataclass
class SearchResult:
    """ranked: the confirmed plans that fit, best first (at most K). screened: every
    composed candidate (fitting or not). usable_bytes: capacity x (1 - margin), None when
    the capacity is unknown (no fit filter). timed: ranked by predicted tokens/s (else by
    micro-batch, then memory, and said so)."""

    ranked: list[Candidate]
    screened: list[Candidate]
    usable_bytes: int | None
    timed: bool
    evaluations: int
    notes: list[str] = field(default_factory=list)


class TraceCache:
    """Evaluations at accumulation 1, by (trace knobs, micro-batch); a refused plan (the
    evaluator raised InputError) is remembered as None with its reason."""

    def __init__(self, evaluator: Evaluator, base: Plan):
        self.evaluator, self.base = evaluator, base
        self.points: dict[tuple, Measure | None] = {}
        self.refusals: dict[tuple, str] = {}

    def at(self, variant: dict, micro_batch: int) -> Measure | None:
        key = (tuple(sorted(variant.items())), micro_batch)
        if key not in self.points:
            try:
                self.points[key] = self.evaluator(self.base.replace(**variant, batch_size=micro_batch, grad_accum=1))
            except InputError as refused:
                self.points[key], self.refusals[key[0]] = None, str(refused)
        return self.points[key]


def refusal_notes(cache: TraceCache) -> list[str]:
    """One note per reason the evaluator refused plans, naming what those plans share off the
    base plan as flags ("--attention flash --precision tf32"), not as a dictionary per plan."""
    by_reason: dict[str, list[dict]] = {}
    for knobs, why in cache.refusals.items():
        by_reason.setdefault(why, []).append(dict(knobs))
    notes = []
    for why, plans in by_reason.items():
        shared = {k: v for k, v in plans[0].items() if all(p.get(k) == v for p in plans[1:])}
        off_base = {k: v for k, v in shared.items() if getattr(cache.base, k, None) != v} or shared
        flags = " ".join(ties.flag_text(k, v) for k, v in sorted(off_base.items()) if v is not False)
        count = f"{len(plans)} plans" if len(plans) > 1 else "a plan"
        notes.append(f"{count} with {flags or 'these settings'} not searched: {why}")
    return notes


def traced_sizes(space: Space) -> tuple[int, int]:
    """(low, high) micro-batches to trace: high the largest option <= TRACED_MICRO_BATCH,
    low the largest option <= high / 4 (equal when there is one option)."""
    sizes = sorted({mb for mb, _ in space.batches})
    high = max([s for s in sizes if s <= TRACED_MICRO_BATCH] or sizes[:1])
    low = max([s for s in sizes if s <= max(high // 4, 1)] or [high])
    return low, high


def screen(space: Space, device: Device, cache: TraceCache, progress: Progress = silent) -> list[Candidate]:
    """A composed Candidate for every variant and (micro-batch, accumulation) of the space."""
    candidates = []
    variants = space.variants()
    for done, variant in enumerate(variants):
        progress(done, len(variants), SCREENING)
        points = variant_points(space, cache, variant)
        if points is None:
            continue
        for micro_batch, accum in space.batches:
            measure = composed(*points, micro_batch, accum)
            plan = space.base.replace(**variant, batch_size=micro_batch, grad_accum=accum)
            candidates.append(candidate_of(plan, measure, device, exact=False))
    progress(len(variants), len(variants), SCREENING)
    return candidates


def variant_points(space: Space, cache: TraceCache, variant: dict):
    """((low, Measure), (high, Measure)) of a variant, or None when the estimate refused it.

    Traced: the rows-dependent line once per precision, checkpointing and attention kernel
    (with the first optimizer, no LoRA) at two sizes. Another optimizer or LoRA moves that
    line by a difference traced once per precision, on the first checkpointing and attention
    choice: they change the model states and the update, which do not depend on what the
    forward keeps (the exact confirmation corrects what this misses)."""
    low, high = traced_sizes(space)
    first = {name: values[0] for name, values in space.choices.items()}
    line = {**variant, "optim": first["optim"], "lora_rank": first["lora_rank"]}
    needed = [cache.at(line, low), cache.at(line, high)]
    moved = variant != line
    if moved:
        reference = {**variant, "grad_ckpt": first["grad_ckpt"], "attention": first["attention"]}
        needed += [cache.at(reference, high),
                   cache.at({**reference, "optim": first["optim"], "lora_rank": first["lora_rank"]}, high)]
    if any(m is None for m in needed):
        return None
    line_low, line_high = needed[:2]
    own_high = _plus_difference(line_high, needed[2], needed[3]) if moved else line_high
    own_low = own_high if low == high else _plus_difference(own_high, line_low, line_high)
    return (low, own_low), (high, own_high)


def _plus_difference(base: Measure, minuend: Measure, subtrahend: Measure) -> Measure:
    """base + (minuend - subtrahend), field by field (memory, time, breakdown, ideal time)."""
    def moved(mine, plus, minus):
        if mine is None or plus is None or minus is None:
            return None
        return mine + (plus - minus)
    names = set(base.breakdown) | set(minuend.breakdown) | set(subtrahend.breakdown)
    return Measure(memory_bytes=base.memory_bytes + minuend.memory_bytes - subtrahend.memory_bytes,
                   step_s=moved(base.step_s, minuend.step_s, subtrahend.step_s),
                   breakdown={n: moved(base.breakdown.get(n, 0.0), minuend.breakdown.get(n, 0.0),
                                       subtrahend.breakdown.get(n, 0.0)) for n in names},
                   ideal_s=moved(base.ideal_s, minuend.ideal_s, subtrahend.ideal_s))


def candidate_of(plan: Plan, measure: Measure, device: Device, *, exact: bool) -> Candidate:
    """The Candidate of a plan from its Measure (throughput over all data-parallel replicas)."""
    samples = plan.batch_size * plan.grad_accum * data_parallel_of(plan)
    step = measure.step_s
    return Candidate(plan=plan, memory_bytes=measure.memory_bytes, step_s=step if step is not None else math.nan,
                     tokens_per_s=samples * plan.seq_len / step if step else math.nan,
                     samples_per_s=samples / step if step else math.nan, mfu=measure.mfu,
                     breakdown=dict(measure.breakdown), exact=exact, changes_math=math_changes(plan, device))


def rank_key(candidate: Candidate, timed: bool):
    """Best first: highest predicted tokens/s. Without a time prediction there is no speed to
    rank by; the order is then the largest micro-batch, without recomputation, not eager
    attention, then the least memory (said so wherever it is shown)."""
    if timed:
        return (-candidate.tokens_per_s, candidate.memory_bytes)
    plan = candidate.plan
    return (-plan.batch_size, plan.grad_ckpt, plan.attention == "eager", candidate.memory_bytes)


def fits(candidate: Candidate, usable_bytes: int | None) -> bool:
    return usable_bytes is None or candidate.memory_bytes <= usable_bytes


def search(space: Space, device: Device, evaluator: Evaluator, *, capacity_bytes: int | None, top: int = 3,
           margin: float = DEFAULT_MARGIN, extra: list[Candidate] | None = None,
           own_screen: bool = True, progress: Progress = silent) -> SearchResult:
    """Screen, confirm and rank. `extra`: candidates screened elsewhere (the layouts of
    several GPUs), ranked and confirmed with these; `own_screen` False leaves the screen to them."""
    cache = TraceCache(evaluator, space.base)
    screened = (screen(space, device, cache, progress) if own_screen else []) + list(extra or [])
    usable = None if capacity_bytes is None else int(capacity_bytes * (1 - margin))
    timed = bool(screened) and all(not math.isnan(c.step_s) for c in screened)
    ranked, evaluations = confirm(screened, device, evaluator, usable, timed, top, progress)
    notes = refusal_notes(cache)
    return SearchResult(ranked=ranked, screened=screened, usable_bytes=usable, timed=timed,
                        evaluations=len(cache.points) + evaluations, notes=notes)


def confirm(screened: list[Candidate], device: Device, evaluator: Evaluator, usable: int | None, timed: bool,
            top: int, progress: Progress = silent) -> tuple[list[Candidate], int]:
    """Evaluate the best screened plans exactly (in the tie rule's order) until `top` fit; a plan that misses drops
    every screened plan of its kind with as large a micro-batch (the step down)."""
    pending = sorted((c for c in screened if fits(c, usable)), key=lambda c: rank_key(c, timed))
    confirmed: list[Candidate] = []
    evaluations = 0
    error = ties.measured_error(device.kind) if timed else None
    while pending and len(confirmed) < top and evaluations < top + SPARE_CONFIRMATIONS:
        progress(len(confirmed), top, CONFIRMING)
        # The simplest plan tied with the fastest is confirmed first: it is the one ranked first.
        best = ties.first(pending, error)
        pending = [c for c in pending if c.plan != best.plan]
        evaluations += 1
        # Its tie note stays: the faster plan it was preferred to may never be confirmed.
        exact = replace(candidate_of(best.plan, evaluator(best.plan), device, exact=True),
                        notes=tuple(n for n in best.notes if n.startswith(ties.TIE_NOTE)))
        if fits(exact, usable):
            confirmed.append(exact)
            continue
        kind = _kind(best.plan)
        pending = [c for c in pending if not (_kind(c.plan) == kind and c.plan.batch_size >= best.plan.batch_size)]
    progress(top, top, CONFIRMING)
    return ranking(confirmed, device, timed), evaluations


def ranking(candidates: list[Candidate], device: Device, timed: bool) -> list[Candidate]:
    """Best first by `rank_key`; with a time prediction, plans tied within the time model's
    measured error on this kind of device are ordered simplest first (search/ties.py)."""
    ordered = sorted(candidates, key=lambda c: rank_key(c, timed))
    return ties.order(ordered, ties.measured_error(device.kind)) if timed else ordered


def _kind(plan: Plan) -> tuple:
    """What makes plans 'of a kind': everything but the batch shape."""
    values = plan.to_dict()
    return tuple(sorted((k, v) for k, v in values.items() if k not in ("batch_size", "grad_accum")))


def smallest(screened: list[Candidate]) -> Candidate | None:
    """The screened plan predicted to need the least memory (for the nothing-fits message)."""
    return min(screened, key=lambda c: c.memory_bytes, default=None)


def data_parallel_of(plan: Plan) -> int:
    """Data-parallel replicas of the plan's layout (1 on one device)."""
    if not plan.is_distributed:
        return 1
    return resolve_layout(plan).data_parallel


__all__ = ["Evaluator", "SearchResult", "search", "screen", "confirm", "rank_key", "ranking", "fits", "smallest",
           "traced_sizes", "TRACE_KNOBS", "DEFAULT_MARGIN"]
