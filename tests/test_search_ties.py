"""The tie rule: plans whose predicted speeds differ by less than the time model's measured
error are tied, and the simpler plan is ranked first, saying so; the error is the figure
benchmarks/tie_error.py reads from the committed results."""

from __future__ import annotations

import io
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from trainwise.hardware import resolve_device
from trainwise.plan import Plan
from trainwise.search import ties
from trainwise.search.compose import Measure
from trainwise.search.screen_and_confirm import candidate_of, search
from trainwise.search.space import build_space, parse_allow

REPO = Path(__file__).resolve().parent.parent
GIB = 2 ** 30
H100 = resolve_device("H100")


def test_the_error_the_planner_reads_is_what_the_script_gives_from_the_committed_results():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import tie_error

    assert tie_error.main(["--check"]) == 0, "run python benchmarks/tie_error.py"
    cpu = tie_error.figures()["cpu"]
    assert ties.measured_error("cpu") == cpu["error_pct"] / 100 and cpu["plans"] >= 12
    assert ties.measured_error("no such kind") is None


def test_the_error_within_groups_takes_out_what_a_group_shares():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import tie_error

    # Group a is 2x slower than predicted throughout: no error in its order; b is off by 10 %.
    rows = [("a", 1.0, 2.0), ("a", 2.0, 4.0), ("a", 3.0, 6.0), ("b", 1.0, 1.0), ("b", 1.0, 1.1), ("b", 1.0, 0.9)]
    assert tie_error.error_within_groups(rows) == {"error_pct": 0.0, "plans": 6, "groups": 2}
    assert tie_error.error_within_groups(rows[3:])["error_pct"] == 10.0
    assert tie_error.error_within_groups(rows[:2]) is None  # too few plans to judge a group by


def attention_formula(lead: float):
    """Every plan the same but the attention kernel: eager `lead` (a fraction) faster."""
    def formula(plan: Plan) -> Measure:
        step = 1.0 * plan.batch_size * plan.grad_accum * (1.0 + (0.5 if plan.grad_ckpt else 0) + (plan.precision != "bf16"))
        step /= (1 + lead) if plan.attention == "eager" else 1.0
        return Measure(memory_bytes=GIB, step_s=step, breakdown={"matmul": step})
    return formula


def _search(lead: float):
    base = Plan.from_dict({"device": "H100", "seq_len": 1024})
    space = build_space(base, frozenset({"device", "seq_len"}), H100, parse_allow(""), 8, flash_refusal="no")
    return search(space, H100, attention_formula(lead), capacity_bytes=80 * GIB, top=3)


def test_a_faster_plan_within_the_measured_error_loses_to_the_simpler_one_and_the_winner_says_so():
    error = ties.measured_error("cuda")
    result = _search(lead=error / 2)
    best = result.ranked[0]
    assert best.plan.attention == "sdpa"
    assert best.tokens_per_s < max(c.tokens_per_s for c in result.screened)
    note = next(n for n in best.notes if n.startswith("tied with"))
    assert "--attention eager" in note and f"±{error * 100:.1f} %" in note and "(0 against 1 techniques)" in note


def test_a_lead_beyond_the_measured_error_keeps_the_faster_plan_first():
    error = ties.measured_error("cuda")
    best = _search(lead=error * 1.5).ranked[0]
    assert best.plan.attention == "eager" and not best.notes


def _candidate(plan: Plan, step_s: float, device=H100):
    return candidate_of(plan, Measure(memory_bytes=GIB, step_s=step_s), device, exact=True)


def test_among_tied_plans_one_that_keeps_the_math_comes_before_one_with_fewer_techniques():
    plain = Plan.from_dict({"device": "H100", "seq_len": 128, "grad_ckpt": True, "attention": "eager"})
    lora = Plan.from_dict({"device": "H100", "seq_len": 128, "lora_rank": 8})  # 1 technique against 2, but LoRA
    slow = plain.replace(compile=True)
    ordered = ties.order([_candidate(lora, 1.0), _candidate(plain, 1.05), _candidate(slow, 2.0)], error=0.1)
    assert [c.plan for c in ordered] == [plain, lora, slow]
    assert "it keeps the training math" in ordered[0].notes[0] and not ordered[1].notes
    assert ties.order([_candidate(lora, 1.0), _candidate(plain, 1.05)], error=None)[0].plan == lora


def test_the_plan_table_prints_the_tie():
    from rich.console import Console

    from trainwise.cli.render_plan import render_plan

    result = _search(lead=ties.measured_error("cuda") / 2)
    report = SimpleNamespace(model="tiny-llama", device=H100, margin=0.05, seconds=1.0, why_lost=[],
                             space=SimpleNamespace(notes=[]), result=result)
    out = io.StringIO()
    render_plan(report, [None] * len(result.ranked), Console(file=out, width=300))
    assert re.search(r"^1: tied with the plan with .*--attention eager \(", out.getvalue(), flags=re.M)


def test_the_why_not_line_of_a_tied_faster_plan_says_it_lost_by_the_tie_and_it_stays_lost():
    from trainwise.search.why_lost import confirmed_alternatives

    lead = ties.measured_error("cuda") / 2
    result = _search(lead=lead)
    lines = confirmed_alternatives(result, result.screened, ("attention",), H100, attention_formula(lead))
    assert result.ranked[0].plan.attention == "sdpa"  # the faster alternative, confirmed, did not take the pick
    line = next(text for knob, _, text in lines if knob == "attention")
    assert line.startswith("eager attention: +") and "tied with the pick within the time model's measured" in line


def test_a_tie_note_naming_a_plan_now_ranked_above_is_dropped():
    # README's plan example: the plain plan, preferred earlier to the compiled one, said "ranked
    # above it as the simpler plan" while the compiled one (tied with a faster flash plan the
    # plain one is not tied with) was ranked first.
    error = ties.measured_error("cuda")
    base = Plan(device="H100", batch_size=4, seq_len=1024)
    plain = _candidate(base, 1.0)
    compiled = _candidate(base.replace(compile=True), 1 / (1 + error / 2))
    plain = ties.first([compiled, plain], error)
    assert plain.notes[0].startswith("tied with the plan with --compile ")
    flash = _candidate(base.replace(compile=True, attention="flash"), 1 / (1 + error * 1.5))
    ordered = ties.order([flash, compiled, plain], error)
    assert [c.plan for c in ordered] == [compiled.plan, flash.plan, plain.plan]
    assert ordered[0].notes[0].startswith("tied with the plan with --attention flash ")
    assert ordered[2].notes == ()
