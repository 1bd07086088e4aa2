"""`--report-to`: TensorBoard and Weights & Biases get what the metrics file gets (read back
and compared), the plan goes along as hyperparameters, and every run with a metrics file
leaves a loss and throughput chart beside it."""

from __future__ import annotations

import json

import pytest

from trainwise.cli.main import main

RUN = ["train", "tiny-llama", "--device", "cpu", "--seq-len", "16", "--batch-size", "2", "--steps", "6",
       "--data", "synthetic"]


def metrics_lines(path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if "summary" not in line]


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tensorboard_hparams(directory) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(directory))
    events.Reload()
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    values = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    return {key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind")) for key, value in values.items()}


@pytest.mark.slow
def test_tensorboard_scalars_match_the_metrics_file(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    assert main([*RUN, "--metrics", str(metrics), "--report-to", "tensorboard"]) == 0
    out = capsys.readouterr().out
    board = tmp_path / "metrics-runs" / "tensorboard"
    assert f"logs: tensorboard {board}" in out
    scalars = tensorboard_scalars(board)
    lines = metrics_lines(metrics)
    assert [step for step, _ in scalars["train/loss"]] == [line["step"] for line in lines]
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                     ("train/tokens_per_s", "tokens_per_s"), ("memory/peak_allocated_bytes", "peak_allocated")):
        logged = dict(scalars[tag])
        for line in lines:
            if line[key] is not None:
                assert logged[line["step"]] == pytest.approx(line[key], rel=1e-6), (tag, line["step"])
    hparams = tensorboard_hparams(board)
    assert hparams["plan/batch_size"] == 2 and hparams["plan/seq_len"] == 16 and hparams["run/steps"] == 6
    summary = json.loads(metrics.read_text().splitlines()[-1])["summary"]
    assert any(report.startswith("tensorboard") for report in summary["reports"])
    # Every run with a metrics file also leaves its loss and throughput chart beside it.
    chart = tmp_path / "metrics.png"
    assert chart.read_bytes().startswith(b"\x89PNG") and chart.stat().st_size > 10_000
    assert f"logs: chart {chart}" in out


def test_wandb_logs_offline_unless_configured(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.setenv("WANDB_SILENT", "true")
    metrics = tmp_path / "metrics.jsonl"
    assert main([*RUN, "--metrics", str(metrics), "--report-to", "wandb", "--report-dir", str(tmp_path / "dash")]) == 0
    out = capsys.readouterr().out
    assert "logs: wandb offline" in out
    runs = list((tmp_path / "dash" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


@pytest.mark.fault
@pytest.mark.parametrize("argv, field_text", [
    (["--report-to", "mlflow", "--metrics", "m.jsonl"], "mlflow is not a dashboard"),
    (["--report-to", "none,tensorboard", "--metrics", "m.jsonl"], "none cannot be combined"),
    (["--report-to", "tensorboard"], "needs somewhere to write"),
])
def test_bad_report_requests_are_refused_before_the_run(tmp_path, monkeypatch, capsys, fault_log, argv, field_text):
    monkeypatch.chdir(tmp_path)
    code = main([*RUN, *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--report-to" in err and field_text in err
    assert not (tmp_path / "m.jsonl").exists()  # refused before any step
    fault_log(kind="bad input", case=f"--report-to {argv[1]}", exit_code=code, message=err)
