"""benchmarks/gpu_validation.sh is what a lent GPU runs, so a mistake in it costs a GPU
session. On the CPU: every stage's time limits add up to what one 10-minute command can
hold, and the issue-17 stages' commands parse and skip cleanly without a GPU (a wrong flag
would exit 2 here instead of there); each memory stage's row filter selects rows."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_validation.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))

import engine_speed  # noqa: E402
import tp_compile_check  # noqa: E402
import validate_memory  # noqa: E402

STAGES = ("smoke", "memory", "vs-trainer", "offload", "bench", "time-model", "plan", "activation-offload",
          "engine-speed", "engine-fit", "engine-memory", "tasks", "tp-compile")
# A command is at most 10 minutes where a GPU is lent; a minute is left for the machine's
# own start-up work and the wheels' install.
STAGE_BUDGET_S = 540
LINE = re.compile(r"^=== (?P<name>\S+) \(limit (?P<limit>\d+) s\): (?P<command>.*)$")


def dry_run(stage: str, out: Path) -> list[dict]:
    """The stage's commands as the script would run them: name, limit (s), argv."""
    done = subprocess.run(["bash", str(SCRIPT), str(out), stage], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    lines = [LINE.match(line) for line in done.stdout.splitlines()]
    assert lines and all(lines), done.stdout
    return [{"name": m["name"], "limit": int(m["limit"]), "argv": shlex.split(m["command"])} for m in lines]


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_fits_one_command(stage, tmp_path):
    commands = dry_run(stage, tmp_path)
    assert sum(c["limit"] for c in commands) <= STAGE_BUDGET_S, commands


def test_an_unknown_stage_is_refused(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "engine"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DRY_RUN": "1"})
    assert done.returncode == 2 and "unknown stage engine" in done.stderr


def _script_argv(command: dict, script: str) -> list[str]:
    argv = command["argv"]
    assert Path(argv[1]).name == script, argv
    return argv[2:]


@pytest.mark.parametrize("stage", ("engine-speed", "engine-fit"))
def test_engine_speed_commands_parse_and_skip_without_a_gpu(stage, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(engine_speed.torch.cuda, "is_available", lambda: False)
    for command in dry_run(stage, tmp_path):
        assert engine_speed.main(_script_argv(command, "engine_speed.py")) == 0
        assert capsys.readouterr().out.strip() == "skipped: no CUDA GPU"


def test_tp_compile_stage_runs_its_check_on_one_rank_and_skips_without_a_gpu(tmp_path, capsys, monkeypatch):
    (command,) = dry_run("tp-compile", tmp_path)
    argv = command["argv"]
    assert argv[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert argv[argv.index("--nproc-per-node") + 1] == "1", "one GPU: a 1-rank tensor-parallel mesh"
    script = next(i for i, arg in enumerate(argv) if arg.endswith(".py"))
    assert Path(argv[script]).name == "tp_compile_check.py"
    monkeypatch.setattr(tp_compile_check.torch.cuda, "is_available", lambda: False)
    assert tp_compile_check.main(argv[script + 1:]) == 0
    assert capsys.readouterr().out.strip() == "skipped: no CUDA GPU"
    assert not (tmp_path / "tp-compile.json").exists()


@pytest.mark.parametrize("stage", ("engine-memory", "tasks", "activation-offload"))
def test_memory_stage_filters_select_rows(stage, tmp_path, capsys):
    commands = [c for c in dry_run(stage, tmp_path) if Path(c["argv"][1]).name == "validate_memory.py"]
    assert commands
    for command in commands:
        argv = _script_argv(command, "validate_memory.py")
        assert validate_memory.main([*argv, "--list"]) == 0
        listed = capsys.readouterr().out.splitlines()
        only = argv[argv.index("--only") + 1]
        assert listed and len(listed) == len(validate_memory.select(False, only)), listed


def test_the_fit_search_starts_where_told_and_walks_both_ways(monkeypatch, tmp_path):
    """largest_batch: up from the start while runs finish, down from it while they fail; what
    it reports is only what ran (sizes the GPU would take up to 8 here)."""
    ran = []

    def fake_run_row(job):
        ran.append(job.plan.batch_size)
        return {"status": "ok" if job.plan.batch_size <= 8 else "oom", "reason": None}

    monkeypatch.setattr(engine_speed, "run_row", fake_run_row)
    plan = engine_speed.Plan.from_dict({"device": "cpu", "seq_len": 16})
    sizes = [1, 2, 4, 8, 16, 32]
    up = engine_speed.largest_batch("tiny-llama", None, plan, "trainwise", sizes, tmp_path, 1.0, start=2)
    assert (up["batch_size"], ran) == (8, [4, 8, 16])
    assert [batch for batch, *_ in up["tried"]] == [4, 8, 16]
    ran.clear()
    down = engine_speed.largest_batch("tiny-llama", None, plan, "trainwise", sizes, tmp_path, 1.0, start=5)
    assert (down["batch_size"], ran) == (8, [32, 16, 8])
    ran.clear()
    none = engine_speed.largest_batch("tiny-llama", None, plan, "trainwise", [16, 32], tmp_path, 1.0, start=1)
    assert (none["batch_size"], ran) == (None, [32, 16])


def test_the_search_starts_at_the_largest_size_predicted_to_fit(monkeypatch):
    """predicted_start bisects the sizes with exact estimates against the GPU's memory (here a
    stand-in capacity between the predictions of micro-batches 4 and 8 of a tiny model)."""
    plan = engine_speed.Plan.from_dict({"device": "cpu", "seq_len": 64})
    need = {batch: engine_speed.estimate("tiny-llama", plan.replace(batch_size=batch)).memory.device_total
            for batch in (4, 8)}
    assert need[4] < need[8]
    capacity = (need[4] + need[8]) // 2
    monkeypatch.setattr(engine_speed.torch.cuda, "get_device_properties",
                        lambda index: type("Properties", (), {"total_memory": capacity}))
    start = engine_speed.predicted_start("tiny-llama", None, plan, [1, 2, 4, 8, 16])
    assert start["index"] == 2 and start["device_bytes"] == capacity
    assert all((need_bytes <= capacity) == (batch <= 4) for batch, need_bytes in start["predicted"].items())
