"""estimate --compile: the compiled regions' element-wise chains priced as fused kernels
(trainwise/trace/fusion.py), the eager step's pricing untouched, and the plan search
trying compile (and float8 where allowed) around its confirmed plans."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.estimator.predict import _trace
from trainwise.estimator.shared_traces import SharedTraces
from trainwise.hardware import resolve_device
from trainwise.hardware.profile import DeviceProfile, Rate
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan
from trainwise.search.compose import Measure
from trainwise.search.refine import refine
from trainwise.search.screen_and_confirm import search
from trainwise.search.space import build_space, parse_allow
from trainwise.trace.depth import with_blocks
from trainwise.trace.fusion import FusionGrouper

CPU = resolve_device("cpu")
PROFILE = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10, 1e-6)}, {}, Rate(1e9, 1e-6), 1e-5)
FUSIBLE = ("elementwise", "normalization", "transcendental")
GIB = 2 ** 30


def _costs(**knobs):
    plan = Plan(**{"device": "cpu", "batch_size": 2, "seq_len": 32, **knobs})
    return _trace(resolve_model("tiny-llama"), plan, CPU)[0].op_costs


def _kernel_ops(costs) -> int:
    eager = sum(v[0] for k, v in costs.rows.items() if k[2] != "metadata")
    return eager + sum(v[0] for k, v in costs.compiled.items() if k[2] != "region")


def _fusible_bytes(costs) -> int:
    """Element-wise bytes of forward and backward (the optimizer is never compiled)."""
    return sum(v[2] + v[3] for table in (costs.rows, costs.compiled) for k, v in table.items()
               if k[2] in FUSIBLE and k[0] in ("forward", "backward"))


def test_a_compiled_step_launches_fewer_kernels_and_moves_fewer_elementwise_bytes():
    eager, blocks, model = _costs(), _costs(compile=True), _costs(compile=True, compile_scope="model")
    assert eager.compiled == {}, "an eager step has no compiled rows: its pricing is the one tests hold"
    for compiled in (blocks, model):
        assert _kernel_ops(compiled) < 0.7 * _kernel_ops(eager)
        assert _fusible_bytes(compiled) < 0.8 * _fusible_bytes(eager)
        # Matmuls and attention are library calls either way: the same FLOPs.
        for op_class in ("matmul", "attention"):
            assert (compiled.total(1, op_class=op_class) + compiled.compiled_total(1, op_class=op_class)
                    == eager.total(1, op_class=op_class))
    # Per block: one region call per block in forward and one in backward; the whole model: one each.
    assert blocks.compiled_total(0, op_class="region", phase="forward") == 2
    assert model.compiled_total(0, op_class="region", phase="forward") == 1
    assert model.compiled_total(0, op_class="region", phase="backward") == 1
    # The embeddings, final norm, head and loss stay eager per block, not under the whole model.
    assert model.total(0, phase="forward") < blocks.total(0, phase="forward")


def test_the_eager_estimate_is_priced_as_before_and_compile_is_faster():
    eager = estimate("tiny-llama", Plan(device="cpu", batch_size=2, seq_len=32), profile=PROFILE).time
    compiled = estimate("tiny-llama", Plan(device="cpu", batch_size=2, seq_len=32, compile=True),
                        profile=PROFILE).time
    assert compiled.step_s < eager.step_s
    assert compiled.breakdown["host_overhead"] < eager.breakdown["host_overhead"]
    assert compiled.breakdown["matmul"] == pytest.approx(eager.breakdown["matmul"], rel=1e-12)
    assert not any("--compile" in note for note in eager.notes)
    assert any("fused kernels" in note for note in compiled.notes)


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-bert"])
def test_a_compiled_regions_dropout_is_priced_at_the_profiles_compiled_random_rate(name):
    """Inductor draws a compiled dropout's numbers with a generator of its own on every
    thread (trainwise/calibration/compiled_random.py): its measured rate, not eager
    bernoulli_'s, prices the compiled regions' random rows; eager plans are untouched."""
    eager_rate = dataclasses.replace(PROFILE, random=Rate(1e8, 0.0), step_non_matmul_factor=3.0)
    own = dataclasses.replace(eager_rate, compiled_random=Rate(2.5e7, 0.0))
    plan, shared = Plan(device="cpu", batch_size=2, seq_len=32), SharedTraces()
    compiled = [estimate(name, plan.replace(compile=True), profile=p, shared=shared).time for p in (eager_rate, own)]
    eager = [estimate(name, plan, profile=p, shared=shared).time for p in (eager_rate, own)]
    costs = _trace(resolve_model(name), plan.replace(compile=True), CPU)[0].op_costs
    drawn = sum(costs.compiled_total(column, op_class="random", micro_step=0) for column in (2, 3))
    assert drawn > 0, "the model's dropouts run inside the compiled regions"
    # No step factor on either: the generator's arithmetic sets the pace, as for eager rows.
    assert compiled[1].step_s - compiled[0].step_s == pytest.approx(drawn / 2.5e7 - drawn / 1e8, rel=1e-6)
    assert compiled[1].breakdown["host_overhead"] == pytest.approx(compiled[0].breakdown["host_overhead"])
    assert eager[1].step_s == eager[0].step_s and eager[1].breakdown == eager[0].breakdown


def test_a_fused_chain_reads_what_enters_it_and_writes_what_leaves_it():
    rows, keys = {}, {}
    grouper = FusionGrouper(rows, lambda t: keys.setdefault(id(t.untyped_storage()), len(keys)))
    region, key = ("forward", 0), ("forward", 0, "elementwise", "fp32", False, 0)
    x, w = torch.ones(4, 4), torch.ones(4, 4)
    a, b = x * 2, None
    grouper.op(region, key, "elementwise", [x], [a], [1, 0, 128, 64])
    b = a + 1
    grouper.op(region, key, "elementwise", [a], [b], [1, 0, 64, 64])
    c = b.sigmoid()
    grouper.op(region, ("forward", 0, "transcendental", "fp32", False, 0), "transcendental", [b], [c], [1, 0, 64, 64])
    mm_key = ("forward", 0, "matmul", "fp32", False, 0)
    grouper.op(region, mm_key, "matmul", [c, w], [c @ w], [1, 128, 128, 64])
    assert rows[key] == [1, 0, 64, 0], "one kernel reading x once; a and b never leave it"
    assert rows[("forward", 0, "transcendental", "fp32", False, 0)] == [0, 0, 0, 64], "c leaves for the matmul"
    assert rows[mm_key] == [1, 128, 128, 64] and rows[("forward", 0, "region", "none", False, 0)] == [1, 0, 0, 0]


def test_estimate_compile_is_no_longer_refused_and_says_its_memory_is_an_upper_bound(capsys):
    for scope in ("blocks", "model"):
        code = main(["estimate", "tiny-llama", "--device", "cpu", "--compile", "--compile-scope", scope,
                     "--batch-size", "2", "--seq-len", "32", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["plan"]["compile"] and out["plan"]["compile_scope"] == scope
        assert any("upper bound" in note for note in out["notes"])


@pytest.mark.parametrize("blocks", [2, 6])  # traced whole; traced at 2 and 3 blocks and extrapolated
def test_a_compile_twin_priced_from_the_eager_trace_is_the_fresh_estimate(blocks):
    tiny = resolve_model("tiny-llama")
    spec = dataclasses.replace(tiny, config=with_blocks(tiny.config, blocks))
    for knobs in ({}, {"grad_ckpt": True}):
        eager = Plan(device="H100", batch_size=2, grad_accum=2, seq_len=32, precision="bf16", **knobs)
        compiled = eager.replace(compile=True)
        assert estimate(spec, compiled).time.step_s < estimate(spec, eager).time.step_s
        for first, twin in ((eager, compiled), (compiled, eager)):
            shared = SharedTraces()
            estimate(spec, first, shared=shared)
            assert estimate(spec, twin, shared=shared) == estimate(spec, twin), "memory, time, notes: all of it"
            assert shared.reused == 1
    other = SharedTraces()
    estimate(spec, eager, shared=other)
    estimate(spec, eager.replace(batch_size=1, compile=True), shared=other)
    assert other.reused == 0, "only the compile knob may differ"


def test_the_search_traces_no_step_twice_for_compile(monkeypatch):
    import trainwise.api.search as search_api
    import trainwise.estimator.predict as predict

    traced, estimated = [], []
    trace, estimate_ = predict.trace_training_step, search_api.estimate
    monkeypatch.setattr(predict, "trace_training_step",
                        lambda model, batch_fn, plan, *a, **k: traced.append(plan) or trace(model, batch_fn, plan, *a, **k))
    monkeypatch.setattr(search_api, "estimate", lambda spec, plan, **k: estimated.append(plan) or estimate_(spec, plan, **k))
    report = search_api.plan_search("tiny-llama", Plan(device="H100", seq_len=64), {"device", "seq_len"}, global_batch=8)
    compiled = [p for p in estimated if p.compile]
    twins_before = [p for p in compiled if p.replace(compile=False) in estimated[:estimated.index(p)]]
    assert twins_before, "the compile refinement asks for twins of plans it has estimated"
    steps = [p.replace(compile=False) for p in traced]
    assert len(steps) == len(set(steps)), "a plan and its compile twin share one trace"
    assert len(traced) < len(estimated) and report.result.ranked[0].exact


def _compile_is_faster(plan: Plan) -> Measure:
    """Memory and time as simple formulas; compile takes 20 % off the step, float8 10 % more."""
    step = 0.1 * plan.batch_size * plan.grad_accum * (0.8 if plan.compile else 1.0) * (0.9 if plan.float8 else 1.0)
    return Measure(memory_bytes=int(16 * GIB + GIB * plan.batch_size), step_s=step, breakdown={"matmul": step})


def _space(allow: str = ""):
    base = Plan.from_dict({"device": "H100", "seq_len": 1024, "precision": "bf16"})
    return build_space(base, frozenset({"device", "seq_len", "precision"}), resolve_device("H100"), parse_allow(allow),
                       64, flash_refusal="not installed")


def test_the_search_tries_compile_and_float8_only_when_allowed(monkeypatch):
    from trainwise.search import refine as refine_module
    from trainwise.search import ties

    monkeypatch.setattr(refine_module, "installed", lambda package: True)  # torchao, which float8 is traced with
    # Whether float8 is tried, not the tie rule (a float8 lead inside the measured error loses
    # to the plan that keeps the math: tests/test_search_ties.py).
    monkeypatch.setattr(ties, "measured_error", lambda kind: None)
    h100 = resolve_device("H100")
    for allow, float8 in (("", False), ("float8", True)):
        space = _space(allow)
        result = search(space, h100, _compile_is_faster, capacity_bytes=80 * GIB, top=3)
        assert not result.ranked[0].plan.compile, "the screen itself does not compile"
        refined = refine(result, space, h100, _compile_is_faster, top=3)
        best = refined.ranked[0].plan
        assert best.compile and best.compile_scope == "blocks" and best.float8 is float8
        assert any("compile" in note for note in refined.notes if note.startswith("composed"))
        assert any(note.startswith("float8 not searched") for note in refined.notes) is not float8


def test_a_compiled_regions_fused_kernels_are_not_slowed_by_the_eager_steps_element_wise_factor():
    """calibrate fits step_non_matmul_factor on an eager step (fresh outputs, cold operands
    per op); inductor's fused kernels ran at about the hot rates (benchmarks/time_breakdown.py
    --compile): a larger factor slows the eager element-wise work, not the compiled rows."""
    from trainwise.estimator.row_time import priced_rows

    plan = Plan(device="cpu", batch_size=2, seq_len=32, compile=True)
    costs = _trace(resolve_model("tiny-llama"), plan, CPU)[0].op_costs
    slow, slower = (dataclasses.replace(PROFILE, step_non_matmul_factor=f) for f in (2.0, 4.0))
    priced = [{(key, compiled): seconds for key, _v, compiled, _c, seconds in priced_rows(costs, plan, p)}
              for p in (slow, slower)]
    fused = [k for k in priced[0] if k[1] and k[0][2] in FUSIBLE and k[0][0] in ("forward", "backward")]
    eager = [k for k in priced[0] if not k[1] and k[0][2] in FUSIBLE and priced[0][k] > 0]
    assert fused and eager
    assert all(priced[1][k] == pytest.approx(priced[0][k]) for k in fused)
    assert all(priced[1][k] > priced[0][k] for k in eager)
