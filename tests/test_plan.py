"""The Plan: knobs declared once, parsed from strings and files, validated with clear errors."""

import json

import pytest

from trainwise.plan import InputError, Plan, plan_from_sources


def test_every_design_flag_is_declared_as_a_knob():
    flags = {spec.flag for spec in Plan.specs()}
    documented = {"--batch-size", "--grad-accum", "--seq-len", "--precision", "--optim", "--grad-ckpt",
                  "--attention", "--compile", "--lora-rank", "--workers", "--pin-memory", "--device",
                  "--nproc", "--dp", "--fsdp", "--zero", "--cpu-offload", "--tp", "--pp", "--pp-schedule",
                  "--microbatches"}
    assert documented <= flags


def test_strings_are_converted_to_each_knobs_type():
    plan = Plan.from_dict({"batch-size": "8", "grad_ckpt": "true", "lr": "1e-4", "zero": "3"})
    assert (plan.batch_size, plan.grad_ckpt, plan.lr, plan.zero) == (8, True, 1e-4, 3)


@pytest.mark.parametrize("values, flag", [
    ({"batch_size": 0}, "--batch-size"),
    ({"seq_len": -1}, "--seq-len"),
    ({"precision": "fp8"}, "--precision"),
    ({"lora_rank": -2}, "--lora-rank"),
    ({"grad_ckpt": "maybe"}, "--grad-ckpt"),
    ({"batch_size": 2.5}, "--batch-size"),
    ({"zero": 4}, "--zero"),
])
def test_bad_values_name_the_flag_and_what_is_allowed(values, flag):
    with pytest.raises(InputError) as err:
        Plan.from_dict(values)
    assert err.value.field == flag
    assert "must be" in err.value.message


def test_unknown_knob_is_rejected_with_the_known_ones():
    with pytest.raises(InputError, match="unknown knob"):
        Plan.from_dict({"batchsize": 4})


def test_flags_override_the_plan_file(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("batch_size: 16\nprecision: bf16\n")
    plan = plan_from_sources(path, {"batch_size": "2"})
    assert (plan.batch_size, plan.precision) == (2, "bf16")


def test_json_plan_file_and_estimate_output_nesting(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"plan": {"grad_accum": 4}}))
    assert plan_from_sources(path).grad_accum == 4


@pytest.mark.parametrize("text", ["batch_size: [1, 2", "- 1\n- 2\n"])
def test_malformed_plan_file_is_an_input_error(tmp_path, text):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        plan_from_sources(path)
    assert err.value.field == "--plan"


def test_missing_plan_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        plan_from_sources(tmp_path / "nope.yaml")


def test_changed_knobs_lists_only_non_defaults():
    assert Plan(batch_size=2, grad_ckpt=True).changed_knobs() == {"batch_size": 2, "grad_ckpt": True}


def test_every_knob_is_a_scalar_so_to_dict_is_a_full_copy():
    # Plan.to_dict reads the fields without copying them: that is a copy only while no knob
    # holds a list, dict or other mutable value.
    plan = Plan(lora_rank=8, grad_ckpt=True, zero=3)
    assert all(isinstance(v, (bool, int, float, str, type(None))) for v in plan.to_dict().values())


def test_to_dict_reads_the_knobs_without_deep_copies(monkeypatch):
    # A search reads the knobs of thousands of plans (why_lost.py, refine.py): asdict's deep
    # copy of each field ran for every one (11,668 reads in the 8B search of plan_search_time.py).
    import copy
    import dataclasses

    plan = Plan(lora_rank=8, grad_ckpt=True)
    expected = dataclasses.asdict(plan)
    copies = []
    monkeypatch.setattr(copy, "deepcopy", lambda value, *a, **k: copies.append(value) or value)
    assert plan.to_dict() == expected and list(plan.to_dict()) == list(expected)
    assert copies == []
