"""The engine's measurements: counted FLOPs and MFU, the memory probe, throughput and the
metrics file. No GPU here: the CUDA paths run against stand-ins for torch.cuda and NVML."""

import dataclasses
import json
import os
import sys
import types

import pytest
import torch

from tests.memory_reference import measure_step
from trainwise.engine.flops import mfu, peak_flops_for
from trainwise.engine.memory_probe import MemoryProbe
from trainwise.engine.memory_nvml import ProcessGpuMemory
from trainwise.engine.metrics import STEP_KEYS, SUMMARY_KEYS, MetricsLog, StepTimer
from trainwise.engine.run import _live_tensors
from trainwise.engine.parallelize import parallelize
from trainwise.engine.train_step import training_step
from trainwise.trace.depth import block_count, with_blocks
from trainwise.trace.flops import count_training_flops
from trainwise.hardware import resolve_device
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import Plan


def _flops(plan: Plan, name="tiny-llama", blocks=None, extrapolate=True, attention="sdpa"):
    spec = resolve_model(name)
    if blocks is not None:
        spec = dataclasses.replace(spec, config=with_blocks(spec.config, blocks))
    model = build_model(spec, "meta", attention=attention)
    return count_training_flops(model, lambda: example_batch(spec, plan.batch_size, plan.seq_len), plan, spec.task,
                                extrapolate=extrapolate)


def _projections_and_attention(config, b, s, expert_mlp=False):
    """Analytic forward FLOPs of one llama-style layer: 2 x tokens x weights of each matmul,
    plus 4 b s^2 h for the attention scores and their product with V."""
    h, inter = config.hidden_size, config.intermediate_size
    kv = h // config.num_attention_heads * config.num_key_value_heads
    attention = 2 * b * s * (2 * h * h + 2 * h * kv) + 4 * b * s * s * h
    if not expert_mlp:
        return attention + 2 * b * s * 3 * h * inter
    routed = config.num_experts_per_tok * 3 * h * inter  # each token through top-k experts
    return attention + 2 * b * s * (routed + h * config.num_local_experts)  # + the router


# ------------------------------------------------------------------------------ FLOPs
def test_forward_flops_equal_the_matmul_count_of_a_llama_and_backward_is_twice_that():
    b, s = 2, 64
    config = resolve_model("tiny-llama").config
    expected = config.num_hidden_layers * _projections_and_attention(config, b, s) \
        + 2 * b * s * config.hidden_size * config.vocab_size  # the LM head
    count = _flops(Plan(batch_size=b, seq_len=s))
    assert count.forward == expected
    assert count.backward == 2 * count.forward and count.total == 3 * count.forward


def test_experts_count_tokens_times_top_k_whatever_the_routing():
    b, s = 2, 32
    config = resolve_model("tiny-mixtral").config
    expected = config.num_hidden_layers * _projections_and_attention(config, b, s, expert_mlp=True) \
        + 2 * b * s * config.hidden_size * config.vocab_size
    count = _flops(Plan(batch_size=b, seq_len=s), "tiny-mixtral")
    assert count.forward == expected and count.backward == 2 * count.forward


def test_lora_needs_fewer_backward_flops_and_checkpointing_changes_nothing():
    plan = Plan(batch_size=2, seq_len=64)
    full = _flops(plan)
    assert _flops(plan.replace(lora_rank=4)).backward < 0.8 * full.backward
    assert _flops(plan.replace(grad_ckpt=True)) == full  # model FLOPs exclude recomputation
    # Frozen experts get an input gradient but no weight gradient.
    moe_lora = _flops(Plan(batch_size=2, seq_len=32, lora_rank=4, lora_targets="q_proj,v_proj"), "tiny-mixtral")
    assert moe_lora.backward < 1.2 * moe_lora.forward


def test_model_flops_do_not_depend_on_the_attention_kernel_or_precision():
    plan = Plan(batch_size=2, seq_len=32)
    sdpa = _flops(plan)
    assert _flops(plan, attention="eager") == sdpa  # flash's recomputed scores are not model work
    for precision in ("fp16", "bf16-pure"):  # an fp16 plan is for CUDA; the count runs anywhere
        assert _flops(plan.replace(precision=precision)) == sdpa


@pytest.mark.parametrize("name,plan", [("tiny-llama", Plan(batch_size=2, seq_len=32, lora_rank=4)),
                                       ("tiny-mixtral", Plan(batch_size=2, seq_len=32)),
                                       ("tiny-t5", Plan(batch_size=2, seq_len=32))])
def test_counting_few_blocks_and_extrapolating_equals_the_full_count(name, plan, monkeypatch):
    import trainwise.trace.flops as flops_module

    full = _flops(plan, name, blocks=5, extrapolate=False)
    counted_depths, count = [], flops_module._count
    monkeypatch.setattr(flops_module, "_count", lambda model, *args: counted_depths.append(
        block_count(model.config)) or count(model, *args))
    assert _flops(plan, name, blocks=5) == full
    assert counted_depths == [2, 3]


def test_mfu_uses_the_catalog_peak_and_names_it():
    peak, label = peak_flops_for(resolve_device("H100"), "bf16-pure")
    assert peak == pytest.approx(989.4e12)
    assert label == "H100-80GB dense bf16 peak 989 TFLOP/s (catalog)"
    assert mfu(peak / 2, peak) == pytest.approx(0.5)
    assert mfu(1e12, None) is None


def test_peak_rate_follows_the_precision_and_is_absent_without_a_catalog_figure():
    h100 = resolve_device("H100")
    rates = {p: peak_flops_for(h100, p)[0] for p in ("fp32", "tf32", "fp16", "bf16", "bf16-pure")}
    assert rates["fp32"] < rates["tf32"] < rates["bf16"] == rates["bf16-pure"] == rates["fp16"]
    peak, label = peak_flops_for(resolve_device("cpu"), "bf16")
    assert peak is None and "MFU not shown" in label
    peak, label = peak_flops_for(resolve_device("V100"), "bf16")  # no bf16 units
    assert peak is None and "V100" in label and "MFU not shown" in label


# ------------------------------------------------------------------------------ memory
def test_cpu_probe_matches_the_reference_measurement_and_ignores_other_steps():
    torch.manual_seed(0)
    spec = resolve_model("tiny-llama")
    plan = Plan(device="cpu", batch_size=2, seq_len=32, grad_accum=2)
    setup = parallelize(build_model(spec, "cpu", attention=plan.attention), plan, torch.device("cpu"), 3)
    generator = torch.Generator().manual_seed(0)
    batches = iter(lambda: example_batch(spec, 2, 32, generator=generator), None)
    probe = MemoryProbe(torch.device("cpu"), probe_step=1)
    probe.reset()
    for step in range(2):
        probe.step_begin(step, _live_tensors(setup))
        if step == 0:
            assert probe._profiler is None  # not the probe step: nothing runs
        training_step(setup, batches, plan, skip_non_finite=False)
        probe.step_end(step)
        if step == 0:
            assert probe.snapshot().peak_allocated is None
    measured = probe.snapshot()
    reference = measure_step(spec, plan).peak_allocated
    assert measured.peak_allocated == pytest.approx(reference, rel=1e-3)
    assert measured.peak_reserved is None and measured.device_total is None
    assert "profiler over step 2" in measured.method


class _FakeCuda:
    """Stand-ins for the torch.cuda memory counters and NVML (no GPU on the test machine)."""

    def __init__(self, monkeypatch, nvml_bytes):
        import trainwise.engine.memory_probe as probe_module

        self.resets, self.nvml_sessions = 0, 0
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: self._reset())
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2 * 2**30)
        props = types.SimpleNamespace(multi_processor_count=132, max_threads_per_multi_processor=2048)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        fake = self

        class Session:
            def __init__(self, device):
                fake.nvml_sessions += 1

            def used_bytes(self):
                return nvml_bytes

        monkeypatch.setattr(probe_module, "ProcessGpuMemory", Session)

    def _reset(self):
        self.resets += 1


def test_cuda_probe_reads_the_allocator_and_adds_what_lies_outside_it(monkeypatch):
    fake = _FakeCuda(monkeypatch, nvml_bytes=2 * 2**30 + 500 * 2**20)  # reserved now + 500 MiB context
    probe = MemoryProbe(torch.device("cuda", 0), probe_step=0)
    probe.reset()
    probe.step_begin(0, [torch.zeros(4)])  # the profiler is for the CPU only
    assert probe._profiler is None
    probe.step_end(0)
    measured = probe.snapshot()
    probe.snapshot()
    assert fake.resets == 1 and fake.nvml_sessions == 1  # NVML opened once, not per step
    assert (measured.peak_allocated, measured.peak_reserved) == (3 * 2**30, 4 * 2**30)
    assert measured.device_total == 4 * 2**30 + 500 * 2**20 and "NVML" in measured.method


def test_cuda_probe_without_nvml_estimates_the_context_and_says_so(monkeypatch):
    _FakeCuda(monkeypatch, nvml_bytes=None)
    measured = MemoryProbe(torch.device("cuda", 0), probe_step=0).snapshot()
    assert 4 * 2**30 + 300 * 2**20 < measured.device_total < 4 * 2**30 + 2**30
    assert "estimated" in measured.method


def test_nvml_reading_picks_this_process_on_the_right_board(monkeypatch):
    asked, processes = [], []
    process = lambda pid, used: types.SimpleNamespace(pid=pid, usedGpuMemory=used)  # noqa: E731
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda address: asked.append(address) or "handle",
        nvmlDeviceGetComputeRunningProcesses=lambda handle: processes)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    reader = ProcessGpuMemory(torch.device("cuda", 0))
    processes[:] = [process(os.getpid() + 1, 7), process(os.getpid(), 42)]
    assert reader.used_bytes() == 42 and asked == ["00000000:1B:00.0"]
    processes[:] = [process(os.getpid() + 1, 7)]  # this pid hidden (a container's namespace)
    assert reader.used_bytes() is None


def test_nvml_without_the_library_reads_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert ProcessGpuMemory(torch.device("cuda", 0)).used_bytes() is None


# ------------------------------------------------------------------------------ throughput
def test_timer_rates_leave_out_untimed_steps():
    timer = StepTimer(samples_per_step=8, tokens_per_step=800, flops_per_step=10**12, peak_flops=10**13)
    timer.record(5.0, timed=False)
    timer.record(1.0, timed=True)
    timer.record(1.0, timed=True)
    summary = timer.summary(7.0)
    assert summary["samples_per_s"] == 8 and summary["tokens_per_s"] == 800 and summary["mfu"] == pytest.approx(0.1)
    assert summary["time_s"] == 7.0 and summary["step_time_s"] == 1.0 and summary["timed_steps"] == 2
    assert summary["rates_include_warmup"] is False


def test_timer_rates_are_the_whole_jobs_with_the_per_gpu_rates_beside_them():
    timer = StepTimer(samples_per_step=8, tokens_per_step=800, flops_per_step=None, peak_flops=None, gpus=4)
    timer.record(2.0, timed=True)
    summary = timer.summary(2.0)
    assert (summary["samples_per_s"], summary["tokens_per_s"]) == (4, 400)  # the job's: 8 samples in 2 s
    assert (summary["samples_per_s_per_gpu"], summary["tokens_per_s_per_gpu"], summary["gpus"]) == (1, 100, 4)
    assert timer.rates(None) == dict.fromkeys(("samples_per_s", "tokens_per_s", "samples_per_s_per_gpu",
                                               "tokens_per_s_per_gpu"))


def test_timer_without_timed_steps_falls_back_to_all_and_flags_it():
    timer = StepTimer(samples_per_step=2, tokens_per_step=20, flops_per_step=None, peak_flops=None)
    timer.record(2.0, timed=False)
    summary = timer.summary(2.5)
    assert summary["samples_per_s"] == 1 and summary["mfu"] is None
    assert summary["timed_steps"] == 0 and summary["rates_include_warmup"] is True
    assert timer.mfu_for(1.0) is None


# ------------------------------------------------------------------------------ metrics file
def test_metrics_lines_put_the_design_keys_first_and_fill_missing_ones_with_null(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(str(path))
    log.step({"grad_norm": 0.5, "loss": 2.0, "step": 1})
    log.summary({"final_loss": 2.0, "memory_method": "cpu: ...", "time_s": 1.5})
    step, summary = (json.loads(line) for line in path.read_text().splitlines())
    assert list(step) == [*STEP_KEYS, "grad_norm"] and step["loss"] == 2.0 and step["mfu"] is None
    assert list(summary) == ["summary"] and list(summary["summary"]) == [*SUMMARY_KEYS, "memory_method"]


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


def test_metrics_log_writes_strict_json_and_restarts_without_resume(tmp_path):
    MetricsLog(None).step({"step": 1})  # no file: nothing happens
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 9}\n')
    log = MetricsLog(str(path))  # a fresh run truncates
    log.step({"step": 1, "loss": float("inf"), "nested": [float("nan"), 1.5]})
    log.summary({"time_s": 1.0, "final_loss": 2.0})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["loss"] is None and lines[0]["nested"] == [None, 1.5]
    assert lines[1]["summary"]["time_s"] == 1.0 and len(lines) == 2
    MetricsLog(str(path), resume_from_step=1)  # resume drops the old summary
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:1]
