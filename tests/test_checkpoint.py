"""Checkpoints restore a run exactly, survive crashes mid-save, and export loadable models."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from trainwise.engine import checkpoint as checkpoint_module
from trainwise.engine.checkpoint import TrainingState, latest_checkpoint, restore_checkpoint, save_checkpoint
from trainwise.engine.export import export_final
from trainwise.engine.parallelize import parallelize
from trainwise.engine.train_step import training_step
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import InputError, Plan

CPU = torch.device("cpu")


def _setup(name="tiny-llama", **knobs):
    torch.manual_seed(0)
    spec = resolve_model(name)
    plan = Plan(device="cpu", batch_size=2, seq_len=16, **knobs)
    return spec, plan, parallelize(build_model(spec, "cpu", attention="eager"), plan, CPU, total_steps=10,
                                   task=spec.task)


def _batches(spec, start=0):
    """Micro-batch i is always the same, wherever a run starts: the data position is enough."""
    index = start
    while True:
        yield example_batch(spec, 2, 16, generator=torch.Generator().manual_seed(index))
        index += 1


def _train(setup, plan, batches, steps):
    return [training_step(setup, batches, plan, skip_non_finite=False).loss.item() for _ in range(steps)]


def _save(path, setup, step, plan=None, keep=2):
    return save_checkpoint(path, TrainingState(step=step, micro_batches_consumed=step, skipped_steps=0,
                                               extra={"last_loss": 1.5}),
                           model=setup.model, optimizer=setup.optimizer, scheduler=setup.scheduler,
                           scaler=setup.scaler, plan=plan, keep=keep)


def _scramble_rngs():
    torch.manual_seed(12345)
    random.seed(12345)
    np.random.seed(12345)


def _assert_same_tensors(first: dict, second: dict):
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


# tiny-bert has dropout (RNG restore matters), tiny-gpt2 tied weights, tiny-mixtral a weight
# layout transformers converts when saving, and the LoRA run saves adapters only.
@pytest.mark.parametrize("name, knobs", [("tiny-llama", {}), ("tiny-bert", {}), ("tiny-gpt2", {}),
                                         ("tiny-mixtral", {}), ("tiny-llama", {"lora_rank": 4})])
def test_resumed_run_repeats_the_uninterrupted_loss_sequence(tmp_path, name, knobs):
    spec, plan, uninterrupted = _setup(name, **knobs)
    batches = _batches(spec)
    losses = _train(uninterrupted, plan, batches, 1)
    _save(tmp_path, uninterrupted, step=1, plan=plan)  # saving must not disturb the run either
    saved_optimizer = {i: {k: v.clone() for k, v in s.items()} for i, s in uninterrupted.optimizer.state.items()}
    losses += _train(uninterrupted, plan, batches, 2)

    _, _, resumed = _setup(name, **knobs)  # a new process after the kill: same seed, fresh objects
    _scramble_rngs()
    state = restore_checkpoint(latest_checkpoint(tmp_path), model=resumed.model, optimizer=resumed.optimizer,
                               scheduler=resumed.scheduler, scaler=resumed.scaler, plan=plan)
    assert (state.step, state.micro_batches_consumed, state.extra) == (1, 1, {"last_loss": 1.5})
    for param_state, restored in zip(saved_optimizer.values(), resumed.optimizer.state.values()):
        _assert_same_tensors(param_state, restored)
    resumed_losses = _train(resumed, plan, _batches(spec, start=state.micro_batches_consumed), 2)
    assert resumed_losses == losses[1:]
    _assert_same_tensors(uninterrupted.model.state_dict(), resumed.model.state_dict())


def test_tied_weights_stay_tied_after_restore(tmp_path):
    _, _, setup = _setup("tiny-gpt2")
    _save(tmp_path, setup, 1)
    _, _, fresh = _setup("tiny-gpt2")
    restore_checkpoint(latest_checkpoint(tmp_path), model=fresh.model, optimizer=fresh.optimizer)
    assert fresh.model.lm_head.weight is fresh.model.transformer.wte.weight


def test_restore_keeps_the_parameter_objects_the_optimizer_holds(tmp_path):
    _, _, setup = _setup()
    _save(tmp_path, setup, 1)
    _, _, fresh = _setup()
    before = [id(p) for p in fresh.model.parameters()]
    restore_checkpoint(latest_checkpoint(tmp_path), model=fresh.model, optimizer=fresh.optimizer)
    assert [id(p) for p in fresh.model.parameters()] == before
    assert all(id(p) in set(before) for group in fresh.optimizer.param_groups for p in group["params"])


def test_every_rng_continues_where_it_was_saved(tmp_path):
    _, _, setup = _setup()
    _save(tmp_path, setup, 1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    _scramble_rngs()
    restore_checkpoint(latest_checkpoint(tmp_path), model=setup.model, optimizer=setup.optimizer)
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_loss_scaler_state_round_trips(tmp_path):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    path = save_checkpoint(tmp_path, TrainingState(1, 1, 0, {}), model=model, optimizer=optimizer, scaler=scaler)
    fresh = torch.amp.GradScaler("cpu")
    restore_checkpoint(path, model=torch.nn.Linear(4, 1), optimizer=torch.optim.AdamW(model.parameters()),
                       scaler=fresh)
    assert fresh.state_dict() == scaler.state_dict() and fresh.get_scale() == 2.0**11


def test_trainer_state_loads_with_weights_only(tmp_path):
    _, _, setup = _setup()
    path = _save(tmp_path, setup, 1)
    loaded = torch.load(path / "trainer_state.pt", weights_only=True)
    assert set(loaded) == {"optimizer", "scheduler", "scaler", "rng"}


def test_restore_reads_the_trainer_state_with_weights_only(tmp_path, monkeypatch):
    _, _, setup = _setup()
    path = _save(tmp_path, setup, 1)
    calls = []
    real_load = torch.load
    monkeypatch.setattr(checkpoint_module.torch, "load", lambda *a, **k: calls.append(k) or real_load(*a, **k))
    restore_checkpoint(path, model=setup.model, optimizer=setup.optimizer)
    assert calls and all(call.get("weights_only") is True for call in calls)


def test_checkpoint_directory_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    _, _, setup = _setup()
    path = _save(tmp_path, setup, 1)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    _assert_same_tensors(setup.model.state_dict(), loaded.state_dict())
    info = json.loads((path / "trainwise.json").read_text())
    assert info["state"]["step"] == 1 and info["versions"]["torch"] == torch.__version__


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    _, _, setup = _setup()
    good = _save(tmp_path, setup, 1)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, setup, 2)
    assert latest_checkpoint(tmp_path) == good
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == [good.name]


_KILLED_MID_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from trainwise.engine import checkpoint
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    checkpoint.save_checkpoint(sys.argv[1], checkpoint.TrainingState(1, 1, 0, {}), model=model, optimizer=optimizer)
    checkpoint.torch.save = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.save_checkpoint(sys.argv[1], checkpoint.TrainingState(2, 2, 0, {}), model=model, optimizer=optimizer)
""")


def test_a_run_killed_mid_save_leaves_the_previous_checkpoint_and_no_partial_one(tmp_path):
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_SAVE, str(tmp_path)], capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    root = tmp_path / "checkpoints"
    assert any(p.name.startswith(".step-00000002") for p in root.iterdir())  # the half-written one
    assert latest_checkpoint(tmp_path) == root / "step-00000001"
    (root / "latest").unlink()  # also without the pointer, the scan ignores the partial one
    assert latest_checkpoint(tmp_path) == root / "step-00000001"

    model = torch.nn.Linear(4, 4)
    state = restore_checkpoint(latest_checkpoint(tmp_path), model=model,
                               optimizer=torch.optim.AdamW(model.parameters()))
    assert state.step == 1
    save_checkpoint(tmp_path, TrainingState(2, 2, 0, {}), model=model, optimizer=torch.optim.AdamW(model.parameters()))
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000001", "step-00000002"]


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    _, _, setup = _setup()
    for step in (1, 2, 3):
        _save(tmp_path, setup, step, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step-00000002", "step-00000003"]
    assert latest_checkpoint(tmp_path).name == "step-00000003"


def test_a_new_run_in_a_reused_directory_supersedes_the_old_run(tmp_path):
    _, _, setup = _setup()
    for step in (40, 50):
        _save(tmp_path, setup, step)
    new = _save(tmp_path, setup, 10)  # an earlier step, but the newest save: never pruned
    assert latest_checkpoint(tmp_path) == new
    (tmp_path / "checkpoints" / "latest").unlink()
    assert latest_checkpoint(tmp_path) == new
    _save(tmp_path, setup, 20)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step-00000010", "step-00000020"]


def test_no_checkpoint_means_none(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("../../elsewhere\n")
    assert latest_checkpoint(tmp_path) is None


def test_resume_of_a_damaged_checkpoint_is_a_clear_error(tmp_path):
    _, _, setup = _setup()
    path = _save(tmp_path, setup, 1)
    (path / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(InputError, match="--resume") as error:
        restore_checkpoint(path, model=setup.model, optimizer=setup.optimizer)
    assert "\n" not in str(error.value)
    (path / "trainer_state.pt").unlink()
    with pytest.raises(InputError, match="not a complete"):
        restore_checkpoint(path, model=setup.model, optimizer=setup.optimizer)


def test_resume_into_a_different_model_is_a_clear_error(tmp_path):
    _, _, setup = _setup("tiny-llama")
    path = _save(tmp_path, setup, 1)
    _, _, other = _setup("tiny-gpt2")
    with pytest.raises(InputError, match="--resume"):
        restore_checkpoint(path, model=other.model, optimizer=other.optimizer)


def test_resume_with_a_different_micro_batch_is_refused(tmp_path):
    _, plan, setup = _setup()
    path = _save(tmp_path, setup, 1, plan=plan)
    with pytest.raises(InputError, match="--batch-size 2"):
        restore_checkpoint(path, model=setup.model, optimizer=setup.optimizer, plan=plan.replace(batch_size=4))


def test_lora_resume_on_different_base_weights_is_refused(tmp_path):
    _, _, setup = _setup("tiny-llama", lora_rank=4)
    path = _save(tmp_path, setup, 1)
    _, _, other = _setup("tiny-llama", lora_rank=4)
    with torch.no_grad():
        other.model.get_base_model().model.embed_tokens.weight.add_(1.0)
    with pytest.raises(InputError, match="frozen weights differ"):
        restore_checkpoint(path, model=other.model, optimizer=other.optimizer)


def test_final_export_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    spec, _, setup = _setup("tiny-gpt2")
    exports = export_final(tmp_path, setup.model)
    assert exports == {"final model": tmp_path / "final"}
    loaded = AutoModelForCausalLM.from_pretrained(exports["final model"], attn_implementation="eager").eval()
    _assert_same_tensors(setup.model.state_dict(), loaded.state_dict())
    batch = example_batch(spec, 1, 8)
    setup.model.eval()
    torch.testing.assert_close(loaded(input_ids=batch["input_ids"]).logits,
                               setup.model(input_ids=batch["input_ids"]).logits, rtol=0, atol=0)


def test_lora_exports_the_adapter_and_the_merged_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec, _, setup = _setup("tiny-llama", lora_rank=4)
    for module in setup.model.modules():  # make the adapters non-trivial
        if hasattr(module, "lora_B"):
            for b in module.lora_B.values():
                torch.nn.init.normal_(b.weight)
    trained = {k: v.clone() for k, v in setup.model.state_dict().items()}
    exports = export_final(tmp_path, setup.model)
    assert set(exports.values()) == {tmp_path / "final", tmp_path / "final-adapter"}
    _assert_same_tensors(trained, setup.model.state_dict())  # the training model keeps its adapters
    batch = example_batch(spec, 1, 8)["input_ids"]
    setup.model.eval()
    expected = setup.model(input_ids=batch).logits
    merged = AutoModelForCausalLM.from_pretrained(exports["final model (LoRA merged)"]).eval()
    assert not any("lora" in key for key in merged.state_dict())
    torch.testing.assert_close(merged(input_ids=batch).logits, expected, rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    base = build_model(spec, "cpu", attention="eager")
    adapted = PeftModel.from_pretrained(base, exports["LoRA adapter"]).eval()
    torch.testing.assert_close(adapted(input_ids=batch).logits, expected, rtol=1e-4, atol=1e-4)


def test_plain_module_round_trips_through_safetensors(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path, TrainingState(1, 1, 0, {}), model=model, optimizer=optimizer)
    assert (path / "model.safetensors").is_file()
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    restore_checkpoint(path, model=fresh, optimizer=torch.optim.AdamW(fresh.parameters()))
    _assert_same_tensors(model.state_dict(), fresh.state_dict())
    assert os.path.isfile(export_final(tmp_path, model)["final model"] / "model.safetensors")


@pytest.mark.gpu
def test_cuda_weights_optimizer_and_rng_round_trip(tmp_path):
    model = torch.nn.Linear(4, 4, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4, device="cuda")).sum().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path, TrainingState(1, 1, 0, {}), model=model, optimizer=optimizer)
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed_all(999)
    fresh = torch.nn.Linear(4, 4, device="cuda")
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    restore_checkpoint(path, model=fresh, optimizer=fresh_optimizer)
    assert torch.equal(torch.rand(3, device="cuda"), expected)
    _assert_same_tensors(model.state_dict(), fresh.state_dict())
    assert fresh_optimizer.state[fresh.weight]["exp_avg"].device.type == "cuda"
