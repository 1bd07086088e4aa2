"""`trainwise plan --gpus N`: the layout screen's candidates, filtered by capacity and
confirmed by the exact per-rank estimate, with the layout flags given held fixed
(trainwise/api/search_layouts.py, trainwise/search/why_lost_layout.py)."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from trainwise.api.search import plan_search
from trainwise.cli.main import main
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan

BASE = Plan(device="H100", seq_len=32)
FOUR = ["plan", "tiny-llama", "--device", "H100", "--seq-len", "32", "--gpus", "4"]


def _samples(plan: Plan) -> int:
    return plan.batch_size * plan.grad_accum * resolve_layout(plan).data_parallel


@pytest.mark.slow
def test_four_gpus_rank_confirmed_layouts_that_reach_the_global_batch():
    """Every plan shown was estimated exactly, uses the 4 GPUs, reaches the global batch,
    fits, and they come fastest first; the main layout families each get a why-lost line."""
    report = plan_search("tiny-llama", BASE, {"seq_len", "device"}, gpus=4, global_batch=16)
    ranked = report.result.ranked
    assert len(ranked) == 3 and all(c.exact for c in ranked)
    assert all(resolve_layout(c.plan).world == 4 and _samples(c.plan) == 16 for c in ranked)
    assert all(c.memory_bytes <= report.result.usable_bytes for c in ranked)
    assert [c.tokens_per_s for c in ranked] == sorted((c.tokens_per_s for c in ranked), reverse=True)
    assert all(c.mfu is not None and 0 < c.mfu < 1 for c in ranked)
    kinds = {resolve_layout(c.plan).data_parallel_kind for c in report.result.screened}
    assert {"ddp", "zero1", "fsdp"} <= kinds
    families = {knob for knob, _, _ in report.why_lost}
    assert {"tensor parallel", "pipeline parallel"} & families and "ZeRO-3 + CPU offload" in families
    assert all("% step time per sample" in line or "does not fit" in line
               for knob, _, line in report.why_lost if knob != "grad_ckpt")


def test_layout_flags_given_are_held_in_every_plan_screened_and_shown():
    base = BASE.replace(tp=2, zero=3)
    report = plan_search("tiny-llama", base, {"seq_len", "device", "tp", "zero"}, gpus=4, global_batch=8, top=1)
    assert report.result.screened and report.result.ranked
    for candidate in (*report.result.screened, *report.result.ranked):
        layout = resolve_layout(candidate.plan)
        assert (layout.tp, candidate.plan.zero, layout.world) == (2, 3, 4)


def test_plan_cli_over_gpus_prints_json_with_the_layouts_and_per_node_lines(capsys, tmp_path):
    script = tmp_path / "job.sbatch"
    code = main([*FOUR, "--gpus-per-node", "2", "--global-batch", "8", "--tp", "2", "--zero", "3", "--top", "1",
                 "--json", "--out", str(tmp_path), "--data", "builtin", "--train-out", "/shared/run", "--steps", "5",
                 "--emit", "slurm", "--emit-out", str(script)])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    (best,) = data["plans"]
    assert best["exact"] and "--tp 2" in best["flags"] and "--zero 3" in best["flags"]
    assert (tmp_path / "plan-1.yaml").exists()
    # 4 GPUs on nodes of 2: each node runs the line with --nproc 2, never --nproc 4
    words = shlex.split(best["flags"])
    assert words[words.index("--nnodes") + 1] == "2" and words[words.index("--nproc") + 1] == "2"
    assert words[-6:] == ["--data", "builtin", "--steps", "5", "--out", "/shared/run"]
    assert script.read_text() == data["emit"]["text"] + "\n" and "#SBATCH --nodes=2" in data["emit"]["text"]
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.fault
@pytest.mark.parametrize("extra, field", [([], "--global-batch"),
                                          (["--global-batch", "6", "--tp", "1", "--pp", "1"], "--global-batch"),
                                          (["--global-batch", "8", "--gpus-per-node", "3"], "--gpus-per-node"),
                                          (["--global-batch", "8", "--emit", "torchtitan"], "--emit"),
                                          (["--global-batch", "8", "--steps", "0"], "--steps")],
                         ids=["no-global-batch", "indivisible", "gpus-per-node", "torchtitan-flavor", "steps"])
def test_a_layout_search_it_cannot_run_is_refused(extra, field, capsys, fault_log):
    code = main([*FOUR, *extra])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith(f"trainwise: error: {field}: "), err
    fault_log(kind="bad input", case="plan --gpus 4 " + " ".join(extra), exit_code=2, message=err[0])
