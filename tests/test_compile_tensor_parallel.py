"""Per-block torch.compile over tensor-parallel (DTensor) blocks trains like one eager
process: tp 2, with and without sequence parallel, and tp 2 x ZeRO-3 2, on gloo (inductor's
CPU backend).

Tolerance: per-step loss within 1e-4 relative, as for one compiled process
(tests/test_compile_regions.py): inductor may reorder float reductions inside a block."""

import json

import pytest

from distributed_launch import CASES_WORKER, launch
from trainwise.api.training import train
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan

STEPS = 4
BASE = {"batch_size": 2, "seq_len": 32, "lr": 1e-3}
LAYOUTS = {"TP 2, compiled blocks": {"tp": 2}, "TP 2, sequence parallel, compiled blocks": {"tp": 2, "sequence_parallel": True}}


def _eager_one_process(grad_accum: int = 1) -> list[float]:
    """Tensor-parallel peers share their samples, so one process with the same micro-batch
    sees the same data per step (accumulation stands in for data-parallel ranks)."""
    losses = []
    train(resolve_model("tiny-llama"), plan=Plan.from_dict({**BASE, "grad_accum": grad_accum, "device": "cpu"}),
          run=RunConfig.from_dict({"steps": STEPS, "data": "synthetic", "timing_warmup": 0}),
          on_step=lambda entry: losses.append(entry.outcome.loss))
    return losses


@pytest.mark.slow
@pytest.mark.distributed
def test_block_compile_over_tensor_parallel_blocks_matches_one_eager_process(tmp_path):
    cases = [{"name": name, "model": "tiny-llama", "knobs": {**BASE, **knobs, "compile": True}, "steps": STEPS,
              "config": {}} for name, knobs in LAYOUTS.items()]
    done = launch(CASES_WORKER, 2, tmp_path, [json.dumps(cases)], timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = _eager_one_process()
    for name in LAYOUTS:
        for rank, output in done.rank_outputs.items():
            result = output[name]
            assert "error" not in result, f"{name} on rank {rank}: {result.get('traceback')}"
            assert result["losses"] == pytest.approx(reference, rel=1e-4), f"{name} on rank {rank}"


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_over_compiled_tensor_parallel_blocks_matches_one_eager_process(tmp_path):
    """The recipe of large runs, on 4 ranks: tp 2 x ZeRO-3 2 (FSDP2 shards the compiled
    DTensor blocks), against one eager process accumulating 2 micro-batches."""
    name = "TP 2 x ZeRO-3 2, compiled blocks"
    case = {"name": name, "model": "tiny-llama", "knobs": {**BASE, "tp": 2, "zero": 3, "compile": True},
            "steps": STEPS, "config": {}}
    done = launch(CASES_WORKER, 4, tmp_path, [json.dumps([case])], timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = _eager_one_process(grad_accum=2)
    for rank, output in done.rank_outputs.items():
        assert "error" not in output[name], f"rank {rank}: {output[name].get('traceback')}"
        assert output[name]["losses"] == pytest.approx(reference, rel=1e-4), f"rank {rank}"


def test_estimate_prices_tensor_parallel_with_compile_for_a_gpu_target():
    """Once refused at estimate time; now the per-rank step is priced with the compiled
    regions' fused kernels, so it is predicted no slower than the eager tp 2 step."""
    from trainwise.api.estimate import estimate

    spec = resolve_model("tiny-llama")
    plan = Plan.from_dict({**BASE, "device": "h100", "precision": "bf16", "nproc": 2, "tp": 2})
    eager, compiled = estimate(spec, plan), estimate(spec, plan.replace(compile=True))
    assert compiled.layout is not None and compiled.plan.compile
    assert any("--compile (scope blocks)" in note for note in compiled.time.notes)
    assert compiled.time.breakdown["elementwise"] < eager.time.breakdown["elementwise"]
    assert compiled.time.step_s <= eager.time.step_s
