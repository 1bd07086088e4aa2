"""The layout time model: ring formulas, links, DDP overlap, TP on the critical path,
pipeline bubbles, offload (trainwise/estimator/layout_time.py and its parts)."""

import dataclasses

import pytest

from trainwise.common.errors import InputError
from trainwise.estimator.collective_time import Link, Topology, collective_seconds
from trainwise.estimator.layout_collectives import bucketed_overlap
from trainwise.estimator.layout_time import layout_time
from trainwise.estimator.rank_work import RankWork, communicated_bytes
from trainwise.hardware.profile import DeviceProfile, Rate
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan

GB = 1e9
LINK = Link("NVLink", dict.fromkeys(("all_reduce", "all_gather", "reduce_scatter", "send_recv"), Rate(100 * GB, 0.0)))


def profile(collective_gb_s=100.0, pcie_gb_s=50.0) -> DeviceProfile:
    link = Rate(collective_gb_s * GB, 0.0)
    return DeviceProfile("test-gpu", "cuda", "test", matmul={"bf16": Rate(1e15)}, attention={},
                         memory=Rate(2e12), host_s_per_op=0.0,
                         collectives=dict.fromkeys(("all_reduce", "all_gather", "reduce_scatter", "send_recv"), link),
                         host_to_device=Rate(pcie_gb_s * GB, 0.0))


def work(**changes) -> RankWork:
    base = RankWork(forward_s=0.1, backward_s=0.2, optimizer_s=0.01, params=1_000_000_000,
                    trainable_params=1_000_000_000, params_in_blocks=900_000_000, blocks=10, weight_bytes=4,
                    gather_bytes=2, reduce_bytes=4, activation_bytes=4 * 1024 * 2048 * 2)
    return dataclasses.replace(base, **changes)


def plan(**changes) -> Plan:
    return Plan(device="H100", precision="bf16", batch_size=4, seq_len=1024).replace(**changes)


def test_ring_formulas_follow_nccl_bus_bandwidth():
    nbytes = 8 * GB
    assert collective_seconds("all_reduce", nbytes, 8, LINK) == pytest.approx(2 * 7 / 8 * nbytes / (100 * GB))
    assert collective_seconds("all_gather", nbytes, 4, LINK) == pytest.approx(3 / 4 * nbytes / (100 * GB))
    assert collective_seconds("reduce_scatter", nbytes, 2, LINK) == pytest.approx(1 / 2 * nbytes / (100 * GB))
    assert collective_seconds("send_recv", nbytes, 2, LINK) == pytest.approx(nbytes / (100 * GB))
    assert collective_seconds("all_reduce", nbytes, 1, LINK) == 0.0  # one rank: nothing to reduce


def test_latency_grows_with_log_of_ranks():
    link = Link("NVLink", {"all_reduce": Rate(100 * GB, 1e-5)})
    assert collective_seconds("all_reduce", 1, 8, link) == pytest.approx(3e-5, rel=1e-3)
    assert collective_seconds("all_reduce", 1, 1024, link) == pytest.approx(10e-5, rel=1e-3)


def test_group_spanning_nodes_uses_the_inter_node_link():
    layout = resolve_layout(plan(nproc=16, tp=16))
    slow = Topology.from_gbps(8, 100)  # 100 Gbit/s = 12.5 GB/s per GPU
    result = layout_time(plan(nproc=16, tp=16), layout, work(), profile(), slow)
    assert {c.link for c in result.collectives} == {"inter-node"}
    inside = layout_time(plan(nproc=16, tp=16), layout, work(), profile(), Topology.from_gbps(16, 100))
    assert {c.link for c in inside.collectives} == {"NVLink"}
    assert result.breakdown["communication_exposed"] > 5 * inside.breakdown["communication_exposed"]


def test_data_parallel_group_spans_nodes_only_past_a_node():
    topology = Topology(8)
    assert not topology.spans_nodes(8, 1) and topology.spans_nodes(9, 1)
    assert topology.spans_nodes(2, 8) and not topology.spans_nodes(2, 4)


@pytest.mark.fault
def test_inter_node_bandwidth_must_be_positive(fault_log):
    with pytest.raises(InputError, match="inter-node-gbps") as error:
        Topology.from_gbps(8, 0)
    fault_log(kind="bad input", case="--inter-node-gbps 0", exit_code=2, message=str(error.value))


def test_ddp_hides_all_but_the_last_bucket_behind_a_long_backward():
    assert bucketed_overlap([0.01] * 10, backward_s=1.0) == pytest.approx(0.01)
    assert bucketed_overlap([0.5] * 4, backward_s=1.0) == pytest.approx(1.25)  # link-bound: 4 x 0.5 from 0.25
    p = plan(nproc=8)
    long_backward = layout_time(p, resolve_layout(p), work(backward_s=10.0), profile(), Topology(8))
    (reduce,) = long_backward.collectives
    assert reduce.purpose.startswith("DDP") and reduce.bytes_per_step == 4 * GB
    last_bucket = collective_seconds("all_reduce", 4 * GB - 25 * 2**20 * 152, 8, LINK)
    assert reduce.exposed_s == pytest.approx(last_bucket, rel=1e-6)
    assert reduce.overlapped_s == pytest.approx(2 * 7 / 8 * 4 * GB / (100 * GB) - last_bucket, rel=1e-6)


def test_tensor_parallel_collectives_are_on_the_critical_path():
    p = plan(nproc=4, tp=4)
    result = layout_time(p, resolve_layout(p), work(), profile(), Topology(8))
    (tp,) = result.collectives
    count = 10 * 4 + 2  # two all-reduces per block each way, the embedding's and the head's
    assert tp.overlapped_s == 0.0
    assert tp.exposed_s == pytest.approx(count * collective_seconds("all_reduce", work().activation_bytes, 4, LINK))
    recomputed = layout_time(p, resolve_layout(p), work(recomputed_blocks=10), profile(), Topology(8)).collectives[0]
    assert recomputed.exposed_s == pytest.approx(tp.exposed_s * (10 * 6 + 2) / count)
    sequence = plan(nproc=4, tp=4, sequence_parallel=True)
    split = layout_time(sequence, resolve_layout(sequence), work(), profile(), Topology(8)).collectives
    assert sorted(c.name for c in split) == ["all_gather", "reduce_scatter"]
    assert sum(c.exposed_s for c in split) == pytest.approx(tp.exposed_s)  # same volume


@pytest.mark.parametrize("schedule, stages", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_bubble_fraction_per_schedule(schedule, stages):
    p = plan(nproc=4, pp=4, microbatches=8, pp_schedule=schedule)
    w = work(chunks=8, blocks=2)
    result = layout_time(p, resolve_layout(p), w, profile(), Topology(8))
    pipelined = result.breakdown["compute"] + result.breakdown["pipeline_bubble"]
    assert result.breakdown["pipeline_bubble"] / pipelined == pytest.approx((3 / stages) / (8 + 3 / stages))
    (p2p,) = result.collectives
    assert p2p.name == "send_recv" and p2p.bytes_per_step == 2 * stages * 8 * w.activation_bytes


def test_offload_pcie_term_scales_with_parameter_bytes():
    p = plan(nproc=8, zero=3, cpu_offload=True)
    layout = resolve_layout(p)
    small = layout_time(p, layout, work(), profile(), Topology(8))
    large = layout_time(p, layout, work(params=2_000_000_000, trainable_params=2_000_000_000,
                                         params_in_blocks=1_800_000_000), profile(), Topology(8))
    host = 1_000_000_000 / 8 / 2.5e8
    pcie = (2 * 1e9 / 8 * 4 + 1e9 / 8 * 4) / (50 * GB)  # ZeRO-3: two gathers' copies in, gradients out
    assert small.breakdown["offload"] == pytest.approx(pcie + host)
    assert large.breakdown["offload"] == pytest.approx(2 * (pcie + host))
    assert small.breakdown["optimizer"] == 0.0 and any("host optimizer" in n for n in small.notes)


def test_offloaded_gradients_leave_at_the_device_to_host_rate_and_the_note_says_which_rates():
    """The parameter shards come in at host-to-device (50 GB/s); the gradient shards leave
    at a measured device-to-host 25 GB/s, not at the other direction's rate."""
    p = plan(nproc=8, zero=3, cpu_offload=True)
    layout = resolve_layout(p)
    both = dataclasses.replace(profile(), device_to_host=Rate(25 * GB, 0.0))
    result = layout_time(p, layout, work(), both, Topology(8))
    pcie = 2 * 1e9 / 8 * 4 / (50 * GB) + 1e9 / 8 * 4 / (25 * GB)
    assert result.breakdown["offload"] == pytest.approx(pcie + 1_000_000_000 / 8 / 2.5e8)
    assert any("device to host 25 GB/s (measured)" in n for n in result.notes)
    one_rate = layout_time(p, layout, work(), profile(), Topology(8))
    assert any("device to host assumed the same (not measured)" in n for n in one_rate.notes)


def test_fsdp_gathers_hide_behind_compute_until_they_are_longer():
    p = plan(nproc=8, zero=3)
    layout = resolve_layout(p)
    fast = layout_time(p, layout, work(), profile(collective_gb_s=1000), Topology(8))
    slow = layout_time(p, layout, work(), profile(collective_gb_s=10), Topology(8))
    gather = {c.name: c for c in fast.collectives}["all_gather"]
    one_block = collective_seconds("all_gather", 90_000_000 * 2, 8, Link("x", {"all_gather": Rate(1000 * GB)}))
    root = collective_seconds("all_gather", 100_000_000 * 2, 8, Link("x", {"all_gather": Rate(1000 * GB)}))
    assert gather.exposed_s == pytest.approx(root + 2 * one_block, rel=1e-6)  # the first of each pass
    assert slow.breakdown["communication_exposed"] > 0.5 * slow.breakdown["communication_overlapped"]
    assert slow.step_s > fast.step_s


def test_zero_one_broadcasts_updated_parameters_after_the_step():
    p = plan(nproc=4, zero=1)
    result = layout_time(p, resolve_layout(p), work(backward_s=100.0), profile(), Topology(8))
    broadcast = [c for c in result.collectives if c.name == "all_gather"][0]
    assert broadcast.bytes_per_step == 4 * GB and broadcast.overlapped_s == 0.0
    assert result.breakdown["optimizer"] == pytest.approx(0.01 / 4)


def test_fsdp_under_bf16_gathers_bf16_and_reduces_fp32():
    assert communicated_bytes("bf16", "cuda", "fsdp") == {"weight_bytes": 4, "gather_bytes": 2, "reduce_bytes": 4,
                                                         "activation_bytes": 2}
    assert communicated_bytes("bf16", "cuda", "ddp")["reduce_bytes"] == 4
    assert communicated_bytes("bf16-pure", "cuda", "fsdp")["gather_bytes"] == 2


def _tp_collectives_per_rank(changes: dict, layers: int) -> list[float]:
    """Tensor-parallel collectives per micro-batch of each pipeline rank, by the exact
    estimate's own path (estimator/rank_view.py -> rank_work.py -> layout_time.py) for
    tiny-llama cut to `layers` blocks."""
    from trainwise.estimator.rank_view import rank_views
    from trainwise.estimator.rank_work import rank_work
    from trainwise.models import resolve_model

    config = resolve_model("tiny-llama").config
    config = type(config)(**{**config.to_dict(), "num_hidden_layers": layers})
    p = plan(**changes)
    layout = resolve_layout(p)
    counts = []
    for view in rank_views(config, p, layout):
        w = rank_work(p, layout, view, [], config.hidden_size, "cuda", 0.1, 0.2, 0.01)
        tp = next(c for c in layout_time(p, layout, w, profile(), Topology(8)).collectives if c.purpose.startswith("TP"))
        counts.append(tp.bytes_per_step / (w.activation_bytes * w.chunks * w.grad_accum))
    return counts


def test_checkpointing_every_second_block_recomputes_the_tp_all_reduces_of_those_blocks_only():
    layers = 5
    tp = dict(nproc=2, tp=2)
    (none,) = _tp_collectives_per_rank(tp, layers)
    (every_2,) = _tp_collectives_per_rank({**tp, "grad_ckpt": True, "grad_ckpt_every": 2}, layers)
    (full,) = _tp_collectives_per_rank({**tp, "grad_ckpt": True}, layers)
    checkpointed = len(range(0, layers, 2))  # blocks 0, 2, 4
    assert none == 4 * layers + 2  # 2 forward + 2 backward per block, the embedding's and the head's
    assert every_2 == none + 2 * checkpointed  # the forward's two again per recomputed block
    assert full == none + 2 * layers
    assert none < every_2 < full


def test_a_pipeline_rank_recomputes_the_blocks_checkpointed_by_their_index_in_the_whole_stack():
    # 6 blocks on 2 stages: blocks 0-2 and 3-5. Checkpointed every 2: 0, 2 and 4 (the engine
    # picks them before the split), so rank 1 recomputes block 4 alone, not its 1st and 3rd.
    first, second = _tp_collectives_per_rank(dict(nproc=4, tp=2, pp=2, batch_size=4, grad_ckpt=True,
                                                  grad_ckpt_every=2), layers=6)
    assert first == 4 * 3 + 2 * 2 + 1  # blocks 0 and 2; the embedding
    assert second == 4 * 3 + 2 * 1 + 1  # block 4; the head
