"""plan --verify: the top plans run for real on this machine, predicted and measured side by
side, the measured best recommended (or no winner declared when the runs cannot tell), and
the measured/predicted step-time ratio written into the device profile."""

import argparse
import json
import re

import pytest
from rich.console import Console

from trainwise.bench import runner
from trainwise.bench.rows import empty_row, row_from_summary, row_plan
from trainwise.cli.render_verify import render_verify
from trainwise.cli.verify_args import add_verify_arguments, run_verify_from_args, verify_count
from trainwise.common.errors import InputError
from trainwise.hardware.catalog import find_gpu
from trainwise.hardware.device import catalog_device, cpu_device
from trainwise.hardware.catalog_profile import catalog_profile
from trainwise.hardware.profile import DeviceProfile, Rate, profile_for, read_profile, write_profile
from trainwise.plan import Plan
from trainwise.search import verify
from trainwise.search.candidate import Candidate
from trainwise.search.corrections import CORRECTIONS_OVER_CATALOG, apply_corrections, record_corrections
from trainwise.search.verify import VerifiedCandidate, VerifyReport, verify_candidates

MODEL = "tiny-llama"
SEQ = 32


def candidate(step_s: float, memory: int = 4 << 20, **knobs) -> Candidate:
    """A hand-made candidate: verify does not care where a prediction came from."""
    plan = Plan.from_dict({"device": "cpu", "seq_len": SEQ, "batch_size": 1, **knobs})
    samples = plan.batch_size * plan.grad_accum
    return Candidate(plan=plan, memory_bytes=memory, step_s=step_s, tokens_per_s=samples * SEQ / step_s,
                     samples_per_s=samples / step_s, mfu=None)


def cpu_profile(**corrections) -> DeviceProfile:
    return DeviceProfile(device_name="cpu", kind="cpu", source="test", matmul={"fp32": Rate(1e10, 1e-5)},
                         attention={}, memory=Rate(1e10), host_s_per_op=1e-5, corrections=corrections)


class FakeRunner:
    """Stands in for bench.runner.run_row: plan #rank's k-th run takes `times[rank][k]`
    seconds per step, or ends with the status given instead of a list."""

    def __init__(self, times: dict):
        self.times, self.jobs = times, []

    def __call__(self, job, predicted=None):
        self.jobs.append(job)
        rank, attempt = map(int, re.fullmatch(r"verify-(\d+)-run-(\d+)", job.name).groups())
        outcome = self.times[rank]
        if isinstance(outcome, str):
            return empty_row(job.name, row_plan(job.plan), "trainwise", outcome, f"made-up {outcome}")
        samples = job.plan.batch_size * job.plan.grad_accum
        summary = {"samples_per_s": samples / outcome[attempt - 1], "tokens_per_s": samples * SEQ / outcome[attempt - 1],
                   "peak_allocated": 5 << 20, "device_total": None}
        return row_from_summary(job.name, row_plan(job.plan), "trainwise", summary, None)


@pytest.fixture
def quiet_machine(monkeypatch):
    """The runs' timings are made up or tiny: the verdict must not depend on the load of
    the machine the tests run on."""
    monkeypatch.setattr(verify, "_busy_machine", lambda device_kind: None)


def run_fake(monkeypatch, tmp_path, candidates, times, repeat=3, profile=None):
    monkeypatch.setattr(runner, "run_row", FakeRunner(times))
    path = None
    if profile is not None:
        path = write_profile(profile, tmp_path / "cpu.json")
    return verify_candidates(MODEL, candidates, steps=4, timing_warmup=1, repeat=repeat, workdir=tmp_path,
                             task=None, profile_path=path, device=cpu_device())


@pytest.mark.slow
def test_verify_runs_the_plans_for_real_and_reports_a_skipped_one(tmp_path, quiet_machine):
    plans = [candidate(0.01), candidate(0.02, batch_size=2), candidate(0.005, precision="fp16")]
    profile = write_profile(cpu_profile(), tmp_path / "cpu.json")
    report = verify_candidates(MODEL, plans, steps=3, timing_warmup=1, repeat=1, workdir=tmp_path / "runs",
                               task=None, profile_path=profile, device=cpu_device())
    ran, skipped = report.entries[:2], report.entries[2]
    for entry in ran:
        assert entry.status == "ok" and entry.measured_step_s > 0 and len(entry.measured_runs_s) == 1
        assert entry.memory_kind == "peak allocated" and entry.measured_memory_bytes > 1 << 20
    assert skipped.status == "skipped" and "fp16" in skipped.message and skipped.measured_step_s is None
    per_sample = {i: ran[i].measured_step_s / ran[i].candidate.plan.batch_size for i in (0, 1)}
    assert report.recommended == min(per_sample, key=per_sample.get)
    assert report.predicted_best == 2  # fp16 was predicted fastest and could not run
    assert any("predicted best #3 did not run here" in line for line in report.lines)
    stored = read_profile(profile)
    median_of_two = (ran[0].step_ratio + ran[1].step_ratio) / 2
    assert stored.corrections["step:tiny-llama"] == pytest.approx(median_of_two, rel=1e-4)


def test_recommends_the_measured_best_and_says_by_how_much_it_beat_the_prediction(monkeypatch, tmp_path,
                                                                                   quiet_machine):
    plans = [candidate(0.10), candidate(0.25, batch_size=2)]
    report = run_fake(monkeypatch, tmp_path, plans, {1: [0.30, 0.31, 0.30], 2: [0.40, 0.41, 0.40]})
    # #2 runs two samples in 0.40 s, #1 one sample in 0.30 s: #2 is faster per sample.
    assert report.recommended == 1 and report.predicted_best == 0 and report.confident
    assert report.entries[0].measured_step_s == pytest.approx(0.30)
    assert report.entries[0].spread == pytest.approx(0.01 / 0.30)
    assert "the next, #1, measured +50.0 % time per sample, beyond the run-to-run spread" in report.lines[0]
    assert any("differs from the predicted best #1: #1 measured +50.0 %" in line for line in report.lines)


def test_no_winner_is_declared_when_the_runs_overlap(monkeypatch, tmp_path, quiet_machine):
    report = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.1, grad_ckpt=True)],
                      {1: [0.30, 0.33, 0.31], 2: [0.32, 0.34, 0.32]})
    assert report.recommended == 0 and not report.confident
    assert "no clear winner: it cannot be told apart from #2" in report.lines[0]


def test_no_winner_is_declared_when_a_spread_is_over_ten_percent(monkeypatch, tmp_path, quiet_machine):
    report = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.1, grad_ckpt=True)],
                      {1: [0.20, 0.25, 0.21], 2: [0.26, 0.27, 0.26]})
    assert report.entries[0].spread > 0.10 and not report.confident


def test_single_runs_closer_than_ten_percent_are_not_told_apart(monkeypatch, tmp_path, quiet_machine):
    close = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.1, grad_ckpt=True)],
                     {1: [0.30], 2: [0.32]}, repeat=1)
    apart = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.1, grad_ckpt=True)],
                     {1: [0.30], 2: [0.40]}, repeat=1)
    assert not close.confident and apart.confident and apart.recommended == 0


def test_an_out_of_memory_plan_is_reported_and_the_others_still_run(monkeypatch, tmp_path, quiet_machine):
    report = run_fake(monkeypatch, tmp_path, [candidate(0.1, batch_size=2), candidate(0.2)],
                      {1: "oom", 2: [0.3, 0.3, 0.3]})
    assert [e.status for e in report.entries] == ["oom", "ok"]
    assert report.entries[0].message == "made-up oom" and report.entries[0].step_ratio is None
    assert report.recommended == 1
    assert any("predicted best #1 did not run here (oom" in line for line in report.lines)


def test_the_median_ratio_is_written_atomically_into_the_profile_file(monkeypatch, tmp_path, quiet_machine):
    report = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.2), candidate(0.4)],
                      {1: [0.15] * 3, 2: [0.2] * 3, 3: [0.8] * 3}, profile=cpu_profile())
    assert [e.step_ratio for e in report.entries] == pytest.approx([1.5, 1.0, 2.0])
    stored = read_profile(report.profile_written)
    assert stored.corrections == {"step:tiny-llama": 1.5, "step": 1.5}
    assert stored.measured["verify_history"][-1]["median_ratio"] == 1.5
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json") == ["cpu.json"]  # no temporary left


def test_a_new_ratio_composes_with_the_correction_the_prediction_already_carried():
    entries = tuple(VerifiedCandidate(rank, candidate(0.1), "ok", measured_runs_s=(0.1 * ratio,))
                    for rank, ratio in enumerate((1.1, 1.2, 1.5), 1))
    report = VerifyReport(MODEL, "cpu", 4, 1, 1, entries)
    composed = apply_corrections(cpu_profile(**{"step:tiny-llama": 2.0, "step:other": 1.0}), report, MODEL)
    assert composed.corrections["step:tiny-llama"] == pytest.approx(2.4)
    assert composed.corrections["step"] == pytest.approx((2.4 + 1.0) / 2)  # median over the models
    # A model never verified was predicted with "step": that is what the ratio composes with.
    borrowed = apply_corrections(cpu_profile(step=3.0), report, MODEL)
    assert borrowed.corrections["step:tiny-llama"] == pytest.approx(3.6)


def test_a_catalog_profile_becomes_a_cache_file_marked_as_corrections_over_catalog(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    h100 = catalog_device(find_gpu("H100"))
    entry = VerifiedCandidate(1, candidate(0.1), "ok", measured_runs_s=(0.125,))
    report = record_corrections(VerifyReport(MODEL, h100.name, 4, 1, 1, (entry,)), MODEL, h100, None)
    cached = profile_for(h100)
    assert cached.source == str(report.profile_written) and report.profile_written.parent == tmp_path / "profiles"
    assert cached.measured["kind"] == CORRECTIONS_OVER_CATALOG
    assert cached.corrections["step:tiny-llama"] == pytest.approx(1.25)
    assert cached.matmul == catalog_profile(h100).matmul  # the rates are still the catalog's


def test_a_busy_machine_writes_no_correction_and_declares_no_winner(monkeypatch, tmp_path):
    monkeypatch.setattr(verify, "_busy_machine", lambda device_kind: "the machine was busy (made up)")
    report = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.1, grad_ckpt=True)],
                      {1: [0.1] * 3, 2: [0.5] * 3}, profile=cpu_profile())
    assert report.recommended == 0 and not report.confident and report.profile_written is None
    assert "not written" in report.corrections_note and read_profile(tmp_path / "cpu.json").corrections == {}


def test_the_table_puts_predicted_and_measured_side_by_side_with_units(monkeypatch, tmp_path, quiet_machine):
    report = run_fake(monkeypatch, tmp_path, [candidate(0.1), candidate(0.2, batch_size=2), candidate(0.1, grad_ckpt=True)],
                      {1: [0.2] * 3, 2: [0.3] * 3, 3: "error"}, profile=cpu_profile())
    console = Console(record=True, width=220)
    render_verify(report, console)
    text = console.export_text()
    for label in ("step time (s)", "predicted", "measured, median", "measured /", "peak memory",
                  "2.00x", "4.0 MiB", "5.0 MiB", "--batch-size 2", "--grad-ckpt", "error [1]", "[1] made-up error",
                  "2 (recommended)", "written to"):
        assert label in text, label


def test_the_cli_glue_verifies_the_top_k_and_prints_the_table(monkeypatch, tmp_path, capsys, quiet_machine):
    fake = FakeRunner({1: [0.2] * 2, 2: [0.3] * 2, 3: [0.1] * 2})
    monkeypatch.setattr(runner, "run_row", fake)
    parser = argparse.ArgumentParser()
    add_verify_arguments(parser)
    args = parser.parse_args(["--verify", "2", "--verify-repeat", "2"])
    report = run_verify_from_args(args, MODEL, [candidate(0.1), candidate(0.2), candidate(0.3)], cpu_device(),
                                  write_profile(cpu_profile(), tmp_path / "p.json"))
    assert len(report.entries) == 2 and len(fake.jobs) == 4
    assert {job.steps for job in fake.jobs} == {4} and {job.timing_warmup for job in fake.jobs} == {1}
    assert "verify: tiny-llama on cpu, 2 run(s) per plan x 4 steps" in capsys.readouterr().out
    assert json.loads(json.dumps(verify.report_to_json(report)))["recommended_rank"] == 1


@pytest.mark.parametrize("argv, field", [(["--verify", "0"], "--verify"), (["--verify", "two"], "--verify"),
                                         (["--verify", "2", "--verify-repeat", "0"], "--verify-repeat")])
def test_bad_verify_flags_are_refused_before_any_run(argv, field, fault_log):
    parser = argparse.ArgumentParser()
    add_verify_arguments(parser)
    with pytest.raises(InputError) as refused:
        verify_count(parser.parse_args(argv))
    assert refused.value.field == field
    fault_log(kind="bad input", case=" ".join(argv), exit_code=2, message=str(refused.value))


def test_too_few_steps_or_an_absent_gpu_are_refused_before_any_run(monkeypatch, tmp_path, fault_log):
    fake = FakeRunner({})
    monkeypatch.setattr(runner, "run_row", fake)
    monkeypatch.setattr(verify, "catalog_gpu_present", lambda name: False)  # whatever this machine has
    cases = [("--verify-steps 2 on the CPU", cpu_device(), 2), ("a catalog GPU not present", catalog_device(find_gpu("H100")), 5)]
    for case, device, steps in cases:
        with pytest.raises(InputError) as refused:
            verify_candidates(MODEL, [candidate(0.1)], steps=steps, timing_warmup=1, repeat=1, workdir=tmp_path,
                              task=None, profile_path=None, device=device)
        fault_log(kind="bad input", case=f"plan --verify: {case}", exit_code=2, message=str(refused.value))
    assert fake.jobs == []


def test_verify_asks_the_shared_busy_check_for_its_device(monkeypatch):
    asked = []
    monkeypatch.setattr(verify, "busy_machine", lambda device: asked.append(device) or "machine busy: made up")
    assert verify._busy_machine("cpu") == "machine busy: made up" and asked == ["cpu"]
