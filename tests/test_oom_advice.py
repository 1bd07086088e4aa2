"""After an out-of-memory crash the advice names knob changes the estimate says would fit."""

import pytest

from trainwise.api.estimate import estimate
from trainwise.api.oom_advice import fitting_changes, oom_message
from trainwise.hardware import resolve_device
from trainwise.models import resolve_model
from trainwise.plan import Plan


@pytest.mark.slow
def test_suggested_changes_are_predicted_to_fit_and_the_plan_is_not():
    spec = resolve_model("Llama-3.2-1B")
    plan = Plan(batch_size=8, seq_len=2048, device="A100-40GB")
    capacity = resolve_device("A100-40GB").memory_bytes
    assert estimate(spec, plan).memory.device_total > capacity
    fits = fitting_changes(spec, plan, capacity)
    assert fits and all(total <= capacity for _, total in fits)
    message = oom_message(spec, plan, capacity, step=0)
    assert "at step 1" in message and "predicted need" in message and "predicted to fit" in message
