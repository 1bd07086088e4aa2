"""`trainwise calibrate`: measures this device and writes a profile the time model reads.

The quick mode keeps these tests to a few seconds each; its figures are coarse, so the
tests hold the profile to what any honest measurement shows (positive, finite rates; a
large matmul doing more FLOPs per second than a tiny one), not to this machine's speed."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from trainwise.cli.main import main
from trainwise.hardware.device import cpu_device
from trainwise.hardware.profile import COLLECTIVES, default_profile_path, read_profile


def _finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _rates(profile):
    return [*profile.matmul.values(), *profile.attention.values(), profile.memory, profile.optimizer,
            profile.random, *profile.collectives.values()]


@pytest.fixture(scope="module")
def cached_profile():
    """One quick calibration of the CPU into the (test-private) per-user cache."""
    path = default_profile_path(cpu_device())
    path.unlink(missing_ok=True)
    # On one thread calibrate times the CPU by the process's own CPU seconds, which a busy
    # machine does not inflate; on several it reads the wall clock, where one preempted
    # sample of a large matmul (a single call of a few ms in quick mode) made it look slower
    # per FLOP than a tiny one. The rates asserted below hold on any thread count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["calibrate", "--quick"]) == 0
    finally:
        torch.set_num_threads(threads)
    return path


def test_without_out_the_profile_lands_in_the_per_user_cache_for_this_device(cached_profile):
    assert cached_profile.is_file()
    profile = read_profile(cached_profile)
    assert profile.kind == "cpu" and profile.source == str(cached_profile)


def test_a_quick_profile_has_positive_finite_rates_for_each_kind_of_work(cached_profile):
    profile = read_profile(cached_profile)
    assert "fp32" in profile.matmul and "fp32" in profile.attention
    for rate in _rates(profile):
        assert _finite_positive(rate.per_s) and math.isfinite(rate.fixed_s) and rate.fixed_s >= 0
    assert _finite_positive(profile.host_s_per_op)
    assert _finite_positive(profile.measured["optimizer_step"]["per_s"])
    assert profile.host_to_device is None and profile.collectives == {}  # a CPU, one process


def test_a_cpu_profiles_step_factors_are_the_measured_ratios_held_at_one(cached_profile):
    """The factors come from what the profile records as measured (the ratio before it is
    held at 1), and a recomputed op costs the host at least what a plain one does."""
    profile = read_profile(cached_profile)
    step = profile.measured["training_step"]
    assert profile.step_contraction_factor == max(1.0, step["contraction"]["ratio"])
    assert step["contraction"]["ratio"] == pytest.approx(step["contraction"]["in_step_s"]
                                                         / step["contraction"]["replayed_s"])
    assert profile.host_s_per_recomputed_op == step["recomputed"]["host_s_per_recomputed_op"]
    assert profile.host_s_per_recomputed_op >= profile.host_s_per_op > 0
    # selective checkpointing's own figure, from its own reference step
    assert profile.host_s_per_selective_recomputed_op == step["selective_recomputed"]["host_s_per_recomputed_op"]
    assert profile.host_s_per_selective_recomputed_op >= profile.host_s_per_op
    assert step["selective_recomputed"]["recomputed_ops"] > 0
    # each from its checkpointed step less the plain one timed beside it, less the predicted rise
    from trainwise.calibration.host_time import recomputed_op_host

    for found in (step["recomputed"], step["selective_recomputed"]):
        rise = found["predicted_without_recomputed_host_s"] - found["predicted_plain_s"]
        assert found["host_s_per_recomputed_op"] == recomputed_op_host(found["measured_rise_s"], rise,
                                                                       found["recomputed_ops"], profile.host_s_per_op)
        assert found["plain_step_s"] > 0 and found["spread"] >= 0 and found["plain_spread"] >= 0
    assert step["contraction"]["ops"] > 0


def test_attention_is_measured_at_each_head_dim_and_the_reference_ones_fit_is_the_profiles_one_rate(cached_profile):
    """The attention kernel's rate by head dim, per dtype; the reference head dim (quick:
    32) measured over every sequence length as before, the others over fewer (keeps
    calibrate short), each fitted from its own points."""
    from trainwise.calibration.compute import HEAD_DIMS

    profile = read_profile(cached_profile)
    points = profile.measured["points"]
    assert set(profile.attention_by_head_dim) == set(profile.attention) >= {"fp32"}
    for dtype, single in profile.attention.items():
        by_head_dim = profile.attention_by_head_dim[dtype]
        assert sorted(by_head_dim) == list(HEAD_DIMS) and by_head_dim[32] == single
        for head_dim, rate in by_head_dim.items():
            assert _finite_positive(rate.per_s) and math.isfinite(rate.fixed_s) and rate.fixed_s >= 0
            assert len(points[f"attention {dtype}" + ("" if head_dim == 32 else f" head dim {head_dim}")]) == (
                3 if head_dim == 32 else 2)


def test_the_calibrate_table_shows_attention_by_head_dim_where_measured_else_the_one_rate():
    from trainwise.cli.render_calibrate import rate_rows
    from trainwise.hardware.profile import DeviceProfile, Rate

    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e11)}, {"fp32": Rate(4e10), "bf16": Rate(5e10)},
                            Rate(1e9), 1e-5, attention_by_head_dim={"bf16": {64: Rate(5e10), 16: Rate(2e10, 3e-5)}})
    shown = {what: (throughput, fixed) for what, throughput, fixed in rate_rows(profile) if what.startswith("attention")}
    assert shown == {"attention fp32 (fwd+bwd)": ("0.04 TFLOP/s", "0 µs"),
                     "attention bf16, head dim 16 (fwd+bwd)": ("0.02 TFLOP/s", "30 µs"),
                     "attention bf16, head dim 64 (fwd+bwd)": ("0.05 TFLOP/s", "0 µs")}


def test_dropouts_random_numbers_are_measured_and_cost_a_cpu_more_per_byte_than_an_add(cached_profile):
    """A generator's arithmetic per element (~40x an add's on one thread of the project's
    CPU): priced at the memory rate, dropout was all but free."""
    profile = read_profile(cached_profile)
    assert profile.random.per_s < profile.memory.per_s / 4


def test_a_quick_cpu_profile_times_a_compiled_dropout_on_the_bytes_the_trace_charges_its_random_ops(cached_profile):
    """The compiled rate is fitted on what trainwise/trace/fusion.py charges a compiled
    region's random op (on the CPU dropout's bernoulli_ mask, read and written in fp32), so
    the time model charges the timed seconds back; its fixed cost is the region call's."""
    from trainwise.calibration.compiled_random import random_bytes
    from trainwise.calibration.memory import element_counts
    from trainwise.calibration.timing import QUICK

    profile = read_profile(cached_profile)
    assert profile.compiled_random is not None and _finite_positive(profile.compiled_random.per_s)
    assert profile.compiled_random.fixed_s == 0.0
    assert "random in a compiled region" in profile.measured["spread"]
    cpu = torch.device("cpu")
    counts = element_counts(cpu, QUICK)
    assert [x for x, _ in profile.measured["compiled_random"]["points"]] == [2 * 4 * n for n in counts]
    assert [random_bytes(n, cpu) for n in counts] == [2 * 4 * n for n in counts]


def test_the_compiled_dropout_is_timed_as_training_runs_it_writing_the_mask_backward_reads(monkeypatch):
    """Timed without a gradient the generated kernel writes no mask, and a compiled step's
    dropout (whose mask backward reads) cost ~2.7 x what that timing priced it at."""
    from trainwise.calibration import compiled_random
    from trainwise.calibration.timing import QUICK

    timed = []

    def first_two(cases, sync, settings):
        for size, make in sorted(cases)[:2]:
            out = make()()
            timed.append(out)
        raise RuntimeError("stop after the first two sizes")
    monkeypatch.setattr(compiled_random, "measure_sizes", first_two)
    found = compiled_random.measure_compiled_random(torch.device("cpu"), QUICK)
    assert found["rate"] is None and "stop after the first two sizes" in found["why"]
    assert len(timed) == 2 and all(out.requires_grad and out.grad_fn is not None for out in timed)


def test_where_torch_compile_fails_the_profile_prices_compiled_dropout_at_the_eager_rate(monkeypatch):
    from trainwise.api import calibrate
    from trainwise.calibration.timing import QUICK
    from trainwise.hardware.profile import DeviceProfile, Rate

    def no_compiler(function, **options):
        raise RuntimeError("InductorError: CppCompileError: no C++ compiler found\nmore")
    monkeypatch.setattr(torch, "compile", no_compiler)
    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e10)}, {}, Rate(1e10), 5e-6, random=Rate(2e9))
    spreads = {}
    found = calibrate._with_compiled_random(profile, torch.device("cpu"), QUICK, spreads)
    assert spreads == {}
    assert found.compiled_random is None and found.compiled_random_rate("fp32") == Rate(2e9)
    assert found.measured["compiled_random"]["why"] == (
        "torch.compile failed on this machine (RuntimeError: InductorError: CppCompileError: no C++ compiler "
        "found): nothing measured")


def test_the_element_wise_rates_are_measured_in_bf16_too_where_the_cpu_runs_it(cached_profile):
    """A CPU core spends about as long per element on bf16 as on fp32: its byte rates are
    fp32's over the per-byte slowdown of like ops at like sizes, timed side by side."""
    profile = read_profile(cached_profile)
    dtypes = ["bf16"] if "bf16" in profile.matmul else []
    for kind in ("memory", "transcendental", "random"):
        assert list(profile.byte_rates_by_dtype.get(kind, {})) == dtypes, kind
        for dtype in dtypes:
            rate, found = profile.byte_rates_by_dtype[kind][dtype], profile.measured["byte_rates_vs_fp32"][f"{kind} {dtype}"]
            assert rate.per_s == pytest.approx(getattr(profile, kind).per_s / found["ratio"])
            assert rate.fixed_s == getattr(profile, kind).fixed_s
            assert found["pairs"] and found["ratio"] == pytest.approx(
                statistics.median(pair["ratio"] for pair in found["pairs"]))
            assert f"{kind} {dtype} vs fp32" in profile.measured["spread"]


def test_calibrate_measures_the_element_wise_rates_in_each_dtype_the_device_runs_but_tf32_and_fp8(monkeypatch):
    """fp32 fitted into the profile's own fields; bf16 and fp16 (a GPU's list) as fp32's
    rate over their measured per-byte slowdown, into byte_rates_by_dtype; not tf32 (a
    matmul mode) nor fp8. Faked timings: fast."""
    from trainwise.api import calibrate
    from trainwise.calibration import compute, memory
    from trainwise.calibration.timing import QUICK, Fit
    from trainwise.hardware.profile import Rate

    asked = []
    fitted = {"memory": 8e9, "transcendental": 4e9, "random": 2e9}
    slowdown = {"bf16": 2.5, "fp16": 1.25}

    def measure_bytes(kind, device, settings):
        asked.append((kind, "fp32"))
        return Fit(Rate(fitted[kind], 1e-6), [(1.0, 1e-6)], 0.0)

    def measure_bytes_relative(kind, dtype, device, settings):
        asked.append((kind, dtype))
        return slowdown[dtype], {"ratio": slowdown[dtype], "spread": 0.01, "pairs": []}

    monkeypatch.setattr(compute, "dtypes_to_measure", lambda device: ["fp32", "tf32", "bf16", "fp16", "fp8"])
    monkeypatch.setattr(compute, "measure_matmul", lambda *a, **k: Fit(Rate(1e10), [(1.0, 1e-6)], 0.0))
    monkeypatch.setattr(compute, "measure_attention",
                        lambda *a, **k: dict.fromkeys(compute.HEAD_DIMS, Fit(Rate(1e10), [(1.0, 1e-6)], 0.0)))
    monkeypatch.setattr(memory, "measure_bytes", measure_bytes)
    monkeypatch.setattr(memory, "measure_bytes_relative", measure_bytes_relative)
    monkeypatch.setattr(memory, "measure_optimizer", lambda *a, **k: Fit(Rate(1e9), [(1.0, 1e-6)], 0.0))
    monkeypatch.setattr(memory, "measure_host_overhead", lambda *a, **k: (5e-6, 0.0))
    rates, spreads, measured = calibrate._measure_one_device(torch.device("cpu"), QUICK)
    assert sorted(asked) == sorted((kind, dtype) for kind in fitted for dtype in ("fp32", "bf16", "fp16"))
    assert (rates["memory"], rates["transcendental"], rates["random"]) == tuple(Rate(v, 1e-6) for v in fitted.values())
    assert rates["byte_rates_by_dtype"] == {kind: {dtype: Rate(per_s / ratio, 1e-6) for dtype, ratio in slowdown.items()}
                                            for kind, per_s in fitted.items()}
    assert "memory bf16 vs fp32" in spreads and measured["byte_rates_vs_fp32"]["random fp16"]["ratio"] == 1.25


def test_a_bf16_add_is_timed_side_by_side_with_an_fp32_one_and_compared_per_byte(monkeypatch):
    """The slowdown is per byte: a bf16 op taking as long as the fp32 one on the same
    element count moves half the bytes, a ratio of 2. The two are timed together, fp32
    first."""
    from trainwise.calibration import memory
    from trainwise.calibration.timing import QUICK, Timing

    timed = []

    def dtype_of(work):
        return next(c.cell_contents for c in work.__closure__ if isinstance(c.cell_contents, torch.Tensor)).dtype

    def time_side_by_side(works, sync, settings):
        timed.append(tuple(dtype_of(work) for work in works))
        return [Timing(1e-5, 0.02), Timing(1e-5, 0.01)]

    monkeypatch.setattr(memory, "time_side_by_side", time_side_by_side)
    ratio, found = memory.measure_bytes_relative("memory", "bf16", torch.device("cpu"), QUICK)
    assert ratio == 2.0 and {pair["ratio"] for pair in found["pairs"]} == {2.0}
    assert set(timed) == {(torch.float32, torch.bfloat16)} and len(timed) == len(found["pairs"]) > 0
    assert found["spread"] == 0.02


def test_side_by_side_timing_takes_the_samples_in_turn_so_a_slow_spell_meets_both():
    """A machine that slows down half-way: timed one after the other, the second op read
    as slower than the first though both do the same work; in turn, they read alike."""
    from trainwise.calibration.timing import Settings, Synchronizer, time_call, time_side_by_side

    now, order = [0.0], []
    settings = Settings(repeats=6, sample_s=0.0, max_call_s=1.0, quick=True)

    def op(name):
        def work():
            order.append(name)
            now[0] += 1.0 if len(order) <= 8 else 3.0  # the same work, slower after a while
        return work

    sync = Synchronizer(lambda: None, lambda: now[0])
    apart = [time_call(op("a"), sync, settings).seconds, time_call(op("b"), sync, settings).seconds]
    assert apart[1] > 2 * apart[0]
    now[0], order[:] = 0.0, []
    first, second = time_side_by_side([op("a"), op("b")], sync, settings)
    assert first.seconds == second.seconds
    timed = order[4:]  # after each one's warm-up and first call
    assert timed == ["a", "b"] * settings.repeats


def test_a_large_fp32_matmul_does_more_flops_per_second_than_a_tiny_one(cached_profile):
    points = read_profile(cached_profile).measured["points"]["matmul fp32"]
    (tiny_flops, tiny_s), (large_flops, large_s) = min(points), max(points)
    assert large_flops > 100 * tiny_flops
    assert large_flops / large_s > tiny_flops / tiny_s


def test_the_profile_records_where_and_how_it_was_measured(cached_profile):
    measured = read_profile(cached_profile).measured
    for key in ("date", "torch", "cpu_count", "torch_threads", "clock", "cpu_model", "nproc", "load_average_1min",
                "spread"):
        assert key in measured, key
    assert measured["clock"] == "wall" and measured["torch_threads"] == 1  # the fixture's thread count
    assert measured["nproc"] == 1 and measured["quick"] is True
    assert set(measured["load_average_1min"]) == {"start", "end"}
    assert measured["spread"]["matmul fp32"] >= 0


@pytest.fixture
def measured_as_before(cached_profile, monkeypatch):
    """The one-device measurements replaced by the module's quick calibration, for the tests
    of what calibrate does around them (where it writes, the collectives): a quick calibrate
    of its own would add 10-30 s each and test nothing more."""
    from trainwise.api import calibrate

    profile = read_profile(cached_profile)
    rates = {"matmul": profile.matmul, "attention": profile.attention, "memory": profile.memory,
             "attention_by_head_dim": profile.attention_by_head_dim, "transcendental": profile.transcendental,
             "byte_rates_by_dtype": profile.byte_rates_by_dtype, "random": profile.random,
             "host_s_per_op": profile.host_s_per_op, "optimizer": profile.optimizer}
    monkeypatch.setattr(calibrate, "_measure_one_device",
                        lambda device, settings, between=None: (dict(rates), {}, {"points": {}}))
    monkeypatch.setattr(calibrate, "_with_training_host", lambda profile, device, settings, spreads, *rest: profile)
    return profile


def test_out_names_the_file_and_json_reports_it(tmp_path, capsys, measured_as_before):
    out = tmp_path / "profiles" / "this-cpu.json"
    assert main(["calibrate", "--quick", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == str(out) and out.is_file()
    assert read_profile(out).to_json()["matmul"] == report["profile"]["matmul"]
    assert report["profile"]["matmul"] == measured_as_before.to_json()["matmul"]


@pytest.mark.parametrize("case", ["a directory", "under a file", "a catalog GPU", "no processes"])
def test_bad_input_is_exit_2_naming_the_flag_before_anything_is_measured(case, tmp_path, monkeypatch, capsys,
                                                                        fault_log):
    import trainwise.calibration.compute as compute

    measured = []
    monkeypatch.setattr(compute, "measure_matmul", lambda *a, **k: measured.append(a))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    argv, flag = {"a directory": (["--out", str(tmp_path)], "--out"),
                  "under a file": (["--out", str(blocker / "cpu.json")], "--out"),
                  "a catalog GPU": (["--device", "H100"], "--device"),
                  "no processes": (["--nproc", "0"], "--nproc")}[case]
    code = main(["calibrate", "--quick", *argv])
    message = capsys.readouterr().err.strip()
    assert code == 2 and message.startswith(f"trainwise: error: {flag}:"), message
    assert measured == [] and blocker.read_text() == "not a directory"
    fault_log(kind="bad input", case=f"calibrate {' '.join(argv)} ({case})", exit_code=code, message=message)


@pytest.mark.distributed
def test_nproc_2_records_the_four_collectives_between_two_gloo_processes(tmp_path, measured_as_before):
    out = tmp_path / "two.json"
    assert main(["calibrate", "--quick", "--nproc", "2", "--out", str(out)]) == 0
    profile = read_profile(out)
    assert set(profile.collectives) == set(COLLECTIVES)
    assert all(_finite_positive(rate.per_s) for rate in profile.collectives.values())
    assert profile.measured["nproc"] == 2 and profile.measured["collectives"]["backend"] == "gloo"
    assert profile.matmul == measured_as_before.matmul


def test_the_calibrate_table_shows_each_element_wise_rate_by_dtype():
    from trainwise.cli.render_calibrate import rate_rows
    from trainwise.hardware.profile import DeviceProfile, Rate

    profile = DeviceProfile("cpu", "cpu", "test", {"fp32": Rate(1e11)}, {}, Rate(1e11), 1e-5, random=Rate(2e9),
                            byte_rates_by_dtype={"memory": {"bf16": Rate(5e10, 2e-6)}, "random": {"bf16": Rate(1e9)}})
    shown = {what: (throughput, fixed) for what, throughput, fixed in rate_rows(profile) if "bytes read" in what}
    assert shown == {"memory fp32 (bytes read + written)": ("100 GB/s", "0 µs"),
                     "memory bf16 (bytes read + written)": ("50 GB/s", "2 µs"),
                     "random numbers, dropout's mask fp32 (bytes read + written)": ("2 GB/s", "0 µs"),
                     "random numbers, dropout's mask bf16 (bytes read + written)": ("1 GB/s", "0 µs")}


def test_a_cpu_calibration_ends_by_timing_its_reference_steps_again_against_the_fit(cached_profile):
    measured = read_profile(cached_profile).measured
    fitted = {(p["batch_size"], p["seq_len"]): p["step_s"] for p in measured["training_step"]["steps"]}
    steadiness = measured["steadiness"]
    assert {(p["batch_size"], p["seq_len"]) for p in steadiness["steps"]} == set(fitted)
    for point in steadiness["steps"]:
        assert point["fitted_s"] == fitted[(point["batch_size"], point["seq_len"])]
        assert _finite_positive(point["end_s"])
    assert steadiness["ratio"] == pytest.approx(
        statistics.geometric_mean([p["end_s"] / p["fitted_s"] for p in steadiness["steps"]]))


@pytest.mark.parametrize("moved, warned", [(1.3, True), (0.8, True), (1.05, False), (0.95, False), (None, False)])
def test_a_calibration_whose_reference_steps_moved_more_than_ten_percent_is_called_unsteady(moved, warned):
    from trainwise.api.calibrate import busy_warnings

    measured = {"cpu_count": 2, "spread": {}, "load_average_1min": {"start": 0.1, "end": 0.2}}
    if moved is not None:
        measured["steadiness"] = {"ratio": moved}
    warnings = busy_warnings(measured)
    assert any("speed changed while calibrating" in w and f"{moved:.2f} x" in w for w in warnings) == warned
    assert len(warnings) == int(warned)


def test_the_calibrate_table_says_how_steady_the_machine_was(cached_profile, capsys):
    from types import SimpleNamespace

    from trainwise.cli.render_calibrate import render_calibration

    profile = read_profile(cached_profile)
    render_calibration(SimpleNamespace(profile=profile, seconds=1.0, path=cached_profile))
    shown = " ".join(capsys.readouterr().out.split())
    assert f"took {profile.measured['steadiness']['ratio']:.2f} x as long at the end" in shown
