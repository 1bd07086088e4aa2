"""After the screen: the techniques whose effect is narrow, composed from a few exact
estimates instead of traced across the whole screen.

The fused loss, selective checkpointing, checkpointing every other block, activation
offload and Liger's kernels change memory and time in a few places (the logits, what a
checkpoint keeps, the saved activations, the norms' and MLPs' element-wise work). Tracing each across the whole screen would multiply its cost, so
each is measured exactly on the best plan of each checkpointing choice (whether the blocks
keep their activations decides what offload can move): the memory it frees
per sample of the micro-batch and the factor it puts on the step time. Those are applied
to every screened plan of that checkpointing choice (a plan that did not fit may fit
now); the refined plans predicted to enter the top K are confirmed exactly, as the screen's
are. The refinements apply one after another, so a later one also tries the plans an
earlier one made the best.

Compile (per block) is tried the same way: its estimate prices the compiled blocks' fused
kernels (trainwise/trace/fusion.py) and keeps the eager step's memory (an upper bound),
so it changes the time factor only. Float8 is tried after it, on compiled plans (a float8
run needs --compile), and only where the user allows it (`--allow float8`): it changes the
training math (float8 rounding of every converted matmul). The others change it by float
rounding at most."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from trainwise.common.errors import InputError
from trainwise.hardware import Device
from trainwise.hardware.installation import LIGER, TORCHAO, TRITON, Package, installed
from trainwise.search.candidate import Candidate
from trainwise.search.screen_and_confirm import Evaluator, SearchResult, candidate_of, confirm, fits, rank_key, ranking
from trainwise.search.space import NOT_HERE, Space
from trainwise.plan.plan import Plan
from trainwise.techniques.float8 import float8_plan_problem


@dataclass(frozen=True)
class Refinement:
    """One technique: its name in notes, the knob changes, when it applies to a plan, and
    whether it is worth trying given the best plan so far (`useful`) and on the target
    device (`runs_on`)."""

    name: str
    changes: dict
    applies: Callable[[Plan], bool]
    useful: Callable[[Plan], bool] = lambda best: True
    runs_on: Callable[[Device], bool] = lambda device: True
    allow: str | None = None  # the --allow value it needs (a technique that changes the math)
    # The package it runs on where the plan runs (left out under --installed-only when not here).
    package: Package | None = None
    # Whether the estimate traces that package itself, so it is needed here whatever the target.
    traced_with_package: bool = False


@dataclass(frozen=True)
class Effect:
    """What a refinement did to one exactly estimated plan: bytes freed per sample of the
    micro-batch, and the factor on the step time."""

    freed_per_sample: float
    time_factor: float


def liger_can_run(device: Device) -> bool:
    """Liger's Triton kernels need a CUDA target (and liger-kernel where the plan runs: the
    refinement's package). A family Liger does not patch is refused by the estimate, which
    the search then notes."""
    return device.kind == "cuda"


def compile_can_run(device: Device) -> bool:
    """CUDA GPUs, through Triton (the refinement's package). Not the CPU, though inductor
    compiles for it: there a compiled step measured mixed against eager (GPT-2 slower,
    docs/plan.md), and a cold compile of a minute outweighs the short runs a CPU is used
    for; `--compile` stays the user's to give."""
    return device.kind == "cuda"


def float8_can_run(device: Device) -> bool:
    """Float8 matmuls need compute capability 8.9+."""
    gpu = device.gpu
    return device.kind == "cuda" and gpu is not None and gpu.supports_float8


REFINEMENTS = (
    Refinement("fused loss", {"loss": "fused"}, lambda p: p.loss == "default"),
    # Checkpointing less, or moving what it keeps, can only beat a best plan that checkpoints:
    # against one that does not, each adds recomputation or copies for memory it does not need.
    Refinement("selective checkpointing", {"grad_ckpt_policy": "selective"},
               lambda p: p.grad_ckpt and p.grad_ckpt_policy == "full", lambda best: best.grad_ckpt),
    Refinement("checkpointing every 2nd block", {"grad_ckpt_every": 2},
               lambda p: p.grad_ckpt and p.grad_ckpt_every == 1, lambda best: best.grad_ckpt),
    Refinement("activation offload", {"activation_offload": True}, lambda p: not p.activation_offload,
               lambda best: best.grad_ckpt, runs_on=lambda device: device.kind != "cpu"),  # refused there
    # Estimated from a stand-in that keeps what Liger's kernels keep (techniques/liger_stand_in.py).
    Refinement("Liger kernels", {"kernels": "liger"}, lambda p: p.kernels == "none", runs_on=liger_can_run,
               package=LIGER),
    # Per block (the default scope); refused with --tp, so plans with it are left as they are.
    Refinement("compile", {"compile": True}, lambda p: not p.compile and p.tp == 1, runs_on=compile_can_run,
               package=TRITON),
    Refinement("float8", {"float8": True}, lambda p: p.compile and not p.float8 and float8_plan_problem(p) is None,
               runs_on=float8_can_run, allow="float8", package=TORCHAO, traced_with_package=True),
)


def _package_missing(refinement: Refinement, space: Space) -> bool:
    """Whether the refinement is left out for its package: one the estimate traces, or any
    under --installed-only, that is not installed here."""
    package = refinement.package
    return (package is not None and (refinement.traced_with_package or space.installed_only)
            and not installed(package.module))


def refinements_for(space: Space, device: Device) -> list[Refinement]:
    """The refinements whose knobs the user did not fix, that run on `device`, whose
    change of the math (if any) the user allowed, and whose package is here when it must be."""
    return [r for r in REFINEMENTS if not any(k in space.fixed for k in r.changes) and r.runs_on(device)
            and (r.allow is None or r.allow in space.allow) and not _package_missing(r, space)]


def not_allowed(space: Space, device: Device) -> list[str]:
    """Notes for the refinements left out only because they change the math, or because
    their package is not installed here (traced by the estimate, or --installed-only)."""
    notes = []
    for r in REFINEMENTS:
        if not r.runs_on(device) or any(k in space.fixed for k in r.changes):
            continue
        if r.allow is not None and r.allow not in space.allow:
            notes.append(f"{r.name} not searched: it changes the training math; add --allow {r.allow} to try it")
        elif _package_missing(r, space) and r.traced_with_package:
            notes.append(f"{r.name} not searched: its estimate traces {r.package.module}, which is not installed here "
                         f"(pip install '{r.package.pip}')")
        elif _package_missing(r, space):
            notes.append(f"{r.name} not searched: {NOT_HERE.format(need=r.package.need)}")
    return notes


def refine(result: SearchResult, space: Space, device: Device, evaluator: Evaluator, top: int) -> SearchResult:
    """`result` with refined plans that fit and rank in the top `top` added, its evaluation
    count and notes updated."""
    if not result.ranked or not result.timed:
        return result
    ranked, screened, evaluations, notes = list(result.ranked), list(result.screened), 0, list(result.notes)
    for refinement in refinements_for(space, device):
        if not refinement.useful(ranked[0].plan):
            notes.append(f"{refinement.name} not tried: the best plan does not checkpoint")
            continue
        effects, measured, refusal = _effects(refinement, ranked, screened, device, evaluator)
        evaluations += len(measured) + (refusal is not None)
        if refusal is not None:
            notes.append(f"{refinement.name} not searched: {refusal}")
            continue
        pairs = [(c, _refined(c, refinement, effects[c.plan.grad_ckpt])) for c in screened
                 if refinement.applies(c.plan) and c.plan.grad_ckpt in effects]
        composed = [refined for _, refined in pairs]
        # Only a refined plan predicted to beat the best, and by the technique, is confirmed (the
        # exact estimates are what the search time is made of); the effects' own exact plans join
        # the ranking as they are.
        hopeful = [refined for base, refined in pairs
                   if rank_key(refined, True) < rank_key(ranked[0], True) and _gains(base, refined, result.usable_bytes)]
        confirmed, count = confirm(hopeful, device, evaluator, result.usable_bytes, True, 1)
        evaluations += count
        screened += composed
        kept = {c.plan: c for c in ranked + measured + confirmed if fits(c, result.usable_bytes)}
        ranked = ranking(list(kept.values()), device, True)[:top]
    if refinements_for(space, device):
        notes.append("composed from exact estimates around the confirmed plans: "
                     + ", ".join(r.name for r in refinements_for(space, device)))
    notes.extend(not_allowed(space, device))
    return SearchResult(ranked=ranked, screened=screened, usable_bytes=result.usable_bytes, timed=True,
                        evaluations=result.evaluations + evaluations, notes=notes)


def _effects(refinement: Refinement, ranked: list[Candidate], screened: list[Candidate], device: Device,
             evaluator: Evaluator):
    """({grad_ckpt: Effect}, the exact candidates made, a refusal message or None). The base
    of each checkpointing choice is its best confirmed plan, else its best screened one."""
    effects, made = {}, []
    for grad_ckpt in dict.fromkeys(c.plan.grad_ckpt for c in ranked + screened):
        pool = [c for c in ranked if c.plan.grad_ckpt == grad_ckpt and refinement.applies(c.plan)] or \
            sorted((c for c in screened if c.plan.grad_ckpt == grad_ckpt and refinement.applies(c.plan)
                    and fits(c, None)), key=lambda c: rank_key(c, True))
        if not pool:
            continue
        base = pool[0]  # exact when confirmed, else composed (the confirmation corrects what that misses)
        try:
            plan = base.plan.replace(**refinement.changes)
            exact = candidate_of(plan, evaluator(plan), device, exact=True)
        except InputError as refused:
            return {}, made, refused.message
        made.append(exact)
        effects[grad_ckpt] = Effect((base.memory_bytes - exact.memory_bytes) / base.plan.batch_size,
                                    exact.step_s / base.step_s)
    return effects, made, None


def _gains(base: Candidate, refined: Candidate, usable: int | None) -> bool:
    """Whether the technique is what the refined plan would win by: it ranks above its plan
    without the technique, or fits where that one does not. A technique that makes a plan
    slower and fit no better (the fused loss where the logits were not what kept it out)
    leaves the plan without it predicted better still: whether that one beats the best is
    the screen's confirmation's question, not worth an exact estimate of the slower plan."""
    return rank_key(refined, True) < rank_key(base, True) or (fits(refined, usable) and not fits(base, usable))


def _refined(candidate: Candidate, refinement: Refinement, effect: Effect) -> Candidate:
    """A screened candidate with the refinement's measured effect applied (composed, not exact)."""
    step = candidate.step_s * effect.time_factor
    memory = int(candidate.memory_bytes - effect.freed_per_sample * candidate.plan.batch_size)
    # The breakdown scales with the step, so that a "why not" line naming the category that
    # grew most reads the refined plan's time, not its base's.
    breakdown = {k: v * effect.time_factor for k, v in candidate.breakdown.items()}
    return replace(candidate, plan=candidate.plan.replace(**refinement.changes), memory_bytes=memory, step_s=step,
                   breakdown=breakdown,
                   tokens_per_s=candidate.tokens_per_s / effect.time_factor,
                   samples_per_s=candidate.samples_per_s / effect.time_factor, exact=False,
                   mfu=candidate.mfu / effect.time_factor if candidate.mfu else candidate.mfu)
