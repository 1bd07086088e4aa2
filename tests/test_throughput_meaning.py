"""One meaning of throughput: `tokens_per_s` and `samples_per_s` are the whole job's in
every output (estimate, plan, train, bench, verify), with `tokens_per_s_per_gpu` and
`samples_per_s_per_gpu` beside them (the job's over its GPUs)."""

from __future__ import annotations

import json

import pytest

from trainwise.cli.main import main
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan


@pytest.mark.slow
def test_an_estimate_of_a_layout_reports_the_jobs_tokens_per_s_as_plan_json_does(capsys, tmp_path):
    """ZeRO-3 x TP 2 on 4 GPUs: 2 data-parallel replicas. The estimate of the plan that
    `plan --json` chose reports the job's rate (both replicas' samples over the step), the
    same figure as the plan's, and per GPU that over the 4 GPUs."""
    assert main(["plan", "tiny-llama", "--device", "H100", "--seq-len", "32", "--gpus", "4", "--global-batch", "8",
                 "--tp", "2", "--zero", "3", "--top", "1", "--json", "--out", str(tmp_path)]) == 0
    (planned,) = json.loads(capsys.readouterr().out)["plans"]
    assert main(["estimate", "tiny-llama", "--plan", planned["plan_file"], "--json"]) == 0
    time = json.loads(capsys.readouterr().out)["time"]

    plan = Plan.from_dict(planned["plan"])
    layout = resolve_layout(plan)
    assert (layout.world, layout.data_parallel) == (4, 2)
    job_samples = plan.batch_size * plan.grad_accum * layout.data_parallel
    assert time["samples_per_s"] == pytest.approx(job_samples / time["step_s"])
    assert time["tokens_per_s"] == pytest.approx(job_samples * plan.seq_len / time["step_s"])
    assert time["tokens_per_s"] == pytest.approx(planned["tokens_per_s"])
    assert time["samples_per_s"] == pytest.approx(planned["samples_per_s"])
    for figures in (time, planned):
        assert figures["gpus"] == 4
        assert figures["tokens_per_s_per_gpu"] == pytest.approx(figures["tokens_per_s"] / 4)
        assert figures["samples_per_s_per_gpu"] == pytest.approx(figures["samples_per_s"] / 4)


def test_a_one_device_estimate_is_its_jobs_and_its_gpus_rate_and_says_so(capsys):
    one_device = ["estimate", "tiny-llama", "--device", "H100", "--seq-len", "32", "--batch-size", "2"]
    assert main(one_device) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert main([*one_device, "--json"]) == 0
    time = json.loads(capsys.readouterr().out)["time"]
    assert f"predicted throughput: {time['tokens_per_s']:,.0f} tokens/s" in table
    assert "samples/s (job of one device)" in table
    assert time["gpus"] == 1
    assert time["tokens_per_s"] == pytest.approx(2 * 32 / time["step_s"]) == time["tokens_per_s_per_gpu"]
    assert time["samples_per_s"] == time["samples_per_s_per_gpu"]
