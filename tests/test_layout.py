"""Layout arithmetic: degrees from the plan and the world size, and the errors."""

import pytest

from trainwise.plan import InputError
from trainwise.plan.layout import resolve_layout
from trainwise.plan.plan import Plan


def _layout(world=None, **knobs):
    return resolve_layout(Plan.from_dict(knobs), world)


def test_one_device_is_not_distributed():
    layout = _layout()
    assert (layout.world, layout.mesh_shape, layout.zero, layout.is_distributed) == (1, (1, 1, 1, 1), 0, False)


def test_leftover_ranks_go_to_ddp_or_to_shards():
    assert _layout(nproc=4).mesh_shape == (1, 4, 1, 1)
    assert _layout(nproc=4, tp=2).mesh_shape == (1, 2, 1, 2)
    sharded = _layout(nproc=4, zero=2)
    assert (sharded.mesh_shape, sharded.zero) == ((1, 1, 4, 1), 2)
    hybrid = _layout(nproc=8, fsdp=4)  # --fsdp alone means ZeRO-3; leftover ranks replicate the shards
    assert (hybrid.mesh_shape, hybrid.zero) == ((1, 2, 4, 1), 3)
    assert _layout(fsdp=8, tp=2).world == 16  # an estimate needs no --nproc


def test_world_size_overrides_nproc():
    assert _layout(4, pp=2).mesh_shape == (2, 2, 1, 1)


def test_zero_and_offload_on_one_device():
    layout = _layout(zero=3, cpu_offload=True)
    assert (layout.world, layout.zero, layout.cpu_offload) == (1, 3, True)


@pytest.mark.parametrize("knobs, flag, words", [
    ({"nproc": 6, "tp": 4}, "--nproc", "= 4"),
    ({"nproc": 8, "dp": 2, "fsdp": 2}, "--nproc", "must equal"),
    ({"nproc": 2, "dp": 2, "zero": 2}, "--zero", "--fsdp"),
    ({"nproc": 2, "cpu_offload": True}, "--cpu-offload", "sharded"),
    ({"nproc": 2, "zero": 1, "cpu_offload": True}, "--cpu-offload", "--zero 2 or 3"),
    ({"nproc": 2, "sequence_parallel": True}, "--sequence-parallel", "--tp"),
    ({"nproc": 2, "tp": 2, "seq_len": 33, "sequence_parallel": True}, "--sequence-parallel", "divisible"),
])
def test_bad_layouts_name_the_flag(knobs, flag, words):
    with pytest.raises(InputError) as error:
        _layout(**knobs)
    assert error.value.field == flag and words in str(error.value)


def test_sequence_parallel_runs_for_every_tensor_parallel_family_and_with_pipelines():
    from trainwise.models import resolve_model
    from trainwise.models.families.checks import check_model_layout

    plan = Plan.from_dict({"nproc": 2, "tp": 2, "sequence_parallel": True})
    for name in ("tiny-llama", "tiny-gpt2", "tiny-bert"):
        check_model_layout(resolve_model(name).config, plan, resolve_layout(plan))
    piped = Plan.from_dict({"nproc": 4, "tp": 2, "pp": 2, "microbatches": 2, "sequence_parallel": True})
    layout = resolve_layout(piped)
    check_model_layout(resolve_model("tiny-gpt2").config, piped, layout)
    assert (layout.tp, layout.pp, layout.sequence_parallel) == (2, 2, True)
    # T5 has no tensor-parallel plan, so none to shard over the sequence: refused by name.
    with pytest.raises(InputError) as error:
        check_model_layout(resolve_model("tiny-t5").config, plan, resolve_layout(plan))
    assert error.value.field == "--sequence-parallel" and "t5" in str(error.value)
    assert "sequence parallel" in resolve_layout(plan).describe()
