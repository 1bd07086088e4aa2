"""One line per main alternative on why it lost to the winner, from the predictions' difference.

An alternative is the best plan that differs from the winner in one technique (checkpointing,
attention kernel, optimizer, precision, LoRA, or the layout) and in nothing else but the batch
shape; its line says that it does not fit (and by how much), or how much slower it is and
which part of the step makes the difference. Where no plan differs in that technique alone,
the best that differs in it is shown, with the other flags it differs by: a line must not
credit one technique with what another (compile, a kernel) does."""

from __future__ import annotations

import math

from trainwise.common.units import human_bytes
from trainwise.search.candidate import Candidate
from trainwise.search.screen_and_confirm import Evaluator, SearchResult, candidate_of, fits, rank_key, ranking
from trainwise.search.ties import differing_flags

# Rounds of exact estimates of the alternatives that read better than the winner: each round
# replaces them by their exact figures, and the group's next screened plan may then read better.
CONFIRM_ROUNDS = 6
LAYOUT_KNOBS = ("dp", "fsdp", "zero", "cpu_offload", "tp", "sequence_parallel", "pp", "pp_schedule", "microbatches")
# The knobs one alternative may differ in besides the batch shape: its technique's own settings.
KNOB_FAMILY = {
    "grad_ckpt": ("grad_ckpt", "grad_ckpt_policy", "grad_ckpt_every", "activation_offload"),
    "lora_rank": ("lora_rank", "lora_alpha", "lora_targets"),
    "layout": LAYOUT_KNOBS,
}
BATCH_SHAPE = ("batch_size", "grad_accum")


def technique_of(knob: str, candidate: Candidate) -> str:
    """How the alternative's technique reads in its line."""
    plan = candidate.plan
    if knob == "grad_ckpt":
        return "grad checkpointing" if plan.grad_ckpt else "no grad checkpointing"
    if knob == "attention":
        return f"{plan.attention} attention"
    if knob == "optim":
        return f"optimizer {plan.optim}"
    if knob == "precision":
        return f"precision {plan.precision}"
    if knob == "lora_rank":
        return f"LoRA rank {plan.lora_rank}" if plan.lora else "no LoRA"
    degrees = [f"{k} {getattr(plan, k)}" for k in LAYOUT_KNOBS if getattr(plan, k) not in (1, None, False)]
    return "layout " + (", ".join(degrees) or "one device")


def alternatives(winner: Candidate, screened: list[Candidate], usable: int | None, timed: bool,
                 knobs: tuple[str, ...]) -> list[tuple[str, Candidate, str]]:
    """(knob, the alternative, its line) for each knob with another value among `screened`."""
    lines = []
    for knob in knobs:
        key = _layout_key if knob == "layout" else (lambda c, k=knob: getattr(c.plan, k))
        others = [c for c in screened if key(c) != key(winner)]
        if not others:
            continue
        rest = _rest(winner.plan, knob)
        alone = [c for c in others if _rest(c.plan, knob) == rest]
        best = best_of(alone or others, usable, timed)
        lines.append((knob, best, why_lost(winner, best, usable, timed, knob)))
    return lines


def _rest(plan, knob: str) -> dict:
    """The plan's knobs but the batch shape and `knob`'s own settings."""
    own = KNOB_FAMILY.get(knob, (knob,))
    return {k: v for k, v in plan.to_dict().items() if k not in own and k not in BATCH_SHAPE}


def confirmed_alternatives(result: SearchResult, judged: list[Candidate], knobs: tuple[str, ...], device,
                           evaluator: Evaluator) -> list[tuple[str, Candidate, str]]:
    """`alternatives`, after estimating exactly every screened alternative that would read as
    better than the winner: a screen's figure is composed from neighbouring plans and can be
    optimistic (or fit where the plan does not), and a line must not say a plan is faster when
    its exact estimate says it is slower. One that is still better once exact joins the ranked
    plans, and wins unless the tie rule ranks the simpler winner first (`result` is updated)."""
    for _ in range(CONFIRM_ROUNDS):  # a new winner, or the next screened plan of a group, may read better
        winner = result.ranked[0]
        lines = alternatives(winner, judged, result.usable_bytes, result.timed, knobs)
        doubtful = [c for _, c, _ in lines if not c.exact and fits(c, result.usable_bytes)
                    and rank_key(c, result.timed) < rank_key(winner, result.timed)]
        if not doubtful:
            return lines
        exact = {c.plan: candidate_of(c.plan, evaluator(c.plan), device, exact=True) for c in doubtful}
        result.evaluations += len(exact)
        judged = [exact.get(c.plan, c) for c in judged]
        better = [c for c in exact.values() if fits(c, result.usable_bytes)]
        result.ranked = ranking([*result.ranked, *better], device, result.timed)[:len(result.ranked)]
    return alternatives(result.ranked[0], judged, result.usable_bytes, result.timed, knobs)


def best_of(candidates: list[Candidate], usable: int | None, timed: bool) -> Candidate:
    """The alternative a group is judged by: its best fitting plan, else its smallest."""
    fitting = [c for c in candidates if fits(c, usable)]
    return min(fitting, key=lambda c: rank_key(c, timed)) if fitting else min(candidates, key=lambda c: c.memory_bytes)


def why_lost(winner: Candidate, other: Candidate, usable: int | None, timed: bool, knob: str) -> str:
    """'grad checkpointing: -24 % tokens/s (recompute +0.21 s per step), predicted'."""
    label = technique_of(knob, other)
    if not fits(other, usable):
        return (f"{label}: does not fit: needs {human_bytes(other.memory_bytes)} of {human_bytes(usable)} usable "
                f"(predicted)")
    if not timed or math.isnan(other.tokens_per_s):
        return (f"{label}: fits ({human_bytes(other.memory_bytes)}, predicted) but allows micro-batch "
                f"{other.plan.batch_size} against {winner.plan.batch_size} (no time prediction)")
    loss = 1 - other.tokens_per_s / winner.tokens_per_s
    how = "predicted" if other.exact else "predicted by the screen, not confirmed"
    # A faster alternative that lost was tied with the simpler winner (confirmed_alternatives
    # made any other one the winner), or was still screened when the rounds ran out.
    tie = ("" if loss >= 0 else "; tied with the pick within the time model's measured error, and the pick is simpler"
           if other.exact else "; not estimated exactly, so not ranked")
    also = _also(winner, other, knob)
    return f"{label}{also}: {-loss * 100:+.1f} % tokens/s{_biggest_difference(winner, other)}, {how}{tie}"


def _also(winner: Candidate, other: Candidate, knob: str) -> str:
    """' (with --compile)': the other flags it differs by, where no plan differs in `knob` alone."""
    extra = differing_flags(other.plan, winner.plan, ignore=KNOB_FAMILY.get(knob, (knob,)) + BATCH_SHAPE)
    return f" (with {' '.join(extra)})" if extra else ""


def _biggest_difference(winner: Candidate, other: Candidate) -> str:
    """' (recompute +0.21 s per step)': the breakdown category that grew most, per sample
    so that plans of different batch shapes compare."""
    def per_sample(c: Candidate) -> dict[str, float]:
        samples = c.plan.batch_size * c.plan.grad_accum
        return {k: v / samples for k, v in c.breakdown.items()}
    mine, theirs = per_sample(winner), per_sample(other)
    growth = {k: theirs.get(k, 0.0) - mine.get(k, 0.0) for k in set(mine) | set(theirs)
              if k != "communication_overlapped"}
    if not growth:
        return ""
    name = max(growth, key=growth.get)
    if growth[name] <= 0:
        return ""
    samples = other.plan.batch_size * other.plan.grad_accum
    return f" ({name} +{growth[name] * samples:.3g} s per step)"


def _layout_key(candidate: Candidate) -> tuple:
    return tuple(getattr(candidate.plan, k) for k in LAYOUT_KNOBS)
