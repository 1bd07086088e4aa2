"""The tie rule: plans whose predicted speeds differ by less than the step-time model's
measured error are tied, and the simpler one is ranked first.

The error is measured, not chosen: `tie_error.json` beside this file holds, per device
kind, the median error of one plan's predicted time relative to the other plans of its
model and sequence length, from the committed results (benchmarks/tie_error.py writes it;
tests/test_search_ties.py holds it to that script's output). Simpler: no change of the
training math first, then fewer techniques (the table's techniques column,
`plan/technique_names.py`), then the faster."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from trainwise.search.candidate import Candidate
from trainwise.plan.plan import Plan
from trainwise.plan.technique_names import techniques_of

TIE_NOTE = "tied with"


@lru_cache(maxsize=None)
def measured_error(device_kind: str) -> float | None:
    """The time model's measured error within one search on `device_kind` (a fraction), or
    None when no results measured it there (then no plans are tied)."""
    figures = json.loads((Path(__file__).with_name("tie_error.json")).read_text())["figures"]
    found = figures.get(device_kind)
    return found["error_pct"] / 100 if found else None


def simplicity(candidate: Candidate) -> tuple[bool, int]:
    return bool(candidate.changes_math), len(techniques_of(candidate.plan))


def tied(faster: Candidate, slower: Candidate, error: float) -> bool:
    """Whether `faster`'s predicted lead over `slower` is within the measured error."""
    return faster.tokens_per_s <= slower.tokens_per_s * (1 + error)


def first(ranked: list[Candidate], error: float | None) -> Candidate:
    """The simplest plan tied with `ranked[0]` (`ranked`: fastest first, not empty), with a
    note naming the faster plan it was preferred to (replacing an earlier tie note; one made
    where the faster plan was screened stays when that plan is not among those ranked now). Tied plans are a prefix of `ranked`, so
    the scan stops at the first plan out of the error."""
    fastest = ranked[0]
    if not error:
        return fastest
    chosen = fastest
    for candidate in ranked[1:]:
        if not tied(fastest, candidate, error):
            break
        if simplicity(candidate) < simplicity(chosen):  # equally simple: the faster stays
            chosen = candidate
    if chosen is fastest:
        return fastest
    return replace(chosen, notes=(*without_ties(chosen.notes), tie_note(chosen, fastest, error)))


def without_ties(notes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in notes if not n.startswith(TIE_NOTE))


def order(ranked: list[Candidate], error: float | None) -> list[Candidate]:
    """`ranked` (fastest first) with the tie rule applied: each place goes to the simplest
    plan tied with the fastest plan left."""
    left, out = list(ranked), []
    while left:
        chosen = first(left, error)
        left = [c for c in left if c.plan != chosen.plan]
        out.append(_stale_ties_dropped(chosen, out))
    return out


def _stale_ties_dropped(candidate: Candidate, above: list[Candidate]) -> Candidate:
    """`candidate` without a tie note (made in an earlier ranking) that names a plan ranked
    above it now: it says the candidate was ranked above that plan."""
    stale = {f"{TIE_NOTE} {difference(c.plan, candidate.plan)} " for c in above if c.plan != candidate.plan}
    notes = tuple(n for n in candidate.notes if not any(n.startswith(s) for s in stale))
    return candidate if notes == candidate.notes else replace(candidate, notes=notes)


def tie_note(chosen: Candidate, faster: Candidate, error: float) -> str:
    lead = (faster.tokens_per_s / chosen.tokens_per_s - 1) * 100
    why = ("it keeps the training math" if simplicity(chosen)[0] < simplicity(faster)[0]
           else f"{len(techniques_of(chosen.plan))} against {len(techniques_of(faster.plan))} techniques")
    return (f"{TIE_NOTE} {difference(faster.plan, chosen.plan)} ({lead:+.1f} % tokens/s predicted, within the "
            f"measured error ±{error * 100:.1f} %): ranked above it as the simpler plan ({why})")


def difference(other: Plan, mine: Plan) -> str:
    """`other` as the flags it differs from `mine` by, e.g. 'the plan with --optim adamw-fused'."""
    return "the plan with " + (" ".join(differing_flags(other, mine)) or "the same knobs")


def differing_flags(other: Plan, mine: Plan, ignore: tuple[str, ...] = ()) -> list[str]:
    """The flags of `other`'s knobs (but `ignore`) whose values differ from `mine`'s."""
    mine_values = mine.to_dict()
    return [flag_text(knob, value) for knob, value in other.to_dict().items()
            if knob not in ignore and mine_values.get(knob) != value]


def flag_text(knob: str, value) -> str:
    """'--compile', 'no --compile' or '--optim adamw' for a knob's value."""
    flag = "--" + knob.replace("_", "-")
    return flag if value is True else f"no {flag}" if value is False else f"{flag} {value}"
