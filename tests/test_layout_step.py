"""The estimate's step time under a parallel layout (trainwise/estimator/layout_step.py):
each pipeline rank's traced compute with the layout's collectives, bubble and offload
added by the layout time model, on a catalog H100 (its figures, no calibration)."""

from __future__ import annotations

import json

import pytest

from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.estimator.step_time import CATEGORIES, OFF_CRITICAL_PATH
from trainwise.plan.plan import Plan


def _plan(**knobs) -> Plan:
    return Plan(**{"device": "H100", "batch_size": 2, "seq_len": 32, "nproc": 2, **knobs})


def _on_path(breakdown: dict) -> float:
    return sum(v for k, v in breakdown.items() if k not in OFF_CRITICAL_PATH)


@pytest.mark.parametrize("knobs", [{"tp": 2}, {"zero": 3}, {"pp": 2, "microbatches": 2}],
                         ids=["tp2", "zero3", "pp2"])
def test_a_layout_step_adds_its_communication_to_the_compute(knobs):
    """The time's breakdown has every shared category and sums to the step; the layout's
    communication is in it (and the bubble under a pipeline); each collective is listed."""
    time = estimate("tiny-llama", _plan(**knobs)).time
    assert set(time.breakdown) == set(CATEGORIES)
    assert _on_path(time.breakdown) == pytest.approx(time.step_s, rel=1e-9)
    communication = time.breakdown["communication_exposed"] + time.breakdown["communication_overlapped"]
    assert communication > 0
    assert (time.breakdown["pipeline_bubble"] > 0) == ("pp" in knobs)
    listed = time.to_json()["collectives"]
    assert listed and all(set(c) == {"name", "purpose", "bytes", "link", "exposed_s", "overlapped_s"} for c in listed)
    assert sum(c["exposed_s"] for c in listed) == pytest.approx(time.breakdown["communication_exposed"])
    assert not any("not modelled yet" in note for note in time.notes)


def test_ranks_on_two_nodes_pay_the_inter_node_link(capsys):
    """ZeRO-3 over two one-GPU nodes at 10 Gbit/s gathers over the slow link: the step is
    slower than on one node, and the table lists the collectives on that link."""
    one_node = estimate("tiny-llama", _plan(zero=3)).time
    args = ["estimate", "tiny-llama", "--device", "H100", "--nproc", "2", "--zero", "3", "--seq-len", "32",
            "--batch-size", "2", "--gpus-per-node", "1", "--inter-node-gbps", "10"]
    assert main([*args, "--json"]) == 0
    two_nodes = json.loads(capsys.readouterr().out)["time"]
    assert two_nodes["step_s"] > one_node.step_s
    assert {c["link"] for c in two_nodes["collectives"]} == {"inter-node"}
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "Collectives of the slowest rank" in table and "inter-node" in table


@pytest.mark.fault
@pytest.mark.parametrize("flag, value", [("--gpus-per-node", "0"), ("--inter-node-gbps", "-5")])
def test_a_bad_topology_is_refused(flag, value, capsys, fault_log):
    code = main(["estimate", "tiny-llama", "--device", "H100", "--nproc", "2", "--zero", "3", "--seq-len", "16",
                 flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"trainwise: error: {flag}"), err
    fault_log(kind="bad input", case=f"estimate {flag} {value}", exit_code=2, message=err[0])
