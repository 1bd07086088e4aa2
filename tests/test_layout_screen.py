"""The plan search's layout screen: its memory against the exact per-rank estimate, its
enumeration, and that its ranking follows the links (trainwise/search/layout_screen.py)."""

import pytest

from trainwise.api import estimate
from trainwise.estimator.rank_work import communicated_bytes
from trainwise.hardware import resolve_device
from trainwise.hardware.catalog_profile import catalog_profile
from trainwise.estimator.collective_time import Topology
from trainwise.models import resolve_model
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan
from trainwise.search.layout_enumeration import LayoutSpace, layout_plans
from trainwise.search.layout_screen import screen_candidate, traced_precision
from trainwise.search.screen_memory import rank_device_total, rank_params, screen_ranks, state_bytes
from trainwise.search.traced_unit import ComputePhase, Linear, TracedUnit, traced_unit

BASE = Plan(device="cpu", seq_len=32, batch_size=2)


def memory_only(result):
    """The memory tests need no seconds: the traced unit's times are left at zero."""
    return 0.0, 0.0, 0.0


def screened(plan: Plan):
    spec = resolve_model("tiny-llama")
    layout = resolve_layout(plan)
    unit = traced_unit(spec, plan.replace(precision=traced_precision(plan, layout)), resolve_device("cpu"),
                       layout.tp, layout.sequence_parallel, memory_only)
    return spec, layout, unit


@pytest.mark.slow
@pytest.mark.parametrize("changes", [dict(nproc=2), dict(nproc=4, zero=3), dict(nproc=2, tp=2),
                                     dict(nproc=2, pp=2, batch_size=4),
                                     dict(nproc=4, tp=2, pp=2, batch_size=4, sequence_parallel=True)],
                         ids=["ddp", "zero3", "tp2", "pp2", "tp2-sp-pp2"])
def test_screen_memory_within_ten_percent_of_the_per_rank_estimate(changes):
    plan = BASE.replace(**changes)
    spec, layout, unit = screened(plan)
    dtypes = communicated_bytes(plan.precision, "cpu", layout.data_parallel_kind)
    screen = max(rank_device_total(unit, rank, layout, plan, dtypes, spec.config.hidden_size)
                 for rank in screen_ranks(spec.config.num_hidden_layers, layout, plan.pp_schedule))
    exact = max(rank["device_total"] for rank in estimate("tiny-llama", plan).layout["pipeline_ranks"])
    assert screen == pytest.approx(exact, rel=0.10)


@pytest.mark.parametrize("changes", [dict(nproc=2, zero=1), dict(nproc=4, zero=3), dict(nproc=2, tp=2)],
                         ids=["zero1", "zero3", "tp2"])
def test_screen_model_states_within_five_percent_of_the_exact_ones(changes):
    plan = BASE.replace(**changes)
    spec, layout, unit = screened(plan)
    (rank,) = screen_ranks(spec.config.num_hidden_layers, layout, plan.pp_schedule)
    params, _ = rank_params(unit, rank, pipelined=False)
    states = state_bytes(unit, params, layout, 4, plan.grad_accum)
    exact = estimate("tiny-llama", plan).memory
    for key in ("weights", "gradients", "optimizer"):
        assert states[key] == pytest.approx(getattr(exact, key), rel=0.05), key


def test_enumeration_covers_every_gpu_and_reaches_the_global_batch():
    spec = resolve_model("Llama-3.1-70B")
    space = LayoutSpace(gpus=64, gpus_per_node=8, global_batch=256)
    plans = list(layout_plans(spec.config, Plan(device="H100", precision="bf16", seq_len=2048), space))
    assert len(plans) > 100
    for plan in plans:
        layout = resolve_layout(plan)
        assert layout.dp * layout.fsdp * layout.tp * layout.pp == 64
        assert layout.tp <= 8 and 64 % layout.tp == 0
        assert plan.batch_size * plan.grad_accum * layout.data_parallel == 256
    assert {resolve_layout(p).data_parallel_kind for p in plans} == {"none", "ddp", "zero1", "fsdp"}
    assert {p.pp_schedule for p in plans if p.pp > 1} == {"gpipe", "1f1b", "interleaved-1f1b"}
    assert any(p.sequence_parallel for p in plans) and any(p.cpu_offload for p in plans)
    # The large-model layout is searched: tensor + sequence parallel with pipeline stages.
    assert any(p.sequence_parallel and p.pp > 1 for p in plans)


def unit_at(tp: int) -> TracedUnit:
    """A 70B-like rank at tensor-parallel degree tp: compute divides by tp, the states too."""
    per_row = lambda seconds: Linear(0.0, 0.0, seconds / tp)  # noqa: E731 - seconds per block per row
    return TracedUnit(tp=tp, sequence_parallel=False, block_params=850_000_000 // tp, first_params=0,
                      last_params=0, whole_params=2_100_000_000 // tp, trainable_fraction=1.0,
                      optimizer_per_weight_byte=2.0, optimizer_temporary_per_weight_byte=0.0,
                      activations=Linear(0, 0, 2**28 / tp), phases=(ComputePhase("backward", Linear(0, 0, 0), 1, 1),),
                      slack=0, context=0, forward_s=per_row(0.02), backward_s=per_row(0.04), optimizer_s_per_param=0.0)


def test_on_a_slow_inter_node_link_tp_16_loses_to_tp_8():
    spec = resolve_model("Llama-3.1-70B")
    profile = catalog_profile(resolve_device("H100"))
    slow = Topology.from_gbps(8, 25)
    plan = Plan(device="H100", precision="bf16", seq_len=4096, batch_size=1)
    wide = plan.replace(nproc=16, tp=16)
    narrow = plan.replace(nproc=16, tp=8, dp=2)
    wide_candidate = screen_candidate(spec, wide, unit_at(16), profile, slow, "cuda")
    narrow_candidate = screen_candidate(spec, narrow, unit_at(8), profile, slow, "cuda")
    assert narrow_candidate.tokens_per_s > wide_candidate.tokens_per_s
    assert not wide_candidate.exact and wide_candidate.breakdown["communication_exposed"] > 0


def test_fewer_pipeline_chunks_pay_a_larger_bubble():
    spec = resolve_model("Llama-3.1-70B")
    profile = catalog_profile(resolve_device("H100"))
    plan = Plan(device="H100", precision="bf16", seq_len=4096, batch_size=8, nproc=8, pp=8, pp_schedule="1f1b")
    few = screen_candidate(spec, plan.replace(microbatches=8), unit_at(1), profile, Topology(8), "cuda")
    many = screen_candidate(spec, plan.replace(microbatches=32, batch_size=32), unit_at(1), profile, Topology(8),
                            "cuda")
    assert few.breakdown["pipeline_bubble"] / few.step_s > many.breakdown["pipeline_bubble"] / many.step_s


@pytest.mark.parametrize("changes", [dict(nproc=2, tp=2), dict(nproc=2, pp=2, batch_size=4),
                                     dict(nproc=2, pp=2, batch_size=4, pp_schedule="interleaved-1f1b")],
                         ids=["tp2", "pp2", "pp2-interleaved"])
def test_screen_ranks_hold_the_same_block_ranges_as_the_exact_estimate(changes):
    # --grad-ckpt-every picks the recomputed blocks by these ranges (estimator/rank_work.py):
    # the screen and the exact estimate must count the same ones.
    from trainwise.estimator.rank_view import rank_views

    spec = resolve_model("tiny-llama")
    config = type(spec.config)(**{**spec.config.to_dict(), "num_hidden_layers": 7})
    plan = BASE.replace(**changes)
    layout = resolve_layout(plan)
    screen = [rank.block_ranges for rank in screen_ranks(7, layout, plan.pp_schedule)]
    assert screen == [view.block_ranges for view in rank_views(config, plan, layout)]
    assert sorted(index for ranges in screen for first, end in ranges for index in range(first, end)) == list(range(7))


@pytest.mark.slow
def test_the_estimate_counts_tp_all_reduces_of_every_second_block_between_none_and_all():
    layers = resolve_model("tiny-llama").config.num_hidden_layers
    tp = dict(device="H100", precision="bf16", nproc=2, tp=2)

    def tp_bytes(**changes) -> int:
        time = estimate("tiny-llama", BASE.replace(**tp, **changes)).time
        return sum(c["bytes"] for c in time.to_json()["collectives"] if c["purpose"].startswith("TP"))

    none, every_2, full = tp_bytes(), tp_bytes(grad_ckpt=True, grad_ckpt_every=2), tp_bytes(grad_ckpt=True)
    per_collective = none / (4 * layers + 2)  # 2 + 2 per block, the embedding's and the head's
    assert every_2 == none + 2 * len(range(0, layers, 2)) * per_collective
    assert full == none + 2 * layers * per_collective and none < every_2 < full
