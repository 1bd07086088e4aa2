"""After the screen: the techniques whose effect is narrow, composed from a few exact
estimates instead of traced across the whole screen.

The fused loss and activation offload change memory and time in a few places (the logits,
the saved activations). Tracing each across the whole screen would multiply its cost, so
each is measured exactly on the best plan of each checkpointing choice (whether the blocks
keep their activations decides what offload can move): the memory it frees
per sample of the micro-batch and the factor it puts on the step time. Those are applied
to every screened plan of that checkpointing choice (a plan that did not fit may fit
now); the refined plans predicted to enter the top K are confirmed exactly, as the screen's
are. Neither technique changes the training math beyond float rounding."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from trainwise.common.errors import InputError
from trainwise.hardware import Device
from trainwise.planner.candidate import Candidate
from trainwise.planner.search import Evaluator, SearchResult, candidate_of, confirm, fits, rank_key
from trainwise.planner.space import Space
from trainwise.plan.plan import Plan


@dataclass(frozen=True)
class Refinement:
    """One technique: its name in notes, the knob changes, and when it applies to a plan."""

    name: str
    changes: dict
    applies: Callable[[Plan], bool]


@dataclass(frozen=True)
class Effect:
    """What a refinement did to one exactly estimated plan: bytes freed per sample of the
    micro-batch, and the factor on the step time."""

    freed_per_sample: float
    time_factor: float


REFINEMENTS = (
    Refinement("fused loss", {"loss": "fused"}, lambda p: p.loss == "default"),
    Refinement("activation offload", {"activation_offload": True}, lambda p: not p.activation_offload),
)


def refinements_for(space: Space) -> list[Refinement]:
    """The refinements whose knobs the user did not fix."""
    return [r for r in REFINEMENTS if not any(k in space.fixed for k in r.changes)]


def refine(result: SearchResult, space: Space, device: Device, evaluator: Evaluator, top: int) -> SearchResult:
    """`result` with refined plans that fit and rank in the top `top` added, its evaluation
    count and notes updated."""
    if not result.ranked or not result.timed:
        return result
    ranked, screened, evaluations, notes = list(result.ranked), list(result.screened), 0, list(result.notes)
    for refinement in refinements_for(space):
        effects, measured, refusal = _effects(refinement, ranked, screened, device, evaluator)
        evaluations += len(measured) + (refusal is not None)
        if refusal is not None:
            notes.append(f"{refinement.name} not searched: {refusal}")
            continue
        composed = [_refined(c, refinement, effects[c.plan.grad_ckpt]) for c in screened
                    if refinement.applies(c.plan) and c.plan.grad_ckpt in effects]
        worst = ranked[-1] if len(ranked) >= top else None
        hopeful = [c for c in composed if worst is None or rank_key(c, True) < rank_key(worst, True)]
        confirmed, count = confirm(hopeful, device, evaluator, result.usable_bytes, True, top)
        evaluations += count
        screened += composed
        ranked = sorted({c.plan: c for c in ranked + measured + confirmed if fits(c, result.usable_bytes)}.values(),
                        key=lambda c: rank_key(c, True))[:top]
    if refinements_for(space):
        notes.append("composed from exact estimates around the confirmed plans: "
                     + ", ".join(r.name for r in refinements_for(space)))
    return SearchResult(ranked=ranked, screened=screened, usable_bytes=result.usable_bytes, timed=True,
                        evaluations=result.evaluations + evaluations, notes=notes)


def _effects(refinement: Refinement, ranked: list[Candidate], screened: list[Candidate], device: Device,
             evaluator: Evaluator):
    """({grad_ckpt: Effect}, the exact candidates made, a refusal message or None). The base
    of each checkpointing choice is its best confirmed plan, else its best screened one
    (estimated exactly first: an effect is measured between two exact estimates)."""
    effects, made = {}, []
    for grad_ckpt in dict.fromkeys(c.plan.grad_ckpt for c in ranked + screened):
        pool = [c for c in ranked if c.plan.grad_ckpt == grad_ckpt and refinement.applies(c.plan)] or \
            sorted((c for c in screened if c.plan.grad_ckpt == grad_ckpt and refinement.applies(c.plan)),
                   key=lambda c: rank_key(c, True))
        if not pool:
            continue
        try:
            base = pool[0] if pool[0].exact else candidate_of(pool[0].plan, evaluator(pool[0].plan), device, exact=True)
            plan = base.plan.replace(**refinement.changes)
            exact = candidate_of(plan, evaluator(plan), device, exact=True)
        except InputError as refused:
            return {}, made, refused.message
        made += ([] if base is pool[0] else [base]) + [exact]
        effects[grad_ckpt] = Effect((base.memory_bytes - exact.memory_bytes) / base.plan.batch_size,
                                    exact.step_s / base.step_s)
    return effects, made, None


def _refined(candidate: Candidate, refinement: Refinement, effect: Effect) -> Candidate:
    """A screened candidate with the refinement's measured effect applied (composed, not exact)."""
    step = candidate.step_s * effect.time_factor
    memory = int(candidate.memory_bytes - effect.freed_per_sample * candidate.plan.batch_size)
    return replace(candidate, plan=candidate.plan.replace(**refinement.changes), memory_bytes=memory, step_s=step,
                   tokens_per_s=candidate.tokens_per_s / effect.time_factor,
                   samples_per_s=candidate.samples_per_s / effect.time_factor, exact=False,
                   mfu=candidate.mfu / effect.time_factor if candidate.mfu else candidate.mfu)
