"""Nothing trainwise writes costs the user a file: export never writes over or into its
source, a directory write never replaces what trainwise did not write, a damaged checkpoint
is refused before anything is written, an export is read back before it is called loadable,
and `train --output` / `bench --out` are checked before any model is built."""

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fault_log import tree_digest
from trainwise.cli.main import main
from trainwise.common.atomic import MARKER, atomic_directory
from trainwise.common.errors import InputError

TRAIN = ["train", "tiny-gpt2", "--data", "synthetic", "--device", "cpu", "--steps", "2", "--seq-len", "16",
         "--batch-size", "1"]
STEP = "checkpoints/step-00000002"
QUICK_S = 15  # a refusal before the build takes imports and a meta-device model, not training


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run: OUTPUT/checkpoints/step-00000002/ and OUTPUT/final/."""
    output = tmp_path_factory.mktemp("trained") / "run"
    assert main([*TRAIN, "--output", str(output)]) == 0
    return output


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the finished run that a test may try to damage."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _refused(argv, capsys, field: str) -> str:
    assert main(argv) == 2
    line = _error_line(capsys)
    assert line.startswith(f"trainwise: error: {field}: "), line
    return line


# ---------------------------------------------------------------------------- export: where it writes
OVERLAPS = [  # (CHECKPOINT, --out, both relative to the run; what is tried)
    ("", "", "export RUN --out RUN"),
    ("", "exported", "export RUN --out RUN/exported (inside the run)"),
    (STEP, STEP, "export CHECKPOINT --out CHECKPOINT (the checkpoint itself)"),
    (STEP, "", "export CHECKPOINT --out RUN (contains the checkpoint)"),
    (STEP, STEP + "/hf", "export CHECKPOINT --out CHECKPOINT/hf (inside the checkpoint)"),
    ("checkpoints/latest", "checkpoints", "export RUN/checkpoints/latest --out RUN/checkpoints"),
]


@pytest.mark.fault
@pytest.mark.parametrize("source, out, case", OVERLAPS, ids=[case for _, _, case in OVERLAPS])
def test_export_refuses_an_output_that_is_contains_or_lies_inside_the_source(run, source, out, case, capsys,
                                                                              fault_log):
    before = tree_digest(run)
    fault_log.watch(run)
    line = _refused(["export", str(run / source), "--out", str(run / out)], capsys, "--out")
    assert "outside" in line
    assert tree_digest(run) == before
    fault_log(kind="bad input", case=case, exit_code=2, message=line)


@pytest.mark.fault
def test_export_refuses_a_symlink_that_names_the_source(run, tmp_path, capsys, fault_log):
    alias = tmp_path / "alias"
    alias.symlink_to(run)
    before = tree_digest(run)
    fault_log.watch(run)
    line = _refused(["export", str(run), "--out", str(alias / "final")], capsys, "--out")
    assert tree_digest(run) == before and alias.is_symlink()
    fault_log(kind="bad input", case="export RUN --out LINK/final, where LINK is a symlink to RUN", exit_code=2,
              message=line)


@pytest.mark.fault
def test_export_refuses_to_write_over_another_runs_checkpoint(run, trained, tmp_path, capsys, fault_log):
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    before = tree_digest(other)
    fault_log.watch(other)
    line = _refused(["export", str(run), "--out", str(other / STEP)], capsys, "--out")
    assert "checkpoints" in line and tree_digest(other) == before
    fault_log(kind="bad input", case="export RUN --out OTHER_RUN/checkpoints/step-00000002", exit_code=2,
              message=line)


@pytest.mark.fault
def test_export_refuses_to_replace_a_file(run, tmp_path, capsys, fault_log):
    target = tmp_path / "notes.txt"
    target.write_text("the user's own file\n")
    fault_log.watch(target)
    line = _refused(["export", str(run), "--out", str(target)], capsys, "--out")
    assert str(target) in line and target.read_text() == "the user's own file\n"
    fault_log(kind="bad input", case="export --out naming an existing file", exit_code=2, message=line)


@pytest.mark.fault
def test_export_refuses_a_directory_trainwise_did_not_write(run, tmp_path, capsys, fault_log):
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "weights.bin").write_bytes(b"\x01" * 64)
    before = tree_digest(mine)
    fault_log.watch(mine)
    line = _refused(["export", str(run), "--out", str(mine)], capsys, "--out")
    assert str(mine) in line and tree_digest(mine) == before
    fault_log(kind="bad input", case="export --out naming a non-empty directory trainwise did not write",
              exit_code=2, message=line)


def test_export_replaces_its_own_earlier_export_and_an_empty_directory(run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    out.mkdir()
    for _ in range(2):  # into an empty directory, then over its own export
        assert main(["export", str(run), "--out", str(out)]) == 0
        assert (out / MARKER).is_file()
    assert "from_pretrained loads it" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0


# ---------------------------------------------------------------------------- export: what it reads and writes
@pytest.mark.fault
def test_export_of_a_truncated_model_safetensors_is_refused_naming_the_file(run, tmp_path, capsys, fault_log):
    weights = run / STEP / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    fault_log.watch(run)  # the damaged run, as it was handed to export
    out = tmp_path / "hf"
    line = _refused(["export", str(run), "--out", str(out)], capsys, "CHECKPOINT")
    assert str(weights) in line and not out.exists()
    fault_log(kind="fault", case="export of a checkpoint whose model.safetensors was truncated to half",
              exit_code=2, message=line)


@pytest.mark.fault
def test_export_of_weights_that_disagree_with_config_json_is_refused(run, tmp_path, capsys, fault_log):
    config = run / STEP / "config.json"
    config.write_text(_with_field(config.read_text(), "vocab_size", 300))
    fault_log.watch(run)
    out = tmp_path / "hf"
    line = _refused(["export", str(run), "--out", str(out)], capsys, "CHECKPOINT")
    assert "model.safetensors" in line and "shape" in line and not out.exists()
    fault_log(kind="fault", case="export of a checkpoint whose config.json names another vocabulary size than "
                                 "its weights", exit_code=2, message=line)


def _with_field(text: str, field: str, value) -> str:
    import json

    config = json.loads(text)
    config[field] = value
    return json.dumps(config)


@pytest.mark.fault
def test_an_export_that_does_not_read_back_is_not_put_in_place(run, tmp_path, capsys, fault_log, monkeypatch):
    import trainwise.api.export as export

    def copy_that_loses_the_tail(source, target):
        shutil.copyfile(source, target)
        if str(target).endswith(".safetensors"):
            os.truncate(target, Path(target).stat().st_size - 100)

    monkeypatch.setattr(export.shutil, "copy2", copy_that_loses_the_tail)
    fault_log.watch(run)
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out)]) == 1
    line = _error_line(capsys)
    assert "did not read back" in line and "model.safetensors" in line
    assert not out.exists() and not list(tmp_path.glob(".hf.*"))
    fault_log(kind="fault", case="export whose written model.safetensors loses its last 100 bytes (a failing "
                                 "disk)", exit_code=1, message=line)


@pytest.fixture
def distributed_checkpoint(run):
    """`run`'s checkpoint turned into a distributed one: the model's state saved with
    torch.distributed.checkpoint in the names and shapes distributed runs save, no
    model.safetensors beside it."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from trainwise.engine.parallel.checkpoint_shapes import fused_projections, to_checkpoint_shapes

    checkpoint = run / STEP
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    dcp.save({"model": to_checkpoint_shapes(model.state_dict(), fused_projections(model))},
             checkpoint_id=str(checkpoint / "dcp"), no_dist=True)
    (checkpoint / "model.safetensors").unlink()
    return checkpoint


@pytest.mark.fault
def test_export_of_a_truncated_distributed_shard_is_refused_naming_the_file(distributed_checkpoint, tmp_path,
                                                                           capsys, fault_log):
    out = tmp_path / "hf"
    assert main(["export", str(distributed_checkpoint), "--out", str(out)]) == 0  # whole, it exports
    shutil.rmtree(out)
    capsys.readouterr()
    shard = next((distributed_checkpoint / "dcp").glob("*.distcp"))
    os.truncate(shard, shard.stat().st_size // 2)
    fault_log.watch(distributed_checkpoint)
    line = _refused(["export", str(distributed_checkpoint), "--out", str(out)], capsys, "CHECKPOINT")
    assert str(shard) in line and not out.exists()
    fault_log(kind="fault", case="export of a distributed checkpoint whose shard file was truncated to half",
              exit_code=2, message=line)


# ---------------------------------------------------------------------------- every directory write
@pytest.mark.fault
def test_atomic_directory_never_replaces_what_trainwise_did_not_write(tmp_path, fault_log):
    file, theirs, link = tmp_path / "file", tmp_path / "theirs", tmp_path / "link"
    file.write_text("keep me")
    theirs.mkdir()
    (theirs / "a").write_text("keep me too")
    link.symlink_to(theirs)
    before = tree_digest(tmp_path)
    fault_log.watch(tmp_path)
    refusals = {}
    for path in (file, theirs, link):
        with pytest.raises(InputError, match=str(path)) as refused:
            with atomic_directory(path) as tmp:
                (tmp / "new").write_text("new")
        refusals[path.name] = str(refused.value)
    assert tree_digest(tmp_path) == before and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link", "theirs"]  # no temporary left
    with atomic_directory(tmp_path / "ours") as tmp:
        (tmp / "v").write_text("1")
    with atomic_directory(tmp_path / "ours") as tmp:  # its own: replaced
        (tmp / "v").write_text("2")
    assert (tmp_path / "ours" / "v").read_text() == "2"
    for name, what in (("file", "a file"), ("theirs", "a directory of the user's"), ("link", "a symlink")):
        fault_log(kind="bad input", case=f"a directory write (checkpoint, final/, export) aimed at {what}",
                  exit_code=2, message="trainwise: error: " + refusals[name])


# ---------------------------------------------------------------------------- preflight
def _quick_refusal(argv, capsys, field):
    started = time.perf_counter()
    line = _refused(argv, capsys, field)
    assert time.perf_counter() - started < QUICK_S
    return line


@pytest.mark.fault
def test_train_output_naming_a_file_is_refused_before_the_build(tmp_path, capsys, fault_log, monkeypatch):
    import trainwise.engine.job as training

    monkeypatch.setattr(training, "_build", _must_not_run)
    target = tmp_path / "run.txt"
    target.write_text("notes")
    fault_log.watch(target)
    line = _quick_refusal([*TRAIN, "--output", str(target)], capsys, "--out")
    assert str(target) in line and "file" in line and target.read_text() == "notes"
    nested = _quick_refusal([*TRAIN, "--output", str(target / "sub")], capsys, "--out")
    assert "file" in nested and sorted(os.listdir(tmp_path)) == ["run.txt"]
    fault_log(kind="bad input", case="train --output naming an existing file", exit_code=2, message=line)
    fault_log(kind="bad input", case="train --output naming a path under a file", exit_code=2, message=nested)


@contextlib.contextmanager
def _small_filesystem(path: Path, options: str):
    """A tmpfs mounted at `path` with `options` (True), or False where this process may not
    mount (then `path` is a plain directory)."""
    path.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                                       capture_output=True).returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.fault
def test_train_output_in_a_read_only_directory_is_refused(tmp_path, capsys, fault_log, monkeypatch):
    import trainwise.engine.job as training

    monkeypatch.setattr(training, "_build", _must_not_run)
    locked = tmp_path / "locked"
    with _small_filesystem(locked, "ro,size=1m") as mounted:
        how = "a read-only filesystem" if mounted else "a directory of mode 0555"
        if not mounted:
            locked.chmod(0o555)
        try:
            if os.access(locked, os.W_OK):
                pytest.skip("cannot mount here and this process writes through a read-only mode (root)")
            line = _quick_refusal([*TRAIN, "--output", str(locked / "run")], capsys, "--out")
            assert "read-only" in line and not os.listdir(locked)
        finally:
            if not mounted:
                locked.chmod(0o755)
    fault_log(kind="bad input", case=f"train --output inside {how}", exit_code=2, message=line)


@pytest.mark.fault
def test_train_output_without_room_is_refused_with_the_numbers(tmp_path, capsys, fault_log, monkeypatch):
    import trainwise.engine.job as training

    monkeypatch.setattr(training, "_build", _must_not_run)
    small = tmp_path / "small"
    with _small_filesystem(small, "size=1m") as mounted:
        if not mounted:  # a filesystem that reports 1 MiB free
            import trainwise.engine.output_preflight as preflight

            full = shutil.disk_usage(tmp_path)._replace(free=1024**2)
            monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: full)
        line = _quick_refusal([*TRAIN, "--output", str(small / "run")], capsys, "--out")
        assert "need " in line and "1.0 MiB free" in line and not os.listdir(small)
    how = "a 1 MiB tmpfs" if mounted else "a filesystem with 1 MiB free (disk_usage patched)"
    fault_log(kind="fault", case=f"train --output on {how}; the tiny model needs about 20 MiB", exit_code=2,
              message=line)


def test_the_room_a_run_needs_follows_the_plan():
    from trainwise.engine.output_preflight import training_output_bytes
    from trainwise.engine.run_config import RunConfig
    from trainwise.plan.plan import Plan

    params = 10**9
    base = training_output_bytes(params, Plan(), RunConfig(steps=10))  # fp32 AdamW: 4 + 8 bytes, + 4 of final/
    assert 16e9 < base < 16e9 * 1.2
    assert training_output_bytes(params, Plan(precision="bf16-pure"), RunConfig(steps=10)) < base * 0.6
    kept = training_output_bytes(params, Plan(), RunConfig(steps=10, save_every=2))  # 3 checkpoints at once
    assert 40e9 < kept < 40e9 * 1.2
    assert training_output_bytes(params, Plan(lora_rank=8), RunConfig(steps=10)) < 5e9


@pytest.mark.fault
def test_train_under_nproc_checks_the_output_before_torchrun(tmp_path, capsys, fault_log, monkeypatch):
    import trainwise.engine.parallel.launch as launch

    monkeypatch.setattr(launch, "launch_local", _must_not_run)
    target = tmp_path / "run.txt"
    target.write_text("notes")
    fault_log.watch(target)
    line = _quick_refusal([*TRAIN, "--nproc", "2", "--output", str(target)], capsys, "--out")
    assert "file" in line and target.read_text() == "notes"
    fault_log(kind="bad input", case="train --nproc 2 --output naming an existing file", exit_code=2, message=line)


@pytest.mark.fault
def test_train_refuses_before_the_build_a_final_directory_it_did_not_write(tmp_path, capsys, fault_log,
                                                                           monkeypatch):
    import trainwise.engine.job as training

    monkeypatch.setattr(training, "_build", _must_not_run)
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "my-notes.txt").write_text("notes")
    before = tree_digest(tmp_path)
    fault_log.watch(tmp_path)
    line = _quick_refusal([*TRAIN, "--output", str(tmp_path / "run")], capsys, "--out")
    assert str(final) in line and tree_digest(tmp_path) == before
    fault_log(kind="bad input", case="train --output RUN where RUN/final is a directory trainwise did not write",
              exit_code=2, message=line)


@pytest.mark.fault
def test_bench_out_naming_a_file_is_refused_before_the_first_row(tmp_path, capsys, fault_log, monkeypatch):
    import trainwise.api.benchmark as benchmark

    monkeypatch.setattr(benchmark, "run_row", _must_not_run)
    target = tmp_path / "results"
    target.write_text("notes")
    fault_log.watch(target)
    line = _quick_refusal(["bench", "tiny-llama", "--device", "cpu", "--steps", "3", "--out", str(target)], capsys,
                          "--out")
    assert "file" in line and target.read_text() == "notes"
    fault_log(kind="bad input", case="bench --out naming an existing file", exit_code=2, message=line)


def _must_not_run(*args, **kwargs):
    raise AssertionError("reached: the refusal should have come first")


def test_meta_parameter_count_matches_the_built_model():
    from trainwise.engine.output_preflight import count_parameters_of
    from trainwise.models import resolve_model
    from trainwise.models.build import build_model

    spec = resolve_model("tiny-gpt2")
    built = build_model(spec, device="cpu")
    assert count_parameters_of(spec) == sum(p.numel() for p in built.parameters()) == count_parameters_of(built)


@pytest.mark.fault
def test_train_into_a_used_out_without_resume_is_refused_and_nothing_replaced(run, capsys, fault_log, monkeypatch):
    import trainwise.engine.job as training

    monkeypatch.setattr(training, "_build", _must_not_run)
    before = tree_digest(run)
    fault_log.watch(run)
    line = _quick_refusal([*TRAIN, "--out", str(run)], capsys, "--out")
    assert "--resume" in line and "fresh folder" in line and "checkpoints/" in line and "final/" in line
    assert tree_digest(run) == before
    fault_log(kind="bad input", case="train --out RUN where RUN holds an earlier run, without --resume", exit_code=2,
              message=line)
