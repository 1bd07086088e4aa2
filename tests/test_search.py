"""The plan search (trainwise/search/): what it tries, what it keeps, how it ranks.

Most tests inject an evaluator whose memory and time are known formulas, so the search's own
logic is checked without the estimator; one test checks the composition against exact
estimates of a small model."""

from __future__ import annotations

import pytest

from trainwise.api.search import estimate_evaluator
from trainwise.hardware import resolve_device
from trainwise.models import resolve_model
from trainwise.plan import Plan
from trainwise.common.errors import InputError
from trainwise.search import refine
from trainwise.search.compose import Measure, composed
from trainwise.search.screen_and_confirm import candidate_of, fits, search, traced_sizes
from trainwise.search.space import build_space, parse_allow
from trainwise.search.why_lost import alternatives

GIB = 2 ** 30
H100 = resolve_device("H100")
STATES = {"adamw": 16, "adamw-fused": 16, "adafactor": 9, "adamw-8bit": 10}  # GiB, full training
ROW_GIB = {"bf16": 1.0, "tf32": 2.0, "fp16": 1.0, "bf16-pure": 1.0}


@pytest.fixture(autouse=True)
def no_ties(monkeypatch):
    """These tests hold the ranking by predicted speed; the tie rule (plans within the time
    model's measured error, simplest first) is tests/test_search_ties.py's."""
    from trainwise.search import ties

    monkeypatch.setattr(ties, "measured_error", lambda kind: None)


def formula(plan: Plan) -> Measure:
    """A plan's memory and time as simple, linear formulas: activations grow with the
    micro-batch (eager attention 3x, checkpointing /5), checkpointing recomputes, the fused
    optimizer is faster, LoRA shrinks the states and the optimizer step."""
    states = (2 if plan.lora else STATES[plan.optim]) * GIB
    rows = ROW_GIB[plan.precision] * (3 if plan.attention == "eager" else 1) / (5 if plan.grad_ckpt else 1)
    per_sample = 0.02 * (2 if plan.precision == "tf32" else 1) * (1.2 if plan.attention == "eager" else 1)
    matmul = plan.batch_size * plan.grad_accum * per_sample
    recompute = matmul * 0.3 if plan.grad_ckpt else 0.0
    optimizer = 0.01 if plan.lora else (0.05 if plan.optim == "adamw-fused" else 0.08)
    breakdown = {"matmul": matmul, "recompute": recompute, "optimizer": optimizer}
    return Measure(memory_bytes=int(states + rows * GIB * plan.batch_size), step_s=sum(breakdown.values()),
                   breakdown=breakdown, ideal_s=matmul * 0.5)


class Counting:
    """The formula, counting the plans it was asked about."""

    def __init__(self, function=formula):
        self.function, self.plans = function, []

    def __call__(self, plan):
        self.plans.append(plan)
        return self.function(plan)


def space_for(fixed_values=None, allow="", global_batch=64, device=H100):
    fixed_values = {"device": device.name, "seq_len": 1024, **(fixed_values or {})}
    base = Plan.from_dict(fixed_values)
    return build_space(base, frozenset(fixed_values), device, parse_allow(allow), global_batch,
                       flash_refusal="not installed")


def test_a_fixed_flag_is_never_changed_in_any_plan_tried_or_shown():
    space = space_for({"attention": "eager", "optim": "adamw", "grad_ckpt": True})
    evaluator = Counting()
    result = search(space, H100, evaluator, capacity_bytes=80 * GIB)
    tried = evaluator.plans + [c.plan for c in result.screened + result.ranked]
    assert result.ranked
    assert {(p.attention, p.optim, p.grad_ckpt) for p in tried} == {("eager", "adamw", True)}


def test_techniques_that_change_the_math_are_tried_only_when_allowed_and_are_marked():
    plain = search(space_for(), H100, Counting(), capacity_bytes=80 * GIB)
    assert not any(c.plan.lora or c.plan.optim in ("adafactor", "adamw-8bit") or c.plan.precision in
                   ("fp16", "bf16-pure") for c in plain.screened)
    assert all(c.changes_math == () for c in plain.screened)
    allowed = search(space_for(allow="lora,adafactor"), H100, Counting(), capacity_bytes=80 * GIB)
    lora = [c for c in allowed.screened if c.plan.lora]
    assert lora and all("lora" in c.changes_math for c in lora)
    assert {c.plan.optim for c in allowed.screened} == {"adamw", "adamw-fused", "adafactor"}
    assert {c.plan.precision for c in allowed.screened} == {"bf16", "tf32"}  # fp16, bf16-pure not allowed


def test_only_plans_under_capacity_less_the_margin_are_ranked():
    capacity = 40 * GIB
    result = search(space_for(), H100, Counting(), capacity_bytes=capacity, margin=0.1, top=50)
    usable = int(capacity * 0.9)
    assert result.usable_bytes == usable
    assert result.ranked and all(c.memory_bytes <= usable for c in result.ranked)
    # Plans between the usable share and the full capacity exist, and were left out.
    squeezed = [c for c in result.screened if usable < c.memory_bytes <= capacity]
    assert squeezed and not {c.plan for c in squeezed} & {c.plan for c in result.ranked}


def test_the_ranking_is_by_predicted_tokens_per_s_and_matches_a_brute_force_search():
    result = search(space_for(), H100, Counting(), capacity_bytes=40 * GIB, top=3)
    speeds = [c.tokens_per_s for c in result.ranked]
    assert speeds == sorted(speeds, reverse=True) and all(c.exact for c in result.ranked)
    usable = result.usable_bytes
    brute = [candidate_of(c.plan, formula(c.plan), H100, exact=True) for c in result.screened]
    best = max((c for c in brute if c.memory_bytes <= usable), key=lambda c: c.tokens_per_s)
    assert result.ranked[0].tokens_per_s == pytest.approx(best.tokens_per_s)


def test_accumulation_reaches_the_global_batch_exactly():
    space = space_for(global_batch=48)
    result = search(space, H100, Counting(), capacity_bytes=80 * GIB)
    assert {c.plan.batch_size for c in result.screened} == {1, 2, 3, 4, 6, 8, 12, 16, 24, 48}
    assert all(c.plan.batch_size * c.plan.grad_accum == 48 for c in result.screened + result.ranked)


def test_the_screen_traces_few_plans_and_composes_the_rest_exactly_for_linear_figures():
    evaluator = Counting()
    result = search(space_for(), H100, evaluator, capacity_bytes=80 * GIB)
    assert len(set(evaluator.plans)) <= 24 < len(result.screened)
    for candidate in result.screened[::7]:
        exact = formula(candidate.plan)
        assert candidate.memory_bytes == pytest.approx(exact.memory_bytes, rel=1e-6)
        assert candidate.step_s == pytest.approx(exact.step_s, rel=1e-6)


def test_a_plan_that_misses_when_confirmed_steps_down_to_a_smaller_micro_batch():
    """Memory that grows faster than the line (quadratic): the screen is optimistic for large
    micro-batches; the exact check rejects them and the shown plans all fit exactly."""
    def curved(plan):
        measure = formula(plan)
        return Measure(measure.memory_bytes + int(0.05 * GIB * plan.batch_size ** 2), measure.step_s,
                       measure.breakdown, measure.ideal_s)
    result = search(space_for(), H100, Counting(curved), capacity_bytes=40 * GIB, top=2)
    assert result.ranked and all(c.exact and curved(c.plan).memory_bytes <= result.usable_bytes
                                 for c in result.ranked)


def test_why_lost_names_the_step_time_cost_or_the_missing_memory():
    result = search(space_for(), H100, Counting(), capacity_bytes=30 * GIB)
    winner = result.ranked[0]
    lines = {knob: line for knob, _, line in alternatives(winner, result.screened, result.usable_bytes,
                                                          result.timed, ("grad_ckpt", "attention", "optim"))}
    assert not winner.plan.grad_ckpt and lines["grad_ckpt"].startswith("grad checkpointing: -")
    assert "recompute +" in lines["grad_ckpt"] and "% tokens/s" in lines["grad_ckpt"]
    assert lines["optim"].startswith("optimizer adamw: -") and "optimizer +" in lines["optim"]
    assert lines["attention"].startswith("eager attention: ")


def test_an_alternative_that_fits_nowhere_says_how_much_it_needs():
    space = space_for({"batch_size": 16, "grad_ckpt": False}, global_batch=None)
    result = search(space, H100, Counting(), capacity_bytes=40 * GIB)
    (_, other, line), = alternatives(result.ranked[0], result.screened, result.usable_bytes, True, ("attention",))
    assert not fits(other, result.usable_bytes)
    assert line.startswith("eager attention: does not fit: needs ") and "GiB usable" in line


@pytest.mark.slow
def test_composed_memory_matches_exact_estimates_of_a_small_model():
    """The screen's line through two traced micro-batches against exact estimates of
    tiny-llama (CPU: bytes as asked, no allocator rounding)."""
    evaluate = estimate_evaluator(resolve_model("tiny-llama"))
    base = Plan(device="cpu", seq_len=64)
    low, high = 2, 8
    points = (low, evaluate(base.replace(batch_size=low))), (high, evaluate(base.replace(batch_size=high)))
    for micro_batch in (4, 16):
        exact = evaluate(base.replace(batch_size=micro_batch)).memory_bytes
        assert composed(*points, micro_batch, 1).memory_bytes == pytest.approx(exact, rel=0.03)


def test_the_traced_sizes_are_within_the_options():
    space = space_for(global_batch=12)
    low, high = traced_sizes(space)
    assert (low, high) == (1, 6)
    assert traced_sizes(space_for(global_batch=64)) == (2, 8)
    assert traced_sizes(space_for({"batch_size": 3}, global_batch=12)) == (3, 3)


def test_the_search_reports_its_progress_from_start_to_end():
    space = space_for()
    heard = []
    search(space, H100, Counting(), capacity_bytes=80 * GIB, top=3,
           progress=lambda done, total, what: heard.append((what, done, total)))
    for what in ("screening plans (traced estimates)", "confirming the best plans (exact estimates)"):
        reports = [(done, total) for kind, done, total in heard if kind == what]
        assert reports and reports[-1][0] == reports[-1][1]  # it ends complete
        assert [done for done, _ in reports] == sorted(done for done, _ in reports)  # never goes back
    screening = [total for kind, _, total in heard if kind.startswith("screening")]
    assert set(screening) == {len(space.variants())}


def test_narrow_techniques_are_composed_around_the_confirmed_plans_and_kept_when_faster():
    from trainwise.search.refine import refine

    def with_fused_loss(plan):  # the fused loss frees 1.5 GiB per sample of the micro-batch, 1 % slower
        if plan.activation_offload:
            raise InputError("--activation-offload", "not in this test")
        measure = formula(plan.replace(loss="default"))
        if plan.loss != "fused":
            return measure
        return Measure(memory_bytes=int(measure.memory_bytes - 1.5 * GIB * plan.batch_size),
                       step_s=measure.step_s * 1.01, breakdown=dict(measure.breakdown), ideal_s=measure.ideal_s)

    # 17.5 GiB: the fused AdamW states (16 GiB) leave room without checkpointing only once the
    # fused loss frees the activations; checkpointing recomputes 30 % of the matmuls.
    space = space_for()
    evaluator = Counting(with_fused_loss)
    result = search(space, H100, evaluator, capacity_bytes=17.5 * GIB, top=3)
    assert result.ranked[0].plan.grad_ckpt  # without the fused loss only checkpointed plans fit
    refined = refine(result, space, H100, evaluator, top=3)
    best = refined.ranked[0]
    assert best.plan.loss == "fused" and not best.plan.grad_ckpt and best.exact
    assert best.tokens_per_s > result.ranked[0].tokens_per_s and best.memory_bytes <= 17.5 * GIB * 0.95
    assert any(note.startswith("activation offload not") for note in refined.notes)  # refused or not useful
    fixed = space_for({"loss": "default"})
    kept = refine(search(fixed, H100, Counting(with_fused_loss), capacity_bytes=17.5 * GIB, top=3), fixed, H100,
                  Counting(with_fused_loss), top=3)
    assert all(c.plan.loss == "default" for c in kept.ranked)  # a flag the user gave is held


def test_a_refinement_that_only_slows_plans_down_costs_no_confirmation():
    """The screen here is optimistic (an exact estimate at accumulation > 1 pays a per-step
    second the accumulation-1 traces never see), so plans refined with a slower fused loss
    still look better than the confirmed best; each is slower than its own plan without the
    fused loss, which fits too, so none is worth an exact estimate. Where the fused loss is
    what lets a plan fit, the refined plan is confirmed (previous test)."""
    from trainwise.search.refine import refine

    def optimistic_screen(plan):
        if plan.activation_offload:
            raise InputError("--activation-offload", "not in this test")
        measure = formula(plan.replace(loss="default"))
        slower = 1.2 if plan.loss == "fused" else 1.0  # and frees no memory
        step = measure.step_s * slower + (1.0 if plan.grad_accum > 1 else 0.0)
        return Measure(memory_bytes=measure.memory_bytes, step_s=step,
                       breakdown={**measure.breakdown, "optimizer": step - sum(measure.breakdown.values()) +
                                  measure.breakdown["optimizer"]}, ideal_s=measure.ideal_s)

    space = space_for({"grad_ckpt": False})
    evaluator = Counting(optimistic_screen)
    result = search(space, H100, evaluator, capacity_bytes=80 * GIB, top=1)
    best = result.ranked[0]
    assert min(c.step_s for c in result.screened if c.plan.grad_accum > 1) * 1.2 < best.step_s  # hopeful-looking
    refined = refine(result, space, H100, evaluator, top=1)
    fused = [p for p in evaluator.plans if p.loss == "fused"]
    assert fused == [best.plan.replace(loss="fused")], "the effect estimate only, on the best plan"
    assert refined.ranked[0].plan == best.plan


def test_a_gpu_search_says_the_kernels_it_does_not_try():
    notes = " ".join(space_for().notes)
    # Liger, compile and float8 are composed around the confirmed plans (search/refine.py).
    assert not any(word in notes for word in ("Liger", "compile", "float8"))
    assert refine.not_allowed(space_for(), H100) == [
        "float8 not searched: it changes the training math; add --allow float8 to try it"]
    assert refine.not_allowed(space_for({"float8": False}), H100) == []  # held by the user


def test_an_allowed_float8_search_without_torchao_says_so(monkeypatch):
    monkeypatch.setattr(refine, "installed", lambda package: package != "torchao")
    allowed = space_for(allow="float8")
    assert "float8" not in [r.name for r in refine.refinements_for(allowed, H100)]
    assert refine.not_allowed(allowed, H100) == [
        "float8 not searched: its estimate traces torchao, which is not installed here "
        "(pip install 'torchao>=0.12,<0.19')"]


def _why_not_setup(exact_step_s: float):
    from trainwise.hardware import resolve_device
    from trainwise.search.compose import Measure
    from trainwise.search.screen_and_confirm import SearchResult, candidate_of

    device = resolve_device("H100")
    winner_plan = Plan(device="H100", batch_size=4, seq_len=128, optim="adamw-fused")
    other_plan = winner_plan.replace(optim="adamw")
    winner = candidate_of(winner_plan, Measure(memory_bytes=10 * 2**30, step_s=1.0), device, exact=True)
    # The screen composed the alternative as 10 % faster than the winner.
    screened = candidate_of(other_plan, Measure(memory_bytes=10 * 2**30, step_s=1 / 1.1), device, exact=False)
    result = SearchResult(ranked=[winner], screened=[winner, screened], usable_bytes=70 * 2**30, timed=True,
                          evaluations=2)
    evaluated = []

    def evaluator(plan):
        evaluated.append(plan)
        return Measure(memory_bytes=10 * 2**30, step_s=exact_step_s)
    return result, device, evaluator, evaluated


def test_a_why_not_line_never_says_a_faster_plan_lost():
    from trainwise.search.why_lost import confirmed_alternatives

    result, device, evaluator, evaluated = _why_not_setup(exact_step_s=1.05)  # exact: 5 % slower
    lines = confirmed_alternatives(result, list(result.screened), ("optim",), device, evaluator)
    assert [p.optim for p in evaluated] == ["adamw"]
    assert result.ranked[0].plan.optim == "adamw-fused"
    (_, other, line), = lines
    assert other.exact and line.startswith("optimizer adamw: -4.8 % tokens/s") and line.endswith(", predicted")


def test_an_alternative_faster_once_estimated_exactly_becomes_the_pick():
    from trainwise.search.why_lost import confirmed_alternatives

    result, device, evaluator, _ = _why_not_setup(exact_step_s=0.8)
    lines = confirmed_alternatives(result, list(result.screened), ("optim",), device, evaluator)
    assert result.ranked[0].plan.optim == "adamw" and result.ranked[0].exact
    (_, other, line), = lines
    assert other.plan.optim == "adamw-fused" and line.startswith("optimizer adamw-fused: -20.0 % tokens/s")


def test_no_why_not_line_reads_faster_after_several_optimistic_screened_plans_of_one_group():
    # Three screened adamw plans read faster than the winner; each, once exact, is slower. Two
    # rounds of confirmation left the third's "+" line (a faster plan that lost).
    from trainwise.search.compose import Measure
    from trainwise.search.screen_and_confirm import candidate_of
    from trainwise.search.why_lost import confirmed_alternatives

    result, device, evaluator, evaluated = _why_not_setup(exact_step_s=1.05)
    for batch, step in ((2, 1 / 1.08), (1, 1 / 1.06)):  # 4 samples per step, as the winner's
        plan = result.ranked[0].plan.replace(optim="adamw", batch_size=batch, grad_accum=4 // batch)
        result.screened.append(candidate_of(plan, Measure(memory_bytes=10 * 2**30, step_s=step), device, exact=False))
    lines = confirmed_alternatives(result, list(result.screened), ("optim",), device, evaluator)
    (_, other, line), = lines
    assert line.startswith("optimizer adamw: -") and other.exact, line


def test_a_refined_plans_breakdown_is_its_own_step_not_its_bases():
    # A "why not" line names the category that grew most: a composed Liger plan 20 % faster
    # must not show its base's (slower) categories.
    from trainwise.hardware import resolve_device
    from trainwise.search.compose import Measure
    from trainwise.search.screen_and_confirm import candidate_of

    base = candidate_of(Plan(device="H100", batch_size=4, seq_len=128),
                        Measure(memory_bytes=2**30, step_s=1.0, breakdown={"matmul": 0.6, "elementwise": 0.4}),
                        resolve_device("H100"), exact=False)
    liger = refine.REFINEMENTS[[r.name for r in refine.REFINEMENTS].index("Liger kernels")]
    refined = refine._refined(base, liger, refine.Effect(freed_per_sample=0.0, time_factor=0.8))
    assert refined.step_s == pytest.approx(0.8) and sum(refined.breakdown.values()) == pytest.approx(0.8)


def test_plans_the_estimate_refuses_are_noted_once_per_reason_as_flags():
    """Flash with tf32 is refused by the estimate for every optimizer and checkpointing
    choice: one readable note, not a Python dictionary per refused plan."""
    from trainwise.search.screen_and_confirm import TraceCache, refusal_notes

    def evaluate(plan):
        if plan.attention == "flash" and plan.precision == "tf32":
            raise InputError("--attention", "flash runs in fp16 or bf16 only")
        return Measure(memory_bytes=1, step_s=1.0, breakdown={"matmul": 1.0}, ideal_s=1.0)

    cache = TraceCache(evaluate, Plan(device="H100", precision="bf16"))
    for ckpt in (False, True):
        for optim in ("adamw", "adamw-fused"):
            cache.at({"attention": "flash", "precision": "tf32", "grad_ckpt": ckpt, "optim": optim}, 4)
    cache.at({"attention": "flash", "precision": "bf16", "grad_ckpt": False, "optim": "adamw"}, 4)
    notes = refusal_notes(cache)
    assert len(notes) == 1 and "{" not in notes[0], notes
    assert notes[0].startswith("4 plans with --attention flash --precision tf32 not searched: --attention:")


def test_a_faster_screened_alternative_is_estimated_exactly_even_when_tied_with_a_simpler_pick(monkeypatch):
    # The tie rule ranks a simpler pick over a plan up to the measured error faster; that plan's
    # "why not" line still must not rest on a screened figure the exact estimate contradicts
    # (README's plan example said "optimizer adamw: +10.6 %" where exact estimates had it slower).
    from trainwise.search import ties
    from trainwise.search.screen_and_confirm import SearchResult, candidate_of
    from trainwise.search.why_lost import confirmed_alternatives

    monkeypatch.setattr(ties, "measured_error", lambda kind: 0.2)
    winner_plan = Plan(device="H100", batch_size=4, seq_len=128)
    winner = candidate_of(winner_plan, Measure(memory_bytes=10 * GIB, step_s=1.0), H100, exact=True)
    flash = candidate_of(winner_plan.replace(attention="flash"), Measure(memory_bytes=10 * GIB, step_s=1 / 1.1), H100,
                         exact=False)  # screened 10 % faster: tied, and the pick is simpler
    result = SearchResult(ranked=[winner], screened=[winner, flash], usable_bytes=70 * GIB, timed=True, evaluations=2)
    evaluator = Counting(lambda plan: Measure(memory_bytes=10 * GIB, step_s=1.05))
    (_, other, line), = confirmed_alternatives(result, list(result.screened), ("attention",), H100, evaluator)
    assert [p.attention for p in evaluator.plans] == ["flash"]
    assert other.exact and line.startswith("flash attention: -4.8 % tokens/s") and line.endswith(", predicted")


def test_a_why_not_line_compares_plans_that_differ_in_its_technique_alone():
    # The best plain-AdamW plan also compiled reads faster than an uncompiled pick by what compile
    # does; the optimizer's line must compare the uncompiled one (and name the extra flag where
    # no plan differs in the optimizer alone).
    from trainwise.search.screen_and_confirm import candidate_of

    winner_plan = Plan(device="H100", batch_size=4, seq_len=128, optim="adamw-fused")
    winner = candidate_of(winner_plan, Measure(memory_bytes=10 * GIB, step_s=1.0), H100, exact=True)
    compiled = candidate_of(winner_plan.replace(optim="adamw", compile=True), Measure(memory_bytes=10 * GIB, step_s=0.8),
                            H100, exact=True)
    plain = candidate_of(winner_plan.replace(optim="adamw", batch_size=2, grad_accum=2),
                         Measure(memory_bytes=10 * GIB, step_s=1.02), H100, exact=True)
    (_, other, line), = alternatives(winner, [winner, compiled, plain], 70 * GIB, True, ("optim",))
    assert other.plan == plain.plan and line.startswith("optimizer adamw: -2.0 % tokens/s")
    (_, other, line), = alternatives(winner, [winner, compiled], 70 * GIB, True, ("optim",))
    assert other.plan == compiled.plan and line.startswith("optimizer adamw (with --compile): +25.0 % tokens/s")
