"""The per-rank estimate's arithmetic, without processes (tests/test_parallel_engine.py
checks it against real ranks): shares of the model states, pipeline stages, buffers."""

import copy
import dataclasses
import json
import subprocess
import sys

import pytest

from trainwise.api.estimate import estimate
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan

BASE = {"batch_size": 4, "seq_len": 64, "device": "cpu"}


def _estimate(blocks: int | None = None, **knobs):
    spec = resolve_model("tiny-llama")
    if blocks is not None:
        config = copy.deepcopy(spec.config)
        config.num_hidden_layers = blocks
        spec = dataclasses.replace(spec, config=config)
    return estimate(spec, Plan.from_dict({**BASE, **knobs}))


def test_sharding_divides_the_model_states_stage_by_stage():
    one, ddp, zero1, zero2, zero3 = (_estimate(**k).memory for k in (
        {}, {"nproc": 4}, {"nproc": 4, "zero": 1}, {"nproc": 4, "zero": 2}, {"nproc": 4, "zero": 3}))
    assert (ddp.weights, ddp.gradients, ddp.optimizer) == (one.weights, one.gradients, one.optimizer)
    assert zero1.optimizer < one.optimizer / 2 and zero1.gradients == one.gradients
    # FSDP2 pads each parameter's dimension 0 up to a multiple of the ranks: at least a quarter.
    for sharded in (zero2, zero3):
        assert one.weights / 4 <= sharded.weights < one.weights / 4 * 1.05
        assert one.optimizer / 4 <= sharded.optimizer < one.optimizer / 4 * 1.05
    assert zero2.communication >= zero3.communication > 0
    # With more than the two blocks FSDP2 keeps gathered at once, ZeRO-2 holds more: it
    # keeps every block gathered from forward to backward.
    deep2, deep3 = (_estimate(blocks=6, nproc=4, zero=zero).memory for zero in (2, 3))
    assert deep2.communication > deep3.communication
    assert zero3.activations == one.activations  # each rank runs its own micro-batch


def test_cpu_offload_moves_the_model_states_to_host_memory():
    on_device, offloaded = _estimate(nproc=2, zero=3).memory, _estimate(nproc=2, zero=3, cpu_offload=True).memory
    assert offloaded.weights == offloaded.gradients == offloaded.optimizer == 0
    assert offloaded.host == on_device.weights + on_device.gradients + on_device.optimizer
    assert offloaded.peak_allocated < on_device.peak_allocated


def test_tensor_parallel_splits_everything_but_the_norms():
    one, tp = _estimate().memory, _estimate(tp=2).memory
    config = resolve_model("tiny-llama").config
    norms = (2 * config.num_hidden_layers + 1) * config.hidden_size * 4  # fp32 RMSNorm weights, replicated
    assert tp.weights == (one.weights - norms) // 2 + norms


def test_pipeline_ranks_hold_their_blocks_and_the_first_is_most_loaded_under_1f1b():
    result = _estimate(pp=2, microbatches=4, pp_schedule="1f1b", **{"batch_size": 8})
    layout = result.to_json()["layout"]
    first, last = layout["pipeline_ranks"]
    config = resolve_model("tiny-llama").config
    assert first["blocks"] + last["blocks"] == config.num_hidden_layers
    assert (first["embedding"], first["head"], last["embedding"], last["head"]) == (True, False, False, True)
    assert (first["chunks_in_flight"], last["chunks_in_flight"]) == (2, 1)  # 1F1B: pp - rank
    assert first["parameters"] + last["parameters"] == result.params
    assert layout["most_loaded_pipeline_rank"] in (0, 1)
    gpipe = _estimate(pp=2, microbatches=4, pp_schedule="gpipe", **{"batch_size": 8}).to_json()["layout"]
    assert gpipe["pipeline_ranks"][0]["chunks_in_flight"] == 4  # GPipe holds every chunk


def test_layouts_the_estimate_cannot_model_are_refused_with_the_flag():
    from trainwise.common.errors import InputError

    with pytest.raises(InputError, match="--tp"):
        estimate(resolve_model("tiny-t5"), Plan.from_dict({**BASE, "tp": 2}))
    with pytest.raises(InputError, match="--lora-rank"):
        _estimate(tp=2, lora_rank=4)


@pytest.mark.slow
def test_cli_shows_rank_0_and_the_layout():
    done = subprocess.run([sys.executable, "-m", "trainwise", "estimate", "tiny-llama", "--nproc", "4", "--tp", "2",
                           "--zero", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    layout = json.loads(done.stdout)["layout"]
    assert (layout["world"], layout["fsdp"], layout["tp"], layout["zero"]) == (4, 2, 2, 3)
    table = subprocess.run([sys.executable, "-m", "trainwise", "estimate", "tiny-llama", "--pp", "2"],
                           capture_output=True, text=True, timeout=120, env={"COLUMNS": "160", **_env()})
    assert table.returncode == 0, table.stderr
    assert "rank 0" in table.stdout and "pipeline" in table.stdout and "communication" in table.stdout


def _env():
    import os

    return dict(os.environ)


def test_sequence_parallel_divides_the_norms_activations_only():
    """Sequence parallel keeps 1/tp of what the norms and the residual sums saved: at 2 ranks
    the saving is about half of those (tiny-llama fp32: two norms of 2 x 4 x 64 x 64 fp32
    each per block, plus the residual sum), and model states do not change."""
    tp = _estimate(nproc=2, tp=2).memory
    sp = _estimate(nproc=2, tp=2, sequence_parallel=True).memory
    assert (sp.weights, sp.gradients, sp.optimizer) == (tp.weights, tp.gradients, tp.optimizer)
    hidden = BASE["batch_size"] * BASE["seq_len"] * 64 * 4  # one (batch, seq, hidden) fp32 tensor
    saved = tp.activations - sp.activations
    blocks = resolve_model("tiny-llama").config.num_hidden_layers
    # Per block at least the two norms' normalised inputs and the residual sum, halved.
    assert saved >= blocks * 3 * hidden // 2 and saved < tp.activations / 2


def test_a_stage_without_the_head_does_not_count_the_logits():
    """The first stage never computes logits: its peak's temporaries stay below one
    chunk's logits (2 x 512 tokens x 1024 fp32), which a trace of the whole one-device
    workload peaks on (+40 % against a measured gloo run before the head was shrunk)."""
    knobs = {"batch_size": 4, "seq_len": 512, "nproc": 2, "pp": 2, "microbatches": 2}
    first = _estimate(**knobs).memory
    logits = 2 * 512 * 1024 * 4
    assert first.at_peak["temporary"] < logits / 2
    last_stage = _estimate(**knobs).layout["pipeline_ranks"][1]
    assert last_stage["head"] and last_stage["peak_allocated"] > first.peak_allocated + logits


@pytest.mark.slow
@pytest.mark.parametrize("name, tp, pp, seq_len", [("Llama-3.1-70B", 8, 8, 4096), ("gpt2-large", 4, 4, 1024)])
def test_tensor_sequence_and_pipeline_parallel_on_a_thousand_gpus(name, tp, pp, seq_len):
    """The large-model layout (tensor + sequence parallel in a node, pipeline across
    nodes, ZeRO-3 over the rest of 1024 GPUs) is estimated, not refused, for Llama and
    GPT-2. Rank 0 holds its blocks' activations for every chunk in flight; sequence
    parallel keeps 1/tp of at least the two residual-stream tensors each block's norms
    save (fp32: one chunk's sequence x hidden x 4 bytes each), and never more than the
    (tp - 1)/tp share of all of them."""
    knobs = {"device": "H100", "nproc": 1024, "tp": tp, "pp": pp, "microbatches": pp, "batch_size": pp,
             "seq_len": seq_len, "zero": 3, "precision": "fp32"}
    spec = resolve_model(name)
    without = estimate(spec, Plan.from_dict(knobs))
    with_sp = estimate(spec, Plan.from_dict({**knobs, "sequence_parallel": True}))
    assert "sequence parallel" in with_sp.layout["description"]
    ranks = with_sp.layout["pipeline_ranks"]
    assert len(ranks) == pp and (with_sp.layout["tp"], with_sp.layout["fsdp"]) == (tp, 1024 // (tp * pp))
    rank_0 = ranks[0]
    residual = seq_len * spec.config.hidden_size * 4  # one chunk (1 sequence) of the residual stream, fp32
    shard = (1 - 1 / tp)
    saved = without.memory.activations - with_sp.memory.activations
    assert saved >= rank_0["blocks"] * rank_0["chunks_in_flight"] * 2 * residual * shard
    assert saved <= without.memory.activations * shard
    # The stages pass sequence slices: each receive buffer is 1/tp of the whole chunk.
    buffers = [r["communication_buffers"]["pipeline receive buffers"] for r in (without.layout["pipeline_ranks"][1],
                                                                                 ranks[1])]
    assert buffers[1] * tp == buffers[0]
