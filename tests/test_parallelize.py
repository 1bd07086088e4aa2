"""One place for each decision: the Layout decides how data parallelism is done and how big
a pipeline chunk is, the engine and the estimate read the same FSDP2 settings, one
parallelize() applies a plan on one device as on many, and the training job stays below
the API (engine/job.py imports nothing from trainwise.api)."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from trainwise.common.errors import InputError
from trainwise.plan.layout import resolve_layout
from trainwise.plan.partition import check_layout_combination
from trainwise.plan.plan import Plan

TINY = {"batch_size": 4, "seq_len": 16, "device": "cpu"}


@pytest.mark.parametrize("knobs, kind", [
    ({}, "none"), ({"zero": 3}, "fsdp"), ({"nproc": 4}, "ddp"), ({"nproc": 4, "zero": 1}, "zero1"),
    ({"nproc": 4, "zero": 2}, "fsdp"), ({"nproc": 4, "tp": 2}, "fsdp"), ({"nproc": 4, "pp": 2}, "fsdp"),
])
def test_the_layout_says_how_data_parallelism_is_done(knobs, kind):
    assert resolve_layout(Plan.from_dict({**TINY, **knobs})).data_parallel_kind == kind


def test_the_layout_refuses_zero_1_next_to_tensor_parallel_when_asked():
    plan = Plan.from_dict({**TINY, "nproc": 4, "zero": 1, "tp": 2, "fsdp": 2})
    layout = resolve_layout(plan)  # the degrees alone are fine
    for decide in (lambda: layout.data_parallel_kind, lambda: check_layout_combination(plan, layout)):
        with pytest.raises(InputError, match="ZeRO-1 runs on plain data parallel only") as error:
            decide()
        assert error.value.field == "--zero"


def test_a_pipeline_chunk_is_the_micro_batch_over_the_microbatches():
    assert (resolve_layout(Plan.from_dict({**TINY, "batch_size": 8})).chunk_batch,
            resolve_layout(Plan.from_dict({**TINY, "batch_size": 8, "nproc": 2, "pp": 2})).chunk_batch,
            resolve_layout(Plan.from_dict({**TINY, "batch_size": 8, "nproc": 2, "pp": 2,
                                           "microbatches": 2})).chunk_batch) == (8, 2, 4)


def test_fsdp2_is_given_the_settings_the_estimate_reads(monkeypatch):
    from trainwise.engine.parallel import fsdp
    from trainwise.plan.fsdp_settings import FsdpSettings

    given = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **options: given.append(options))
    model = nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]))
    for zero, reshard in ((2, False), (3, True)):
        layout = resolve_layout(Plan.from_dict({**TINY, "nproc": 2, "zero": zero, "precision": "bf16"}))
        given.clear()
        fsdp.shard_model(model, None, FsdpSettings.for_layout(layout, "bf16"))
        assert len(given) == 3 and {o["reshard_after_forward"] for o in given} == {reshard}
        assert given[0]["mp_policy"].param_dtype == torch.bfloat16


def test_fsdp_makes_a_unit_of_every_block_of_an_encoder_decoders_two_stacks(monkeypatch):
    """tiny-t5: the encoder's and the decoder's blocks, not the longest ModuleList (the three
    sublayers of one decoder block), each a unit of its own, then the model."""
    from trainwise.engine.parallel import fsdp
    from trainwise.models.build import build_model
    from trainwise.models.resolve import resolve_model
    from trainwise.plan.fsdp_settings import FsdpSettings

    sharded = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **options: sharded.append(module))
    model = build_model(resolve_model("tiny-t5"), "meta")
    layout = resolve_layout(Plan.from_dict({**TINY, "nproc": 2, "zero": 3}))
    fsdp.shard_model(model, None, FsdpSettings.for_layout(layout, "fp32"))
    assert sharded == [*model.encoder.block, *model.decoder.block, model]


def test_the_estimate_follows_the_fsdp_settings(monkeypatch):
    """ZeRO-3 whose settings keep the blocks gathered after forward is ZeRO-2 to the estimate:
    the buffers come from the settings object, not from the stage number."""
    from trainwise.api.estimate import estimate
    from trainwise.plan import fsdp_settings

    zero2 = estimate("tiny-llama", Plan.from_dict({**TINY, "nproc": 2, "zero": 2})).memory
    zero3 = estimate("tiny-llama", Plan.from_dict({**TINY, "nproc": 2, "zero": 3})).memory
    assert zero3.communication < zero2.communication
    monkeypatch.setattr(fsdp_settings.FsdpSettings, "for_layout", classmethod(
        lambda cls, layout, precision: cls(reshard_after_forward=False, gathers_bf16=precision == "bf16",
                                           cpu_offload=layout.cpu_offload)))
    kept = estimate("tiny-llama", Plan.from_dict({**TINY, "nproc": 2, "zero": 3})).memory
    assert kept.communication == zero2.communication and kept.peak_allocated == zero2.peak_allocated


def test_one_process_whole_model_compile_wraps_the_model_and_saves_the_uncompiled_one():
    from trainwise.engine.parallelize import parallelize

    model = nn.Linear(4, 4)
    eager = parallelize(model, Plan(device="cpu"), torch.device("cpu"), total_steps=1)
    assert eager.forward is eager.model is model and not eager.has_mesh
    compiled = parallelize(nn.Linear(4, 4), Plan(device="cpu", compile=True, compile_scope="model"),
                           torch.device("cpu"), total_steps=1)
    assert compiled.forward is not compiled.model and compiled.forward._orig_mod is compiled.model


def test_the_training_job_imports_nothing_from_the_api():
    code = ("import sys, trainwise.engine.job; "
            "print(sorted(m for m in sys.modules if m.startswith('trainwise.api')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
