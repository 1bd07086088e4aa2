"""Counted FLOPs, the CPU memory probe and the metrics file."""

import json

import pytest
import torch

from tests.memory_reference import measure_step
from trainwise.engine.flops import count_training_flops, mfu, peak_flops_for
from trainwise.engine.memory_probe import MemoryProbe
from trainwise.engine.metrics import MetricsLog, StepTimer
from trainwise.engine.run import _live_tensors
from trainwise.engine.setup import apply_plan
from trainwise.engine.train_step import training_step
from trainwise.hardware import resolve_device
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import Plan


def _flops(plan: Plan, name="tiny-llama"):
    spec = resolve_model(name)
    model = build_model(spec, "meta", attention="sdpa")
    return count_training_flops(model, lambda: example_batch(spec, plan.batch_size, plan.seq_len), plan, spec.task)


def test_forward_flops_match_the_matmul_count_of_a_llama():
    b, s = 2, 64
    config = resolve_model("tiny-llama").config
    h, inter, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    kv = h // config.num_attention_heads * config.num_key_value_heads
    per_layer = 2 * b * s * (h * h * 2 + h * kv * 2 + 3 * h * inter) + 2 * 2 * b * s * s * h  # projections + attention
    expected = layers * per_layer + 2 * b * s * h * vocab  # plus the LM head
    count = _flops(Plan(batch_size=b, seq_len=s))
    assert count.forward == pytest.approx(expected, rel=0.02)
    assert count.backward == pytest.approx(2 * count.forward, rel=0.05)


def test_lora_needs_fewer_backward_flops_and_checkpointing_changes_nothing():
    plan = Plan(batch_size=2, seq_len=64)
    full = _flops(plan)
    assert _flops(plan.replace(lora_rank=4)).backward < 0.8 * full.backward
    assert _flops(plan.replace(grad_ckpt=True)) == full  # model FLOPs exclude recomputation


def test_mfu_uses_the_catalog_peak_and_names_it():
    peak, label = peak_flops_for(resolve_device("H100"), "bf16-pure")
    assert peak > 5e14 and "bf16" in label and "catalog" in label
    assert mfu(peak / 2, peak) == pytest.approx(0.5)
    assert peak_flops_for(resolve_device("cpu"), "fp32")[0] is None
    assert mfu(1e12, None) is None


def test_cpu_probe_matches_the_reference_measurement():
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama")
    plan = Plan(device="cpu", batch_size=4, seq_len=64)
    setup = apply_plan(build_model(spec, "cpu", attention=plan.attention), plan, torch.device("cpu"), 3)
    generator = torch.Generator().manual_seed(0)
    batches = iter(lambda: example_batch(spec, 4, 64, generator=generator), None)
    probe = MemoryProbe(torch.device("cpu"), probe_step=1)
    for step in range(2):
        probe.step_begin(step, _live_tensors(setup))
        training_step(setup, batches, plan, skip_non_finite=False)
        probe.step_end(step)
        if step == 0:
            assert probe.snapshot().peak_allocated is None  # not the probe step
    measured = probe.snapshot()
    reference = measure_step(spec, plan).peak_allocated
    assert measured.peak_allocated == pytest.approx(reference, rel=0.05)
    assert measured.peak_reserved is None and "profiler" in measured.method


def test_timer_rates_leave_out_untimed_steps():
    timer = StepTimer(samples_per_step=8, tokens_per_step=800, flops_per_step=10**12, peak_flops=10**13)
    timer.record(5.0, timed=False)
    timer.record(1.0, timed=True)
    timer.record(1.0, timed=True)
    summary = timer.summary(7.0)
    assert summary["samples_per_s"] == 8 and summary["tokens_per_s"] == 800 and summary["mfu"] == pytest.approx(0.1)
    assert summary["time_s"] == 7.0 and summary["timed_steps"] == 2


def test_metrics_log_on_resume_drops_torn_lines_and_later_steps(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(str(path))
    for step in (1, 2, 3):
        log.step({"step": step, "loss": float(step)})
    with open(path, "a") as handle:
        handle.write('{"step": 4, "lo')  # a run killed mid-write
    MetricsLog(str(path), resume_from_step=2).step({"step": 3, "loss": float("nan")})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3] and lines[-1]["loss"] is None
