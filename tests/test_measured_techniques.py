"""`plan` marks a technique whose effect is predicted but was never measured on the target's
GPU class; the record it reads is generated from the committed GPU rows."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import rich.console

from test_plan_cli import PLAN, _liger_faster, _nothing_installed, _use
from trainwise.cli.main import main
from trainwise.hardware import resolve_device
from trainwise.hardware.measured import never_measured

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("measured_techniques", REPO / "benchmarks" / "measured_techniques.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installed_record_is_what_the_script_makes_of_the_committed_rows():
    script = _script()
    assert (REPO / "trainwise" / "hardware" / "measured_techniques.json").read_text() == \
        script.render(script.record(REPO / "docs" / "results" / "rows"))


def test_a_class_is_a_compute_capability_and_a_cpu_gets_no_claim():
    # The committed H200 runs trained Liger and compile: the same class as an H100, not an A100's.
    assert never_measured(("liger", "compile", "checkpointing"), resolve_device("H100")) == ("checkpointing",)
    assert never_measured(("liger",), resolve_device("A100")) == ("liger",)
    assert never_measured(("compile",), resolve_device("cpu")) is None


def test_the_plan_table_marks_techniques_never_measured_on_the_device_class(monkeypatch, capsys):
    _use(monkeypatch, _liger_faster)
    _nothing_installed(monkeypatch)
    # The table's cells unwrapped: a console 300 columns wide. (Not COLUMNS=300: in the full
    # suite an earlier test's settings can leave rich at 80 columns, and at 80 columns the
    # cell folds; what is tested here is the mark, not the wrapping, which test_cli_front_door holds.)
    monkeypatch.setattr(rich.console, "Console", functools.partial(rich.console.Console, width=300))
    assert main(PLAN + ["--global-batch", "16", "--grad-ckpt"]) == 0
    out = capsys.readouterr().out
    assert "checkpointing†" in out and "liger†" not in out
    assert "† effect predicted, never measured on a compute capability 9.0 GPU" in out
    assert main(PLAN + ["--global-batch", "16", "--grad-ckpt", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["plans"][0]
    assert "liger" in best["techniques"] and best["never_measured_on_device_class"] == ["checkpointing"]
