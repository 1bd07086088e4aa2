"""bench: rows run in their own processes, failures become rows, files survive, resume skips."""

import json
import sys

import pytest

from trainwise.api import benchmark
from trainwise.bench import runner
from trainwise.bench.ladders import load_ladder
from trainwise.bench.rows import empty_row
from trainwise.bench.runner import RowJob, run_row
from trainwise.cli.main import main
from trainwise.plan import InputError, Plan

CPU_BASE = {"device": "cpu", "seq_len": 32}


def _job(tmp_path, engine="trainwise") -> RowJob:
    return RowJob("row", Plan(device="cpu"), engine, "tiny-llama", 2, 1, 0, None, tmp_path, 60)


def _fake_child(monkeypatch, script: str):
    """Replace the child command with a tiny python script (argv[1] is the metrics path)."""
    monkeypatch.setattr(runner, "command", lambda job, plan, metrics: [sys.executable, "-c", script, str(metrics)])


def test_exit_3_is_an_oom_row(tmp_path, monkeypatch):
    _fake_child(monkeypatch, "import sys; print('trainwise: error: out of memory at step 1', file=sys.stderr); "
                             "sys.exit(3)")
    row = run_row(_job(tmp_path))
    assert row["status"] == "oom" and "out of memory" in row["reason"]


def test_a_crash_is_an_error_row_with_its_message(tmp_path, monkeypatch):
    _fake_child(monkeypatch, "raise RuntimeError('boom in the child')")
    row = run_row(_job(tmp_path))
    assert row["status"] == "error" and "boom in the child" in row["reason"]


def test_a_device_capability_refusal_is_a_skipped_row(tmp_path, monkeypatch):
    _fake_child(monkeypatch, "import sys; print('trainwise: error: --precision: fp16 needs a CUDA device', "
                             "file=sys.stderr); sys.exit(2)")
    assert run_row(_job(tmp_path))["status"] == "skipped"


def test_each_row_runs_in_a_fresh_process(tmp_path, monkeypatch):
    script = ("import json, os, sys; open(sys.argv[1], 'w').write(json.dumps({'summary': {'time_s': 1.0, "
              "'samples_per_s': float(os.getpid()), 'peak_allocated': 100}}))")
    _fake_child(monkeypatch, script)
    pids = {run_row(_job(tmp_path))["samples_per_s"] for _ in range(2)}
    assert len(pids) == 2


def test_rows_that_cannot_run_here_are_skipped_with_a_reason_and_kept(tmp_path):
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text("- {name: fp16, plan: {precision: fp16}}\n- {name: eight-bit, plan: {optim: adamw-8bit}}\n")
    rows = benchmark.bench("tiny-llama", str(ladder), steps=2, out=tmp_path / "out", device="cpu",
                           base_knobs={"seq_len": 32})
    assert [(r["name"], r["engine"], r["status"]) for r in rows] == [
        ("fp16", "trainwise", "skipped"), ("fp16", "hf-trainer", "skipped"),
        ("eight-bit", "trainwise", "skipped"), ("eight-bit", "hf-trainer", "skipped")]
    assert all("CUDA" in r["reason"] for r in rows)


def test_files_are_written_after_each_row_and_resume_skips_finished_rows(tmp_path, monkeypatch):
    calls = []

    def fake_run_row(job, predicted=None):
        calls.append((job.name, job.engine))
        saved = json.loads((tmp_path / "results.json").read_text()) if (tmp_path / "results.json").exists() else []
        assert len(saved) == len(calls) - 1  # the previous rows are already on disk
        row = empty_row(job.name, job.plan.changed_knobs(), job.engine, "ok")
        row.update(samples_per_s=10.0, measured={"peak_allocated": 2**20, "peak_reserved": None, "device_total": None})
        return row

    monkeypatch.setattr(benchmark, "run_row", fake_run_row)
    monkeypatch.setattr(benchmark, "_predicted", lambda *a: None)
    ladder = tmp_path / "l.yaml"
    ladder.write_text("- {name: a, plan: {}}\n- {name: b, plan: {batch_size: 1}}\n")
    benchmark.bench("tiny-llama", str(ladder), steps=2, out=tmp_path, device="cpu")
    assert len(calls) == 4
    for name in ("results.json", "results.csv", "chart.png", "results.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "results.csv").read_text().count("\n") == 5
    rows = benchmark.bench("tiny-llama", str(ladder), steps=2, out=tmp_path, device="cpu", resume=True)
    assert len(calls) == 4 and len(rows) == 4


@pytest.mark.parametrize("text, message", [
    ("- {name: a, plan: {precision: fp64}}\n", "precision"),
    ("- {plan: {}}\n", "name"),
    ("{a: 1}\n", "list"),
    ("- {name: a, plan: {}}\n- {name: a, plan: {}}\n", "twice"),
])
def test_a_bad_ladder_file_is_exit_2(tmp_path, text, message, capsys):
    ladder = tmp_path / "bad.yaml"
    ladder.write_text(text)
    assert main(["bench", "tiny-llama", "--ladder", str(ladder), "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_named_ladders_are_valid_plans():
    assert len(load_ladder("default", {"device": "cuda"})) == 12
    assert {r.plan.precision for r in load_ladder("quick", CPU_BASE)} >= {"fp32", "fp16", "bf16"}
    with pytest.raises(InputError):
        load_ladder("no-such-ladder", CPU_BASE)


def test_end_to_end_trainwise_and_baseline_rows_with_predictions(tmp_path, capsys):
    ladder = tmp_path / "l.yaml"
    ladder.write_text("- {name: vanilla, plan: {batch_size: 2}}\n- {name: fp16, plan: {precision: fp16}}\n")
    code = main(["bench", "tiny-llama", "--ladder", str(ladder), "--steps", "3", "--device", "cpu",
                 "--seq-len", "32", "--out", str(tmp_path / "out"), "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["engine"] for r in ok} == {"trainwise", "hf-trainer"}
    for row in ok:
        assert row["measured"]["peak_allocated"] > 0 and row["predicted"]["peak_allocated"] > 0
        assert abs(row["error_pct"]["peak_allocated"]) < 10
    assert [r["status"] for r in rows if r["name"] == "fp16"] == ["skipped", "skipped"]
