"""Checkpoint integrity: every checkpoint carries a manifest of its files' sizes and sha256;
`--resume` passes over a damaged newest checkpoint (with one warning line) and continues
the run's exact loss curve from the previous one; a save that fails loses nothing."""

import errno
import json
import shutil

import pytest
import torch

from fault_log import tree_digest
from metrics_file import step_losses as _losses
from trainwise.cli.main import main
from trainwise.engine import checkpoint as checkpoint_module

STEPS = 6
RUN = ["train", "tiny-llama", "--data", "synthetic", "--device", "cpu", "--seq-len", "16", "--batch-size", "1",
       "--save-every", "2", "--deterministic"]


def _train(out, metrics, *extra, steps=STEPS) -> int:
    return main([*RUN, "--steps", str(steps), "--output", str(out), "--metrics", str(metrics), *extra])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 6-step run saving every 2 steps: step-00000004 and step-00000006 are kept."""
    root = tmp_path_factory.mktemp("finished")
    assert _train(root / "out", root / "metrics.jsonl") == 0
    return root


@pytest.fixture
def run_copy(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


def _truncate(file):
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _flip_a_bit(file):
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


def test_every_checkpoint_lists_each_file_with_its_size_and_sha256(finished_run):
    checkpoint = finished_run / "out" / "checkpoints" / "step-00000006"
    listed = json.loads((checkpoint / "manifest.json").read_text())["files"]
    digests = tree_digest(checkpoint)
    del digests["manifest.json"]
    assert listed.keys() == digests.keys() and {"model.safetensors", "trainer_state.pt"} <= listed.keys()
    for name, entry in listed.items():
        assert entry == {"bytes": (checkpoint / name).stat().st_size, "sha256": digests[name]}


DAMAGE = {"truncated model.safetensors": ("model.safetensors", _truncate),
          "one bit flipped in trainer_state.pt": ("trainer_state.pt", _flip_a_bit),
          "trainer_state.pt deleted (listed in the manifest)": ("trainer_state.pt", lambda f: f.unlink())}


@pytest.mark.fault
@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_passes_over_a_damaged_newest_checkpoint_and_continues_the_same_loss_curve(
        run_copy, damage, capsys, fault_log):
    name, harm = DAMAGE[damage]
    checkpoints = run_copy / "out" / "checkpoints"
    harm(checkpoints / "step-00000006" / name)
    fault_log.watch(checkpoints / "step-00000004")
    reference = _losses(run_copy / "metrics.jsonl")
    capsys.readouterr()

    code = _train(run_copy / "out", run_copy / "metrics.jsonl", "--resume")

    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trainwise: warning:")]
    assert code == 0
    assert len(warnings) == 1
    assert f"step-00000006/{name} is damaged" in warnings[0]
    assert warnings[0].endswith(f"resuming from the previous intact checkpoint {checkpoints / 'step-00000004'}")
    assert _losses(run_copy / "metrics.jsonl") == pytest.approx(reference, rel=1e-6, abs=1e-7)
    fault_log(kind="fault", case=f"--resume with the newest checkpoint damaged: {damage}", exit_code=code,
              message=warnings[0].replace(str(run_copy / "out"), "OUT"))


@pytest.mark.fault
def test_resume_with_every_checkpoint_damaged_exits_2_naming_the_file(run_copy, capsys, fault_log):
    checkpoints = run_copy / "out" / "checkpoints"
    _truncate(checkpoints / "step-00000006" / "model.safetensors")
    _flip_a_bit(checkpoints / "step-00000004" / "model.safetensors")
    fault_log.watch(checkpoints)
    capsys.readouterr()

    code = _train(run_copy / "out", run_copy / "metrics.jsonl", "--resume")

    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert errors[-1].startswith("trainwise: error: --resume: no intact checkpoint in ")
    assert "step-00000006/model.safetensors is damaged" in errors[-1]
    fault_log(kind="fault", case="--resume with every checkpoint damaged (truncated, bit flipped)",
              exit_code=code, message=errors[-1].replace(str(run_copy / "out"), "OUT"))


def test_a_checkpoint_without_a_manifest_from_older_trainwise_still_resumes(run_copy, capsys):
    checkpoints = run_copy / "out" / "checkpoints"
    for manifest in checkpoints.glob("step-*/manifest.json"):
        manifest.unlink()
    reference = _losses(run_copy / "metrics.jsonl")
    (checkpoints / "latest").write_text("step-00000004\n")  # resume mid-run, as after a kill
    shutil.rmtree(checkpoints / "step-00000006")
    capsys.readouterr()

    assert _train(run_copy / "out", run_copy / "metrics.jsonl", "--resume") == 0
    assert "warning" not in capsys.readouterr().err
    assert _losses(run_copy / "metrics.jsonl") == pytest.approx(reference, rel=1e-6, abs=1e-7)


def _fail_second_call(monkeypatch, owner, name, error, before_fault):
    """Make `owner.name` raise `error` on its second call, after calling `before_fault()`
    (which records what the first, completed save wrote)."""
    real, calls = getattr(owner, name), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            before_fault()
            raise error
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, failing)


FAILURES = {
    "disk full (torch.save raises ENOSPC)": (torch, "save", OSError(errno.ENOSPC, "No space left on device")),
    "permission denied (the safetensors writer raises EACCES)":
        (checkpoint_module, "save_weights", PermissionError(errno.EACCES, "Permission denied")),
}


@pytest.mark.fault
@pytest.mark.parametrize("failure", FAILURES)
def test_a_save_that_fails_keeps_the_previous_checkpoint_and_exits_4(tmp_path, monkeypatch, capsys, fault_log,
                                                                     failure):
    out = tmp_path / "out"
    checkpoints = out / "checkpoints"
    owner, name, error = FAILURES[failure]
    _fail_second_call(monkeypatch, owner, name, error, lambda: fault_log.saved(checkpoints / "step-00000002"))

    code = _train(out, tmp_path / "metrics.jsonl", steps=4)

    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert errors[-1] == (f"trainwise: error: could not save checkpoint step-00000004 in {checkpoints}: "
                          f"{error.strerror}; the previous checkpoint step-00000002 is intact")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-00000002"]  # no partial directory
    assert (checkpoints / "latest").read_text() == "step-00000002\n"
    fault_log(kind="fault", case=f"checkpoint save fails: {failure}", exit_code=code,
              message=errors[-1].replace(str(out), "OUT"))
