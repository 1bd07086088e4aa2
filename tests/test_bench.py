"""bench: every row in its own process, failures become rows, files survive, resume skips.

Most tests run the ladder against tests/bench_stand_in.py (same command line, exit codes
and metrics summary as `trainwise train`, no training); the last one runs the real thing."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from trainwise.api import benchmark
from trainwise.bench import runner
from trainwise.bench.hf_trainer_worker import training_arguments
from trainwise.bench.ladders import load_ladder
from trainwise.bench.rows import empty_row
from trainwise.bench.runner import RowJob, run_row
from trainwise.cli.main import main
from trainwise.plan import InputError, Plan

STAND_IN = Path(__file__).with_name("bench_stand_in.py")
CPU_BASE = {"device": "cpu", "seq_len": 32}
ROW_KEYS = {"name", "plan", "engine", "status", "reason", "time_s", "samples_per_s", "tokens_per_s", "mfu",
            "measured", "predicted", "error_pct"}
MEMORY_KEYS = {"peak_allocated", "peak_reserved", "device_total"}


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """Both engines' rows run tests/bench_stand_in.py; returns the file of child pids."""
    pids = tmp_path / "pids.txt"
    monkeypatch.setenv("BENCH_STAND_IN_PIDS", str(pids))
    monkeypatch.setattr(runner, "command", lambda job, plan_file, metrics: [
        sys.executable, str(STAND_IN), job.model, "--plan", str(plan_file), "--data", "synthetic",
        "--steps", str(job.steps), "--timing-warmup", str(job.timing_warmup), "--metrics", str(metrics),
        "--seed", str(job.seed)])
    def predicted(model, plan, task):
        return {"peak_allocated": 1100 * plan.batch_size, "peak_reserved": 2000, "device_total": 3000}, None

    monkeypatch.setattr(benchmark, "_predicted", predicted)
    return pids


def _ladder(tmp_path, *entries) -> str:
    path = tmp_path / "ladder.yaml"
    path.write_text("".join(f"- {{name: {name}, plan: {plan}}}\n" for name, plan in entries))
    return str(path)


def _bench(tmp_path, ladder, **kwargs):
    kwargs = {"steps": 3, "out": tmp_path / "out", "device": "cpu", **kwargs}
    return benchmark.bench("tiny-llama", ladder, **kwargs)


def _job(tmp_path, plan=None) -> RowJob:
    return RowJob("row", plan or Plan(device="cpu"), "trainwise", "tiny-llama", 3, 1, 0, None, tmp_path, 60)


def test_a_trainwise_row_reads_the_device_every_few_steps_not_every_step(tmp_path):
    # The row trains as a run that logs every LOG_EVERY_STEPS steps does: the flag reaches
    # the run's RunConfig through the train command's own parser, and of 25 steps only the
    # 10th, 20th and last read the device (engine/run.py).
    from trainwise.cli.main import build_parser
    from trainwise.cli.flags import typed_values
    from trainwise.engine.run import _is_read_point
    from trainwise.engine.run_config import RunConfig

    job = RowJob("row", Plan(device="cpu"), "trainwise", "tiny-llama", 25, 1, 0, None, tmp_path, 60)
    argv = runner.command(job, tmp_path / "p.json", tmp_path / "m.jsonl")
    assert argv[1:4] == ["-m", "trainwise", "train"]
    run = RunConfig.from_dict(typed_values(build_parser().parse_args(argv[3:]), RunConfig.specs()))
    assert run.log_every == runner.LOG_EVERY_STEPS > 1
    assert [step + 1 for step in range(run.steps) if _is_read_point(step, run)] == [10, 20, 25]
    trainer = runner.command(dataclasses.replace(job, engine="hf-trainer"), tmp_path / "p.json", tmp_path / "m.jsonl")
    assert "--log-every" not in trainer  # the Trainer's worker logs through its own arguments


def test_each_row_runs_in_its_own_process(tmp_path, stand_in):
    rows = _bench(tmp_path, _ladder(tmp_path, ("a", "{batch_size: 2}"), ("b", "{batch_size: 4}")))
    assert [r["status"] for r in rows] == ["ok"] * 4
    pids = stand_in.read_text().split()
    assert len(pids) == 4 and len(set(pids)) == 4


def test_rows_follow_the_design_contract_with_measured_and_predicted_memory(tmp_path, stand_in):
    row = _bench(tmp_path, _ladder(tmp_path, ("a", "{batch_size: 2}")), baseline="none")[0]
    assert ROW_KEYS <= set(row) and set(row["measured"]) == set(row["predicted"]) == MEMORY_KEYS
    assert row["engine"] == "trainwise" and row["measured"]["peak_allocated"] == 2000
    assert row["predicted"]["peak_allocated"] == 2200 and row["error_pct"]["peak_allocated"] == 10.0
    # The CPU reports no reserved or device-total figure: no error is invented for them.
    assert row["measured"]["device_total"] is None and row["error_pct"]["device_total"] is None
    assert row["plan"]["batch_size"] == 2 and row["plan"]["device"] == "cpu"


def test_crash_oom_and_refusals_become_rows_and_the_ladder_goes_on(tmp_path, stand_in):
    ladder = _ladder(tmp_path, ("crash", "{batch_size: 3}"), ("oom", "{batch_size: 5}"),
                     ("cannot", "{batch_size: 7}"), ("bad", "{batch_size: 9}"), ("fine", "{batch_size: 2}"))
    rows = _bench(tmp_path, ladder, baseline="none")
    assert [(r["name"], r["status"]) for r in rows] == [
        ("crash", "error"), ("oom", "oom"), ("cannot", "skipped"), ("bad", "error"), ("fine", "ok")]
    reasons = {r["name"]: r["reason"] for r in rows}
    assert "RuntimeError: boom in the child" in reasons["crash"]
    assert "out of memory" in reasons["oom"] and "Ampere" in reasons["cannot"] and "q_proj" in reasons["bad"]
    assert all(r["measured"]["peak_allocated"] is None for r in rows[:4])


def test_a_row_past_its_time_limit_is_an_error_row(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "command", lambda *a: [sys.executable, "-c", "import time; time.sleep(30)"])
    job = RowJob("slow", Plan(device="cpu"), "trainwise", "tiny-llama", 3, 1, 0, None, tmp_path, 0.5)
    row = run_row(job)
    assert row["status"] == "error" and "timed out" in row["reason"]


def test_rows_this_machine_cannot_run_are_skipped_up_front_with_a_reason_and_kept(tmp_path, stand_in):
    ladder = _ladder(tmp_path, ("fp16", "{precision: fp16}"), ("eight-bit", "{optim: adamw-8bit}"),
                     ("flash", "{attention: flash}"), ("two gpus", "{nproc: 2}"), ("fine", "{}"))
    rows = _bench(tmp_path, ladder)
    assert [(r["name"], r["engine"], r["status"]) for r in rows] == [
        (name, engine, "skipped" if name != "fine" else "ok")
        for name in ("fp16", "eight-bit", "flash", "two gpus", "fine") for engine in ("trainwise", "hf-trainer")]
    reasons = [r["reason"] for r in rows if r["status"] == "skipped"]
    assert all(reasons) and "fp16 needs a CUDA device" in reasons[0]
    assert len(stand_in.read_text().split()) == 2  # only the runnable row started processes


def test_asking_for_cuda_on_a_machine_without_one_skips_every_row(tmp_path, stand_in, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    rows = _bench(tmp_path, _ladder(tmp_path, ("a", "{}")), device="cuda")
    assert {r["status"] for r in rows} == {"skipped"} and "no CUDA GPU" in rows[0]["reason"]


def test_files_are_written_after_each_row(tmp_path, monkeypatch):
    out, calls = tmp_path / "out", []

    def fake_run_row(job, predicted=None):
        calls.append((job.name, job.engine))
        saved = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else []
        assert len(saved) == len(calls) - 1  # the rows before this one are already on disk
        return empty_row(job.name, {}, job.engine, "ok")

    monkeypatch.setattr(benchmark, "run_row", fake_run_row)
    monkeypatch.setattr(benchmark, "_predicted", lambda *a: (None, None))
    _bench(tmp_path, _ladder(tmp_path, ("a", "{}"), ("b", "{batch_size: 1}")))
    assert len(calls) == 4
    for name in ("results.json", "results.csv", "chart.png", "results.md"):
        assert (out / name).stat().st_size > 0
    assert (out / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "results.csv").read_text().count("\n") == 5  # header + 4 rows


def test_ctrl_c_keeps_the_finished_rows(tmp_path, stand_in, monkeypatch):
    real_run_row, calls = benchmark.run_row, []

    def interrupted_on_the_third(job, predicted=None):
        calls.append(job.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_run_row(job, predicted)

    monkeypatch.setattr(benchmark, "run_row", interrupted_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        _bench(tmp_path, _ladder(tmp_path, ("a", "{}"), ("b", "{batch_size: 2}")))
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(r["name"], r["engine"], r["status"]) for r in saved] == [("a", "trainwise", "ok"),
                                                                       ("a", "hf-trainer", "ok")]
    assert (tmp_path / "out" / "chart.png").exists()


def test_resume_skips_finished_rows_and_reruns_failed_or_changed_ones(tmp_path, stand_in):
    first = _ladder(tmp_path, ("a", "{batch_size: 2}"), ("crash", "{batch_size: 3}"))
    _bench(tmp_path, first, baseline="none")
    assert len(stand_in.read_text().split()) == 2
    rows = _bench(tmp_path, first, baseline="none", resume=True)
    assert len(stand_in.read_text().split()) == 3  # only the error row ran again
    assert [(r["name"], r["status"]) for r in rows] == [("a", "ok"), ("crash", "error")]
    changed = _ladder(tmp_path, ("a", "{batch_size: 4}"), ("crash", "{batch_size: 3}"))
    _bench(tmp_path, changed, baseline="none", resume=True)
    assert len(stand_in.read_text().split()) == 5  # a's plan changed: not the same row any more


@pytest.mark.parametrize("text, message", [
    ("- {name: a, plan: {precision: fp64}}\n", "entry 'a': --precision"),
    ("- {name: a, plan: {batch_size: 0}}\n", "entry 'a': --batch-size"),
    ("- {name: a, plan: {no_such_knob: 1}}\n", "no_such_knob"),
    ("- {name: a, batch_size: 2}\n", "unknown key(s) batch_size"),
    ("- {plan: {}}\n", "name"),
    ("{a: 1}\n", "list"),
    ("- {name: a, plan: {}}\n- {name: a, plan: {}}\n", "twice"),
    ("- [unclosed\n", "not valid YAML"),
])
def test_a_bad_ladder_file_is_exit_2_naming_the_entry(tmp_path, text, message, capsys):
    ladder = tmp_path / "bad.yaml"
    ladder.write_text(text)
    assert main(["bench", "tiny-llama", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--ladder", "no-such-ladder"], "neither a ladder name"),
    (["--steps", "2"], "--steps"),
    (["--baseline", "deepspeed"], "baseline"),
    (["--device", "no-such-gpu"], "unknown GPU"),
])
def test_bad_bench_arguments_are_exit_2(tmp_path, argv, message, capsys):
    assert main(["bench", "tiny-llama", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_named_ladders_are_valid_plans_and_quick_shows_cpu_skips():
    default = {r.name: r.plan for r in load_ladder("default", {"device": "cuda"})}
    assert len(default) >= 14 and default["selective ckpt"].grad_ckpt_policy == "selective"
    assert default["ckpt every 2"].grad_ckpt_every == 2
    quick = load_ladder("quick", CPU_BASE)
    assert {r.plan.precision for r in quick} >= {"fp32", "fp16"}
    assert "adamw-8bit" in {r.plan.optim for r in quick}
    assert "fused" in {r.plan.loss for r in quick}
    assert benchmark._cannot_run_here(next(r.plan for r in quick if r.plan.precision == "fp16"))
    with pytest.raises(InputError):
        load_ladder("no-such-ladder", CPU_BASE)


def test_knob_flags_set_the_base_of_every_rung_and_rungs_win(tmp_path, stand_in, capsys):
    ladder = _ladder(tmp_path, ("a", "{}"), ("b", "{seq_len: 16}"))
    code = main(["bench", "tiny-llama", "--ladder", ladder, "--device", "cpu", "--seq-len", "24", "--grad-ckpt",
                 "--baseline", "none", "--steps", "3", "--out", str(tmp_path / "out"), "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["plan"]["seq_len"], r["plan"]["grad_ckpt"]) for r in rows] == [(24, True), (16, True)]


def test_the_table_labels_measured_and_predicted_and_shows_missing_figures_as_na(tmp_path, stand_in, capsys):
    code = main(["bench", "tiny-llama", "--ladder", _ladder(tmp_path, ("a", "{}"), ("fp16", "{precision: fp16}")),
                 "--device", "cpu", "--steps", "3", "--out", str(tmp_path / "out")])
    assert code == 0
    text = capsys.readouterr().out
    assert "measured" in text and "predicted" in text and "n/a" in text and "HF Trainer" in text
    assert "fp16 needs a CUDA device" in text and "1.00x" in text


def test_trainer_arguments_carry_the_plan():
    plan = Plan(device="cpu", batch_size=2, grad_accum=4, grad_ckpt=True, optim="adafactor", lr=1e-3,
                warmup_steps=2, lr_schedule="constant", weight_decay=0.1, max_grad_norm=0.5, workers=1)
    args = training_arguments(plan, steps=5, seed=3, device_type="cpu", output_dir="/tmp/unused")
    checkpointing = getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, checkpointing) == (2, 4, True)
    assert (args.optim.value, args.learning_rate, args.warmup_steps, args.max_steps) == ("adafactor", 1e-3, 2, 5)
    assert args.lr_scheduler_type.value == "constant_with_warmup" and args.weight_decay == 0.1
    assert (args.max_grad_norm, args.dataloader_num_workers, args.use_cpu) == (0.5, 1, True)
    assert args.save_strategy.value == "no"
    assert not args.fp16 and not args.bf16 and args.report_to in ([], "none", ["none"])


@pytest.mark.slow
def test_end_to_end_trainwise_and_baseline_rows_with_predictions(tmp_path, capsys, monkeypatch):
    # The verdict on the ratio must not depend on the load of the machine the tests run on.
    monkeypatch.setattr("trainwise.api.benchmark.busy_machine", lambda *args, **kwargs: None)
    ladder = _ladder(tmp_path, ("vanilla", "{batch_size: 2}"), ("fp16", "{precision: fp16}"))
    code = main(["bench", "tiny-llama", "--ladder", ladder, "--steps", "3", "--device", "cpu",
                 "--seq-len", "32", "--out", str(tmp_path / "out"), "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["engine"] for r in ok] == ["trainwise", "hf-trainer"], rows
    for row in ok:
        assert row["samples_per_s"] > 0 and row["time_s"] > 0
        assert row["measured"]["peak_allocated"] > 0 and row["predicted"]["peak_allocated"] > 0
        assert abs(row["error_pct"]["peak_allocated"]) < 10
        assert "profiler" in row["memory_method"]
        # 3 steps on a CPU: one timed step (warm-up and the memory-profiled step left out), kept per run.
        assert len(row["runs"]) == 1 and len(row["runs"][0]["step_times_s"]) == 1 and row["spread"]["n"] == 1
    assert ok[0]["vs_baseline"] == {"ratio": None, "withheld": "one sample: no spread to judge it by"}
    assert [r["status"] for r in rows if r["name"] == "fp16"] == ["skipped", "skipped"]
    assert (tmp_path / "out" / "chart.png").exists()


def test_the_trainer_sees_the_same_batches_as_trainwise():
    from trainwise.bench.hf_trainer_worker import _SameSamples
    from trainwise.engine.data.train_data import SyntheticMicroBatches
    from trainwise.models import resolve_model

    micro_batches = SyntheticMicroBatches(resolve_model("tiny-llama"), 2, 8, seed=5, rank=0, world_size=1)
    samples = _SameSamples(micro_batches, batch_size=2, count=3)
    assert len(samples) == 6
    for index in range(6):
        number, row = divmod(index, 2)
        assert samples[index]["input_ids"].tolist() == micro_batches[number]["input_ids"][row].tolist()
