"""--compile compiles each transformer block (regional compilation), keeps the compiled code
in the per-user compile cache, and times the steps that compile apart from the others."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.engine.compile_cache import CACHE_ENV, enable_compile_cache
from trainwise.engine.compile_regions import compiled_blocks, transformer_blocks
from trainwise.engine.parallelize import parallelize
from trainwise.engine.throughput import StepTimer
from trainwise.models.build import build_model
from trainwise.models.resolve import resolve_model
from trainwise.plan import Plan
from trainwise.plan.layout import resolve_layout
from trainwise.plan.partition import check_layout_combination

TINY = Plan(device="cpu", batch_size=2, seq_len=16)


def _tiny_llama() -> nn.Module:
    torch.manual_seed(0)
    return build_model(resolve_model("tiny-llama"), "cpu")


def test_compile_compiles_every_block_and_leaves_the_head_and_embeddings_eager():
    model = _tiny_llama()
    setup = parallelize(model, TINY.replace(compile=True), torch.device("cpu"), total_steps=1)
    assert setup.forward is model, "blocks are compiled in place: no whole-model wrapper"
    assert compiled_blocks(model) == list(model.model.layers) and len(model.model.layers) == 2
    for eager_part in (model, model.model, model.model.embed_tokens, model.model.norm, model.lm_head):
        assert "forward" not in eager_part.__dict__


def test_an_encoder_decoder_compiles_every_block_of_both_stacks_the_blocks_the_trace_prices_as_compiled():
    """tiny-t5 has two blocks per stack; the longest ModuleList is the three sublayers of
    one decoder block, which the engine compiled before (and no whole block)."""
    from trainwise.trace.blocks import BlockTracker

    torch.manual_seed(0)
    model = build_model(resolve_model("tiny-t5"), "cpu")
    priced = BlockTracker(model).modules  # what the time model prices as compiled regions
    parallelize(model, TINY.replace(compile=True), torch.device("cpu"), total_steps=1)
    stacks = [*model.encoder.block, *model.decoder.block]
    assert compiled_blocks(model) == stacks == priced and len(stacks) == 4
    assert not any("forward" in layer.__dict__ for block in stacks for layer in block.layer)


def test_a_pipeline_stage_compiles_the_blocks_it_holds():
    from trainwise.models.families.llama import LlamaStage

    model = _tiny_llama()
    stage = LlamaStage(model, 1, 2, is_first=False, is_last=True)
    assert transformer_blocks(stage) == [model.model.layers[1]]


@pytest.mark.fault
def test_block_compile_of_a_model_without_repeated_blocks_is_refused(fault_log):
    with pytest.raises(InputError) as refused:
        parallelize(nn.Linear(4, 4), Plan(device="cpu", compile=True), torch.device("cpu"), total_steps=1)
    assert refused.value.field == "--compile-scope" and "--compile-scope model" in str(refused.value)
    fault_log(kind="bad input", case="--compile on a model with no repeated blocks", exit_code=2,
              message=str(refused.value))


@pytest.mark.fault
def test_whole_model_compile_with_tensor_parallel_is_refused_and_block_compile_is_not(fault_log):
    plan = Plan.from_dict({"device": "cpu", "batch_size": 2, "seq_len": 16, "nproc": 2, "tp": 2, "compile": True,
                           "compile_scope": "model"})
    with pytest.raises(InputError) as refused:
        check_layout_combination(plan, resolve_layout(plan))
    assert refused.value.field == "--compile-scope" and "--compile-scope blocks" in str(refused.value)
    assert "172556" in str(refused.value), "names the PyTorch limitation"
    for allowed in (plan.replace(compile_scope="blocks"), plan.replace(device="h100", compile_scope="blocks")):
        check_layout_combination(allowed, resolve_layout(allowed))  # per-block compile runs with --tp
    fault_log(kind="bad input", case="--compile --compile-scope model --tp 2", exit_code=2,
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


# One fresh process trains tiny-llama eager and then compiled into an empty compile cache;
# a second fresh process trains it compiled again with that cache. Both slow tests below
# read the two processes' reports (a cold compile costs a minute on a busy 2-core CPU).
_TRAIN_AND_REPORT = """
import json, sys
from torch._dynamo.utils import counters
from trainwise.api.training import train
from trainwise.engine.run_config import RunConfig
from trainwise.plan import Plan
folder, with_eager = sys.argv[1], sys.argv[2] == "eager"
plan, run = Plan(device="cpu", batch_size=2, seq_len=16), RunConfig(steps=4, data="synthetic", timing_warmup=0)
def lines(name, plan):
    result = train("tiny-llama", plan=plan, run=run.replace(metrics=f"{folder}/{name}.jsonl"))
    steps = [json.loads(line) for line in open(f"{folder}/{name}.jsonl")][:-1]
    return {"steps": steps, "summary": result.summary, "predicted": result.predicted, "notes": result.notes}
eager = lines("eager", plan) if with_eager else None
graphs_before = counters["stats"]["unique_graphs"]
compiled = lines("compiled", plan.replace(compile=True))
import torch
print(json.dumps({"eager": eager, "compiled": compiled, "graphs": counters["stats"]["unique_graphs"] - graphs_before,
                  "threads": torch.get_num_threads(),
                  "inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"])}))
"""


@pytest.fixture(scope="module")
def cold_and_warm(tmp_path_factory) -> tuple[dict, dict]:
    cache = tmp_path_factory.mktemp("trainwise-cache")
    env = {**os.environ, "TRAINWISE_CACHE": str(cache)}
    env.pop(CACHE_ENV, None)

    def fresh_process(eager: bool) -> dict:
        folder = tmp_path_factory.mktemp("run")
        done = subprocess.run([sys.executable, "-c", _TRAIN_AND_REPORT, str(folder), "eager" if eager else "-"],
                              env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "cache_root": str(cache)}

    return fresh_process(eager=True), fresh_process(eager=False)


@pytest.mark.slow
def test_block_compiled_model_trains_like_the_eager_one_and_reports_its_compile_time(cold_and_warm):
    """Tolerance: per-step loss within 1e-4 relative (inductor reorders float reductions).
    The compile step is found by the compiler's own events (timing_warmup is 0 here)."""
    cold, _ = cold_and_warm
    eager_steps, compiled_steps = cold["eager"]["steps"], cold["compiled"]["steps"]
    assert [s["loss"] for s in compiled_steps] == pytest.approx([s["loss"] for s in eager_steps], rel=1e-4)
    assert cold["graphs"] == 1, "both blocks run one compiled graph"
    summary = cold["compiled"]["summary"]
    assert [s["compiled"] for s in compiled_steps] == [True, False, False, False]
    assert summary["compile_steps"] == 1 and summary["compile_s"] == pytest.approx(compiled_steps[0]["step_time_s"])
    assert summary["timed_steps"] == 2, "4 steps less the compile step and the CPU memory-probe step"
    assert summary["step_times_s"] == pytest.approx([s["step_time_s"] for s in compiled_steps[1:3]], abs=1e-6)
    # The estimate traces the eager step; on this model compile needs no more memory than it.
    assert summary["peak_allocated"] <= cold["compiled"]["predicted"]["peak_allocated"] * 1.03
    # On more than one thread scatter-adds run in ATen (engine/compile_atomic_add.py), and the run says so.
    switched = [note for note in cold["compiled"]["notes"] if "scatter-adds" in note]
    assert len(switched) == (1 if cold["threads"] > 1 else 0)
    assert not any("scatter-adds" in note for note in cold["eager"]["notes"])


@pytest.mark.slow
def test_a_second_run_loads_the_compiled_blocks_from_the_cache(cold_and_warm):
    cold, warm = cold_and_warm
    cache = os.path.join(cold["cache_root"], "compile")
    assert cold["compiled"]["summary"]["compile_cache"] == warm["compiled"]["summary"]["compile_cache"] == cache
    assert cold["inductor"].get("fxgraph_cache_miss", 0) > 0 and cold["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0 and warm["inductor"].get("fxgraph_cache_hit", 0) > 0
    assert warm["aot"].get("autograd_cache_hit", 0) > 0
    assert warm["compiled"]["summary"]["compile_steps"] == 1, "loading from the cache is still timed apart"


@pytest.mark.fault
def test_compile_settings_without_compile_are_refused(fault_log):
    from trainwise.plan import InputError, Plan
    from trainwise.plan.combinations import check_combinations

    for knobs, flag in (({"compile_scope": "model"}, "--compile-scope"), ({"compile_mode": "max-autotune"},
                                                                          "--compile-mode")):
        with pytest.raises(InputError) as caught:
            check_combinations(Plan(device="cpu", **knobs))
        assert caught.value.field == flag and "--compile" in caught.value.message
        fault_log(kind="bad input", case=f"{flag} without --compile", exit_code=2, message=str(caught.value))
    check_combinations(Plan(device="cpu", compile=True, compile_scope="model"))  # with --compile: fine
