"""Under --compile the estimate shows the eager step's memory as an upper bound
(docs/estimate.md, "Compiled steps"). Pinned here on a real CPU step: tiny-llama compiled
block by block peaks below the eager estimate, by exactly what AOTAutograd's partitioner
recomputes in backward instead of saving."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from trainwise.api import estimate
from trainwise.engine.compile_cache import CACHE_ENV
from trainwise.engine.compile_regions import compile_model_parts
from trainwise.engine.memory_probe import highest_running_sum, unique_storage_bytes
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan.plan import Plan
from trainwise.step import build_optimizer, compute_loss, precision_policy, prepare_model

BATCH, SEQ = 4, 64


def _measured_peak(plan: Plan) -> int:
    """Peak tensor bytes of the second step (the first one compiles), counted as
    `trainwise train` counts its CPU probe step: what is alive at the step's start plus
    the highest running sum of the profiler's allocation events during it."""
    spec = resolve_model("tiny-llama")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = build_model(spec, "cpu", attention=plan.attention, batch_size=plan.batch_size, seq_len=plan.seq_len)
    model = prepare_model(model, plan, precision_policy(plan.precision, "cpu"), spec.task)
    forward = compile_model_parts([model], plan, in_place=False)[0]
    optimizer = build_optimizer(plan, model, "cpu")
    peak = 0
    for step in range(2):
        gc.collect()
        state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        baseline = unique_storage_bytes([*model.parameters(), *model.buffers(), *state])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            batch = example_batch(spec, plan.batch_size, plan.seq_len, device="cpu", generator=generator)
            compute_loss(forward, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del batch
        peak = baseline + highest_running_sum(prof.profiler.kineto_results.events())
    return peak


@pytest.mark.slow  # one cold compile of two blocks: 15-30 s on a busy 2-core CPU
def test_a_block_compiled_step_peaks_below_the_eager_estimate_by_what_the_partitioner_recomputes(
        monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "compile"))  # cold, and not the user's cache
    plan = Plan(device="cpu", batch_size=BATCH, seq_len=SEQ)
    eager, compiled = _measured_peak(plan), _measured_peak(plan.replace(compile=True))
    bound = estimate("tiny-llama", plan.replace(compile=True)).memory.peak_allocated
    assert compiled <= bound, "the compiled step exceeded the figure the estimate calls its upper bound"
    # Per block the eager step saves SiLU's output for the gated product and, in each of
    # the two RMSNorms, x * rsqrt for the weight's multiply; the compiled backward
    # recomputes all three (element-wise, used only by element-wise ops in backward).
    config = resolve_model("tiny-llama").config
    per_block = BATCH * SEQ * (config.intermediate_size + 2 * config.hidden_size) * 4
    assert eager - compiled == config.num_hidden_layers * per_block
