"""Checkpoints restore a run exactly, survive crashes mid-save, and export loadable models."""

import pytest
import torch

from trainwise.engine import checkpoint as checkpoint_module
from trainwise.engine.checkpoint import TrainingState, latest_checkpoint, restore_checkpoint, save_checkpoint
from trainwise.engine.export import export_final
from trainwise.engine.setup import apply_plan
from trainwise.engine.train_step import training_step
from trainwise.models import build_model, example_batch, resolve_model
from trainwise.plan import InputError, Plan

CPU = torch.device("cpu")


def _setup(name="tiny-llama", **knobs):
    torch.manual_seed(0)
    spec = resolve_model(name)
    plan = Plan(device="cpu", batch_size=2, seq_len=16, **knobs)
    return spec, plan, apply_plan(build_model(spec, "cpu", attention="eager"), plan, CPU, total_steps=10,
                                  task=spec.task)


def _batches(spec, seed):
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield example_batch(spec, 2, 16, generator=generator)


def _state(step):
    return TrainingState(step=step, micro_batches_consumed=step, skipped_steps=0, extra={})


@pytest.mark.parametrize("name, knobs", [("tiny-llama", {}), ("tiny-gpt2", {}), ("tiny-llama", {"lora_rank": 4})])
def test_restore_continues_bit_for_bit(tmp_path, name, knobs):
    spec, plan, setup = _setup(name, **knobs)
    batches = _batches(spec, 1)
    for _ in range(2):
        training_step(setup, batches, plan, skip_non_finite=False)
    save_checkpoint(tmp_path, _state(2), model=setup.model, optimizer=setup.optimizer,
                    scheduler=setup.scheduler, scaler=setup.scaler, plan=plan)
    # (the fresh setup below reseeds; only a restored RNG state gives the same dropout)
    expected = [training_step(setup, _batches(spec, 2), plan, skip_non_finite=False).loss for _ in range(2)]

    _, _, fresh = _setup(name, **knobs)
    state = restore_checkpoint(latest_checkpoint(tmp_path), model=fresh.model, optimizer=fresh.optimizer,
                               scheduler=fresh.scheduler, scaler=fresh.scaler)
    assert state.step == 2
    again = [training_step(fresh, _batches(spec, 2), plan, skip_non_finite=False).loss for _ in range(2)]
    assert again == expected


def test_tied_weights_stay_tied_after_restore(tmp_path):
    spec, plan, setup = _setup("tiny-gpt2")
    save_checkpoint(tmp_path, _state(1), model=setup.model, optimizer=setup.optimizer)
    _, _, fresh = _setup("tiny-gpt2")
    restore_checkpoint(latest_checkpoint(tmp_path), model=fresh.model, optimizer=fresh.optimizer)
    assert fresh.model.lm_head.weight.data_ptr() == fresh.model.transformer.wte.weight.data_ptr()


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    _, _, setup = _setup()
    good = save_checkpoint(tmp_path, _state(1), model=setup.model, optimizer=setup.optimizer)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, _state(2), model=setup.model, optimizer=setup.optimizer)
    assert latest_checkpoint(tmp_path) == good
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == [good.name]


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    _, _, setup = _setup()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, _state(step), model=setup.model, optimizer=setup.optimizer, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step-00000002", "step-00000003"]


def test_trainer_state_loads_with_weights_only(tmp_path):
    _, _, setup = _setup()
    path = save_checkpoint(tmp_path, _state(1), model=setup.model, optimizer=setup.optimizer,
                           scheduler=setup.scheduler, scaler=setup.scaler)
    assert "optimizer" in torch.load(path / "trainer_state.pt", weights_only=True)


def test_resume_of_a_damaged_checkpoint_is_a_clear_error(tmp_path):
    _, _, setup = _setup()
    path = save_checkpoint(tmp_path, _state(1), model=setup.model, optimizer=setup.optimizer)
    (path / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(InputError, match="--resume"):
        restore_checkpoint(path, model=setup.model, optimizer=setup.optimizer)


def test_final_export_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    spec, _, setup = _setup("tiny-gpt2")
    exports = export_final(tmp_path, setup.model)
    loaded = AutoModelForCausalLM.from_pretrained(exports["final model"]).eval()
    batch = example_batch(spec, 1, 8)
    setup.model.eval()
    torch.testing.assert_close(loaded(input_ids=batch["input_ids"]).logits,
                               setup.model(input_ids=batch["input_ids"]).logits)


def test_lora_exports_the_adapter_and_the_merged_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec, _, setup = _setup("tiny-llama", lora_rank=4)
    for module in setup.model.modules():  # make the adapters non-trivial
        if hasattr(module, "lora_B"):
            for b in module.lora_B.values():
                torch.nn.init.normal_(b.weight)
    exports = export_final(tmp_path, setup.model)
    batch = example_batch(spec, 1, 8)["input_ids"]
    setup.model.eval()
    expected = setup.model(input_ids=batch).logits
    merged = AutoModelForCausalLM.from_pretrained(exports["final model (LoRA merged)"]).eval()
    torch.testing.assert_close(merged(input_ids=batch).logits, expected, rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    base = build_model(spec, "cpu", attention="eager")
    adapted = PeftModel.from_pretrained(base, exports["LoRA adapter"]).eval()
    torch.testing.assert_close(adapted(input_ids=batch).logits, expected, rtol=1e-4, atol=1e-4)
