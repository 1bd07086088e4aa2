"""--compile compiles each transformer block (regional compilation), keeps the compiled code
in the per-user compile cache, and times the steps that compile apart from the others."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from trainwise.api.training import train
from trainwise.common.errors import InputError
from trainwise.engine.compile_cache import CACHE_ENV, enable_compile_cache
from trainwise.engine.compile_regions import compiled_blocks
from trainwise.engine.parallelize import parallelize
from trainwise.engine.run_config import RunConfig
from trainwise.engine.throughput import StepTimer
from trainwise.models.build import build_model
from trainwise.models.resolve import resolve_model
from trainwise.plan import Plan

TINY = Plan(device="cpu", batch_size=2, seq_len=16)


def _tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    return build_model(resolve_model("tiny-llama"), "cpu")


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_compile_compiles_every_block_and_leaves_the_head_and_embeddings_eager():
    model = _tiny_llama()
    setup = parallelize(model, TINY.replace(compile=True), torch.device("cpu"), total_steps=1)
    assert setup.forward is model, "blocks are compiled in place: no whole-model wrapper"
    assert compiled_blocks(model) == list(model.model.layers) and len(model.model.layers) == 2
    for eager_part in (model, model.model, model.model.embed_tokens, model.model.norm, model.lm_head):
        assert "forward" not in eager_part.__dict__


@pytest.mark.fault
def test_block_compile_of_a_model_without_repeated_blocks_is_refused(fault_log):
    with pytest.raises(InputError) as refused:
        parallelize(nn.Linear(4, 4), Plan(device="cpu", compile=True), torch.device("cpu"), total_steps=1)
    assert refused.value.field == "--compile-scope" and "--compile-scope model" in str(refused.value)
    fault_log(kind="bad input", case="--compile on a model with no repeated blocks", exit_code=2,
              message=str(refused.value))


def test_compile_cache_goes_to_the_trainwise_cache_unless_the_user_named_one(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "tw"))
    monkeypatch.setenv(CACHE_ENV, "placeholder")
    monkeypatch.delenv(CACHE_ENV)  # restored after the test
    assert enable_compile_cache() == tmp_path / "tw" / "compile"
    assert os.environ[CACHE_ENV] == str(tmp_path / "tw" / "compile") and (tmp_path / "tw" / "compile").is_dir()
    assert torch._inductor.config.fx_graph_cache and torch._functorch.config.enable_autograd_cache
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert enable_compile_cache() == tmp_path / "mine"


def test_steps_that_compiled_are_summed_as_compile_time_and_left_out_of_step_times():
    timer = StepTimer(samples_per_step=2, tokens_per_step=32, flops_per_step=None, peak_flops=None)
    timer.record(9.0, timed=True, compiled=True)  # even past the warm-up, a compiling step is not timed
    timer.record(0.1, timed=True)
    timer.record(0.3, timed=True)
    summary = timer.summary(total_time_s=9.4)
    assert summary["compile_s"] == 9.0 and summary["compile_steps"] == 1
    assert summary["step_times_s"] == [0.1, 0.3] and summary["step_time_s"] == pytest.approx(0.2)
    eager = StepTimer(samples_per_step=2, tokens_per_step=32, flops_per_step=None, peak_flops=None)
    eager.record(0.1, timed=True)
    assert eager.summary(0.1)["compile_s"] is None and eager.summary(0.1)["compile_steps"] == 0


@pytest.mark.slow
def test_block_compiled_model_trains_like_the_eager_one_and_reports_its_compile_time(tmp_path):
    """Tolerance: per-step loss within 1e-4 relative (inductor reorders float reductions).
    The compile step is found by the compiler's own events, not by a warm-up count."""
    run = RunConfig(steps=4, data="synthetic", timing_warmup=0)
    eager = train("tiny-llama", plan=TINY, run=run.replace(metrics=str(tmp_path / "eager.jsonl")))
    torch._dynamo.reset()  # compile afresh even if an earlier test compiled these blocks
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = train("tiny-llama", plan=TINY.replace(compile=True),
                     run=run.replace(metrics=str(tmp_path / "compiled.jsonl")))
    eager_steps, compiled_steps = (_metrics(tmp_path / f"{name}.jsonl")[:-1] for name in ("eager", "compiled"))
    assert [s["loss"] for s in compiled_steps] == pytest.approx([s["loss"] for s in eager_steps], rel=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before == 1, "blocks share one graph"
    summary = compiled.summary
    assert [s["compiled"] for s in compiled_steps] == [True, False, False, False]
    assert summary["compile_steps"] == 1 and summary["compile_s"] == pytest.approx(compiled_steps[0]["step_time_s"])
    assert summary["timed_steps"] == 2, "4 steps less the compile step and the CPU memory-probe step"
    assert summary["compile_s"] not in summary["step_times_s"]
    assert summary["compile_cache"] and os.path.isdir(summary["compile_cache"])
    # The estimate traces the eager step; on this model compile needs no more memory than it.
    assert summary["peak_allocated"] <= compiled.predicted["peak_allocated"] * 1.03


_ONE_COMPILED_STEP = """
import json
from torch._dynamo.utils import counters
from trainwise.api.training import train
from trainwise.engine.run_config import RunConfig
from trainwise.plan import Plan
result = train("tiny-llama", plan=Plan(device="cpu", batch_size=1, seq_len=16, compile=True),
               run=RunConfig(steps=1, data="synthetic"))
print(json.dumps({"cache": result.summary["compile_cache"], "inductor": dict(counters["inductor"]),
                  "aot": dict(counters["aot_autograd"])}))
"""


@pytest.mark.slow
def test_a_second_run_loads_the_compiled_blocks_from_the_cache(tmp_path):
    env = {**os.environ, "TRAINWISE_CACHE": str(tmp_path)}
    env.pop(CACHE_ENV, None)

    def fresh_process() -> dict:
        done = subprocess.run([sys.executable, "-c", _ONE_COMPILED_STEP], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = fresh_process(), fresh_process()
    assert first["cache"] == second["cache"] == str(tmp_path / "compile")
    assert first["inductor"].get("fxgraph_cache_miss", 0) > 0 and first["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0 and second["inductor"].get("fxgraph_cache_hit", 0) > 0
    assert second["aot"].get("autograd_cache_hit", 0) > 0
